//! `--values`: node outputs read at the race-free point (the last thread to
//! arrive at the barrier after a node), sent as a head record (the node as
//! the probe read it) followed by chunks of its bytes. User space hashes
//! them: BPF has no floating point.

use crate::{EventHeader, TensorRecord};

/// Array `u64`, indexed by the slots below: where the probes find things.
pub const MAP_VALUE_CONFIG: &str = "VALUE_CONFIG";

/// Slots of [`MAP_VALUE_CONFIG`].
pub mod config {
    pub const SLOTS: u32 = 7;
    /// Link-time address (ELF vaddr) of the `ggml_barrier` probe site: with the probe's
    /// own address it gives the library's load bias.
    pub const BARRIER_VADDR: u32 = 0;
    /// `[start, end)` vaddrs of `ggml_graph_compute_thread`: only barriers
    /// called from there can end a node (the others are inside ops).
    pub const LOOP_START: u32 = 1;
    pub const LOOP_END: u32 = 2;
    /// The target's `GGML_OP_SET_ROWS` (a view of a whole layer's KV cache: not copied).
    pub const SET_ROWS_OP: u32 = 3;
    /// Larger spans are not copied (flagged [`super::flags::TOO_BIG`]).
    pub const MAX_BYTES: u32 = 4;
    /// Tests only (`TTRACE_TEST_UNREAD_PARAMS`): each thread's node number
    /// this (its `nodes_total`, from 1) takes the read of `ith, nth` at its
    /// entry as failed; with [`REREAD_FAILS`] set, the read again at its
    /// barrier too. 0: off.
    pub const TEST_UNREAD_PARAMS: u32 = 5;
    pub const REREAD_FAILS: u64 = 1 << 32;
    /// Non-zero with `--values-filter`: nodes named in
    /// [`super::MAP_VALUE_SKIP_NAMES`] are not copied.
    pub const FILTERING: u32 = 6;
}

/// Hash map `[u8; MAX_NAME]` (a node name, zero after its NUL) → `u8`: the
/// names `--values-filter` leaves out, so their bytes are not copied. A name
/// not in it is copied and judged in user space, which adds it; so the map
/// only saves work, it never decides what is recorded.
pub const MAP_VALUE_SKIP_NAMES: &str = "VALUE_SKIP_NAMES";
pub const MAX_SKIP_NAMES: u32 = 4096;

/// Bytes of node data per chunk record: the record must fit a per-CPU
/// map value (32 KiB).
pub const VALUE_CHUNK_BYTES: usize = 32 * 1024 - 128;

/// What a head record says about the bytes that follow (or do not).
pub mod flags {
    /// A view of another tensor (`view_src` set): its span is copied.
    pub const VIEW: u32 = 1;
    /// Strided: the span from the first to the last element is copied.
    pub const NON_CONTIGUOUS: u32 = 2;
    /// A quantised or otherwise unknown element type: not copied.
    pub const UNSUPPORTED_TYPE: u32 = 4;
    /// SET_ROWS writes into the KV cache, a view of the whole layer: not copied.
    pub const SET_ROWS: u32 = 8;
    /// Span above the configured maximum: not copied.
    pub const TOO_BIG: u32 = 16;
    /// The node's struct or data could not be read.
    pub const READ_FAILED: u32 = 32;
}

/// Which record a [`ValueEvent`] is.
pub mod part {
    /// `data` holds the node's [`crate::TensorRecord`]; `total` bytes follow.
    pub const HEAD: u32 = 0;
    /// `data` holds `len` bytes of the node at byte `offset`.
    pub const CHUNK: u32 = 1;
}

/// One `--values` record: a head, then its chunks, all with the same
/// `(run, node)`. Sent with its exact length (fixed part + `len`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ValueEvent {
    pub header: EventHeader,
    /// The process's `ggml_graph_compute` call count when the node ran.
    pub run: u64,
    /// Address of the node's `ggml_tensor`.
    pub node: u64,
    /// Head: link-time address the barrier returns to (which barrier).
    pub site: u64,
    /// Head: the RMS_NORM node fused into this MUL (0: none).
    pub fused: u64,
    /// Head: bytes that follow. Chunk: byte offset of `data`.
    pub offset: u64,
    pub len: u32,
    /// A [`part`] value.
    pub part: u32,
    /// Head: [`flags`] bits.
    pub flags: u32,
    pub _pad: u32,
    pub data: [u8; VALUE_CHUNK_BYTES],
}

pub const VALUE_EVENT_FIXED: usize = core::mem::offset_of!(ValueEvent, data);
pub const VALUE_HEAD_BYTES: usize = VALUE_EVENT_FIXED + core::mem::size_of::<TensorRecord>();

/// Teams larger than this are not read (flagged by user space).
pub const MAX_TEAM: usize = 64;

/// Slots of the per-thread task array: a thread's slot is its tid masked.
/// An array, not a hash map: a lookup cannot miss and a write cannot fail
/// (a missed arrival used to cost the rest of a run, see `on_barrier`).
pub const TASK_SLOTS: u32 = 1 << 14;

/// Per thread, what it computes now (set at each node's entry).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ValueTask {
    pub node: u64,
    pub fused: u64,
    /// `params->ith, nth`: its place in the team, and the team's size (the
    /// threads in every barrier). [`team::UNREAD`] until read: a read that
    /// failed at the node's entry is tried again at its barrier.
    pub ith: u32,
    pub nth: u32,
    /// `tgid << 32 | tid` of the thread that owns the slot: two threads
    /// whose tids share a slot make each other's barriers count as lost.
    pub owner: u64,
    /// The `ggml_compute_params` the node was computed with: one per
    /// thread and compute call.
    pub params: u64,
    /// The run of the thread's last barrier.
    pub run: u64,
    /// Barriers entered since the node started (ops barrier inside too).
    pub barriers: u64,
    /// Since the thread's first node: nodes it started and barriers it
    /// entered. Every team member enters the same ones, so user space can
    /// tell a probe run missed in one thread from a read not made.
    pub nodes_total: u64,
    pub barriers_total: u64,
}

/// Map names user space reads at the end.
pub const MAP_VALUE_TASKS: &str = "VALUE_TASKS";
pub const MAP_VALUE_UNREAD: &str = "VALUE_UNREAD";

/// Slots of [`MAP_VALUE_UNREAD`] (per CPU): nodes no barrier could read
/// because a read of the target's memory failed (a nofault read fails on a
/// page being migrated, for one).
/// [`ValueTask::nth`] before its read, and after it failed twice.
pub mod team {
    /// Not read at the node's entry: read at its first barrier.
    pub const UNREAD: u32 = u32::MAX;
    /// Not read at its first barrier either: the node goes unread.
    pub const LOST: u32 = u32::MAX - 1;
}

pub mod unread {
    pub const SLOTS: u32 = 5;
    /// The thread's `ith, nth`, unreadable at a node's entry (with no
    /// earlier read of the same compute call to fall back on) and again at
    /// its first barrier. (7.2 in qemu fails a nofault read of a thread's
    /// own stack now and then, in a process's first graph.)
    pub const PARAMS: u32 = 0;
    /// The barrier's return address (which barrier it is).
    pub const SITE: u32 = 1;
    /// A run whose process state could not be made (a failed map insert).
    pub const POOL: u32 = 2;
    /// A read this CPU skipped because it was already in the middle of
    /// one: a program preempted mid-copy (uprobes run preemptible on
    /// PREEMPT_LAZY kernels, 6.18 on) and another team thread's, on the
    /// same CPU, arriving last at the same barrier too. The first reads the
    /// node; the per-CPU scratch both copy through is not shared.
    pub const BUSY: u32 = 3;
    /// Reads of a node `--values-filter` leaves out (its name in the skip
    /// map): nothing is sent, not even its head. The recorder knows from the
    /// graph which nodes those are; sending each one's head cost a ring
    /// record and a wake-up's share per node and thread team.
    pub const FILTERED: u32 = 4;
}

/// Where one team member last arrived: which node, and `run << 16 |
/// barrier` within it. Another member is at the same barrier exactly when
/// both words equal ours; an earlier arrival differs in one of them.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ValueArrival {
    pub node: u64,
    pub mark: u64,
}

/// Per process: graph runs so far, and per team member its last arrival.
/// Each thread writes only its own slot, the last word with a locked add
/// (the BPF target has no fetch-add before 5.12): a full fence, so of two
/// threads arriving together the second sees the first.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ValuePool {
    pub run: u64,
    pub arrivals: [ValueArrival; MAX_TEAM],
}

const _: () = {
    assert!(VALUE_EVENT_FIXED == 24 + 40 + 16);
    assert!(core::mem::size_of::<ValueEvent>() <= 32 * 1024);
    assert!(VALUE_EVENT_FIXED.is_multiple_of(8));
};

/// Program names (see `tracer-ebpf/src/values.rs`).
pub mod programs {
    /// `ggml_cpu_extra_compute_forward(params, node)` (cookie `hooks::EXTRA`)
    /// and `ggml_compute_forward_rms_norm_mul_fused(params, rms, mul)`
    /// (cookie `hooks::FUSED_MUL`): the node the thread computes now.
    pub const VALUE_NODE: &str = "value_node";
    /// `ggml_barrier(threadpool)` entry: counts arrivals; the last one reads
    /// the node just finished.
    pub const VALUE_BARRIER: &str = "value_barrier";
    /// `ggml_graph_compute(cgraph, cplan)`: a new run, no thread in a barrier.
    pub const VALUE_GRAPH: &str = "value_graph";
}
