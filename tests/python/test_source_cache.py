"""The graph probe sends a source tensor (a weight, the KV cache) whole only
when its `ggml_tensor` bytes differ from the last record its thread sent for
that address; otherwise the node's record marks it cached and user space
fills it in. The trace must be what it was when every graph sent every
source whole. Needs root: the traces are recorded here.

- llama-server under four concurrent clients builds a new graph for every
  ubatch: its first graph (the warm-up) is read with an empty cache, every
  later one from the cache. Each op's sources (names, and whether the weights
  are read from the file or a copy) must equal those of the op of the same
  name in the warm-up graph, and each ubatch must read the warm-up's layer
  weights.
- A process that frees a model and loads another with the same architecture
  gets tensor structs at addresses the first model's used (malloc reuses
  them) with other types and data pointers: every weight its later graphs
  read must be the second model's.
"""
from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import textwrap

from test_exports import jsonl_rows
from test_sequences import PROMPTS, free_port, report, serve, server_argv

LAYER_MATRIX = re.compile(r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight$")


def op_sources(rows: list[dict], ubatches: set[int]) -> dict[tuple, set]:
    """(op, dst) → the distinct (srcs, weights from the file, from copies) of its ops in `ubatches`."""
    got = collections.defaultdict(set)
    for r in rows:
        if r["kind"] == "op" and r["ubatch"] in ubatches:
            got[(r["name"], r["dst"])].add((r["srcs"], r["weights_file"], r["weights_copy"]))
    return got


def weight_names(a: dict, ubatch: dict) -> set[str]:
    return {a["models"][w["model"]]["tensors"][w["tensor"]]["name"] for w in ubatch["weights"]}


def test_served_graphs_read_from_the_cache_equal_the_first_read_whole(ttrace, tmp_path, paths, models):
    port = free_port()
    trace = tmp_path / "srv.data"
    proc = subprocess.Popen([ttrace, "run", "-o", trace, "--", *server_argv(paths, models, port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        responses = serve(port)
        responses += serve(port)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: ttrace stops the server and writes the trace
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert len(responses) == 2 * len(PROMPTS)
    a = report(ttrace, trace)
    assert a["lost"] == {} or not any(a["lost"].values()), a["lost"]
    warmup = [u for u in a["ubatches"] if u["phase"] == "warmup"]
    later = [u for u in a["ubatches"] if u["phase"] != "warmup"]
    assert len(warmup) == 1 and warmup[0]["index"] == 0, [u["phase"] for u in a["ubatches"][:3]]
    # Four clients at once: ubatches of several sequences, each a new graph.
    assert any(len({t["seq"] for t in u["tokens"]}) > 1 for u in later)

    rows = jsonl_rows(ttrace, trace, tmp_path / "t.jsonl")
    first = op_sources(rows, {warmup[0]["index"]})
    rest = op_sources(rows, {u["index"] for u in later})
    weighted = [k for k, v in first.items() if any(f + c for _, f, c in v)]
    assert len(weighted) > 100, "the warm-up graph's ops read the model's weights"
    for key, sources in rest.items():
        if key in first:
            assert sources <= first[key], (key, sources, first[key])
    assert all(k in rest for k in weighted), [k for k in weighted if k not in rest][:5]

    matrices = {n for n in weight_names(a, warmup[0]) if LAYER_MATRIX.match(n)}
    assert len(matrices) >= 7 * 18, sorted(matrices)[:5]
    for u in later:
        names = weight_names(a, u)
        assert matrices <= names, (u["index"], sorted(matrices - names)[:5])
        assert names <= weight_names(a, warmup[0]) | {"output.weight"}, (u["index"], names)


RELOAD = textwrap.dedent("""
    import gc, sys
    import llama_cpp
    for path in sys.argv[1:]:
        llm = llama_cpp.Llama(model_path=path, n_ctx=128, n_threads=2, seed=1, verbose=False)
        llm.create_completion("hello world", max_tokens=4, temperature=0)
        llm.close()
        del llm
        gc.collect()
""")


def test_a_model_loaded_where_a_freed_one_was_resolves_to_its_own_tensors(ttrace, tmp_path, models):
    script = tmp_path / "reload.py"
    script.write_text(RELOAD)
    trace = tmp_path / "reload.data"
    first, second = models["tiny"], models["tiny-q8"]
    out = subprocess.run([ttrace, "run", "-o", trace, "--", sys.executable, script, first, second, first],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    a = report(ttrace, trace)
    files = [m["files"][0] for m in a["models"]]
    assert sorted(files) == sorted({str(first), str(second)}), files
    # Every ubatch reads weights of one model, the one loaded then: a stale
    # record would name the freed model's mapping (or none).
    by_ubatch = [{files[w["model"]] for w in u["weights"]} for u in a["ubatches"]]
    assert all(len(m) == 1 for m in by_ubatch), by_ubatch
    order = [next(iter(m)) for m in by_ubatch]
    runs = [f for i, f in enumerate(order) if i == 0 or order[i - 1] != f]
    assert runs == [str(first), str(second), str(first)], runs
