//! The records a [`super::reader::TraceReader`] yields, with descriptor
//! indices and threads resolved.

use tracer_common::{BlockKind, PageCacheKind};

use super::frames::{FilePos, Lost, Memory, Trailer};

/// An op, with descriptor indices resolved by [`TraceReader::descriptor`].
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub ts_ns: u64,
    pub tid: u32,
    pub ith: u32,
    pub nth: u32,
    pub hook: u32,
    pub dst: u32,
    /// `(source slot, descriptor)` pairs; shared by every run of a graph's
    /// node (one allocation per node defined, not per op read).
    pub srcs: std::sync::Arc<[(u32, u32)]>,
    pub token_ids: Vec<i32>,
}

impl Op {
    /// Whether the op was probed as it ran (`--op-timing`), so its start
    /// time is its own; a graph-captured op has its graph's start time.
    pub fn timed(&self) -> bool {
        self.hook != tracer_common::hooks::GRAPH
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Marker {
    pub ts_ns: u64,
    pub tid: u32,
    pub cookie: u64,
    pub args: [u64; 3],
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub ts_ns: u64,
    pub tid: u32,
    pub address: u64,
    pub ip: u64,
    pub error_code: u64,
    /// The model-file byte the address maps, when it is in a model mapping.
    pub file: Option<FilePos>,
    pub memory: Memory,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PageCache {
    pub ts_ns: u64,
    pub tid: u32,
    pub kind: PageCacheKind,
    pub dev: u32,
    pub ino: u64,
    /// Page index (file offset / 4096) and folio order.
    pub index: u64,
    pub order: u32,
    /// `(model, file)` from the MODEL frames' (dev, ino).
    pub file: Option<(u32, u32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub ts_ns: u64,
    pub tid: u32,
    pub tgid: u32,
    pub cpu: u32,
    pub kind: BlockKind,
    pub dev: u32,
    pub sector: u64,
    pub nr_sector: u32,
    pub error: i32,
    pub rwbs: String,
    pub comm: String,
}

/// One token's expert ranking, best first (see `FrameKind::Routing`).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub ts_ns: u64,
    pub tid: u32,
    /// The argsort node's descriptor (its name gives the layer), when defined.
    pub node: Option<u32>,
    /// The token's index in its ubatch.
    pub row: u32,
    pub experts: Vec<i32>,
}

/// Which array of a `llama_decode` batch (see `FrameKind::Batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchArray {
    Token,
    Pos,
    /// Each token's first sequence id.
    Seq,
    /// Whether each token's output is kept (1) or not (0).
    Output,
}

/// One array of a decode call's batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub ts_ns: u64,
    pub tid: u32,
    pub array: BatchArray,
    /// The batch's tokens; `values` holds at most `MAX_BATCH_TOKENS` of them.
    pub n_tokens: u32,
    pub values: Vec<i32>,
}

/// What happened to a backend buffer (see `FrameKind::Buffer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferAction {
    Created,
    SetUsage,
    Freed,
}

/// A ggml backend buffer as a probe read it.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferRecord {
    pub ts_ns: u64,
    pub tid: u32,
    pub action: BufferAction,
    /// Address of the `ggml_backend_buffer`.
    pub buffer: u64,
    pub buft: u64,
    /// The data pointer for the CPU buffer types.
    pub context: u64,
    pub size: u64,
    /// ggml's `enum ggml_backend_buffer_usage` value (at `SetUsage`, the one set).
    pub usage: u32,
    /// `CPU`, `CPU_Mapped`, `CPU_REPACK`; empty when the probe could not read it.
    pub type_name: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Op(Op),
    Buffer(BufferRecord),
    Batch(Batch),
    Routing(Routing),
    Marker(Marker),
    Fault(Fault),
    PageCache(PageCache),
    Block(Block),
    /// A node output's fingerprint (`--values`).
    Value(Box<super::values::Value>),
    /// A model table was defined; its index in [`TraceReader::models`].
    Model(u32),
    Lost(Lost),
    End(Box<Trailer>),
}
