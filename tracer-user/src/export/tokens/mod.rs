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
//! - No `buffer-timeline.json`: ttrace does not record ggml's backend
//!   buffer allocations, and the UI loads that file only if it is there.
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

mod category;
pub mod graph;
pub mod memory_map;

use std::{
    collections::BTreeMap,
    fmt,
    fs::{self, File},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::{Value, json};
use tracer_common::markers;

use super::{ExportError, Written, rows::phase_name};
use crate::analyze::{
    tensor::{memory_class, model_tensor, op_layer, view_bytes, weight_of},
    walk::{self, Event, OpEvent, Sink, Tables, WeightRead, sources},
};
use crate::{
    analyze::{Analysis, Phase, Ubatch},
    format::Descriptor,
};

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

struct TokenSink {
    dir: PathBuf,
    entries: Vec<Value>,
    graph: graph::UbatchGraph,
    /// The current ubatch's routed experts per layer.
    experts: Option<(u32, BTreeMap<u32, Vec<i32>>)>,
    files: u64,
    prompt_files: u32,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    for dir in [out.to_path_buf(), out.join("traces"), out.join("graphs")] {
        fs::create_dir_all(&dir).map_err(ExportError::write(&dir))?;
    }
    let mut sink = TokenSink {
        dir: out.to_path_buf(),
        entries: Vec::new(),
        graph: graph::UbatchGraph::default(),
        experts: None,
        files: 0,
        prompt_files: 0,
    };
    walk::walk(trace, a, progress, &mut sink)?;
    if let Some(model) = a.models.first() {
        write_json(&out.join("memory-map.json"), &memory_map::build(model))?;
    }
    Ok(Written { events: progress.position(), items: sink.files })
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
fn routed_experts(u: &Ubatch) -> BTreeMap<u32, Vec<i32>> {
    let mut by_layer: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
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

/// `fields` added to the object `header`.
fn merged(header: &Value, fields: Value) -> Value {
    let mut doc = header.clone();
    if let (Some(doc), Value::Object(fields)) = (doc.as_object_mut(), fields) {
        doc.extend(fields);
    }
    doc
}

impl TokenSink {
    fn entry(&mut self, e: &OpEvent, u: &Ubatch, t: &Tables) -> Value {
        if self.experts.as_ref().is_none_or(|(index, _)| *index != u.index) {
            self.experts = Some((u.index, routed_experts(u)));
        }
        let dst = t.descriptor(e.op.dst);
        let srcs = sources(&e.op, t);
        let slotted: Vec<(u32, &Descriptor)> = e.op.srcs.iter().map(|&(s, _)| s).zip(srcs.iter().copied()).collect();
        let layer = op_layer(t.models, dst, &srcs);
        let op_name = t.op_name(&e.op);
        let reads: Vec<Option<WeightRead>> =
            slotted.iter().map(|&source| t.weight_read(&op_name, e.ctx.ubatch, source, &slotted)).collect();
        let sources: Vec<Value> = slotted
            .iter()
            .zip(&reads)
            .map(|(&(_, d), read)| {
                let mut s = json!({"name": d.name, "tensor_ptr": format!("{:#x}", d.data),
                                   "size_bytes": view_bytes(d), "layer_id": layer,
                                   "memory_class": memory_class(&d.memory)});
                if let Some(read) = read {
                    s["bytes_read"] = json!(read.bytes);
                }
                let weight = weight_of(d);
                let mt = weight.and_then(|w| model_tensor(t.models, w.model, w.tensor));
                if let Some(mt) = mt {
                    s["layer_id"] = json!(mt.layer.or(layer));
                    s["model_tensor"] = json!(mt.name);
                }
                match weight {
                    Some(w) if !w.copy => {
                        s["memory_source"] = json!("DISK");
                        if let Some(mt) = mt {
                            s["disk_offset"] = json!(mt.file_offset + w.offset);
                        }
                    }
                    _ => s["memory_source"] = json!("BUFFER"),
                }
                s
            })
            .collect();
        // An MoE op reading routed experts: the experts of its layer.
        let expert_ids = self.experts.as_ref().and_then(|(_, by_layer)| {
            let w = reads.iter().flatten().find(|r| r.routed)?.weight;
            by_layer.get(&model_tensor(t.models, w.model, w.tensor)?.layer?)
        });
        let mut entry = json!({
            "entry_id": self.entries.len(), "timestamp_ns": e.op.ts_ns,
            "token_id": u.token_ids.last().copied().unwrap_or(UNKNOWN_TOKEN), "layer_id": layer,
            "thread_id": e.op.tid, "phase": phase_name(u.phase), "operation_type": op_name, "dst_name": dst.name,
            "num_sources": sources.len(), "sources": sources,
            "duration_ns": e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns)),
        });
        if let Some(ids) = expert_ids {
            entry["expert_ids"] = json!(ids);
            entry["num_experts"] = json!(ids.len());
        }
        entry
    }

    /// The ubatch's two files, under the stem its phase gives it.
    fn finish(&mut self, index: u32, end_ns: u64, t: &Tables) -> Result<(), ExportError> {
        let mut entries = std::mem::take(&mut self.entries);
        let (metadata, nodes, edges) = self.graph.take();
        let Some(u) = t.analysis.ubatches.get(index as usize) else { return Ok(()) };
        let stem = match (u.phase, t.token_index(Some(index))) {
            (Phase::Generate, Some(k)) => Stem::Token(k),
            (Phase::Prompt, _) => {
                self.prompt_files += 1;
                Stem::Prompt(self.prompt_files - 1)
            }
            _ => return Ok(()),
        };
        // Times count from the first entry, as the UI's timeline does: at 0
        // it shows that entry's reads (under graph capture, all of them).
        let first = entries.iter().filter_map(|e| e["timestamp_ns"].as_u64()).min().unwrap_or(u.start_ns);
        for e in &mut entries {
            let ts = e["timestamp_ns"].as_u64().unwrap_or(first);
            e["timestamp_relative_ms"] = json!(ms(ts - first));
        }
        let header = json!({
            "token_id": u.token_ids.last(), "token_ids": u.token_ids, "ubatch": index,
            "phase": phase_name(u.phase), "token_index": t.token_index(Some(index)),
        });
        let trace = merged(
            &header,
            json!({
                "metadata": {"total_entries": entries.len(), "duration_ms": ms(end_ns.saturating_sub(u.start_ns)),
                             "timestamp_start_ns": first, "format_version": FORMAT_VERSION,
                             "ubatch_start_ns": u.start_ns},
                "entries": entries,
            }),
        );
        let graph = merged(&header, json!({"metadata": metadata, "nodes": nodes, "edges": edges}));
        write_json(&self.dir.join("traces").join(format!("{stem}.json")), &trace)?;
        write_json(&self.dir.join("graphs").join(format!("{stem}.json")), &graph)?;
        self.files += 1;
        Ok(())
    }
}

impl Sink for TokenSink {
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
