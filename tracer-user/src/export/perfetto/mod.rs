//! Perfetto's native protobuf trace (`.pftrace`), streamed packet by packet.
//!
//! Tracks (uuids fixed so tests and users can find them):
//! - a process track for the target (uuid 1) with a `ubatches` child
//!   (uuid 2): one slice per ubatch graph, `ubatch N (phase[, token K])`;
//! - one thread track per thread that ran ops or faulted (uuid
//!   `0x1_0000_0000 + tid`): op slices named by op, args dst, srcs,
//!   weight_bytes, memory, layer, and `page_fault` instants (address,
//!   tensor, file_offset) with a flow from the op that was running (below);
//! - per model a group `model: FILE` (uuid `0x2_0000_0000 + model << 16`)
//!   with a track per layer (`layer N`, `+ 1 + N`) and `non-layer`
//!   (`+ 0xffff`): a slice, named by the weight, while an op reads that
//!   layer's weights (one per graph node: ith 0 only, clipped so slices
//!   never overlap; with graph capture, which does not time ops, one per
//!   weight a ubatch read, spanning the ubatch);
//! - a counter `page faults per 10 ms` (uuid 3);
//! - per sequence id a track `sequence S` (uuid `0x4_0000_0000 + S`): a
//!   slice per ubatch it had tokens in, `request R: prompt N` or
//!   `request R: generate POS` ([`sequences`]);
//! - with I/O records: a `disk` group (uuid 4) with `disk requests N` lanes
//!   (uuid 0x3_0000_0000 + N): a slice per block request from issue to
//!   completion (overlapping requests on separate lanes), a counter
//!   `disk bytes per 10 ms` (uuid 5, completed bytes), a counter
//!   `model bytes read from disk (cumulative)` (uuid 6) and `page_cache_add`
//!   instants on the thread that caused them;
//! - with buffer records: a `backend buffers` group (uuid 0x5_0000_0000) with
//!   a bytes counter per usage ([`buffers`]).
//!
//! The cumulative counter steps at each read request's issue by the request's
//! model-file bytes (a requeued request counts once), so its last value is
//! `ttrace report --json`'s `io.disk.bytes`. It is deliberately not "model
//! bytes resident": page-cache adds are traced but evictions are not, so
//! residency cannot be derived honestly.
//!
//! Flows (one id per chain, in time order, so Perfetto draws each arrow
//! forwards): a model-file fault whose thread issues a read request
//! overlapping the fault's page before its next fault or op (the sync read of
//! a major fault) is chained to that request's slice on the disk lane:
//! `op → page_fault → disk request` when an op was running on the faulting
//! thread (the op that waited for the read), `page_fault → disk request →
//! next op on that thread` when none was (loading). Other faults keep the
//! plain `op → page_fault` flow. A chain ends at the disk request when the
//! thread runs no recorded op afterwards (a worker without `--all-threads`).
//! Reads issued by kworkers (requeues) or by another thread's readahead are
//! not chained, so not every major fault has a chain.
//!
//! Names and annotation strings are interned on one packet sequence, and
//! timestamps are deltas on it where packets come in time order ([`clock`]).

mod buffers;
mod clock;
mod disk;
pub mod proto;
mod sequences;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use indicatif::ProgressBar;
use prost::Message;
use proto::*;
use tracer_common::{PAGE_SIZE, markers};

use super::{
    ExportError, Written,
    buckets::Buckets,
    rows::{phase_name, row},
    ubatch_weights::UbatchWeights,
};
use crate::analyze::{Analysis, io::IoCorrelator};
use crate::analyze::{
    tensor::{model_tensor, weight_of},
    walk::{self, Event, Sink, Tables},
};
use crate::format::ModelTensor;

pub const PROCESS_UUID: u64 = 1;
pub const UBATCH_UUID: u64 = 2;
pub const FAULT_COUNTER_UUID: u64 = 3;
pub const DISK_UUID: u64 = 4;
pub const DISK_BYTES_UUID: u64 = 5;
pub const DISK_CUMULATIVE_UUID: u64 = 6;
pub const THREAD_UUID: u64 = 0x1_0000_0000;
pub const LANE_UUID: u64 = 0x3_0000_0000;
pub const MODEL_UUID: u64 = 0x2_0000_0000;
pub const NON_LAYER: u64 = 0xffff;
const SEQ: u32 = 1;
const ANNOTATIONS: [&str; 12] = [
    "dst",
    "srcs",
    "weight_bytes",
    "memory",
    "layer",
    "ubatch",
    "address",
    "tensor",
    "sector",
    "bytes",
    "rwbs",
    "file_offset",
];

struct PerfettoSink<W: Write> {
    out: W,
    buf: Vec<u8>,
    packets: u64,
    names: HashMap<String, u64>,
    strings: HashMap<String, u64>,
    threads: BTreeMap<u32, ()>,
    /// Per layer track: where its last slice ended.
    layer_end: HashMap<u64, u64>,
    /// Graph capture: the weights the current ubatch's untimed ops read,
    /// drawn over the ubatch at its end.
    ubatch_weights: UbatchWeights,
    ubatch_start: u64,
    /// Flows from an op (by seq) to the faults it took.
    op_flows: HashMap<u64, Vec<u64>>,
    faults_per_bucket: Buckets,
    disk_bytes_per_bucket: Buckets,
    /// The disk group's descriptors are written (at the first block event).
    disk_described: bool,
    /// Issued block requests by (dev, sector), until their completion.
    requests: HashMap<(u32, u64), disk::OpenRequest>,
    /// Per lane: whether a request occupies it.
    lanes: Vec<bool>,
    pid: u32,
    first: bool,
    clock: clock::DeltaClock,
    /// Block requests → model-file ranges.
    io: IoCorrelator,
    /// Per thread: its last model-file fault, held back until it is known
    /// whether the thread reads the fault's page from disk.
    faults: HashMap<u32, PendingFault>,
    /// Flows waiting for a request's slice: (flow, whether it ends there).
    request_flows: HashMap<(u32, u64), (u64, bool)>,
    /// Per thread: flows (with their fault's seq) ending at its next op.
    next_op_flows: HashMap<u32, Vec<(u64, u64)>>,
    /// Read requests counted in the cumulative counter and not completed.
    reads: HashSet<(u32, u64)>,
    read_bytes: u64,
    /// Sequence tracks with a slice open for the current ubatch.
    open_sequences: Vec<u64>,
}

struct PendingFault {
    seq: u64,
    ts: u64,
    event: TrackEvent,
    flow: u64,
    /// An op was running on the thread (it already carries the flow).
    in_op: bool,
    /// (model, file, page start) in the file.
    page: (u32, u32, u64),
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut sink = PerfettoSink::new(BufWriter::with_capacity(1 << 20, file), a.header.pid);
    for (m, table) in a.models.iter().enumerate() {
        sink.io.on_model(m as u32, table);
    }
    let io = ExportError::write(out);
    sink.preamble(a).map_err(|e| rewrite(e, out))?;
    sink.buffer_counters(a).map_err(|e| rewrite(e, out))?;
    walk::walk(trace, a, progress, &mut sink).map_err(|e| rewrite(e, out))?;
    let tids: Vec<u32> = sink.faults.keys().copied().collect();
    for tid in tids {
        sink.close_fault(tid).map_err(|e| rewrite(e, out))?;
    }
    sink.close_requests(a.last_ts_ns.unwrap_or(0)).map_err(|e| rewrite(e, out))?;
    sink.close_counters().map_err(|e| rewrite(e, out))?;
    sink.out.flush().map_err(io)?;
    Ok(Written { events: progress.position(), items: sink.packets })
}

fn rewrite(e: ExportError, out: &Path) -> ExportError {
    match e {
        ExportError::Write { source, .. } => ExportError::Write { path: out.display().to_string(), source },
        e => e,
    }
}

fn io(source: std::io::Error) -> ExportError {
    ExportError::Write { path: String::new(), source }
}

fn track(uuid: u64, name: &str, parent: Option<u64>) -> TrackDescriptor {
    TrackDescriptor { uuid: Some(uuid), name: Some(name.into()), parent_uuid: parent, ..Default::default() }
}

pub fn layer_uuid(model: u32, layer: Option<u32>) -> u64 {
    MODEL_UUID + (u64::from(model) << 16) + layer.map_or(NON_LAYER, |l| 1 + u64::from(l).min(NON_LAYER - 2))
}

impl<W: Write> PerfettoSink<W> {
    fn new(out: W, pid: u32) -> Self {
        PerfettoSink {
            out,
            buf: Vec::new(),
            packets: 0,
            names: HashMap::new(),
            strings: HashMap::new(),
            threads: BTreeMap::new(),
            layer_end: HashMap::new(),
            ubatch_weights: UbatchWeights::default(),
            ubatch_start: 0,
            op_flows: HashMap::new(),
            faults_per_bucket: Buckets::default(),
            disk_bytes_per_bucket: Buckets::default(),
            disk_described: false,
            requests: HashMap::new(),
            lanes: Vec::new(),
            pid,
            first: true,
            clock: clock::DeltaClock::default(),
            io: IoCorrelator::default(),
            faults: HashMap::new(),
            request_flows: HashMap::new(),
            next_op_flows: HashMap::new(),
            reads: HashSet::new(),
            read_bytes: 0,
            open_sequences: Vec::new(),
        }
    }

    fn packet(&mut self, mut p: TracePacket) -> Result<(), ExportError> {
        p.trusted_packet_sequence_id = Some(SEQ);
        if self.first {
            p.incremental_state_cleared = Some(true);
            p.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
            self.first = false;
        } else if p.track_event.is_some() {
            p.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        }
        self.clock.stamp(&mut p);
        // Trace.packet (field 1, length-delimited), one at a time.
        self.buf.clear();
        self.buf.push(0x0a);
        p.encode_length_delimited(&mut self.buf).map_err(|e| ExportError::Invalid(e.to_string()))?;
        self.packets += 1;
        self.out.write_all(&self.buf).map_err(io)
    }

    fn descriptor(&mut self, d: TrackDescriptor) -> Result<(), ExportError> {
        self.packet(TracePacket { track_descriptor: Some(d), ..Default::default() })
    }

    fn preamble(&mut self, a: &Analysis) -> Result<(), ExportError> {
        // Interned annotation names first: every later packet may use them.
        let names = ANNOTATIONS
            .iter()
            .enumerate()
            .map(|(i, n)| DebugAnnotationName { iid: Some(i as u64 + 1), name: Some((*n).into()) })
            .collect();
        let mut first = TracePacket {
            interned_data: Some(InternedData { debug_annotation_names: names, ..Default::default() }),
            ..Default::default()
        };
        self.clock.define(a.header.start_monotonic_ns, &mut first);
        self.packet(first)?;
        let process = a.header.command.first().map(|c| c.rsplit('/').next().unwrap_or(c)).unwrap_or("target");
        self.descriptor(TrackDescriptor {
            process: Some(ProcessDescriptor { pid: Some(a.header.pid as i32), process_name: Some(process.into()) }),
            child_ordering: Some(CHILD_ORDERING_EXPLICIT),
            ..track(PROCESS_UUID, process, None)
        })?;
        self.descriptor(TrackDescriptor {
            sibling_order_rank: Some(-2),
            ..track(UBATCH_UUID, "ubatches", Some(PROCESS_UUID))
        })?;
        self.descriptor(TrackDescriptor {
            counter: Some(CounterDescriptor { unit: Some(UNIT_COUNT), unit_name: Some("faults".into()) }),
            sibling_order_rank: Some(-1),
            ..track(FAULT_COUNTER_UUID, "page faults per 10 ms", Some(PROCESS_UUID))
        })?;
        self.sequence_tracks(a)?;
        for (m, model) in a.models.iter().enumerate() {
            let m = m as u32;
            let file = model.files.first().map(|f| f.rsplit('/').next().unwrap_or(f)).unwrap_or("model");
            let group = MODEL_UUID + (u64::from(m) << 16);
            self.descriptor(TrackDescriptor {
                child_ordering: Some(CHILD_ORDERING_EXPLICIT),
                ..track(group, &format!("model: {file}"), None)
            })?;
            let mut layers: Vec<Option<u32>> = model.tensors.iter().map(|t| t.layer).collect();
            layers.sort_unstable();
            layers.dedup();
            for (rank, layer) in layers.into_iter().enumerate() {
                let name = layer.map_or_else(|| "non-layer".to_string(), |l| format!("layer {l}"));
                self.descriptor(TrackDescriptor {
                    sibling_order_rank: Some(rank as i32),
                    ..track(layer_uuid(m, layer), &name, Some(group))
                })?;
            }
        }
        Ok(())
    }

    /// Interned ids for an event name and annotation strings, plus the
    /// interned-data entries this packet must carry for new ones.
    fn name_iid(&mut self, name: &str, new: &mut InternedData) -> u64 {
        if let Some(&iid) = self.names.get(name) {
            return iid;
        }
        let iid = self.names.len() as u64 + 1;
        self.names.insert(name.to_string(), iid);
        new.event_names.push(EventName { iid: Some(iid), name: Some(name.into()) });
        iid
    }

    fn string_iid(&mut self, s: &str, new: &mut InternedData) -> u64 {
        if let Some(&iid) = self.strings.get(s) {
            return iid;
        }
        let iid = self.strings.len() as u64 + 1;
        self.strings.insert(s.to_string(), iid);
        new.debug_annotation_string_values.push(InternedString { iid: Some(iid), str: Some(s.as_bytes().to_vec()) });
        iid
    }

    fn event(&mut self, ts: u64, event: TrackEvent, interned: InternedData) -> Result<(), ExportError> {
        let interned = (!interned.event_names.is_empty() || !interned.debug_annotation_string_values.is_empty())
            .then_some(interned);
        self.packet(TracePacket {
            timestamp: Some(ts),
            track_event: Some(event),
            interned_data: interned,
            ..Default::default()
        })
    }

    fn thread(&mut self, tid: u32) -> Result<u64, ExportError> {
        let uuid = THREAD_UUID + u64::from(tid);
        if self.threads.insert(tid, ()).is_none() {
            self.descriptor(TrackDescriptor {
                thread: Some(ThreadDescriptor {
                    pid: Some(self.pid as i32),
                    tid: Some(tid as i32),
                    thread_name: Some(format!("thread {tid}")),
                }),
                ..track(uuid, &format!("thread {tid}"), None)
            })?;
        }
        Ok(uuid)
    }

    fn end(&mut self, ts: u64, track: u64) -> Result<(), ExportError> {
        let e = TrackEvent { r#type: Some(TYPE_SLICE_END), track_uuid: Some(track), ..Default::default() };
        self.event(ts, e, InternedData::default())
    }
}

fn uint(name: usize, v: u64) -> DebugAnnotation {
    DebugAnnotation { name_iid: Some(name as u64 + 1), uint_value: Some(v), ..Default::default() }
}

fn string(name: usize, iid: u64) -> DebugAnnotation {
    DebugAnnotation { name_iid: Some(name as u64 + 1), string_value_iid: Some(iid), ..Default::default() }
}

impl<W: Write> Sink for PerfettoSink<W> {
    type Error = ExportError;

    fn event(&mut self, event: &Event, t: &Tables) -> Result<(), ExportError> {
        match event {
            // Ops captured with their graph have no time of their own: the
            // timeline shows their ubatch (op slices need --op-timing), and
            // the weights they read over it.
            Event::Op(e) if !e.op.timed() => self.ubatch_weights.note(e, t),
            Event::Op(e) => {
                // The thread moved on to its next op: its fault read nothing more.
                self.close_fault(e.op.tid)?;
                let Some(r) = row(event, t) else { return Ok(()) };
                let track = self.thread(e.op.tid)?;
                let mut ending = Vec::new();
                if let Some(flows) = self.next_op_flows.get_mut(&e.op.tid) {
                    flows.retain(|&(fault_seq, flow)| {
                        let after = fault_seq < e.ctx.seq;
                        if after {
                            ending.push(flow);
                        }
                        !after
                    });
                }
                let end = e.end_ns.unwrap_or(e.op.ts_ns);
                let mut new = InternedData::default();
                let name = self.name_iid(&r.name, &mut new);
                let dst = self.string_iid(r.dst.as_deref().unwrap_or(""), &mut new);
                let srcs = self.string_iid(r.srcs.as_deref().unwrap_or(""), &mut new);
                let memory = self.string_iid(r.dst_memory.unwrap_or(""), &mut new);
                let mut args = vec![string(0, dst), string(1, srcs), uint(2, r.weight_bytes), string(3, memory)];
                args.extend(r.layer.map(|l| uint(4, u64::from(l))));
                args.extend(r.ubatch.map(|u| uint(5, u64::from(u))));
                let begin = TrackEvent {
                    r#type: Some(TYPE_SLICE_BEGIN),
                    track_uuid: Some(track),
                    name_iid: Some(name),
                    debug_annotations: args,
                    flow_ids: self.op_flows.remove(&e.ctx.seq).unwrap_or_default(),
                    terminating_flow_ids: ending,
                    ..Default::default()
                };
                self.event(e.op.ts_ns, begin, new)?;
                self.end(end, track)?;
                if e.op.ith == 0 {
                    self.layer_slices(e, end, t)?;
                }
            }
            Event::Marker(ctx, m) => {
                let Some(u) = ctx.ubatch else { return Ok(()) };
                if m.cookie == markers::SCHED_GRAPH_COMPUTE {
                    let phase = t.phase(Some(u)).map_or("aux", phase_name);
                    let name = match t.token_index(Some(u)) {
                        Some(k) => format!("ubatch {u} ({phase}, token {k})"),
                        None => format!("ubatch {u} ({phase})"),
                    };
                    let e = TrackEvent {
                        r#type: Some(TYPE_SLICE_BEGIN),
                        track_uuid: Some(UBATCH_UUID),
                        name: Some(name),
                        ..Default::default()
                    };
                    self.event(m.ts_ns, e, InternedData::default())?;
                    self.ubatch_start = m.ts_ns;
                    let tokens = t.analysis.ubatches.get(u as usize).map_or(&[][..], |x| &x.tokens[..]);
                    self.sequence_slices_begin(m.ts_ns, tokens)?;
                } else if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN {
                    self.ubatch_weight_slices(m.ts_ns, t)?;
                    self.sequence_slices_end(m.ts_ns)?;
                    self.end(m.ts_ns, UBATCH_UUID)?;
                }
            }
            Event::Fault(f) => {
                self.count_fault(f.fault.ts_ns)?;
                let track = self.thread(f.fault.tid)?;
                let mut new = InternedData::default();
                let name = self.name_iid("page_fault", &mut new);
                let mut args = vec![uint(6, f.fault.address)];
                if let Some(hit) = f.hit
                    && let Some(tensor) = hit.tensor.and_then(|x| model_tensor(t.models, hit.model, x))
                {
                    let iid = self.string_iid(&tensor.name, &mut new);
                    args.push(string(7, iid));
                }
                let mut e = TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(track),
                    name_iid: Some(name),
                    debug_annotations: args,
                    ..Default::default()
                };
                if let Some(hit) = f.hit {
                    e.debug_annotations.push(uint(11, hit.file_offset));
                }
                self.close_fault(f.fault.tid)?;
                let flow = (1 << 63) | f.ctx.seq;
                // Only an op slice can start a flow (untimed graph ops have none).
                let op_slice = f.op_seq.filter(|_| f.op_timed);
                if let Some(op) = op_slice {
                    // The op is written when it ends, after its faults.
                    self.op_flows.entry(op).or_default().push(flow);
                }
                if let Some(hit) = f.hit {
                    // Held until the thread's next fault, op or read of this page.
                    // Its new interned names go out now: later packets may use them.
                    if !new.event_names.is_empty() || !new.debug_annotation_string_values.is_empty() {
                        self.packet(TracePacket {
                            interned_data: Some(new),
                            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
                            ..Default::default()
                        })?;
                    }
                    let page = (hit.model, hit.file, hit.file_offset & !(PAGE_SIZE - 1));
                    let pending = PendingFault {
                        seq: f.ctx.seq,
                        ts: f.fault.ts_ns,
                        event: e,
                        flow,
                        in_op: op_slice.is_some(),
                        page,
                    };
                    self.faults.insert(f.fault.tid, pending);
                    return Ok(());
                }
                if op_slice.is_some() {
                    e.terminating_flow_ids.push(flow);
                }
                self.event(f.fault.ts_ns, e, new)?;
            }
            Event::Block(_, b) => self.block(b)?,
            Event::PageCache(_, p) if p.kind == tracer_common::PageCacheKind::Add => {
                let track = self.thread(p.tid)?;
                let mut new = InternedData::default();
                let name = self.name_iid("page_cache_add", &mut new);
                let mut args = vec![uint(11, p.index.saturating_mul(4096)), uint(9, 4096u64 << p.order.min(20))];
                if let Some(x) = row(event, t).and_then(|r| r.fault_tensor) {
                    let iid = self.string_iid(&x, &mut new);
                    args.push(string(7, iid));
                }
                let e = TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(track),
                    name_iid: Some(name),
                    debug_annotations: args,
                    ..Default::default()
                };
                self.event(p.ts_ns, e, new)?;
            }
            _ => {}
        }
        Ok(())
    }
}

impl<W: Write> PerfettoSink<W> {
    /// Per layer track, one slice per weight the ubatch read, all spanning
    /// the ubatch (nested: graph capture does not time the reads within it).
    /// Every track's begins come before the ends, so the packets stay in
    /// time order and their timestamps deltas.
    fn ubatch_weight_slices(&mut self, end: u64, t: &Tables) -> Result<(), ExportError> {
        let mut open: Vec<(u64, usize)> = Vec::new();
        for ((model, layer), weights) in self.ubatch_weights.take() {
            let track = layer_uuid(model, layer);
            let mut begun = 0;
            for &(model, x, copy) in &weights {
                let Some(tensor) = model_tensor(t.models, model, x) else { continue };
                self.weight_slice_begin(track, tensor, copy, self.ubatch_start)?;
                begun += 1;
            }
            open.push((track, begun));
        }
        for (track, begun) in open {
            for _ in 0..begun {
                self.end(end, track)?;
            }
        }
        Ok(())
    }

    /// A slice on a layer track, named by the weight read.
    fn weight_slice_begin(&mut self, track: u64, tensor: &ModelTensor, copy: bool, ts: u64) -> Result<(), ExportError> {
        let mut new = InternedData::default();
        let name = self.name_iid(&tensor.name, &mut new);
        let memory = self.string_iid(if copy { "copy" } else { "model_file" }, &mut new);
        let ev = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            name_iid: Some(name),
            debug_annotations: vec![string(3, memory), uint(2, tensor.size_bytes)],
            ..Default::default()
        };
        self.event(ts, ev, new)
    }

    fn layer_slices(&mut self, e: &walk::OpEvent, end: u64, t: &Tables) -> Result<(), ExportError> {
        let mut seen: Vec<u64> = Vec::new();
        for &(_, id) in e.op.srcs.iter() {
            let d = t.descriptor(id);
            let Some(w) = weight_of(d) else { continue };
            let Some(tensor) = model_tensor(t.models, w.model, w.tensor) else { continue };
            let track = layer_uuid(w.model, tensor.layer);
            if seen.contains(&track) {
                continue;
            }
            seen.push(track);
            let begin = e.op.ts_ns.max(self.layer_end.get(&track).copied().unwrap_or(0));
            if begin >= end {
                continue;
            }
            self.layer_end.insert(track, end);
            self.weight_slice_begin(track, tensor, w.copy, begin)?;
            self.end(end, track)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
