"""The graph probe sends a source tensor (a weight, the KV cache) whole only
when its `ggml_tensor` bytes differ from the last record its thread sent for
that address; otherwise the node's record marks it cached and user space
fills it in. The trace must be what it was when every graph sent every
source whole. Needs root: the traces are recorded here.

llama-server under four concurrent clients builds a new graph for every
ubatch: its first graph (the warm-up) is read with an empty cache, every
later one from the cache. Each op's sources (names, and whether the weights
are read from the file or a copy) must equal those of the op of the same
name in the warm-up graph, and each ubatch must read the warm-up's layer
weights. A tensor struct whose address is reused (a model freed and another
loaded) differs in its bytes, so it is sent whole again: the graph
assembler's unit test covers that
(`a_cached_source_is_the_last_one_its_thread_sent_for_that_address`).
"""
from __future__ import annotations

import collections
import re

from test_exports import jsonl_rows
from test_sequences import PROMPTS, record_server, report

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
    trace = tmp_path / "srv.data"
    responses = record_server(ttrace, trace, paths, models, waves=2)
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

