//! One row per event, for JSONL and CSV (and [`super::parquet`]).
//!
//! The columns are [`super::columns::COLUMNS`] (also `ttrace export --help`).
//!
//! Kinds `block` (name `issue`/`complete`) and `page_cache` (name `add`/
//! `filemap_fault`, `file_offset` = page offset in the model file,
//! `fault_tensor` = the tensor there) come from traces with I/O records.
//!
//! Ops arrive when their end is known, so rows are near, not exactly, in
//! `seq` order; sort by `seq` or `ts_ns` if it matters.

use std::borrow::Cow;

use serde::Serialize;
use tracer_common::{PAGE_SIZE, ggml::MAX_SRC, markers};

use crate::analyze::{
    tensor::{display_name, memory_class, model_tensor, op_layer},
    walk::{Event, OpEvent, Tables},
};
use crate::{analyze::Phase, format::Descriptor};

pub use super::text::{Text, write};

/// One row, owned (Chrome and Perfetto keep parts of it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub seq: u64,
    pub kind: &'static str,
    pub ts_ns: u64,
    pub rel_ns: u64,
    pub dur_ns: Option<u64>,
    pub tid: u32,
    pub ubatch: Option<u32>,
    pub phase: Option<&'static str>,
    pub token_index: Option<u32>,
    pub name: String,
    pub layer: Option<u32>,
    pub dst: Option<String>,
    pub dst_memory: Option<&'static str>,
    pub srcs: Option<String>,
    pub n_srcs: u32,
    pub weights_file: u32,
    pub weights_copy: u32,
    pub weight_bytes: u64,
    pub ith: Option<u32>,
    pub nth: Option<u32>,
    pub address: Option<u64>,
    pub ip: Option<u64>,
    pub error_code: Option<u64>,
    pub fault_tensor: Option<String>,
    pub file_offset: Option<u64>,
    pub op_seq: Option<u64>,
    pub dev: Option<u32>,
    pub sector: Option<u64>,
    pub io_bytes: Option<u64>,
    pub rwbs: Option<String>,
    pub seq_ids: Option<String>,
    pub positions: Option<String>,
}

/// One row borrowed from its event and the tables, the same fields as [`Row`]:
/// the JSONL/CSV/Parquet writers format it without allocating, which an owned
/// row (five strings per event) cannot.
#[derive(Clone, Debug, Default)]
pub struct Cells<'a> {
    pub seq: u64,
    pub kind: &'static str,
    pub ts_ns: u64,
    pub rel_ns: u64,
    pub dur_ns: Option<u64>,
    pub tid: u32,
    pub ubatch: Option<u32>,
    pub phase: Option<&'static str>,
    pub token_index: Option<u32>,
    pub name: Cow<'a, str>,
    pub layer: Option<u32>,
    pub dst: Option<&'a str>,
    pub dst_memory: Option<&'static str>,
    pub srcs: Option<Srcs<'a>>,
    pub n_srcs: u32,
    pub weights_file: u32,
    pub weights_copy: u32,
    pub weight_bytes: u64,
    pub ith: Option<u32>,
    pub nth: Option<u32>,
    pub address: Option<u64>,
    pub ip: Option<u64>,
    pub error_code: Option<u64>,
    pub fault_tensor: Option<&'a str>,
    pub file_offset: Option<u64>,
    pub op_seq: Option<u64>,
    pub dev: Option<u32>,
    pub sector: Option<u64>,
    pub io_bytes: Option<u64>,
    pub rwbs: Option<&'a str>,
    pub seq_ids: Option<&'a str>,
    pub positions: Option<&'a str>,
}

/// An op's source names; the `srcs` column joins them with `;`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Srcs<'a> {
    names: [&'a str; MAX_SRC],
    len: usize,
}

impl<'a> Srcs<'a> {
    pub fn names(&self) -> &[&'a str] {
        &self.names[..self.len]
    }

    pub fn joined(&self) -> String {
        self.names().join(";")
    }

    /// The first [`MAX_SRC`] of `names`.
    pub fn from_names(names: &[&'a str]) -> Self {
        let mut s = Self { len: names.len().min(MAX_SRC), ..Default::default() };
        s.names[..s.len].copy_from_slice(&names[..s.len]);
        s
    }
}

pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Warmup => "warmup",
        Phase::Prompt => "prompt",
        Phase::Generate => "generate",
        Phase::Aux => "aux",
    }
}

pub fn marker_name(cookie: u64) -> String {
    marker_name_ref(cookie).into_owned()
}

fn marker_name_ref(cookie: u64) -> Cow<'static, str> {
    match cookie {
        markers::SCHED_GRAPH_COMPUTE => "graph_compute".into(),
        markers::SCHED_GRAPH_COMPUTE_RETURN => "graph_compute_return".into(),
        markers::LLAMA_DECODE => "llama_decode".into(),
        markers::LLAMA_PROCESS => "llama_process".into(),
        markers::LLAMA_PERF_RESET => "llama_perf_reset".into(),
        markers::OUTPUT_RESERVE => "output_reserve".into(),
        markers::OUTPUT_RESERVE_RETURN => "output_reserve_return".into(),
        markers::SEQ_RM_CHECK => "seq_rm_check".into(),
        markers::SEQ_RM_CHECK_RETURN => "seq_rm_check_return".into(),
        markers::LIBRARY_LOADED => "library_loaded".into(),
        markers::WHISPER_ENCODE => "whisper_encode".into(),
        markers::WHISPER_DECODE => "whisper_decode".into(),
        markers::WHISPER_INIT => "whisper_init".into(),
        markers::PROCESS_EXEC => "process_exec".into(),
        other => format!("marker#{other}").into(),
    }
}

/// The row of one event; `None` for events that are not rows (lost counters, end).
pub fn row(event: &Event, t: &Tables) -> Option<Row> {
    cells(event, t).map(|c| c.to_row())
}

/// [`row`] without copying strings out of the event and tables.
pub fn cells<'a>(event: &'a Event, t: &Tables<'a>) -> Option<Cells<'a>> {
    // The columns every non-op row fills the same way.
    let base = |seq: u64, kind: &'static str, ts_ns: u64, tid: u32, ubatch: Option<u32>| Cells {
        seq,
        kind,
        ts_ns,
        rel_ns: ts_ns.saturating_sub(t.analysis.header.start_monotonic_ns),
        tid,
        ubatch,
        phase: t.phase(ubatch).map(phase_name),
        token_index: t.token_index(ubatch),
        seq_ids: sequences(t, ubatch).map(|s| s.0.as_str()),
        positions: sequences(t, ubatch).map(|s| s.1.as_str()),
        ..Default::default()
    };
    match event {
        Event::Op(e) => {
            let mut c = op_context(e, t);
            op_shape(e, t, &mut c);
            Some(c)
        }
        Event::Marker(ctx, m) => Some(Cells {
            name: marker_name_ref(m.cookie),
            address: Some(m.args[0]),
            error_code: Some(m.cookie),
            ..base(ctx.seq, "marker", m.ts_ns, m.tid, ctx.ubatch)
        }),
        Event::Fault(f) => {
            let tensor = f.hit.and_then(|h| Some(model_tensor(t.models, h.model, h.tensor?)?.name.as_str()));
            Some(Cells {
                name: "page_fault".into(),
                address: Some(f.fault.address),
                ip: Some(f.fault.ip),
                error_code: Some(f.fault.error_code),
                fault_tensor: tensor,
                file_offset: f.hit.map(|h| h.file_offset),
                op_seq: f.op_seq,
                ..base(f.ctx.seq, "fault", f.fault.ts_ns, f.fault.tid, f.ctx.ubatch)
            })
        }
        Event::PageCache(ctx, p) => {
            let file_offset = p.index.saturating_mul(PAGE_SIZE);
            let tensor = p.file.and_then(|(m, f)| {
                let models = t.models.get(m as usize)?;
                models
                    .tensors
                    .iter()
                    .find(|x| x.file == f && x.file_offset <= file_offset && file_offset < x.file_offset + x.size_bytes)
            });
            Some(Cells {
                name: <&str>::from(p.kind).into(),
                fault_tensor: tensor.map(|x| x.name.as_str()),
                file_offset: p.file.map(|_| file_offset),
                dev: Some(p.dev),
                io_bytes: Some(PAGE_SIZE << p.order.min(20)),
                ..base(ctx.seq, "page_cache", p.ts_ns, p.tid, ctx.ubatch)
            })
        }
        Event::Block(ctx, b) => Some(Cells {
            name: <&str>::from(b.kind).into(),
            error_code: Some(b.error as i64 as u64),
            dev: Some(b.dev),
            sector: Some(b.sector),
            io_bytes: Some(u64::from(b.nr_sector) * 512),
            rwbs: Some(&b.rwbs),
            ..base(ctx.seq, "block", b.ts_ns, b.tid, ctx.ubatch)
        }),
        _ => None,
    }
}

/// An op's columns that change from one execution to the next: position,
/// time, thread, ubatch, work split. The rest is [`op_shape`].
pub fn op_context<'a>(e: &OpEvent, t: &Tables<'a>) -> Cells<'a> {
    Cells {
        seq: e.ctx.seq,
        kind: "op",
        ts_ns: e.op.ts_ns,
        rel_ns: e.op.ts_ns.saturating_sub(t.analysis.header.start_monotonic_ns),
        dur_ns: e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns)),
        tid: e.op.tid,
        ubatch: e.ctx.ubatch,
        phase: t.phase(e.ctx.ubatch).map(phase_name),
        token_index: t.token_index(e.ctx.ubatch),
        ith: Some(e.op.ith),
        nth: Some(e.op.nth),
        seq_ids: sequences(t, e.ctx.ubatch).map(|s| s.0.as_str()),
        positions: sequences(t, e.ctx.ubatch).map(|s| s.1.as_str()),
        ..Default::default()
    }
}

/// A ubatch's `seq_ids` and `positions` columns.
fn sequences<'a>(t: &Tables<'a>, ubatch: Option<u32>) -> Option<&'a (String, String)> {
    t.analysis.ubatches.get(ubatch? as usize)?.sequences.as_ref()
}

/// Whether an op's [`op_shape`] columns may be kept per op shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeScope {
    /// A function of the op's destination and sources and the model tables.
    PerShape,
    /// `weight_bytes` also depends on the ubatch's MoE routing.
    PerUbatch,
}

/// The columns `name` to `weight_bytes` of an op: a function of its
/// destination and sources (slot, descriptor) and the model tables, so
/// writers may keep them per [`super::shape::OpShapes`] key, except where
/// an op reads routed MoE experts ([`ShapeScope::PerUbatch`]).
pub fn op_shape<'a>(e: &OpEvent, t: &Tables<'a>, c: &mut Cells<'a>) -> ShapeScope {
    let dst = t.descriptor(e.op.dst);
    // The reader rejects ops with more than MAX_SRC sources.
    let n = e.op.srcs.len().min(MAX_SRC);
    let mut srcs: [&Descriptor; MAX_SRC] = [dst; MAX_SRC];
    let mut slotted: [(u32, &Descriptor); MAX_SRC] = [(0, dst); MAX_SRC];
    let mut names = Srcs { len: n, ..Default::default() };
    for (i, &(slot, id)) in e.op.srcs.iter().take(n).enumerate() {
        let d = t.descriptor(id);
        (srcs[i], slotted[i], names.names[i]) = (d, (slot, d), display_name(t.models, d));
    }
    let (srcs, slotted) = (&srcs[..n], &slotted[..n]);
    c.name = t.op_name_ref(&e.op);
    c.layer = op_layer(t.models, dst, srcs);
    c.dst = Some(&dst.name);
    c.dst_memory = Some(memory_class(&dst.memory));
    c.srcs = Some(names);
    c.n_srcs = e.op.srcs.len() as u32;
    (c.weights_file, c.weights_copy, c.weight_bytes) = (0, 0, 0);
    let mut scope = ShapeScope::PerShape;
    for &source in slotted {
        let Some(read) = t.weight_read(&c.name, e.ctx.ubatch, source, slotted) else { continue };
        if read.weight.copy {
            c.weights_copy += 1;
        } else {
            c.weights_file += 1;
        }
        c.weight_bytes += read.bytes;
        if read.routed {
            scope = ShapeScope::PerUbatch;
        }
    }
    scope
}

impl Cells<'_> {
    /// `address` to `rwbs` are all absent, as in every op's row.
    pub fn io_columns_empty(&self) -> bool {
        self.address.is_none()
            && self.ip.is_none()
            && self.error_code.is_none()
            && self.fault_tensor.is_none()
            && self.file_offset.is_none()
            && self.op_seq.is_none()
            && self.dev.is_none()
            && self.sector.is_none()
            && self.io_bytes.is_none()
            && self.rwbs.is_none()
    }

    pub fn to_row(&self) -> Row {
        Row {
            seq: self.seq,
            kind: self.kind,
            ts_ns: self.ts_ns,
            rel_ns: self.rel_ns,
            dur_ns: self.dur_ns,
            tid: self.tid,
            ubatch: self.ubatch,
            phase: self.phase,
            token_index: self.token_index,
            name: self.name.clone().into_owned(),
            layer: self.layer,
            dst: self.dst.map(String::from),
            dst_memory: self.dst_memory,
            srcs: self.srcs.map(|s| s.joined()),
            n_srcs: self.n_srcs,
            weights_file: self.weights_file,
            weights_copy: self.weights_copy,
            weight_bytes: self.weight_bytes,
            ith: self.ith,
            nth: self.nth,
            address: self.address,
            ip: self.ip,
            error_code: self.error_code,
            fault_tensor: self.fault_tensor.map(String::from),
            file_offset: self.file_offset,
            op_seq: self.op_seq,
            dev: self.dev,
            sector: self.sector,
            io_bytes: self.io_bytes,
            rwbs: self.rwbs.map(String::from),
            seq_ids: self.seq_ids.map(String::from),
            positions: self.positions.map(String::from),
        }
    }
}
