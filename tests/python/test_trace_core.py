"""`ttrace run` on the real llama.cpp, checked against independent oracles:
llama.cpp's own perf counters (prompt tokens, eval runs) and the PyPI `gguf`
reader's tensor table (names, absolute file offsets). Needs root: the probes
are loaded into the running kernel."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import gguf
import pytest

PERF_PROMPT = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
PERF_EVAL = re.compile(r"(?<!prompt )eval time =\s*[\d.]+ ms /\s*(\d+) runs")
# Weight matrices of a layer: what every generate ubatch must read.
LAYER_MATRIX = re.compile(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down)(_exps)?)\.weight$")


@pytest.fixture(scope="session")
def ttrace() -> Path:
    if os.geteuid() != 0:
        pytest.fail("these tests load eBPF programs and need root: run `sudo -E cargo xtask test`", pytrace=False)
    p = Path(os.environ.get("TTRACE_BIN", Path(__file__).resolve().parents[2] / "target/release/ttrace"))
    if not os.access(p, os.X_OK):
        pytest.fail(f"no ttrace binary at {p}: run through `cargo xtask test` (it builds it and sets TTRACE_BIN)", pytrace=False)
    return p


def trace_run(ttrace, out: Path, argv: list, preload: Path | None = None, timeout=600):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = str(preload)
    # The random models print arbitrary bytes: decode leniently.
    proc = subprocess.run([ttrace, "run", "-o", out, "--", *argv], capture_output=True, text=True, errors="replace", env=env, timeout=timeout)
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


def run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, model: Path, n: int, *extra):
    out = tmp_path / "trace.data"
    argv = [llama_completion, "-m", model, "-p", "hello world", "-n", str(n), "-no-cnv", "--ignore-eos", "--perf", "-t", "2", "--seed", "1", *extra]
    proc = trace_run(ttrace, out, argv, flush_log_preload)
    prompt, runs = PERF_PROMPT.findall(proc.stderr), PERF_EVAL.findall(proc.stderr)
    assert len(prompt) == 1 and len(runs) == 1, f"llama's perf lines missing:\n{proc.stderr[-2000:]}"
    return report(ttrace, out), int(prompt[0]), int(runs[0]), proc


@pytest.mark.parametrize("name", ["tiny", "tiny-q8", "moe"])
def test_ubatches_match_llama_counters_and_weights_match_gguf(ttrace, tmp_path, llama_completion, flush_log_preload, models, paths, name):
    a, prompt_tokens, eval_runs, _ = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, models[name], 8)
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
        assert all(w["file_backed"] > 0 and w["copy"] == 0 for w in read.values())
        assert len(u["token_ids"]) == 1


def test_repacked_q4_weights_are_copies_resolved_by_name(ttrace, tmp_path, llama_completion, flush_log_preload, models):
    a, prompt_tokens, eval_runs, _ = run_completion(ttrace, tmp_path, llama_completion, flush_log_preload, models["tiny-q4"], 8)
    assert (a["prompt_tokens"], a["generate_runs"]) == (prompt_tokens, eval_runs)
    reference = gguf_table(models["tiny-q4"])
    r = gguf.GGUFReader(models["tiny-q4"])
    q4 = {t.name for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_0 and LAYER_MATRIX.match(t.name)}
    assert q4, "tiny-q4 has Q4_0 layer matrices"
    for u in (u for u in a["ubatches"] if u["phase"] == "generate"):
        read = weight_names(a, u)
        for name, w in read.items():
            assert name in reference
            if name in q4:
                # CPU_REPACK moved them to heap buffers: a copy, found by name.
                assert w["copy"] > 0 and w["file_backed"] == 0, name
            elif name.endswith("_norm.weight"):
                assert w["file_backed"] > 0 and w["copy"] == 0, name


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
