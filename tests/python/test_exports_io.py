"""`ttrace export` and `ttrace report --html` on cold and memory-limited
runs: block requests on the disk track and in rows, fault → disk → op flows,
and the HTML heatmap's read-from-disk cells, each checked against `ttrace
report --json` of the same trace. Needs root: the traces are recorded here."""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import gguf
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from test_exports import CHROMIUM_FLAGS, export, gguf_layer, packet_times, record, screenshot_path


def drop_from_page_cache(path: Path):
    """Evict one file's pages (this file only: other users of the machine keep theirs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_io_records_on_the_disk_track_and_in_rows(ttrace, tmp_path, llama_completion, models, flush_log_preload):
    """A cold model file: block requests become disk-lane slices (issue to
    completion, never overlapping on one lane) and rows of kind `block`."""
    model = tmp_path / "cold.gguf"
    shutil.copyfile(models["moe"], model)
    os.sync()
    drop_from_page_cache(model)
    path = record(ttrace, tmp_path / "io.data", llama_completion, model, flush_log_preload)
    rows = [json.loads(line) for line in export(ttrace, path, "jsonl", tmp_path / "io.jsonl").read_text().splitlines()]
    blocks = [r for r in rows if r["kind"] == "block"]
    assert any(r["kind"] == "page_cache" for r in rows), "a cold model is read into the page cache"
    assert blocks, "a cold model file is read from disk"
    # Pair issues with completions as the exporter does: by (dev, sector). A
    # sector issued again before its completion was traced ends the earlier
    # request there.
    issued, pairs, superseded = {}, [], []
    for r in sorted(blocks, key=lambda r: r["seq"]):
        key = (r["dev"], r["sector"])
        if r["name"] == "issue":
            if key in issued:
                superseded.append((issued.pop(key)["ts_ns"], r["ts_ns"]))
            issued[key] = r
        elif key in issued:
            pairs.append((issued.pop(key), r))
    assert pairs

    t = pb.Trace()
    t.ParseFromString(export(ttrace, path, "perfetto", tmp_path / "io.pftrace").read_bytes())
    tracks, parents, open_at = {}, {}, {}
    lane_slices, disk_counter = collections.defaultdict(list), []
    for p, ts in zip(t.packet, packet_times(t)):
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor.name
            parents[p.track_descriptor.uuid] = p.track_descriptor.parent_uuid
        if p.HasField("track_event"):
            e, name = p.track_event, tracks.get(p.track_event.track_uuid, "")
            if name.startswith("disk requests"):
                if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                    assert e.track_uuid not in open_at, "lanes hold one request at a time"
                    open_at[e.track_uuid] = ts
                elif e.type == pb.TrackEvent.TYPE_SLICE_END:
                    lane_slices[e.track_uuid].append((open_at.pop(e.track_uuid), ts))
            elif name == "disk bytes per 10 ms":
                disk_counter.append(e.counter_value)
    by_name = {v: k for k, v in tracks.items()}
    disk = by_name["disk"]
    assert all(parents[u] == disk for u in lane_slices)
    # A request whose completion was never recorded still gets its slice,
    # from its issue to the end of the trace.
    a = json.loads(subprocess.run([ttrace, "report", path, "--json"], capture_output=True, text=True, check=True).stdout)
    unfinished = [(i["ts_ns"], max(a["last_ts_ns"], i["ts_ns"])) for i in issued.values()]
    assert sum(len(v) for v in lane_slices.values()) == len(pairs) + len(superseded) + len(unfinished)
    # Slices are written at completion: sort each lane by start before checking overlap.
    for spans in lane_slices.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "requests on one lane do not overlap"
    assert sum(disk_counter) == sum(c["io_bytes"] for _, c in pairs)
    expected = sorted([(i["ts_ns"], c["ts_ns"]) for i, c in pairs] + superseded + unfinished)
    assert sorted(s for v in lane_slices.values() for s in v) == expected

    load = next(p for p in a["stats"]["phases"] if p["phase"] == "load")
    assert load["disk_bytes"] is not None
    assert all(u["disk_bytes"] is not None for u in a["stats"]["ubatches"])
    check_disk_flows_and_counters(path, a, tmp_path / "io2.pftrace", ttrace)


def perfetto_flows(ttrace, path: Path, out: Path):
    """Per flow id: the (kind, ts, terminating) of each event carrying it;
    and the cumulative disk counter's values."""
    t = pb.Trace()
    t.ParseFromString(export(ttrace, path, "perfetto", out).read_bytes())
    tracks, names, flows, cumulative = {}, {}, collections.defaultdict(list), []
    for p, ts in zip(t.packet, packet_times(t)):
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor.name
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track = tracks[e.track_uuid]
        if track == "model bytes read from disk (cumulative)":
            cumulative.append((ts, e.counter_value))
        if e.type == pb.TrackEvent.TYPE_INSTANT and names.get(e.name_iid) == "page_fault":
            kind = "fault"
        elif e.type == pb.TrackEvent.TYPE_SLICE_BEGIN and track.startswith("disk requests"):
            kind = "disk"
        elif e.type == pb.TrackEvent.TYPE_SLICE_BEGIN and track.startswith("thread "):
            kind = "op"
        else:
            kind = "other"
        for f in e.flow_ids:
            flows[f].append((kind, ts, False))
        for f in e.terminating_flow_ids:
            flows[f].append((kind, ts, True))
    return flows, cumulative


def check_disk_flows_and_counters(path: Path, a: dict, out: Path, ttrace) -> int:
    """Flows that reach a disk slice form fault → disk → op chains (in time
    order, one id each); the cumulative counter ends at io.disk.bytes; the
    per-(ubatch, tensor) disk bytes add up. Returns the number of chains."""
    flows, cumulative = perfetto_flows(ttrace, path, out)
    chains = 0
    for flow, events in flows.items():
        events.sort(key=lambda x: x[1])
        kinds = [k for k, _, _ in events]
        assert "other" not in kinds, (hex(flow), events)
        assert sum(term for _, _, term in events) <= 1, "a flow ends once"
        fault_ends = any(k == "fault" and term for k, _, term in events)
        # A fault chained to its read reaches that read's disk slice even when
        # the completion was never recorded (io.disk.uncompleted): such a
        # request's slice ends at the end of the trace.
        assert "disk" in kinds or fault_ends, (hex(flow), events)
        if "disk" not in kinds:
            assert kinds == ["op", "fault"], (hex(flow), events)
            continue
        assert sorted(kinds) in (["disk", "fault", "op"], ["disk", "fault"]), (hex(flow), events)
        # op → fault → disk (the op that waited) or fault → disk → next op.
        assert kinds in (["op", "fault", "disk"], ["fault", "disk", "op"], ["fault", "disk"]), kinds
        assert events[-1][2] or kinds == ["fault", "disk"], "the last event ends the flow"
        chains += sorted(kinds) == ["disk", "fault", "op"]
    io = a["io"]
    assert cumulative, "a cold trace reads the model from disk"
    assert [v for _, v in cumulative] == sorted(v for _, v in cumulative), "cumulative"
    assert cumulative[-1][1] == io["disk"]["bytes"]
    per_ubatch = collections.Counter()
    per_tensor = collections.Counter()
    for e in io["ubatch_tensor_bytes"]:
        per_ubatch[e["ubatch"]] += e["bytes"]
        if e["tensor"] is not None:
            per_tensor[(e["model"], e["tensor"])] += e["bytes"]
    assert not io["ubatch_tensor_bytes_truncated"]
    for u in a["ubatches"]:
        w = io["by_when"].get(f"ubatch {u['index']}")
        assert per_ubatch[u["index"]] == (w["disk"]["bytes"] if w else 0), u["index"]
    read = {(t["model"], t["tensor"]): t["bytes_read"] for t in io["tensors"]}
    assert all(b <= read[k] for k, b in per_tensor.items())
    outside = sum(w["disk"]["bytes"] for k, w in io["by_when"].items() if not k.startswith("ubatch"))
    between = io["disk"]["bytes"] - sum(read.values())
    assert sum(per_tensor.values()) >= io["disk"]["bytes"] - outside - between
    return chains


@pytest.mark.parametrize("mode", ["graph", "op-timing"])
def test_memory_limited_run_reads_every_token_from_disk(ttrace, tmp_path, llama_completion, models,
                                                        flush_log_preload, mode):
    """Under a memory limit smaller than the model, every generated token reads
    weights from disk: each major fault names the op that read its address
    (graph capture: an op of the current graph reading that tensor) and, with
    --op-timing, chains to its disk read on the timeline (fault → disk request
    → op); the HTML heatmap shows read-from-disk cells in generate rows."""
    out = tmp_path / "lim.data"
    timing = ["--op-timing"] if mode == "op-timing" else []
    argv = [ttrace, "run", *timing, "--drop-caches", "--mem-limit", "384M", "-o", out, "--", llama_completion,
            "-m", models["bench"], "-p", "hello world", "-n", "8", "-no-cnv", "--ignore-eos", "-t", "2",
            "-c", "256", "-b", "64", "-ub", "64"]
    env = dict(os.environ, LD_PRELOAD=str(flush_log_preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    generate = [u for u in a["stats"]["ubatches"] if u["phase"] == "generate"]
    assert generate and all(u["disk_bytes"] > 0 and u["disk_tensors"] > 0 for u in generate)
    # Per token, the disk bytes by layer add up to the token's disk bytes, and
    # each layer's share is what its tensors (layer from the GGUF reader's
    # names) read: the per-(ubatch, tensor) bytes grouped by layer.
    (model,) = a["models"]
    names = [t.name for t in gguf.GGUFReader(models["bench"]).tensors]
    assert [t["name"] for t in model["tensors"]] == names
    io = a["io"]
    by_tensor = collections.defaultdict(collections.Counter)
    for e in io["ubatch_tensor_bytes"]:
        layer = None if e["tensor"] is None else gguf_layer(names[e["tensor"]])
        by_tensor[e["ubatch"]]["none" if layer is None else str(layer)] += e["bytes"]
    for u in generate:
        layers = io["ubatch_layer_bytes"][str(u["index"])]
        assert sum(layers.values()) == u["disk_bytes"] == io["by_when"][f"ubatch {u['index']}"]["disk"]["bytes"]
        assert layers == dict(by_tensor[u["index"]]), f"ubatch {u['index']}: per-layer bytes"
        assert sum(1 for k, b in layers.items() if k != "none" and b > 0) > 1, "several layers read per token"
    chains = check_disk_flows_and_counters(out, a, tmp_path / "lim.pftrace", ttrace)
    if timing:
        assert chains >= 1, "no fault → disk → op chain"
    else:
        rows = [json.loads(line) for line in export(ttrace, out, "jsonl", tmp_path / "lim.jsonl").read_text().splitlines()]
        ops = {r["seq"]: r for r in rows if r["kind"] == "op"}
        faults = [r for r in rows if r["kind"] == "fault" and r["fault_tensor"] and r["ubatch"] is not None
                  and a["ubatches"][r["ubatch"]]["phase"] == "generate"]
        assert faults, "generate ubatches fault on weights"
        for f in faults:
            op = ops[f["op_seq"]]
            assert op["ubatch"] == f["ubatch"] and f["fault_tensor"] in op["srcs"].split(";"), (f, op)
    text = subprocess.run([ttrace, "report", out], capture_output=True, text=True, check=True).stdout
    assert "disk read (tensors)" in text

    html = tmp_path / "lim.html"
    subprocess.run([ttrace, "report", out, "--html", html], capture_output=True, text=True, check=True)
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.fail("chromium is not installed: `apt-get install chromium` (cargo xtask setup does)", pytrace=False)
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1100"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-rendered="ok"' in dom.stdout
    assert "CONSOLE" not in dom.stderr, [l for l in dom.stderr.splitlines() if "CONSOLE" in l]
    cells = re.search(r'data-disk-generate-cells="(\d+)"', dom.stdout)
    assert cells and int(cells.group(1)) > 0, "read-from-disk cells in generate rows"
    shot = screenshot_path(tmp_path, "report-memory-limited.png")
    got = subprocess.run([chromium, *flags, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0 and shot.stat().st_size > 10_000
