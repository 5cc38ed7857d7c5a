"""`ttrace run` on the real llama.cpp, checked against independent oracles:
llama.cpp's own perf counters (prompt tokens, eval runs) and the PyPI `gguf`
reader's tensor table (names, absolute file offsets). Needs root: the probes
are loaded into the running kernel."""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import time
from pathlib import Path

import gguf
import pytest

PERF_PROMPT = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
PERF_EVAL = re.compile(r"(?<!prompt )eval time =\s*[\d.]+ ms /\s*(\d+) runs")
# Weight matrices of a layer: what every generate ubatch must read.
LAYER_MATRIX = re.compile(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down)(_exps)?)\.weight$")


def trace_run(ttrace, out: Path, argv: list, preload: Path | None = None, timeout=600, opts=()):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = str(preload)
    # The random models print arbitrary bytes: decode leniently.
    proc = subprocess.run([ttrace, "run", "-o", out, *opts, "--", *argv], capture_output=True, text=True, errors="replace", env=env, timeout=timeout)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def report(ttrace, trace: Path) -> dict:
    proc = subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def gguf_table(path: Path) -> dict[str, int]:
    """name -> absolute file offset, from the reference reader."""
    r = gguf.GGUFReader(path)
    return {t.name: int(t.data_offset) for t in r.tensors}


def weight_names(a: dict, ubatch: dict) -> dict[str, dict]:
    return {a["models"][w["model"]]["tensors"][w["tensor"]]["name"]: w for w in ubatch["weights"]}


SUMMARY = {
    "head": re.compile(r"^ttrace: run of pid (\d+) \((.*)\), (\d+\.\d{3}) s$"),
    "ubatches": re.compile(r"^  ubatches     (\d+) prompt \((\d+) tokens\), (\d+) generate \(each request samples "
                           r"one token more than it decodes\), (\d+) warm-up, (\d+) other graphs$"),
    "ops": re.compile(r"^  ops          (\d+) recorded \((\d+) outside any graph\)$"),
    "weights": re.compile(r"^  weights      (\d+) distinct tensors touched; (.+) per generated token; "
                          r"accesses (\d+\.\d)% file-backed, (\d+\.\d)% copies$"),
    "lost": re.compile(r"^  (?:lost events  none|LOST EVENTS  op (\d+), call (\d+), page_fault (\d+), "
                       r"page_cache (\d+), block (\d+): .*)$"),
}


def human_bytes(n: int) -> str:
    """The summary's unit formatting (B, KiB, ... with one decimal)."""
    value, unit = float(n), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and unit + 1 < len(units):
        value /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def parse_summary(stderr: str) -> dict[str, re.Match]:
    """The end-of-run summary `ttrace run` printed on stderr (after the target's own output)."""
    lines = stderr.splitlines()
    heads = [i for i, l in enumerate(lines) if SUMMARY["head"].match(l)]
    assert len(heads) == 1, f"one summary on stderr:\n{stderr[-3000:]}"
    got = {"head": SUMMARY["head"].match(lines[heads[0]])}
    for line in lines[heads[0] + 1:]:
        for key, pattern in SUMMARY.items():
            if key != "head" and (m := pattern.match(line)):
                assert key not in got, f"summary line {key} twice"
                got[key] = m
    assert set(got) == set(SUMMARY), f"summary lines missing: {set(SUMMARY) - set(got)}\n{stderr[-3000:]}"
    return got


def check_summary(stderr: str, a: dict, wall_s: float):
    """The summary's figures, each against `report --json` of the same trace."""
    s = parse_summary(stderr)
    assert int(s["head"].group(1)) == a["header"]["pid"]
    # The time traced: from the header's start to the trailer's end.
    traced_ns = a["trailer"]["end_monotonic_ns"] - a["header"]["start_monotonic_ns"]
    assert s["head"].group(3) == f"{traced_ns / 1e9:.3f}"
    # It spans the events, which last at least as long as the graphs, and no longer than ttrace itself ran.
    duration_ns = a["last_ts_ns"] - a["first_ts_ns"]
    graphs = sum(u["end_ns"] - u["start_ns"] for u in a["ubatches"])
    assert graphs <= duration_ns <= traced_ns and traced_ns / 1e9 <= wall_s

    phases = collections.Counter(u["phase"] for u in a["ubatches"])
    assert [int(x) for x in s["ubatches"].groups()] == [
        phases["prompt"], a["prompt_tokens"], phases["generate"], phases["warmup"], phases["aux"]]
    assert phases["generate"] == a["generate_runs"]
    assert [int(x) for x in s["ops"].groups()] == [a["ops"], a["ops_outside_ubatches"]]
    assert a["ops"] == sum(u["ops"] for u in a["ubatches"]) + a["ops_outside_ubatches"]

    distinct = {(w["model"], w["tensor"]) for u in a["ubatches"] for w in u["weights"]}
    touched = {(t["model"], t["tensor"]) for t in a["stats"]["tensors"] if t["ubatches_touched"] > 0}
    assert int(s["weights"].group(1)) == len(distinct) == len(touched)
    assert distinct == touched
    # Weight bytes per generated token: the mean of the report's per-token weight bytes.
    generate = [u for u in a["stats"]["ubatches"] if u["phase"] == "generate"]
    assert generate
    per_token = sum(u["weight_bytes"] for u in generate) / len(generate)
    assert s["weights"].group(2) == human_bytes(int(per_token)), (s["weights"].group(0), per_token)
    file = sum(w["file_backed"] for u in a["ubatches"] for w in u["weights"])
    copy = sum(w["copy"] for u in a["ubatches"] for w in u["weights"])
    assert file == sum(u["file_backed_accesses"] for u in a["stats"]["ubatches"])
    assert copy == sum(u["copy_accesses"] for u in a["stats"]["ubatches"])
    assert file + copy > 0
    assert s["weights"].group(3) == f"{100 * file / (file + copy):.1f}"
    assert s["weights"].group(4) == f"{100 * copy / (file + copy):.1f}"

    # Model reads whose completion was never recorded: said when there are any.
    uncompleted = re.findall(r"^  WARNING      (\d+) model-file reads issued without a completion recorded",
                             stderr, re.M)
    assert [int(n) for n in uncompleted] == ([a["io"]["disk"]["uncompleted"]] if a["io"]["disk"]["uncompleted"] else [])

    lost = s["lost"]
    kinds = ["op", "call", "page_fault", "page_cache", "block", "value"]
    assert set(a["lost"]) == set(kinds)
    if lost.group(1) is None:
        assert all(a["lost"][k] == 0 for k in kinds), a["lost"]
    else:
        assert [int(x) for x in lost.groups()] == [a["lost"][k] for k in kinds]
        assert sum(a["lost"].values()) > 0


def run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, model: Path, n: int, *extra, ttrace_opts=()):
    out = tmp_path / "trace.data"
    argv = [llama_completion, "-m", model, "-p", "hello world", "-n", str(n), "-no-cnv", "--ignore-eos", "--perf", "-t", "2", "--seed", "1", *extra]
    started = time.monotonic()
    proc = trace_run(ttrace, out, argv, flush_log_preload, opts=ttrace_opts)
    proc.wall_s = time.monotonic() - started
    prompt, runs = PERF_PROMPT.findall(proc.stderr), PERF_EVAL.findall(proc.stderr)
    assert len(prompt) == 1 and len(runs) == 1, f"llama's perf lines missing:\n{proc.stderr[-2000:]}"
    return report(ttrace, out), int(prompt[0]), int(runs[0]), proc


# Graph capture (the default), the per-node probes of --op-timing on tiny,
# and on moe the stand-ins of kernels before 5.15 (TTRACE_STAND_INS: as if
# this one lacked bpf_get_attach_cookie and bpf_loop).
@pytest.mark.parametrize("name, opts, stand_ins", [("tiny", (), ""), ("tiny-q8", (), ""), ("moe", (), ""),
                                                   ("tiny", ("--op-timing",), ""), ("moe", (), "cookie,loop")],
                         ids=["tiny", "tiny-q8", "moe", "tiny-op-timing", "moe-stand-ins"])
def test_ubatches_match_llama_counters_and_weights_match_gguf(ttrace, tmp_path, llama_completion, flush_log_preload, models, paths,
                                                              monkeypatch, name, opts, stand_ins):
    monkeypatch.setenv("TTRACE_STAND_INS", stand_ins)
    a, prompt_tokens, eval_runs, proc = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, models[name], 8,
                                                       ttrace_opts=opts)
    assert a["header"]["options"]["op_timing"] == ("--op-timing" in opts)
    # The trace states the build's commit, as `llama-completion --version` reports it.
    assert a["header"]["llama_commit"] == paths["llama_commit"]
    assert (a["prompt_tokens"], a["generate_runs"]) == (prompt_tokens, eval_runs) == (3, 7)
    generate = [u for u in a["ubatches"] if u["phase"] == "generate"]
    assert len(generate) == eval_runs
    assert set(a["lost"].values()) == {0}, a["lost"]
    assert a["trailer"]["stop_reason"] == "target exited" and not a["truncated"]

    # The model table ttrace recorded is the reference reader's, name for name.
    (table,) = a["models"]
    reference = gguf_table(models[name])
    assert {t["name"]: t["file_offset"] for t in table["tensors"]} == reference
    matrices = {n for n in reference if LAYER_MATRIX.match(n)}
    assert matrices, "the model has layer weight matrices"
    for u in generate:
        read = weight_names(a, u)
        assert matrices <= set(read), f"ubatch {u['index']} missed {sorted(matrices - set(read))}"
        # Plain mmap loads: every weight read goes through the file mapping.
        odd = {n: w for n, w in read.items() if not (w["file_backed"] > 0 and w["copy"] == 0)}
        assert not odd, f"ubatch {u['index']}: weights not read through the file mapping: {odd}"
        assert len(u["token_ids"]) == 1
    check_summary(proc.stderr, a, proc.wall_s)


# llama.cpp's own debug log line for each weight CPU_REPACK moved to a heap buffer.
REPACKED = re.compile(r"repack tensor (\S+) with ")


def test_repacked_q4_weights_are_copies_resolved_by_name(ttrace, tmp_path, llama_completion, flush_log_preload, models):
    # -v: llama.cpp logs each tensor it repacks; that list is the oracle.
    a, prompt_tokens, eval_runs, proc = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload,
                                                       models["tiny-q4"], 8, "-v")
    assert (a["prompt_tokens"], a["generate_runs"]) == (prompt_tokens, eval_runs)
    assert set(a["lost"].values()) == {0}, a["lost"]
    reference = gguf_table(models["tiny-q4"])
    r = gguf.GGUFReader(models["tiny-q4"])
    q4 = {t.name for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_0 and LAYER_MATRIX.match(t.name)}
    assert q4, "tiny-q4 has Q4_0 layer matrices"
    repacked = set(REPACKED.findall(proc.stderr))
    assert q4 <= repacked, f"llama.cpp repacked {sorted(repacked)}; expected every Q4_0 layer matrix"
    types = {t.name: t.tensor_type for t in r.tensors}
    assert all(types[n] == gguf.GGMLQuantizationType.Q4_0 for n in repacked), repacked
    generate = [u for u in a["ubatches"] if u["phase"] == "generate"]
    assert len(generate) == eval_runs
    for u in generate:
        read = weight_names(a, u)
        assert set(read) <= set(reference)
        assert repacked <= set(read), f"ubatch {u['index']} missed {sorted(repacked - set(read))}"
        for name, w in read.items():
            if name in repacked:
                # CPU_REPACK moved them to heap buffers: a copy, found by name.
                assert w["copy"] > 0 and w["file_backed"] == 0, name
            else:
                # Everything else is read where llama.cpp mmap'd it: the model file.
                assert w["file_backed"] > 0 and w["copy"] == 0, name
        assert set(read) - repacked, "some weights are read through the file mapping"
    check_summary(proc.stderr, a, proc.wall_s)


def test_end_of_run_summary_matches_report(ttrace, tmp_path, llama_completion, flush_log_preload, models):
    """`ttrace run`'s summary on stderr, with a worker record per thread and
    repacked copies, says what `ttrace report --json` of its trace says."""
    a, prompt_tokens, eval_runs, proc = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload,
                                                       models["tiny-q4"], 8, ttrace_opts=["--all-threads"])
    assert a["header"]["options"]["all_threads"]
    assert (a["prompt_tokens"], a["generate_runs"]) == (prompt_tokens, eval_runs) == (3, 7)
    check_summary(proc.stderr, a, proc.wall_s)
    s = parse_summary(proc.stderr)
    copies = float(s["weights"].group(4))
    assert 0 < copies < 100, "tiny-q4: some accesses are copies, some file-backed"


def test_python_client_matches_llama_completion_per_ubatch(ttrace, tmp_path, llama_completion, flush_log_preload, models, paths):
    model = models["tiny"]
    # The Python client does not turn flash attention on by default; llama-completion's "auto" does.
    cli, *_ = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, model, 4, "-fa", "off")
    client = tmp_path / "client.py"
    client.write_text(
        "import sys\nfrom llama_cpp import Llama\n"
        "llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False, seed=1)\n"
        # Ban EOS and the UTF-8 continuation bytes that make the client overshoot.
        "bias = {2: -1e9, **{i: -1e9 for i in range(3 + 0x80, 3 + 0x100)}}\n"
        "out = llm.create_completion('hello world', max_tokens=4, logit_bias=bias)\n"
        "assert out['usage']['completion_tokens'] == 4, out['usage']\n"
    )
    out = tmp_path / "py.data"
    trace_run(ttrace, out, [paths["venv_python"], client, model])
    py = report(ttrace, out)
    assert py["ops_outside_ubatches"] == 0
    assert py["prompt_tokens"] == cli["prompt_tokens"] == 3
    assert py["generate_runs"] == cli["generate_runs"] == 3
    def ops_by_phase(a):
        return [(u["phase"], u["n_tokens"], u["ops"]) for u in a["ubatches"] if u["phase"] in ("prompt", "generate")]
    assert ops_by_phase(py) == ops_by_phase(cli)
    assert [l["path"] for l in py["header"]["libraries"] if l["role"] == "cpu"][0].endswith(".so.0")


@pytest.mark.parametrize("opts", [(), ("--op-timing",)], ids=["graph-capture", "op-timing"])
def test_a_long_runs_summary_is_the_recorders_and_says_what_report_adds(ttrace, tmp_path, llama_completion, flush_log_preload,
                                                                        models, monkeypatch, opts):
    """Past READ_BACK_MAX_OPS (5 M; lowered here) the end-of-run summary is
    made from the recorder's counts, header and trailer, not read back: its
    op count, stop, trace size and losses are those `report --json` reads
    from the file, and it names the command that gives the rest."""
    monkeypatch.setenv("TTRACE_TEST_READ_BACK_MAX_OPS", "100")
    a, _, _, proc = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, models["tiny"], 8,
                                   ttrace_opts=opts)
    lines = proc.stderr.splitlines()
    at = [i for i, l in enumerate(lines) if SUMMARY["head"].match(l)]
    assert len(at) == 1, proc.stderr[-3000:]
    rows = lines[at[0]:]
    head = SUMMARY["head"].match(rows[0])
    assert int(head.group(1)) == a["header"]["pid"]
    traced_ns = a["trailer"]["end_monotonic_ns"] - a["header"]["start_monotonic_ns"]
    assert head.group(3) == f"{traced_ns / 1e9:.3f}"
    trace = tmp_path / "trace.data"
    assert f"  stopped      {a['trailer']['stop_reason']}, exit status 0" in rows
    ops = [l for l in rows if l.startswith("  ops          ")]
    assert ops == [f"  ops          {a['ops']} recorded; per-phase, token and weight figures are not read back at the "
                   f"end of a run this long (`ttrace report {trace}` reads them)"], rows
    assert a["ops"] > 100
    size = human_bytes(trace.stat().st_size)
    assert any(l.startswith(f"  trace        {trace}: {size}, ") for l in rows), (size, rows)
    assert "  lost events  none" in rows
    # What only a read of the ops gives is left to `report`.
    assert not any(l.startswith(("  ubatches", "  tokens", "  weights")) for l in rows), rows


def test_a_run_written_to_dev_null_ends_with_the_recorders_summary(ttrace, tmp_path, llama_completion, flush_log_preload,
                                                                   models):
    """`-o /dev/null` keeps nothing to read back: the run still succeeds, and
    its summary's op count is that of the same run written to a file."""
    a, _, _, _ = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, models["tiny"], 8)
    argv = [llama_completion, "-m", models["tiny"], "-p", "hello world", "-n", "8", "-no-cnv", "--ignore-eos", "--perf",
            "-t", "2", "--seed", "1"]
    proc = trace_run(ttrace, Path("/dev/null"), argv, flush_log_preload)
    rows = proc.stderr.splitlines()
    assert f"  ops          {a['ops']} recorded; written to /dev/null, so per-phase, token and weight figures are not " \
           "known" in rows, proc.stderr[-3000:]
    assert "  stopped      target exited, exit status 0" in rows and "  lost events  none" in rows
    assert Path("/dev/null").is_char_device()
