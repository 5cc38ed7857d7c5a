//! `--op-timing` on the recording side. Per node and thread the kernel
//! sends only when it started (an [`OpEvent`]); the node's tensors come
//! from the definition of the graph running, which the graph capture sent
//! once. Each start becomes the OP frame a full per-node read would have
//! written, so the trace and everything that reads it are unchanged. A
//! node's descriptor ids are kept after its first op: later ones are
//! written without looking its tensors up again.

use foldhash::HashMap;

use tracer_common::{EventHeader, MAX_TOKEN_IDS, OpEvent, SLOT_DST, TensorRecord, hooks};

use super::{
    graphs::{Definition, Run},
    target::OpNames,
};
use crate::format::OpStart;

/// One defined graph's nodes, ready to be written as ops.
struct Nodes {
    /// Node address → index in `ops`. A graph holds each node once.
    by_address: HashMap<u64, u32>,
    ops: Vec<NodeOp>,
}

struct NodeOp {
    /// The destination (slot `SLOT_DST`), then the sources in slot order.
    tensors: Vec<TensorRecord>,
    /// A GET_ROWS node's row-index tensor: its ids are the run's input.
    rows_from: Option<u64>,
    /// `tensors` as the writer's `(slot, descriptor)`, once written.
    ids: Vec<(u32, u32)>,
}

/// One op to write: the writer's [`OpStart`], its node's tensors, the
/// token ids it carries, and its descriptor ids (empty until the first
/// write fills them in; they are the writer's, valid while it lives).
pub struct NodeStart<'a> {
    pub start: OpStart<'a>,
    pub tensors: &'a [TensorRecord],
    pub token_ids: &'a [i32],
    pub ids: &'a mut Vec<(u32, u32)>,
}

/// The graph run the next node starts belong to.
struct Current {
    graph: u32,
    inputs: Vec<(u64, Vec<i32>)>,
}

pub struct OpTimes {
    /// The target's op id of GET_ROWS, whose index input is token ids.
    get_rows: Option<i32>,
    graphs: HashMap<u32, Nodes>,
    current: Option<Current>,
    /// Node starts no recorded graph run holds (its definition lost to a
    /// full ring, or a node outside any graph): counted as lost ops.
    pub unmatched: u64,
}

impl Default for OpTimes {
    fn default() -> Self {
        Self::new()
    }
}

impl OpTimes {
    pub fn new() -> Self {
        Self { get_rows: None, graphs: HashMap::default(), current: None, unmatched: 0 }
    }

    /// The target's op table (known once ggml is loaded): which op's index
    /// input carries token ids.
    pub fn set_op_names(&mut self, names: Option<&OpNames>) {
        if let Some(get_rows) = names.and_then(|n| n.op_id("GET_ROWS")) {
            self.get_rows = Some(get_rows);
        }
    }

    /// A graph definition; `is_current` tells which earlier ones a run can
    /// still name (a cgraph redefined drops its old one).
    pub fn define(&mut self, definition: &Definition, is_current: impl Fn(u32) -> bool) {
        self.graphs.retain(|&id, _| is_current(id));
        let records = &definition.records;
        let mut nodes = Nodes { by_address: HashMap::default(), ops: Vec::with_capacity(definition.n_nodes) };
        for (i, (dst, sources)) in definition.nodes().enumerate() {
            let mut tensors = Vec::with_capacity(1 + sources.len());
            tensors.push(TensorRecord { slot: SLOT_DST, ..*dst });
            tensors.extend(sources.iter().map(|&(slot, at)| TensorRecord { slot, ..records[at as usize] }));
            let rows_from = (Some(dst.op) == self.get_rows)
                .then(|| tensors.iter().find(|t| t.slot == 1).map(|t| t.tensor))
                .flatten();
            nodes.by_address.insert(dst.tensor, i as u32);
            nodes.ops.push(NodeOp { tensors, rows_from, ids: Vec::new() });
        }
        self.graphs.insert(definition.id, nodes);
    }

    /// A new file of a ring interns descriptors afresh: the ids kept are
    /// the last file's.
    pub fn forget_ids(&mut self) {
        self.graphs.values_mut().flat_map(|nodes| &mut nodes.ops).for_each(|op| op.ids.clear());
    }

    /// A graph was entered: until its run is complete, no node start is its.
    pub fn graph_entered(&mut self) {
        self.current = None;
    }

    /// A graph run with its integer inputs: the node starts that follow are its.
    pub fn run(&mut self, run: &Run) {
        let inputs = run
            .inputs
            .iter()
            .map(|(record, bytes)| {
                let ids = bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                (record.tensor, ids.take(MAX_TOKEN_IDS).collect())
            })
            .collect();
        self.current = Some(Current { graph: run.graph, inputs });
    }

    /// The ops a node start stands for (a fused pair is two), each passed
    /// to `write`; a start of no known node is counted, not written.
    pub fn on_op<E>(&mut self, e: &OpEvent, mut write: impl FnMut(NodeStart<'_>) -> Result<(), E>) -> Result<(), E> {
        // One kernel computes a fused pair: the second node starts 1 ns after
        // the first, so a (thread, start) still names one op and the pair
        // keeps its order; the time is the pair's, on its second node.
        let pair = [(e.node, e.hook, 0), (e.fused, hooks::FUSED_MUL, 1)];
        let count = if e.hook == hooks::FUSED_RMS_NORM { 2 } else { 1 };
        let Self { graphs, current, unmatched, .. } = self;
        let current = current.as_ref();
        let mut nodes = current.and_then(|c| graphs.get_mut(&c.graph));
        for &(address, hook, after) in &pair[..count] {
            let Some(node) = nodes.as_mut().and_then(|n| n.by_address.get(&address).map(|&i| &mut n.ops[i as usize]))
            else {
                *unmatched += 1;
                continue;
            };
            let token_ids = match node.rows_from {
                Some(rows) => {
                    current.and_then(|c| c.inputs.iter().find(|(t, _)| *t == rows)).map_or(&[][..], |(_, ids)| ids)
                }
                None => &[],
            };
            let header = EventHeader { ts_ns: e.header.ts_ns + after, ..e.header };
            let start = OpStart { header: &header, ith: e.ith, nth: e.nth, hook };
            write(NodeStart { start, tensors: &node.tensors, token_ids, ids: &mut node.ids })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::EventKind;

    use super::*;
    use crate::events::OpRecord;

    const GET_ROWS: i32 = 13;

    fn record(tensor: u64, op: i32) -> TensorRecord {
        // SAFETY: TensorRecord holds only integers and byte arrays.
        TensorRecord { tensor, op, ..unsafe { std::mem::zeroed() } }
    }

    /// Node 0x10 = GET_ROWS(weights 0x80, ids 0x90); node 0x20 = MUL(0x10, 0x80).
    fn definition() -> Definition {
        Definition {
            id: 4,
            records: vec![record(0x10, GET_ROWS), record(0x20, 7), record(0x80, 0), record(0x90, 0)],
            n_nodes: 2,
            sources: vec![(0, 2), (1, 3), (0, 0), (1, 2)],
            source_ends: vec![2, 4],
        }
    }

    fn start(node: u64, fused: u64, hook: u32) -> OpEvent {
        let header = EventHeader { kind: EventKind::Op as u32, ts_ns: 50, tid: 3, ..Default::default() };
        OpEvent { header, node, fused, ith: 1, nth: 2, hook, _pad: 0 }
    }

    fn ops(times: &mut OpTimes, e: &OpEvent) -> Vec<OpRecord> {
        let mut out = Vec::new();
        times
            .on_op::<()>(e, |op| {
                let (header, ith, nth, hook) = (*op.start.header, op.start.ith, op.start.nth, op.start.hook);
                let (token_ids, tensors) = (op.token_ids.to_vec(), op.tensors.to_vec());
                out.push(OpRecord { header, ith, nth, hook, token_ids, tensors });
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn a_node_start_is_its_graphs_node_with_the_runs_token_ids() {
        let mut times = OpTimes { get_rows: Some(GET_ROWS), ..OpTimes::new() };
        times.define(&definition(), |_| true);
        let ids: Vec<u8> = (0..20i32).flat_map(|i| i.to_le_bytes()).collect();
        times.run(&Run { graph: 4, ts_ns: 1, tid: 3, uid: 9, inputs: vec![(record(0x90, 0), ids)] });

        let [op] = &ops(&mut times, &start(0x10, 0, hooks::EXTRA))[..] else { panic!("one op") };
        assert_eq!((op.header.ts_ns, op.header.tid, op.ith, op.nth, op.hook), (50, 3, 1, 2, hooks::EXTRA));
        let tensors: Vec<(u64, u32)> = op.tensors.iter().map(|t| (t.tensor, t.slot)).collect();
        assert_eq!(tensors, [(0x10, SLOT_DST), (0x80, 0), (0x90, 1)]);
        assert_eq!(op.token_ids, (0..MAX_TOKEN_IDS as i32).collect::<Vec<_>>(), "at most MAX_TOKEN_IDS");

        // A fused pair: both nodes, in order, the second as FUSED_MUL, with no ids.
        let pair = ops(&mut times, &start(0x10, 0x20, hooks::FUSED_RMS_NORM));
        let hooks: Vec<(u64, u32)> = pair.iter().map(|o| (o.tensors[0].tensor, o.hook)).collect();
        assert_eq!(hooks, [(0x10, hooks::FUSED_RMS_NORM), (0x20, hooks::FUSED_MUL)]);
        assert_eq!((pair[0].header.ts_ns, pair[1].header.ts_ns), (50, 51), "in order, one start each");
        assert_eq!(pair[1].tensors[1].tensor, 0x10, "its source is the first node");
        assert!(pair[1].token_ids.is_empty());
        assert_eq!(times.unmatched, 0);
    }

    #[test]
    fn a_start_outside_the_running_graph_is_counted_not_guessed() {
        let mut times = OpTimes { get_rows: Some(GET_ROWS), ..OpTimes::new() };
        times.define(&definition(), |_| true);
        // No run yet: the node's address alone names nothing.
        assert!(ops(&mut times, &start(0x10, 0, hooks::EXTRA)).is_empty());
        times.run(&Run { graph: 4, ts_ns: 1, tid: 3, uid: 9, inputs: Vec::new() });
        assert!(ops(&mut times, &start(0x30, 0, hooks::EXTRA)).is_empty(), "not a node of graph 4");
        // The next graph entered, its definition lost: a reused address is not graph 4's node.
        times.graph_entered();
        assert!(ops(&mut times, &start(0x10, 0, hooks::EXTRA)).is_empty());
        assert_eq!(times.unmatched, 3);
        // A definition no run can name any more is dropped when the next arrives.
        times.define(&Definition { id: 5, ..definition() }, |id| id == 5);
        times.run(&Run { graph: 4, ts_ns: 1, tid: 3, uid: 9, inputs: Vec::new() });
        assert!(ops(&mut times, &start(0x10, 0, hooks::EXTRA)).is_empty());
    }
}
