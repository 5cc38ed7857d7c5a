"""`ttrace simulate` on real traces: what must hold whatever the model of
the kernel (OPT is a floor, LRU is a stack algorithm, a budget holding
everything re-reads nothing), its outputs, and its errors."""
from __future__ import annotations

import collections
import csv
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import gguf
import pytest
from test_exports import CHROMIUM_FLAGS

PROMPT = "The history of the printing press begins in"
MIB = 1 << 20


def trace_moe(ttrace, out, llama_completion, models, flush_log_preload, tokens: int):
    argv = [ttrace, "run", "-o", out, "--", llama_completion, "-m", models["moe"], "-p", PROMPT, "-n", str(tokens),
            "-no-cnv", "--ignore-eos", "-t", "2", "--temp", "0", "-c", "256"]
    env = dict(os.environ, LD_PRELOAD=str(flush_log_preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def moe_trace(ttrace, tmp_path_factory, llama_completion, models, flush_log_preload):
    out = tmp_path_factory.mktemp("simulate") / "moe.data"
    return trace_moe(ttrace, out, llama_completion, models, flush_log_preload, 12)


def simulate(ttrace, trace, *args) -> subprocess.CompletedProcess:
    return subprocess.run([ttrace, "simulate", trace, *args], capture_output=True, text=True, timeout=600)


def test_floors_stack_property_and_a_budget_that_holds_everything(ttrace, moe_trace, tmp_path, models):
    budgets = [8, 12, 16, 20, 24, 28, 32, 48]
    # Demand paging (--readahead 0): the kernel's read-around makes LRU no
    # longer a stack algorithm.
    proc = simulate(ttrace, moe_trace, "--budgets", ",".join(f"{b}M" for b in budgets), "--json", "--readahead", "0",
                    "--csv", tmp_path / "c.csv", "--plot", tmp_path / "c.svg")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    # The recorded anonymous memory is what the limit spends besides the model.
    assert 0 < doc["anon_bytes"] < 64 * MIB and "recorded" in doc["anon_source"]
    assert doc["generated_tokens"] == 11 and doc["populate"]
    assert 0 < doc["footprint_bytes"] <= models["moe"].stat().st_size
    rows = {(r["budget_bytes"], r["policy"]): r for r in doc["rows"]}
    assert len(rows) == len(budgets) * 3
    for b in budgets:
        lru, opt, two = (rows[(b * MIB, p)] for p in ("lru", "opt", "2q"))
        assert opt["misses"] <= lru["misses"] and opt["misses"] <= two["misses"], b
        assert lru["cache_bytes"] == max(0, b * MIB - doc["anon_bytes"])
        assert lru["disk_bytes"] == lru["misses"] * doc["page_bytes"]
        assert lru["disk_bytes_per_token"] == pytest.approx(lru["disk_bytes"] / 11)
    # LRU and OPT are stack algorithms: a larger cache never misses more.
    for policy in ("lru", "opt"):
        misses = [rows[(b * MIB, policy)]["misses"] for b in budgets]
        assert misses == sorted(misses, reverse=True), (policy, misses)
    # From the budget simulate names on, generation re-reads nothing. Loading
    # read the whole file first (MAP_POPULATE), so at most the file plus anon.
    fit = doc["fit_budget_bytes"]
    assert fit <= models["moe"].stat().st_size + doc["anon_bytes"] + doc["page_bytes"]
    at_fit = simulate(ttrace, moe_trace, "--budgets", str(fit), "--json", "--readahead", "0")
    assert all(r["misses"] == 0 for r in json.loads(at_fit.stdout)["rows"] if r["policy"] != "2q")
    # The two-list model reclaims 32 pages at a time (SWAP_CLUSTER_MAX), as
    # the kernel does: loading leaves up to 31 pages fewer cached.
    cluster = 32 * doc["page_bytes"]
    two_fit = simulate(ttrace, moe_trace, "--budgets", str(fit + cluster), "--policy", "2q", "--json", "--readahead", "0")
    assert json.loads(two_fit.stdout)["rows"][0]["misses"] == 0
    below = simulate(ttrace, moe_trace, "--budgets", str(fit - doc["page_bytes"]), "--policy", "lru", "--json",
                     "--readahead", "0")
    assert json.loads(below.stdout)["rows"][0]["misses"] > 0
    # The kernel's readahead, recorded in the trace, is the default: with
    # the whole file cached, it reads nothing either.
    recorded = json.loads(simulate(ttrace, moe_trace, "--budgets", str(fit), "--json").stdout)
    assert recorded["readahead"]["window_bytes"] > 0 and "recorded" in recorded["readahead_source"]
    whole = models["moe"].stat().st_size + doc["anon_bytes"] + doc["page_bytes"]
    recorded = json.loads(simulate(ttrace, moe_trace, "--budgets", str(whole), "--json").stdout)
    assert all(r["misses"] == 0 for r in recorded["rows"])

    with open(tmp_path / "c.csv") as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:5] == ["budget_bytes", "policy", "disk_bytes", "disk_bytes_per_token", "misses"]
    assert {(int(r["budget_bytes"]), r["policy"]): int(r["misses"]) for r in table} == \
        {k: r["misses"] for k, r in rows.items()}
    svg = ET.parse(tmp_path / "c.svg").getroot()
    assert svg.tag.endswith("svg") and "lru" in ET.tostring(svg, encoding="unicode")

    text = simulate(ttrace, moe_trace, "--budgets", "16M,32M")
    assert text.returncode == 0 and "smallest budget at which generation reads nothing" in text.stdout


def test_readahead_reads_more_and_an_expert_permutation_changes_what_is_read(ttrace, moe_trace, tmp_path):
    base = json.loads(simulate(ttrace, moe_trace, "--budgets", "16M", "--policy", "lru", "--json",
                               "--readahead", "0").stdout)
    assert base["readahead"] is None
    ahead = json.loads(simulate(ttrace, moe_trace, "--budgets", "16M", "--policy", "lru", "--readahead", "128K",
                                "--json").stdout)
    assert ahead["readahead"]["window_bytes"] == 128 << 10
    assert ahead["rows"][0]["misses"] >= base["rows"][0]["misses"]
    # The identity permutation changes nothing; reversing every layer's
    # experts moves the routed slices, so the same budget reads differently.
    n_layers, n_expert = 4, 8
    same = tmp_path / "identity.json"
    same.write_text(json.dumps([list(range(n_expert))] * n_layers))
    flip = tmp_path / "reverse.json"
    flip.write_text(json.dumps([list(reversed(range(n_expert)))] * n_layers))
    ident = json.loads(simulate(ttrace, moe_trace, "--budgets", "16M", "--policy", "lru", "--layout", same,
                                "--json", "--readahead", "0").stdout)
    assert ident["rows"] == base["rows"]
    moved = simulate(ttrace, moe_trace, "--budgets", "16M", "--policy", "lru", "--layout", flip, "--json")
    assert moved.returncode == 0, moved.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([list(range(3))] * n_layers))
    bad = simulate(ttrace, moe_trace, "--budgets", "16M", "--layout", wrong)
    assert bad.returncode != 0 and "experts" in bad.stderr, bad.stderr


@pytest.mark.parametrize("readahead", [None, "128K", "1M"])
def test_the_run_replay_equals_the_page_by_page_replay(ttrace, moe_trace, readahead):
    """The default engine replays the fault path run by run; `--engine pages`
    is the straightforward page-by-page replay. On a real trace, with the
    recorded 16 MiB window and smaller ones (more windows, marks and
    evictions), at budgets from a thrashing cache to one holding the file,
    every figure is the same."""
    args = ["--budget-range", "8M..40M/9", "--policy", "lru", "--anon", "0", "--phase", "all", "--json"]
    if readahead:
        args += ["--readahead", readahead]
    runs = simulate(ttrace, moe_trace, *args)
    pages = simulate(ttrace, moe_trace, *args, "--engine", "pages")
    assert runs.returncode == 0 and pages.returncode == 0, runs.stderr + pages.stderr
    fast, slow = json.loads(runs.stdout), json.loads(pages.stdout)
    assert fast["readahead"] is not None, "the trace recorded its readahead"
    assert fast["rows"] == slow["rows"]
    # Not trivially equal: the budgets read different amounts.
    assert len({r["misses"] for r in fast["rows"]}) >= 3


@pytest.mark.parametrize("args,message", [
    (["--budgets", "12Q"], "unknown unit"),
    (["--budget-range", "1G..64M"], "FROM must be below TO"),
    (["--page", "3000"], "power of two"),
    (["--readahead", "5K"], "multiple of --page"),
    (["--policy", "fifo"], "invalid value"),
    (["--detail", "0"], "above zero"),
    (["--detail", "12Q"], "unknown unit"),
    (["--tokens", "0"], "at least one generated token"),
    (["--tokens", "some"], "expected a number of generated tokens"),
])
def test_bad_arguments_are_one_clear_error(ttrace, moe_trace, args, message):
    proc = simulate(ttrace, moe_trace, *args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "panicked" not in proc.stderr


def test_a_token_window_replays_what_a_shorter_run_of_the_same_text_read(
        ttrace, moe_trace, tmp_path, llama_completion, models, flush_log_preload):
    """`--tokens N` replays the trace up to its N-th generated token: the
    same rows as the whole trace of a run that generated only those tokens
    (greedy, so the same tokens, routing and reads), recorded separately."""
    short = trace_moe(ttrace, tmp_path / "short.data", llama_completion, models, flush_log_preload, 5)
    common = ["--json", "--anon", "4M", "--budgets", "8M,16M,24M,32M"]
    whole = json.loads(simulate(ttrace, short, *common, "--tokens", "all").stdout)
    assert whole["generated_tokens"] == 4 and "window" not in whole
    proc = simulate(ttrace, moe_trace, *common, "--tokens", "4")
    assert proc.returncode == 0, proc.stderr
    cut = json.loads(proc.stdout)
    assert cut["generated_tokens"] == 4
    assert cut["window"]["tokens"] == 4 and cut["window"]["trace_tokens"] == 11
    for key in ("rows", "footprint_bytes", "fit_budget_bytes", "first_read_bytes", "readahead"):
        assert cut[key] == whole[key], key
    assert any(r["misses"] for r in cut["rows"])
    text = simulate(ttrace, moe_trace, "--tokens", "4").stdout
    assert "the first 4 of 11 generated tokens replayed (--tokens all replays every one)" in text
    # A window as long as the run, or the default on a short trace, is the whole trace.
    for tokens in (["--tokens", "11"], ["--tokens", "1000"], []):
        doc = json.loads(simulate(ttrace, moe_trace, *common, *tokens).stdout)
        assert "window" not in doc and doc["generated_tokens"] == 11, tokens


def test_missing_and_malformed_traces_are_refused(ttrace, tmp_path):
    proc = simulate(ttrace, tmp_path / "none.data")
    assert proc.returncode != 0 and "none.data" in proc.stderr
    junk = tmp_path / "junk.data"
    junk.write_bytes(b"not a trace" * 100)
    proc = simulate(ttrace, junk)
    assert proc.returncode != 0 and "junk.data" in proc.stderr and "panicked" not in proc.stderr


def test_html_report_shows_the_curve_simulate_prints(ttrace, moe_trace, tmp_path):
    """`ttrace report --html` draws `ttrace simulate`'s default curve: its
    table, rendered by Chromium, holds the figures `simulate --json` prints,
    up to the budget that reads nothing, which it names."""
    want = json.loads(simulate(ttrace, moe_trace, "--json").stdout)
    html = tmp_path / "report.html"
    subprocess.run([ttrace, "report", moe_trace, "--html", html], capture_output=True, check=True)
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([shutil.which("chromium") or "chromium", *flags, "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert 'data-rendered="ok"' in dom.stdout
    assert "CONSOLE" not in dom.stderr, [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    cells = re.findall(r'<td data-budget="(\d+)" data-policy="([a-z0-9]+)" data-misses="(\d+)" '
                       r'data-disk-bytes="(\d+)">', dom.stdout)
    assert sorted((int(b), p, int(m), int(d)) for b, p, m, d in cells) == \
        sorted((r["budget_bytes"], r["policy"], r["misses"], r["disk_bytes"]) for r in want["rows"])
    assert f'data-simulate-rows="{len(want["rows"])}"' in dom.stdout
    fit = want["fit_budget_bytes"]
    assert f'id="simulate-fit" data-bytes="{fit}"' in dom.stdout
    # The default budgets reach the one where generation reads nothing.
    top = max(r["budget_bytes"] for r in want["rows"])
    assert fit <= top and all(r["misses"] == 0 for r in want["rows"] if r["budget_bytes"] == top)


@pytest.mark.parametrize("args", [["--readahead", "0"], [], ["--engine", "pages", "--policy", "lru"], ["--layout"]],
                         ids=["demand-paging", "recorded-readahead", "page-engine", "reversed-layout"])
def test_detail_charges_every_byte_read_to_tensors_layers_and_experts(ttrace, moe_trace, models, tmp_path, args):
    """`--detail`: at its budget (added to those replayed), each policy's
    disk bytes split by tensor (named as the GGUF file has them), one
    entry for the bytes outside every tensor, by layer and by expert slot:
    each split sums to the row, experts to the expert tensors."""
    n_expert = 8
    if args == ["--layout"]:
        flip = tmp_path / "reverse.json"
        flip.write_text(json.dumps([list(reversed(range(n_expert)))] * 4))
        args = ["--layout", str(flip)]
    proc = simulate(ttrace, moe_trace, "--budgets", "12M,24M", "--detail", "16M", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    detail = doc["detail"]
    assert detail["budget_bytes"] == 16 * MIB
    assert sorted({r["budget_bytes"] for r in doc["rows"]}) == [12 * MIB, 16 * MIB, 24 * MIB]
    rows = {r["policy"]: r for r in doc["rows"] if r["budget_bytes"] == 16 * MIB}
    assert [p["policy"] for p in detail["policies"]] == list(rows)
    gguf_tensors = {t.name: t for t in gguf.GGUFReader(models["moe"]).tensors}
    for p in detail["policies"]:
        row = rows[p["policy"]]
        assert p["disk_bytes"] == row["disk_bytes"] > 0, p["policy"]
        tensors = p["tensors"]
        assert sum(t["disk_bytes"] for t in tensors) == row["disk_bytes"]
        outside = [t for t in tensors if t["name"] is None]
        assert len(outside) == 1 and outside[0]["tensor"] is None and outside[0]["layer"] is None
        for t in tensors:
            if t["name"] is not None:
                g = gguf_tensors[t["name"]]
                assert (t["file_offset"], t["size_bytes"]) == (int(g.data_offset), int(g.n_bytes)), t["name"]
            assert 0 < t["disk_bytes"] or t is outside[0]
            assert t["disk_bytes_per_token"] == pytest.approx(t["disk_bytes"] / doc["generated_tokens"])
        by_layer = collections.Counter()
        for t in tensors:
            by_layer[t["layer"]] += t["disk_bytes"]
        assert {x["layer"]: x["disk_bytes"] for x in p["layers"]} == dict(by_layer)
        # Experts: the expert tensors' bytes, per layer, split by slot.
        expert_tensors, experts = collections.Counter(), collections.Counter()
        for t in tensors:
            if t["component"] and t["component"].endswith("_exps"):
                expert_tensors[t["layer"]] += t["disk_bytes"]
        for e in p["experts"]:
            assert 0 <= e["position"] < n_expert
            flipped = "--layout" in args
            assert e["expert"] == (n_expert - 1 - e["position"] if flipped else e["position"])
            experts[e["layer"]] += e["disk_bytes"]
        assert experts == expert_tensors and sum(experts.values()) > 0, p["policy"]
    # The text table: the tensor read the most under any policy is on it.
    text = simulate(ttrace, moe_trace, "--budgets", "12M,24M", "--detail", "16M", *args)
    assert text.returncode == 0, text.stderr
    assert "where the reads go at 16.0 MiB" in text.stdout, text.stdout
    first = max((t for p in detail["policies"] for t in p["tensors"]), key=lambda t: t["disk_bytes"])
    assert (first["name"] or "(outside tensors)") in text.stdout.split("where the reads go")[1]
