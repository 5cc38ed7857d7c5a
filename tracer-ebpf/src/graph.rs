//! One uprobe per CPU graph: `ggml_graph_compute(cgraph, cplan)` is called
//! once per graph split by the calling thread only, so its cost does not
//! grow with node or thread counts. A graph whose `(cgraph, uid)` ran before
//! is unchanged (the scheduler gives a rebuilt split a fresh uid), and only
//! its integer inputs are read again; a new one is read whole with
//! `bpf_loop`: every node, and every tensor a node reads that is not a node.
//! Builds whose `ggml_cgraph` has no `uid` (ggml before 0.10) rebuild their
//! graphs for every ubatch anyway: each run is read whole, under a number
//! the probe makes up.
//!
//! The walk is a `bpf_loop` over the nodes; each present source of a node
//! goes to `walk_source`, a function of its own (a BPF-to-BPF call, not a
//! callback per source slot: that cost a fifth more per graph walked). No
//! step holds a large local: before 6.13 the program, the node step and the
//! source step share 512 bytes of stack (6.12 refused 336 + 304). Nothing
//! in a step branches per word: 7.2's verifier gave up (a million
//! instructions walked) on the sources inlined into the node step with
//! their bytes compared word by word, an early exit each.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_RB_FORCE_WAKEUP, pt_regs},
    helpers::generated::bpf_probe_read_user,
    macros::{map, uprobe},
    maps::{HashMap, PerCpuArray},
    programs::ProbeContext,
};
use tracer_common::{
    EventKind, GraphEvent, INPUT_EVENT_FIXED, InputEvent, MAX_GRAPH_INPUTS, MAX_GRAPH_NODES, MAX_INPUT_BYTES,
    NodeEvent, ggml, graph,
    layout::{ABSENT, MAX_TENSOR_BYTES},
    node_role,
};

use crate::{
    layout::{self, RawTensor, TENSOR_SCRATCH, ggml},
    looping::{global_step, repeat},
    maps::{
        EVENTS, count_lost, count_lost_n, emit, emit_with, header, read_user, read_user_bytes, submit_flags,
        traced_task,
    },
    pinned::pinned,
};

/// What a graph's walk needs in every loop step.
#[repr(C)]
#[derive(Clone, Copy)]
struct Walk {
    task: (u32, u32),
    nodes: u64,
    uid: u64,
    cgraph: u64,
}

/// What each source step of a node needs: the walk's fields, the node's
/// index, and the `cache` bits found so far.
#[repr(C)]
struct Sources {
    task: (u32, u32),
    uid: u64,
    cgraph: u64,
    index: u32,
    cached: u32,
}

/// Integer inputs found in a graph, read again at each of its runs.
#[repr(C)]
#[derive(Clone, Copy)]
struct Inputs {
    n: u32,
    _pad: u32,
    tensor: [u64; MAX_GRAPH_INPUTS],
    data: [u64; MAX_GRAPH_INPUTS],
    len: [u32; MAX_GRAPH_INPUTS],
}

#[map]
static GRAPH_INPUT: PerCpuArray<InputEvent> = PerCpuArray::with_max_entries(1, 0);

/// An all-zero `Inputs`, never written: what a graph read anew starts from
/// (88 bytes the program's stack has no room for).
#[map]
static NO_INPUTS: PerCpuArray<Inputs> = PerCpuArray::with_max_entries(1, 0);

/// The source being read, while the node that reads it stays in
/// `TENSOR_SCRATCH` for the next source step.
#[map]
static SOURCE_SCRATCH: PerCpuArray<RawTensor> = PerCpuArray::with_max_entries(1, 0);

/// A tensor address as one thread of the target sees it.
#[repr(C)]
struct SeenKey {
    tid: u32,
    _pad: u32,
    address: u64,
}

/// What the probe last did with a tensor address on that thread.
#[repr(C)]
struct Seen {
    /// uid of the last graph that read it as a source: each tensor once per graph.
    uid: u64,
    /// 1 when `bytes` are those of the last SOURCE record sent for it: what
    /// user space holds for it too, so an equal read need not be sent.
    sent: u64,
    bytes: [u64; MAX_TENSOR_BYTES / 8],
}

/// Keyed by thread, so that only one thread ever writes an entry and its
/// records reach the ring in the order it wrote them. Not an LRU and never
/// deleted from: an entry a program holds a pointer to is never recycled
/// under another key. Not preallocated: it holds the tensors seen, at most
/// `max_entries`; past that, new tensors are sent whole every time.
#[map]
static SEEN: HashMap<SeenKey, Seen> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// A new `SEEN` entry being put together (too big for the stack).
#[map]
static SEEN_NEW: PerCpuArray<Seen> = PerCpuArray::with_max_entries(1, 0);

/// A node of the graph being read, in a direct-mapped table: how a source
/// that is a node of the same graph is told apart without a hash lookup
/// (`SEEN`'s bucket walks, a cache miss each, were most of the probe's
/// time in a profile). A node evicted by another in its slot
/// only costs its reader a `SEEN` lookup and maybe a SOURCE record with the
/// node's own bytes, which user space takes as the node.
#[repr(C)]
struct NodeSlot {
    address: u64,
    uid: u64,
}

/// Slots: a power of two. Node structs sit 368 bytes apart in a graph's
/// context (23 slots at 16-byte granularity, odd), so up to this many
/// consecutive nodes never share a slot.
const NODE_SLOTS: u32 = 1 << 12;

#[map]
static GRAPH_NODES: PerCpuArray<NodeSlot> = PerCpuArray::with_max_entries(NODE_SLOTS, 0);

#[inline(always)]
fn node_slot(address: u64) -> u32 {
    (address >> 4) as u32 & (NODE_SLOTS - 1)
}

/// cgraph address → uid of its last run.
#[map]
static LAST_UID: HashMap<u64, u64> = HashMap::with_max_entries(1024, 0);

/// cgraph address → its integer inputs.
#[map]
static INPUTS: HashMap<u64, Inputs> = HashMap::with_max_entries(1024, 0);

#[uprobe]
pub fn graph_compute(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let cgraph = unsafe { read_volatile(&(*(ctx.as_ptr() as *const pt_regs)).rdi) };
    let _ = pinned(|| read_graph::<false>(cgraph));
    0
}

/// Kernels before 5.17 (`looping`): at most [`BOUNDED_NODES`] nodes a graph.
#[uprobe]
pub fn graph_compute_bounded(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let cgraph = unsafe { read_volatile(&(*(ctx.as_ptr() as *const pt_regs)).rdi) };
    let _ = read_graph::<true>(cgraph);
    0
}

/// Nodes the bounded copy reads of a graph (the verifier keeps a pending
/// state per step of a bounded loop, at most 8192 in all); the rest are
/// counted as lost. A 94-layer MoE's graph has fewer.
const BOUNDED_NODES: u32 = 4000;

/// Numbers for runs of graphs without a `uid` of their own: the top bit
/// set, so they never equal a real one (ggml counts those up from 1).
#[map]
static MADE_UP_UID: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

fn read_graph<const BOUNDED: bool>(cgraph: u64) -> Result<(), ()> {
    let task = traced_task().ok_or(())?;
    if !layout::valid() {
        return Err(());
    }
    let (mut size, mut raw_n_nodes, mut nodes) = (0i32, 0i32, 0u64);
    read_user(&mut size, cgraph + u64::from(ggml!(cgraph.size)))?;
    read_user(&mut raw_n_nodes, cgraph + u64::from(ggml!(cgraph.n_nodes)))?;
    read_user(&mut nodes, cgraph + u64::from(ggml!(cgraph.nodes)))?;
    let uid_at = ggml!(cgraph.uid);
    let mut uid = 0u64;
    if uid_at != ABSENT {
        read_user(&mut uid, cgraph + u64::from(uid_at))?;
    }
    if uid == 0 {
        uid = made_up_uid();
    }
    // Outside 0..=size the cgraph layout is wrong: walk nothing (user space
    // refuses the trace on this event). A view (a scheduler split) has size 0.
    let fits = raw_n_nodes >= 0 && (size == 0 || raw_n_nodes <= size);
    let max = if BOUNDED { BOUNDED_NODES } else { MAX_GRAPH_NODES };
    let n_nodes = if fits { raw_n_nodes as u32 } else { 0 };
    if n_nodes > max {
        count_lost_n(EventKind::Node, u64::from(n_nodes - max));
    }
    let n_nodes = n_nodes.min(max);
    // A made-up uid is never the last one: such a graph is read every run.
    let reused = LAST_UID.get_ptr(cgraph).is_some_and(|last| unsafe { *last } == uid);
    let event =
        |flags| GraphEvent { header: header(EventKind::Graph, task), cgraph, uid, n_nodes, flags, raw_n_nodes, size };
    let reuse = if reused { graph::REUSED } else { 0 };
    emit(EventKind::Graph, event(reuse));
    if !reused {
        if let Some(empty) = NO_INPUTS.get_ptr(0) {
            // SAFETY: a map value of the right type, never written.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = INPUTS.insert(cgraph, unsafe { &*empty }, 0);
        }
        let mut walk = Walk { task, nodes, uid, cgraph };
        repeat::<BOUNDED, _>(n_nodes, max, walk_node, ttrace_walk_node, &mut walk);
        let _ = LAST_UID.insert(cgraph, uid, 0);
    }
    send_inputs(cgraph, uid, task);
    // A new graph's end wakes the reader: the weight copies it reads are
    // named by comparing the target's memory with the model file, which
    // must happen while the target lives (whisper.cpp exits about 60 ms
    // after its first decoder graph, within one 100 ms drain tick).
    let wake = if reused { submit_flags() } else { u64::from(BPF_RB_FORCE_WAKEUP) };
    emit_with(EventKind::Graph, event(graph::DONE | reuse), wake);
    Ok(())
}

/// A fresh number with the top bit set.
#[inline(always)]
fn made_up_uid() -> u64 {
    let Some(next) = MADE_UP_UID.get_ptr_mut(0) else { return 1 << 63 };
    // SAFETY: per-CPU slot. The CPU number in bits 48.. keeps CPUs apart.
    unsafe {
        *next += 1;
        (1 << 63) | (u64::from(aya_ebpf::helpers::bpf_get_smp_processor_id()) << 48) | (*next & ((1 << 48) - 1))
    }
}

global_step!(ttrace_walk_node, walk_node, Walk);

#[inline(never)]
extern "C" fn walk_node(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the loop passes back the `Walk` given to it.
    let walk = unsafe { &*(ctx as *const Walk) };
    let _ = send_node(walk, index as u32);
    0
}

fn send_node(walk: &Walk, index: u32) -> Result<(), ()> {
    let mut node = 0u64;
    read_user(&mut node, walk.nodes + u64::from(index) * 8)?;
    // SAFETY: per-CPU scratch; a uprobe cannot be preempted by another on this CPU.
    let t = unsafe { &mut *TENSOR_SCRATCH.get_ptr_mut(0).ok_or(())? };
    read_user_bytes(addr_of_mut!(t.0).cast(), layout::tensor_size(), node)?;
    // The node's record is reserved first and submitted last, with the
    // sources it did not send again: those were sent before it in the ring.
    let Some(mut entry) = EVENTS.reserve::<NodeEvent>(0) else {
        count_lost(EventKind::Node);
        return Err(());
    };
    let e = entry.as_mut_ptr();
    // SAFETY: the reservation is NodeEvent-sized; all of it is written here or below.
    unsafe { fill(e, walk.task, walk.uid, index, node_role::NODE, node, t) };
    mark(walk.uid, node);
    let mut sources = Sources { task: walk.task, uid: walk.uid, cgraph: walk.cgraph, index, cached: 0 };
    for slot in 0..ggml::MAX_SRC as u32 {
        let address = t.u64(ggml!(tensor.src) + slot * 8);
        if address != 0 {
            walk_source(&mut sources, slot, address);
        }
    }
    // SAFETY: as above.
    unsafe { (*e).cache = sources.cached as u16 };
    entry.submit(submit_flags());
    Ok(())
}

/// Source `slot` of the node, at `address`: a function of its own, so that
/// the verifier checks it at each call without the states of the calls
/// before it (inlined, they multiplied).
#[inline(never)]
fn walk_source(sources: &mut Sources, slot: u32, address: u64) {
    if send_source(sources, address) == Source::Cached {
        sources.cached |= 1 << (slot & 15);
    }
}

#[derive(PartialEq, Eq)]
enum Source {
    /// Sent already in this graph, sent now, or unreadable.
    Done,
    /// Equal to the last record sent for it: the node's record says so.
    Cached,
}

/// Record that `address` was sent (as a node) in graph `uid`.
#[inline(always)]
fn mark(uid: u64, address: u64) {
    if let Some(slot) = GRAPH_NODES.get_ptr_mut(node_slot(address)) {
        // SAFETY: per-CPU slot; a uprobe program is not migrated while it runs.
        unsafe { *slot = NodeSlot { address, uid } };
    }
}

/// Whether `address` is a node of the graph being read, as far as its slot
/// still says.
#[inline(always)]
fn is_marked(uid: u64, address: u64) -> bool {
    // SAFETY: per-CPU slot, read only.
    GRAPH_NODES
        .get_ptr(node_slot(address))
        .is_some_and(|slot| unsafe { (*slot).address == address && (*slot).uid == uid })
}

/// A node's source: skipped when already sent in this graph, marked cached
/// when its bytes equal the last record sent for it, else sent whole.
#[inline(always)]
fn send_source(s: &Sources, address: u64) -> Source {
    if is_marked(s.uid, address) {
        return Source::Done;
    }
    let key = SeenKey { tid: s.task.1, _pad: 0, address };
    let seen = SEEN.get_ptr_mut(&key);
    if let Some(seen) = seen {
        // SAFETY: an entry only this thread writes (keyed by tid).
        let seen = unsafe { &mut *seen };
        if seen.uid == s.uid {
            return Source::Done;
        }
        seen.uid = s.uid;
    }
    // SAFETY: per-CPU scratch; a uprobe cannot be preempted by another on this CPU.
    let Some(t) = SOURCE_SCRATCH.get_ptr_mut(0).map(|t| unsafe { &mut *t }) else { return Source::Done };
    if read_user_bytes(addr_of_mut!(t.0).cast(), layout::tensor_size(), address).is_err() {
        if seen.is_none() {
            let _ = insert_seen(&key, s.uid, None);
        }
        return Source::Done;
    }
    let remembered = match seen {
        Some(seen) => {
            // SAFETY: as above.
            let seen = unsafe { &mut *seen };
            if seen.sent == 1 && same_bytes(&seen.bytes, t) {
                remember_input(s.cgraph, address, t);
                return Source::Cached;
            }
            // Remembered before the record goes, so that the record can say so.
            seen.sent = 1;
            copy_bytes(&mut seen.bytes, t);
            true
        }
        None => insert_seen(&key, s.uid, Some(t)).is_ok(),
    };
    if !send_tensor(s, address, t, remembered)
        && let Some(seen) = SEEN.get_ptr_mut(&key)
    {
        // Lost to a full ring: user space never got these bytes.
        // SAFETY: as above.
        unsafe { (*seen).sent = 0 };
    }
    Source::Done
}

/// Whether `t` holds `bytes`. Every word is compared, without a branch: an
/// early exit per word made the verifier walk each way out separately.
#[inline(always)]
fn same_bytes(bytes: &[u64; MAX_TENSOR_BYTES / 8], t: &RawTensor) -> bool {
    let words = t.0.as_ptr().cast::<u64>();
    let mut diff = 0u64;
    for (i, &word) in bytes.iter().enumerate() {
        // SAFETY: the scratch holds at least MAX_TENSOR_BYTES.
        diff |= word ^ unsafe { words.add(i).read() };
    }
    diff == 0
}

#[inline(always)]
fn copy_bytes(bytes: &mut [u64; MAX_TENSOR_BYTES / 8], t: &RawTensor) {
    let words = t.0.as_ptr().cast::<u64>();
    for (i, word) in bytes.iter_mut().enumerate() {
        // SAFETY: the scratch holds at least MAX_TENSOR_BYTES.
        *word = unsafe { words.add(i).read() };
    }
}

/// A new entry: sent as a SOURCE with `bytes`, or only seen in this graph.
#[inline(always)]
fn insert_seen(key: &SeenKey, uid: u64, bytes: Option<&RawTensor>) -> Result<(), ()> {
    // SAFETY: per-CPU scratch.
    let new = unsafe { &mut *SEEN_NEW.get_ptr_mut(0).ok_or(())? };
    new.uid = uid;
    new.sent = u64::from(bytes.is_some());
    if let Some(t) = bytes {
        copy_bytes(&mut new.bytes, t);
    }
    SEEN.insert(key, new, 0).map_err(|_| ())
}

/// Copy the source read into `t` into a ring record as the target holds it.
/// An integer input is remembered. False when the ring is full.
#[inline(always)]
fn send_tensor(s: &Sources, address: u64, t: &RawTensor, remembered: bool) -> bool {
    let Some(mut entry) = EVENTS.reserve::<NodeEvent>(0) else {
        count_lost(EventKind::Node);
        return false;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: the reservation is NodeEvent-sized; `fill` writes all of it.
    unsafe {
        fill(e, s.task, s.uid, s.index, node_role::SOURCE, address, t);
        (*e).cache = u16::from(remembered);
    }
    remember_input(s.cgraph, address, t);
    entry.submit(submit_flags());
    true
}

/// An integer input among a graph's sources, sent or cached, is read again at each run.
#[inline(always)]
fn remember_input(cgraph: u64, address: u64, t: &RawTensor) {
    if t.flags() & ggml::FLAG_INPUT != 0 && t.type_() == ggml::TYPE_I32 {
        add_input(cgraph, address, t);
    }
}

/// Write a whole record, the tensor's bytes word by word: a copy of fixed
/// size the verifier checks once.
#[inline(always)]
unsafe fn fill(e: *mut NodeEvent, task: (u32, u32), uid: u64, index: u32, role: u16, address: u64, t: &RawTensor) {
    // SAFETY: the caller's `e` is a NodeEvent-sized reservation.
    unsafe {
        (*e).header = header(EventKind::Node, task);
        (*e).uid = uid;
        (*e).index = index;
        (*e).role = role;
        (*e).cache = 0;
        (*e).address = address;
        let words = addr_of_mut!((*e).tensor).cast::<u64>();
        let from = t.0.as_ptr().cast::<u64>();
        for i in 0..MAX_TENSOR_BYTES / 8 {
            words.add(i).write(from.add(i).read());
        }
    }
}

#[inline(always)]
fn add_input(cgraph: u64, tensor_address: u64, t: &RawTensor) {
    let Some(inputs) = INPUTS.get_ptr_mut(cgraph) else { return };
    // SAFETY: a map value; only this graph's caller thread writes it.
    let inputs = unsafe { &mut *inputs };
    let i = inputs.n as usize;
    if i >= MAX_GRAPH_INPUTS {
        return;
    }
    let ne = t.ne();
    let elems = ne[0].max(0) as u64 * ne[1].max(1) as u64 * ne[2].max(1) as u64 * ne[3].max(1) as u64;
    inputs.tensor[i] = tensor_address;
    inputs.data[i] = t.data();
    inputs.len[i] = (elems * 4).min(MAX_INPUT_BYTES as u64) as u32;
    inputs.n = i as u32 + 1;
}

/// One INPUT record per integer input the graph's walks found. Fields are
/// read through the map value (a copy of `Inputs` took 88 bytes of stack),
/// and each length is bounded right before the read that uses it: 6.1's
/// verifier forgets a bound checked on a value spilled to the stack.
#[inline(always)]
fn send_inputs(cgraph: u64, uid: u64, task: (u32, u32)) {
    let Some(inputs) = INPUTS.get_ptr(cgraph) else { return };
    let Some(event) = GRAPH_INPUT.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU scratch.
    let event = unsafe { &mut *event };
    for i in 0..MAX_GRAPH_INPUTS {
        // SAFETY: a map value, read only (only this thread writes it, in the walk).
        let (n, tensor, data, len) = unsafe {
            (read_volatile(&(*inputs).n), (*inputs).tensor[i], (*inputs).data[i], read_volatile(&(*inputs).len[i]))
        };
        if i as u32 >= n {
            break;
        }
        if len == 0 {
            continue;
        }
        event.header = header(EventKind::Input, task);
        event.uid = uid;
        event.tensor = tensor;
        event._pad = 0;
        // SAFETY: as above; a second read, checked where it is used.
        let len = unsafe { read_volatile(&(*inputs).len[i]) };
        if len as usize > MAX_INPUT_BYTES {
            continue;
        }
        event.len = len;
        // SAFETY: len is at most the size of `data`.
        let ret = unsafe { bpf_probe_read_user(event.data.as_mut_ptr().cast::<c_void>(), len, data as *const c_void) };
        if ret != 0 {
            continue;
        }
        let total = INPUT_EVENT_FIXED + len as usize;
        if total > size_of::<InputEvent>() {
            continue;
        }
        // SAFETY: total is within the scratch slot, checked above.
        let bytes = unsafe { core::slice::from_raw_parts((event as *const InputEvent).cast::<u8>(), total) };
        if EVENTS.output::<[u8]>(bytes, submit_flags()).is_err() {
            count_lost(EventKind::Input);
        }
    }
}
