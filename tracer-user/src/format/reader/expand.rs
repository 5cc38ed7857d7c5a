//! A COMPUTE frame's graph run, handed out one op per call: building all its
//! ops at once and queueing them was a tenth of a read.

use std::io::Read;

use super::{
    super::{executed, frames::Header},
    GraphNode, Op, TraceReader,
};

/// A graph run being handed out op by op.
pub(super) struct Expansion {
    graph: u32,
    /// The node to look at next.
    next: usize,
    flagged: bool,
    ts_ns: u64,
    tid: u32,
    /// `(tensor address, ids)` of the run's input arrays.
    inputs: Vec<(u64, Vec<i32>)>,
}

/// Op ids looked up per op and per graph: `Header::op_id` scans the names,
/// which was a tenth of `report`. Read again when a late HOOKS frame brings
/// the names.
pub(super) struct OpIds {
    pub get_rows: Option<i32>,
    empty: Vec<i32>,
}

impl OpIds {
    pub fn of(header: &Header) -> OpIds {
        OpIds { get_rows: header.op_id(tracer_common::ggml::OP_GET_ROWS), empty: executed::empty_op_ids(header) }
    }
}

impl<R: Read> TraceReader<R> {
    /// The nodes of graph `graph` that the CPU backend executes.
    pub(super) fn graph_ops(&self, graph: u32) -> Result<impl Iterator<Item = &GraphNode>, String> {
        let nodes = self.nodes(graph)?;
        let flagged = self.flagged(nodes);
        Ok(nodes.iter().filter(move |node| self.executed(node, flagged)))
    }

    /// Starts handing out a run of graph `graph`.
    pub(super) fn expand(
        &mut self,
        graph: u32,
        ts_ns: u64,
        tid: u32,
        inputs: Vec<(u64, Vec<i32>)>,
    ) -> Result<(), String> {
        let flagged = self.flagged(self.nodes(graph)?);
        self.expanding = Some(Expansion { graph, next: 0, flagged, ts_ns, tid, inputs });
        Ok(())
    }

    /// The next op of the graph run being expanded, if any is left.
    pub(super) fn next_expanded(&mut self) -> Option<Op> {
        let x = self.expanding.as_ref()?;
        let nodes = &self.graphs[x.graph as usize][x.next..];
        let Some(skipped) = nodes.iter().position(|node| self.executed(node, x.flagged)) else {
            self.expanding = None;
            return None;
        };
        let op = self.op_of(&nodes[skipped], x);
        if let Some(x) = self.expanding.as_mut() {
            x.next += skipped + 1;
        }
        Some(op)
    }

    fn op_of(&self, node: &GraphNode, x: &Expansion) -> Op {
        // The token-embedding lookup carries the ids its slot-1 input held.
        let token_ids = if Some(self.descriptors[node.dst as usize].op) == self.op_ids.get_rows {
            node.srcs
                .iter()
                .find(|(slot, _)| *slot == 1)
                .and_then(|&(_, id)| {
                    let tensor = self.descriptors[id as usize].tensor;
                    x.inputs.iter().find(|(t, _)| *t == tensor)
                })
                .map(|(_, ids)| ids.clone())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Op {
            ts_ns: x.ts_ns,
            tid: x.tid,
            ith: 0,
            nth: 0,
            hook: tracer_common::hooks::GRAPH,
            dst: node.dst,
            srcs: node.srcs.clone(),
            token_ids,
        }
    }

    fn nodes(&self, graph: u32) -> Result<&[GraphNode], String> {
        self.graphs.get(graph as usize).map(Vec::as_slice).ok_or_else(|| format!("graph {graph} not defined"))
    }

    /// Whether a graph's nodes carry ggml's `FLAG_COMPUTE` (see [`executed`]).
    fn flagged(&self, nodes: &[GraphNode]) -> bool {
        nodes.iter().any(|node| self.descriptors[node.dst as usize].flags & executed::FLAG_COMPUTE != 0)
    }

    fn executed(&self, node: &GraphNode, flagged: bool) -> bool {
        let d = &self.descriptors[node.dst as usize];
        executed::is_executed(d.op, d.flags, flagged, &self.op_ids.empty)
    }
}
