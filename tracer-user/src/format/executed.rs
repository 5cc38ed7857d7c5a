//! Which graph nodes count as executed ops: one rule for the reader, which
//! expands a COMPUTE frame into its ops, and the writer, which counts them
//! for the summary at the end of a long run (not read back).

use foldhash::HashMap;

use super::Header;

/// Ops that only re-describe memory: the CPU backend's compute loop skips them.
const EMPTY_OPS: [&str; 5] = ["NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"];
/// `GGML_TENSOR_FLAG_COMPUTE`: the scheduler marks the nodes a backend runs.
pub const FLAG_COMPUTE: i32 = 16;

/// The ids of [`EMPTY_OPS`] in this build's op table.
pub fn empty_op_ids(header: &Header) -> Vec<i32> {
    EMPTY_OPS.iter().filter_map(|name| header.op_id(name)).collect()
}

/// Whether a node `(op, flags)` of a graph is executed. ggml marks the
/// nodes the CPU backend runs with `FLAG_COMPUTE` since 2026; before, it ran
/// every node (a graph with no node so marked, `flagged` false, comes from
/// such a build).
pub fn is_executed(op: i32, flags: i32, flagged: bool, empty: &[i32]) -> bool {
    !empty.contains(&op) && (!flagged || flags & FLAG_COMPUTE != 0)
}

/// How many of `nodes` (`(op, flags)`, a graph's in order) are executed.
pub fn count(nodes: impl Iterator<Item = (i32, i32)> + Clone, empty: &[i32]) -> u64 {
    let flagged = nodes.clone().any(|(_, flags)| flags & FLAG_COMPUTE != 0);
    nodes.filter(|&(op, flags)| is_executed(op, flags, flagged, empty)).count() as u64
}

/// The writer's count of executed ops per graph definition, by the
/// recorder's id. Bounded: a build that defines a graph per ubatch (ggml
/// before 0.10) would otherwise keep one entry per token; a run of a graph
/// whose count was dropped is counted as unknown.
#[derive(Default)]
pub struct OpsPerGraph(HashMap<u32, u64>);

/// The definitions whose counts are kept.
const GRAPHS_KEPT: usize = 4096;

impl OpsPerGraph {
    pub fn define(&mut self, graph: u32, ops: u64) {
        if self.0.len() >= GRAPHS_KEPT && !self.0.contains_key(&graph) {
            self.0.clear();
        }
        self.0.insert(graph, ops);
    }

    pub fn of(&self, graph: u32) -> Option<u64> {
        self.0.get(&graph).copied()
    }
}
