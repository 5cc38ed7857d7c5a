//! The load-time walk: every event of `analyze::walk` filed into the
//! columns the queries scan. What bytes an op read comes from analyze
//! (`Tables::weight_read`, `usage::source_ranges`); this only places it.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use tracer_common::{BlockKind, PAGE_SIZE, PageCacheKind, markers};

use super::{
    Tensors,
    memmap::{self, BufferBuilder, IoEvent, MemoryMap, Read, ReadsBuilder},
    ops::{Ops, OpsBuilder},
    timeline::Timeline,
};
use crate::{
    analyze::{
        Analysis,
        io::{IoCorrelator, When},
        tensor::model_tensor,
        usage,
        walk::{Event, Sink, Tables},
    },
    format::{Descriptor, Memory, TraceError},
};

pub struct Builder {
    base_ns: u64,
    file_y0: Vec<Vec<u64>>,
    first_of_model: Vec<u32>,
    routed: BTreeMap<(u32, u32), BTreeSet<u32>>,
    io: IoCorrelator,
    /// Read requests issued and not completed: a requeued one is read once.
    in_flight: HashSet<(u32, u64)>,
    ops: OpsBuilder,
    reads: ReadsBuilder,
    buffer: BufferBuilder,
    cache_fills: Vec<IoEvent>,
    block_reads: Vec<IoEvent>,
    /// Timed ops' `(arrival index, thread)`.
    timed: Vec<(u32, u32)>,
    /// Ops so far.
    arrived: u32,
}

/// What the walk produced.
pub struct Built {
    pub ops: Ops,
    pub memmap: MemoryMap,
    pub timeline: Timeline,
}

impl Builder {
    pub fn new(a: &Analysis, tensors: &Tensors) -> Builder {
        let mut io = IoCorrelator::default();
        for (i, m) in a.models.iter().enumerate() {
            io.on_model(i as u32, m);
        }
        let mut first_of_model = Vec::new();
        let mut n = 0;
        for m in &a.models {
            first_of_model.push(n);
            n += m.tensors.len() as u32;
        }
        let mut ops = OpsBuilder::default();
        ops.reserve(usize::try_from(a.ops).unwrap_or(0));
        Builder {
            base_ns: a.header.start_monotonic_ns,
            file_y0: tensors.file_y0.clone(),
            first_of_model,
            routed: usage::routed_experts(a),
            io,
            in_flight: HashSet::new(),
            ops,
            reads: ReadsBuilder::default(),
            buffer: BufferBuilder::default(),
            cache_fills: Vec::new(),
            block_reads: Vec::new(),
            timed: Vec::new(),
            arrived: 0,
        }
    }

    fn rel(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.base_ns)
    }

    fn y_of(&self, model: u32, file: u32, offset: u64) -> Option<u64> {
        Some(self.file_y0.get(model as usize)?.get(file as usize)? + offset)
    }

    fn on_op(&mut self, e: &crate::analyze::walk::OpEvent, tables: &Tables) {
        let name = tables.op_name_ref(&e.op);
        let ubatch = e.ctx.ubatch;
        let start = self.rel(e.op.ts_ns);
        let combo = self.ops.combo(&e.op, &name, tables, &self.first_of_model);
        let mut weight_bytes = 0u64;
        if self.ops.has_weights(combo) {
            let slotted: Vec<(u32, &Descriptor)> =
                e.op.srcs.iter().map(|&(s, id)| (s, tables.descriptor(id))).collect();
            let op_name = self.ops.op_name_id(combo);
            let u = ubatch.unwrap_or(memmap::NO_UBATCH);
            for &(slot, d) in &slotted {
                let Some(w) = tables.weight_read(&name, ubatch, (slot, d), &slotted) else { continue };
                weight_bytes += w.bytes;
                let Some(t) = model_tensor(tables.models, w.weight.model, w.weight.tensor) else { continue };
                let routed = t.layer.zip(ubatch).and_then(|(l, u)| self.routed.get(&(u, l)));
                let from = t.file_offset + w.weight.offset;
                let (ranges, _) = usage::source_ranges(&name, slot, d, t, from, &e.op.token_ids, routed);
                let Some(base) = self.y_of(w.weight.model, t.file, 0) else { continue };
                let tensor = self.first_of_model[w.weight.model as usize] + w.weight.tensor;
                for r in ranges {
                    let read = Read::new(start, base + r.start, u, tensor, w.weight.copy, op_name, self.arrived);
                    self.reads.push(read, r.end - r.start);
                }
            }
        }
        if let Some(u) = ubatch {
            let ids = std::iter::once(e.op.dst).chain(e.op.srcs.iter().map(|&(_, id)| id));
            for id in ids {
                let d = tables.descriptor(id);
                if matches!(d.memory, Memory::Anon | Memory::Copy { .. }) {
                    self.buffer.touch(u, id, d, self.first_of_model.as_slice());
                }
            }
        }
        let dur = e.end_ns.map(|end| end.saturating_sub(e.op.ts_ns));
        if e.op.timed() {
            self.timed.push((self.arrived, e.op.tid));
        }
        self.arrived += 1;
        self.ops.push(e.ctx.seq, start, dur, ubatch, combo, weight_bytes);
    }

    pub fn finish(self, a: &Analysis, tensors: &Tensors) -> Built {
        let base = self.base_ns;
        let faults = |major: bool| -> Vec<IoEvent> {
            a.io.fault_pages
                .iter()
                .filter(|f| f.major == major)
                .filter_map(|f| {
                    Some(IoEvent {
                        t: f.ts_ns.saturating_sub(base),
                        ubatch: match f.when {
                            When::Ubatch(u) => u,
                            _ => memmap::NO_UBATCH,
                        },
                        y0: tensors.y_of(f.model, f.file, f.file_offset / PAGE_SIZE * PAGE_SIZE)?,
                        len: PAGE_SIZE,
                    })
                })
                .collect()
        };
        let (fault_major, fault_minor) = (faults(true), faults(false));
        let (ops, order) = self.ops.finish();
        // Ops nearly always arrive in row order: no map is then needed.
        let row_of_arrival = order.map(|order| {
            let mut rows = vec![0u32; order.len()];
            for (row, &arrival) in order.iter().enumerate() {
                rows[arrival as usize] = row as u32;
            }
            rows
        });
        let row_of = |arrival: u32| row_of_arrival.as_ref().map_or(arrival, |rows| rows[arrival as usize]);
        let threads: Vec<(u32, u32)> = self.timed.iter().map(|&(arrival, tid)| (row_of(arrival), tid)).collect();
        let io = [fault_major, fault_minor, self.cache_fills, self.block_reads];
        // Two cores: the timeline beside the memory map (with its own copy
        // of the I/O events, a small fraction of the ops).
        let counted = io.clone();
        let (timeline, memmap) = std::thread::scope(|scope| {
            let (ops, threads) = (&ops, &threads);
            let timeline = scope.spawn(move || {
                let [a0, a1, a2, a3] = &counted;
                Timeline::new(a, ops, threads, [a0, a1, a2, a3])
            });
            let memmap = MemoryMap::new(a, tensors, self.reads, self.buffer, io, row_of_arrival.as_deref());
            (timeline.join().expect("the timeline thread does not panic"), memmap)
        });
        Built { ops, memmap, timeline }
    }
}

impl Sink for Builder {
    type Error = TraceError;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), TraceError> {
        match event {
            Event::Op(e) => self.on_op(e, tables),
            Event::Marker(ctx, m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                if let Some(u) = ctx.ubatch {
                    self.buffer.flush(u);
                }
            }
            Event::PageCache(ctx, p) if p.kind == PageCacheKind::Add => {
                if let Some((model, file)) = p.file
                    && let Some(y0) = self.y_of(model, file, p.index * PAGE_SIZE)
                {
                    self.cache_fills.push(IoEvent {
                        t: self.rel(p.ts_ns),
                        ubatch: ctx.ubatch.unwrap_or(memmap::NO_UBATCH),
                        y0,
                        len: PAGE_SIZE << p.order.min(20),
                    });
                }
            }
            Event::Block(_, b) if b.kind == BlockKind::Complete => {
                self.in_flight.remove(&(b.dev, b.sector));
            }
            Event::Block(ctx, b) if b.rwbs.contains('R') => {
                if !self.in_flight.insert((b.dev, b.sector)) {
                    return Ok(());
                }
                for (model, file, from, to) in self.io.file_ranges(b.dev, b.sector, b.nr_sector) {
                    if from < to
                        && let Some(y0) = self.y_of(model, file, from)
                    {
                        self.block_reads.push(IoEvent {
                            t: self.rel(b.ts_ns),
                            ubatch: ctx.ubatch.unwrap_or(memmap::NO_UBATCH),
                            y0,
                            len: to - from,
                        });
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}
