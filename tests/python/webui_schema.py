"""What the thesis web UI (github.com/ErsjanKeri/BSC, tensor-tracing/webui)
loads, written down from its src/types/data.ts and from where its store
fetches the files (src/stores/useAppStore.ts), as checks for a
`ttrace export --format tokens-json` directory. Nothing here is the UI's
code: the specs restate its declared types, field by field.

Types: `str`, `int`, `NUM` (int or float), `Null(x)` (x or null),
`Array(x)`, `Enum(...)` (one of the listed strings), `Obj(required,
optional)`: an object with those fields; fields beyond them (ttrace's own)
are allowed, as the UI ignores what it does not declare.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Of:
    """A spec wrapping another: `how` is "null" (it, or null) or "array"."""
    how: str
    inner: object


def Null(inner) -> Of:
    return Of("null", inner)


def Array(inner) -> Of:
    return Of("array", inner)


class Enum(tuple):
    """One of these strings."""


@dataclass(frozen=True)
class Obj:
    required: dict
    optional: dict = field(default_factory=dict)


NUM = "number"

# -- graphs/token-NNNNN.json (GraphData) -----------------------------------
# Node colours are keyed by these categories; anything else falls to grey.
GRAPH_CATEGORIES = Enum(("input", "attention", "ffn", "norm", "output", "other"))
GRAPH_NODE = Obj({
    "id": str, "address": str, "label": str, "operation": str, "shape": Array(int), "dtype": str,
    "layer_id": Null(int), "category": GRAPH_CATEGORIES,
})
GRAPH_EDGE = Obj({"source": str, "target": str, "label": str})
GRAPH_METADATA = Obj({"total_nodes": int, "total_edges": int, "layers": int, "timestamp_generated": Null(str)})
GRAPH = Obj({"token_id": Null(int), "metadata": GRAPH_METADATA, "nodes": Array(GRAPH_NODE), "edges": Array(GRAPH_EDGE)})

# -- traces/token-NNNNN.json (TraceData) -----------------------------------
SOURCE = Obj(
    {"name": str, "tensor_ptr": str, "size_bytes": int, "layer_id": Null(int),
     "memory_source": Enum(("DISK", "BUFFER"))},
    # The UI prints these in hex when present, so present means a number.
    {"disk_offset": int, "buffer_id": int, "tensor_idx": Null(int)},
)
ENTRY = Obj(
    {"entry_id": int, "timestamp_ns": int, "timestamp_relative_ms": NUM, "token_id": int, "layer_id": Null(int),
     "thread_id": int, "phase": str, "operation_type": str, "dst_name": str, "num_sources": int,
     "sources": Array(SOURCE)},
    # Not in data.ts, but the heatmap reads them (the routed experts, best first).
    {"expert_ids": Array(int), "num_experts": int},
)
TRACE_METADATA = Obj({"total_entries": int, "duration_ms": NUM, "timestamp_start_ns": int, "format_version": str})
TRACE = Obj({"token_id": Null(int), "metadata": TRACE_METADATA, "entries": Array(ENTRY)})

# -- memory-map.json (MemoryMap) -------------------------------------------
MEMORY_CATEGORIES = Enum(("embedding", "attention", "ffn", "norm", "output", "other"))
MEMORY_TENSOR = Obj(
    {"name": str, "offset_start": int, "offset_end": int, "size_bytes": int, "shape": Array(int), "dtype": str,
     "category": MEMORY_CATEGORIES, "layer_id": Null(int), "component_type": str, "component": str},
    # The heatmap's tooltip shows it for one expert's slice.
    {"expert_id": int},
)
MEMORY_MAP = Obj({
    "model_name": str, "total_size_bytes": int,
    "metadata": Obj({"n_layers": int, "n_vocab": int, "n_embd": int}, {"n_heads": int}),
    "tensors": Array(MEMORY_TENSOR),
})

# -- buffer-timeline.json (BufferTimeline), optional ------------------------
BUFFER_TIMELINE = Obj({
    "metadata": Obj({"total_events": int, "total_buffers": int, "peak_occupancy_bytes": int,
                     "peak_occupancy_mb": NUM, "duration_ms": NUM, "usage_breakdown": dict}),
    "buffers": Array(Obj({"id": int, "name": str, "size": int, "backend": str, "usage": int, "usage_name": str,
                         "layer": int, "alloc_time_ms": NUM, "dealloc_time_ms": Null(NUM)})),
    "timeline": Array(Obj({"timestamp_ms": NUM, "event": Enum(("alloc", "dealloc")), "buffer_id": int,
                          "buffer_name": str, "size": int, "cumulative_size": int, "num_active_buffers": int})),
})


def check(value, spec, where: str = "$") -> None:
    """Raise AssertionError naming the JSON path where `value` breaks `spec`."""
    if isinstance(spec, Of) and spec.how == "null":
        if value is not None:
            check(value, spec.inner, where)
    elif isinstance(spec, Of):
        assert isinstance(value, list), f"{where}: expected an array, got {value!r:.80}"
        for i, v in enumerate(value):
            check(v, spec.inner, f"{where}[{i}]")
    elif isinstance(spec, Enum):
        assert value in spec, f"{where}: {value!r} is not one of {tuple(spec)}"
    elif isinstance(spec, Obj):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r:.80}"
        for k, s in spec.required.items():
            assert k in value, f"{where}: missing field {k!r}"
            check(value[k], s, f"{where}.{k}")
        for k, s in spec.optional.items():
            if k in value:
                check(value[k], s, f"{where}.{k}")
    elif spec is NUM:
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: expected a number: {value!r}"
    elif spec is int:
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: expected an integer: {value!r}"
    else:
        assert isinstance(value, spec), f"{where}: expected {spec.__name__}, got {value!r:.80}"


STEM = re.compile(r"(token|prompt)-(\d{5})\.json")
EXPERT_NAME = re.compile(r"(.+_exps\.weight)\[(\d+)\]")


def check_export(out: Path) -> dict:
    """Every file of a tokens-json directory against the specs above, and the
    directory layout the UI fetches from: memory-map.json, graphs/ and
    traces/ holding the same token-NNNNN.json (numbered from 0, no gaps) and
    prompt-NNNNN.json, buffer-timeline.json only if valid. Returns the parsed
    files: {"memory_map": ..., "traces": {stem: doc}, "graphs": {stem: doc}}."""
    top = {p.name for p in out.iterdir()}
    assert top <= {"memory-map.json", "buffer-timeline.json", "traces", "graphs"}, top
    assert {"memory-map.json", "traces", "graphs"} <= top, top
    mm = json.loads((out / "memory-map.json").read_text())
    check(mm, MEMORY_MAP, "memory-map.json")
    check_memory_map(mm)
    timeline = None
    if (out / "buffer-timeline.json").exists():
        timeline = json.loads((out / "buffer-timeline.json").read_text())
        check(timeline, BUFFER_TIMELINE, "buffer-timeline.json")
        check_buffer_timeline(timeline)

    docs = {}
    for sub, spec in (("traces", TRACE), ("graphs", GRAPH)):
        names = sorted(p.name for p in (out / sub).iterdir())
        assert all(STEM.fullmatch(n) for n in names), names
        for kind in ("token", "prompt"):
            numbers = [int(STEM.fullmatch(n)[2]) for n in names if n.startswith(kind)]
            assert numbers == list(range(len(numbers))), f"{sub}/{kind}-*: {numbers}"
        docs[sub] = {}
        for n in names:
            doc = json.loads((out / sub / n).read_text())
            check(doc, spec, f"{sub}/{n}")
            docs[sub][n] = doc
    assert docs["traces"].keys() == docs["graphs"].keys(), "a graph for every trace file and no other"
    assert "token-00000.json" in docs["traces"], "the UI opens token 0 first"
    for n, doc in docs["traces"].items():
        check_trace(n, doc)
    for n, doc in docs["graphs"].items():
        check_graph(n, doc, docs["traces"][n])
    return {"memory_map": mm, "buffer_timeline": timeline, **docs}


def check_buffer_timeline(t: dict) -> None:
    """What the UI's buffer list shows adds up: one alloc per buffer and a
    dealloc per freed one, in time order, the running totals and the
    metadata's counts and peak as the events give them."""
    buffers = {b["id"]: b for b in t["buffers"]}
    assert len(buffers) == len(t["buffers"]) == t["metadata"]["total_buffers"]
    assert len(t["timeline"]) == t["metadata"]["total_events"]
    assert all(b["size"] > 0 for b in buffers.values())
    total = active = peak = 0
    allocs = set()
    for e in t["timeline"]:
        b = buffers[e["buffer_id"]]
        assert e["size"] == b["size"] and e["buffer_name"] == b["name"], e
        if e["event"] == "alloc":
            assert e["buffer_id"] not in allocs and e["timestamp_ms"] == b["alloc_time_ms"], e
            allocs.add(e["buffer_id"])
            total, active = total + b["size"], active + 1
        else:
            assert e["buffer_id"] in allocs and e["timestamp_ms"] == b["dealloc_time_ms"], e
            total, active = total - b["size"], active - 1
        peak = max(peak, total)
        assert (e["cumulative_size"], e["num_active_buffers"]) == (total, active), e
    assert allocs == set(buffers)
    assert [e["timestamp_ms"] for e in t["timeline"]] == sorted(e["timestamp_ms"] for e in t["timeline"])
    assert t["metadata"]["peak_occupancy_bytes"] == peak
    assert sum(t["metadata"]["usage_breakdown"].values()) == len(buffers)


def check_memory_map(mm: dict) -> None:
    """Offsets as the heatmap draws them; expert slices named NAME[E] with E
    their expert_id."""
    for t in mm["tensors"]:
        assert t["offset_end"] == t["offset_start"] + t["size_bytes"], t["name"]
        assert t["offset_end"] <= mm["total_size_bytes"], t["name"]
        m = EXPERT_NAME.fullmatch(t["name"])
        assert bool(m) == ("expert_id" in t), t["name"]
        if m:
            assert int(m[2]) == t["expert_id"], t["name"]
    assert mm["metadata"]["n_layers"] > 0 and mm["metadata"]["n_embd"] > 0 and mm["metadata"]["n_vocab"] > 0


def check_trace(name: str, doc: dict) -> None:
    entries = doc["entries"]
    assert doc["metadata"]["total_entries"] == len(entries) > 0, name
    assert [e["entry_id"] for e in entries] == list(range(len(entries))), name
    # Relative to the first entry: the UI's timeline starts there.
    assert min(e["timestamp_relative_ms"] for e in entries) == 0, name
    for e in entries:
        assert e["num_sources"] == len(e["sources"]), (name, e["entry_id"])
        if "expert_ids" in e:
            assert e["num_experts"] == len(e["expert_ids"]) > 0, (name, e["entry_id"])
        for s in e["sources"]:
            assert re.fullmatch(r"0x[0-9a-f]+", s["tensor_ptr"]), s
            if s["memory_source"] == "BUFFER":
                assert "disk_offset" not in s, s


def check_graph(name: str, graph: dict, trace: dict) -> None:
    """Node ids unique, edges between nodes that exist, one edge per pair (the
    UI names an edge source-target), and every op of the trace drawn."""
    nodes, edges = graph["nodes"], graph["edges"]
    ids = [n["id"] for n in nodes]
    assert len(set(ids)) == len(ids), name
    assert graph["metadata"]["total_nodes"] == len(nodes) > 0 and graph["metadata"]["total_edges"] == len(edges), name
    layers = [n["layer_id"] for n in nodes if n["layer_id"] is not None]
    assert graph["metadata"]["layers"] == (max(layers) + 1 if layers else 0), name
    known = set(ids)
    assert all(e["source"] in known and e["target"] in known for e in edges), name
    pairs = [(e["source"], e["target"]) for e in edges]
    assert len(set(pairs)) == len(pairs), f"{name}: an edge id would repeat"
    assert all(re.fullmatch(r"src \d+", e["label"]) for e in edges), name
    assert all(re.fullmatch(r"0x[0-9a-f]+", n["address"]) for n in nodes), name
    labels = {n["label"] for n in nodes}
    assert {e["dst_name"] for e in trace["entries"]} <= labels, name
    assert graph["token_id"] == trace["token_id"], name
