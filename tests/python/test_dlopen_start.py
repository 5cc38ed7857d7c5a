"""A program that loads llama.cpp with dlopen and computes at once (what a
Node addon or a Python client does) is traced from its first graph: `run`
holds it at the library load until ggml's probes are in. Judged by the
program's own counts and llama.cpp's buffer log lines, in 20 of 20 runs
(the kernel matrix: 1 run of the tiny model per kernel).

Before the hold, ttrace found such a library by scanning the maps every
20 ms; a program this quick lost its prompt, or ran to its end untraced.

The hold follows the processes the command starts to their exec (a program
run by `unshare --fork ... sh -c`, as a container runs one), hooking each
one's own loader there.

A process that loads ggml and ends before any graph does not keep ttrace
from the next one that loads it.

The same hold covers a program run by the loader itself (`ld.so PROGRAM`,
whose executable names no libraries): judged by llama-completion's perf lines."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sysconfig
import os
from pathlib import Path

import pytest

from test_buffers import assert_report_buffers_equal_log

SOURCE = Path(__file__).with_name("dlopen_generate.c")
# The kernel matrix runs fewer (its guests' CPU is emulated).
RUNS = int(os.environ.get("TTRACE_TEST_RUNS", "20"))
# The kernel matrix runs the tiny model (Gemma read over 9p under emulation
# takes minutes a run); the hold does not depend on the model.
MODEL = os.environ.get("TTRACE_DLOPEN_MODEL", "gemma")
N_PREDICT = 4


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """dlopen_generate.c, built against the llama.h of the pinned llama-cpp-python."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc); install build-essential", pytrace=False)
    include = Path(sysconfig.get_paths()["purelib"]) / "include"
    if not (include / "llama.h").is_file():
        pytest.fail(f"no llama.h in {include}: run `cargo xtask setup`", pytrace=False)
    exe = tmp_path_factory.mktemp("dlopen") / "dlopen_generate"
    subprocess.run([cc, "-O2", "-I", include, "-o", exe, SOURCE, "-ldl"], check=True)
    return exe


def test_dlopened_llama_traced_from_its_first_graph(ttrace, paths, models, program, tmp_path):
    libllama = Path(paths["llama_lib_dir"]) / "libllama.so"
    for run in range(RUNS):
        argv = [program, libllama, models[MODEL], "hello world", str(N_PREDICT)]
        assert_traced_from_first_graph(ttrace, argv, tmp_path / f"t{run}.data", f"run {run}")


def test_dlopened_llama_in_a_grandchild_traced_from_its_first_graph(ttrace, paths, models, program, tmp_path):
    """The program two processes below the command, in namespaces of its own
    (as a container runs it): the hold follows the processes the command
    starts to their exec, and hooks each one's loader there."""
    libllama = Path(paths["llama_lib_dir"]) / "libllama.so"
    for run in range(RUNS):
        script = f"'{program}' '{libllama}' '{models[MODEL]}' 'hello world' {N_PREDICT}; true"
        argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script]
        assert_traced_from_first_graph(ttrace, argv, tmp_path / f"t{run}.data", f"run {run}")


def test_a_process_that_loads_ggml_and_ends_before_a_graph_leaves_the_next_traced(
        ttrace, paths, models, llama_completion, program, tmp_path):
    """A process that loads ggml and ends without computing (a version
    check; node-llama-cpp tests its binary in a child first), then the one
    that computes: ttrace lets the first go and traces the second from its
    first graph. Before, it kept to the ended process: an empty trace, exit
    status 0."""
    libllama = Path(paths["llama_lib_dir"]) / "libllama.so"
    for run in range(min(RUNS, 5)):
        script = (f"'{llama_completion}' --version >/dev/null 2>&1; "
                  f"'{program}' '{libllama}' '{models[MODEL]}' 'hello world' {N_PREDICT}")
        assert_traced_from_first_graph(ttrace, ["sh", "-c", script], tmp_path / f"t{run}.data", f"run {run}")


def assert_traced_from_first_graph(ttrace, argv: list, out: Path, where: str) -> None:
    proc = subprocess.run([ttrace, "run", "-o", out, "--", *argv], capture_output=True, text=True,
                          errors="replace", timeout=300)
    assert proc.returncode == 0, f"{where}: ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    own = dict(re.findall(r"^(prompt_tokens|eval_runs)=(\d+)$", proc.stdout, re.M))
    assert set(own) == {"prompt_tokens", "eval_runs"}, f"{where}: the program printed {proc.stdout!r}"

    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    s = a["summary"]
    where = f"{where}: {proc.stderr[-1500:]}"
    assert s["late_attach"] == {"library": s["late_attach"]["library"], "held": True}, where
    assert "libggml-cpu" in s["late_attach"]["library"], where
    assert "ggml loaded" in proc.stderr and "LATE START" not in proc.stderr, where
    assert s["prompt_tokens"] == int(own["prompt_tokens"]), where
    assert s["prompt_ubatches"] == 1 and s["generate_ubatches"] == int(own["eval_runs"]), where

    assert_report_buffers_equal_log(a, proc.stderr, where)


def test_program_run_by_the_loader(ttrace, llama_completion, models, flush_log_preload, tmp_path):
    from test_llama_targets import PERF_EVAL, PERF_PROMPT

    loader = Path("/lib64/ld-linux-x86-64.so.2")
    out = tmp_path / "t.data"
    argv = [ttrace, "run", "-o", out, "--", loader, llama_completion, "-m", models["tiny"], "-p", "hello world",
            "-n", "4", "-no-cnv", "--ignore-eos", "-t", "2", "--seed", "1", "--perf"]
    env = dict(os.environ, LD_PRELOAD=str(flush_log_preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=300)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    prompt, runs = PERF_PROMPT.search(proc.stderr), PERF_EVAL.search(proc.stderr)
    assert prompt and runs, proc.stderr[-2000:]
    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    s = a["summary"]
    # A run without the row (seen once, under load, not reproduced in 30
    # runs since) says what it printed.
    assert (s["late_attach"] or {}).get("held"), (s["late_attach"], proc.stderr[-3000:])
    assert s["prompt_tokens"] == int(prompt.group(1)) and s["generate_ubatches"] == int(runs.group(1)), s
