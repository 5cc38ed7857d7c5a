//! `tokens-json`: a directory in the layout the thesis web UI
//! (ErsjanKeri/BSC, `tensor-tracing/webui`) loads from its `public/data/`,
//! with the fields of its `src/types/data.ts`; ttrace's own fields sit
//! beside them.
//!
//! - `memory-map.json`: the first model's GGUF tensor table, expert tensors
//!   as one entry per expert ([`memory_map`]).
//! - `traces/token-00000.json`, …: one per *generated* token, i.e. per
//!   generate-phase ubatch in order (token-K is llama.cpp's eval run K+1);
//!   `entries` holds every op record of that ubatch.
//! - `graphs/token-00000.json`, …: the graph that ubatch executed ([`graph`]).
//! - `traces/prompt-00000.json`, `graphs/prompt-00000.json`, …: the prompt
//!   ubatches, in the same layout. The UI opens `token-*` only; a prompt
//!   ubatch evaluates several tokens (`token_id` is its last one,
//!   `token_ids` all of them). Warm-up and auxiliary graphs are not written.
//! - `buffer-timeline.json`: ggml's backend buffers, when the trace has
//!   them ([`crate::export::buffers::timeline`]); the UI loads it if there.
//!
//! Per source, `bytes_read` (model tensors only) is what the op read: the
//! indexed rows of a GET_ROWS, the routed experts' slices of an MoE expert
//! tensor, else the view. `memory_source` is `DISK` when the tensor's data is
//! inside the model file mapping (`disk_offset` = tensor file offset + view
//! offset) and `BUFFER` otherwise; `memory_class` names the memory (`copy`
//! of a model tensor, `anon`, `other_file`, `unmapped`). An op that read
//! routed experts lists them in `expert_ids`, which the UI's heatmap maps
//! to the memory map's per-expert entries.
//!
//! `timestamp_relative_ms` counts from the ubatch's first entry
//! (`metadata.timestamp_start_ns`), as the UI's `data.ts` says;
//! `duration_ms` runs from the ubatch's start (`ubatch_start_ns`) to its
//! graph's return. Graph capture (the default) records no time per op:
//! every entry has its graph's start, so the UI's timeline shows one
//! instant per token. `ttrace run --op-timing` times each op.
//!
//! Output is written as bytes (the keys sorted, as `serde_json`'s maps had
//! them): each op shape's fields and each distinct graph are encoded once,
//! and worker threads ([`files`]) assemble and write the files while the
//! walk reads on.

mod category;
mod entry;
mod files;
mod graph;
pub mod memory_map;

use std::{
    fmt,
    fs::{self, File},
    io::{BufWriter, Write},
    path::Path,
    sync::Arc,
};

use indicatif::ProgressBar;
use serde::Serialize;
use tracer_common::markers;

use super::{ExportError, Written, rows::phase_name, shape::OpShapes};
use crate::analyze::{
    Analysis, Phase, Ubatch,
    walk::{self, Event, OpEvent, Sink, Tables},
};
use entry::{Entry, EntryShape, RoutedExperts, Scope};
use files::{Header, Job, Writers};
use graph::{GraphCache, GraphOps};

/// In every file's metadata; a string, as the UI declares it.
pub const FORMAT_VERSION: &str = "ttrace-tokens-2";

/// Stand-in for an entry's `token_id` (a number to the UI) when the ubatch's
/// token ids were not captured.
const UNKNOWN_TOKEN: i32 = -1;

/// The name a ubatch's files share under `traces/` and `graphs/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stem {
    Token(u32),
    Prompt(u32),
}

impl fmt::Display for Stem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stem::Token(k) => write!(f, "token-{k:05}"),
            Stem::Prompt(k) => write!(f, "prompt-{k:05}"),
        }
    }
}

struct TokenSink<'w> {
    writers: &'w Writers,
    entries: Vec<Entry>,
    graph: GraphOps,
    graphs: GraphCache,
    shapes: OpShapes<Arc<EntryShape>>,
    /// The current ubatch's routed experts per layer.
    experts: Option<(u32, RoutedExperts)>,
    files: u64,
    prompt_files: u32,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    for dir in [out.to_path_buf(), out.join("traces"), out.join("graphs")] {
        fs::create_dir_all(&dir).map_err(ExportError::write(&dir))?;
    }
    let files = files::scope(out, |writers| {
        let mut sink = TokenSink {
            writers,
            entries: Vec::new(),
            graph: GraphOps::default(),
            graphs: GraphCache::default(),
            shapes: OpShapes::default(),
            experts: None,
            files: 0,
            prompt_files: 0,
        };
        walk::walk(trace, a, progress, &mut sink)?;
        Ok(sink.files)
    })?;
    if let Some(model) = a.models.first() {
        write_json(&out.join("memory-map.json"), &memory_map::build(model))?;
    }
    if let Some(timeline) = super::buffers::timeline(a) {
        write_json(&out.join("buffer-timeline.json"), &timeline)?;
    }
    Ok(Written { events: progress.position(), items: files })
}

fn write_json(path: &Path, v: &impl Serialize) -> Result<(), ExportError> {
    let file = File::create(path).map_err(ExportError::write(path))?;
    let mut w = BufWriter::new(file);
    serde_json::to_writer(&mut w, v)
        .map_err(|e| ExportError::Write { path: path.display().to_string(), source: e.into() })?;
    w.flush().map_err(ExportError::write(path))
}

/// Per layer, the experts the ubatch's tokens were routed to: the first
/// token's in rank order, then each new one as later tokens bring it.
fn routed_experts(u: &Ubatch) -> RoutedExperts {
    let mut by_layer = RoutedExperts::new();
    for r in &u.routing {
        let Some(layer) = r.layer else { continue };
        let experts = by_layer.entry(layer).or_default();
        for e in &r.selected {
            if !experts.contains(e) {
                experts.push(*e);
            }
        }
    }
    by_layer
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl TokenSink<'_> {
    fn entry(&mut self, e: &OpEvent, u: &Ubatch, t: &Tables) -> Entry {
        let shape = match self.shapes.get(&e.op, t.models.len()) {
            Some(shape) => shape.clone(),
            None => {
                let experts = match self.experts.take() {
                    Some((index, by_layer)) if index == u.index => (index, by_layer),
                    _ => (u.index, routed_experts(u)),
                };
                let (shape, scope) = entry::shape(e, t, &self.experts.insert(experts).1);
                let shape = Arc::new(shape);
                if scope == Scope::PerShape {
                    self.shapes.insert(&e.op, shape.clone());
                }
                shape
            }
        };
        Entry {
            shape,
            ts_ns: e.op.ts_ns,
            duration_ns: e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns)),
            tid: e.op.tid,
        }
    }

    /// The ubatch's two files, under the stem its phase gives it.
    fn finish(&mut self, index: u32, end_ns: u64, t: &Tables) -> Result<(), ExportError> {
        let entries = std::mem::take(&mut self.entries);
        let graph = std::mem::take(&mut self.graph);
        let Some(u) = t.analysis.ubatches.get(index as usize) else { return Ok(()) };
        let token_index = t.token_index(Some(index));
        let stem = match (u.phase, token_index) {
            (Phase::Generate, Some(k)) => Stem::Token(k),
            (Phase::Prompt, _) => {
                self.prompt_files += 1;
                Stem::Prompt(self.prompt_files - 1)
            }
            _ => return Ok(()),
        };
        let header = Header { phase: phase_name(u.phase), token_ids: u.token_ids.clone(), token_index, ubatch: index };
        let graph = self.graphs.bytes(graph, t);
        self.writers.send(Job { stem, header, entries, span: (u.start_ns, end_ns), graph })?;
        self.files += 1;
        Ok(())
    }
}

impl Sink for TokenSink<'_> {
    type Error = ExportError;

    fn event(&mut self, event: &Event, t: &Tables) -> Result<(), ExportError> {
        match event {
            Event::Op(e) => {
                let Some(u) = e.ctx.ubatch.and_then(|u| t.analysis.ubatches.get(u as usize)) else { return Ok(()) };
                if matches!(u.phase, Phase::Generate | Phase::Prompt) {
                    let entry = self.entry(e, u, t);
                    self.entries.push(entry);
                    self.graph.note(&e.op, t);
                }
            }
            Event::Marker(ctx, m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                if let Some(index) = ctx.ubatch {
                    self.finish(index, m.ts_ns, t)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems() {
        assert_eq!(Stem::Token(7).to_string(), "token-00007");
        assert_eq!(Stem::Prompt(0).to_string(), "prompt-00000");
    }
}
