"""`ttrace view`'s index on disk (issue 42): the first open of a trace saves
`TRACE.ttidx`, the next one maps it instead of walking the trace, and every
API answer is the same bytes either way. An index that does not match its
trace (appended, touched, truncated), of another version, or damaged, is
rebuilt with a note on stderr, never trusted; a trace in a read-only
directory keeps its index in the cache. The oracle is the server that built
its index in memory from the trace (today's path), on a copy of the same
trace under the same name. Needs root: the traces are recorded here, and
the read-only directory is a read-only bind mount."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path

import blake3
import pytest
from test_exports import export, record
from test_view import free_port

NAME = "t.data"
RECORDINGS = {"gemma": ("--op-timing",), "moe": ()}


@pytest.fixture(scope="module")
def traces(ttrace, tmp_path_factory, llama_completion, models, flush_log_preload) -> dict[str, Path]:
    """A run of Gemma 3 with op timing (thread and layer tracks) and one of the MoE model (routing)."""
    out = {}
    for name, extra in RECORDINGS.items():
        d = tmp_path_factory.mktemp(f"index-{name}")
        out[name] = record(ttrace, d / NAME, llama_completion, models[name], flush_log_preload, extra)
    return out


class View:
    """`ttrace view t.data` run in the trace's directory (so that every
    answer names the trace alike), with its own cache directory."""

    def __init__(self, ttrace: Path, trace: Path, cache: Path, verbose: bool = False):
        self.log = trace.parent.parent / f"view-{time.monotonic_ns()}.log"
        self.port = free_port()
        env = dict(os.environ, XDG_CACHE_HOME=str(cache))
        with self.log.open("w") as err:
            self.proc = subprocess.Popen([ttrace, *(["-v"] if verbose else []), "view", trace.name, "--no-open",
                                          "--port", str(self.port)],
                                         cwd=trace.parent, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.base = f"http://127.0.0.1:{self.port}"
        self.until(lambda: self.get("/api/v1/meta")[0] == 200, "answered /api/v1/meta")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=120) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def text(self) -> str:
        return self.log.read_text()

    def until(self, done, what: str):
        deadline = time.monotonic() + 300  # a hang guard, not a timing check
        while not done():
            if self.proc.poll() is not None:
                pytest.fail(f"ttrace view exited ({self.proc.returncode}) before it {what}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"ttrace view never {what}:\n{self.text()[-3000:]}")
            time.sleep(0.1)

    def saved(self) -> Path:
        """Waits for the index to be saved; where it went."""
        self.until(lambda: "ttrace: index saved to " in self.text(), "saved its index")
        return Path(re.search(r"ttrace: index saved to (.+?) \(", self.text()).group(1))

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        assert "panicked" not in self.text(), self.text()


def columns(body: bytes) -> dict[str, list]:
    """A docs/VIEW_API.md columns frame, decoded."""
    assert body[:4] == b"TTC1"
    (n,) = struct.unpack_from("<I", body, 4)
    header = json.loads(body[8:8 + n])
    at = (8 + n + 7) // 8 * 8
    sizes = {"u8": ("B", 1), "u32": ("I", 4), "i32": ("i", 4), "u64": ("Q", 8), "f32": ("f", 4)}
    out = {}
    for c in header["columns"]:
        code, width = sizes[c["type"]]
        out[c["name"]] = list(struct.unpack_from(f"<{header['rows']}{code}", body, at))
        at = (at + header["rows"] * width + 7) // 8 * 8
    return out


def queries(v: View) -> list[str]:
    """Every query of docs/VIEW_API.md, over the whole run and over parts of it."""
    meta = json.loads(v.get("/api/v1/meta")[1])
    tracks = json.loads(v.get("/api/v1/timeline/tracks")[1])
    n_ub, n_tok, n_t = meta["counts"]["ubatches"], meta["counts"]["tokens"], len(meta["tensors"])
    end = meta["trace"]["duration_ns"]
    ops = columns(v.get("/api/v1/ops?limit=5000")[1])["op"]
    u = [0, n_ub // 2, n_ub - 1]
    q = ["/api/v1/meta", "/api/v1/summary", "/api/v1/ubatches", "/api/v1/tokens", "/api/v1/timeline/tracks",
         "/api/v1/moe", "/api/v1/memmap/bands?track=disk", "/api/v1/memmap/bands?track=buffer"]
    q += [f"/api/v1/ubatch/{i}" for i in u] + [f"/api/v1/graph?ubatch={i}" for i in u]
    q += [f"/api/v1/token/{i}" for i in (0, n_tok - 1)] + [f"/api/v1/sequence/{s}" for s in meta["sequences"]]
    q += [f"/api/v1/op/{ops[i]}" for i in (0, len(ops) // 3, len(ops) - 1)]
    q += [f"/api/v1/tensor/{i}" for i in (0, n_t // 2, n_t - 1)] + [f"/api/v1/layer/{i}" for i in (0, 1)]
    for x, to in (("ubatch", n_ub), ("time", end)):
        for metric in ("read", "fault_major", "fault_minor", "cache_fill", "block_read", "unused"):
            q.append(f"/api/v1/memmap/grid?track=disk&x={x}&metric={metric}&w=300&h=200")
        q.append(f"/api/v1/memmap/grid?track=disk&x={x}&x_from={to // 3}&x_to={to // 2}&w=64&h=64&memory=copy")
        q.append(f"/api/v1/memmap/grid?track=disk&x={x}&w=7&h=50&op=4&layer=1&phase=generate")
        q.append(f"/api/v1/memmap/grid?track=buffer&x={x}&w=300&h=200")
        q.append(f"/api/v1/memmap/tensors?x={x}&w=100")
        q.append(f"/api/v1/memmap/tensors?x={x}&w=100&layer=0&memory=file")
        q.append(f"/api/v1/memmap/cell?track=disk&x={x}&x_from=0&x_to={to}&y_from=0&y_to={meta['tracks']['disk']['size']}")
        q.append(f"/api/v1/memmap/cell?track=buffer&x={x}&x_from=0&x_to={to}&y_from=0&y_to={meta['tracks']['buffer']['size']}")
    for t in tracks:
        kind = "counter" if t["id"].startswith("counter:") else "slices"
        for w in (1000, 5):
            q.append(f"/api/v1/timeline/{kind}?track={t['id']}&t_from=0&t_to={end}&w={w}")
        q.append(f"/api/v1/timeline/{kind}?track={t['id']}&t_from={end // 3}&t_to={end // 2}&w=300")
    for sort in ("op_seq", "dur", "weight_bytes", "layer", "ubatch"):
        for desc in (0, 1):
            q.append(f"/api/v1/ops?sort={sort}&desc={desc}&offset=7&limit=300")
    q += ["/api/v1/ops?tensor=1&limit=5000", "/api/v1/ops?name=attn&layer=0&layer=1&limit=5000",
          f"/api/v1/ops?from_ubatch=1&to_ubatch={n_ub}&phase=generate&sort=dur&limit=5000", "/api/v1/ops?memory=anon&seq=0"]
    if meta["moe"]:
        q += ["/api/v1/moe/grid?phase=generate", "/api/v1/moe/grid?from_ubatch=1&to_ubatch=3"]
    for layer in meta["moe"][:2]:
        lid = layer["layer"]
        q += [f"/api/v1/moe/tokens?layer={lid}&w=50", f"/api/v1/moe/coactivation?layer={lid}",
              f"/api/v1/expert/{lid}/0"]
    return q + ["/api/v1/simulate"]


def answers(v: View, urls: list[str]) -> dict[str, tuple[int, bytes]]:
    out = {}
    for u in urls:
        out[u] = v.get(u)
        # Computed in the background: 202 until it is done.
        while out[u][0] == 202:
            time.sleep(0.2)
            out[u] = v.get(u)
    return out


def copy_trace(trace: Path, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(trace, d / NAME))


@pytest.fixture(scope="module")
def fresh(ttrace, traces, tmp_path_factory) -> dict[str, tuple[list[str], dict]]:
    """Per trace: the queries, and the answers of a view that indexed it in memory."""
    out = {}
    for name, trace in traces.items():
        d = tmp_path_factory.mktemp(f"fresh-{name}")
        v = View(ttrace, copy_trace(trace, d / "trace"), d / "cache")
        try:
            urls = queries(v)
            out[name] = (urls, answers(v, urls))
        finally:
            v.close()
    return out


def same_answers(v: View, fresh: tuple[list[str], dict]):
    urls, expected = fresh
    got = answers(v, urls)
    differ = [u for u in urls if got[u] != expected[u]]
    assert not differ, f"{len(differ)} of {len(urls)} answers differ, e.g. {differ[:5]}"
    assert all(s == 200 for s, _ in expected.values()), [u for u in urls if expected[u][0] != 200]


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_second_open_maps_the_index_and_answers_the_same(ttrace, traces, fresh, tmp_path, name):
    trace = copy_trace(traces[name], tmp_path / "trace")
    first = View(ttrace, trace, tmp_path / "cache")
    try:
        saved = first.saved()
        assert saved == Path(f"{NAME}.ttidx") and (trace.parent / saved).is_file()
        assert "reused" not in first.text()
    finally:
        first.close()
    second = View(ttrace, trace, tmp_path / "cache")
    try:
        assert f"ttrace: index {NAME}.ttidx reused" in second.text()
        same_answers(second, fresh[name])
        assert "index saved" not in second.text()
    finally:
        second.close()
    assert not (tmp_path / "cache" / "ttrace" / "index").exists()


def flip_byte(path: Path, at: int):
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def bump_version(path: Path):
    with path.open("r+b") as f:
        f.seek(8)
        (v,) = struct.unpack("<I", f.read(4))
        f.seek(8)
        f.write(struct.pack("<I", v + 1))


# The index header's fields (view/index/disk/mod.rs `Header`, repr(C)).
BOOT, HEADER_HASH, HEADER_END = slice(72, 88), slice(136, 168), 168


def as_after_a_reboot(path: Path):
    """The index as a later boot finds it: written or last checked in another
    boot, so its body hash is checked again (within one boot it is not)."""
    header = bytearray(path.read_bytes()[:HEADER_END])
    assert header[BOOT] == uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes
    header[BOOT] = bytes(16)[:-1] + b"\x01"
    header[HEADER_HASH] = bytes(32)
    header[HEADER_HASH] = blake3.blake3(bytes(header)).digest()
    with path.open("r+b") as f:
        f.write(header)


def damaged_after_a_reboot(index: Path):
    flip_byte(index, index.stat().st_size // 2)
    as_after_a_reboot(index)


def touch(path: Path):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


STALE = {
    # What is done to the trace or its index, and what stderr then says.
    "touched": (lambda trace, index: touch(trace), "made for the trace as it was before"),
    "version": (lambda trace, index: bump_version(index), "this ttrace reads version"),
    "damaged": (lambda trace, index: damaged_after_a_reboot(index), "do not match their hash"),
    "cut index": (lambda trace, index: os.truncate(index, index.stat().st_size // 2), "damaged"),
    "not an index": (lambda trace, index: index.write_bytes(b"\0" * 8192), "no ttrace index"),
}


@pytest.mark.parametrize("name", list(RECORDINGS))
def test_ops_by_ubatch_range_and_phase_are_the_exports(ttrace, traces, tmp_path, name):
    """The op table filtered by ubatch range and phase (set span by span when each ubatch's
    ops are contiguous, without reading a row) lists the JSONL export's op rows of those
    ubatches and phases, and counts them, whether the index was built or mapped."""
    trace = copy_trace(traces[name], tmp_path / "trace")
    rows = [json.loads(line) for line in export(ttrace, trace, "jsonl", tmp_path / "e.jsonl").read_text().splitlines()]
    ops = [r for r in rows if r["kind"] == "op"]
    n_ub = max(r["ubatch"] for r in ops if r["ubatch"] is not None) + 1
    for opened in ("built", "mapped"):
        v = View(ttrace, trace, tmp_path / "cache")
        try:
            assert ("reused" in v.text()) == (opened == "mapped")
            for a, b, phases in ((0, n_ub, ["generate"]), (1, n_ub // 2, ["prompt", "generate"]), (0, 1, ["warmup"])):
                query = "".join(f"&phase={p}" for p in phases)
                want = [r["seq"] for r in ops if r["ubatch"] is not None and a <= r["ubatch"] < b and r["phase"] in phases]
                for desc in (0, 1):
                    code, body = v.get(f"/api/v1/ops?from_ubatch={a}&to_ubatch={b}{query}&desc={desc}&limit=5000")
                    assert code == 200, body
                    (n,) = struct.unpack_from("<I", body, 4)
                    total = json.loads(body[8:8 + n])["meta"]["total"]
                    assert want and total == len(want), (opened, a, b, phases, total, len(want))
                    assert columns(body)["op"] == (want[::-1] if desc else want)[:5000], (opened, a, b, phases, desc)
            if opened == "built":
                v.saved()
        finally:
            v.close()


@pytest.mark.parametrize("change", list(STALE))
def test_a_stale_index_is_rebuilt(ttrace, traces, fresh, tmp_path, change):
    trace = copy_trace(traces["gemma"], tmp_path / "trace")
    first = View(ttrace, trace, tmp_path / "cache")
    index = trace.parent / first.saved()
    first.close()
    act, said = STALE[change]
    act(trace, index)
    again = View(ttrace, trace, tmp_path / "cache")
    try:
        note = next((line for line in again.text().splitlines() if "not used" in line), "")
        assert said in note and "indexing the trace again" in note, again.text()
        assert "reused" not in again.text()
        same_answers(again, fresh["gemma"])
        assert again.saved() == Path(f"{NAME}.ttidx")
    finally:
        again.close()
    third = View(ttrace, trace, tmp_path / "cache")
    try:
        assert "reused" in third.text() and "not used" not in third.text(), third.text()
    finally:
        third.close()


def test_an_index_from_another_boot_is_checked_then_marked(ttrace, traces, fresh, tmp_path):
    """After a reboot the index's body is hashed once, found whole, used, and
    marked as checked in this boot (the next open skips the hash)."""
    trace = copy_trace(traces["gemma"], tmp_path / "trace")
    first = View(ttrace, trace, tmp_path / "cache")
    index = trace.parent / first.saved()
    first.close()
    as_after_a_reboot(index)
    again = View(ttrace, trace, tmp_path / "cache", verbose=True)
    try:
        assert "reused" in again.text() and "index hash checked" in again.text(), again.text()
        same_answers(again, fresh["gemma"])
    finally:
        again.close()
    third = View(ttrace, trace, tmp_path / "cache", verbose=True)
    try:
        assert "reused" in third.text() and "index hash checked" not in third.text(), third.text()
    finally:
        third.close()
    as_after_a_reboot(index)  # asserts the header says this boot again


def test_a_trace_that_grew_or_shrank_is_indexed_again(ttrace, traces, fresh, tmp_path):
    """An index of a trace still being written (cut short: up to its last
    whole frame) is not the index of the whole trace, nor the reverse."""
    full = traces["gemma"]
    trace = copy_trace(full, tmp_path / "trace")
    os.truncate(trace, full.stat().st_size * 2 // 3)
    cut = View(ttrace, trace, tmp_path / "cache")
    cut.saved()
    cut_meta = json.loads(cut.get("/api/v1/meta")[1])
    cut.close()
    assert cut_meta["trace"]["truncated"] and cut_meta["counts"]["ops"] < json.loads(fresh["gemma"][1]["/api/v1/meta"][1])["counts"]["ops"]
    shutil.copyfile(full, trace)  # appended: the recording went on
    grown = View(ttrace, trace, tmp_path / "cache")
    try:
        assert "made for the trace as it was before" in grown.text(), grown.text()
        same_answers(grown, fresh["gemma"])
        grown.saved()
    finally:
        grown.close()
    os.truncate(trace, full.stat().st_size * 2 // 3)  # and cut again
    shrunk = View(ttrace, trace, tmp_path / "cache")
    try:
        assert "made for the trace as it was before" in shrunk.text(), shrunk.text()
        assert json.loads(shrunk.get("/api/v1/meta")[1]) == cut_meta
    finally:
        shrunk.close()


def test_read_only_directory_keeps_the_index_in_the_cache(ttrace, traces, fresh, tmp_path):
    src = copy_trace(traces["gemma"], tmp_path / "src")
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", src.parent, ro], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", ro], check=True)
        cache = tmp_path / "cache"
        first = View(ttrace, ro / NAME, cache)
        saved = first.saved()
        first.close()
        assert saved.parent == cache / "ttrace" / "index" and saved.suffix == ".ttidx", saved
        assert not (ro / f"{NAME}.ttidx").exists()
        second = View(ttrace, ro / NAME, cache)
        try:
            assert f"ttrace: index {saved} reused" in second.text(), second.text()
            same_answers(second, fresh["gemma"])
        finally:
            second.close()
    finally:
        subprocess.run(["umount", ro], check=True)


def test_a_ring_of_files_is_indexed_as_one_trace(ttrace, tmp_path, llama_completion, models, flush_log_preload):
    """`--max-size` writes t.data.NNNN only: `view t.data` indexes the set,
    a second open reuses that index with the same answers, and a member
    changed since makes it stale."""
    d = tmp_path / "trace"
    d.mkdir()
    record(ttrace, d / NAME, llama_completion, models["moe"], flush_log_preload, ("--max-size", "64K"))
    members = sorted(d.glob(f"{NAME}.[0-9][0-9][0-9][0-9]"))
    assert len(members) >= 2 and not (d / NAME).exists(), members
    first = View(ttrace, d / NAME, tmp_path / "cache")
    try:
        assert first.saved() == Path(f"{NAME}.ttidx")
        urls = queries(first)
        expected = answers(first, urls)
    finally:
        first.close()
    second = View(ttrace, d / NAME, tmp_path / "cache")
    try:
        assert f"ttrace: index {NAME}.ttidx reused" in second.text(), second.text()
        same_answers(second, (urls, expected))
    finally:
        second.close()
    touch(members[-1])
    third = View(ttrace, d / NAME, tmp_path / "cache")
    try:
        assert "reused" not in third.text() and "not used" in third.text(), third.text()
    finally:
        third.close()
