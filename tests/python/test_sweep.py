"""`ttrace sweep`: one plan (Gemma 3 270M and an MoE model × 3 prompt domains
× 2 memory limits × 2 repeats), interrupted with SIGINT and resumed; DuckDB
and Spark read the dataset unchanged with the queries of docs/DATASET.md, and
agree with each other, with every run's `ttrace report --json`, and with
`ttrace sweep report`'s domain similarity. Needs root: the runs are traced."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from sweep_queries import duckdb_results

HERE = Path(__file__).resolve().parent
DOMAINS = {
    "code": "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n",
    "math": "Prove that the square root of two is irrational. Suppose that",
    "creative": "Once upon a time, in a village at the edge of the sea, there lived",
}
REPEATS = 2
# Budgets where every run succeeds: Gemma (241 MiB of weights plus ~60 MiB of
# KV cache and compute at -c 256) streams its weights from disk under 256M
# and keeps more of them under 320M; the MoE model (26 MiB) is squeezed at 32M.
GEMMA_LIMITS = ["256M", "320M"]
MOE_LIMITS = ["32M", "48M"]
N_PREDICT = 4


def plan(tmp: Path, models: dict, llama_completion: Path) -> Path:
    prompts = "".join(f'[[prompts]]\ndomain = "{d}"\ntext = {json.dumps(t)}\n' for d, t in DOMAINS.items())
    text = f"""
models = [
  {{ path = "{models['gemma']}", mem_limits = {json.dumps(GEMMA_LIMITS)} }},
  {{ path = "{models['moe']}", mem_limits = {json.dumps(MOE_LIMITS)} }},
]
threads = [2]
cache = "cold"
repeats = {REPEATS}
n_predict = {N_PREDICT}
ctx = 256

[command]
program = "{llama_completion}"
args = ["--ignore-eos", "--temp", "0"]

{prompts}"""
    path = tmp / "plan.toml"
    path.write_text(text)
    return path


def finished(directory: Path) -> dict[str, Path]:
    runs = directory / "runs"
    return {p.stem: p for p in runs.glob("r*.json")} if runs.is_dir() else {}


def report(ttrace, trace: Path) -> dict:
    out = subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def spark(directory: Path) -> dict:
    """The doc's queries in Spark, offline: a network namespace with only
    loopback, so nothing can be downloaded at run time."""
    script = f"ip link set lo up && exec {sys.executable} {HERE / 'sweep_queries.py'} spark {directory}"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def same_rows(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], float) or isinstance(y[k], float):
                if x[k] is None or y[k] is None or x[k] != pytest.approx(y[k], rel=1e-9, abs=1e-9):
                    if x[k] != y[k]:
                        return False
            elif x[k] != y[k]:
                return False
    return True


def test_sweep_dataset_duckdb_spark_and_report(ttrace, tmp_path, models, llama_completion, flush_log_preload):
    started = time.monotonic()
    out = tmp_path / "sweep"
    plan_path = plan(tmp_path, models, llama_completion)
    n_runs = 2 * len(DOMAINS) * 2 * REPEATS
    # The preload drains llama.cpp's log at exit, so its perf lines (the
    # `llama_*` columns) are always there to compare.
    env = dict(os.environ, LD_PRELOAD=str(flush_log_preload))
    argv = [ttrace, "sweep", plan_path, "-o", out]

    # Interrupted mid-way: after some runs are done, while another one runs.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 900
    while len(finished(out)) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the sweep ended before it could be interrupted:\n{proc.stderr.read()[-3000:]}"
    # Into the next run (a Gemma one, seconds long): its trace file appears
    # once its probes are attached, and its log once the command runs.
    running = None
    while running is None and time.monotonic() < deadline:
        started_runs = {p.stem for p in (out / "traces").glob("*.data")} - set(finished(out))
        logs = [r for r in started_runs if (out / "logs" / f"{r}.log").is_file()
                and (out / "logs" / f"{r}.log").stat().st_size > 0]
        running = logs[0] if logs else None
        time.sleep(0.05)
    assert running, "no run started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "interrupted" in err, err[-3000:]
    done = finished(out)
    assert 5 <= len(done) < n_runs, len(done)
    # The run stopped left nothing behind: no record, trace, log or dataset file.
    assert running not in done and not (out / "logs" / f"{running}.log").exists()
    assert {p.stem for p in (out / "traces").glob("*.data")} == set(done)
    run_dirs = {p.name.removeprefix("run_id=") for p in (out / "dataset").glob("table=*/model=*/run_id=*")}
    assert run_dirs <= set(done)
    before = {rid: ((out / "traces" / f"{rid}.data").stat().st_mtime_ns, p.stat().st_mtime_ns, p.read_text())
              for rid, p in done.items()}

    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(done)} done before (skipped)" in proc.stderr, proc.stderr[-2000:]
    # No finished run was redone: same trace and record, untouched.
    for rid, (trace_mtime, record_mtime, record) in before.items():
        assert (out / "traces" / f"{rid}.data").stat().st_mtime_ns == trace_mtime, rid
        assert done[rid].stat().st_mtime_ns == record_mtime and done[rid].read_text() == record, rid
    records = {rid: json.loads(p.read_text()) for rid, p in finished(out).items()}
    assert len(records) == n_runs
    failed = {rid: r["error"] for rid, r in records.items() if r["error"]}
    assert not failed, failed
    assert not list((out / "dataset").rglob(".*")), "temporaries left in the dataset"
    assert not (out / "models").exists(), "the private model copies outlive the finished sweep"
    sweep_done = time.monotonic()

    db = duckdb_results(out)
    sp = spark(out)
    assert db.keys() == sp.keys() and len(db) >= 6
    for name in db:
        assert same_rows(db[name], sp[name]), (name, db[name][:3], sp[name][:3])

    figures = {r["run_id"]: r for r in db["run_figures"]}
    tokens = {r["run_id"]: r for r in db["token_counts"]}
    disk = {r["run_id"]: r for r in db["disk_per_token"]}
    activations: dict[str, dict] = {}
    for r in db["expert_activations"]:
        activations.setdefault(r["run_id"], {})[(r["layer"], r["phase"], r["expert"])] = r["activations"]
    # One row per run in `runs`: none doubled, none lost.
    assert sorted(figures) == sorted(records)
    for rid, rec in records.items():
        a = report(ttrace, out / rec["trace"])
        s, stats = a["summary"], a["stats"]
        generate = [u for u in stats["ubatches"] if u["phase"] == "generate"]
        assert len(generate) == N_PREDICT - 1, rid
        f = figures[rid]
        assert (f["model"], f["domain"], f["status"]) == (rec["model"], rec["params"]["domain"], "ok")
        assert f["prompt_tokens"] == s["prompt_tokens"] and f["generated_tokens"] == len(generate)
        assert (tokens[rid]["prompt_tokens"], tokens[rid]["generated_tokens"]) == \
            (s["tokens"]["prompt"], s["tokens"]["generated"])
        want_disk = sum(u["disk_bytes"] for u in generate) / len(generate)
        assert f["disk_bytes_per_token"] == pytest.approx(want_disk, rel=1e-12)
        assert disk[rid]["disk_bytes_per_token"] == pytest.approx(want_disk, rel=1e-12)
        assert f["weight_bytes_per_token"] == pytest.approx(sum(u["weight_bytes"] for u in generate) / len(generate))
        # llama.cpp's own counters agree with the trace's.
        assert rec["llama"]["prompt_tokens"] == s["prompt_tokens"], rec["llama"]
        assert rec["llama"]["eval_runs"] == len(generate), rec["llama"]
        moe = stats["moe"]
        if rec["model"] == "moe":
            want = {(layer["layer"], p["phase"], e): n for layer in moe["layers"] for p in layer["phases"]
                    for e, n in enumerate(p["activations"]) if n}
            assert activations[rid] == want, rid
        else:
            assert moe is None and rid not in activations
    # The io table names the tensor each block request read, as the blkparse export does.
    for rid, rec in records.items():
        assert io_block_issues(out, rid) == blkparse_issues(ttrace, out / rec["trace"], tmp_path / f"{rid}.blk"), rid
    # Gemma under the smaller limit reads its weights from disk for every token.
    gemma_low = [figures[rid] for rid, rec in records.items()
                 if rec["model"] != "moe" and rec["params"]["mem_limit_bytes"] == 256 << 20]
    assert len(gemma_low) == len(DOMAINS) * REPEATS and all(f["disk_bytes_per_token"] > 0 for f in gemma_low)

    # The sweep report's domain similarity is the dataset's, by DuckDB.
    proc = subprocess.run([ttrace, "sweep", "report", out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_report = json.loads((out / "report.json").read_text())
    assert (out / "report.html").read_text().count("<table>") >= 3
    by_model = {m["model"]: m for m in sweep_report["models"]}
    assert by_model.keys() == {"moe", "gemma-3-270m-q4_k_m"}
    assert by_model["gemma-3-270m-q4_k_m"]["similarity"] is None
    sim = by_model["moe"]["similarity"]
    assert sorted(sim["domains"]) == sorted(DOMAINS) and sim["metric"] == "cosine"
    sql = {(r["domain_a"], r["domain_b"]): r["cosine"] for r in db["domain_similarity"] if r["model"] == "moe"}
    for i, da in enumerate(sim["domains"]):
        for j, db_ in enumerate(sim["domains"]):
            assert sim["matrix"][i][j] == pytest.approx(sql.get((da, db_), 0.0), rel=1e-9), (da, db_)
    assert all(sim["matrix"][i][i] == pytest.approx(1.0) for i in range(len(DOMAINS)))
    limits = {r["mem_limit_bytes"]: r for r in by_model["gemma-3-270m-q4_k_m"]["disk_vs_mem_limit"]}
    sql_limits = {r["mem_limit_bytes"]: r for r in db["disk_vs_mem_limit"] if r["model"] != "moe"}
    assert limits.keys() == sql_limits.keys()
    for k, r in limits.items():
        assert r["disk_bytes_per_token"]["mean"] == pytest.approx(sql_limits[k]["disk_bytes_per_token"])
    print(f"\nsweep of {n_runs} runs (interrupted and resumed): {sweep_done - started:.0f} s; "
          f"queries, reports and checks: {time.monotonic() - sweep_done:.0f} s")


def test_sweep_server_clients(ttrace, tmp_path, paths, models):
    """The `server` kind: llama-server traced while two clients send their
    completions at once. The sequences and tokens in the trace, the report and
    the dataset are what the server answered each client (its `timings`)."""
    server = Path(paths["llama_lib_dir"]) / "llama-server"
    plan_path = tmp_path / "plan.toml"
    plan_path.write_text(f"""
models = ["{models['moe']}"]
threads = [2]
n_predict = 6
ctx = 512

[command]
kind = "server"
program = "{server}"
clients = 2
args = ["--no-webui"]
request = {{ temperature = 0, ignore_eos = true }}

[[prompts]]
domain = "code"
text = {json.dumps(DOMAINS["code"])}
""")
    out = tmp_path / "sweep"
    proc = subprocess.run([ttrace, "sweep", plan_path, "-o", out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in finished(out).values()]
    assert record["error"] is None and record["params"]["clients"] == 2
    served = record["served"]
    assert len(served) == 2 and sorted(s["slot"] for s in served) == [0, 1]
    assert all(s["predicted_n"] == 6 for s in served)

    a = report(ttrace, out / record["trace"])
    tokens = a["summary"]["tokens"]
    assert tokens["sequences"] == 2
    assert tokens["prompt"] == sum(s["prompt_n"] for s in served)
    assert tokens["generated"] == sum(s["predicted_n"] - 1 for s in served)

    import duckdb
    con = duckdb.connect()
    glob = f"{out}/dataset/table={{}}/*/*/*.parquet"
    ((clients,),) = con.sql(f"SELECT clients FROM read_parquet('{glob.format('runs')}')").fetchall()
    assert clients == 2
    per_seq = dict(con.sql(f"SELECT seq, COUNT(*) FROM read_parquet('{glob.format('tokens')}') "
                           "WHERE kind = 'generated' GROUP BY seq").fetchall())
    assert sorted(per_seq.values()) == [5, 5] and len(per_seq) == 2


def test_sweep_failed_run_recorded_and_retried(ttrace, tmp_path, models, llama_completion):
    """A run that fails (OOM-killed in a 4 MiB cgroup) is recorded with its
    error, as a `runs` row with status `failed` and no other rows, and the
    sweep goes on; a rerun skips it, `--retry-failed` runs it again."""
    plan_path = tmp_path / "plan.toml"
    plan_path.write_text(f"""
models = ["{models['moe']}"]
mem_limits = ["4M", "none"]
threads = [2]
n_predict = 4
ctx = 256
[command]
program = "{llama_completion}"
args = ["--ignore-eos"]
[[prompts]]
domain = "code"
text = "def f():"
""")
    out = tmp_path / "sweep"
    argv = [ttrace, "sweep", plan_path, "-o", out]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "1 runs done now, 1 failed" in proc.stderr, proc.stderr[-3000:]
    records = {rid: json.loads(p.read_text()) for rid, p in finished(out).items()}
    failed = [r for r in records.values() if r["error"]]
    assert len(failed) == 1 and failed[0]["params"]["mem_limit_bytes"] == 4 << 20
    assert "killed by signal 9" in failed[0]["error"], failed[0]["error"]
    rows = duckdb.sql(f"SELECT run_id, status, error, generated_tokens FROM read_parquet("
                      f"'{out}/dataset/table=runs/*/*/*.parquet', hive_partitioning = true)").fetchall()
    by_id = {r[0]: r for r in rows}
    assert len(rows) == 2 and by_id[failed[0]["run_id"]][1:] == ("failed", failed[0]["error"], None)
    for table in ["ubatches", "tokens", "routing"]:
        assert not list((out / "dataset" / f"table={table}").glob(f"*/run_id={failed[0]['run_id']}"))

    mtimes = {rid: p.stat().st_mtime_ns for rid, p in finished(out).items()}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "2 done before (skipped)" in proc.stderr, proc.stderr[-3000:]
    assert {rid: p.stat().st_mtime_ns for rid, p in finished(out).items()} == mtimes
    proc = subprocess.run([*argv, "--retry-failed"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "0 runs done now, 1 failed, 1 done before" in proc.stderr, proc.stderr[-3000:]
    again = {rid: p.stat().st_mtime_ns for rid, p in finished(out).items()}
    assert [rid for rid in again if again[rid] != mtimes[rid]] == [failed[0]["run_id"]]


def io_block_issues(out: Path, run_id: str) -> list[tuple]:
    """(sector, tensor, file offset) of every block request the run issued on the model, from the dataset."""
    rows = duckdb.sql(
        f"select sector, tensor, file_offset from read_parquet('{out}/dataset/table=io/*/*/*.parquet', "
        f"hive_partitioning=true) where run_id = '{run_id}' and kind = 'block' and name = 'issue' "
        "and tensor is not null order by seq").fetchall()
    return [tuple(r) for r in rows]


def blkparse_issues(ttrace, trace: Path, out: Path) -> list[tuple]:
    """The same, from `ttrace export --format blkparse`'s `D` lines (an independent walk of the trace)."""
    proc = subprocess.run([ttrace, "export", trace, "--format", "blkparse", "-o", out], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    issues = []
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) > 7 and fields[5] == "D" and " tensor=" in line:
            tags = dict(f.split("=", 1) for f in fields if "=" in f)
            if tags["tensor"] != "-":
                issues.append((int(fields[7]), tags["tensor"], int(tags["file_off"])))
    return issues
