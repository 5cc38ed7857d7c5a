"""`ttrace simulate` against reality (issue 28): cold `--mem-limit` runs at
three budgets, five runs each, on Gemma 3 270M (the real model: a 241 MiB
file streamed whole every token, dominated by the 170 MiB output
projection) and on the synthetic MoE model `moe` (8 experts, 2 routed: each
token reads a different quarter of the expert slices).

The model is read from ext4 on a loop device with the kernel's default
readahead (conftest's `default_readahead_dir`: 256 KiB read-around windows,
what NVMe and SSD users have). On this VM's own disk (`read_ahead_kb` 8192,
16 MiB windows, larger than `moe`'s whole cache) the runs spread 2-4x at one
budget and the prediction is off: docs/SIMULATE.md, "Where it is off".

Measured: the block reads in the model file during generate ubatches (the
trace's own block I/O, which test_trace_core holds equal to the kernel's
blk tracer), per generated token, median of five runs, each on a private
copy of the model made cold with posix_fadvise(DONTNEED). Predicted:
`ttrace simulate` of an unlimited trace of the same command on the same
device, with the readahead and anonymous memory that trace recorded.

Runs for about 7 minutes (32 traced runs)."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from conftest import DEFAULT_READ_AHEAD_KB

PROMPT = "The history of the printing press begins in"
MIB = 1 << 20
RUNS = 5
TOLERANCE = 0.20
# Gemma's are the issue's. `moe`'s: 12M-16M, where every token thrashes
# (the cache holds a fifth to two fifths of the 26 MiB file). From 18M to
# 24M, the knee of its curve, the prediction moves with the recorded peak
# anonymous memory, which varies by 1.6 MiB between runs (4.4-6.0 MiB: 2q
# at 24M 0.8-1.2 MiB per token, at 18M 4.0-6.8), so one unlimited trace
# can land 20 % off (docs/SIMULATE.md).
BUDGETS = {"gemma": ["160M", "200M", "256M"], "moe": ["12M", "14M", "16M"]}


def completion(ttrace, out: Path, llama_completion, model: Path, preload: Path, limit: str | None,
               prompt: str = PROMPT, tokens: int = 16, ctx: int = 512) -> dict:
    """Trace a greedy llama-completion of `tokens` tokens (under `limit`, if
    any); the report's JSON."""
    argv = [ttrace, "run", "-o", out]
    if limit:
        argv += ["--mem-limit", limit]
    argv += ["--", llama_completion, "-m", model, "-p", prompt, "-n", str(tokens), "-c", str(ctx), "-t", "2",
             "--temp", "0", "--ignore-eos", "-no-cnv"]
    env = dict(os.environ, LD_PRELOAD=str(preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout)


def generation_reads_per_token(a: dict, generated: int = 15) -> float:
    """Block reads in the model file during generate ubatches, per generated
    token (the last of `-n N` tokens is never fed back: N - 1 ubatches)."""
    generate = next(p for p in a["stats"]["phases"] if p["phase"] == "generate")
    assert generate["tokens"] == generated and generate["disk_bytes"] is not None
    return generate["disk_bytes"] / generate["tokens"]


def cold_copy(source: Path, to: Path) -> Path:
    """A new inode with none of its pages cached."""
    if to.exists():
        to.unlink()
    shutil.copyfile(source, to)
    os.sync()
    fd = os.open(to, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return to


def predict(ttrace, trace: Path, budgets: list[str], *options) -> dict:
    proc = subprocess.run([ttrace, "simulate", trace, "--budgets", ",".join(budgets), "--json", *options],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["gemma", "moe"])
def test_predictions_against_memory_limited_runs(ttrace, tmp_path, llama_completion, models, flush_log_preload,
                                                  default_readahead_dir, name):
    cold = default_readahead_dir / f"cold-{name}.gguf"
    unlimited = completion(ttrace, tmp_path / "free.data", llama_completion, cold_copy(models[name], cold),
                           flush_log_preload, None)
    anon = unlimited["trailer"]["peak_anon_bytes"]
    assert anon, "the run recorded its anonymous memory"
    size = models[name].stat().st_size
    # Everything fits: the file, the anonymous memory, and a margin for the
    # kernel memory the cgroup is charged too (page tables, slab).
    whole = f"{(size + anon) // MIB + 8}M"
    doc = predict(ttrace, tmp_path / "free.data", [*BUDGETS[name], whole])
    assert "recorded" in doc["readahead_source"], doc["readahead_source"]
    assert doc["readahead"]["window_bytes"] == 2 * DEFAULT_READ_AHEAD_KB * 1024, doc["readahead"]
    predicted = {(r["budget_bytes"], r["policy"]): r["disk_bytes_per_token"] for r in doc["rows"]}

    measured: dict[str, list[float]] = {}
    for run in range(RUNS):
        for budget in [*BUDGETS[name], *([whole] if run == 0 else [])]:
            model = cold_copy(models[name], cold)
            trace = tmp_path / f"{budget}-{run}.data"
            a = completion(ttrace, trace, llama_completion, model, flush_log_preload, budget)
            # `run` read the cgroup's memory.stat every tick (which keeps
            # reclaim's statistics fresh); each charge stayed in the limit
            # (the two peaks need not fall at the same tick).
            peak = a["trailer"]["cgroup_peak"]
            assert 0 < peak["anon_bytes"] <= parse_size(budget) and 0 < peak["file_bytes"] <= parse_size(budget), peak
            measured.setdefault(budget, []).append(generation_reads_per_token(a))
            if run == 0:
                # simulate of a limited trace sets what the run read beside
                # its prediction at the run's own budget.
                own = predict(ttrace, trace, [budget])["measured"]
                generate = next(p for p in a["stats"]["phases"] if p["phase"] == "generate")
                assert (own["budget_bytes"], own["disk_bytes"]) == (parse_size(budget), generate["disk_bytes"]), own
            trace.unlink()

    lines = [f"{name}: generation's disk MiB per generated token, readahead "
             f"{doc['readahead']['window_bytes'] // 1024} KiB, anon {anon / MIB:.1f} MiB",
             f"{'budget':>8} {'measured (runs)':>26} {'median':>8} {'lru':>14} {'2q':>14} {'opt':>8}"]
    failures = []
    for budget in [*BUDGETS[name], whole]:
        b = parse_size(budget)
        runs = measured[budget]
        median = statistics.median(runs)
        lru, two, opt = (predicted[(b, p)] for p in ("lru", "2q", "opt"))

        def off(p: float) -> str:
            return f"{p / MIB:6.1f} ({(p - median) / median:+.0%})" if median else f"{p / MIB:6.1f}"

        lines.append(f"{budget:>8} {', '.join(f'{m / MIB:.1f}' for m in runs):>26} {median / MIB:8.1f} "
                     f"{off(lru):>14} {off(two):>14} {opt / MIB:8.1f}")
        # The floor: no run reads less than OPT says any cache must.
        if any(opt > m for m in runs):
            failures.append(f"{budget}: OPT {opt / MIB:.1f} MiB above a measured run")
        if budget == whole:
            if lru or two or opt or median:
                failures.append(f"{budget}: model size + anon should read nothing after warm-up")
            continue
        if min(abs(lru - median), abs(two - median)) > TOLERANCE * median:
            failures.append(f"{budget}: neither LRU nor 2q within {TOLERANCE:.0%} of the median")
    print("\n" + "\n".join(lines))
    assert not failures, "\n".join(failures + lines)


def parse_size(text: str) -> int:
    return int(text[:-1]) * MIB
