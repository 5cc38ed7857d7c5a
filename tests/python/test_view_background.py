"""`ttrace view` while it computes: the Memory tab's simulation runs in the
background (202 with its progress until its document is in, the same as
`ttrace simulate --json`), every other query answers meanwhile, and SIGTERM
or Ctrl-C stops the server within a second, whatever it is computing: a
simulation of a 4000-token run (minutes of work), or the index at start-up.
Needs root: the traces are recorded here."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_exports import record
from test_view import Server, free_port, simulated

# The process must be gone this soon after the signal (issue 42).
EXIT_WITHIN_S = 1.0
# Another query's answer while the simulation runs: prompt, not queued
# behind it (each takes milliseconds alone).
ANSWER_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def long_trace(ttrace, tmp_path_factory, llama_completion, models) -> Path:
    """4000 tokens of the tiny model: its simulation runs for minutes."""
    trace = tmp_path_factory.mktemp("view-long") / "long.data"
    proc = subprocess.run([ttrace, "run", "-o", trace, "--", llama_completion, "-m", models["tiny"], "-p", "hi",
                           "-n", "4000", "-c", "4096", "-no-cnv", "--ignore-eos", "-t", "2"],
                          capture_output=True, text=True, errors="replace", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return trace


def ask(base: str, path: str) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one GET."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(base + path, timeout=60) as r:
            return r.status, r.read(), time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.monotonic() - started


def start_simulating(server: Server) -> float:
    """Starts the simulation; its progress once it is seen computing."""
    status, body, _ = ask(server.base, "api/v1/simulate")
    assert status == 202 and json.loads(body) == {"state": "computing", "progress": 0.0}, (status, body)
    status, body, _ = ask(server.base, "api/v1/simulate")
    assert status == 202, "the simulation ended at once: the run is too short to test this"
    return json.loads(body)["progress"]


def stop(proc: subprocess.Popen, sig: signal.Signals) -> float:
    """Seconds from `sig` until the process is gone (a hang guard of 30 s)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=30)
    return time.monotonic() - sent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_while_it_simulates(ttrace, long_trace, tmp_path, sig):
    """The simulation would run for minutes; the process is gone within a
    second of the signal, exits 0 and says why."""
    server = Server(ttrace, long_trace, tmp_path / "view.log")
    start_simulating(server)
    waited = stop(server.proc, sig)
    log = server.log.read_text()
    assert server.proc.returncode == 0, log[-2000:]
    assert f"ttrace: view stopped by {sig.name}" in log, log[-2000:]
    assert "panicked" not in log
    assert waited < EXIT_WITHIN_S, f"exited {waited:.2f} s after {sig.name}"


def opened(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = list(fds.iterdir())
    except FileNotFoundError:
        return False
    for fd in names:
        try:
            if Path(os.readlink(fd)) == path.resolve():
                return True
        except FileNotFoundError:
            continue
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_while_it_indexes(ttrace, long_trace, tmp_path, sig):
    """Before it listens: the index of the trace is being built."""
    # Not mapped from the index an earlier test's server saved.
    Path(f"{long_trace}.ttidx").unlink(missing_ok=True)
    log = tmp_path / "view.log"
    with log.open("w") as err:
        proc = subprocess.Popen([ttrace, "view", long_trace, "--no-open", "--port", str(free_port())],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    # Once the trace is open, the index is being built (its signals are
    # caught before): the index of 330 k ops takes 0.1 s, so the "indexing"
    # line, said only after that long, may never come.
    deadline = time.monotonic() + 60  # a hang guard
    while not opened(proc.pid, long_trace):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.0002)
    waited = stop(proc, sig)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert proc.stdout.read() == "", "the URL was printed: indexing ended before the signal"
    assert f"ttrace: view stopped while indexing by {sig.name}" in text, text
    assert waited < EXIT_WITHIN_S, f"exited {waited:.2f} s after {sig.name}"


def test_other_queries_answer_while_it_simulates(ttrace, long_trace, tmp_path):
    """While the simulation computes (and says how far it got, never going
    back), the other queries answer as fast as ever."""
    server = Server(ttrace, long_trace, tmp_path / "view.log")
    try:
        progress = start_simulating(server)
        queries = ["api/v1/meta", "api/v1/ubatches", "api/v1/tokens", "api/v1/summary",
                   "api/v1/ops?sort=weight_bytes&desc=1&limit=100", "api/v1/timeline/tracks"]
        slowest = 0.0
        for _ in range(5):
            for q in queries:
                status, body, took = ask(server.base, q)
                assert status == 200, (q, status, body[:300])
                slowest = max(slowest, took)
            status, body, _ = ask(server.base, "api/v1/simulate")
            assert status == 202, "the simulation ended: the run is too short to test this"
            now = json.loads(body)["progress"]
            assert progress <= now < 1
            progress = now
        print(f"slowest other query while simulating: {slowest * 1e3:.0f} ms")
        assert slowest < ANSWER_WITHIN_S, f"a query took {slowest:.2f} s while the simulation ran"
    finally:
        server.close()


def test_polled_simulation_is_ttrace_simulate(ttrace, tmp_path, llama_completion, models, flush_log_preload):
    """Polled until done, by several clients at once: one computation (the
    server's log says so once), whose document is `ttrace simulate --json`'s."""
    trace = record(ttrace, tmp_path / "t.data", llama_completion, models["tiny"], flush_log_preload)
    want = json.loads(subprocess.run([ttrace, "simulate", trace, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    log = tmp_path / "view.log"
    port = free_port()
    with log.open("w") as err:
        proc = subprocess.Popen([ttrace, "-v", "view", trace, "--no-open", "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        base = proc.stdout.readline().split()[2]
        first = [ask(base, "api/v1/simulate") for _ in range(3)]
        assert first[0][0] == 202, first[0]
        assert all(json.loads(body)["state"] == "computing" for status, body, _ in first if status == 202)
        assert simulated(base) == want
        assert simulated(base) == want, "kept"
    finally:
        stop(proc, signal.SIGTERM)
    assert log.read_text().count("simulate computed in") == 1, log.read_text()[-2000:]
