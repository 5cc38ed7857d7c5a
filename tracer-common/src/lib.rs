//! Event layouts and map names shared by the kernel (`tracer-ebpf`) and user
//! (`tracer-user`) sides. This crate is the only place they are defined.
//!
//! Every event starts with an [`EventHeader`]; its `kind` says which struct
//! follows. All structs are `#[repr(C)]` with explicit padding so the byte
//! layout is the same on both sides, which the `const` asserts below pin down.
#![no_std]

use num_enum::TryFromPrimitive;
use strum::{EnumIter, IntoStaticStr};

pub mod ggml;
pub mod kernel;
pub mod kfunc;
pub mod layout;
pub mod tracepoints;
pub mod values;

/// Ring buffer carrying every event to user space.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU `u64` array, indexed by [`EventKind`]: events dropped because the
/// ring buffer was full. The ring buffer keeps no such count itself.
pub const MAP_LOST: &str = "LOST";
/// Hash `u32 tgid -> u8` (a [`traced`] value): the processes whose events
/// are recorded.
pub const MAP_TARGET_TGIDS: &str = "TARGET_TGIDS";
/// LRU hash `u32 pid -> u8`: tasks a traced process created (a process or a
/// thread: the fork tracepoint cannot tell) while the library hold is on.
/// One that execs becomes a [`traced::FOLLOWED`] process.
pub const MAP_NEW_CHILDREN: &str = "NEW_CHILDREN";
/// Capacity of [`MAP_NEW_CHILDREN`]: threads the target starts between a
/// fork and its exec push the oldest entries out.
pub const MAX_NEW_CHILDREN: u32 = 1024;
/// Array `u64`, indexed by the `config` constants: settings from user space.
pub const MAP_CONFIG: &str = "CONFIG";
/// Hash [`FileKey`] -> `u8`: the model files whose page-cache events are recorded.
pub const MAP_MODEL_FILES: &str = "MODEL_FILES";
/// Hash `u32` dev_t (kernel encoding, `major << 20 | minor`) -> `u8`: the
/// block devices whose requests are recorded.
pub const MAP_BLOCK_DEVICES: &str = "BLOCK_DEVICES";
/// Capacity of [`MAP_MODEL_FILES`] and [`MAP_BLOCK_DEVICES`].
pub const MAX_MODEL_FILES: u32 = 256;

/// Slots of [`MAP_CONFIG`].
pub mod config {
    pub const SLOTS: u32 = 6;
    /// Bit set: see `FLAG_*`.
    pub const FLAGS: u32 = 0;
    // Slot 1 is free: it held the GET_ROWS op id while the op probes read
    // token ids (the graph capture's inputs hold them now).
    /// Bytes waiting in the ring above which a submit wakes the reader; below
    /// it events are submitted silently and the reader drains on a timer.
    /// 0 (unset) wakes on every event.
    pub const WAKEUP_BYTES: u32 = 2;
    /// Non-zero: stop the target (SIGSTOP) when its first ubatch graph
    /// starts, once, so ttrace reads its maps while the model is mapped
    /// (`run` only; ttrace continues it). Cleared by the program.
    pub const STOP_AT_FIRST_GRAPH: u32 = 3;
    /// Non-zero: stop the target (SIGSTOP) at every [`super::markers::LIBRARY_LOADED`]
    /// and wake the reader, until ttrace has found ggml and attached its
    /// probes (`run` of a program that loads ggml with `dlopen`). ttrace
    /// continues it and clears this.
    pub const HOLD_AT_LIBRARY_LOAD: u32 = 4;
    /// Byte offset of `child_pid` in this kernel's `sched:sched_process_fork`
    /// record (it moved when the comms became `__data_loc` strings), read
    /// from its format file; 0 (unset): children are not followed. While
    /// [`HOLD_AT_LIBRARY_LOAD`] is on, a process a traced one starts is
    /// traced from its exec, and held there ([`super::markers::PROCESS_EXEC`]).
    pub const FORK_CHILD_PID: u32 = 5;
    /// Record every worker thread's op calls, not only `ith == 0`.
    pub const FLAG_ALL_THREADS: u64 = 1;
}

/// Default ring buffer size; user space may override it at load time.
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;
/// Capacity of [`MAP_TARGET_TGIDS`].
pub const MAX_TARGET_TGIDS: u32 = 64;

/// Values of [`MAP_TARGET_TGIDS`]: how a process came to be traced.
pub mod traced {
    /// Named by user space: `run`'s child, `attach`'s pid, one found later.
    pub const NAMED: u8 = 1;
    /// Followed by the kernel: a process a traced one started, from its exec.
    pub const FOLLOWED: u8 = 2;
}

pub mod programs;

pub mod markers;

/// Discriminant of every event; also the index into [`MAP_LOST`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive, IntoStaticStr, EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum EventKind {
    Call = 1,
    PageFault = 2,
    Op = 3,
    PageCache = 4,
    Block = 5,
    Graph = 6,
    Node = 7,
    Input = 8,
    Routing = 9,
    /// One array of a ubatch ([`batch`]), an [`InputEvent`].
    Batch = 10,
    /// A node output's head or chunk (`--values`, [`values::ValueEvent`]).
    Value = 11,
    /// A backend buffer created, given a usage or freed, a [`BufferEvent`].
    Buffer = 12,
}

/// Number of slots in [`MAP_LOST`]; every `EventKind` value is below it.
pub const EVENT_KIND_SLOTS: u32 = 16;

impl EventKind {
    /// `call`, `page_fault`, `op`, `page_cache`, `block`, `graph`, `node`, `input`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Page size of the traced machine's mappings and page-cache indices.
pub const PAGE_SIZE: u64 = 4096;

/// `(tgid, tid)` of `bpf_get_current_pid_tgid()`'s value.
#[inline(always)]
pub const fn split_pid_tgid(pid_tgid: u64) -> (u32, u32) {
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// The text of a NUL-padded C string field (tensor names, comm, rwbs).
pub fn c_str(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// Common prefix of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] value.
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Thread group id (the process id users see).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
}

/// A probed function was entered (its first six integer arguments, System V
/// x86_64: rdi, rsi, rdx, rcx, r8, r9) or returned (`args[0]` = rax).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEvent {
    pub header: EventHeader,
    /// A [`markers`] value: which function.
    pub cookie: u64,
    pub args: [u64; 6],
}

/// Identifies a file in page-cache tracepoints: the superblock's dev_t
/// (kernel encoding) and the inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// `PageCacheEvent::kind`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive, IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PageCacheKind {
    /// A page was added to the page cache (read from disk, or readahead).
    Add = 0,
    /// `filemap_fault` ran for the page.
    FilemapFault = 1,
}

/// A page-cache event on a model file. Not filtered by process: readahead
/// and prefetch may run in another task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheEvent {
    pub header: EventHeader,
    pub file: FileKey,
    /// Page index: file offset / 4096.
    pub index: u64,
    /// A [`PageCacheKind`] value.
    pub kind: u32,
    /// Folio order (2^order pages added at once); 0 for faults.
    pub order: u32,
}

/// `BlockEvent::kind`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive, IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum BlockKind {
    Issue = 0,
    Complete = 1,
}

/// A block request on a watched device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockEvent {
    pub header: EventHeader,
    /// dev_t in kernel encoding.
    pub dev: u32,
    pub nr_sector: u32,
    /// 512-byte sectors from the start of the whole disk.
    pub sector: u64,
    /// A [`BlockKind`] value.
    pub kind: u32,
    /// Completion status (0 = ok); 0 on issue.
    pub error: i32,
    /// Read/write/barrier flags as blktrace prints them, NUL-padded.
    pub rwbs: [u8; 16],
    /// Issuing task's command (issue only).
    pub comm: [u8; 16],
}

/// Tensors recorded per op: dst plus up to `ggml::MAX_SRC` sources.
pub const MAX_OP_TENSORS: usize = 1 + ggml::MAX_SRC;
/// Token ids an op of the token-embedding GET_ROWS carries.
pub const MAX_TOKEN_IDS: usize = 16;
/// `TensorRecord::slot` of the destination tensor; sources use their index.
pub const SLOT_DST: u32 = u32::MAX;
/// `TensorRecord::slot` of a null source before the last present one.
pub const SLOT_ABSENT: u32 = u32::MAX - 1;

/// Which hook produced an [`OpEvent`].
pub mod hooks {
    pub const EXTRA: u32 = 0;
    pub const FUSED_RMS_NORM: u32 = 1;
    pub const FUSED_MUL: u32 = 2;
    /// Not a probe: an op of a graph read whole at `ggml_graph_compute`,
    /// timed only as part of its graph.
    pub const GRAPH: u32 = 3;
}

/// `endbr64`, the first instruction of every function a CET build
/// (distributions' packages) compiles: code is decoded past it, in the
/// kernel (buffer type names) and in user space (probe sites, layouts).
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// One tensor of an op, as the probe saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorRecord {
    /// Address of the `ggml_tensor` struct.
    pub tensor: u64,
    pub data: u64,
    pub ne: [i64; 4],
    pub nb: [u64; 4],
    pub view_src: u64,
    pub view_offs: u64,
    pub extra: u64,
    pub type_: i32,
    pub op: i32,
    /// `op_params[0]`: the sub-op of UNARY/GLU nodes.
    pub op_param0: i32,
    pub flags: i32,
    /// [`SLOT_DST`], [`SLOT_ABSENT`] or the source index.
    pub slot: u32,
    pub _pad: u32,
    pub name: [u8; ggml::MAX_NAME],
}

impl TensorRecord {
    /// The record of the tensor at `address`, as the target holds it.
    pub fn of(address: u64, t: &ggml::GgmlTensor, slot: u32) -> Self {
        Self {
            tensor: address,
            data: t.data,
            ne: t.ne,
            nb: t.nb,
            view_src: t.view_src,
            view_offs: t.view_offs,
            extra: t.extra,
            type_: t.type_,
            op: t.op,
            op_param0: t.op_params[0],
            flags: t.flags,
            slot,
            _pad: 0,
            name: t.name,
        }
    }
}

/// A node started on a thread (`--op-timing`): only what the graph capture
/// cannot know, so the per-node program costs little beyond its trap. The
/// node's tensors come from its graph's definition, matched by address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpEvent {
    pub header: EventHeader,
    /// Address of the node's `ggml_tensor` (a fused pair's first node).
    pub node: u64,
    /// A fused pair's second node (`hooks::FUSED_RMS_NORM`), else 0.
    pub fused: u64,
    pub ith: u32,
    pub nth: u32,
    /// A [`hooks`] value.
    pub hook: u32,
    pub _pad: u32,
}

pub const TENSOR_RECORD_SIZE: usize = core::mem::size_of::<TensorRecord>();

/// Nodes read per graph at most (llama.cpp's own graphs have a few
/// thousand even for large MoE models).
pub const MAX_GRAPH_NODES: u32 = 1 << 16;
/// Integer inputs read per graph run, and bytes of each.
pub const MAX_GRAPH_INPUTS: usize = 4;
pub const MAX_INPUT_BYTES: usize = 4096;

/// `GraphEvent::flags`.
pub mod graph {
    /// Same `cgraph` and `uid` as its last run: no node records follow.
    pub const REUSED: u32 = 1;
    /// Sent after a graph's node and input records: they are complete
    /// (records of other threads may interleave with them in the ring).
    pub const DONE: u32 = 2;
}

/// `ggml_graph_compute` entered. Unless `REUSED`, `n_nodes` [`NodeEvent`]s
/// with `role` NODE follow (index order), each followed by SOURCE records of
/// the tensors it reads that were not sent before in this graph, and not
/// marked in the node's `cache`; then one
/// [`InputEvent`] per integer input.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphEvent {
    pub header: EventHeader,
    pub cgraph: u64,
    /// The graph's `uid`, or where the build has none a number the probe
    /// makes up per run (never `REUSED` then).
    pub uid: u64,
    /// Nodes read (`n_nodes` capped at [`MAX_GRAPH_NODES`]; 0 when `n_nodes`
    /// is out of `0..=size`, the check that the cgraph layout is right).
    pub n_nodes: u32,
    pub flags: u32,
    /// `n_nodes` and `size` as read, for that check in user space.
    pub raw_n_nodes: i32,
    pub size: i32,
}

/// `NodeEvent::role`.
pub mod node_role {
    pub const NODE: u16 = 0;
    /// A tensor some node reads that is not a node of this graph (a weight,
    /// an input, the KV cache).
    pub const SOURCE: u16 = 1;
}

/// One tensor of a graph, a node or a source, as the target holds it: the
/// probe copies the `ggml_tensor` into the ring as it is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub header: EventHeader,
    pub uid: u64,
    /// Node index (for a SOURCE: of the node that reads it).
    pub index: u32,
    pub role: u16,
    /// For a NODE: bit `i` set when `src[i]` was not sent again because
    /// its `ggml_tensor` bytes equal the last SOURCE record the same thread
    /// sent for that address (weights, the KV cache: a new graph of
    /// llama-server reads the same ones); user space fills it from there.
    /// For a SOURCE: 1 when the probe remembers these bytes (its table has
    /// room), so a later node may mark them; 0 when it does not.
    pub cache: u16,
    /// Address of the `ggml_tensor`.
    pub address: u64,
    /// The `ggml_tensor` bytes as the target holds them: its layout's
    /// `size` of them, decoded in user space by that layout.
    pub tensor: [u8; layout::MAX_TENSOR_BYTES],
}

/// The contents of a small integer input of a graph run, sent at every run.
/// Sent with only `len` bytes of `data`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputEvent {
    pub header: EventHeader,
    pub uid: u64,
    pub tensor: u64,
    pub len: u32,
    pub _pad: u32,
    pub data: [u8; MAX_INPUT_BYTES],
}

pub const INPUT_EVENT_FIXED: usize = core::mem::offset_of!(InputEvent, data);

/// A ubatch as llama.cpp is about to compute it, sent as
/// [`EventKind::Batch`] [`InputEvent`]s: one per array, `uid` = its
/// `n_tokens`, `tensor` = which array, `data` = its first
/// [`MAX_BATCH_TOKENS`](batch::MAX_BATCH_TOKENS) entries as i32 (output
/// flags widened).
pub mod batch {
    pub const TOKEN: u64 = 0;
    pub const POS: u64 = 1;
    /// Each token's first sequence id (`seq_id[i][0]`).
    pub const SEQ: u64 = 2;
    /// `logits[i]`: whether the token's output is kept.
    pub const OUTPUT: u64 = 3;
    pub const MAX_BATCH_TOKENS: u32 = (super::MAX_INPUT_BYTES / 4) as u32;
}

/// Experts per routing row a record holds.
pub const MAX_EXPERTS: usize = 256;
/// Rows one argsort return reads at most (tokens per ubatch per thread).
pub const MAX_ROUTING_ROWS: u32 = 8192;
/// The name prefix of llama.cpp's MoE routing node (`ffn_moe_argsort-L`).
pub const MOE_ARGSORT_PREFIX: &[u8; 15] = b"ffn_moe_argsort";
/// The name prefix of the last MUL_MAT_ID of an MoE layer (`ffn_moe_down-L`).
pub const MOE_DOWN_PREFIX: &[u8; 12] = b"ffn_moe_down";

/// One token's experts, best first, as llama.cpp's `ffn_moe_argsort-L` node
/// ranked them (the first `n_expert_used` are the routed ones). Sent with
/// only `n_experts` ids.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingEvent {
    pub header: EventHeader,
    /// Address of the argsort node's `ggml_tensor`.
    pub tensor: u64,
    /// Row of the node: the token's index in its ubatch.
    pub row: u32,
    pub n_experts: u32,
    pub ids: [i32; MAX_EXPERTS],
}

/// `BufferEvent::action`, also the attach cookie of `buffer_changed`.
pub mod buffer_action {
    pub const CREATED: u32 = 0;
    pub const SET_USAGE: u32 = 1;
    pub const FREED: u32 = 2;
}

/// Bytes of a buffer type's name a [`BufferEvent`] holds.
pub const MAX_BUFFER_TYPE_NAME: usize = 32;

/// A ggml backend buffer (`struct ggml_backend_buffer`) as a probe read it,
/// at the build's `layout::BufferLayout` offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferEvent {
    pub header: EventHeader,
    /// Address of the `ggml_backend_buffer`.
    pub buffer: u64,
    /// Its `buft` (CPU_REPACK replaces it after creation), and its
    /// `context`: the data pointer for the CPU buffer types.
    pub buft: u64,
    pub context: u64,
    pub size: u64,
    /// `usage` as read; at SET_USAGE the value being set.
    pub usage: u32,
    /// A [`buffer_action`] value.
    pub action: u32,
    /// The buffer type's name (`CPU`, `CPU_Mapped`, `CPU_REPACK`), read
    /// from the string its `get_name` returns; empty when that could not
    /// be read.
    pub type_name: [u8; MAX_BUFFER_TYPE_NAME],
}

/// A user-space page fault (`exceptions:page_fault_user`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageFaultEvent {
    pub header: EventHeader,
    pub address: u64,
    pub ip: u64,
    pub error_code: u64,
}

// Layout pins: a change here is a trace-format change on both sides.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<EventHeader>() == 24);
    assert!(offset_of!(EventHeader, ts_ns) == 8);
    assert!(offset_of!(EventHeader, tgid) == 16);
    assert!(size_of::<CallEvent>() == 80);
    assert!(offset_of!(CallEvent, args) == 32);
    assert!(size_of::<TensorRecord>() == 192);
    assert!(offset_of!(TensorRecord, name) == 128);
    assert!(size_of::<OpEvent>() == 56);
    assert!(offset_of!(OpEvent, ith) == 40);
    assert!(TENSOR_RECORD_SIZE.is_multiple_of(8));
    assert!(size_of::<PageFaultEvent>() == 48);
    assert!(offset_of!(PageFaultEvent, address) == 24);
    assert!((EventKind::Block as u32) < EVENT_KIND_SLOTS);
    assert!(size_of::<FileKey>() == 16);
    assert!(size_of::<PageCacheEvent>() == 56);
    assert!(offset_of!(PageCacheEvent, index) == 40);
    assert!(size_of::<BlockEvent>() == 80);
    assert!(offset_of!(BlockEvent, rwbs) == 48);
    assert!(size_of::<GraphEvent>() == 56);
    assert!(size_of::<NodeEvent>() == 24 + 24 + 336);
    assert!(offset_of!(NodeEvent, cache) == 38 && ggml::MAX_SRC <= 16);
    assert!(INPUT_EVENT_FIXED == 48);
    assert!((EventKind::Batch as u32) < EVENT_KIND_SLOTS);
    assert!((EventKind::Buffer as u32) < EVENT_KIND_SLOTS);
    assert!(size_of::<BufferEvent>() == 96);
    assert!(offset_of!(BufferEvent, type_name) == 64);
};

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: plain-old-data, `#[repr(C)]`, no padding holes, any bit pattern valid.
    unsafe impl aya::Pod for EventHeader {}
    unsafe impl aya::Pod for CallEvent {}
    unsafe impl aya::Pod for PageFaultEvent {}
    unsafe impl aya::Pod for TensorRecord {}
    unsafe impl aya::Pod for FileKey {}
    unsafe impl aya::Pod for PageCacheEvent {}
    unsafe impl aya::Pod for BlockEvent {}
    unsafe impl aya::Pod for OpEvent {}
    unsafe impl aya::Pod for GraphEvent {}
    unsafe impl aya::Pod for NodeEvent {}
    unsafe impl aya::Pod for InputEvent {}
    unsafe impl aya::Pod for BufferEvent {}
    unsafe impl aya::Pod for values::ValueTask {}
}
