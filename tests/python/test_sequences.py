"""Batched and served inference: ttrace's prompt and generated token counts per
sequence and request against llama.cpp's own figures, llama-batched-bench's
table and llama-server's per-response timings, on the real model. Needs root:
the traces are recorded here."""
from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from test_exports import Pftrace, export, jsonl_rows

# (prompt, n_predict): different prompt and output lengths.
PROMPTS = [
    ("Tell me about the sea.", 12),
    ("One two three four five six seven eight nine ten eleven twelve", 5),
    ("Why?", 20),
    ("Write a short poem about a cat sitting on a warm windowsill in the afternoon sun", 9),
]


def report(ttrace, trace: Path) -> dict:
    out = subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def bench_table(text: str) -> list[dict]:
    """llama-batched-bench's own table rows: PP, TG, B."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and all(re.fullmatch(r"\d+", c) for c in cells[:3]):
            rows.append({"pp": int(cells[0]), "tg": int(cells[1]), "b": int(cells[2])})
    return rows


def test_batched_bench_counts_equal_its_table(ttrace, tmp_path, paths, models):
    bench = Path(paths["llama_lib_dir"]) / "llama-batched-bench"
    trace = tmp_path / "bb.data"
    argv = [ttrace, "run", "-o", trace, "--", bench, "-m", models["gemma"], "-c", "2048", "-b", "512", "-ub", "512",
            "-npp", "16", "-ntg", "8", "-npl", "1,4", "-t", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = bench_table(proc.stdout + proc.stderr)
    assert [(r["pp"], r["tg"], r["b"]) for r in table] == [(16, 8, 1), (16, 8, 4)]

    a = report(ttrace, trace)
    t = a["tokens"]
    assert (t["prompt"], t["generated"]) == (sum(r["pp"] * r["b"] for r in table), sum(r["tg"] * r["b"] for r in table))
    assert t["sequences"] == max(r["b"] for r in table)
    # Warm-up apart: the bench's own 16-token batch, which asks for no output.
    warm = [r for r in a["requests"] if r["warmup"]]
    assert [r["prompt_tokens"] for r in warm] == [16] and t["warmup_tokens"] == 16
    # Per phase of the bench (its requests start together): B requests of PP + TG tokens.
    phases: dict[int, list[dict]] = {}
    for r in a["requests"]:
        if not r["warmup"]:
            phases.setdefault(r["first_decode"], []).append(r)
    got = [[(r["prompt_tokens"], r["generated_tokens"]) for r in p] for _, p in sorted(phases.items())]
    assert got == [[(row["pp"], row["tg"])] * row["b"] for row in table]
    assert sorted(r["seq"] for r in phases[max(phases)]) == [0, 1, 2, 3]
    text = subprocess.run([ttrace, "report", trace], capture_output=True, text=True, check=True).stdout
    assert "tokens       80 prompt, 40 generated, 4 sequences" in text
    assert "per request" in text
    check_exports(ttrace, trace, a, tmp_path)


def expected_columns(tokens: list[dict]) -> tuple[str, str] | tuple[None, None]:
    """`seq_ids` and `positions` of a ubatch, from the report's tokens."""
    order: dict[int, list[int]] = {}
    for t in tokens:
        order.setdefault(t["seq"], []).append(t["pos"])
    if not order:
        return None, None
    ranges = [str(min(p)) if min(p) == max(p) else f"{min(p)}-{max(p)}" for p in order.values()]
    return ";".join(map(str, order)), ";".join(ranges)


def check_exports(ttrace, trace: Path, a: dict, tmp_path: Path):
    """Rows carry each ubatch's sequences and positions (JSONL and Parquet
    alike); Perfetto has a track per sequence with a slice per ubatch."""
    rows = jsonl_rows(ttrace, trace, tmp_path / "rows.jsonl")
    want = {u["index"]: expected_columns(u["tokens"]) for u in a["ubatches"]}
    ops = [r for r in rows if r["kind"] == "op"]
    assert ops and all((r["seq_ids"], r["positions"]) == want[r["ubatch"]] for r in ops)
    # The bench's generate steps: one token of each of the 4 sequences, at PP + i.
    steps = [want[u["index"]] for u in a["ubatches"] if u["phase"] == "generate" and len(u["tokens"]) == 4]
    assert steps == [("0;1;2;3", ";".join([str(16 + i)] * 4)) for i in range(8)]
    table = pq.read_table(export(ttrace, trace, "parquet", tmp_path / "rows.parquet"))
    assert table.column("seq_ids").to_pylist() == [r["seq_ids"] for r in rows]
    assert table.column("positions").to_pylist() == [r["positions"] for r in rows]

    pf = Pftrace(export(ttrace, trace, "perfetto", tmp_path / "t.pftrace").read_bytes())
    for seq in range(4):
        uuid = pf.by_name[f"sequence {seq}"]
        names = pf.slice_names[uuid]
        per_seq = [u for u in a["ubatches"] if any(t["seq"] == seq for t in u["tokens"])]
        assert len(names) == len(per_seq) == pf.ends[uuid]
        # Sequence 0 runs in both phases of the bench.
        assert sum(n.endswith(f"generate {16 + i}") for n in names for i in range(8)) == (16 if seq == 0 else 8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, timeout: float = 120, proc=None):
    """Until llama-server answers /health; fails if `proc` (what started it) ends first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"the process starting llama-server exited ({proc.returncode}) before it came up",
                            pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail("llama-server did not come up", pytrace=False)
            time.sleep(0.3)


def serve(port: int, timeout: float = 120) -> list[dict]:
    """Wait for the server, send the four completions at once; their responses."""
    base = f"http://127.0.0.1:{port}"
    wait_healthy(port, timeout)

    def complete(item):
        body = json.dumps({"prompt": item[0], "n_predict": item[1], "cache_prompt": False,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/completion", body, {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=120).read())

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(complete, PROMPTS))


def check_requests(a: dict, responses: list[dict]):
    """Every response is one counted request of its slot, with the server's
    prompt count and its predicted count as outputs (the server samples one
    token more than it decodes: the last is never fed back)."""
    counted = [r for r in a["requests"] if not r["warmup"] and not r["prompt_only"]]
    assert len(counted) == len(responses)
    for resp in responses:
        t = resp["timings"]
        match = [r for r in counted if r["seq"] == resp["id_slot"] and r["prompt_tokens"] == t["prompt_n"]]
        assert len(match) == 1, (resp["id_slot"], t, counted)
        r = match[0]
        assert (r["outputs"], r["generated_tokens"]) == (t["predicted_n"], t["predicted_n"] - 1), (r, t)
    tokens = a["tokens"]
    assert tokens["prompt"] == sum(r["timings"]["prompt_n"] for r in responses)
    assert tokens["generated"] == sum(r["timings"]["predicted_n"] - 1 for r in responses)
    assert tokens["sequences"] == len(responses)
    # Anything else is the server's start-up work, none of it generating.
    others = [r for r in a["requests"] if r["warmup"] or r["prompt_only"]]
    assert all(r["generated_tokens"] == 0 for r in others)


def server_argv(paths, models, port: int) -> list:
    server = Path(paths["llama_lib_dir"]) / "llama-server"
    return [server, "-m", models["gemma"], "--host", "127.0.0.1", "--port", str(port), "-np", str(len(PROMPTS)),
            "-c", "4096", "-t", "2", "--no-webui"]


def record_server(ttrace, trace: Path, paths, models, waves: int = 1) -> list[dict]:
    """`ttrace run -o trace` of llama-server serving `waves` rounds of the four
    concurrent completions; their responses."""
    port = free_port()
    proc = subprocess.Popen([ttrace, "run", "-o", trace, "--", *server_argv(paths, models, port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        responses = [r for _ in range(waves) for r in serve(port)]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: ttrace stops the server and writes the trace
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return responses


def test_server_requests_equal_its_timings(ttrace, tmp_path, paths, models):
    trace = tmp_path / "srv.data"
    responses = record_server(ttrace, trace, paths, models)
    a = report(ttrace, trace)
    check_requests(a, responses)
    # The server's start-up check of its context (llama.cpp's common_context_can_seq_rm:
    # tokens [0, 0], decoded and cleared) is neither prompt nor generation.
    checks = [d for d in a["decodes"] if d["context_check"]]
    assert [(d["n_tokens"], d["phase"]) for d in checks] == [(2, "aux")], checks
    checked = {u for d in checks for u in d["ubatches"]}
    assert all(u["phase"] == "aux" for u in a["ubatches"] if u["index"] in checked)
    text = subprocess.run([ttrace, "report", trace], capture_output=True, text=True, check=True).stdout
    assert re.search(r"tokens\s+\d+ prompt, \d+ generated, 4 sequences", text)


def test_attach_to_a_running_server(ttrace, tmp_path, paths, models):
    port = free_port()
    server = subprocess.Popen(server_argv(paths, models, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, errors="replace")
    trace = tmp_path / "attach.data"
    try:
        serve(port, timeout=120)  # up and warm before ttrace attaches
        tracer = subprocess.Popen([ttrace, "attach", "--pid", str(server.pid), "-o", trace],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        time.sleep(3)  # probes attached
        assert tracer.poll() is None, tracer.communicate()[1][-3000:]
        responses = serve(port)
        tracer.send_signal(signal.SIGINT)  # detach; the server keeps running
        _, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, err[-3000:]
        assert server.poll() is None, "detaching left the server running"
    finally:
        server.terminate()
        server.communicate(timeout=60)
    check_requests(report(ttrace, trace), responses)
