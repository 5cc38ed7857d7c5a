//! `graphs/<stem>.json`: the graph one ubatch executed, as the thesis UI's
//! computation-graph view reads it (`GraphData` in its `data.ts`). Nodes are
//! tensors by `ggml_tensor` address, numbered `node_0`, `node_1`, … in first
//! sighting order; edges run source → output, labelled `src i` by the slot.
//!
//! The UI names an edge `source-target`, so a pair is drawn once: an op
//! reading one tensor in two slots keeps the first slot's edge.

use std::collections::{HashMap, HashSet, hash_map::Entry};

use serde::Serialize;

use super::category::Category;
use crate::{
    analyze::{
        tensor::{memory_class, model_tensor, name_layer, weight_of},
        walk::Tables,
    },
    format::{Descriptor, Op},
    model::GgmlType,
};

#[derive(Default)]
pub struct UbatchGraph {
    /// Tensor address → index in `nodes`.
    index: HashMap<u64, usize>,
    nodes: Vec<GraphNode>,
    edges: Vec<GraphEdge>,
    pairs: HashSet<(usize, usize)>,
    /// Outputs already drawn: with `--all-threads` every worker records the op.
    computed: HashSet<u64>,
}

#[derive(Serialize)]
pub struct GraphNode {
    id: String,
    address: String,
    label: String,
    operation: String,
    shape: Vec<i64>,
    dtype: String,
    layer_id: Option<u32>,
    category: Category,
    // ttrace's own: where the data lives and, for weights, which GGUF tensor.
    memory_class: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_tensor: Option<String>,
}

#[derive(Serialize)]
pub struct GraphEdge {
    source: String,
    target: String,
    label: String,
}

#[derive(Serialize)]
pub struct GraphMetadata {
    total_nodes: usize,
    total_edges: usize,
    /// Layers among the nodes: highest `layer_id` + 1.
    layers: u32,
    /// The trace has no wall-clock time to give.
    timestamp_generated: Option<String>,
}

impl UbatchGraph {
    pub fn note(&mut self, op: &Op, t: &Tables) {
        let dst = t.descriptor(op.dst);
        if !self.computed.insert(dst.tensor) {
            return;
        }
        let target = self.node(dst, t);
        for &(slot, id) in &op.srcs {
            let source = self.node(t.descriptor(id), t);
            if self.pairs.insert((source, target)) {
                let (source, target) = (self.nodes[source].id.clone(), self.nodes[target].id.clone());
                self.edges.push(GraphEdge { source, target, label: format!("src {slot}") });
            }
        }
    }

    fn node(&mut self, d: &Descriptor, t: &Tables) -> usize {
        match self.index.entry(d.tensor) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let i = self.nodes.len();
                self.nodes.push(graph_node(i, d, t));
                *e.insert(i)
            }
        }
    }

    /// The ubatch's graph: metadata, nodes, edges; and a fresh start.
    pub fn take(&mut self) -> (GraphMetadata, Vec<GraphNode>, Vec<GraphEdge>) {
        let this = std::mem::take(self);
        let metadata = GraphMetadata {
            total_nodes: this.nodes.len(),
            total_edges: this.edges.len(),
            layers: this.nodes.iter().filter_map(|n| n.layer_id).max().map_or(0, |l| l + 1),
            timestamp_generated: None,
        };
        (metadata, this.nodes, this.edges)
    }
}

fn graph_node(i: usize, d: &Descriptor, t: &Tables) -> GraphNode {
    let weight = weight_of(d).and_then(|w| model_tensor(t.models, w.model, w.tensor));
    let (layer_id, category) = match weight {
        Some(w) => (w.layer, Category::of_weight_node(&w.name)),
        None => (name_layer(&d.name), Category::of_node_name(&d.name)),
    };
    GraphNode {
        id: format!("node_{i}"),
        address: format!("{:#x}", d.tensor),
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
