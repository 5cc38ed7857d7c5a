"""`ttrace export` and `ttrace report --html` on real llama.cpp traces, read
back by the tools users open them with: the official Perfetto protobuf
bindings (PyPI `perfetto`), pyarrow, the csv/json modules, the PyPI `gguf`
reader for offsets, and headless Chromium for the HTML page. Every figure
is checked against `ttrace report --json` of the same trace. Needs root:
the traces are recorded here."""
from __future__ import annotations

import collections
import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import gguf
import pyarrow.parquet as pq
import pytest
import webui_schema
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
# The documented row schema (tracer-user/src/export/rows.rs), in order.
COLUMNS = [
    "seq", "kind", "ts_ns", "rel_ns", "dur_ns", "tid", "ubatch", "phase", "token_index", "name", "layer", "dst",
    "dst_memory", "srcs", "n_srcs", "weights_file", "weights_copy", "weight_bytes", "ith", "nth", "address", "ip",
    "error_code", "fault_tensor", "file_offset", "op_seq", "dev", "sector", "io_bytes", "rwbs", "seq_ids", "positions",
]
UNSIGNED = {"seq": "uint64", "ts_ns": "uint64", "tid": "uint32", "weight_bytes": "uint64", "ubatch": "uint32"}
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--enable-logging=stderr", "--v=0",
]


def record(ttrace, out: Path, llama_completion, model: Path, preload: Path, extra=()) -> Path:
    argv = [ttrace, "run", "-o", out, *extra, "--", llama_completion, "-m", model, "-p", "hello world", "-n", "8",
            "-no-cnv", "--ignore-eos", "-t", "2", "--seed", "1"]
    env = dict(os.environ, LD_PRELOAD=str(preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module", params=["tiny", "tiny-q4-all-threads"])
def trace(request, ttrace, tmp_path_factory, llama_completion, models, flush_log_preload):
    """(trace path, report --json) of a small run: plain, and with repacked
    copies and one record per worker thread."""
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "tiny":
        path = record(ttrace, d / "t.data", llama_completion, models["tiny"], flush_log_preload)
    else:
        path = record(ttrace, d / "t.data", llama_completion, models["tiny-q4"], flush_log_preload, ["--all-threads"])
    a = json.loads(subprocess.run([ttrace, "report", path, "--json"], capture_output=True, text=True, check=True).stdout)
    assert a["lost"] == {k: 0 for k in a["lost"]}, "events were lost; the checks below would be unfair"
    return path, a


def export(ttrace, trace: Path, fmt: str, out: Path, *extra) -> Path:
    proc = subprocess.run([ttrace, "export", trace, "--format", fmt, "-o", out, *extra], capture_output=True, text=True)
    assert proc.returncode == 0, f"export {fmt} failed:\n{proc.stderr}"
    return out


def gguf_offsets(path: Path) -> dict[str, tuple[int, int]]:
    r = gguf.GGUFReader(path)
    return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in r.tensors}


def expected_rows(a: dict):
    ops_per_ubatch = {u["index"]: u["ops"] for u in a["ubatches"]}
    file_backed = sum(w["file_backed"] for u in a["ubatches"] for w in u["weights"])
    copies = sum(w["copy"] for u in a["ubatches"] for w in u["weights"])
    return ops_per_ubatch, file_backed, copies


def check_rows(rows: list[dict], a: dict):
    """Rows (any format, values as Python ints/str/None) against the report."""
    kinds = collections.Counter(r["kind"] for r in rows)
    assert kinds["op"] == a["ops"] and kinds["fault"] == a["faults"]
    ops_per_ubatch, file_backed, copies = expected_rows(a)
    got = collections.Counter(r["ubatch"] for r in rows if r["kind"] == "op" and r["ubatch"] is not None)
    assert dict(got) == {k: v for k, v in ops_per_ubatch.items() if v}
    in_graph = [r for r in rows if r["kind"] == "op" and r["ubatch"] is not None]
    assert sum(r["weights_file"] for r in in_graph) == file_backed
    assert sum(r["weights_copy"] for r in in_graph) == copies
    phases = {u["index"]: u["phase"] for u in a["ubatches"]}
    assert all(r["phase"] == phases[r["ubatch"]] for r in in_graph)
    ops = collections.Counter(r["name"] for r in rows if r["kind"] == "op")
    assert dict(ops) == a["op_counts"]
    assert sorted(r["seq"] for r in rows) == list(range(len(rows))), "seq numbers every row once"


def test_jsonl_csv_parquet_match_report(ttrace, trace, tmp_path):
    path, a = trace
    jsonl = [json.loads(line) for line in export(ttrace, path, "jsonl", tmp_path / "e.jsonl").read_text().splitlines()]
    assert all(list(r) == COLUMNS for r in jsonl)
    check_rows(jsonl, a)

    with export(ttrace, path, "csv", tmp_path / "e.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        ints = {"seq", "ubatch", "weights_file", "weights_copy", "weight_bytes"}
        rows = [{k: (int(v) if k in ints and v != "" else (None if v == "" else v)) for k, v in r.items()} for r in reader]
    check_rows(rows, a)
    assert len(rows) == len(jsonl)

    table = pq.read_table(export(ttrace, path, "parquet", tmp_path / "e.parquet"))
    assert table.column_names == COLUMNS
    for name, ty in UNSIGNED.items():
        assert str(table.schema.field(name).type) == ty, name
    check_rows(table.to_pylist(), a)
    assert table.num_rows == len(jsonl)
    assert sum(table.column("weight_bytes").to_pylist()) == sum(r["weight_bytes"] for r in jsonl)


HEX = re.compile(r"0x[0-9a-f]+")
LAYER_NAME = re.compile(r"blk\.(\d+)\.")


def gguf_layer(name: str):
    m = LAYER_NAME.match(name)
    return int(m.group(1)) if m else None


def jsonl_rows(ttrace, path: Path, out: Path) -> list[dict]:
    return [json.loads(line) for line in export(ttrace, path, "jsonl", out).read_text().splitlines()]


TRACE_CLOCK = pb.BuiltinClock.BUILTIN_CLOCK_BOOTTIME


def packet_times(t) -> list:
    """Each packet's time on the trace clock (None when it has none), as
    trace_packet.proto and clock_snapshot.proto define `timestamp`: on the
    packet's `timestamp_clock_id`, else its sequence's TracePacketDefaults
    clock, else the trace clock; on a clock a ClockSnapshot marks
    `is_incremental`, a delta from the sequence's previous timestamp on that
    clock (the first one from the snapshot's), which the snapshot ties to the
    trace clock."""
    defaults, last, offset, times = {}, {}, {}, []
    for p in t.packet:
        seq = p.trusted_packet_sequence_id
        ts = None
        if p.HasField("timestamp"):
            clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else defaults.get(seq, TRACE_CLOCK)
            if (seq, clock) in last:
                last[seq, clock] += p.timestamp
                ts = last[seq, clock] + offset[seq, clock]
            else:
                assert clock == TRACE_CLOCK, f"clock {clock} is not defined on sequence {seq}"
                ts = p.timestamp
        times.append(ts)
        if p.HasField("trace_packet_defaults"):
            defaults[seq] = p.trace_packet_defaults.timestamp_clock_id
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            for c in clocks.values():
                if c.is_incremental:
                    last[seq, c.clock_id] = c.timestamp
                    offset[seq, c.clock_id] = clocks[TRACE_CLOCK].timestamp - c.timestamp
    return times


class Pftrace:
    """A .pftrace decoded with the official bindings: tracks, slices (with
    their decoded debug annotations) and counter values."""

    def __init__(self, data: bytes):
        t = pb.Trace()
        t.ParseFromString(data)
        self.tracks, self.parents = {}, {}
        names, arg_names, strings = {}, {}, {}
        self.begins, self.ends = collections.Counter(), collections.Counter()
        self.slice_names = collections.defaultdict(list)
        # Per track: (ts, name, args) of each slice begin.
        self.slices = collections.defaultdict(list)
        self.counters = collections.defaultdict(list)
        self.counter_points = collections.defaultdict(list)
        for p, ts in zip(t.packet, packet_times(t)):
            assert p.trusted_packet_sequence_id == 1
            for n in p.interned_data.event_names:
                assert names.setdefault(n.iid, n.name) == n.name, "an interned id is redefined"
            for n in p.interned_data.debug_annotation_names:
                assert arg_names.setdefault(n.iid, n.name) == n.name, "an interned id is redefined"
            for n in p.interned_data.debug_annotation_string_values:
                assert strings.setdefault(n.iid, n.str) == n.str, "an interned id is redefined"
            if p.HasField("track_descriptor"):
                d = p.track_descriptor
                self.tracks[d.uuid] = d.name
                self.parents[d.uuid] = d.parent_uuid
            if p.HasField("track_event"):
                e = p.track_event
                assert e.track_uuid in self.tracks, "events only on described tracks"
                if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                    self.begins[e.track_uuid] += 1
                    name = names[e.name_iid] if e.name_iid else e.name
                    self.slice_names[e.track_uuid].append(name)
                    args = {}
                    for d in e.debug_annotations:
                        key = arg_names[d.name_iid]
                        if d.HasField("string_value_iid"):
                            args[key] = strings[d.string_value_iid].decode()
                        elif d.HasField("uint_value"):
                            args[key] = d.uint_value
                        elif d.HasField("string_value"):
                            args[key] = d.string_value
                        else:
                            args[key] = d.int_value
                    self.slices[e.track_uuid].append((ts, name, args))
                elif e.type == pb.TrackEvent.TYPE_SLICE_END:
                    self.ends[e.track_uuid] += 1
                elif e.type == pb.TrackEvent.TYPE_COUNTER:
                    self.counters[e.track_uuid].append(e.counter_value)
                    self.counter_points[e.track_uuid].append((ts, e.counter_value))
        self.by_name = {v: k for k, v in self.tracks.items()}

    def threads(self) -> dict[int, int]:
        """tid -> track uuid of the `thread N` tracks."""
        return {int(n.split()[1]): u for u, n in self.tracks.items() if n.startswith("thread ")}


def check_op_slices(ttrace, pf, a: dict, path: Path, tmp_path: Path):
    """Per thread one slice per op row (same start), per op name as many as
    the report counts, with the row's tensors, bytes, memory class and layer."""
    begins, slice_names = pf.begins, pf.slice_names
    threads = list(pf.threads().values())
    ops = collections.Counter(n for u in threads for n in slice_names[u] if n != "page_fault")
    assert dict(ops) == a["op_counts"]
    assert sum(begins[u] for u in threads) == a["ops"]

    # Op slice args: dst and src tensor names, weight bytes, dst memory class,
    # layer and ubatch, equal to the op's JSONL row (same thread, same start).
    op_rows = [r for r in jsonl_rows(ttrace, path, tmp_path / "rows.jsonl") if r["kind"] == "op"]
    rows = {(r["tid"], r["ts_ns"]): r for r in op_rows}
    assert len(rows) == len(op_rows) == a["ops"], "(thread, start) names one op"
    (model,) = a["models"]
    reference = {t.name: t for t in gguf.GGUFReader(Path(model["files"][0])).tensors}
    spans = {u["index"]: (u["start_ns"], u["end_ns"]) for u in a["ubatches"]}
    n_ops, matmuls = 0, 0
    for tid, uuid in pf.threads().items():
        for ts, name, args in pf.slices[uuid]:
            r = rows.pop((tid, ts))
            n_ops += 1
            want = {"dst": r["dst"], "srcs": r["srcs"], "weight_bytes": r["weight_bytes"], "memory": r["dst_memory"]}
            want |= {k: r[k] for k in ("layer", "ubatch") if r[k] is not None}
            assert (name, args) == (r["name"], want), (tid, ts)
            assert args["memory"] in ("model_file", "copy", "anon", "other_file", "unmapped")
            if "ubatch" in args:
                start, end = spans[args["ubatch"]]
                assert start <= ts <= end, "an op slice lies inside its ubatch's slice"
            # Independent of ttrace: a matrix product reads its whole weight matrix
            # (the GGUF reader's size) and works on that weight's layer.
            weights = [s for s in args["srcs"].split(";") if s in reference]
            if name == "MUL_MAT" and len(weights) == 1:
                g = reference[weights[0]]
                assert args["weight_bytes"] == int(g.n_bytes), (name, args)
                assert args.get("layer") == gguf_layer(g.name), (name, args)
                matmuls += 1
            if not weights:
                assert args["weight_bytes"] == 0, (name, args)
    assert not rows and n_ops == a["ops"], "one op slice per op row"
    assert matmuls > 0


def test_perfetto_tracks_slices_and_counters(ttrace, trace, tmp_path, models):
    path, a = trace
    pf = Pftrace(export(ttrace, path, "perfetto", tmp_path / "t.pftrace").read_bytes())
    tracks, parents, begins, slice_names, counters, by_name = (
        pf.tracks, pf.parents, pf.begins, pf.slice_names, pf.counters, pf.by_name)
    assert begins == pf.ends, "every slice is closed"

    # Ubatch track: one slice per ubatch, in order, named with its phase.
    ub = slice_names[by_name["ubatches"]]
    assert len(ub) == len(a["ubatches"])
    assert all(f"({u['phase']}" in s for s, u in zip(ub, a["ubatches"]))

    # Thread tracks: op slices with --op-timing; graph capture (the default)
    # does not time ops, so its threads have fault slices only.
    if a["header"]["options"]["op_timing"]:
        check_op_slices(ttrace, pf, a, path, tmp_path)
    else:
        assert not [n for u in pf.threads().values() for n in slice_names[u] if n != "page_fault"]
    (model,) = a["models"]

    # Model group: a track per layer of the model table, slices named by that layer's weights.
    group = by_name[f"model: {Path(model['files'][0]).name}"]
    layer_of = {x["name"]: x["layer"] for x in model["tensors"]}
    expected = {f"layer {l}" for l in layer_of.values() if l is not None} | {"non-layer"}
    children = {tracks[u]: u for u, p in parents.items() if p == group}
    assert set(children) == expected
    for name, uuid in children.items():
        layer = None if name == "non-layer" else int(name.split()[1])
        assert slice_names[uuid], f"{name}: no weight reads"
        assert all(layer_of[s] == layer for s in slice_names[uuid]), name

    # Counter: page faults per 10 ms sums to the trace's faults.
    assert sum(counters[by_name["page faults per 10 ms"]]) == a["faults"]


def test_chrome_json_matches_perfetto_and_report(ttrace, trace, tmp_path):
    """Chrome Trace Event JSON has the Perfetto export's content: per thread
    the same op slices (name and args), the same ubatch slices, the same
    weight slices per layer track and the same fault counter values; counts
    agree with `report --json`."""
    path, a = trace
    doc = json.loads(export(ttrace, path, "chrome-json", tmp_path / "t.json").read_text())
    pf = Pftrace(export(ttrace, path, "perfetto", tmp_path / "t.pftrace").read_bytes())
    start = a["header"]["start_monotonic_ns"]
    pid = a["header"]["pid"]
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    process_names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}

    # Op slices per thread: the same count, names and args as Perfetto's thread tracks.
    ops = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "op":
            assert e["pid"] == pid and thread_names[(pid, e["tid"])] == f"thread {e['tid']}"
            args = {k: v for k, v in e["args"].items() if k in ("dst", "srcs", "weight_bytes", "memory", "layer",
                                                                 "ubatch") and v is not None}
            ops[e["tid"]].append((e["ts"], e["name"], args))
    # (Perfetto also has tracks for threads that only faulted.)
    threads = {tid: u for tid, u in pf.threads().items() if pf.begins[u]}
    if not a["header"]["options"]["op_timing"]:
        threads = {}  # graph capture: no op slices, in either export
    assert set(ops) == set(threads)
    for tid, uuid in threads.items():
        # µs since tracing started, as the exporter computes them (exact in a double).
        want = sorted(((ts - start) / 1000, n, json.dumps(args, sort_keys=True)) for ts, n, args in pf.slices[uuid])
        got = sorted((ts, n, json.dumps(args, sort_keys=True)) for ts, n, args in ops[tid])
        assert len(got) == pf.begins[uuid], f"thread {tid}: op slice count"
        assert got == want, f"thread {tid}: op slices differ"
    if threads:
        assert sum(len(v) for v in ops.values()) == a["ops"]
        assert dict(collections.Counter(n for v in ops.values() for _, n, _ in v)) == a["op_counts"]

    # Ubatch slices: one per ubatch, named as on Perfetto's ubatch track, with its op count.
    ubatches = [e for e in events if e["ph"] == "X" and e.get("cat") == "ubatch"]
    assert thread_names[(pid, 0)] == "ubatches" and all(e["tid"] == 0 for e in ubatches)
    assert len(ubatches) == len(a["ubatches"])
    assert [e["name"] for e in ubatches] == pf.slice_names[pf.by_name["ubatches"]]
    assert [e["args"]["ops"] for e in ubatches] == [u["ops"] for u in a["ubatches"]]

    # Weight slices: per layer track of the model process, Perfetto's layer tracks.
    (model,) = a["models"]
    model_pid = next(p for p, n in process_names.items() if n == f"model: {Path(model['files'][0]).name}")
    weights = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "weight":
            assert e["pid"] == model_pid
            weights[thread_names[(model_pid, e["tid"])]].append(e["name"])
    group = pf.by_name[f"model: {Path(model['files'][0]).name}"]
    layer_tracks = {pf.tracks[u]: u for u, p in pf.parents.items() if p == group}
    assert {n: len(v) for n, v in weights.items()} == {
        n: pf.begins[u] for n, u in layer_tracks.items() if pf.begins[u]}
    assert all(weights[n] == pf.slice_names[u] for n, u in layer_tracks.items() if pf.begins[u])

    # Counter: the same (time, faults) points as Perfetto's, summing to the report's faults.
    counter = [(e["ts"], e["args"]["faults"]) for e in events if e["ph"] == "C"
               and e["name"] == "page faults per 10 ms"]
    want = [((ts - start) / 1000, v) for ts, v in pf.counter_points[pf.by_name["page faults per 10 ms"]]]
    assert counter == want
    assert len({ts for ts, _ in counter}) == len(counter), "no point written twice"
    assert counter, "faults are counted"
    assert sum(v for _, v in counter) == a["faults"]
    faults = [e for e in events if e["ph"] == "i" and e["name"] == "page_fault"]
    assert len(faults) == a["faults"]


def test_tokens_json_layout_and_offsets(ttrace, trace, tmp_path, models):
    """The thesis web UI's layout (every file against the schema written from
    its data.ts, webui_schema.py), field by field: one trace file per
    generated token whose entries are that ubatch's op records (as the JSONL
    rows have them), every weight source read through the mapping at its
    GGUF table offset (PyPI `gguf` reader), and memory-map.json equal to
    that table."""
    path, a = trace
    out = export(ttrace, path, "tokens-json", tmp_path / "tokens")
    webui_schema.check_export(out)
    stats = {u["index"]: u for u in a["stats"]["ubatches"]}
    generate = [u for u in a["ubatches"] if u["phase"] == "generate"]
    files = sorted((out / "traces").glob("token-*.json"))
    prompts = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert sorted(p.name for p in (out / "traces").glob("prompt-*.json")) == \
        [f"prompt-{k:05d}.json" for k in range(len(prompts))]
    assert [f.name for f in files] == [f"token-{k:05d}.json" for k in range(a["generate_runs"])]
    assert len(files) == len(generate) == a["generate_runs"] > 0
    (model,) = a["models"]
    reader = gguf.GGUFReader(Path(model["files"][0]))
    reference = {t.name: t for t in reader.tensors}
    rows = collections.defaultdict(list)
    for r in jsonl_rows(ttrace, path, tmp_path / "rows.jsonl"):
        if r["kind"] == "op" and r["ubatch"] is not None:
            rows[r["ubatch"]].append(r)

    checked = collections.Counter()
    for f, u in zip(files, generate):
        doc = json.loads(f.read_text())
        s = stats[u["index"]]
        assert doc["token_id"] == u["token_ids"][-1] and len(u["token_ids"]) == 1
        meta = doc["metadata"]
        assert meta["total_entries"] == len(doc["entries"]) == u["ops"] == len(rows[u["index"]]) > 0
        assert set(meta) == {"total_entries", "duration_ms", "timestamp_start_ns", "format_version", "ubatch_start_ns"}
        assert meta["ubatch_start_ns"] == u["start_ns"] == s["start_ns"]
        assert meta["timestamp_start_ns"] == min(e["timestamp_ns"] for e in doc["entries"])
        assert meta["duration_ms"] == pytest.approx(s["duration_ns"] / 1e6, abs=1e-6) and meta["duration_ms"] > 0
        assert meta["format_version"] == "ttrace-tokens-2"
        assert (doc["ubatch"], doc["phase"], doc["token_ids"]) == (u["index"], "generate", u["token_ids"])
        end_ns = u["end_ns"]
        assert [e["entry_id"] for e in doc["entries"]] == list(range(len(doc["entries"])))
        got = collections.Counter()
        for e in doc["entries"]:
            assert {"entry_id", "timestamp_ns", "timestamp_relative_ms", "token_id", "layer_id", "thread_id",
                    "phase", "operation_type", "dst_name", "num_sources", "sources"} <= set(e)
            assert u["start_ns"] <= e["timestamp_ns"] <= end_ns
            assert e["timestamp_relative_ms"] == pytest.approx((e["timestamp_ns"] - meta["timestamp_start_ns"]) / 1e6,
                                                               abs=1e-6)
            assert e["token_id"] == doc["token_id"] and e["phase"] == "generate"
            assert e["num_sources"] == len(e["sources"])
            weight_layers = set()
            for src in e["sources"]:
                assert {"name", "tensor_ptr", "size_bytes", "layer_id", "memory_source"} <= set(src)
                assert HEX.fullmatch(src["tensor_ptr"]), src["tensor_ptr"]
                assert isinstance(src["size_bytes"], int) and src["size_bytes"] >= 0
                assert src["memory_source"] in ("DISK", "BUFFER")
                if src["memory_source"] == "DISK":
                    assert src["memory_class"] == "model_file"
                    g = reference[src["model_tensor"]]
                    start, size = int(g.data_offset), int(g.n_bytes)
                    assert start <= src["disk_offset"] < start + size
                    assert src["layer_id"] == gguf_layer(g.name)
                    weight_layers.add(src["layer_id"])
                    if src["name"] == g.name:
                        # The weight itself (not a view): at its table offset, all of it.
                        assert src["disk_offset"] == start, src
                        assert src["size_bytes"] == size, src
                        checked["disk"] += 1
                else:
                    assert "disk_offset" not in src
                    assert src["memory_class"] in ("copy", "anon", "other_file", "unmapped")
                    if src["memory_class"] == "copy":
                        # A repacked weight: found by name, its layer from the table.
                        assert src["model_tensor"] == src["name"] and src["name"] in reference
                        assert src["layer_id"] == gguf_layer(src["name"])
                        checked["copy"] += 1
            # An op's layer is its weights' layer.
            if weight_layers - {None}:
                assert e["layer_id"] in weight_layers
            got[(e["timestamp_ns"], e["thread_id"], e["operation_type"], e["dst_name"], e["layer_id"],
                 ";".join(x["name"] for x in e["sources"]))] += 1
        want = collections.Counter((r["ts_ns"], r["tid"], r["name"], r["dst"], r["layer"], r["srcs"])
                                   for r in rows[u["index"]])
        assert got == want, f"token file {f.name}: entries differ from the ubatch's op rows"
        # The weights read, and how often through the file or a copy, are the report's.
        reads = collections.Counter()
        for e in doc["entries"]:
            for x in e["sources"]:
                if x["memory_source"] == "DISK":
                    reads[(x["model_tensor"], "file")] += 1
                elif x["memory_class"] == "copy":
                    reads[(x["model_tensor"], "copy")] += 1
        want_reads = collections.Counter()
        for w in u["weights"]:
            name = model["tensors"][w["tensor"]]["name"]
            want_reads[(name, "file")] += w["file_backed"]
            want_reads[(name, "copy")] += w["copy"]
        assert reads == +want_reads, f"token file {f.name}: weight reads differ from the report"
    assert checked["disk"] > 0, "weights were read from the model file, at their GGUF offsets"

    check_memory_map(json.loads((out / "memory-map.json").read_text()), reader)


def check_memory_map(mm: dict, reader: gguf.GGUFReader):
    """memory-map.json against the GGUF table: each tensor at its offsets, an
    expert tensor (experts on its last axis) as its experts' equal slices,
    `NAME[E]` at offset + E * slice, as the thesis's tables listed them."""
    reference = {t.name: t for t in reader.tensors}
    by_name = {t["name"]: t for t in mm["tensors"]}
    assert len(by_name) == len(mm["tensors"]) == mm["total_tensors"]
    listed = 0
    for g in reference.values():
        start, size, shape = int(g.data_offset), int(g.n_bytes), [int(x) for x in g.shape]
        if g.name.endswith("_exps.weight") and len(shape) >= 3:
            n = shape[-1]
            slices = [by_name[f"{g.name}[{e}]"] for e in range(n)]
            assert [(t["offset_start"], t["size_bytes"]) for t in slices] == \
                [(start + e * size // n, size // n) for e in range(n)], g.name
            assert all(t["shape"] == shape[:-1] and (t["expert_id"], t["n_experts"], t["expert_of"]) == (e, n, g.name)
                       for e, t in enumerate(slices)), g.name
            assert g.name not in by_name, "the whole tensor would cover its slices in the heatmap"
            entries = slices
        else:
            t = by_name[g.name]
            assert (t["offset_start"], t["size_bytes"], t["shape"]) == (start, size, shape), g.name
            assert "expert_id" not in t
            entries = [t]
        listed += len(entries)
        base = LAYER_NAME.sub("", g.name).removesuffix(".weight").removesuffix(".bias")
        for t in entries:
            assert t["dtype"] == g.tensor_type.name.lower(), t["name"]
            assert t["layer_id"] == gguf_layer(g.name), t["name"]
            assert t["offset_end"] == t["offset_start"] + t["size_bytes"]
            assert t["gguf_component"] in (base, "other"), t["name"]
    assert listed == len(mm["tensors"]), "nothing listed that the GGUF table lacks"
    assert mm["total_size_bytes"] == max(int(g.data_offset) + int(g.n_bytes) for g in reference.values())
    embd = reference["token_embd.weight"]
    layers = [gguf_layer(n) for n in reference if gguf_layer(n) is not None]
    assert mm["metadata"] == {"n_layers": max(layers) + 1, "n_embd": int(embd.shape[0]), "n_vocab": int(embd.shape[1]),
                              "n_tensors": len(mm["tensors"])}


@pytest.mark.parametrize("name", ["gemma", "moe"])
def test_tokens_json_for_the_thesis_ui(ttrace, tmp_path, llama_completion, models, flush_log_preload, name):
    """A real model (Gemma 3 270M) and an MoE one: every file of the export
    against the schema written from the thesis UI's data.ts, the memory map
    against the GGUF table (the MoE's expert tensors as per-expert entries),
    and each expert op's expert_ids the experts the report says its layer's
    tokens were routed to."""
    path = record(ttrace, tmp_path / "t.data", llama_completion, models[name], flush_log_preload)
    a = json.loads(subprocess.run([ttrace, "report", path, "--json"], capture_output=True, text=True, check=True).stdout)
    docs = webui_schema.check_export(export(ttrace, path, "tokens-json", tmp_path / "tokens"))
    check_memory_map(docs["memory_map"], gguf.GGUFReader(models[name]))
    assert len(docs["traces"]) == a["generate_runs"] + sum(u["phase"] == "prompt" for u in a["ubatches"])
    routed = {u["index"]: {} for u in a["ubatches"]}
    for u in a["ubatches"]:
        for r in u["routing"]:
            routed[u["index"]].setdefault(r["layer"], set()).update(r["selected"])
    experts = 0
    for doc in docs["traces"].values():
        for e in doc["entries"]:
            weight = e["sources"][0].get("model_tensor") or ""
            if e["operation_type"] == "MUL_MAT_ID" and weight.endswith("_exps.weight"):
                layer = gguf_layer(weight)
                assert sorted(e["expert_ids"]) == sorted(routed[doc["ubatch"]][layer]), (doc["ubatch"], e["dst_name"])
                experts += 1
            else:
                assert "expert_ids" not in e, (doc["ubatch"], e["dst_name"])
    expert_entries = [t for t in docs["memory_map"]["tensors"] if "expert_id" in t]
    assert bool(experts) == bool(expert_entries) == (name == "moe")


def test_dot_graph_of_one_ubatch(ttrace, trace, tmp_path):
    path, a = trace
    k = next(u["index"] for u in a["ubatches"] if u["phase"] == "generate")
    text = export(ttrace, path, "dot", tmp_path / "g.dot", "--ubatch", str(k)).read_text()
    assert text.startswith(f"digraph ubatch_{k} {{") and text.rstrip().endswith("}")
    ops = text.count("shape=box]")
    if a["header"]["options"]["all_threads"]:
        # One record per worker: each node is drawn once.
        assert 0 < ops < a["ubatches"][k]["ops"]
    else:
        assert ops == a["ubatches"][k]["ops"]
    bad = subprocess.run([ttrace, "export", path, "--format", "dot", "--ubatch", "99999", "-o", tmp_path / "x.dot"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--ubatch 99999" in bad.stderr and "panicked" not in bad.stderr


def test_report_text_and_html_in_chromium(ttrace, trace, tmp_path):
    path, a = trace
    text = subprocess.run([ttrace, "report", path], capture_output=True, text=True, check=True).stdout
    for section in ("phases", "per generated token", "per layer", "per component", "hot weights", "cold weights"):
        assert section in text
    assert text.count("\n  token ") == a["generate_runs"]

    html = tmp_path / "report.html"
    subprocess.run([ttrace, "report", path, "--html", html], capture_output=True, text=True, check=True)
    page = html.read_text()
    assert "http://" not in page and "https://" not in page, "the page is self-contained"
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.fail("chromium is not installed: `apt-get install chromium` (cargo xtask setup does)", pytrace=False)

    def run(tag: str, *args):
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / ('profile-' + tag)}", "--window-size=1400,1100"]
        return subprocess.run([chromium, *flags, *args], capture_output=True, text=True, timeout=120)

    # The console detector works: a page with an error is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); nope();</script></body></html>")
    assert "CONSOLE" in run("bad", "--dump-dom", bad.as_uri()).stderr

    dom = run("dom", "--dump-dom", html.as_uri())
    assert dom.returncode == 0
    assert 'data-rendered="ok"' in dom.stdout, "the page script ran to the end"
    assert "CONSOLE" not in dom.stderr, [l for l in dom.stderr.splitlines() if "CONSOLE" in l]
    assert dom.stdout.count("<canvas") >= 2
    shot = screenshot_path(tmp_path, f"report-{path.parent.name}.png")
    got = run("shot", f"--screenshot={shot}", html.as_uri())
    assert got.returncode == 0 and shot.stat().st_size > 10_000
    assert "CONSOLE" not in got.stderr


def screenshot_path(tmp_path: Path, name: str) -> Path:
    """Where a screenshot goes: TTRACE_SCREENSHOT_DIR (`cargo xtask test`
    sets it to target/ttrace-test-screenshots, kept after the run), else the
    test's temporary directory. A stale one from an earlier run is removed."""
    d = Path(os.environ.get("TTRACE_SCREENSHOT_DIR", tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    shot = d / name
    shot.unlink(missing_ok=True)
    return shot
