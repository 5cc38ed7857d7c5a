"""`--max-size SIZE [--max-files N]`: a run written as a ring of files
BASE.0000, BASE.0001, ..., read back as one run by giving BASE. Oracles:
llama.cpp's own perf counters, a one-file trace of the same deterministic
(greedy, fixed seed) command, the model file's size (a cold run reads it
once), each file of the ring read alone (their sums), and for a ring whose
oldest files are gone, the whole ring of the same recording restricted to
the ubatches the kept files hold."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_trace_core import PERF_EVAL, PERF_PROMPT, report

NEXT_FILE = "continued in the next file of the ring"


def completion(llama_completion, model: Path, n: int, *extra) -> list:
    return [llama_completion, "-m", model, "-p", "hello world", "-n", str(n), "-no-cnv", "--ignore-eos", "--perf",
            "--temp", "0", "--seed", "1", "-t", "2", *extra]


def record(ttrace, out: Path, argv: list, *opts, preload: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"LD_PRELOAD": str(preload)} if preload else {})}
    proc = subprocess.run([ttrace, "run", "-o", out, *opts, "--", *argv], capture_output=True, text=True,
                          errors="replace", timeout=600, env=env)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def llama_counts(proc) -> tuple[int, int]:
    prompt, runs = PERF_PROMPT.findall(proc.stderr), PERF_EVAL.findall(proc.stderr)
    assert len(prompt) == 1 and len(runs) == 1, f"llama's perf lines missing:\n{proc.stderr[-2000:]}"
    return int(prompt[0]), int(runs[0])


def private_copy(model: Path, tmp_path: Path) -> Path:
    """--drop-caches cannot evict pages another process maps: others on
    this machine run the shared model."""
    copy = tmp_path / model.name
    shutil.copyfile(model, copy)
    return copy


def members(base: Path) -> list[Path]:
    return sorted(base.parent.glob(base.name + ".[0-9][0-9][0-9][0-9]"))


def phases(a: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for u in a["ubatches"]:
        out[u["phase"]] = out.get(u["phase"], 0) + 1
    return out


def ubatch_io(a: dict, u: dict) -> dict:
    """A ubatch's figures that add up across files: its disk issues (a
    request requeued is issued again) and faults."""
    w = a["io"]["by_when"].get(f"ubatch {u['index']}", {"disk": {"issues": 0, "issue_bytes": 0},
                                                          "faults_major": 0, "faults_minor": 0})
    return {"issues": w["disk"]["issues"], "issue_bytes": w["disk"]["issue_bytes"],
            "faults_major": w["faults_major"], "faults_minor": w["faults_minor"]}


def ubatch_key(a: dict, u: dict) -> tuple:
    return (u["start_ns"], u["phase"], u["n_tokens"], u["token_ids"], u["ops"], tuple(sorted(ubatch_io(a, u).items())))


def test_a_ring_of_a_cold_run_totals_as_one_file_and_as_llama_counts(ttrace, tmp_path, llama_completion,
                                                                     flush_log_preload, models):
    model = private_copy(models["tiny"], tmp_path)
    argv = completion(llama_completion, model, 200)
    one = tmp_path / "one.data"
    p1 = record(ttrace, one, argv, "--drop-caches", preload=flush_log_preload)
    # About eight files, whatever the frames' size on this build.
    max_size = one.stat().st_size // 8
    base = tmp_path / "ring.data"
    p2 = record(ttrace, base, argv, "--drop-caches", "--max-size", str(max_size), preload=flush_log_preload)
    files = members(base)
    assert len(files) >= 5, f"{len(files)} files of {max_size} bytes"
    assert not base.exists(), "a ring writes BASE.NNNN only"
    a, b = report(ttrace, one), report(ttrace, base)

    assert llama_counts(p1) == llama_counts(p2) == (a["prompt_tokens"], a["generate_runs"]) \
        == (b["prompt_tokens"], b["generate_runs"])
    assert phases(a) == phases(b) and b["tokens"] == a["tokens"]
    assert [u["token_ids"] for u in b["ubatches"]] == [u["token_ids"] for u in a["ubatches"]], "greedy: same tokens"
    assert [u["ops"] for u in b["ubatches"]] == [u["ops"] for u in a["ubatches"]]
    # A cold run reads the model once: its size in pages, in both traces.
    pages = -(-model.stat().st_size // 4096) * 4096
    assert a["io"]["disk"]["bytes"] == b["io"]["disk"]["bytes"] == pages
    assert b["summary"]["ring"] == {"first_index": 0, "last_index": len(files) - 1, "missing": None}
    assert b["trailer"]["stop_reason"] == "target exited" and not b["truncated"]
    assert set(b["lost"].values()) == {0}
    # One model table, not one per file; the models are the one-file trace's.
    assert b["models"] == a["models"]
    # The end-of-run summary names the ring.
    assert f"files 0000 to {len(files) - 1:04} of a ring" in p2.stderr


# Per-node op records (whose descriptor ids OpTimes keeps per writer) and
# node values (which name graphs by the file's ids) across files.
@pytest.mark.parametrize("opts", [("--op-timing",), ("--values",)], ids=["op-timing", "values"])
def test_op_timing_and_values_rings_total_as_one_file(ttrace, tmp_path, llama_completion, flush_log_preload, models,
                                                      opts):
    argv = completion(llama_completion, models["tiny"], 60)
    one = tmp_path / "one.data"
    record(ttrace, one, argv, *opts, preload=flush_log_preload)
    base = tmp_path / "ring.data"
    record(ttrace, base, argv, *opts, "--max-size", str(one.stat().st_size // 6), preload=flush_log_preload)
    assert len(members(base)) >= 5
    a, b = report(ttrace, one), report(ttrace, base)
    for key in ("ops", "op_counts", "generate_runs", "prompt_tokens", "lost"):
        assert a[key] == b[key], key
    assert [(u["token_ids"], u["ops"]) for u in b["ubatches"]] == [(u["token_ids"], u["ops"]) for u in a["ubatches"]]
    if "--values" in opts:
        said = [subprocess.run([ttrace, "report", t], capture_output=True, text=True, check=True).stdout
                for t in (one, base)]
        values = [re.search(r"node values: .*", s).group(0) for s in said]
        assert values[0] == values[1] and "outputs fingerprinted" in values[0]


def test_each_file_reads_alone_and_a_ring_missing_its_oldest_is_partial(ttrace, tmp_path, llama_completion,
                                                                        flush_log_preload, models):
    # Under a memory limit the model streams from disk as it generates: every
    # file holds disk reads and faults. How much it reads depends on the
    # machine's load: 3.7 GiB (a 20 MB trace) when generation took 6 s, 215
    # MiB (1.6 MB) when it took 32 s beside other work. Files are cut only
    # between decode calls, so a small size gives one per token when the
    # trace is large and still more than five when it is small.
    argv = completion(llama_completion, private_copy(models["tiny"], tmp_path), 40, "-c", "128")
    base = tmp_path / "ring.data"
    record(ttrace, base, argv, "--drop-caches", "--mem-limit", "14M", "--max-size", "100K", preload=flush_log_preload)
    files = members(base)
    assert len(files) >= 5, f"{len(files)} files"
    whole = report(ttrace, base)
    assert whole["io"]["disk"]["issue_bytes"] > 0

    # Each file alone: whole decode calls, and the sums are the ring's.
    alone = [report(ttrace, f) for f in files]
    for i, r in enumerate(alone):
        assert not r["truncated"], files[i]
        assert r["trailer"]["stop_reason"] == (NEXT_FILE if i < len(files) - 1 else "target exited")
        assert r["summary"]["ring"]["first_index"] == i
        assert (r["summary"]["ring"]["missing"] is None) == (i == 0)
    for key in ("ops", "faults", "generate_runs", "prompt_tokens"):
        assert sum(r[key] for r in alone) == whole[key], key
    for key in ("issues", "issue_bytes"):
        assert sum(r["io"]["disk"][key] for r in alone) == whole["io"]["disk"][key], key
    assert sum(len(r["ubatches"]) for r in alone) == len(whole["ubatches"])

    # The newest three, as --max-files 3 would leave them.
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    for f in files[-3:]:
        shutil.copy(f, kept_dir / f.name)
    part = report(ttrace, kept_dir / base.name)
    first_kept = len(files) - 3
    missing = part["summary"]["ring"]["missing"]
    assert part["summary"]["ring"]["first_index"] == first_kept and missing["files"] == first_kept
    assert missing["from_ns"] == whole["header"]["start_monotonic_ns"] < missing["to_ns"]
    # The first kept file begins at a decode call: before its ubatch.
    first = next(i for i, u in enumerate(whole["ubatches"]) if u["start_ns"] >= missing["to_ns"])
    assert whole["ubatches"][first - 1]["start_ns"] < missing["to_ns"]
    # Exactly the whole ring's ubatches from there on.
    expected = whole["ubatches"][first:]
    assert [ubatch_key(part, u) for u in part["ubatches"]] == [ubatch_key(whole, u) for u in expected]
    assert part["generate_runs"] == sum(u["phase"] == "generate" for u in expected)
    assert part["ops"] == sum(u["ops"] for u in expected)
    text = subprocess.run([ttrace, "report", kept_dir / base.name], capture_output=True, text=True, check=True).stdout
    assert f"PARTIAL: files 0000 to {first_kept - 1:04} are not read" in text
    # Those that print no summary say it on stderr.
    for cmd in (["export", kept_dir / base.name, "--format", "jsonl", "-o", tmp_path / "rows.jsonl"],
                ["simulate", kept_dir / base.name, "--budgets", "8M"]):
        proc = subprocess.run([ttrace, *cmd], capture_output=True, text=True, check=True)
        assert "PARTIAL" in proc.stderr, (cmd, proc.stderr)


def test_max_files_keeps_the_newest_and_says_what_is_missing(ttrace, tmp_path, llama_completion, flush_log_preload,
                                                            models):
    argv = completion(llama_completion, models["tiny"], 200)
    one = tmp_path / "one.data"
    record(ttrace, one, argv, preload=flush_log_preload)
    a = report(ttrace, one)
    base = tmp_path / "ring.data"
    proc = record(ttrace, base, argv, "--max-size", str(one.stat().st_size // 8), "--max-files", "3",
                  preload=flush_log_preload)
    files = members(base)
    indices = [int(f.suffix[1:]) for f in files]
    assert len(files) == 3 and indices == list(range(indices[0], indices[0] + 3)) and indices[0] >= 2
    b = report(ttrace, base)
    assert b["summary"]["ring"]["missing"]["files"] == indices[0]
    assert "PARTIAL" in proc.stderr
    # The kept ubatches are the run's last ones: the one-file trace's tail.
    kept = [u["token_ids"] for u in b["ubatches"]]
    assert 0 < len(kept) < len(a["ubatches"])
    assert kept == [u["token_ids"] for u in a["ubatches"]][-len(kept):]
    assert b["generate_runs"] == len(kept) < llama_counts(proc)[1]


def test_ctrl_c_closes_the_last_file(ttrace, tmp_path, llama_completion, models):
    base = tmp_path / "ring.data"
    argv = completion(llama_completion, models["tiny"], 1_000_000, "-c", "256", "--context-shift")
    proc = subprocess.Popen([ttrace, "run", "-o", base, "--max-size", "50K", "--", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    deadline = time.monotonic() + 60
    while len(members(base)) < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    files = members(base)
    assert len(files) >= 4, stderr[-2000:]
    # llama-completion's SIGINT handler joins llama's log thread and
    # deadlocks when the signal lands while the log lock is held (about one
    # run in two here, without ttrace too; see run_controls.rs): ttrace then
    # kills it after its grace. Either way the last file is closed whole.
    endings = {"interrupted", "interrupted (target killed after 10 s)"}
    last = report(ttrace, files[-1])
    assert last["trailer"]["stop_reason"] in endings and not last["truncated"]
    whole = report(ttrace, base)
    assert not whole["truncated"] and whole["trailer"]["stop_reason"] == last["trailer"]["stop_reason"]
    assert len(whole["ubatches"]) == sum(len(report(ttrace, f)["ubatches"]) for f in files)


def test_bad_options_and_bad_rings_are_refused_by_name(ttrace, tmp_path, llama_completion, models):
    argv = ["true"]
    for opts, says in [(["--max-size", "0"], "above zero"), (["--max-size", "10Q"], "unknown unit"),
                       (["--max-files", "3"], "--max-size"), (["--max-size", "1M", "--max-files", "0"], "not in 1..")]:
        proc = subprocess.run([ttrace, "run", "-o", tmp_path / "x.data", *opts, "--", *argv], capture_output=True,
                              text=True)
        assert proc.returncode != 0 and says in proc.stderr, (opts, proc.stderr)
    assert not list(tmp_path.iterdir())

    run = completion(llama_completion, models["tiny"], 100)
    # A ring named after /dev/null would remove it (as root): refused.
    proc = subprocess.run([ttrace, "run", "-o", "/dev/null", "--max-size", "1M", "--", *run], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "give -o a file name" in proc.stderr, proc.stderr
    assert Path("/dev/null").is_char_device()
    for name in ("a", "b"):
        record(ttrace, tmp_path / f"{name}.data", run, "--max-size", "20K")
    a, b = members(tmp_path / "a.data"), members(tmp_path / "b.data")
    assert len(a) >= 3 and len(b) >= 3
    # A middle file missing.
    middle = a[1].read_bytes()
    a[1].unlink()
    proc = subprocess.run([ttrace, "report", tmp_path / "a.data"], capture_output=True, text=True)
    assert proc.returncode != 0 and f"misses {a[1]}" in proc.stderr, proc.stderr
    # Another recording's file in its place.
    shutil.copy(b[1], a[1])
    proc = subprocess.run([ttrace, "report", tmp_path / "a.data"], capture_output=True, text=True)
    assert proc.returncode != 0 and "not of the same run" in proc.stderr, proc.stderr
    a[1].write_bytes(middle)
    assert report(ttrace, tmp_path / "a.data")["summary"]["ring"]["last_index"] == len(a) - 1
    # No file, no ring: the usual error.
    proc = subprocess.run([ttrace, "report", tmp_path / "none.data"], capture_output=True, text=True)
    assert proc.returncode != 0 and "none.data" in proc.stderr
