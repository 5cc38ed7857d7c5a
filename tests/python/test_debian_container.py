"""Debian sid's packaged llama.cpp (llama.cpp-tools, libggml0 0.27: stripped,
CET, its CPU backend one of 14 variants loaded at run time, newer than
ttrace's tables) in a root of its own, run as a container runs it: in its
own mount and PID namespaces (`unshare --mount --pid --fork chroot ROOT`).
ttrace is given only what a user would type; the program it traces is a
child of the command, with its files seen through its root.

Judged by the programs' own accounts: llama-completion's --perf lines and
buffer lines (-lv 4), llama-server's `timings`, the root's dpkg for the
versions, and the GGUF table and our pinned tokenizer for the model."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_buffers import assert_report_buffers_equal_log
from test_llama_targets import PERF_EVAL, PERF_PROMPT
from test_programs import (PROMPT, SKULK_PROMPTS, assert_requests_equal_timings, assert_weights_are_gguf_tensors,
                           complete, prompt_ids)
from test_sequences import free_port, report, wait_healthy

DERIVED = ("ggml_tensor", "ggml_cgraph", "ggml_backend_buffer", "llama_ubatch")


@pytest.fixture(scope="module")
def debian(paths) -> dict:
    target = paths.get("debian_llama")
    if not target or not Path(target["root"], "usr/bin/llama-completion").is_file():
        pytest.fail("Debian's llama.cpp root is not set up: run `cargo xtask setup`", pytrace=False)
    return target


def in_container(debian: dict, *argv) -> list:
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "chroot", debian["root"], *argv]


def upstream(version: str) -> str:
    """`0.27.0` of dpkg's `0.27.0-1` (an epoch and a Debian revision dropped)."""
    return version.split(":")[-1].rsplit("-", 1)[0].split("+")[0]


def assert_derived_build(a: dict, debian: dict) -> None:
    build = a["header"]["build"]
    assert build["ggml_version"] == upstream(debian["ggml_version"]), (build, debian)
    for structure in DERIVED:
        assert "derived from" in build["layouts"][structure], build["layouts"]
    # Its stripped libggml-base exports neither ggml_graph_view nor ggml_graph_next_uid:
    # `uid` is where its ggml_graph_cpy and its scheduler's code agree, at 88 as ggml has
    # declared it since 0.10. Without it every graph run would be read whole (3 % slower).
    assert build["offsets"].get("ggml_cgraph.uid") == 88, build["offsets"]
    check = a["summary"]["layout_check"]
    assert check["graphs"] > 0 and check["weights"] > 0 and check["ubatches"] > 0, check
    assert not a["summary"]["disabled"], a["summary"]["disabled"]


def test_debian_llama_completion_in_its_own_namespaces(ttrace, debian, models, llama_tokenize, tmp_path):
    trace = tmp_path / "t.data"
    argv = in_container(debian, "llama-completion", "-m", debian["model"], "-p", PROMPT, "-n", "8", "-no-cnv",
                        "--perf", "-t", "2", "-c", "512", "--ignore-eos", "-lv", "4")
    proc = subprocess.run([ttrace, "run", "-o", trace, "--", *argv], capture_output=True, text=True,
                          errors="replace", timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    prompt, runs = PERF_PROMPT.findall(proc.stderr), PERF_EVAL.findall(proc.stderr)
    assert len(prompt) == 1 and len(runs) == 1, proc.stderr[-3000:]

    a = report(ttrace, trace)
    s = a["summary"]
    assert_derived_build(a, debian)
    # Found in the chroot'ed child, the CPU variant ggml's loader kept.
    assert "/ggml/backends" in s["late_attach"]["library"], s["late_attach"]
    # Held at the library load, with its loader (the root's) hooked at its exec.
    assert s["late_attach"]["held"], proc.stderr[-3000:]
    assert "ggml loaded" in proc.stderr and "LATE START" not in proc.stderr, proc.stderr[-3000:]
    prompts = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert [t for u in prompts for t in u["token_ids"]] == prompt_ids(llama_tokenize, models["gemma"])
    assert s["prompt_tokens"] == int(prompt[0]), (s, prompt)
    assert s["generate_ubatches"] == int(runs[0]), (s, runs)
    assert a["tokens"]["sequences"] == 1, a["tokens"]
    assert_report_buffers_equal_log(a, proc.stderr, "Debian's llama-completion")
    assert_weights_are_gguf_tensors(a, models["gemma"])


def test_debian_llama_server_attached_in_its_own_namespaces(ttrace, debian, models, llama_tokenize, tmp_path):
    trace, port = tmp_path / "t.data", free_port()
    argv = in_container(debian, "llama-server", "-m", debian["model"], "--host", "127.0.0.1", "--port", str(port),
                        "-np", "1", "-c", "512", "-t", "2", "--no-webui")
    container = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc=container)
        server = server_pid(container.pid)
        tracer = subprocess.Popen([ttrace, "attach", "--pid", str(server), "-o", trace], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, errors="replace")
        said = ""
        while "attached to pid" not in said:
            line = tracer.stderr.readline()
            assert line, f"ttrace attach ended ({tracer.wait()}) before tracing: {said[-3000:]}"
            said += line
        timings = complete(port)
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, (said + err)[-3000:]
    finally:
        # `unshare --fork` leaves SIGTERM to its child; --kill-child ends the rest.
        for pid in descendants(container.pid):
            os.kill(pid, signal.SIGTERM)
        container.wait(timeout=60)

    a = report(ttrace, trace)
    assert_derived_build(a, debian)
    ids = [t for prompt, _ in SKULK_PROMPTS for t in prompt_ids(llama_tokenize, models["gemma"], prompt)]
    assert_requests_equal_timings(a, timings, ids, ggml=upstream(debian["ggml_version"]))
    assert_weights_are_gguf_tensors(a, models["gemma"])


def server_pid(unshare: int, timeout: float = 30) -> int:
    """The host pid of the llama-server the container's `unshare` started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(unshare):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "llama-server":
                return pid
        time.sleep(0.2)
    pytest.fail(f"no llama-server under pid {unshare}", pytrace=False)


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found
