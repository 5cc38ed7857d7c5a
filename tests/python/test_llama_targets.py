"""The real clients ttrace traces load every generated model and generate
exactly N tokens, judged by their own counters.

llama-completion: `-p "hello world" -n N -no-cnv --ignore-eos --perf` (the
command of the issue, plus `-t 2` and a fixed seed). Its `common_perf_print`
lines must say `prompt eval time = ... / P tokens` with P the tokenizer's
count, and `eval time = ... / N-1 runs` (the first new token comes out of the
prompt pass).

Warm-up: we keep llama-completion's default warm-up decode, because that is
what a user's run looks like and what ttrace sees; llama.cpp resets its perf
counters after the warm-up, so it is not counted. test_warmup_not_counted
checks that --no-warmup gives the same counts. (Tracing tests that count
ubatches must expect one extra graph from the warm-up, or pass --no-warmup.)

Reading those lines needs the log-flush preload from conftest.py: llama.cpp
drops queued log lines at exit, often including the perf lines.

Quantized models run with llama.cpp's defaults (weight repacking on), since
repacked weights in heap buffers are a case ttrace must handle; tiny-q4 must
end up in a CPU_REPACK buffer. A build made with GGML_NATIVE on a CPU with
AMX (this machine's) puts Q4_0/Q8_0 matmul weights into ggml's AMX buffer
instead, and that AMX matmul crashes here (SIGILL/SIGSEGV on prompt-sized
batches); the failure message says so. The same models with --no-repack
show the files themselves are fine.

Python client: llama_cpp.Llama.create_completion(max_tokens=N) with EOS
banned through logit_bias. llama-cpp-python holds back tokens that end in an
incomplete UTF-8 sequence and skips its max_tokens check for them, so a
random model that samples a lone byte token 0x80..0xFF overshoots N; those
128 byte tokens are banned too (generation stays random otherwise).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from conftest import load_gen_models

GEN = load_gen_models()
PROMPT = "hello world"


def expected_prompt_ids() -> list[int]:
    """What an SPM tokenizer must make of PROMPT with our vocabulary."""
    tokens, _, _ = GEN.vocab(GEN.SPECS["tiny"].n_vocab)
    ids = {t: i for i, t in enumerate(tokens)}
    return [GEN.BOS_ID] + [ids[GEN.SPM_SPACE + w] for w in PROMPT.split()]


PERF_PROMPT = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
PERF_EVAL = re.compile(r"(?<!prompt )eval time =\s*[\d.]+ ms /\s*(\d+) runs")


class Completion:
    def __init__(self, binary, preload):
        self.binary, self.preload = binary, preload

    def has_amx(self) -> bool:
        """Was this llama.cpp built with ggml's AMX kernels?"""
        lib = self.binary.parent / "libggml-cpu.so"
        return lib.is_file() and b"ggml_backend_amx_mul_mat" in lib.read_bytes()

    def __call__(self, model, n, *extra, timeout=600):
        cmd = [str(self.binary), "-m", str(model), "-p", PROMPT, "-n", str(n), "-no-cnv", "--ignore-eos",
               "--perf", "-t", "2", "--seed", "1", *extra]
        env = dict(os.environ, LD_PRELOAD=str(self.preload))
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
        log = p.stdout + p.stderr
        if p.returncode < 0 and self.has_amx():
            sig = signal.Signals(-p.returncode).name
            pytest.fail(
                f"{' '.join(cmd)} died of {sig} in llama.cpp's AMX matmul path: the build has AMX "
                "(GGML_NATIVE on an AMX CPU) and ggml's AMX kernels crash on this machine. Rebuild "
                "llama.cpp with CMAKE_C_FLAGS/CMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
                "(then Q4_0 goes to CPU_REPACK as intended).", pytrace=False)
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{log[-3000:]}"
        prompt, runs = PERF_PROMPT.findall(log), PERF_EVAL.findall(log)
        assert len(prompt) == 1 and len(runs) == 1, f"no common_perf_print lines in:\n{log[-3000:]}"
        return int(prompt[0]), int(runs[0]), log


@pytest.fixture(scope="module")
def completion(llama_completion, flush_log_preload):
    return Completion(llama_completion, flush_log_preload)


def tokenize(binary, model) -> list[int]:
    p = subprocess.run([str(binary), "-m", str(model), "-p", PROMPT, "--ids", "--log-disable"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r"\[([\d, ]*)\]", p.stdout)
    assert m, f"llama-tokenize printed no id list: {p.stdout!r}"
    return [int(x) for x in m.group(1).split(",") if x.strip()]


@pytest.mark.parametrize("name", ["tiny", "moe", "tiny-split", "tiny-q8", "tiny-q4"])
def test_tokenizer_agrees_with_vocab(llama_tokenize, models, name):
    assert tokenize(llama_tokenize, models[name]) == expected_prompt_ids()


@pytest.mark.parametrize("name,n", [
    ("tiny", 8), ("tiny", 16), ("moe", 8), ("tiny-split", 8),
    ("tiny-q8", 8), ("tiny-q4", 8), ("bench", 4),
])
def test_llama_completion_generates_n(completion, models, name, n):
    prompt, runs, _ = completion(models[name], n)
    assert prompt == len(expected_prompt_ids()), "prompt tokens per llama-completion"
    assert runs == n - 1, f"-n {n} must give {n - 1} eval runs"


@pytest.mark.parametrize("name,n", [("tiny-q8", 8), ("tiny-q4", 8), ("bench", 4)])
def test_quantized_models_without_repack(completion, models, name, n):
    assert completion(models[name], n, "--no-repack")[:2] == (len(expected_prompt_ids()), n - 1)


def test_loader_sees_split_moe_and_repack(completion, models):
    """What llama.cpp's loader reports (-v): the split's other shards, the
    MoE hparams, and tiny-q4's matmul weights repacked into a heap buffer."""
    log = completion(models["tiny-split"], 2, "-v")[2]
    assert "additional 2 GGUFs metadata loaded" in log
    log = completion(models["moe"], 2, "-v")[2]
    assert re.search(r"n_expert\s+= 8\b", log) and re.search(r"n_expert_used\s+= 2\b", log)
    log = completion(models["tiny-q4"], 2, "-v")[2]
    sizes = [float(x) for x in re.findall(r"CPU_REPACK model buffer size =\s*([\d.]+) MiB", log)]
    assert sizes and max(sizes) > 1.0, "tiny-q4's Q4_0 weights were not repacked (CPU_REPACK)"


def test_warmup_not_counted(completion, models):
    assert completion(models["tiny"], 8, "--no-warmup")[:2] == (3, 7)
    assert completion(models["tiny"], 8)[:2] == (3, 7)


@pytest.fixture(scope="module")
def llama_cpp_module():
    try:
        import llama_cpp
    except ImportError as e:
        pytest.fail(f"the Python client is missing from the venv ({e}); run `cargo xtask setup`", pytrace=False)
    return llama_cpp


@pytest.mark.parametrize("name,n", [("tiny", 8), ("tiny", 24), ("moe", 8)])
def test_python_client_generates_n(llama_cpp_module, models, name, n):
    llm = llama_cpp_module.Llama(model_path=str(models[name]), n_ctx=256, n_threads=2, seed=1, verbose=False)
    try:
        assert llm.tokenize(PROMPT.encode()) == expected_prompt_ids()
        assert llm.token_eos() == GEN.EOS_ID
        banned = {GEN.EOS_ID: float("-inf")}
        banned.update({3 + b: float("-inf") for b in range(0x80, 0x100)})  # <0x80>..<0xFF>
        out = llm.create_completion(PROMPT, max_tokens=n, logit_bias=banned, seed=1)
        assert out["usage"]["prompt_tokens"] == len(expected_prompt_ids())
        assert out["usage"]["completion_tokens"] == n
        assert out["choices"][0]["finish_reason"] == "length"
    finally:
        llm.close()
