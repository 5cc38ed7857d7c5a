//! `--values` on the recording side: put each node's head and chunks back
//! together, keep the last read of a node in a run (a barrier inside an op
//! inlined into the node loop reads it mid-way; the loop's own barrier
//! after it is always later), fingerprint it and hand it to the writer with
//! its place in the graph being run.

use std::collections::{HashMap, HashSet};

use regex_lite::Regex;
use tracer_common::{
    TensorRecord,
    ggml::MAX_NAME,
    values::{MAX_SKIP_NAMES, flags},
};

use super::values_fingerprint::{Element, fingerprint};
use crate::{
    events::{ValueRecord, tensor_name},
    format::{
        ValuesMissing,
        values::{Fingerprint, encode_tail, user_flags},
    },
    live::{graphs::Definition, target::OpNames},
};

/// Ops ggml-cpu does not compute (`ggml_op_is_empty`): no barrier reads them.
const NOT_COMPUTED: [&str; 5] = ["NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"];

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

/// A graph definition's nodes, as the reads name them.
struct GraphNodes {
    /// Node address → (index, record).
    by_address: HashMap<u64, (u32, TensorRecord)>,
    /// Indices of the nodes `--values-filter` leaves out: the kernel sends
    /// nothing of them once it has their names, so none is missed.
    left_out: HashSet<u32>,
}

pub struct ValueRecorder {
    filter: Option<Regex>,
    /// Per process, the node being received.
    open: HashMap<u32, Capture>,
    /// Per graph definition, its nodes.
    graphs: HashMap<u32, GraphNodes>,
    /// The graph whose run is the latest written.
    current: Option<u32>,
    /// Node indices of `current`'s run that were read.
    read_in_run: HashSet<u32>,
    /// The target's ids of [`NOT_COMPUTED`] ops; `None` until its op names
    /// are known (nothing is counted missing without them).
    not_computed: Option<Vec<i32>>,
    /// Computed nodes no barrier read, and those the filter left out, over
    /// the runs so far.
    missing: ValuesMissing,
    /// Node names the filter leaves out, as the kernel's skip map keys
    /// them; those not yet handed to it.
    skipped_names: HashSet<[u8; MAX_NAME]>,
    new_skipped_names: Vec<[u8; MAX_NAME]>,
}

impl ValueRecorder {
    pub fn new(filter: Option<Regex>) -> Self {
        Self {
            filter,
            open: HashMap::new(),
            graphs: HashMap::new(),
            current: None,
            read_in_run: HashSet::new(),
            not_computed: None,
            missing: ValuesMissing::default(),
            skipped_names: HashSet::new(),
            new_skipped_names: Vec::new(),
        }
    }

    pub fn set_op_names(&mut self, names: Option<&OpNames>) {
        self.not_computed = names.map(|n| {
            n.ops
                .iter()
                .enumerate()
                .filter(|(_, o)| NOT_COMPUTED.contains(&o.as_str()))
                .map(|(i, _)| i as i32)
                .collect()
        });
    }

    pub fn on_definition(&mut self, definition: &Definition) {
        let by_address: HashMap<u64, (u32, TensorRecord)> =
            definition.nodes().enumerate().map(|(i, (r, _))| (r.tensor, (i as u32, *r))).collect();
        let mut left_out = HashSet::new();
        if let Some(filter) = &self.filter {
            for (index, record) in by_address.values() {
                if filter.is_match(tensor_name(record)) {
                    continue;
                }
                left_out.insert(*index);
                if self.skipped_names.len() < MAX_SKIP_NAMES as usize {
                    let key = skip_key(record);
                    if self.skipped_names.insert(key) {
                        self.new_skipped_names.push(key);
                    }
                }
            }
        }
        self.graphs.insert(definition.id, GraphNodes { by_address, left_out });
    }

    /// Names the filter leaves out, found since the last call: for the
    /// kernel, so that their bytes are not copied at all.
    pub fn take_skipped_names(&mut self) -> Vec<[u8; MAX_NAME]> {
        std::mem::take(&mut self.new_skipped_names)
    }

    /// A run starts: the one before has ended (its last node was flushed
    /// at the graph event that brought this run).
    pub fn on_run(&mut self, graph: u32) {
        self.close_run();
        self.current = Some(graph);
    }

    /// The trace ends (its open nodes flushed): what was missed in all.
    pub fn close(&mut self) -> ValuesMissing {
        self.close_run();
        self.missing
    }

    /// Count the nodes of the run that ended that no read reached, so a
    /// partial run is said, not silent, and those the filter left out. A
    /// node with no op is never computed.
    fn close_run(&mut self) {
        let (Some(nodes), Some(skip)) = (self.current.and_then(|g| self.graphs.get(&g)), &self.not_computed) else {
            return;
        };
        let read = &self.read_in_run;
        let (mut missed, mut left_out) = (0, 0);
        for (i, _) in nodes.by_address.values().filter(|(_, r)| !skip.contains(&r.op)) {
            if nodes.left_out.contains(i) {
                left_out += 1;
            } else if !read.contains(i) {
                missed += 1;
            }
        }
        self.missing.filtered += left_out;
        if missed > 0 {
            self.missing.nodes += missed;
            self.missing.runs += 1;
        }
        self.missing.runs_checked += 1;
        self.read_in_run.clear();
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
        if let Some(nodes) = self.current.and_then(|g| self.graphs.get(&g)) {
            // A norm fused into its MUL is never written: the pair's read covers it.
            let read = [c.node, c.fused].into_iter().filter_map(|a| nodes.by_address.get(&a)).map(|&(i, _)| i);
            self.read_in_run.extend(read);
        }
        // A node left out whose name the kernel did not know yet (counted at the run's close).
        if self.filter.as_ref().is_some_and(|f| !f.is_match(tensor_name(&c.tensor))) {
            return None;
        }
        let graph = self.current.unwrap_or(u32::MAX);
        let nodes = self.graphs.get(&graph).map(|g| &g.by_address);
        let node_index = nodes.and_then(|n| n.get(&c.node)).map(|&(i, _)| i);
        let fused = (c.fused != 0).then(|| nodes.and_then(|n| n.get(&c.fused)).map(|&(_, r)| r)).flatten();
        let mut bits = c.flags;
        let not_copied = flags::UNSUPPORTED_TYPE | flags::SET_ROWS | flags::TOO_BIG | flags::READ_FAILED;
        let copied = bits & not_copied == 0;
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

/// A node's name as the kernel's skip map keys it: its bytes to the NUL,
/// zero to the end.
fn skip_key(record: &TensorRecord) -> [u8; MAX_NAME] {
    let name = tracer_common::c_str(&record.name);
    let mut key = [0; MAX_NAME];
    key[..name.len()].copy_from_slice(name);
    key
}

#[cfg(test)]
mod tests {
    use tracer_common::EventHeader;

    use super::*;

    fn node(address: u64, op: i32) -> TensorRecord {
        // SAFETY: plain old data; all zero is a valid record.
        let zero: TensorRecord = unsafe { std::mem::zeroed() };
        TensorRecord { tensor: address, op, ..zero }
    }

    fn head(run: u64, node: u64, fused: u64) -> ValueRecord {
        // SET_ROWS: a head with no bytes to follow.
        let (header, tensor) = (EventHeader::default(), Some(self::node(node, 1)));
        ValueRecord { header, run, node, site: 0, fused, offset: 0, flags: flags::SET_ROWS, tensor, data: vec![] }
    }

    /// Nodes 0x10 (ADD), 0x20 (VIEW: not computed), 0x30 (RMS_NORM fused into
    /// 0x40), 0x40 (MUL), 0x50 (ADD).
    fn recorder() -> ValueRecorder {
        let names = OpNames {
            ops: ["NONE", "ADD", "MUL", "VIEW", "RMS_NORM"].map(String::from).to_vec(),
            unary: vec![],
            glu: vec![],
        };
        let mut values = ValueRecorder::new(None);
        values.set_op_names(Some(&names));
        let records = vec![node(0x10, 1), node(0x20, 3), node(0x30, 4), node(0x40, 2), node(0x50, 1)];
        let definition = Definition { id: 7, records, n_nodes: 5, sources: vec![], source_ends: vec![0; 5] };
        values.on_definition(&definition);
        values
    }

    #[test]
    fn a_run_read_whole_misses_nothing_and_one_cut_short_is_counted() {
        let mut values = recorder();
        values.on_run(7);
        for (address, fused) in [(0x10, 0), (0x40, 0x30), (0x50, 0)] {
            values.on_event(&head(1, address, fused));
        }
        values.flush();
        // The second run's reads stop after its first node.
        values.on_run(7);
        values.on_event(&head(2, 0x10, 0));
        values.flush();
        let missing = values.close();
        assert_eq!(missing, ValuesMissing { nodes: 3, runs: 1, runs_checked: 2, ..Default::default() });
    }

    #[test]
    fn nodes_the_filter_leaves_out_are_counted_as_left_out_not_missed() {
        let names = OpNames { ops: ["NONE", "ADD", "VIEW"].map(String::from).to_vec(), unary: vec![], glu: vec![] };
        let mut values = ValueRecorder::new(Some(Regex::new("ffn_out").unwrap()));
        values.set_op_names(Some(&names));
        let named = |address, op, name: &str| {
            let mut record = node(address, op);
            record.name[..name.len()].copy_from_slice(name.as_bytes());
            record
        };
        // ADDs kept and left out, and VIEWs (never computed) kept and left out.
        let kept = named(0x10, 1, "ffn_out-0");
        let records =
            vec![kept, named(0x20, 1, "attn_out-0"), named(0x30, 2, "ffn_out-0 (view)"), named(0x40, 2, "kq-0")];
        let definition = Definition { id: 3, records, n_nodes: 4, sources: vec![], source_ends: vec![0; 4] };
        values.on_definition(&definition);
        let mut skipped: Vec<String> = values
            .take_skipped_names()
            .iter()
            .map(|k| String::from_utf8_lossy(tracer_common::c_str(k)).into())
            .collect();
        skipped.sort();
        assert_eq!(skipped, ["attn_out-0", "kq-0"]);
        for run in 1..=2 {
            values.on_run(3);
            // The kernel sends the kept node alone.
            values.on_event(&ValueRecord { tensor: Some(kept), ..head(run, 0x10, 0) });
            assert_eq!(values.flush().len(), 1);
        }
        assert_eq!(values.close(), ValuesMissing { filtered: 2, runs_checked: 2, ..Default::default() });
    }

    #[test]
    fn without_op_names_nothing_is_counted() {
        let mut values = recorder();
        values.set_op_names(None);
        values.on_run(7);
        assert_eq!(values.close(), ValuesMissing::default());
    }
}
