//! One uprobe per CPU graph: `ggml_graph_compute(cgraph, cplan)` is called
//! once per graph split by the calling thread only, so its cost does not
//! grow with node or thread counts. A graph whose `(cgraph, uid)` ran before
//! is unchanged (the scheduler gives a rebuilt split a fresh uid), and only
//! its integer inputs are read again; a new one is read whole with
//! `bpf_loop`: every node, and every tensor a node reads that is not a node.
//! Builds whose `ggml_cgraph` has no `uid` (ggml before 0.10) rebuild their
//! graphs for every ubatch anyway: each run is read whole, under a number
//! the probe makes up.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, pt_regs},
    helpers::generated::{bpf_loop, bpf_probe_read_user},
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
    ggml::TENSOR_SCRATCH,
    layout::{self, RawTensor, ggml},
    maps::{EVENTS, count_lost, emit, header, read_user, read_user_bytes, submit_flags, traced_task},
};

/// What a graph's walk needs in every `bpf_loop` step.
#[repr(C)]
struct Walk {
    task: (u32, u32),
    nodes: u64,
    uid: u64,
    cgraph: u64,
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
    let _ = read_graph(cgraph);
    0
}

/// Numbers for runs of graphs without a `uid` of their own: the top bit
/// set, so they never equal a real one (ggml counts those up from 1).
#[map]
static MADE_UP_UID: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

fn read_graph(cgraph: u64) -> Result<(), ()> {
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
    let n_nodes = if fits { (raw_n_nodes as u32).min(MAX_GRAPH_NODES) } else { 0 };
    // A made-up uid is never the last one: such a graph is read every run.
    let reused = LAST_UID.get_ptr(cgraph).is_some_and(|last| unsafe { *last } == uid);
    let event =
        |flags| GraphEvent { header: header(EventKind::Graph, task), cgraph, uid, n_nodes, flags, raw_n_nodes, size };
    emit(EventKind::Graph, event(if reused { graph::REUSED } else { 0 }));
    if !reused {
        let empty = Inputs { n: 0, _pad: 0, tensor: [0; MAX_GRAPH_INPUTS], data: [0; MAX_GRAPH_INPUTS], len: [0; 4] };
        let _ = INPUTS.insert(cgraph, empty, 0);
        let mut walk = Walk { task, nodes, uid, cgraph };
        // SAFETY: the callback gets `walk` back as its context.
        unsafe {
            bpf_loop(n_nodes, walk_node as *mut c_void, addr_of_mut!(walk).cast::<c_void>(), 0);
        }
        let _ = LAST_UID.insert(cgraph, uid, 0);
    }
    send_inputs(cgraph, uid, task);
    emit(EventKind::Graph, event(graph::DONE | if reused { graph::REUSED } else { 0 }));
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

#[inline(never)]
extern "C" fn walk_node(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Walk` given to it.
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
    unsafe { fill(e, walk, index, node_role::NODE, node, t) };
    let sources = t.src();
    mark(walk, node);
    let mut cached = 0u16;
    for (slot, src) in sources.into_iter().enumerate() {
        if src != 0 && send_source(walk, index, src) == Source::Cached {
            cached |= 1 << slot;
        }
    }
    // SAFETY: as above.
    unsafe { (*e).cache = cached };
    entry.submit(submit_flags());
    Ok(())
}

#[derive(PartialEq, Eq)]
enum Source {
    /// Sent already in this graph, sent now, or unreadable.
    Done,
    /// Equal to the last record sent for it: the node's record says so.
    Cached,
}

/// Record that `address` was sent (as a node) in this graph.
#[inline(always)]
fn mark(walk: &Walk, address: u64) {
    if let Some(slot) = GRAPH_NODES.get_ptr_mut(node_slot(address)) {
        // SAFETY: per-CPU slot; a uprobe program is not migrated while it runs.
        unsafe { *slot = NodeSlot { address, uid: walk.uid } };
    }
}

/// Whether `address` is a node of the graph being read, as far as its slot
/// still says.
#[inline(always)]
fn is_marked(walk: &Walk, address: u64) -> bool {
    // SAFETY: per-CPU slot, read only.
    GRAPH_NODES
        .get_ptr(node_slot(address))
        .is_some_and(|slot| unsafe { (*slot).address == address && (*slot).uid == walk.uid })
}

/// A node's source: skipped when already sent in this graph, marked cached
/// when its bytes equal the last record sent for it, else sent whole.
#[inline(always)]
fn send_source(walk: &Walk, index: u32, address: u64) -> Source {
    if is_marked(walk, address) {
        return Source::Done;
    }
    let key = SeenKey { tid: walk.task.1, _pad: 0, address };
    let seen = SEEN.get_ptr_mut(&key);
    if let Some(seen) = seen {
        // SAFETY: an entry only this thread writes (keyed by tid).
        let seen = unsafe { &mut *seen };
        if seen.uid == walk.uid {
            return Source::Done;
        }
        seen.uid = walk.uid;
    }
    // SAFETY: per-CPU scratch; a uprobe cannot be preempted by another on this CPU.
    let Some(t) = TENSOR_SCRATCH.get_ptr_mut(0).map(|t| unsafe { &mut *t }) else { return Source::Done };
    if read_user_bytes(addr_of_mut!(t.0).cast(), layout::tensor_size(), address).is_err() {
        if seen.is_none() {
            let _ = insert_seen(&key, walk.uid, None);
        }
        return Source::Done;
    }
    let words = t.0.as_ptr().cast::<u64>();
    if let Some(seen) = seen {
        // SAFETY: as above.
        let seen = unsafe { &mut *seen };
        // SAFETY: the scratch holds at least MAX_TENSOR_BYTES.
        if seen.sent == 1 && (0..MAX_TENSOR_BYTES / 8).all(|i| seen.bytes[i] == unsafe { words.add(i).read() }) {
            remember_input(walk, address, t);
            return Source::Cached;
        }
    }
    // Remembered before the record goes, so that the record can say so.
    let remembered = match seen {
        Some(seen) => {
            // SAFETY: as above.
            let seen = unsafe { &mut *seen };
            seen.sent = 1;
            for i in 0..MAX_TENSOR_BYTES / 8 {
                // SAFETY: the scratch holds at least MAX_TENSOR_BYTES.
                seen.bytes[i] = unsafe { words.add(i).read() };
            }
            true
        }
        None => insert_seen(&key, walk.uid, Some(t)).is_ok(),
    };
    if !send_tensor(walk, index, address, t, remembered)
        && let Some(seen) = SEEN.get_ptr_mut(&key)
    {
        // Lost to a full ring: user space never got these bytes.
        // SAFETY: as above.
        unsafe { (*seen).sent = 0 };
    }
    Source::Done
}

/// A new entry: sent as a SOURCE with `bytes`, or only seen in this graph.
#[inline(always)]
fn insert_seen(key: &SeenKey, uid: u64, bytes: Option<&RawTensor>) -> Result<(), ()> {
    // SAFETY: per-CPU scratch.
    let new = unsafe { &mut *SEEN_NEW.get_ptr_mut(0).ok_or(())? };
    new.uid = uid;
    new.sent = u64::from(bytes.is_some());
    if let Some(t) = bytes {
        let words = t.0.as_ptr().cast::<u64>();
        for i in 0..MAX_TENSOR_BYTES / 8 {
            // SAFETY: the scratch holds at least MAX_TENSOR_BYTES.
            new.bytes[i] = unsafe { words.add(i).read() };
        }
    }
    SEEN.insert(key, new, 0).map_err(|_| ())
}

/// Copy the source read into `t` into a ring record as the target holds it.
/// An integer input is remembered. False when the ring is full.
#[inline(always)]
fn send_tensor(walk: &Walk, index: u32, address: u64, t: &RawTensor, remembered: bool) -> bool {
    let Some(mut entry) = EVENTS.reserve::<NodeEvent>(0) else {
        count_lost(EventKind::Node);
        return false;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: the reservation is NodeEvent-sized; `fill` writes all of it.
    unsafe {
        fill(e, walk, index, node_role::SOURCE, address, t);
        (*e).cache = u16::from(remembered);
    }
    remember_input(walk, address, t);
    entry.submit(submit_flags());
    true
}

/// An integer input among a graph's sources, sent or cached, is read again at each run.
#[inline(always)]
fn remember_input(walk: &Walk, address: u64, t: &RawTensor) {
    if t.flags() & ggml::FLAG_INPUT != 0 && t.type_() == ggml::TYPE_I32 {
        add_input(walk.cgraph, address, t);
    }
}

/// Write a whole record, the tensor's bytes word by word: a copy of fixed
/// size the verifier checks once.
#[inline(always)]
unsafe fn fill(e: *mut NodeEvent, walk: &Walk, index: u32, role: u16, address: u64, t: &RawTensor) {
    // SAFETY: the caller's `e` is a NodeEvent-sized reservation.
    unsafe {
        (*e).header = header(EventKind::Node, walk.task);
        (*e).uid = walk.uid;
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

#[inline(always)]
fn send_inputs(cgraph: u64, uid: u64, task: (u32, u32)) {
    let Some(inputs) = INPUTS.get_ptr(cgraph) else { return };
    // SAFETY: a map value, read only.
    let inputs = unsafe { *inputs };
    let Some(event) = GRAPH_INPUT.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU scratch.
    let event = unsafe { &mut *event };
    for i in 0..MAX_GRAPH_INPUTS {
        if i as u32 >= inputs.n {
            break;
        }
        let len = inputs.len[i] as usize;
        if len == 0 || len > MAX_INPUT_BYTES {
            continue;
        }
        event.header = header(EventKind::Input, task);
        event.uid = uid;
        event.tensor = inputs.tensor[i];
        event.len = len as u32;
        event._pad = 0;
        // SAFETY: len is at most the size of `data`.
        let ret = unsafe {
            bpf_probe_read_user(event.data.as_mut_ptr().cast::<c_void>(), len as u32, inputs.data[i] as *const c_void)
        };
        if ret != 0 {
            continue;
        }
        let total = INPUT_EVENT_FIXED + len;
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
