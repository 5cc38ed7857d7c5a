//! `--values` on the recording side: put each node's head and chunks back
//! together, keep the last read of a node in a run (a barrier inside an op
//! inlined into the node loop reads it mid-way; the loop's own barrier
//! after it is always later), fingerprint it and hand it to the writer with
//! its place in the graph being run.

use std::collections::HashMap;

use regex_lite::Regex;
use tracer_common::{TensorRecord, values::flags};

use super::values_fingerprint::{Element, fingerprint};
use crate::{
    events::ValueRecord,
    format::values::{Fingerprint, encode_tail, user_flags},
    live::graphs::Definition,
};

/// A node's bytes as they arrive.
struct Capture {
    ts_ns: u64,
    tid: u32,
    run: u64,
    node: u64,
    site: u64,
    fused: u64,
    flags: u32,
    tensor: TensorRecord,
    total: u64,
    bytes: Vec<u8>,
    superseded: u32,
}

/// A finished node output, ready for a VALUE frame.
pub struct Finished {
    pub ts_tid: (u64, u32),
    pub graph: u32,
    pub node_index: Option<u32>,
    pub tensor: TensorRecord,
    pub fused: Option<TensorRecord>,
    /// `format::values::encode_tail`'s bytes.
    pub tail: Vec<u8>,
}

pub struct ValueRecorder {
    filter: Option<Regex>,
    /// Per process, the node being received.
    open: HashMap<u32, Capture>,
    /// Per graph definition: node address → (index, record).
    graphs: HashMap<u32, HashMap<u64, (u32, TensorRecord)>>,
    /// The graph whose run is the latest written.
    current: Option<u32>,
    /// Nodes left out by `--values-filter`.
    pub filtered: u64,
}

impl ValueRecorder {
    pub fn new(filter: Option<Regex>) -> Self {
        Self { filter, open: HashMap::new(), graphs: HashMap::new(), current: None, filtered: 0 }
    }

    pub fn on_definition(&mut self, definition: &Definition) {
        let nodes = definition.nodes().enumerate().map(|(i, (r, _))| (r.tensor, (i as u32, *r))).collect();
        self.graphs.insert(definition.id, nodes);
    }

    pub fn on_run(&mut self, graph: u32) {
        self.current = Some(graph);
    }

    /// A head or chunk; a head of another node finishes the one before.
    pub fn on_event(&mut self, event: &ValueRecord) -> Option<Finished> {
        let tgid = event.header.tgid;
        let Some(tensor) = event.tensor else {
            // A chunk out of place (one before it lost) leaves the node short: flagged incomplete.
            let same =
                |c: &&mut Capture| (c.run, c.node, c.bytes.len() as u64) == (event.run, event.node, event.offset);
            if let Some(c) = self.open.get_mut(&tgid).filter(same) {
                c.bytes.extend_from_slice(&event.data);
            }
            return None;
        };
        let mut superseded = 0;
        let mut done = None;
        if let Some(c) = self.open.remove(&tgid) {
            if (c.run, c.node) == (event.run, event.node) {
                superseded = c.superseded + 1;
            } else {
                done = self.finish(c);
            }
        }
        let capture = Capture {
            ts_ns: event.header.ts_ns,
            tid: event.header.tid,
            run: event.run,
            node: event.node,
            site: event.site,
            fused: event.fused,
            flags: event.flags,
            tensor,
            total: event.offset,
            bytes: Vec::with_capacity(event.offset as usize),
            superseded,
        };
        self.open.insert(tgid, capture);
        done
    }

    /// Finish every open node (its run has ended).
    pub fn flush(&mut self) -> Vec<Finished> {
        let open: Vec<Capture> = self.open.drain().map(|(_, c)| c).collect();
        open.into_iter().filter_map(|c| self.finish(c)).collect()
    }

    fn finish(&mut self, c: Capture) -> Option<Finished> {
        let name = crate::live::recorder::tensor_name(&c.tensor);
        if self.filter.as_ref().is_some_and(|f| !f.is_match(name)) {
            self.filtered += 1;
            return None;
        }
        let graph = self.current.unwrap_or(u32::MAX);
        let nodes = self.graphs.get(&graph);
        let node_index = nodes.and_then(|n| n.get(&c.node)).map(|&(i, _)| i);
        let fused = (c.fused != 0).then(|| nodes.and_then(|n| n.get(&c.fused)).map(|&(_, r)| r)).flatten();
        let mut bits = c.flags;
        let copied = bits & (flags::UNSUPPORTED_TYPE | flags::SET_ROWS | flags::TOO_BIG | flags::READ_FAILED) == 0;
        let mut fp: Option<Fingerprint> = None;
        if copied {
            fp = (c.bytes.len() as u64 == c.total)
                .then(|| Element::of(c.tensor.type_))
                .flatten()
                .and_then(|e| fingerprint(e, c.tensor.ne, c.tensor.nb, &c.bytes));
            if fp.is_none() {
                bits |= user_flags::INCOMPLETE;
            }
        }
        let mut tail = Vec::with_capacity(400);
        encode_tail(&mut tail, c.site, bits, c.superseded, fp.as_ref());
        Some(Finished { ts_tid: (c.ts_ns, c.tid), graph, node_index, tensor: c.tensor, fused, tail })
    }
}
