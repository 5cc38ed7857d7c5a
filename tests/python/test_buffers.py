"""ggml's backend buffers as `ttrace run` records them by default, against
llama.cpp's own account of them: the `... buffer size = X MiB` lines it
logs when it creates them (load_tensors, llama_kv_cache, sched_reserve,
llama_context's output buffer), at the precision it prints."""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import webui_schema

# `load_tensors:   CPU_Mapped model buffer size =   235.16 MiB`, `llama_context:        CPU  output buffer size = ...`
LOG_LINE = re.compile(r"\s(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
# The log's words for the usage ttrace names.
KIND = {"weights": "model", "repacked weights": "model", "KV cache": "KV", "compute": "compute", "output": "output"}


def run_logged(ttrace, out: Path, llama_completion, model: Path, preload: Path) -> str:
    """Trace a short generation with llama.cpp's info logs on; its stderr."""
    argv = [ttrace, "run", "-o", out, "--", llama_completion, "-m", model, "-p", "hello world", "-n", "4",
            "-no-cnv", "--ignore-eos", "-t", "2", "--seed", "1", "-c", "256", "-lv", "4"]
    env = dict(os.environ, LD_PRELOAD=str(preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def logged_sizes(log: str) -> dict[tuple[str, str], float]:
    """MiB per (kind, buffer type), summed over llama.cpp's lines."""
    sums: dict[tuple[str, str], float] = collections.defaultdict(float)
    for buft, kind, mib in LOG_LINE.findall(log):
        sums[(kind, buft)] += float(mib)
    return dict(sums)


# `ttrace report --json`'s usage names, in llama.cpp's log words.
REPORT_KIND = {"weights": "model", "kv": "KV", "compute": "compute", "output": "output"}


def assert_report_buffers_equal_log(a: dict, log: str, where: str) -> None:
    """The buffers of a `report --json` alive when the first ubatch graph
    starts are, per usage and buffer type, what llama.cpp logged creating
    them, to the 0.01 MiB it prints."""
    expected = logged_sizes(log)
    assert expected, f"{where}: llama.cpp logged no buffer"
    first = a["ubatches"][0]["start_ns"]
    got: dict[tuple[str, str], float] = collections.defaultdict(float)
    lines = collections.Counter()
    for b in a["buffers"]["list"]:
        if b["created_ns"] <= first and (b["freed_ns"] is None or b["freed_ns"] > first):
            key = (REPORT_KIND.get(b["usage"], b["usage"]), b["type_name"])
            got[key] += b["size"] / 2**20
            lines[key] += 1
    assert set(got) == set(expected), f"{where}: ttrace {dict(got)} vs llama.cpp {expected}"
    for key, mib in expected.items():
        assert abs(got[key] - mib) <= 0.005 * max(lines[key], 1) + 1e-9, f"{where} {key}: {got[key]} vs {mib}"


@pytest.fixture(scope="module", params=["gemma", "qwen3moe"])
def traced(request, ttrace, tmp_path_factory, llama_completion, models, flush_log_preload):
    d = tmp_path_factory.mktemp(f"buffers-{request.param}")
    path = d / "t.data"
    log = run_logged(ttrace, path, llama_completion, models[request.param], flush_log_preload)
    a = json.loads(subprocess.run([ttrace, "report", path, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    out = d / "tokens"
    proc = subprocess.run([ttrace, "export", path, "--format", "tokens-json", "-o", out], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return request.param, path, log, a, out


def test_buffer_sizes_equal_llama_logs(ttrace, traced):
    """Per usage and buffer type, the bytes of the buffers alive when the
    first ubatch graph starts (after loading and the compute reserve) are
    what llama.cpp logged, to the 0.01 MiB it prints; and the thesis UI's
    buffer-timeline.json lists exactly those buffers."""
    name, path, log, a, out = traced
    expected = logged_sizes(log)
    kinds = {k for k, _ in expected}
    assert {"model", "KV", "compute", "output"} <= kinds, f"{name}: llama.cpp logged {expected}"
    if name == "gemma":
        assert ("model", "CPU_REPACK") in expected, "Gemma's Q4_K matmul weights are repacked on x86 with AVX2"

    docs = webui_schema.check_export(out)
    timeline = docs["buffer_timeline"]
    assert timeline is not None, "tokens-json wrote no buffer-timeline.json"
    first_ms = (a["ubatches"][0]["start_ns"] - a["header"]["start_monotonic_ns"]) / 1e6
    alive = [b for b in timeline["buffers"]
             if b["alloc_time_ms"] <= first_ms and (b["dealloc_time_ms"] is None or b["dealloc_time_ms"] > first_ms)]
    got: dict[tuple[str, str], float] = collections.defaultdict(float)
    lines = collections.Counter()
    for b in alive:
        key = (KIND[b["usage_label"]], b["type_name"])
        got[key] += b["size"] / 2**20
        lines[key] += 1
    assert set(got) == set(expected), f"{name}: ttrace {dict(got)} vs llama.cpp {expected}"
    for key, mib in expected.items():
        # Each printed line is rounded to 0.01 MiB.
        assert abs(got[key] - mib) <= 0.005 * max(lines[key], 1) + 1e-9, f"{name} {key}: {got[key]:.4f} vs {mib}"

    report = subprocess.run([ttrace, "report", path], capture_output=True, text=True, check=True).stdout
    assert "backend buffers" in report and "buffer bytes at the first graph" in report
    for (kind, buft), mib in expected.items():
        assert re.search(rf"{re.escape(buft)}\s+{mib:.2f} MiB", report) or kind == "KV", (kind, buft, report[-2000:])


def test_op_sources_outside_the_model_file_name_their_buffer(traced):
    """Every op source that is not model-file bytes (what ttrace called
    `anon` or `copy` before it traced buffers) lies in a traced buffer,
    named by what it holds; the KV cache and compute buffers are among them,
    and Gemma's repacked weights are read from the CPU_REPACK buffer."""
    name, _, _, _, out = traced
    docs = webui_schema.check_export(out)
    by_id = {b["id"]: b for b in docs["buffer_timeline"]["buffers"]}
    seen = collections.Counter()
    for doc in docs["traces"].values():
        for e in doc["entries"]:
            for s in e["sources"]:
                if s["memory_source"] == "DISK":
                    assert "buffer" not in s, s
                    continue
                assert "buffer" in s, f"{name}: {e['dst_name']} reads {s['name']} ({s['memory_class']}) in no buffer"
                b = by_id[s["buffer_id"]]
                assert s["buffer"] == b["usage_label"] and s["buffer_name"] == b["name"], (s, b)
                seen[(s["memory_class"], s["buffer"])] += 1
    labels = {label for _, label in seen}
    assert {"KV cache", "compute"} <= labels, f"{name}: {seen}"
    if name == "gemma":
        assert seen[("copy", "repacked weights")] > 0, seen


def test_perfetto_counts_buffer_bytes_per_usage(ttrace, traced, tmp_path):
    """A `backend buffers` group with a bytes counter per usage; at the first
    ubatch each counter holds the bytes of that usage's buffers then alive
    (the same figures the test above holds against llama.cpp's log)."""
    from test_exports import Pftrace, export

    name, path, _, a, out = traced
    pf = Pftrace(export(ttrace, path, "perfetto", tmp_path / "t.pftrace").read_bytes())
    group = pf.by_name["backend buffers"]
    counters = {pf.tracks[u]: u for u, p in pf.parents.items() if p == group}
    timeline = webui_schema.check_export(out)["buffer_timeline"]
    usage = {"repacked weights": "weights"}
    expected = collections.Counter()
    first = a["ubatches"][0]["start_ns"]
    first_ms = (first - a["header"]["start_monotonic_ns"]) / 1e6
    for b in timeline["buffers"]:
        label = usage.get(b["usage_label"], b["usage_label"])
        expected[f"bytes: {label}"] += 0
        if b["alloc_time_ms"] <= first_ms and (b["dealloc_time_ms"] is None or b["dealloc_time_ms"] > first_ms):
            expected[f"bytes: {label}"] += b["size"]
    assert set(counters) == set(expected), (name, counters)
    for track, uuid in counters.items():
        at_first = [v for ts, v in pf.counter_points[uuid] if ts <= first]
        assert at_first and at_first[-1] == expected[track], (name, track, at_first[-3:], expected[track])
        assert pf.counter_points[uuid][-1][1] >= 0


def test_view_op_details_name_the_buffers(ttrace, traced, tmp_path):
    """`ttrace view`'s op lookup (what its details panel shows): an op that
    reads the KV cache names that buffer for the source, and its output's
    buffer is the compute buffer, where a trace without buffers said `anon`
    (or `unmapped`)."""
    import urllib.request

    from test_exports import export
    from test_view import Server

    name, path, _, _, _ = traced
    rows = [json.loads(line) for line in export(ttrace, path, "jsonl", tmp_path / "rows.jsonl").read_text().splitlines()]
    kv_reader = next(r for r in rows if r["kind"] == "op" and "cache_k_l0" in (r["srcs"] or "")
                     and not r["dst"].startswith("cache_"))
    server = Server(ttrace, path, tmp_path / "view.log")
    try:
        with urllib.request.urlopen(f"{server.base}api/v1/op/{kv_reader['seq']}", timeout=60) as r:
            op = json.load(r)
    finally:
        server.close()
    sources = dict(zip(op["srcs"], op["src_buffers"]))
    kv = [b for n, b in sources.items() if n.startswith("cache_k_l0")]
    assert kv and all(b and b["usage"] == "KV cache" for b in kv), (name, op)
    # The buffer, not `dst_memory`: that comes from the recorder's copy of
    # /proc/PID/maps, which may predate a compute buffer ggml just mapped
    # ("unmapped" then); the buffer table has every allocation.
    assert op["dst_buffer"]["usage"] == "compute", (name, op)
