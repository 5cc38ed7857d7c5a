//! Each table's rows for one run, from the analysis and the report's
//! figures: the same numbers `ttrace report --json` prints.

use indicatif::ProgressBar;

use super::{
    RunInfo,
    schema::{Table, VERSION},
    table::{TableRows, Value, i32_of, i64_of},
};
use crate::{
    analyze::{
        Analysis, Phase,
        diff::{self, Run},
        io::{IoCorrelator, TensorBytes},
        sequences::TokenKind,
        stats::Stats,
        usage::{Figures, PERIODS, Period},
        walk::{self, Event, Sink, Tables},
    },
    export::{ExportError, rows},
};

fn text(s: impl Into<String>) -> Option<Value> {
    Some(Value::Text(s.into()))
}

fn phase(p: Phase) -> Option<Value> {
    text(rows::phase_name(p))
}

fn period_name(p: Period) -> &'static str {
    match p {
        Period::Load => "load",
        Period::Warmup => "warmup",
        Period::Prompt => "prompt",
        Period::Generate => "generate",
        Period::Other => "other",
    }
}

/// The `runs` row: parameters always, figures when the run was traced.
pub fn runs(info: &RunInfo, traced: Option<(&Analysis, &Stats)>) -> Result<TableRows, ExportError> {
    let p = &info.params;
    let mut t = TableRows::new(Table::Runs);
    let mut cells = vec![
        ("schema_version", Some(Value::I32(VERSION))),
        ("status", text(if info.error.is_none() { "ok" } else { "failed" })),
        ("error", info.error.clone().map(Value::Text)),
        ("model_path", text(&p.model_path)),
        ("domain", text(&p.domain)),
        ("prompt", text(&p.prompt)),
        ("threads", Some(i32_of(p.threads))),
        ("mem_limit_bytes", p.mem_limit_bytes.map(i64_of)),
        ("cache", text(&p.cache)),
        ("repeat", Some(i32_of(p.repeat))),
        ("n_predict", Some(i32_of(p.n_predict))),
        ("command", text(p.command.join(" "))),
        ("clients", p.clients.map(i32_of)),
        ("host", text(&info.host)),
        ("started_unix_ms", Some(i64_of(info.started_unix_ms))),
        ("trace", text(&info.trace)),
        ("llama_load_ms", info.llama.load_ms.map(Value::F64)),
        ("llama_prompt_tokens", info.llama.prompt_tokens.map(i64_of)),
        ("llama_prompt_ms", info.llama.prompt_ms.map(Value::F64)),
        ("llama_eval_runs", info.llama.eval_runs.map(i64_of)),
        ("llama_eval_ms", info.llama.eval_ms.map(Value::F64)),
        ("cgroup_peak_bytes", info.cgroup_peak_bytes.map(i64_of)),
        ("cgroup_limit_hits", info.cgroup_limit_hits.map(i64_of)),
    ];
    if let Some((a, stats)) = traced {
        let facts = diff::facts(&Run { path: info.trace.clone(), analysis: a, stats });
        let total = stats.loaded_vs_used.as_ref().map(|u| &u.total);
        let skipped = a.trailer.as_ref().map_or(0, |t| t.skipped.total());
        cells.extend([
            ("prompt_tokens", Some(i64_of(a.tokens.as_ref().map_or(a.prompt_tokens, |t| t.prompt)))),
            ("generated_tokens", Some(i64_of(facts.generated_tokens))),
            ("duration_ns", Some(i64_of(a.duration_ns()))),
            ("ops", Some(i64_of(a.ops))),
            ("tokens_per_s", crate::analyze::sweep::tokens_per_s(stats).map(Value::F64)),
            ("weight_bytes_per_token", Some(Value::F64(facts.weight_bytes_per_token))),
            ("disk_bytes_per_token", facts.disk_bytes_per_token.map(Value::F64)),
            ("disk_bytes", Some(i64_of(a.io.disk.bytes))),
            ("faults_model", Some(i64_of(a.io.faults.model_file))),
            ("faults_major", Some(i64_of(a.io.faults.major))),
            ("faults_minor", Some(i64_of(a.io.faults.minor))),
            ("loaded_bytes", total.map(|f| i64_of(f.loaded))),
            ("used_bytes", total.map(|f| i64_of(f.used))),
            ("loaded_unused_bytes", total.map(|f| i64_of(f.loaded_unused))),
            ("lost_events", Some(i64_of(a.lost.total() + skipped))),
        ]);
    }
    t.push(&cells)?;
    Ok(t)
}

pub fn ubatches(stats: &Stats) -> Result<TableRows, ExportError> {
    let mut t = TableRows::new(Table::Ubatches);
    for u in &stats.ubatches {
        t.push(&[
            ("ubatch", Some(i32_of(u.index))),
            ("phase", text(u.phase.map_or("aux", rows::phase_name))),
            ("token_index", u.token_index.map(i32_of)),
            ("n_tokens", Some(Value::I32(u.token_ids.len() as i32))),
            ("start_ns", Some(i64_of(u.start_ns))),
            ("duration_ns", Some(i64_of(u.duration_ns))),
            ("ops", Some(i64_of(u.ops))),
            ("weight_bytes", Some(i64_of(u.weight_bytes))),
            ("disk_bytes", u.disk_bytes.map(i64_of)),
            ("faults_major", u.faults_major.map(i64_of)),
            ("faults_minor", u.faults_minor.map(i64_of)),
        ])?;
    }
    Ok(t)
}

pub fn tokens(a: &Analysis) -> Result<TableRows, ExportError> {
    let mut t = TableRows::new(Table::Tokens);
    let token_of = walk::token_indices(a);
    for u in &a.ubatches {
        let n = u.token_ids.len().max(u.tokens.len());
        for row in 0..n {
            let info = u.tokens.get(row);
            let kind = info.map(|i| match i.kind {
                TokenKind::Prompt => "prompt",
                TokenKind::Generated => "generated",
                TokenKind::Warmup => "warmup",
            });
            t.push(&[
                ("ubatch", Some(i32_of(u.index))),
                ("row", Some(Value::I32(row as i32))),
                ("phase", phase(u.phase)),
                ("token_index", token_of.get(u.index as usize).copied().flatten().map(i32_of)),
                ("token_id", u.token_ids.get(row).map(|&id| Value::I32(id))),
                ("seq", info.map(|i| Value::I32(i.seq))),
                ("pos", info.and_then(|i| i.pos).map(Value::I32)),
                ("kind", kind.and_then(text)),
                ("output", info.map(|i| Value::Bool(i.output))),
            ])?;
        }
    }
    Ok(t)
}

pub fn tensors(stats: &Stats) -> Result<TableRows, ExportError> {
    let mut t = TableRows::new(Table::Tensors);
    let Some(usage) = &stats.loaded_vs_used else { return Ok(t) };
    let charged: std::collections::HashMap<(u32, u32), u64> =
        stats.tensors.iter().map(|s| ((s.model, s.tensor), s.generate_weight_bytes)).collect();
    let row = |t: &mut TableRows, name: &str, layer: Option<u32>, period: &str, f: &Figures, b: Bytes| {
        t.push(&[
            ("tensor", text(name)),
            ("layer", layer.map(i32_of)),
            ("period", text(period)),
            ("size_bytes", Some(i64_of(f.size_bytes))),
            ("loaded_bytes", Some(i64_of(b.loaded))),
            ("disk_bytes", Some(i64_of(b.disk))),
            ("used_bytes", Some(i64_of(b.used))),
            ("disk_read_bytes", Some(i64_of(b.disk_read))),
            ("faults", Some(i64_of(b.faults))),
            ("loaded_unused_bytes", b.loaded_unused.map(i64_of)),
            ("generate_weight_bytes", b.charged.map(i64_of)),
        ])
    };
    for tu in &usage.tensors {
        let f = &tu.figures;
        let whole = Bytes {
            loaded: f.loaded,
            disk: f.disk,
            used: f.used,
            disk_read: f.disk_read,
            faults: f.faults,
            loaded_unused: Some(f.loaded_unused),
            charged: Some(charged.get(&(tu.model, tu.tensor)).copied().unwrap_or(0)),
        };
        row(&mut t, &tu.name, tu.layer, "run", f, whole)?;
        for p in PERIODS {
            let Some(b) = f.periods.get(&p) else { continue };
            let bytes = Bytes {
                loaded: b.loaded,
                disk: b.disk,
                used: b.used,
                disk_read: b.disk_read,
                faults: b.faults,
                loaded_unused: None,
                charged: None,
            };
            row(&mut t, &tu.name, tu.layer, period_name(p), f, bytes)?;
        }
    }
    Ok(t)
}

#[derive(Clone, Copy)]
struct Bytes {
    loaded: u64,
    disk: u64,
    used: u64,
    disk_read: u64,
    faults: u64,
    loaded_unused: Option<u64>,
    charged: Option<u64>,
}

pub fn routing(a: &Analysis) -> Result<TableRows, ExportError> {
    let mut t = TableRows::new(Table::Routing);
    let token_of = walk::token_indices(a);
    for u in &a.ubatches {
        for r in &u.routing {
            let Some(layer) = r.layer else { continue };
            for (rank, &expert) in r.selected.iter().enumerate() {
                t.push(&[
                    ("ubatch", Some(i32_of(u.index))),
                    ("phase", phase(u.phase)),
                    ("token_index", token_of.get(u.index as usize).copied().flatten().map(i32_of)),
                    ("row", Some(i32_of(r.row))),
                    ("layer", Some(i32_of(layer))),
                    ("rank", Some(Value::I32(rank as i32))),
                    ("expert", Some(Value::I32(expert))),
                ])?;
            }
        }
    }
    Ok(t)
}

/// The `io` rows: pass two over the trace, keeping the I/O events' rows.
pub fn io(trace: &std::path::Path, a: &Analysis) -> Result<TableRows, ExportError> {
    let mut sink = IoSink { rows: TableRows::new(Table::Io), files: IoCorrelator::default() };
    for (m, table) in a.models.iter().enumerate() {
        sink.files.on_model(m as u32, table);
    }
    walk::walk(trace, a, &ProgressBar::hidden(), &mut sink)?;
    Ok(sink.rows)
}

struct IoSink {
    rows: TableRows,
    /// The model files' extents: which tensor a block request read.
    files: IoCorrelator,
}

impl IoSink {
    /// The first tensor a block request read (as the blkparse export names
    /// it) and the file offset where the request starts.
    fn block_target<'t>(
        &self,
        b: &crate::format::reader::Block,
        tables: &Tables<'t>,
    ) -> (Option<&'t str>, Option<u64>) {
        let hits = self.files.tensors_of(b.dev, b.sector, b.nr_sector);
        let Some((named, file_offset)) = TensorBytes::naming(&hits) else { return (None, None) };
        let name = tables.models.get(named.model as usize).and_then(|m| m.tensors.get(named.tensor as usize));
        (name.map(|t| t.name.as_str()), Some(file_offset))
    }
}

impl Sink for IoSink {
    type Error = ExportError;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), ExportError> {
        if !matches!(event, Event::Fault(_) | Event::PageCache(..) | Event::Block(..)) {
            return Ok(());
        }
        let Some(c) = rows::cells(event, tables) else { return Ok(()) };
        let (tensor, file_offset) = match event {
            Event::Block(_, b) => self.block_target(b, tables),
            _ => (c.fault_tensor, c.file_offset),
        };
        self.rows.push(&[
            ("seq", Some(i64_of(c.seq))),
            ("kind", text(c.kind)),
            ("ts_ns", Some(i64_of(c.ts_ns))),
            ("tid", Some(i32_of(c.tid))),
            ("ubatch", c.ubatch.map(i32_of)),
            ("phase", c.phase.and_then(text)),
            ("token_index", c.token_index.map(i32_of)),
            ("name", text(c.name.as_ref())),
            ("address", c.address.map(i64_of)),
            ("tensor", tensor.and_then(text)),
            ("file_offset", file_offset.map(i64_of)),
            ("op_seq", c.op_seq.map(i64_of)),
            ("sector", c.sector.map(i64_of)),
            ("io_bytes", c.io_bytes.map(i64_of)),
            ("rwbs", c.rwbs.and_then(text)),
        ])
    }
}
