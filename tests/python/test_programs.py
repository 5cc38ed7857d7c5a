"""Programs users install from registries, traced by `ttrace run` with only
what a user would type, against each program's own account of its run.

node-llama-cpp 3.21.1 (npm, ggml 0.23.0): a Node addon that dlopens ggml and
picks its CPU backend (`libggml-cpu-<variant>.so`) at run time. Its driver,
tests/programs/node-llama-cpp/generate.mjs, prints the prompt's token ids as
its tokenizer makes them and the tokens it generated; llama.cpp's buffer
lines come through its logger.

xllamacpp 2026.10.11549 (PyPI, ggml 0.26.0): llama.cpp's server linked into
a Python extension, newer than ttrace's tables: its layouts are read from
its own code. Judged by the server's `timings` for the request and
llama-tokenize's ids for the prompt."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from test_buffers import assert_report_buffers_equal_log

PROMPT = "The capital of France is"
N_TOKENS = 8


@pytest.fixture(scope="module")
def node_llama_cpp(paths) -> dict:
    target = paths.get("node_llama_cpp")
    if not target or not Path(target["script"]).is_file():
        pytest.fail("node-llama-cpp is not installed: run `cargo xtask setup`", pytrace=False)
    return target


def test_node_llama_cpp_traced_as_it_counts(ttrace, models, node_llama_cpp, tmp_path):
    out = tmp_path / "t.data"
    argv = [ttrace, "run", "-o", out, "--", "node", node_llama_cpp["script"], models["gemma"], PROMPT, str(N_TOKENS)]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{log[-3000:]}"
    own = dict(re.findall(r"^(prompt_ids|output_tokens)=(.+)$", proc.stdout, re.M))
    assert set(own) == {"prompt_ids", "output_tokens"}, f"generate.mjs printed {proc.stdout[-2000:]!r}"
    prompt_ids = json.loads(own["prompt_ids"])

    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    s = a["summary"]
    # Found without --lib, the target held at the backend's load: nothing missed.
    assert s["late_attach"]["held"] and "libggml-cpu-" in s["late_attach"]["library"], log[-2000:]
    build = a["header"]["build"]
    assert build["ggml_version"] == "0.23.0", build
    prompt = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert len(prompt) == 1 and prompt[0]["token_ids"] == prompt_ids, (prompt, prompt_ids)
    assert s["prompt_tokens"] == len(prompt_ids)
    # The first generated token comes out of the prompt's decode.
    assert s["generate_ubatches"] == int(own["output_tokens"]) - 1, s
    assert_report_buffers_equal_log(a, log, "node-llama-cpp")
    # Weights resolve to the GGUF's tensors by name.
    assert s["distinct_weights"] > 0 and s["file_backed_accesses"] > 0, s


XLLAMACPP = Path(__file__).resolve().parents[1] / "programs/xllamacpp/complete.py"


def test_xllamacpp_traced_with_layouts_from_its_code(ttrace, paths, models, llama_tokenize, tmp_path):
    out = tmp_path / "t.data"
    argv = [ttrace, "run", "-o", out, "--", paths["venv_python"], XLLAMACPP, models["gemma"], PROMPT, str(N_TOKENS)]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    timings = json.loads(proc.stdout.strip().splitlines()[-1])["timings"]

    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    s, build = a["summary"], a["header"]["build"]
    assert build["ggml_version"] == "0.26.0", build
    for structure in ("ggml_tensor", "ggml_cgraph", "ggml_backend_buffer", "llama_ubatch"):
        assert "derived from" in build["layouts"][structure], build["layouts"]
    check = s["layout_check"]
    assert check["graphs"] > 0 and check["weights"] > 0 and check["ubatches"] > 0, check
    # Loaded with the extension (dlopen), held until its probes were in.
    assert s["late_attach"]["held"], proc.stderr[-2000:]
    # The server may split a prompt over decodes (2 + 4 tokens here).
    prompt = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    ids = [t for u in prompt for t in u["token_ids"]]
    assert s["prompt_tokens"] == len(ids) == timings["prompt_n"], (prompt, timings)
    assert ids == prompt_ids(llama_tokenize, models["gemma"]), ids
    assert s["generate_ubatches"] == timings["predicted_n"] - 1, (s, timings)
    # llama-server's start-up check of its context (two tokens, cleared) is no prompt.
    assert s["other_graphs"] >= 1, s
    assert_report_buffers_equal_log(a, proc.stderr, "xllamacpp")
    assert s["distinct_weights"] > 0 and s["file_backed_accesses"] > 0, s
    # Sequences from the ubatch layout read from its code (xllamacpp's
    # llama_ubatch has two fields more than the tables'): the request is
    # the server's, one sequence, with its counts (its OpenAI-style reply
    # names no slot).
    assert not s["disabled"], s["disabled"]
    (request,) = [r for r in a["requests"] if not r["warmup"] and not r["prompt_only"]]
    assert a["tokens"]["sequences"] == 1, a["tokens"]
    assert (request["prompt_tokens"], request["outputs"], request["generated_tokens"]) == (
        timings["prompt_n"], timings["predicted_n"], timings["predicted_n"] - 1), (request, timings)
    ubatch = {u["index"]: u for u in a["ubatches"]}
    positions = [t["pos"] for i, _ in request["ubatches"] for t in ubatch[i]["tokens"]]
    assert positions == list(range(timings["prompt_n"] + timings["predicted_n"] - 1)), positions


def prompt_ids(llama_tokenize, model) -> list[int]:
    p = subprocess.run([llama_tokenize, "-m", model, "-p", PROMPT, "--ids", "--log-disable"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(re.search(r"\[[\d, ]*\]", p.stdout).group(0))
