//! The second pass every export shares: re-read the trace in order and hand
//! each event to a sink with its context (ubatch, running op, duration).
//!
//! An op lasts as [`super::op_time`] says, so an op is handed over when its
//! end is seen: ops arrive in end order, everything else in trace order.
//! Memory stays bounded: one pending op per thread plus the reader's tables.

use std::{borrow::Cow, fs::File, io::BufReader, path::Path};

use indicatif::ProgressBar;
use tracer_common::markers;

use super::{
    Analysis, Phase,
    op_time::OpClock,
    tensor::{AddressIndex, FileHit, WeightRef, is_expert_tensor, model_tensor, op_weight_bytes, weight_of},
};
use crate::format::{
    Descriptor, Lost, ModelTable, Op, Record, TraceError, TraceReader, Trailer,
    reader::{Block, Fault, Marker, PageCache},
};

/// Where an event happened.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Context {
    /// Order of the event in the file (ops by their start).
    pub seq: u64,
    pub ubatch: Option<u32>,
}

pub struct OpEvent {
    pub ctx: Context,
    pub op: Op,
    /// `None` when the trace ended while it ran, or the op is not timed
    /// ([`Op::timed`]: captured with its graph, it has no time of its own).
    pub end_ns: Option<u64>,
}

pub struct FaultEvent {
    pub ctx: Context,
    pub fault: Fault,
    /// `seq` of the op running on the faulting thread (timed ops), else of
    /// the op of the current graph reading the faulting address.
    pub op_seq: Option<u64>,
    /// Whether that op is timed, so has a slice a timeline can link to.
    pub op_timed: bool,
    /// The model file position the address falls in.
    pub hit: Option<FileHit>,
}

/// One event. New record kinds become new variants.
pub enum Event {
    Op(OpEvent),
    Marker(Context, Marker),
    Fault(FaultEvent),
    /// A model-file page entering the page cache, or `filemap_fault` on one.
    PageCache(Context, PageCache),
    /// A block request issued or completed on a watched device.
    Block(Context, Block),
    Lost(Lost),
    End(Box<Trailer>),
}

/// An op's sources with their slots (the reader refuses more than
/// `MAX_SRC`).
pub type Slotted<'a> = smallvec::SmallVec<[(u32, &'a Descriptor); tracer_common::ggml::MAX_SRC]>;

/// What a sink may look up while handling an event.
pub struct Tables<'a> {
    pub analysis: &'a Analysis,
    descriptors: &'a [Descriptor],
    pub models: &'a [ModelTable],
    token_of: &'a [Option<u32>],
}

impl<'a> Tables<'a> {
    pub fn descriptor(&self, id: u32) -> &'a Descriptor {
        &self.descriptors[id as usize]
    }

    /// `op`'s sources, each with its slot: what [`Self::weight_read`]
    /// takes, on the stack (per op, a heap list was a few percent of a pass).
    pub fn slotted(&self, op: &Op) -> Slotted<'a> {
        op.srcs.iter().map(|&(slot, id)| (slot, self.descriptor(id))).collect()
    }

    pub fn op_name(&self, op: &Op) -> String {
        self.op_name_ref(op).into_owned()
    }

    /// [`Self::op_name`], borrowed from the header's table when it is there.
    pub fn op_name_ref(&self, op: &Op) -> Cow<'a, str> {
        super::correlate::op_name_ref(&self.analysis.header, self.descriptor(op.dst).op)
    }

    pub fn phase(&self, ubatch: Option<u32>) -> Option<Phase> {
        ubatch.and_then(|u| self.analysis.ubatches.get(u as usize)).map(|u| u.phase)
    }

    /// What op `op_name` of `ubatch` reads from its weight source `slot`
    /// (`None` if that source is no model tensor): the routed experts'
    /// slices of an MoE expert tensor when the ubatch's routing was recorded,
    /// else [`op_weight_bytes`]. Every per-token weight figure (per ubatch,
    /// tensor, layer, component, op row) is charged by this one rule.
    pub fn weight_read(
        &self,
        op_name: &str,
        ubatch: Option<u32>,
        (slot, d): (u32, &Descriptor),
        slotted: &[(u32, &Descriptor)],
    ) -> Option<WeightRead> {
        let weight = weight_of(d)?;
        let t = model_tensor(self.models, weight.model, weight.tensor)?;
        let routed = ubatch
            .and_then(|u| self.analysis.ubatches.get(u as usize))
            .and_then(|u| u.weights.get(&(weight.model, weight.tensor)))
            .filter(|w| w.routed_experts.is_some() && is_expert_tensor(t));
        Some(match routed {
            Some(w) => WeightRead { weight, bytes: w.bytes, routed: true, upper_bound: false },
            None => WeightRead {
                weight,
                bytes: op_weight_bytes(op_name, slot, d, t, slotted),
                routed: false,
                upper_bound: is_expert_tensor(t),
            },
        })
    }

    /// Index among generate ubatches, i.e. which generated token.
    pub fn token_index(&self, ubatch: Option<u32>) -> Option<u32> {
        self.token_of.get(ubatch? as usize).copied().flatten()
    }
}

/// Per ubatch: its index among generate ubatches.
pub fn token_indices(a: &Analysis) -> Vec<Option<u32>> {
    let mut n = 0;
    a.ubatches
        .iter()
        .map(|u| {
            (u.phase == Phase::Generate).then(|| {
                n += 1;
                n - 1
            })
        })
        .collect()
}

/// Whoever consumes pass two; its error type carries the trace's own.
pub trait Sink {
    type Error: From<TraceError>;
    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), Self::Error>;
}

/// Event count of pass two, for progress bars.
pub fn event_total(a: &Analysis) -> u64 {
    a.ops + a.faults + a.ubatches.len() as u64 * 2 + a.decodes.len() as u64
}

const PROGRESS_STEP: u64 = 4096;

pub fn walk<S: Sink + ?Sized>(
    path: &Path,
    analysis: &Analysis,
    progress: &ProgressBar,
    sink: &mut S,
) -> Result<(), S::Error> {
    let mut reader: TraceReader<BufReader<File>> = TraceReader::open(path)?;
    let mut seq = 0u64;
    let mut ubatch: Option<u32> = None;
    let mut next_ubatch = 0u32;
    let mut clock: OpClock<OpEvent> = OpClock::default();
    let mut graph_ops = GraphOps::default();
    // The index only places faults; without any, reading ahead is wasted.
    let mut index = if analysis.faults > 0 { prescan(path)? } else { AddressIndex::default() };
    let token_of = token_indices(analysis);
    // The bar is advanced in steps: `inc` reads the clock, per event that is
    // a few percent of a row export.
    let mut unreported = 0u64;
    let mut emit = |event: Event, reader: &TraceReader<BufReader<File>>| -> Result<(), S::Error> {
        unreported += 1;
        if unreported == PROGRESS_STEP {
            progress.inc(std::mem::take(&mut unreported));
        }
        let tables =
            Tables { analysis, descriptors: reader.descriptors(), models: reader.models(), token_of: &token_of };
        sink.event(&event, &tables)
    };
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Op(op) => {
                let ctx = Context { seq, ubatch };
                seq += 1;
                if !op.timed() {
                    graph_ops.add(&op, ctx.seq);
                    emit(Event::Op(OpEvent { ctx, op, end_ns: None }), &reader)?;
                } else if let Some(ended) = clock.start(op.tid, op.ts_ns, OpEvent { ctx, op, end_ns: None }) {
                    emit(Event::Op(ended.into_op()), &reader)?;
                }
            }
            Record::Marker(m) => {
                if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN {
                    graph_ops.clear();
                    for ended in clock.graph_returned(m.ts_ns) {
                        emit(Event::Op(ended.into_op()), &reader)?;
                    }
                }
                if m.cookie == markers::SCHED_GRAPH_COMPUTE {
                    graph_ops.clear();
                    ubatch = Some(next_ubatch);
                    next_ubatch += 1;
                }
                let ctx = Context { seq, ubatch };
                seq += 1;
                if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN {
                    ubatch = None;
                }
                emit(Event::Marker(ctx, m), &reader)?;
            }
            Record::Fault(fault) => {
                index.learn(reader.descriptors(), reader.models());
                let ctx = Context { seq, ubatch };
                seq += 1;
                // A timed op runs on the faulting thread; otherwise the op of
                // the current graph reading the faulting address is the cause.
                let running = clock.running_on(fault.tid).map(|o| o.ctx.seq);
                let op_timed = running.is_some();
                let op_seq = running.or_else(|| graph_ops.reading(fault.address, reader.descriptors()));
                // Newer traces carry the file position; older ones are resolved here.
                let hit = match fault.file {
                    Some(pos) => {
                        let tensor = index.tensor_at(pos.model, pos.file, pos.offset, reader.models());
                        Some(FileHit { model: pos.model, file: pos.file, file_offset: pos.offset, tensor })
                    }
                    None => index.lookup(fault.address, reader.models()),
                };
                emit(Event::Fault(FaultEvent { ctx, fault, op_seq, op_timed, hit }), &reader)?;
            }
            Record::PageCache(p) => {
                let ctx = Context { seq, ubatch };
                seq += 1;
                emit(Event::PageCache(ctx, p), &reader)?;
            }
            Record::Block(b) => {
                let ctx = Context { seq, ubatch };
                seq += 1;
                emit(Event::Block(ctx, b), &reader)?;
            }
            Record::Lost(lost) => emit(Event::Lost(lost), &reader)?,
            Record::End(trailer) => {
                for ended in clock.unfinished() {
                    emit(Event::Op(ended.into_op()), &reader)?;
                }
                emit(Event::End(trailer), &reader)?;
            }
            _ => {}
        }
    }
    for ended in clock.unfinished() {
        emit(Event::Op(ended.into_op()), &reader)?;
    }
    progress.inc(unreported);
    Ok(())
}

/// Faults during load come before any descriptor shows where the model is
/// mapped: learn the mapping bases first, reading until every model file has
/// one (usually the first graph) or a bounded number of records.
fn prescan(path: &Path) -> Result<AddressIndex, TraceError> {
    const LIMIT: u64 = 1 << 20;
    let mut reader: TraceReader<BufReader<File>> = TraceReader::open(path)?;
    let mut index = AddressIndex::default();
    let mut n = 0;
    while n < LIMIT
        && let Some(record) = reader.next_record()?
    {
        n += 1;
        if let Record::Op(_) = record {
            index.learn(reader.descriptors(), reader.models());
            let files: usize = reader.models().iter().map(|m| m.files.len()).sum();
            if files > 0 && index.files() >= files {
                break;
            }
        }
    }
    index.learn(reader.descriptors(), reader.models());
    Ok(index)
}

impl super::op_time::Ended<OpEvent> {
    fn into_op(self) -> OpEvent {
        OpEvent { end_ns: self.end_ns, ..self.item }
    }
}

/// An op's `(slot, descriptor)` sources, shared with its record.
type Sources = std::sync::Arc<[(u32, u32)]>;

/// The untimed ops of the current ubatch, kept to find the op whose source
/// holds a faulting address. Their byte ranges are worked out only when a
/// fault asks: most graphs fault nowhere, and working them out per op was a
/// sixth of `report`.
#[derive(Default)]
struct GraphOps {
    /// `(op seq, sources)`, in op order.
    ops: Vec<(u64, Sources)>,
}

impl GraphOps {
    fn add(&mut self, op: &Op, seq: u64) {
        self.ops.push((seq, op.srcs.clone()));
    }

    fn clear(&mut self) {
        self.ops.clear();
    }

    /// The first op whose source holds `address`.
    fn reading(&self, address: u64, descriptors: &[Descriptor]) -> Option<u64> {
        self.ops.iter().find_map(|(seq, srcs)| {
            srcs.iter()
                .any(|&(_, id)| {
                    let d = &descriptors[id as usize];
                    d.data != 0
                        && super::tensor::view_bytes(d)
                            .is_some_and(|bytes| (d.data..d.data.saturating_add(bytes)).contains(&address))
                })
                .then_some(*seq)
        })
    }
}

/// Bytes an op reads from one weight source ([`Tables::weight_read`]).
#[derive(Clone, Copy, Debug)]
pub struct WeightRead {
    pub weight: WeightRef,
    pub bytes: u64,
    /// `bytes` are the ubatch's routed expert slices, so they differ
    /// between runs of the same op.
    pub routed: bool,
    /// An MoE expert tensor whose routing was not recorded, so `bytes` are
    /// its view, not the slices read: an upper bound.
    pub upper_bound: bool,
}

/// Descriptors of an op's sources, in slot order.
pub fn sources<'a>(op: &Op, tables: &'a Tables) -> Vec<&'a Descriptor> {
    op.srcs.iter().map(|&(_, id)| tables.descriptor(id)).collect()
}
