//! `graphs/<stem>.json`: the graph one ubatch executed, as the thesis UI's
//! computation-graph view reads it (`GraphData` in its `data.ts`). Nodes are
//! tensors by `ggml_tensor` address, numbered `node_0`, `node_1`, … in first
//! sighting order; edges run source → output, labelled `src i` by the slot.
//!
//! The UI names an edge `source-target`, so a pair is drawn once: an op
//! reading one tensor in two slots keeps the first slot's edge.
//!
//! Graphs are written as bytes, built once per distinct graph
//! ([`GraphCache`]): files of a decode's tokens differ only in the ubatch's
//! own fields (`phase`, `token_id`, `token_ids`, `token_index`, `ubatch`),
//! which the writer appends.

use std::{
    collections::{HashMap, HashSet, hash_map::Entry},
    sync::Arc,
};

use super::category::Category;
use crate::{
    analyze::{
        tensor::{memory_class, model_tensor, name_layer, weight_of},
        walk::Tables,
    },
    export::{
        json_bytes::{hex, ints, n, num, string},
        shape::{FxMap, FxSet},
    },
    format::{Descriptor, Op},
    model::GgmlType,
};

/// The ops of one ubatch's graph that draw it: each output's first record
/// (with `--all-threads` every worker records the op), as `dst, n, (slot,
/// src) × n`. Two ubatches with the same ops (descriptor ids are interned,
/// so equal ids are equal tensors) draw the same graph.
#[derive(Default)]
pub struct GraphOps {
    ops: Vec<u32>,
    computed: FxSet<u64>,
}

impl GraphOps {
    pub fn note(&mut self, op: &Op, t: &Tables) {
        if !self.computed.insert(t.descriptor(op.dst).tensor) {
            return;
        }
        self.ops.push(op.dst);
        self.ops.push(op.srcs.len() as u32);
        for &(slot, id) in op.srcs.iter() {
            self.ops.extend([slot, id]);
        }
    }

    /// `(dst, [(slot, src)])` in order.
    fn each(&self) -> impl Iterator<Item = (u32, impl Iterator<Item = (u32, u32)> + '_)> {
        let mut rest = &self.ops[..];
        std::iter::from_fn(move || {
            let [dst, n, tail @ ..] = rest else { return None };
            let (srcs, after) = tail.split_at(2 * *n as usize);
            rest = after;
            Some((*dst, srcs.chunks_exact(2).map(|p| (p[0], p[1]))))
        })
    }
}

/// Encoded graphs by their ops: a decode graph repeats token after token,
/// so each is built and encoded once and its bytes are shared by every file
/// that draws it. Bounded: the cache starts over past [`Self::LIMIT`].
#[derive(Default)]
pub struct GraphCache {
    graphs: FxMap<(usize, Vec<u32>), Arc<[u8]>>,
}

impl GraphCache {
    const LIMIT: usize = 64;

    /// `{"edges":[…],"metadata":{…},"nodes":[…]`: the graph's part of its
    /// file, without the ubatch's fields and the closing brace.
    pub fn bytes(&mut self, ops: GraphOps, t: &Tables) -> Arc<[u8]> {
        // Model tables feed the nodes, so a new model makes a new key.
        let key = (t.models.len(), ops.ops);
        if let Some(bytes) = self.graphs.get(&key) {
            return bytes.clone();
        }
        let ops = GraphOps { ops: key.1, computed: FxSet::default() };
        let mut graph = UbatchGraph::default();
        for (dst, srcs) in ops.each() {
            graph.add(dst, srcs, t);
        }
        let bytes: Arc<[u8]> = graph.encode().into();
        if self.graphs.len() >= Self::LIMIT {
            self.graphs.clear();
        }
        self.graphs.insert((key.0, ops.ops), bytes.clone());
        bytes
    }
}

#[derive(Default)]
struct UbatchGraph {
    /// Tensor address → index in `nodes`.
    index: HashMap<u64, usize>,
    nodes: Vec<GraphNode>,
    /// (source, target, slot) by node index.
    edges: Vec<(usize, usize, u32)>,
    pairs: HashSet<(usize, usize)>,
}

struct GraphNode {
    address: u64,
    category: Category,
    dtype: String,
    label: String,
    layer_id: Option<u32>,
    // ttrace's own: where the data lives and, for weights, which GGUF tensor.
    memory_class: &'static str,
    model_tensor: Option<String>,
    operation: String,
    shape: Vec<i64>,
}

impl UbatchGraph {
    fn add(&mut self, dst: u32, srcs: impl Iterator<Item = (u32, u32)>, t: &Tables) {
        let target = self.node(t.descriptor(dst), t);
        for (slot, id) in srcs {
            let source = self.node(t.descriptor(id), t);
            if self.pairs.insert((source, target)) {
                self.edges.push((source, target, slot));
            }
        }
    }

    fn node(&mut self, d: &Descriptor, t: &Tables) -> usize {
        match self.index.entry(d.tensor) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                self.nodes.push(graph_node(d, t));
                *e.insert(self.nodes.len() - 1)
            }
        }
    }

    /// Keys sorted, as `serde_json`'s maps wrote them: edges (`label`,
    /// `source`, `target`), metadata (`layers`: highest `layer_id` + 1;
    /// `timestamp_generated`: the trace has no wall-clock time to give),
    /// nodes (`address` … `shape`, `model_tensor` for weights only).
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 * (self.nodes.len() + self.edges.len()));
        out.extend_from_slice(b"{\"edges\":[");
        for (i, &(source, target, slot)) in self.edges.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"label\":\"src ");
            num(&mut out, slot);
            out.extend_from_slice(b"\",\"source\":\"node_");
            num(&mut out, source);
            out.extend_from_slice(b"\",\"target\":\"node_");
            num(&mut out, target);
            out.extend_from_slice(b"\"}");
        }
        out.extend_from_slice(b"],\"metadata\":{\"layers\":");
        num(&mut out, self.nodes.iter().filter_map(|n| n.layer_id).max().map_or(0, |l| l + 1));
        out.extend_from_slice(b",\"timestamp_generated\":null,\"total_edges\":");
        num(&mut out, self.edges.len());
        out.extend_from_slice(b",\"total_nodes\":");
        num(&mut out, self.nodes.len());
        out.extend_from_slice(b"},\"nodes\":[");
        for (i, node) in self.nodes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            node.encode(i, &mut out);
        }
        out.push(b']');
        out
    }
}

impl GraphNode {
    fn encode(&self, i: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"address\":");
        hex(out, self.address);
        out.extend_from_slice(b",\"category\":");
        string(out, self.category.as_str());
        out.extend_from_slice(b",\"dtype\":");
        string(out, &self.dtype);
        out.extend_from_slice(b",\"id\":\"node_");
        num(out, i);
        out.extend_from_slice(b"\",\"label\":");
        string(out, &self.label);
        out.extend_from_slice(b",\"layer_id\":");
        n(out, self.layer_id);
        out.extend_from_slice(b",\"memory_class\":");
        string(out, self.memory_class);
        if let Some(name) = &self.model_tensor {
            out.extend_from_slice(b",\"model_tensor\":");
            string(out, name);
        }
        out.extend_from_slice(b",\"operation\":");
        string(out, &self.operation);
        out.extend_from_slice(b",\"shape\":");
        ints(out, &self.shape);
        out.push(b'}');
    }
}

fn graph_node(d: &Descriptor, t: &Tables) -> GraphNode {
    let weight = weight_of(d).and_then(|w| model_tensor(t.models, w.model, w.tensor));
    let (layer_id, category) = match weight {
        Some(w) => (w.layer, Category::of_weight_node(&w.name)),
        None => (name_layer(&d.name), Category::of_node_name(&d.name)),
    };
    GraphNode {
        address: d.tensor,
        label: d.name.clone(),
        operation: t.analysis.op_name(d.op),
        shape: shape(&d.ne),
        dtype: dtype(d.type_id),
        layer_id,
        category,
        memory_class: memory_class(&d.memory),
        model_tensor: weight.map(|w| w.name.clone()),
    }
}

/// ggml's `ne` without trailing 1s (`[2048, 14]`, not `[2048, 14, 1, 1]`).
fn shape(ne: &[i64; 4]) -> Vec<i64> {
    let rank = ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1);
    ne[..rank].to_vec()
}

/// ggml's lower-case type name (`f32`, `q4_k`).
fn dtype(type_id: i32) -> String {
    match u32::try_from(type_id).ok().and_then(GgmlType::from_id) {
        Some(t) => t.name.to_ascii_lowercase(),
        None => format!("type{type_id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_types() {
        assert_eq!(shape(&[2048, 14, 1, 1]), [2048, 14]);
        assert_eq!(shape(&[1, 1, 1, 1]), [1]);
        assert_eq!(shape(&[64, 1, 4, 1]), [64, 1, 4]);
        assert_eq!(dtype(0), "f32");
        assert_eq!(dtype(12), "q4_k");
        assert_eq!(dtype(-1), "type-1");
    }
}
