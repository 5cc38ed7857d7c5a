//! The writer's graph frames: a graph's definition (GRAPH, its tensors
//! looked up against the last definition of the same shape) and its runs
//! (COMPUTE).

use std::io::{self, Write};

use tracer_common::TensorRecord;

use super::{
    super::{
        codec::{put_bytes, put_u64},
        executed,
        frames::{FrameKind, Memory},
    },
    TraceWriter, descriptor_key,
};

/// A graph definition to write (GRAPH frame): each tensor it names is one
/// record, its nodes' sources indices into them, so that a tensor read by
/// several nodes is neither copied nor looked up per reader.
pub struct GraphDefinition {
    pub id: u32,
    /// Slot cleared: the nodes in order (node `i` is record `i`), then the
    /// sources that are not nodes, in order of first use.
    pub records: Vec<TensorRecord>,
    pub n_nodes: usize,
    /// The nodes' sources as `(slot, record index)`, node after node.
    pub sources: Vec<(u32, u32)>,
    /// Where each node's sources end in `sources`.
    pub source_ends: Vec<u32>,
}

impl GraphDefinition {
    /// Each node's record and its `(slot, record index)` sources.
    pub fn nodes(&self) -> impl Iterator<Item = (&TensorRecord, &[(u32, u32)])> {
        let starts = std::iter::once(0).chain(self.source_ends.iter().copied());
        self.records[..self.n_nodes]
            .iter()
            .zip(starts.zip(&self.source_ends))
            .map(|(record, (start, &end))| (record, &self.sources[start as usize..end as usize]))
    }
}

/// How many graph shapes `last_graphs` keeps.
const GRAPH_SHAPES_KEPT: usize = 32;

/// `a == b` as one compare of their bytes: the derived `eq` goes field by
/// field, and graph frames compare thousands of records each.
fn same_record(a: &TensorRecord, b: &TensorRecord) -> bool {
    const WORDS: usize = size_of::<TensorRecord>() / 8;
    // SAFETY: TensorRecord is repr(C), 8-byte aligned, of whole words and
    // integers only (`_pad` included, so no byte is uninitialised).
    let words = |r: &TensorRecord| unsafe { &*(r as *const TensorRecord).cast::<[u64; WORDS]>() };
    words(a) == words(b)
}
// No padding bytes: 13 words, 6 four-byte fields, then the name.
const _: () = assert!(
    size_of::<TensorRecord>() == 13 * 8 + 6 * 4 + tracer_common::ggml::MAX_NAME
        && tracer_common::ggml::MAX_NAME.is_multiple_of(8)
        && align_of::<TensorRecord>() == 8
);

impl<W: Write> TraceWriter<W> {
    /// [`Self::descriptor`] for the record at `position` of a graph frame
    /// (positions are visited in order), through `last` (see `last_graphs`).
    fn graph_descriptor(
        &mut self,
        last: &mut Vec<(TensorRecord, u32)>,
        position: usize,
        record: &TensorRecord,
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<u32> {
        let key = descriptor_key(record);
        if let Some(&(ref seen, id)) = last.get(position)
            && same_record(seen, &key)
        {
            return Ok(id);
        }
        let id = self.descriptor(record, resolve)?;
        match last.get_mut(position) {
            Some(entry) => *entry = (key, id),
            None => last.push((key, id)),
        }
        Ok(id)
    }

    /// Define a graph (the recorder's ids count up from 0; a ring's file
    /// numbers them afresh, see [`GraphIds`]): each node's descriptor and
    /// its `(slot, descriptor)` sources.
    pub fn graph(
        &mut self,
        definition: &GraphDefinition,
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<()> {
        // Descriptors are defined (frames of their own) before the graph
        // frame is begun: one id per record, then the frame.
        let id = self.graph_ids.define(definition.id)?;
        let mut ids = std::mem::take(&mut self.record_ids);
        ids.clear();
        let records = &definition.records;
        let shape = (definition.n_nodes, records.first().map_or([0; 4], |dst| dst.ne));
        let mut last = self.last_graphs.remove(&shape).unwrap_or_default();
        for (position, record) in records.iter().enumerate() {
            let id = self.graph_descriptor(&mut last, position, record, resolve)?;
            ids.push(id);
        }
        last.truncate(records.len());
        // Bounded: a target that builds ever new graph shapes only misses.
        if self.last_graphs.len() < GRAPH_SHAPES_KEPT {
            self.last_graphs.insert(shape, last);
        }
        let f = &mut self.frame;
        put_u64(f, u64::from(id));
        put_u64(f, definition.n_nodes as u64);
        for (node, (_, sources)) in definition.nodes().enumerate() {
            put_u64(f, u64::from(ids[node]));
            put_u64(f, sources.len() as u64);
            for &(slot, record) in sources {
                put_u64(f, u64::from(slot));
                put_u64(f, u64::from(ids[record as usize]));
            }
        }
        self.record_ids = ids;
        self.stats.graph_bytes += self.emit(FrameKind::Graph)?;
        self.stats.graphs += 1;
        let empty = executed::empty_op_ids(&self.header);
        let nodes = &definition.records[..definition.n_nodes];
        let ops = executed::count(nodes.iter().map(|r| (r.op, r.flags)), &empty);
        self.ops_per_graph.define(definition.id, ops);
        Ok(())
    }

    /// A run of graph `graph` at `ts_ns` on thread `tid`, with the bytes of
    /// its integer inputs, each named by its tensor's record.
    pub fn compute(
        &mut self,
        graph: u32,
        ts_ns: u64,
        tid: u32,
        inputs: &[(TensorRecord, Vec<u8>)],
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<()> {
        match self.ops_per_graph.of(graph) {
            Some(ops) => self.stats.graph_run_ops += ops,
            None => self.stats.graph_runs_uncounted += 1,
        }
        let graph = self.graph_ids.file_id(graph)?;
        let thread = self.thread(tid)?;
        let mut ids = Vec::with_capacity(inputs.len());
        for (record, _) in inputs {
            ids.push(self.descriptor(record, resolve)?);
        }
        self.timestamp(ts_ns);
        let f = &mut self.frame;
        put_u64(f, u64::from(thread));
        put_u64(f, u64::from(graph));
        put_u64(f, inputs.len() as u64);
        for ((_, bytes), id) in inputs.iter().zip(ids) {
            put_u64(f, u64::from(id));
            put_bytes(f, bytes);
        }
        self.stats.computes += 1;
        self.stats.graph_bytes += self.emit(FrameKind::Compute)?;
        Ok(())
    }
}
