//! `tokens-json`: a directory in the layout the thesis web UI reads.
//!
//! - `token-00000.json`, `token-00001.json`, …: one per *generated* token,
//!   i.e. per generate-phase ubatch in order (token-K is llama.cpp's eval
//!   run K+1); `entries` holds every op record of that ubatch.
//! - `prompt-00000.json`, …: the prompt ubatches in the same layout (a
//!   prompt ubatch evaluates several tokens: `token_id` is its last one,
//!   `token_ids` all of them). Warm-up and auxiliary graphs are not written.
//! - `memory-map.json`: the model's GGUF tensor table (first model).
//!
//! Per source, `bytes_read` (model tensors only) is what the op read: the
//! indexed rows of a GET_ROWS, the routed experts' slices of an MoE expert
//! tensor, else the view. `memory_source` is `DISK` when the tensor's data is inside the
//! model file mapping (`disk_offset` = tensor file offset + view offset) and
//! `BUFFER` otherwise, with `buffer_id` naming the memory class (`copy` of a
//! model tensor, `anon`, `other_file`, `unmapped`).

use std::{
    fs::{self, File},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use indicatif::ProgressBar;
use serde_json::{Value, json};
use tracer_common::markers;

use super::{ExportError, Written, rows::phase_name};
use crate::analyze::{
    tensor::{memory_class, model_tensor, op_layer, view_bytes},
    walk::{self, Event, Sink, Tables, sources},
};
use crate::{
    analyze::{Analysis, Phase},
    format::{Descriptor, Memory},
};

pub const FORMAT_VERSION: u32 = 1;

struct TokenSink {
    dir: PathBuf,
    entries: Vec<Value>,
    files: u64,
    prompt_files: u32,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    fs::create_dir_all(out).map_err(ExportError::write(out))?;
    let mut sink = TokenSink { dir: out.to_path_buf(), entries: Vec::new(), files: 0, prompt_files: 0 };
    walk::walk(trace, a, progress, &mut sink)?;
    if let Some(model) = a.models.first() {
        let tensors: Vec<Value> = model
            .tensors
            .iter()
            .map(|t| {
                json!({"name": t.name, "offset_start": t.file_offset, "offset_end": t.file_offset + t.size_bytes,
                       "size_bytes": t.size_bytes, "shape": t.shape, "dtype": t.type_name, "layer_id": t.layer,
                       "category": t.component, "file": model.files.get(t.file as usize)})
            })
            .collect();
        let map = json!({"format_version": FORMAT_VERSION, "model": model.files.first(), "files": model.files,
                         "architecture": model.architecture, "total_tensors": tensors.len(),
                         "total_size_bytes": model.tensors.iter().map(|t| t.size_bytes).sum::<u64>(),
                         "tensors": tensors});
        write_json(&out.join("memory-map.json"), &map)?;
    }
    Ok(Written { events: progress.position(), items: sink.files })
}

fn write_json(path: &Path, v: &Value) -> Result<(), ExportError> {
    let file = File::create(path).map_err(ExportError::write(path))?;
    let mut w = BufWriter::new(file);
    serde_json::to_writer(&mut w, v)
        .map_err(|e| ExportError::Write { path: path.display().to_string(), source: e.into() })?;
    w.flush().map_err(ExportError::write(path))
}

impl Sink for TokenSink {
    type Error = ExportError;

    fn event(&mut self, event: &Event, t: &Tables) -> Result<(), ExportError> {
        match event {
            Event::Op(e) => {
                let Some(u) = e.ctx.ubatch.and_then(|u| t.analysis.ubatches.get(u as usize)) else { return Ok(()) };
                if !matches!(u.phase, Phase::Generate | Phase::Prompt) {
                    return Ok(());
                }
                let dst = t.descriptor(e.op.dst);
                let srcs = sources(&e.op, t);
                let slotted: Vec<(u32, &Descriptor)> =
                    e.op.srcs.iter().map(|&(s, _)| s).zip(srcs.iter().copied()).collect();
                let layer = op_layer(t.models, dst, &srcs);
                let op_name = t.op_name(&e.op);
                let sources: Vec<Value> = slotted
                    .iter()
                    .map(|&(slot, d)| {
                        let mut s = json!({"name": d.name, "tensor_ptr": format!("{:#x}", d.data),
                                           "size_bytes": view_bytes(d), "layer_id": layer});
                        if let Some(read) = t.weight_read(&op_name, e.ctx.ubatch, (slot, d), &slotted) {
                            s["bytes_read"] = json!(read.bytes);
                        }
                        match d.memory {
                            Memory::ModelFile { model, tensor, offset } => {
                                let mt = model_tensor(t.models, model, tensor);
                                s["layer_id"] = json!(mt.and_then(|m| m.layer).or(layer));
                                s["memory_source"] = json!("DISK");
                                s["disk_offset"] = json!(mt.map(|m| m.file_offset + offset));
                                s["model_tensor"] = json!(mt.map(|m| &m.name));
                            }
                            m => {
                                if let Memory::Copy { model, tensor } = m {
                                    let mt = model_tensor(t.models, model, tensor);
                                    s["layer_id"] = json!(mt.and_then(|m| m.layer).or(layer));
                                    s["model_tensor"] = json!(mt.map(|m| &m.name));
                                }
                                s["memory_source"] = json!("BUFFER");
                                s["buffer_id"] = json!(memory_class(&m));
                            }
                        }
                        s
                    })
                    .collect();
                let rel_ms = e.op.ts_ns.saturating_sub(u.start_ns) as f64 / 1e6;
                self.entries.push(json!({
                    "entry_id": self.entries.len(), "timestamp_ns": e.op.ts_ns, "timestamp_relative_ms": rel_ms,
                    "token_id": u.token_ids.last(), "layer_id": layer, "thread_id": e.op.tid,
                    "phase": phase_name(u.phase), "operation_type": op_name, "dst_name": dst.name,
                    "num_sources": sources.len(), "sources": sources,
                    "duration_ns": e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns)),
                }));
            }
            Event::Marker(ctx, m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                let Some(index) = ctx.ubatch else { return Ok(()) };
                let Some(u) = t.analysis.ubatches.get(index as usize) else { return Ok(()) };
                let name = match (u.phase, t.token_index(Some(index))) {
                    (Phase::Generate, Some(k)) => format!("token-{k:05}.json"),
                    (Phase::Prompt, _) => {
                        self.prompt_files += 1;
                        format!("prompt-{:05}.json", self.prompt_files - 1)
                    }
                    _ => {
                        self.entries.clear();
                        return Ok(());
                    }
                };
                let entries = std::mem::take(&mut self.entries);
                let doc = json!({
                    "token_id": u.token_ids.last(), "token_ids": u.token_ids, "ubatch": index,
                    "phase": phase_name(u.phase), "token_index": t.token_index(Some(index)),
                    "metadata": {"total_entries": entries.len(),
                                 "duration_ms": m.ts_ns.saturating_sub(u.start_ns) as f64 / 1e6,
                                 "timestamp_start_ns": u.start_ns, "format_version": FORMAT_VERSION},
                    "entries": entries,
                });
                write_json(&self.dir.join(name), &doc)?;
                self.files += 1;
            }
            _ => {}
        }
        Ok(())
    }
}
