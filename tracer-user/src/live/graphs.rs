//! Graph capture on the recording side: the kernel sends a graph's nodes
//! and the tensors they read once per `(cgraph, uid)`, and for every run a
//! graph event and its integer inputs. These become one GRAPH frame per
//! distinct graph and one COMPUTE frame per run.

use std::collections::HashMap;

use tracer_common::{GraphEvent, NodeEvent, SLOT_DST, TensorRecord, ggml::GgmlTensor, graph, node_role};

use crate::events::InputRecord;

/// A graph whose node records are still arriving.
struct Reading {
    event: GraphEvent,
    nodes: Vec<(u64, GgmlTensor)>,
    sources: HashMap<u64, GgmlTensor>,
}

/// A run waiting for its inputs (they follow its graph event).
pub struct Run {
    pub graph: u32,
    pub ts_ns: u64,
    pub tid: u32,
    pub uid: u64,
    pub inputs: Vec<(TensorRecord, Vec<u8>)>,
}

/// A graph ready to be written: node records with their sources.
pub struct Definition {
    pub id: u32,
    pub nodes: Vec<(TensorRecord, Vec<(u32, TensorRecord)>)>,
}

#[derive(Default)]
pub struct GraphAssembler {
    /// cgraph address → id of its current definition, with the uid read.
    defined: HashMap<u64, (u32, u64)>,
    /// Tensors of each defined graph by address, to name a run's inputs.
    tensors: HashMap<u32, HashMap<u64, TensorRecord>>,
    next_id: u32,
    reading: Option<Reading>,
    run: Option<Run>,
    /// Graphs whose node records did not all arrive (ring overflow), and
    /// runs of a graph never defined: neither can be expanded into ops.
    pub incomplete: u64,
}

/// What the recorder must write, in order.
#[derive(Default)]
pub struct Ready {
    pub definition: Option<Definition>,
    pub run: Option<Run>,
}

impl GraphAssembler {
    /// A graph was entered: whatever was pending is complete.
    pub fn on_graph(&mut self, event: &GraphEvent) -> Ready {
        let ready = self.settle();
        let known = self.defined.get(&event.cgraph).filter(|&&(_, uid)| uid == event.uid);
        match known {
            Some(&(id, _)) if event.flags & graph::REUSED != 0 => self.start_run(id, event),
            _ => {
                self.reading = Some(Reading {
                    event: *event,
                    nodes: Vec::with_capacity(event.n_nodes as usize),
                    sources: HashMap::new(),
                });
            }
        }
        ready
    }

    pub fn on_node(&mut self, node: &NodeEvent) {
        let Some(reading) = self.reading.as_mut().filter(|r| r.event.uid == node.uid) else { return };
        if node.role == node_role::NODE {
            reading.nodes.push((node.address, node.tensor));
        } else {
            reading.sources.insert(node.address, node.tensor);
        }
    }

    /// An input of the current run; it ends the graph's node records.
    pub fn on_input(&mut self, input: &InputRecord) -> Ready {
        let definition = self.finish_reading();
        if let Some(run) = self.run.as_mut().filter(|r| r.uid == input.uid)
            && let Some(record) = self.tensors.get(&run.graph).and_then(|t| t.get(&input.tensor))
        {
            run.inputs.push((*record, input.data.clone()));
        }
        Ready { definition, run: None }
    }

    /// Any other event, or the end: everything pending is complete.
    pub fn settle(&mut self) -> Ready {
        let definition = self.finish_reading();
        Ready { definition, run: self.run.take() }
    }

    fn start_run(&mut self, graph: u32, event: &GraphEvent) {
        self.run =
            Some(Run { graph, ts_ns: event.header.ts_ns, tid: event.header.tid, uid: event.uid, inputs: Vec::new() });
    }

    fn finish_reading(&mut self) -> Option<Definition> {
        let reading = self.reading.take()?;
        if reading.nodes.len() != reading.event.n_nodes as usize {
            self.incomplete += 1;
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut by_address: HashMap<u64, TensorRecord> =
            reading.sources.iter().map(|(&a, t)| (a, TensorRecord::of(a, t, 0))).collect();
        by_address.extend(reading.nodes.iter().map(|(a, t)| (*a, TensorRecord::of(*a, t, SLOT_DST))));
        let nodes = reading
            .nodes
            .iter()
            .map(|(address, t)| {
                let srcs = t
                    .src
                    .iter()
                    .enumerate()
                    .filter(|&(_, &src)| src != 0)
                    .filter_map(|(slot, src)| {
                        by_address.get(src).map(|r| (slot as u32, TensorRecord { slot: slot as u32, ..*r }))
                    })
                    .collect();
                (TensorRecord::of(*address, t, SLOT_DST), srcs)
            })
            .collect();
        // Runs only ever name the current definition of their cgraph.
        if let Some((old, _)) = self.defined.insert(reading.event.cgraph, (id, reading.event.uid)) {
            self.tensors.remove(&old);
        }
        self.tensors.insert(id, by_address);
        self.start_run(id, &reading.event);
        Some(Definition { id, nodes })
    }
}
