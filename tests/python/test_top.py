"""`ttrace top`: the screen, driven in a pseudo-terminal, against llama-server
serving Gemma 3 270M to concurrent clients (its generated tokens against the
server's own /metrics); `--json` residency against util-linux `fincore`,
falling after --drop-caches and rising as the model is read; attached to a
llama-server that a parallel `ttrace run -o --mem-limit` started, the disk
bytes of its intervals against the block reads of run's trace. Needs root. Cold-cache runs use a private copy of the model."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pexpect
import pyte

from test_sequences import PROMPTS, free_port, serve, server_argv, wait_healthy


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("llamacpp:") and len(line.split()) == 2}


def bpf_prog_ids(pid: int) -> set[int]:
    """The BPF programs a process holds open (its fdinfo names them)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            m = re.search(r"prog_id:\s*(\d+)", Path(f"/proc/{pid}/fdinfo/{fd}").read_text())
        except OSError:
            continue
        if m:
            ids.add(int(m.group(1)))
    return ids


def loaded_prog_ids() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return {p["id"] for p in json.loads(out)}


class Terminal:
    """`ttrace top` in a pseudo-terminal, its output kept on a pyte screen."""

    def __init__(self, argv: list[str], rows: int = 45, cols: int = 160):
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(str(argv[0]), [str(a) for a in argv[1:]], dimensions=(rows, cols))

    def pump(self, seconds: float):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.stream.feed(self.child.read_nonblocking(65536, timeout=0.1))
            except pexpect.TIMEOUT:
                pass
            except pexpect.EOF:
                return

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump(0.2)
            if m := re.search(pattern, self.text()):
                return m
        raise AssertionError(f"{pattern!r} never appeared; the screen:\n{self.text()}")


def test_screen_counts_the_servers_generated_tokens(ttrace, paths, models):
    port = free_port()
    server = subprocess.Popen([*server_argv(paths, models, port), "--metrics"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    term = None
    try:
        serve(port)  # up and warm before top attaches
        term = Terminal([ttrace, "top", "--pid", server.pid, "--interval", "0.5"])
        # Drawn when the probes are attached: from here every decode is seen.
        term.wait_for(r"tokens total\s+prompt 0\s+generated 0")
        progs = bpf_prog_ids(term.child.pid)
        assert progs, "top holds its programs"
        before = metrics(port)
        responses = serve(port)
        after = metrics(port)
        # The server samples one token more per request than it decodes (the
        # first comes out of the prompt pass): generated = predicted - requests.
        predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
        prompt = after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"]
        assert predicted == sum(r["timings"]["predicted_n"] for r in responses)
        expected = (int(predicted) - len(responses), int(prompt))
        # Totals on screen: the window's count, whatever the interval boundaries.
        m = term.wait_for(rf"tokens total\s+prompt {expected[1]}\s+generated {expected[0]}\b", timeout=30)
        assert (int(m.group(0).split()[-1])) == expected[0]
        assert re.search(r"tokens/s [\d.]+\s+prompt [\d.]+/s\s+generated [\d.]+/s", term.text())
        assert re.search(r"page cache \S+ \S+ of \S+ \S+ \([\d.]+%\)", term.text())
        # Keys: sort, panes, pause; then quit.
        term.child.send("s")
        term.wait_for(r"sort: faults")
        term.child.send("\t")
        term.wait_for(r"\[layers\]")
        term.child.send("5")
        term.wait_for(r"\[sequences\]")
        term.child.send("p")
        term.wait_for(r"\[paused\]")
        term.child.send("q")
        term.child.expect(pexpect.EOF, timeout=60)
        term.child.close()
        assert term.child.exitstatus == 0, term.text()
        # Detached: the server still serves, and top's programs are gone.
        assert server.poll() is None
        time.sleep(0.5)
        assert not progs & loaded_prog_ids()
        assert len(serve(port)) == len(PROMPTS)
        # --once: one interval as JSON, then it detaches too.
        once = subprocess.run([ttrace, "top", "--once", "--pid", str(server.pid), "--interval", "0.5"],
                              capture_output=True, text=True, timeout=120)
        assert once.returncode == 0, once.stderr[-3000:]
        [line] = once.stdout.splitlines()
        assert json.loads(line)["model_bytes"] == os.path.getsize(models["gemma"])
        assert server.poll() is None
    finally:
        if term is not None and term.child.isalive():
            term.child.kill(signal.SIGKILL)
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)


def private_copy(models, tmp_path: Path) -> Path:
    """A copy of Gemma on the disk (a new inode: its page cache is its own)."""
    copy = tmp_path / "gemma-private.gguf"
    shutil.copyfile(models["gemma"], copy)
    with open(copy, "rb") as f:
        os.fsync(f.fileno())
    return copy


def fincore_bytes(path: Path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


class Lines:
    """top's JSON lines, read as they come by a thread."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=lambda: self.lines.extend(map(json.loads, proc.stdout)), daemon=True)
        self.thread.start()

    def next(self, timeout: float = 120) -> dict:
        """The first line printed from now on."""
        seen, end = len(self.lines), time.monotonic() + timeout
        while len(self.lines) <= seen:
            assert time.monotonic() < end and self.proc.poll() is None, "top printed nothing more (see top.err)"
            time.sleep(0.05)
        return self.lines[seen]


def test_json_residency_equals_fincore_and_falls_then_rises(ttrace, tmp_path, paths, models):
    model = private_copy(models, tmp_path)
    with open(model, "rb") as f:
        f.read()  # all of it in the page cache before top starts
    assert fincore_bytes(model) >= os.path.getsize(model)
    port = free_port()
    argv = [str(a) for a in server_argv(paths, models, port)]
    argv[argv.index(str(models["gemma"]))] = str(model)
    # stderr (the server's log too) to a file: a pipe nobody reads could fill and stall them.
    err_path = tmp_path / "top.err"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen([ttrace, "top", "--json", "--interval", "0.5", "--drop-caches", "--", *argv],
                                stdout=subprocess.PIPE, stderr=err_file, text=True, errors="replace")
    lines = Lines(proc)
    try:
        first = lines.next()
        keys = {"t", "tokens_per_s", "generated", "prompt", "disk_bytes_per_s", "faults_per_s", "resident_bytes",
                "model_bytes", "top_tensors"}
        assert keys <= first.keys()
        assert first["model_bytes"] == os.path.getsize(model)
        # Fell: evicted before the server ran.
        assert first["t"] < 0.5 and first["resident_bytes"] < 0.02 * first["model_bytes"], first["resident_bytes"]
        responses = serve(port)
        # Rose: the server loaded the model and served from it.
        after = lines.next()
        assert after["resident_bytes"] > 0.9 * first["model_bytes"], after["resident_bytes"]
        assert sum(line["generated"] for line in lines.lines) == sum(r["timings"]["predicted_n"] - 1 for r in responses)
        # Idle now: the figure and fincore's at the same moment, within 1 %.
        reference = fincore_bytes(model)
        line = lines.next()
        assert abs(line["resident_bytes"] - reference) <= 0.01 * reference, (line["resident_bytes"], reference)
        per_tensor = sum(t["resident_bytes"] for t in line["top_tensors"])
        assert 0 < per_tensor <= line["resident_bytes"]
        assert all(t["resident_bytes"] <= t["size_bytes"] for t in line["top_tensors"])
    finally:
        proc.send_signal(signal.SIGINT)  # top stops the server it started
        proc.wait(timeout=120)
        lines.thread.join(timeout=30)  # the thread alone reads stdout, to its end
    assert proc.returncode == 0, err_path.read_text(errors="replace")[-3000:]
    assert lines.lines[-1]["t"] > after["t"]  # the last, partial interval after the stop


def evict(path: Path):
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def descendant(pid: int, exe_name: str) -> int:
    """The process under `pid` whose executable is `exe_name`."""
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            children = (task / "children").read_text().split()
            for c in map(int, children):
                try:
                    if Path(os.readlink(f"/proc/{c}/exe")).name == exe_name:
                        return c
                except OSError:
                    pass
                todo.append(c)
    raise AssertionError(f"no {exe_name} under pid {pid}")


def model_file_reads_after(ttrace, trace: Path, tmp_path: Path, since_monotonic_ns: int) -> int:
    """Bytes of the model-file read requests issued to the driver from
    `since_monotonic_ns` on, as the trace's blkparse export lists them (a
    request issued again before it completed is counted once)."""
    report = json.loads(subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    since = (since_monotonic_ns - report["header"]["start_monotonic_ns"]) / 1e9
    out = tmp_path / "run.blkparse"
    subprocess.run([ttrace, "export", trace, "--format", "blkparse", "-o", out], check=True, capture_output=True)
    pending, total = set(), 0
    for line in out.read_text().splitlines():
        dev, _cpu, _seq, t, _pid, action, rwbs, sector, _plus, sectors = line.split()[:10]
        key = (dev, sector)
        if action == "C":
            pending.discard(key)
        elif action == "D" and "R" in rwbs and " tensor=" in line and float(t) >= since and key not in pending:
            pending.add(key)
            total += int(sectors) * 512
    return total


def test_mem_limit_disk_bytes_sum_to_a_parallel_runs_block_reads(ttrace, tmp_path, paths, models):
    """`ttrace run -o --mem-limit` starts llama-server and records; `ttrace top
    --pid` attaches to the server once it is idle. The disk bytes top shows
    over its intervals equal the model-file block reads run's trace holds from
    the first request on (the server reads nothing while idle), within 1 %."""
    model = private_copy(models, tmp_path)
    evict(model)
    port = free_port()
    argv = [str(a) for a in server_argv(paths, models, port)]
    argv[argv.index(str(models["gemma"]))] = str(model)
    argv[argv.index("-c") + 1] = "1024"  # 256 per slot: the KV cache leaves the limit to the page cache
    trace = tmp_path / "run.data"
    run_err, top_err = tmp_path / "run.err", tmp_path / "top.err"
    with open(run_err, "w") as err:
        run = subprocess.Popen([ttrace, "run", "-o", trace, "--mem-limit", "200M", "--", *argv],
                               stdout=subprocess.DEVNULL, stderr=err)
    top = None
    try:
        wait_healthy(port, 180, run)
        server = descendant(run.pid, "llama-server")
        with open(top_err, "w") as err:
            top = subprocess.Popen([ttrace, "top", "--pid", str(server), "--json", "--interval", "0.5"],
                                   stdout=subprocess.PIPE, stderr=err, text=True, errors="replace")
        lines = Lines(top)
        lines.next()  # attached and counting
        since = time.monotonic_ns()
        responses = serve(port)
        assert all(r["timings"]["predicted_n"] > 0 for r in responses)
        lines.next()
        lines.next()  # the last reads have landed in an interval
        top.send_signal(signal.SIGINT)  # detaches; the server goes on
        top.wait(timeout=120)
        lines.thread.join(timeout=30)
        assert top.returncode == 0, top_err.read_text(errors="replace")[-3000:]
        assert run.poll() is None, "top's detach must leave the server and run alone"
    finally:
        if top is not None and top.poll() is None:
            top.kill()
        run.send_signal(signal.SIGINT)  # run stops the server it started and writes the trace
        run.wait(timeout=120)
    assert run.returncode == 0, run_err.read_text(errors="replace")[-3000:]
    # The limit of the cgroup run made, found from the attached pid.
    memory = [line["memory"] for line in lines.lines if line["memory"]]
    assert len(memory) == len(lines.lines), "every interval shows the server's cgroup"
    assert all(m["limit_bytes"] == 200 << 20 and 0 < m["usage_bytes"] <= m["limit_bytes"] for m in memory), memory
    shown = sum(line["disk_bytes_per_s"] * line["interval_s"] for line in lines.lines)
    assert abs(shown - sum(line["disk_bytes"] for line in lines.lines)) < 1  # rates are bytes over each interval
    recorded = model_file_reads_after(ttrace, trace, tmp_path, since)
    print(f"top showed {shown:.0f} disk bytes over {len(lines.lines)} intervals; run's trace holds {recorded}")
    # Streamed: the cgroup holds less than the model, so the requests re-read it.
    assert recorded > os.path.getsize(model), (recorded, os.path.getsize(model))
    assert abs(shown - recorded) <= 0.01 * recorded, (shown, recorded)


def test_moe_expert_grid_equals_the_traces_routing(ttrace, tmp_path, paths, models):
    """Per layer and expert, the routings the intervals count are the experts
    the recorded trace's report says each token selected. The command runs in
    a cgroup of top's own (--mem-limit, ample here): every interval shows it."""
    trace = tmp_path / "moe.data"
    argv = [paths["llama_completion"], "-m", models["moe"], "-p", "hello world", "-n", "12", "-no-cnv",
            "--ignore-eos", "-t", "2"]
    # The command's own output goes to stderr (random weights: any bytes).
    proc = subprocess.run([ttrace, "top", "--json", "--interval", "0.5", "--mem-limit", "1G", "-o", trace, "--",
                           *argv], capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    memory = [line["memory"] for line in lines]
    assert all(m and m["limit_bytes"] == 1 << 30 and m["usage_bytes"] <= 1 << 30 for m in memory), memory
    assert max(m["usage_bytes"] for m in memory) > 0, memory
    shown: dict[tuple[int, int], int] = {}
    for line in lines:
        for layer, counts in line["experts"].items():
            for expert, n in enumerate(counts):
                shown[int(layer), expert] = shown.get((int(layer), expert), 0) + n
    report = json.loads(subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    routed: dict[tuple[int, int], int] = {}
    for u in report["ubatches"]:
        for row in u.get("routing") or []:
            for expert in row["selected"]:
                routed[row["layer"], expert] = routed.get((row["layer"], expert), 0) + 1
    assert routed and {k: v for k, v in shown.items() if v} == routed
    assert lines[-1]["generated_total"] == report["tokens"]["generated"]
