"""`ttrace simulate` against reality (issue 28): cold `--mem-limit` runs at
three budgets, three runs each, on Gemma 3 270M (the real model: a 241 MiB
file streamed whole every token, dominated by the 170 MiB output
projection) and on the synthetic MoE model `moe` (8 experts, 2 routed: each
token reads a different quarter of the expert slices, and the file, 26 MiB,
is smaller than two of this VM's 16 MiB read-around windows, so it is the
readahead-bound case; `qwen3moe` is as small and no different in that).

Measured: the block reads in the model file during generate ubatches (the
trace's own block I/O, which test_trace_core holds equal to the kernel's
blk tracer), per generated token, median of three runs, each on a private
copy of the model made cold with posix_fadvise(DONTNEED). Predicted:
`ttrace simulate` of an unlimited trace of the same command, with the
readahead and anonymous memory that trace recorded.

Runs for about 10 minutes (20 traced runs; the memory-limited Gemma runs
take 30-60 s each)."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

PROMPT = "The history of the printing press begins in"
MIB = 1 << 20
RUNS = 3
TOLERANCE = 0.20
BUDGETS = {"gemma": ["160M", "200M", "256M"], "moe": ["20M", "24M", "28M"]}
# Budgets where neither LRU nor the two-list model comes within 20 % of the
# median, measured and explained in docs/SIMULATE.md ("Where it is off").
# Only the floor (OPT) is asserted there.
KNOWN_GAPS = {
    ("gemma", "256M"): "medians of 150 to 227 MiB per token across sets of runs: no one prediction is within 20 % of all",
    ("moe", "20M"): "read-around thrash: a 16 MiB window in a 14 MiB cache, 2x to 4x the prediction",
    ("moe", "24M"): "read-around thrash: 11 to 36 MiB per token across runs",
    ("moe", "28M"): "a few MiB per token, and the runs spread 3.5 to 23 MiB",
}


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
def test_predictions_against_memory_limited_runs(ttrace, tmp_path, llama_completion, models, flush_log_preload, name):
    unlimited = completion(ttrace, tmp_path / "free.data", llama_completion, models[name], flush_log_preload, None)
    anon = unlimited["trailer"]["peak_anon_bytes"]
    assert anon, "the run recorded its anonymous memory"
    size = models[name].stat().st_size
    # Everything fits: the file, the anonymous memory, and a margin for the
    # kernel memory the cgroup is charged too (page tables, slab).
    whole = f"{(size + anon) // MIB + 8}M"
    doc = predict(ttrace, tmp_path / "free.data", [*BUDGETS[name], whole])
    assert doc["readahead"] and "recorded" in doc["readahead_source"], doc["readahead_source"]
    predicted = {(r["budget_bytes"], r["policy"]): r["disk_bytes_per_token"] for r in doc["rows"]}

    measured: dict[str, list[float]] = {}
    for run in range(RUNS):
        for budget in [*BUDGETS[name], *([whole] if run == 0 else [])]:
            model = cold_copy(models[name], tmp_path / f"cold-{name}.gguf")
            trace = tmp_path / f"{budget}-{run}.data"
            a = completion(ttrace, trace, llama_completion, model, flush_log_preload, budget)
            measured.setdefault(budget, []).append(generation_reads_per_token(a))
            trace.unlink()

    lines = [f"{name}: generation's disk MiB per generated token, readahead "
             f"{doc['readahead']['window_bytes'] / MIB:.0f} MiB, anon {anon / MIB:.1f} MiB",
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
                     f"{off(lru):>14} {off(two):>14} {opt / MIB:8.1f}"
                     + (f"   known gap: {KNOWN_GAPS[(name, budget)]}" if (name, budget) in KNOWN_GAPS else ""))
        # The floor: no run reads less than OPT says any cache must.
        if any(opt > m for m in runs):
            failures.append(f"{budget}: OPT {opt / MIB:.1f} MiB above a measured run")
        if budget == whole:
            if lru or two or opt or median:
                failures.append(f"{budget}: model size + anon should read nothing after warm-up")
            continue
        near = min(abs(lru - median), abs(two - median)) <= TOLERANCE * median
        if not near and (name, budget) not in KNOWN_GAPS:
            failures.append(f"{budget}: neither LRU nor 2q within {TOLERANCE:.0%} of the median")
    print("\n" + "\n".join(lines))
    assert not failures, "\n".join(failures + lines)


def parse_size(text: str) -> int:
    return int(text[:-1]) * MIB
