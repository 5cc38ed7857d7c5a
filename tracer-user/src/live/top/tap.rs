//! From the session's events to the aggregator's calls: tokens from each
//! ubatch's arrays (classified as the report does), disk bytes per tensor
//! from read requests (through the report's own block accounting), faults
//! by the page they hit, weights from the graphs' sources.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::BufWriter,
};

use tracer_common::{SLOT_DST, TensorRecord, batch, c_str, graph, node_role};

use super::aggregate::{Aggregator, MemoryUse, ResidencySample, TensorKey, TensorMeta};
use crate::{
    analyze::{
        io::{IoCorrelator, When},
        sequences::{RequestTracker, UbatchArrays},
    },
    events::{Event, InputRecord, tensor_name},
    format::{
        Memory,
        reader::{Batch, BatchArray, Block},
    },
    live::{
        recorder::{Recorder, Resolver, model_table},
        target::{RangePlan, Residency},
    },
};

/// Graph definitions remembered for their reruns; more are dropped, oldest
/// kept (a reused graph is a recent one).
const MAX_GRAPHS: usize = 256;

/// What the tap keeps between events.
#[derive(Default)]
pub struct Collector {
    pub agg: Aggregator,
    io: IoCorrelator,
    requests: RequestTracker,
    /// Per thread: the arrays of the ubatch being sent.
    pending: HashMap<u32, UbatchArrays>,
    /// Graph uid → the model tensors its nodes read.
    graph_weights: HashMap<u64, HashSet<TensorKey>>,
    /// `ffn_moe_argsort-L` node address → L.
    argsort_layers: HashMap<u64, u32>,
    files: Vec<WatchedFile>,
}

/// A model file whose page-cache residency each interval shows, in total
/// and per tensor (`plan` holds the tensors' ranges, in `tensors`' order).
struct WatchedFile {
    residency: Residency,
    plan: RangePlan,
    tensors: Vec<TensorKey>,
}

impl Collector {
    /// Take in models the resolver found since the last call.
    pub fn sync_models(&mut self, resolver: &Resolver) {
        for (index, model) in resolver.models().iter().enumerate().skip(self.agg.n_models()) {
            let (table, _) = model_table(model);
            self.io.on_model(index as u32, &table);
            let tensors = model
                .tensors()
                .iter()
                .map(|t| TensorMeta {
                    name: t.name.clone(),
                    layer: t.layer,
                    component: t.component,
                    size_bytes: t.size_bytes,
                    file: t.file,
                    file_offset: t.file_offset,
                })
                .collect();
            let used = model.info().n_experts_used.and_then(|n| usize::try_from(n).ok());
            self.agg.add_model(tensors, used);
            for (file, f) in model.files().iter().enumerate() {
                let residency = match Residency::open(&f.path) {
                    Ok(r) => r,
                    Err(e) => {
                        log::warn!("cannot watch the page cache of {}: {e}", f.path.display());
                        continue;
                    }
                };
                let (tensors, ranges): (Vec<TensorKey>, Vec<(u64, u64)>) = self
                    .agg
                    .tensors()
                    .filter(|&((m, _), meta)| m == index as u32 && meta.file == file as u32)
                    .map(|(key, meta)| (key, (meta.file_offset, meta.size_bytes)))
                    .unzip();
                let plan = RangePlan::new(residency.size(), &ranges);
                self.files.push(WatchedFile { residency, plan, tensors });
            }
        }
    }

    pub fn on_event(&mut self, event: &Event, recorder: &mut Recorder<BufWriter<File>>) {
        match event {
            Event::Batch(b) => self.on_batch(b),
            Event::Block(b) => self.on_block(b),
            Event::PageFault(f) => {
                let (memory, _) = recorder.resolver.resolve_fault(f.address);
                let tensor = match memory {
                    Memory::ModelFile { model, tensor, .. } => Some((model, tensor)),
                    _ => None,
                };
                self.agg.on_fault(tensor);
            }
            Event::Node(n) => {
                let Some(t) = recorder.graphs.layout().decode(&n.tensor) else { return };
                let record = TensorRecord::of(n.address, &t, SLOT_DST);
                if let Some(layer) = tensor_name(&record).strip_prefix("ffn_moe_argsort-").and_then(|l| l.parse().ok())
                {
                    self.argsort_layers.insert(n.address, layer);
                }
                // Weights are leafs: a node's sources, never its nodes (whose
                // data is the compute buffer); resolving only those halves the work.
                if n.role == node_role::SOURCE {
                    self.on_source(n.uid, &record, recorder);
                } else if n.cache != 0 {
                    for source in recorder.graphs.cached_sources(n) {
                        self.on_source(n.uid, &source, recorder);
                    }
                }
            }
            Event::Graph(g) if g.flags & graph::DONE != 0 => {
                for &key in self.graph_weights.get(&g.uid).into_iter().flatten() {
                    self.agg.on_weights(key);
                }
            }
            Event::Routing(r) => {
                if let Some(&layer) = self.argsort_layers.get(&r.tensor) {
                    self.agg.on_route(0, layer, &r.experts);
                }
            }
            _ => {}
        }
    }

    /// A tensor graph `uid` reads: a weight counts towards its run.
    fn on_source(&mut self, uid: u64, record: &TensorRecord, recorder: &mut Recorder<BufWriter<File>>) {
        recorder.resolver.prepare_records(std::iter::once(record));
        if let Memory::ModelFile { model, tensor, .. } | Memory::Copy { model, tensor } =
            recorder.resolver.memory_of(record)
        {
            if self.graph_weights.len() >= MAX_GRAPHS && !self.graph_weights.contains_key(&uid) {
                self.graph_weights.clear();
            }
            self.graph_weights.entry(uid).or_default().insert((model, tensor));
        }
    }

    /// Arrays come token, positions, sequences, outputs, from one thread:
    /// a token array starts the next ubatch, the outputs end one.
    fn on_batch(&mut self, b: &InputRecord) {
        let array = match b.tensor {
            batch::TOKEN => BatchArray::Token,
            batch::POS => BatchArray::Pos,
            batch::SEQ => BatchArray::Seq,
            batch::OUTPUT => BatchArray::Output,
            _ => return,
        };
        let tid = b.header.tid;
        if array == BatchArray::Token {
            self.finish_ubatch(tid);
        }
        let values = b.i32s();
        let batch = Batch { ts_ns: b.header.ts_ns, tid, array, n_tokens: b.uid as u32, values };
        self.pending.entry(tid).or_default().set(batch);
        if array == BatchArray::Output {
            self.finish_ubatch(tid);
        }
    }

    fn finish_ubatch(&mut self, tid: u32) {
        let Some(arrays) = self.pending.remove(&tid) else { return };
        let (tokens, _) = self.requests.ubatch(&arrays, None, false);
        tokens.iter().for_each(|t| self.agg.on_token(t.seq, t.kind));
    }

    /// A read request's bytes once (a requeued request is issued again),
    /// split by tensor as the report splits them.
    fn on_block(&mut self, event: &tracer_common::BlockEvent) {
        let block = Block {
            ts_ns: event.header.ts_ns,
            tid: event.header.tid,
            tgid: event.header.tgid,
            cpu: event.header.cpu,
            kind: if event.kind == tracer_common::BlockKind::Issue as u32 {
                tracer_common::BlockKind::Issue
            } else {
                tracer_common::BlockKind::Complete
            },
            dev: event.dev,
            sector: event.sector,
            nr_sector: event.nr_sector,
            error: event.error,
            rwbs: String::from_utf8_lossy(c_str(&event.rwbs)).into_owned(),
            comm: String::new(),
        };
        let before = self.io.disk_bytes();
        let hits = self.io.on_block(&block, When::Between);
        if self.io.disk_bytes() == before {
            return;
        }
        for h in hits {
            let tensor = self.agg.has((h.model, h.tensor)).then_some((h.model, h.tensor));
            self.agg.on_disk(tensor, h.bytes);
        }
    }

    /// Page-cache residency of every model file now, per tensor and in total.
    pub fn residency(&mut self) -> ResidencySample {
        let mut sample = ResidencySample::default();
        for f in &mut self.files {
            sample.model_bytes += f.residency.size();
            let now = f.residency.refresh().and_then(|()| f.residency.sample(&f.plan));
            match now {
                Ok(now) => {
                    sample.resident_bytes += now.total;
                    sample.per_tensor.extend(f.tensors.iter().copied().zip(now.per_range));
                }
                Err(e) => log::debug!("page-cache snapshot: {e}"),
            }
        }
        sample
    }

    /// Close the interval ending at `now_s`.
    pub fn close(&mut self, now_s: f64, memory: Option<MemoryUse>) -> super::aggregate::Interval {
        let residency = self.residency();
        self.agg.close(now_s, &residency, memory)
    }
}
