//! `dot`: the graph one ubatch executed, for Graphviz (`dot -Tsvg`). Nodes
//! are tensors (by `ggml_tensor` address; ops label their output), edges run
//! source → output, and the fill colour is the memory class of the data:
//! blue model file mapping, orange copy of a model tensor, grey anonymous
//! (KV cache, compute buffers), green another file, white unmapped.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path};

use indicatif::ProgressBar;

use super::{ExportError, Written};
use crate::analyze::{
    tensor::{memory_class, view_bytes},
    walk::{self, Event, Sink, Tables},
};
use crate::{analyze::Analysis, format::Descriptor};

struct Node {
    label: String,
    memory: &'static str,
    op: Option<String>,
}

struct DotSink {
    ubatch: u32,
    nodes: BTreeMap<u64, Node>,
    edges: BTreeMap<(u64, u64), ()>,
    ops: u64,
}

pub fn write(
    trace: &Path,
    a: &Analysis,
    out: &Path,
    ubatch: Option<u32>,
    progress: &ProgressBar,
) -> Result<Written, ExportError> {
    // Default: the first generate ubatch, the graph of one generated token.
    let ubatch = ubatch
        .or_else(|| a.ubatches.iter().find(|u| u.phase == crate::analyze::Phase::Generate).map(|u| u.index))
        .or_else(|| a.ubatches.first().map(|u| u.index))
        .ok_or_else(|| ExportError::Invalid("the trace has no ubatch graphs".into()))?;
    if ubatch as usize >= a.ubatches.len() {
        return Err(ExportError::Invalid(format!(
            "--ubatch {ubatch}: the trace has {} ubatches (0..{})",
            a.ubatches.len(),
            a.ubatches.len().saturating_sub(1)
        )));
    }
    let mut sink = DotSink { ubatch, nodes: BTreeMap::new(), edges: BTreeMap::new(), ops: 0 };
    walk::walk(trace, a, progress, &mut sink)?;
    let u = &a.ubatches[ubatch as usize];
    let mut s = String::new();
    let _ = writeln!(s, "digraph ubatch_{ubatch} {{");
    let _ = writeln!(
        s,
        "  label=\"ubatch {ubatch} ({:?}, tokens {:?}): {} ops\"; labelloc=t; rankdir=TB;",
        u.phase, u.token_ids, sink.ops
    );
    let _ = writeln!(s, "  node [shape=box, style=filled, fontname=\"monospace\", fontsize=10];");
    for (addr, n) in &sink.nodes {
        let (fill, shape) = (colour(n.memory), if n.op.is_some() { "box" } else { "ellipse" });
        let label = match &n.op {
            Some(op) => format!("{op}\\n{}", n.label),
            None => n.label.clone(),
        };
        let _ = writeln!(s, "  t{addr:x} [label=\"{}\", fillcolor=\"{fill}\", shape={shape}];", escape(&label));
    }
    for (src, dst) in sink.edges.keys() {
        let _ = writeln!(s, "  t{src:x} -> t{dst:x};");
    }
    s.push_str("}\n");
    fs::write(out, s).map_err(ExportError::write(out))?;
    Ok(Written { events: progress.position(), items: sink.nodes.len() as u64 })
}

fn colour(memory: &str) -> &'static str {
    match memory {
        "model_file" => "#9ecae1",
        "copy" => "#fdae6b",
        "anon" => "#d9d9d9",
        "other_file" => "#a1d99b",
        _ => "#ffffff",
    }
}

fn escape(s: &str) -> String {
    s.replace('"', "\\\"")
}

fn label(d: &Descriptor) -> String {
    let dims: Vec<String> = d.ne.iter().map(|n| n.to_string()).collect();
    let bytes = view_bytes(d).map_or_else(|| "? B".into(), |b| format!("{b} B"));
    format!("{}\\n[{}] {}", d.name, dims.join("x"), bytes)
}

impl Sink for DotSink {
    type Error = ExportError;

    fn event(&mut self, event: &Event, t: &Tables) -> Result<(), ExportError> {
        let Event::Op(e) = event else { return Ok(()) };
        if e.ctx.ubatch != Some(self.ubatch) {
            return Ok(());
        }
        let dst = t.descriptor(e.op.dst);
        // With --all-threads each node appears once per worker: count it once.
        if self.nodes.get(&dst.tensor).is_some_and(|n| n.op.is_some()) {
            return Ok(());
        }
        self.ops += 1;
        self.nodes.insert(
            dst.tensor,
            Node { label: label(dst), memory: memory_class(&dst.memory), op: Some(t.op_name(&e.op)) },
        );
        for &(_, id) in e.op.srcs.iter() {
            let src = t.descriptor(id);
            self.nodes.entry(src.tensor).or_insert_with(|| Node {
                label: label(src),
                memory: memory_class(&src.memory),
                op: None,
            });
            self.edges.insert((src.tensor, dst.tensor), ());
        }
        Ok(())
    }
}
