//! Correlation: from a trace's raw records to decode calls, ubatches and
//! phases, with the weight tensors each ubatch read.
//!
//! Phases follow llama.cpp's own accounting (`llama_context::synchronize`):
//! a decode of more than one token adds its tokens to "prompt eval", a decode
//! of exactly one token is one "eval" run, and `llama_perf_context_reset`
//! restarts both counters, so decodes before the last reset (the warm-up) are
//! not counted. A ubatch's token count comes from the graph itself: the
//! GET_ROWS that reads the token-embedding weight, whose index source holds
//! one id per token. Graphs without it (KV-cache shifts) are auxiliary.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    io::Read,
};

use serde::{Deserialize, Serialize};
use tracer_common::{ggml::OP_MUL_MAT_ID, markers};

use super::{
    io,
    op_time::OpClock,
    sequences,
    tensor::{model_tensor, name_layer, op_weight_bytes},
    weights::{Interner, Weights},
};
use crate::format::{
    Descriptor, Header, Lost, Memory, ModelTable, Op, Record, TraceError, TraceReader, Trailer,
    reader::{Batch, Marker},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before llama's last perf-counter reset: warm-up runs.
    Warmup,
    Prompt,
    Generate,
    /// A graph with no token input (e.g. a KV-cache shift), or one of
    /// llama-server's start-up check of its context.
    Aux,
}

/// Which of whisper.cpp's steps computed a graph: its encode step runs the
/// conv, encoder and cross-attention graphs, its decode step the decoder's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Encoder,
    Decoder,
}

/// How often one ubatch read one weight tensor, and through what memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightUse {
    /// Reads through the model file mapping.
    pub file_backed: u32,
    /// Reads of a copy (repacked, or loaded without mmap).
    pub copy: u32,
    /// Bytes of it the ubatch read: the largest single access (the viewed
    /// bytes; one row per token for the embedding lookup), as `ttrace
    /// report` counts a token's weight bytes. For an MoE expert tensor
    /// whose layer's routing was recorded: the routed experts' slices.
    pub bytes: u64,
    /// Expert tensors with recorded routing: how many distinct experts the
    /// ubatch's tokens were routed to (`bytes` is that many slices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ubatch {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    /// The decode call it belongs to.
    pub decode: Option<u32>,
    pub n_tokens: Option<u32>,
    pub token_ids: Vec<i32>,
    pub phase: Phase,
    /// whisper.cpp's graphs: the step that computed it (`None` elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    pub ops: u64,
    /// Model-file bytes read from disk while this graph ran, and its faults.
    pub disk_bytes: u64,
    pub disk_requests: u64,
    pub faults_major: u64,
    pub faults_minor: u64,
    /// `(model, tensor)` of each weight read.
    pub weights: Weights,
    /// MoE routing, per (layer, token): the experts ranked, best first, and
    /// the ones the layer used (its `MUL_MAT_ID` reads the first k).
    pub routing: Vec<RoutedToken>,
    /// Per MoE layer, experts used per token (`k`, the width of the ids
    /// `MUL_MAT_ID` reads).
    #[serde(skip)]
    pub experts_used: BTreeMap<u32, u32>,
    /// Per token: sequence, position, prompt or generated (traces that
    /// recorded the ubatch's arrays; see [`sequences`]).
    pub tokens: Vec<sequences::TokenInfo>,
    #[serde(skip)]
    pub arrays: Option<sequences::UbatchArrays>,
    /// The rows' `seq_ids` and `positions` columns (see [`sequences`]).
    #[serde(skip)]
    pub sequences: Option<(String, String)>,
}

impl Ubatch {
    /// A graph that has just started: nothing known of it yet but when and
    /// in which decode call.
    pub fn started(index: u32, start_ns: u64, decode: Option<u32>) -> Ubatch {
        Ubatch {
            index,
            start_ns,
            end_ns: None,
            decode,
            n_tokens: None,
            token_ids: Vec::new(),
            phase: Phase::Aux,
            stage: None,
            ops: 0,
            disk_bytes: 0,
            disk_requests: 0,
            faults_major: 0,
            faults_minor: 0,
            weights: Weights::default(),
            routing: Vec::new(),
            experts_used: BTreeMap::new(),
            tokens: Vec::new(),
            arrays: None,
            sequences: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoutedToken {
    pub layer: Option<u32>,
    /// Row of the layer's routing: the token's index in the ubatch, except
    /// where llama.cpp keeps only the output tokens (the last layer of a
    /// prompt), whose rows are those outputs in order.
    pub row: u32,
    pub selected: Vec<i32>,
    pub ranking: Vec<i32>,
}

/// The call that decoded a batch: `llama_decode` (llama-cpp-python) or
/// `llama_process` (llama.cpp's own tools).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecodeFunction {
    #[serde(rename = "llama_decode")]
    LlamaDecode,
    #[serde(rename = "llama_process")]
    LlamaProcess,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Decode {
    pub index: u32,
    pub ts_ns: u64,

    pub function: DecodeFunction,
    pub ubatches: Vec<u32>,
    pub n_tokens: u32,
    pub phase: Phase,
    /// Made by llama-server's start-up check of its context
    /// (`common_context_can_seq_rm`): no prompt, whatever its tokens.
    pub context_check: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Analysis {
    pub header: Header,
    pub models: Vec<ModelTable>,
    pub decodes: Vec<Decode>,
    pub ubatches: Vec<Ubatch>,
    pub ops: u64,
    /// Time per op name, by the rule of [`super::op_time`].
    pub op_time_ns: BTreeMap<String, u64>,
    /// Ops seen outside any ubatch graph (no graph hook in the target).
    pub ops_outside_ubatches: u64,
    pub op_counts: BTreeMap<String, u64>,
    pub faults: u64,
    pub lost: Lost,
    pub trailer: Option<Trailer>,
    pub truncated: bool,
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    /// Prompt tokens and eval runs, counted as llama.cpp counts them.
    pub prompt_tokens: u64,
    pub generate_runs: u64,
    pub warmup_decodes: u64,
    /// Prompt and generated tokens per sequence and request, warm-up apart
    /// (`None`: the trace has no decode batches).
    pub tokens: Option<sequences::TokenCounts>,
    pub requests: Vec<sequences::Request>,
    /// Page faults, page-cache fills and disk reads of the model files.
    pub io: io::IoAnalysis,
    /// ggml's backend buffers (`ttrace run`/`attach` record them by default).
    pub buffers: super::buffers::Buffers,
}

impl Analysis {
    pub fn op_name(&self, op: i32) -> String {
        op_name(&self.header, op)
    }

    pub fn duration_ns(&self) -> u64 {
        match (self.first_ts_ns, self.last_ts_ns) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        }
    }
}

pub fn op_name(header: &Header, op: i32) -> String {
    op_name_ref(header, op).into_owned()
}

/// [`op_name`], borrowed from the header's table when it is there (asked
/// per op: an allocation each was a sixth of `report`).
pub fn op_name_ref(header: &Header, op: i32) -> std::borrow::Cow<'_, str> {
    match usize::try_from(op).ok().and_then(|i| header.op_names.get(i)) {
        Some(name) => std::borrow::Cow::Borrowed(name),
        None => std::borrow::Cow::Owned(format!("op#{op}")),
    }
}

/// Read the whole trace once, in order, keeping per-ubatch state only.
pub fn analyze<R: Read>(mut reader: TraceReader<R>) -> Result<Analysis, TraceError> {
    let mut a = Analysis { header: reader.header().clone(), ..Default::default() };
    let mut bounds = Boundaries::default();
    // Per thread: the op still running (its op id). Counts and times are
    // kept by op id and named at the end: a name per op, allocated and
    // looked up in a map of strings, was a sixth of the pass.
    let mut clock: OpClock<i32> = OpClock::default();
    let mut counts: BTreeMap<i32, u64> = BTreeMap::new();
    let mut times: BTreeMap<i32, u64> = BTreeMap::new();
    let mut io = io::IoCorrelator::default();
    while let Some(record) = reader.next_record()? {
        let ts = match &record {
            Record::Op(op) => Some(op.ts_ns),
            Record::Marker(m) => Some(m.ts_ns),
            Record::Fault(f) => Some(f.ts_ns),
            _ => None,
        };
        if let Some(ts) = ts {
            a.first_ts_ns = Some(a.first_ts_ns.map_or(ts, |f| f.min(ts)));
            a.last_ts_ns = Some(a.last_ts_ns.map_or(ts, |l| l.max(ts)));
        }
        match record {
            Record::Marker(m) => {
                a.buffers.on_marker(&m);
                bounds.on_marker(&mut a, &m);
                // A graph's last op on each thread lasts until the graph returns.
                if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN {
                    for ended in clock.graph_returned(m.ts_ns) {
                        *times.entry(ended.item).or_default() += ended.duration_ns();
                    }
                }
            }
            Record::Op(op) => {
                a.ops += 1;
                for &(_, id) in op.srcs.iter() {
                    let d = reader.descriptor(id);
                    if !matches!(d.memory, Memory::ModelFile { .. }) {
                        a.buffers.note_read(d.data);
                    }
                }
                io.on_op(op.tid);
                let id = reader.descriptor(op.dst).op;
                *counts.entry(id).or_default() += 1;
                let name = op_name_ref(reader.header(), id);
                match bounds.current {
                    // Op names may arrive late (a HOOKS frame, for dlopen'ed libraries).
                    Some(u) => account_op(&mut a.ubatches[u], &op, &name, &reader),
                    None => a.ops_outside_ubatches += 1,
                }
                if op.timed()
                    && let Some(ended) = clock.start(op.tid, op.ts_ns, id)
                {
                    *times.entry(ended.item).or_default() += ended.duration_ns();
                }
            }
            Record::Routing(r) => {
                if let Some(u) = bounds.current {
                    let layer = r.node.and_then(|d| name_layer(&reader.descriptor(d).name));
                    let routed = RoutedToken { layer, row: r.row, selected: Vec::new(), ranking: r.experts };
                    a.ubatches[u].routing.push(routed);
                }
            }
            Record::Fault(fault) => {
                a.faults += 1;
                io.on_fault(&fault, when(bounds.current, &a.ubatches));
            }
            Record::PageCache(event) => io.on_page_cache(&event),
            Record::Block(event) => {
                io.on_block(&event, when(bounds.current, &a.ubatches));
            }
            Record::Batch(b) => bounds.on_batch(b),
            Record::Buffer(b) => a.buffers.on_record(&b),
            Record::Lost(lost) => a.lost = lost,
            Record::End(trailer) => a.trailer = Some(*trailer),
            Record::Model(m) => io.on_model(m, &reader.models()[m as usize]),
            // Node values are read by `analyze::values`, on demand.
            Record::Value(_) => {}
        }
    }
    a.buffers.finish(reader.descriptors());
    a.header = reader.header().clone();
    for (id, n) in counts {
        *a.op_counts.entry(op_name(&a.header, id)).or_default() += n;
    }
    for (id, ns) in times {
        *a.op_time_ns.entry(op_name(&a.header, id)).or_default() += ns;
    }
    a.truncated = reader.truncated;
    a.io = io.finish();
    for u in &mut a.ubatches {
        if let Some(w) = a.io.by_when.get(&io::When::Ubatch(u.index)) {
            (u.disk_bytes, u.disk_requests) = (w.disk.bytes, w.disk.requests);
            (u.faults_major, u.faults_minor) = (w.faults_major, w.faults_minor);
        }
    }
    a.models = reader.models().to_vec();
    for u in &mut a.ubatches {
        select_experts(u, &a.models);
    }
    assign_phases(&mut a, bounds);
    Ok(a)
}

/// Ubatch and decode bookkeeping from the boundary markers, shared by
/// `analyze` and the exports' lighter phase scan.
#[derive(Default)]
pub(crate) struct Boundaries {
    /// The ubatch graph running now.
    pub current: Option<usize>,
    pub decodes_before_reset: usize,
    /// Per thread: the arrays of the ubatch it is about to compute.
    pending: HashMap<u32, sequences::UbatchArrays>,
    /// Threads inside `common_context_can_seq_rm`.
    in_context_check: HashSet<u32>,
    /// Per thread: the whisper.cpp step it last entered.
    whisper_stage: HashMap<u32, Stage>,
    /// The distinct weight lists of the ubatches so far.
    weights: Interner,
}

impl Boundaries {
    pub(crate) fn on_marker(&mut self, a: &mut Analysis, m: &Marker) {
        match m.cookie {
            markers::SCHED_GRAPH_COMPUTE => {
                // The ubatch before is done: its reads join an equal list.
                if let Some(done) = a.ubatches.last_mut() {
                    self.weights.intern(&mut done.weights);
                }
                let index = a.ubatches.len() as u32;
                let decode = a.decodes.len().checked_sub(1).map(|d| d as u32);
                if let Some(d) = decode {
                    a.decodes[d as usize].ubatches.push(index);
                }
                a.ubatches.push(Ubatch {
                    arrays: self.pending.remove(&m.tid),
                    stage: self.whisper_stage.get(&m.tid).copied(),
                    ..Ubatch::started(index, m.ts_ns, decode)
                });
                self.current = Some(index as usize);
            }
            markers::SCHED_GRAPH_COMPUTE_RETURN => {
                if let Some(u) = self.current.take() {
                    a.ubatches[u].end_ns = Some(m.ts_ns);
                }
            }
            // llama_process(ctx, type, batch): only DECODE (1) runs the decoder.
            markers::LLAMA_DECODE | markers::LLAMA_PROCESS if m.cookie == markers::LLAMA_DECODE || m.args[1] == 1 => {
                let function = if m.cookie == markers::LLAMA_DECODE {
                    DecodeFunction::LlamaDecode
                } else {
                    DecodeFunction::LlamaProcess
                };
                let index = a.decodes.len() as u32;
                a.decodes.push(Decode {
                    index,
                    ts_ns: m.ts_ns,

                    function,
                    ubatches: Vec::new(),
                    n_tokens: 0,
                    phase: Phase::Aux,
                    context_check: self.in_context_check.contains(&m.tid),
                });
            }
            markers::LLAMA_PERF_RESET => self.decodes_before_reset = a.decodes.len(),
            markers::WHISPER_ENCODE => {
                self.whisper_stage.insert(m.tid, Stage::Encoder);
            }
            markers::WHISPER_DECODE => {
                self.whisper_stage.insert(m.tid, Stage::Decoder);
            }
            markers::SEQ_RM_CHECK => {
                self.in_context_check.insert(m.tid);
            }
            markers::SEQ_RM_CHECK_RETURN => {
                self.in_context_check.remove(&m.tid);
            }
            _ => {}
        }
    }

    /// A ubatch's array, recorded as llama.cpp starts it: it belongs to the
    /// next graph its thread computes.
    pub(crate) fn on_batch(&mut self, b: Batch) {
        self.pending.entry(b.tid).or_default().set(b);
    }
}

/// When an I/O event happened relative to the ubatch graphs.
pub fn when(current: Option<usize>, ubatches: &[Ubatch]) -> io::When {
    match current {
        Some(u) => io::When::Ubatch(u as u32),
        None if ubatches.is_empty() => io::When::Load,
        None => io::When::Between,
    }
}

fn account_op<R: Read>(ubatch: &mut Ubatch, op: &Op, name: &str, reader: &TraceReader<R>) {
    ubatch.ops += 1;
    let get_rows = reader.get_rows_op();
    let dst = reader.descriptor(op.dst);
    // Only the embedding lookup's bytes depend on the other sources (its ids).
    let slotted: Vec<(u32, &Descriptor)> = if Some(dst.op) == get_rows {
        op.srcs.iter().map(|&(s, id)| (s, reader.descriptor(id))).collect()
    } else {
        Vec::new()
    };
    for &(slot, id) in op.srcs.iter() {
        let src: &Descriptor = reader.descriptor(id);
        let (model, tensor, copy) = match src.memory {
            Memory::ModelFile { model, tensor, .. } => (model, tensor, false),
            Memory::Copy { model, tensor } => (model, tensor, true),
            _ => continue,
        };
        let bytes = reader
            .models()
            .get(model as usize)
            .and_then(|m| m.tensors.get(tensor as usize))
            .map_or(0, |t| op_weight_bytes(name, slot, src, t, &slotted));
        let usage = ubatch.weights.make_mut().entry((model, tensor)).or_default();
        usage.bytes = usage.bytes.max(bytes);
        if copy {
            usage.copy += 1;
        } else {
            usage.file_backed += 1;
        }
    }
    if ubatch.n_tokens.is_none() {
        take_token_input(ubatch, op, reader);
    }
    // MUL_MAT_ID(experts, input, ids): ids (slot 2) holds k experts per token.
    if name == OP_MUL_MAT_ID
        && let Some(&(_, ids)) = op.srcs.iter().find(|(slot, _)| *slot == 2)
        && let Some(layer) = name_layer(&dst.name)
    {
        ubatch.experts_used.insert(layer, reader.descriptor(ids).ne[0].max(0) as u32);
    }
}

/// Each routed token's selected experts (the first k of its ranking), and
/// each expert tensor's bytes: the slices of the experts its layer's tokens
/// were routed to.
fn select_experts(ubatch: &mut Ubatch, models: &[ModelTable]) {
    let mut routed: BTreeMap<u32, BTreeSet<i32>> = BTreeMap::new();
    for t in &mut ubatch.routing {
        let k = t.layer.and_then(|l| ubatch.experts_used.get(&l)).map_or(0, |&k| k as usize);
        t.selected = t.ranking[..k.min(t.ranking.len())].to_vec();
        if let Some(layer) = t.layer {
            routed.entry(layer).or_default().extend(&t.selected);
        }
    }
    if routed.is_empty() {
        // Nothing to change: a list shared with other ubatches stays shared.
        return;
    }
    for (&(model, tensor), usage) in ubatch.weights.make_mut() {
        let Some(t) = model_tensor(models, model, tensor) else { continue };
        if let (Some(slice), Some(experts)) = (t.expert_bytes, t.layer.and_then(|l| routed.get(&l))) {
            usage.bytes = usage.bytes.min(experts.len() as u64 * slice);
            usage.routed_experts = Some(experts.len() as u32);
        }
    }
}

/// A ubatch's token count and ids come from its token-embedding lookup:
/// GET_ROWS(weight, ids), whose slot-1 source holds one id per token. Sets
/// them and says whether `op` was that lookup.
pub(crate) fn take_token_input<R: Read>(ubatch: &mut Ubatch, op: &Op, reader: &TraceReader<R>) -> bool {
    if Some(reader.descriptor(op.dst).op) != reader.get_rows_op() {
        return false;
    }
    let reads_weight = op.srcs.iter().any(|&(slot, id)| {
        slot == 0 && matches!(reader.descriptor(id).memory, Memory::ModelFile { .. } | Memory::Copy { .. })
    });
    let Some(&(_, ids)) = op.srcs.iter().find(|(slot, _)| *slot == 1) else { return false };
    if !reads_weight {
        return false;
    }
    ubatch.n_tokens = u32::try_from(reader.descriptor(ids).ne[0]).ok();
    ubatch.token_ids = op.token_ids.clone();
    true
}

/// Decodes before llama's perf reset are warm-up; the rest are prompt or
/// generate by their token count, and ubatches take their decode's phase.
pub(crate) fn assign_phases(a: &mut Analysis, bounds: Boundaries) {
    let decodes_before_reset = bounds.decodes_before_reset;
    for decode in &mut a.decodes {
        decode.n_tokens = decode.ubatches.iter().filter_map(|&u| a.ubatches[u as usize].n_tokens).sum();
        decode.phase = if (decode.index as usize) < decodes_before_reset {
            Phase::Warmup
        } else if decode.context_check {
            Phase::Aux
        } else {
            match decode.n_tokens {
                0 => Phase::Aux,
                1 => Phase::Generate,
                _ => Phase::Prompt,
            }
        };
        match decode.phase {
            Phase::Prompt => a.prompt_tokens += u64::from(decode.n_tokens),
            Phase::Generate => a.generate_runs += 1,
            Phase::Warmup => a.warmup_decodes += 1,
            Phase::Aux => {}
        }
    }
    sequences::classify(a);
    for ubatch in &mut a.ubatches {
        ubatch.phase = match (ubatch.n_tokens, ubatch.decode) {
            (None, _) => Phase::Aux,
            (Some(_), Some(d)) => a.decodes[d as usize].phase,
            (Some(1), None) => Phase::Generate,
            (Some(_), None) => Phase::Prompt,
        };
    }
}
