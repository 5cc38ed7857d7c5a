//! One row per event, for JSONL and CSV (and [`super::parquet`]).
//!
//! Schema (every row has every column; empty/null where it does not apply):
//!
//! | column         | type   | meaning                                                       |
//! |----------------|--------|---------------------------------------------------------------|
//! | `seq`          | u64    | order in the trace file (ops by start)                        |
//! | `kind`         | string | `op`, `marker`, `fault`, `page_cache`, `block`                |
//! | `ts_ns`        | u64    | CLOCK_MONOTONIC                                               |
//! | `rel_ns`       | u64    | since tracing started (`header.start_monotonic_ns`)           |
//! | `dur_ns`       | u64?   | op: until the next op on its thread or the graph's return     |
//! | `tid`          | u32    | thread                                                        |
//! | `ubatch`       | u32?   | index into `report --json` `ubatches`                         |
//! | `phase`        | string?| `warmup`, `prompt`, `generate`, `aux`                         |
//! | `token_index`  | u32?   | which generated token (generate ubatches)                     |
//! | `name`         | string | op name (`MUL_MAT`), marker name, `page_fault`                |
//! | `layer`        | u32?   | op: its weights' layer, else the `-N` of its output name      |
//! | `dst`          | string?| op: output tensor name                                        |
//! | `dst_memory`   | string?| `model_file`, `copy`, `anon`, `other_file`, `unmapped`        |
//! | `srcs`         | string?| op: source tensor names joined by `;`                         |
//! | `n_srcs`       | u32    |                                                               |
//! | `weights_file` | u32    | sources read through the model file mapping                   |
//! | `weights_copy` | u32    | sources that are copies of model tensors                      |
//! | `weight_bytes` | u64    | bytes of those weight sources (views as viewed)               |
//! | `ith`, `nth`   | u32?   | op: thread index and count of the op's work split             |
//! | `address`      | u64?   | fault: address; marker: first argument                        |
//! | `ip`           | u64?   | fault: instruction pointer                                    |
//! | `error_code`   | u64?   | fault: x86 error code (bit 1 write, bit 2 user); marker: cookie; block: error |
//! | `fault_tensor` | string?| fault: the model tensor the address is in                     |
//! | `file_offset`  | u64?   | fault: offset in the model file                               |
//! | `op_seq`       | u64?   | fault: `seq` of the op running on that thread                 |
//! | `dev`          | u32?   | block, page_cache: device number (kernel `dev_t` encoding)    |
//! | `sector`       | u64?   | block: first 512-byte sector                                  |
//! | `io_bytes`     | u64?   | block: request bytes; page_cache: folio bytes                 |
//! | `rwbs`         | string?| block: blktrace's R/W/S/M flags                               |
//!
//! Kinds `block` (name `issue`/`complete`) and `page_cache` (name `add`/
//! `filemap_fault`, `file_offset` = page offset in the model file,
//! `fault_tensor` = the tensor there) come from traces with I/O records.
//!
//! Ops arrive when their end is known, so rows are near, not exactly, in
//! `seq` order; sort by `seq` or `ts_ns` if it matters.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use indicatif::ProgressBar;
use serde::Serialize;
use tracer_common::markers;

use super::{
    ExportError, Written,
    tensor::{memory_class, model_tensor, op_layer, op_weight_bytes, weight_of},
    walk::{self, Event, Sink, Tables, sources},
};
use crate::correlate::{Analysis, Phase};

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
}

pub const COLUMNS: &[&str] = &[
    "seq",
    "kind",
    "ts_ns",
    "rel_ns",
    "dur_ns",
    "tid",
    "ubatch",
    "phase",
    "token_index",
    "name",
    "layer",
    "dst",
    "dst_memory",
    "srcs",
    "n_srcs",
    "weights_file",
    "weights_copy",
    "weight_bytes",
    "ith",
    "nth",
    "address",
    "ip",
    "error_code",
    "fault_tensor",
    "file_offset",
    "op_seq",
    "dev",
    "sector",
    "io_bytes",
    "rwbs",
];

pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Warmup => "warmup",
        Phase::Prompt => "prompt",
        Phase::Generate => "generate",
        Phase::Aux => "aux",
    }
}

pub fn marker_name(cookie: u64) -> String {
    match cookie {
        markers::SCHED_GRAPH_COMPUTE => "graph_compute".into(),
        markers::SCHED_GRAPH_COMPUTE_RETURN => "graph_compute_return".into(),
        markers::LLAMA_DECODE => "llama_decode".into(),
        markers::LLAMA_PROCESS => "llama_process".into(),
        markers::LLAMA_PERF_RESET => "llama_perf_reset".into(),
        other => format!("marker#{other}"),
    }
}

/// The row of one event; `None` for events that are not rows (lost counters, end).
pub fn row(event: &Event, t: &Tables) -> Option<Row> {
    let start = t.analysis.header.start_monotonic_ns;
    let context = |ubatch: Option<u32>| (ubatch, t.phase(ubatch).map(phase_name), t.token_index(ubatch));
    match event {
        Event::Op(e) => {
            let (ubatch, phase, token_index) = context(e.ctx.ubatch);
            let dst = t.descriptor(e.op.dst);
            let srcs = sources(&e.op, t);
            let mut r = Row {
                seq: e.ctx.seq,
                kind: "op",
                ts_ns: e.op.ts_ns,
                rel_ns: e.op.ts_ns.saturating_sub(start),
                dur_ns: e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns)),
                tid: e.op.tid,
                ubatch,
                phase,
                token_index,
                name: t.op_name(&e.op),
                layer: op_layer(t.models, dst, &srcs),
                dst: Some(dst.name.clone()),
                dst_memory: Some(memory_class(&dst.memory)),
                srcs: Some(srcs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(";")),
                n_srcs: srcs.len() as u32,
                ith: Some(e.op.ith),
                nth: Some(e.op.nth),
                ..Default::default()
            };
            let slotted: Vec<(u32, &_)> = e.op.srcs.iter().map(|&(s, _)| s).zip(srcs.iter().copied()).collect();
            for &(slot, d) in &slotted {
                let Some(w) = weight_of(d) else { continue };
                if w.copy {
                    r.weights_copy += 1;
                } else {
                    r.weights_file += 1;
                }
                r.weight_bytes += model_tensor(t.models, w.model, w.tensor)
                    .map_or(0, |m| op_weight_bytes(&r.name, slot, d, m, &slotted));
            }
            Some(r)
        }
        Event::Marker(ctx, m) => {
            let (ubatch, phase, token_index) = context(ctx.ubatch);
            Some(Row {
                seq: ctx.seq,
                kind: "marker",
                ts_ns: m.ts_ns,
                rel_ns: m.ts_ns.saturating_sub(start),
                tid: m.tid,
                ubatch,
                phase,
                token_index,
                name: marker_name(m.cookie),
                address: Some(m.args[0]),
                error_code: Some(m.cookie),
                ..Default::default()
            })
        }
        Event::Fault(f) => {
            let (ubatch, phase, token_index) = context(f.ctx.ubatch);
            let tensor = f.hit.and_then(|h| Some(model_tensor(t.models, h.model, h.tensor?)?.name.clone()));
            Some(Row {
                seq: f.ctx.seq,
                kind: "fault",
                ts_ns: f.fault.ts_ns,
                rel_ns: f.fault.ts_ns.saturating_sub(start),
                tid: f.fault.tid,
                ubatch,
                phase,
                token_index,
                name: "page_fault".into(),
                address: Some(f.fault.address),
                ip: Some(f.fault.ip),
                error_code: Some(f.fault.error_code),
                fault_tensor: tensor,
                file_offset: f.hit.map(|h| h.file_offset),
                op_seq: f.op_seq,
                ..Default::default()
            })
        }
        Event::PageCache(ctx, p) => {
            let (ubatch, phase, token_index) = context(ctx.ubatch);
            let file_offset = p.index.saturating_mul(4096);
            let tensor = p.file.and_then(|(m, f)| {
                let models = t.models.get(m as usize)?;
                models
                    .tensors
                    .iter()
                    .find(|x| x.file == f && x.file_offset <= file_offset && file_offset < x.file_offset + x.size_bytes)
            });
            Some(Row {
                seq: ctx.seq,
                kind: "page_cache",
                ts_ns: p.ts_ns,
                rel_ns: p.ts_ns.saturating_sub(start),
                tid: p.tid,
                ubatch,
                phase,
                token_index,
                name: if p.kind == tracer_common::page_cache::ADD { "add" } else { "filemap_fault" }.into(),
                fault_tensor: tensor.map(|x| x.name.clone()),
                file_offset: p.file.map(|_| file_offset),
                dev: Some(p.dev),
                io_bytes: Some(4096u64 << p.order.min(20)),
                ..Default::default()
            })
        }
        Event::Block(ctx, b) => {
            let (ubatch, phase, token_index) = context(ctx.ubatch);
            Some(Row {
                seq: ctx.seq,
                kind: "block",
                ts_ns: b.ts_ns,
                rel_ns: b.ts_ns.saturating_sub(start),
                tid: b.tid,
                ubatch,
                phase,
                token_index,
                name: if b.kind == tracer_common::block::ISSUE { "issue" } else { "complete" }.into(),
                error_code: Some(b.error as i64 as u64),
                dev: Some(b.dev),
                sector: Some(b.sector),
                io_bytes: Some(u64::from(b.nr_sector) * 512),
                rwbs: Some(b.rwbs.clone()),
                ..Default::default()
            })
        }
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Text {
    Jsonl,
    Csv,
}

struct TextSink<W: Write> {
    out: W,
    format: Text,
    rows: u64,
    line: String,
}

pub fn write(
    trace: &Path,
    a: &Analysis,
    out: &Path,
    format: Text,
    progress: &ProgressBar,
) -> Result<Written, ExportError> {
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut sink = TextSink { out: BufWriter::with_capacity(1 << 20, file), format, rows: 0, line: String::new() };
    if format == Text::Csv {
        writeln!(sink.out, "{}", COLUMNS.join(",")).map_err(ExportError::write(out))?;
    }
    walk::walk(trace, a, progress, &mut sink).map_err(|e| with_path(e, out))?;
    sink.out.flush().map_err(ExportError::write(out))?;
    Ok(Written { events: sink.rows, items: sink.rows })
}

fn with_path(e: ExportError, out: &Path) -> ExportError {
    match e {
        ExportError::Write { source, .. } => ExportError::Write { path: out.display().to_string(), source },
        e => e,
    }
}

impl<W: Write> Sink for TextSink<W> {
    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), ExportError> {
        let Some(r) = row(event, tables) else { return Ok(()) };
        self.rows += 1;
        let io = |source| ExportError::Write { path: String::new(), source };
        match self.format {
            Text::Jsonl => {
                serde_json::to_writer(&mut self.out, &r).map_err(|e| io(e.into()))?;
                self.out.write_all(b"\n").map_err(io)
            }
            Text::Csv => {
                csv_line(&r, &mut self.line);
                self.out.write_all(self.line.as_bytes()).map_err(io)
            }
        }
    }
}

fn csv_line(r: &Row, line: &mut String) {
    use std::fmt::Write as _;
    line.clear();
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let o32 = |v: Option<u32>| v.map_or(String::new(), |v| v.to_string());
    let _ = write!(
        line,
        "{},{},{},{},{},{},{},{},{},",
        r.seq,
        r.kind,
        r.ts_ns,
        r.rel_ns,
        opt(r.dur_ns),
        r.tid,
        o32(r.ubatch),
        r.phase.unwrap_or(""),
        o32(r.token_index)
    );
    push_field(line, &r.name);
    let _ = write!(line, ",{},", o32(r.layer));
    push_field(line, r.dst.as_deref().unwrap_or(""));
    let _ = write!(line, ",{},", r.dst_memory.unwrap_or(""));
    push_field(line, r.srcs.as_deref().unwrap_or(""));
    let _ = write!(
        line,
        ",{},{},{},{},{},{},{},{},{},",
        r.n_srcs,
        r.weights_file,
        r.weights_copy,
        r.weight_bytes,
        o32(r.ith),
        o32(r.nth),
        opt(r.address),
        opt(r.ip),
        opt(r.error_code)
    );
    push_field(line, r.fault_tensor.as_deref().unwrap_or(""));
    let _ =
        write!(line, ",{},{},{},{},{},", opt(r.file_offset), opt(r.op_seq), o32(r.dev), opt(r.sector), opt(r.io_bytes));
    push_field(line, r.rwbs.as_deref().unwrap_or(""));
    line.push('\n');
}

/// RFC 4180 quoting: tensor names may hold commas or quotes (`x (view)`).
fn push_field(line: &mut String, s: &str) {
    if s.contains([',', '"', '\n', '\r']) {
        line.push('"');
        line.push_str(&s.replace('"', "\"\""));
        line.push('"');
    } else {
        line.push_str(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_every_column_and_quotes() {
        let r = Row { kind: "op", name: "MUL_MAT".into(), dst: Some("a,\"b\"".into()), ..Default::default() };
        let mut line = String::new();
        csv_line(&r, &mut line);
        assert!(line.contains("\"a,\"\"b\"\"\""));
        let unquoted = line.replace("\"a,\"\"b\"\"\"", "x");
        assert_eq!(unquoted.trim_end().split(',').count(), COLUMNS.len());
    }
}
