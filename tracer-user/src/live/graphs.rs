//! Graph capture on the recording side: the kernel sends a graph's nodes
//! and the tensors they read once per `(cgraph, uid)`, and for every run a
//! graph event and its integer inputs. These become one GRAPH frame per
//! distinct graph and one COMPUTE frame per run.

use std::rc::Rc;

use foldhash::HashMap;

use tracer_common::{
    GraphEvent, NodeEvent, SLOT_DST, TensorRecord,
    ggml::{FLAG_INPUT, MAX_SRC},
    graph,
    layout::{TensorLayout, known::TENSOR_2024_12},
    node_role,
};

use crate::events::InputRecord;

/// The last SOURCE record the probe sent for each (thread, tensor address),
/// as the probe remembers it: a node's `cache` name tensors whose
/// bytes equal these, and that were not sent again. Kept decoded (slot 0):
/// a weight is named cached by every graph read after its first.
#[derive(Default)]
pub struct SourceCache(HashMap<(u32, u64), TensorRecord>);

impl SourceCache {
    /// Every SOURCE record, whatever graph it belongs to: what the probe
    /// remembers of it (`cache` 1) it compares the next read with; what
    /// it does not (its table full) it never marks. A copy too short for
    /// `layout` is not kept, and a source naming it is left out as a lost one.
    pub fn on_node(&mut self, node: &NodeEvent, layout: &TensorLayout) {
        if node.role != node_role::SOURCE {
            return;
        }
        let key = (node.header.tid, node.address);
        match layout.decode(&node.tensor).filter(|_| node.cache != 0) {
            Some(tensor) => self.0.insert(key, TensorRecord::of(node.address, &tensor, 0)),
            None => self.0.remove(&key),
        };
    }

    /// The sources of `node` (its `src` as decoded) it did not send again,
    /// as last sent. One missing from the cache (its record lost to a full
    /// ring) is left out, as a lost record is.
    pub fn cached<'a>(
        &'a self,
        node: &'a NodeEvent,
        src: &'a [u64; MAX_SRC],
    ) -> impl Iterator<Item = &'a TensorRecord> + 'a {
        let tid = node.header.tid;
        src.iter()
            .enumerate()
            .filter(|&(slot, &address)| address != 0 && node.cache & (1 << slot) != 0)
            .filter_map(move |(_, &address)| self.0.get(&(tid, address)))
    }
}

/// A graph whose node records are still arriving.
struct Reading {
    event: GraphEvent,
    /// Each node's record and the addresses of its sources.
    nodes: Vec<(TensorRecord, [u64; MAX_SRC])>,
    /// Source tensors by address, as records (slot 0): kept as they will
    /// be written, not as the larger decoded struct.
    sources: HashMap<u64, TensorRecord>,
}

/// A run waiting for its inputs (they follow its graph event).
pub struct Run {
    pub graph: u32,
    pub ts_ns: u64,
    pub tid: u32,
    pub uid: u64,
    pub inputs: Vec<(TensorRecord, Vec<u8>)>,
}

pub use crate::format::GraphDefinition as Definition;

pub struct GraphAssembler {
    /// How the probe's raw copies of `ggml_tensor` are read.
    layout: TensorLayout,
    /// cgraph address → id of its current definition, with the uid read.
    defined: HashMap<u64, (u32, u64)>,
    /// Per definition a run can still name: its input tensors by address,
    /// to name a run's inputs, and the definition, which each file of a
    /// ring restates. One per cgraph: the memory stays flat.
    current: HashMap<u32, (HashMap<u64, TensorRecord>, Rc<Definition>)>,
    next_id: u32,
    sources: SourceCache,
    reading: Option<Reading>,
    run: Option<Run>,
    /// Graphs whose node records did not all arrive (ring overflow), and
    /// runs of a graph never defined: neither can be expanded into ops.
    pub incomplete: u64,
}

/// What the recorder must write, in order.
#[derive(Default)]
pub struct Ready {
    pub definition: Option<Rc<Definition>>,
    pub run: Option<Run>,
}

impl Default for GraphAssembler {
    fn default() -> Self {
        Self::new(TENSOR_2024_12.layout)
    }
}

impl GraphAssembler {
    pub fn new(layout: TensorLayout) -> Self {
        Self {
            layout,
            defined: HashMap::default(),
            current: HashMap::default(),
            next_id: 0,
            sources: SourceCache::default(),
            reading: None,
            run: None,
            incomplete: 0,
        }
    }

    /// How raw `ggml_tensor` copies are read now.
    pub fn layout(&self) -> TensorLayout {
        self.layout
    }

    /// The layout of the target's `ggml_tensor`, once it is known.
    pub fn set_layout(&mut self, layout: TensorLayout) {
        self.layout = layout;
    }

    /// Whether a run can still name definition `id` (its cgraph was not
    /// defined again since).
    pub fn is_current(&self, id: u32) -> bool {
        self.current.contains_key(&id)
    }

    /// The definitions a run can still name, in definition order.
    pub fn current_definitions(&self) -> Vec<Rc<Definition>> {
        let mut definitions: Vec<_> = self.current.values().map(|(_, d)| Rc::clone(d)).collect();
        definitions.sort_by_key(|d| d.id);
        definitions
    }

    /// A graph was entered (whatever was pending is complete), or its
    /// records are all sent (`graph::DONE`).
    pub fn on_graph(&mut self, event: &GraphEvent) -> Ready {
        let ready = self.settle();
        if event.flags & graph::DONE != 0 {
            return ready;
        }
        let known = self.defined.get(&event.cgraph).filter(|&&(_, uid)| uid == event.uid);
        match known {
            Some(&(id, _)) if event.flags & graph::REUSED != 0 => self.start_run(id, event),
            _ => {
                self.reading = Some(Reading {
                    event: *event,
                    nodes: Vec::with_capacity(event.n_nodes as usize),
                    sources: HashMap::default(),
                });
            }
        }
        ready
    }

    pub fn on_node(&mut self, node: &NodeEvent) {
        self.sources.on_node(node, &self.layout);
        let Some(reading) = self.reading.as_mut().filter(|r| r.event.uid == node.uid) else { return };
        // A copy too short for the layout: the graph stays incomplete.
        let Some(tensor) = self.layout.decode(&node.tensor) else { return };
        if node.role == node_role::NODE {
            for record in self.sources.cached(node, &tensor.src) {
                reading.sources.insert(record.tensor, *record);
            }
            reading.nodes.push((TensorRecord::of(node.address, &tensor, SLOT_DST), tensor.src));
        } else {
            reading.sources.insert(node.address, TensorRecord::of(node.address, &tensor, 0));
        }
    }

    /// The sources `node` did not send again, as records (see [`SourceCache`]).
    pub fn cached_sources(&self, node: &NodeEvent) -> Vec<TensorRecord> {
        let Some(tensor) = self.layout.decode(&node.tensor) else { return Vec::new() };
        self.sources.cached(node, &tensor.src).map(|r| TensorRecord { slot: SLOT_DST, ..*r }).collect()
    }

    /// An input of the current run; it ends the graph's node records.
    pub fn on_input(&mut self, input: &InputRecord) -> Ready {
        let definition = self.finish_reading();
        if let Some(run) = self.run.as_mut().filter(|r| r.uid == input.uid)
            && let Some(record) = self.current.get(&run.graph).and_then(|(t, _)| t.get(&input.tensor))
        {
            run.inputs.push((*record, input.data.clone()));
        }
        Ready { definition, run: None }
    }

    /// The end of a graph's records (or of the trace): what is pending is complete.
    pub fn settle(&mut self) -> Ready {
        let definition = self.finish_reading();
        Ready { definition, run: self.run.take() }
    }

    fn start_run(&mut self, graph: u32, event: &GraphEvent) {
        self.run =
            Some(Run { graph, ts_ns: event.header.ts_ns, tid: event.header.tid, uid: event.uid, inputs: Vec::new() });
    }

    fn finish_reading(&mut self) -> Option<Rc<Definition>> {
        let reading = self.reading.take()?;
        if reading.nodes.len() != reading.event.n_nodes as usize {
            self.incomplete += 1;
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let n_nodes = reading.nodes.len();
        // A source that is also a node is the node (sent whole, after it).
        let mut index: HashMap<u64, u32> =
            reading.nodes.iter().enumerate().map(|(i, (record, _))| (record.tensor, i as u32)).collect();
        let mut records: Vec<TensorRecord> =
            reading.nodes.iter().map(|(record, _)| TensorRecord { slot: 0, ..*record }).collect();
        let mut sources = Vec::with_capacity(n_nodes * 2);
        let mut source_ends = Vec::with_capacity(n_nodes);
        for (_, src) in &reading.nodes {
            for (slot, address) in src.iter().enumerate().filter(|&(_, &a)| a != 0) {
                let at = match index.get(address) {
                    Some(&at) => at,
                    // Not sent, nor cached (a lost record): left out, as lost.
                    None => {
                        let Some(record) = reading.sources.get(address) else { continue };
                        let at = records.len() as u32;
                        records.push(*record);
                        index.insert(*address, at);
                        at
                    }
                };
                sources.push((slot as u32, at));
            }
            source_ends.push(sources.len() as u32);
        }
        // A run's inputs are its graph's integer input tensors: only those
        // are kept, to name them.
        let inputs = records.iter().filter(|r| r.flags & FLAG_INPUT != 0).map(|r| (r.tensor, *r)).collect();
        // Runs only ever name the current definition of their cgraph.
        if let Some((old, _)) = self.defined.insert(reading.event.cgraph, (id, reading.event.uid)) {
            self.current.remove(&old);
        }
        let definition = Rc::new(Definition { id, records, n_nodes, sources, source_ends });
        self.current.insert(id, (inputs, Rc::clone(&definition)));
        self.start_run(id, &reading.event);
        Some(definition)
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{EventHeader, EventKind, ggml::GgmlTensor};

    use super::*;

    fn tensor(src: u64) -> GgmlTensor {
        // SAFETY: GgmlTensor holds only integers and byte arrays.
        let mut t: GgmlTensor = unsafe { std::mem::zeroed() };
        t.src[0] = src;
        t
    }

    fn graph(uid: u64, n_nodes: u32, flags: u32) -> GraphEvent {
        let header = EventHeader { kind: EventKind::Graph as u32, tid: 7, ..Default::default() };
        GraphEvent { header, cgraph: 0x1000, uid, n_nodes, flags, raw_n_nodes: n_nodes as i32, size: 0 }
    }

    fn node(uid: u64, role: u16, address: u64, src: u64) -> NodeEvent {
        let header = EventHeader { kind: EventKind::Node as u32, tid: 7, ..Default::default() };
        let t = tensor(src);
        // SAFETY: reading the bytes of a repr(C) POD value.
        let raw = unsafe { std::mem::transmute::<GgmlTensor, [u8; 336]>(t) };
        NodeEvent { header, uid, index: 0, role, cache: 0, address, tensor: raw }
    }

    /// A source record whose tensor has `ne[0]` = `ne0`, to tell versions apart.
    fn source(uid: u64, address: u64, ne0: i64) -> NodeEvent {
        let mut n = node(uid, node_role::SOURCE, address, 0);
        n.cache = 1;
        let mut t = tensor(0);
        t.ne[0] = ne0;
        // SAFETY: as above.
        n.tensor = unsafe { std::mem::transmute::<GgmlTensor, [u8; 336]>(t) };
        n
    }

    fn source_ne0(definition: &Definition, node: usize) -> Vec<(u64, i64)> {
        let (_, sources) = definition.nodes().nth(node).expect("a node");
        sources.iter().map(|&(_, r)| &definition.records[r as usize]).map(|r| (r.tensor, r.ne[0])).collect()
    }

    /// An integer input tensor's SOURCE record (`ggml_set_input`).
    fn input_source(uid: u64, address: u64) -> NodeEvent {
        let mut n = node(uid, node_role::SOURCE, address, 0);
        let mut t = tensor(0);
        t.flags = FLAG_INPUT;
        // SAFETY: as above.
        n.tensor = unsafe { std::mem::transmute::<GgmlTensor, [u8; 336]>(t) };
        n
    }

    fn input(uid: u64, tensor: u64) -> InputRecord {
        InputRecord { header: EventHeader::default(), uid, tensor, data: vec![1, 0, 0, 0] }
    }

    #[test]
    fn a_graph_is_complete_at_its_done_event_and_a_reused_one_runs_it_again() {
        let mut a = GraphAssembler::default();
        assert!(a.on_graph(&graph(5, 2, 0)).definition.is_none());
        a.on_node(&node(5, node_role::NODE, 0xa0, 0xb0));
        a.on_node(&input_source(5, 0xb0));
        a.on_node(&node(5, node_role::NODE, 0xa8, 0xa0));
        let ready = a.on_input(&input(5, 0xb0));
        let definition = ready.definition.expect("inputs follow the last node");
        assert_eq!(definition.n_nodes, 2);
        assert_eq!(source_ne0(&definition, 1)[0].0, 0xa0, "a node's source is the node before it");
        let ready = a.on_graph(&graph(5, 2, graph::DONE));
        let run = ready.run.expect("DONE ends the run");
        assert_eq!((run.graph, run.inputs.len()), (0, 1));

        // The same (cgraph, uid) again: a run of definition 0, no nodes.
        assert!(a.on_graph(&graph(5, 2, graph::REUSED)).run.is_none());
        a.on_input(&input(5, 0xb0));
        let run = a.on_graph(&graph(5, 2, graph::REUSED | graph::DONE)).run.expect("a reused run");
        assert_eq!((run.graph, run.inputs.len()), (0, 1));
        assert_eq!(a.incomplete, 0);
    }

    #[test]
    fn a_cached_source_is_the_last_one_its_thread_sent_for_that_address() {
        let mut a = GraphAssembler::default();
        a.on_graph(&graph(5, 1, 0));
        a.on_node(&node(5, node_role::NODE, 0xa0, 0xb0));
        a.on_node(&source(5, 0xb0, 3));
        a.on_graph(&graph(5, 1, graph::DONE));
        // The address sent again changed (a freed tensor's struct reused): the newer bytes count.
        a.on_graph(&graph(6, 1, 0));
        a.on_node(&node(6, node_role::NODE, 0xa0, 0xb0));
        a.on_node(&source(6, 0xb0, 4));
        let first = a.on_graph(&graph(6, 1, graph::DONE)).definition.expect("graph 6");
        assert_eq!(source_ne0(&first, 0), [(0xb0, 4)]);

        // Graph 7's node names 0xb0 as cached: no source record follows.
        a.on_graph(&graph(7, 1, 0));
        let mut cached = node(7, node_role::NODE, 0xa0, 0xb0);
        cached.cache = 1;
        a.on_node(&cached);
        let second = a.on_graph(&graph(7, 1, graph::DONE)).definition.expect("graph 7");
        assert_eq!(source_ne0(&second, 0), [(0xb0, 4)], "the same record as if sent");
        assert_eq!(a.cached_sources(&cached).iter().map(|r| r.ne[0]).collect::<Vec<_>>(), [4]);

        // Another thread never sent 0xb0: its cached mark names nothing.
        a.on_graph(&graph(8, 1, 0));
        cached.uid = 8;
        cached.header.tid = 9;
        a.on_node(&cached);
        let other = a.on_graph(&graph(8, 1, graph::DONE)).definition.expect("graph 8");
        assert!(source_ne0(&other, 0).is_empty());

        // Sent again with bytes the probe did not keep (its table full): never filled in.
        let mut forgotten = source(9, 0xb0, 5);
        forgotten.cache = 0;
        a.on_node(&forgotten);
        cached.header.tid = 7;
        assert!(a.cached_sources(&cached).is_empty());
    }

    #[test]
    fn a_graph_missing_node_records_is_counted_not_written() {
        let mut a = GraphAssembler::default();
        a.on_graph(&graph(9, 3, 0));
        a.on_node(&node(9, node_role::NODE, 0xa0, 0));
        let ready = a.on_graph(&graph(9, 3, graph::DONE));
        assert!(ready.definition.is_none());
        assert_eq!(a.incomplete, 1);
    }
}
