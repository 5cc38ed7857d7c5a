//! `--values`: every computed node's output bytes, read where no thread can
//! still write them. After each node (or fused pair) every worker calls
//! `ggml_barrier`; the last thread to arrive has all the others waiting
//! inside, and its uprobe runs before it enters, so the node's bytes are
//! final and nothing overwrites them (ggml-alloc reuses buffers in place)
//! until this handler returns. Each thread marks where it arrived (node,
//! run, barrier within the node: ops barrier internally too), and only
//! barriers called from the node loop (`ggml_graph_compute_thread`) are
//! read; an op inlined there may barrier mid-node, so user space keeps the
//! last read of each node. The marks restart at every node, so an arrival
//! the probes miss costs that node alone (counted as a lost value), never
//! the rest of the run.

use core::{
    ffi::c_void,
    mem::MaybeUninit,
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::generated::bpf_get_attach_cookie,
    macros::{map, uprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::ProbeContext,
};
use tracer_common::{
    EventKind, TensorRecord,
    ggml::MAX_NAME,
    hooks,
    values::{
        MAX_SKIP_NAMES, MAX_TEAM, TASK_SLOTS, VALUE_CHUNK_BYTES, VALUE_EVENT_FIXED, ValueEvent, ValuePool, ValueTask,
        config, flags, part, team, unread,
    },
};

use crate::{
    layout::{self, TENSOR_SCRATCH, ggml},
    looping::{cookie_copies, global_step, repeat},
    maps::{EVENTS, count_lost, header, read_user, read_user_bytes, submit_flags, traced_task},
    pinned::pinned,
};

#[map]
static VALUE_CONFIG: Array<u64> = Array::with_max_entries(config::SLOTS, 0);

/// tid (masked) → the node it computes.
#[map]
static VALUE_TASKS: Array<ValueTask> = Array::with_max_entries(TASK_SLOTS, 0);

/// tgid → its run count and team arrivals (inserted once, at its first run).
#[map]
static VALUE_POOLS: HashMap<u32, ValuePool> = HashMap::with_max_entries(256, 0);

#[map]
static VALUE_SCRATCH: PerCpuArray<ValueEvent> = PerCpuArray::with_max_entries(1, 0);

/// Names `--values-filter` leaves out (user space fills it).
#[map]
static VALUE_SKIP_NAMES: HashMap<[u8; MAX_NAME], u8> = HashMap::with_max_entries(MAX_SKIP_NAMES, 0);

/// Whether `name` (zeroed past its NUL here, so that it is the map's key
/// whatever an earlier, longer name left behind) is one the filter leaves out.
#[inline(always)]
fn filtered_out(name: &mut [u8; MAX_NAME]) -> bool {
    let mut ended = false;
    for byte in name.iter_mut() {
        ended |= *byte == 0;
        if ended {
            *byte = 0;
        }
    }
    // SAFETY: a lookup; the key is a plain byte array.
    unsafe { VALUE_SKIP_NAMES.get(name).is_some() }
}

#[inline(always)]
fn setting(slot: u32) -> u64 {
    VALUE_CONFIG.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn regs(ctx: &ProbeContext) -> *const pt_regs {
    ctx.as_ptr() as *const pt_regs
}

/// A zeroed pool, copied from (too big for the BPF stack).
#[map]
static VALUE_POOL_ZERO: PerCpuArray<ValuePool> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn value_graph(_ctx: ProbeContext) -> u32 {
    pinned(count_run)
}

/// Counts a run of the graph, for the workers' arrival marks.
#[inline(always)]
fn count_run() -> u32 {
    let Some((tgid, _)) = traced_task() else { return 0 };
    // No worker is in a barrier between runs, and the arrival marks carry
    // the run: the last run's marks need no reset.
    if let Some(pool) = VALUE_POOLS.get_ptr_mut(tgid) {
        // SAFETY: a map value; workers read it only inside a run.
        unsafe { (*pool).run += 1 };
        return 0;
    }
    let Some(zero) = VALUE_POOL_ZERO.get_ptr(0) else { return 0 };
    // SAFETY: a map value of the right type (all zero: never written).
    // By reference: 520 bytes would not fit the BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if VALUE_POOLS.insert(tgid, unsafe { &*zero }, 0).is_err() {
        // This run goes unread; the next one retries.
        count_unread(unread::POOL);
        return 0;
    }
    if let Some(pool) = VALUE_POOLS.get_ptr_mut(tgid) {
        // SAFETY: as above.
        unsafe { (*pool).run = 1 };
    }
    0
}

#[uprobe]
pub fn value_node(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    pinned(|| node_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }))
}

cookie_copies!(uprobe, ProbeContext, node_with;
    value_node_0 = hooks::EXTRA as u64,
    value_node_2 = hooks::FUSED_MUL as u64,
);

#[inline(always)]
fn node_with(ctx: &ProbeContext, cookie: u64) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let (hook, params, second, third) = unsafe {
        let r = regs(ctx);
        (read_volatile(&cookie) as u32, read_volatile(&(*r).rdi), read_volatile(&(*r).rsi), read_volatile(&(*r).rdx))
    };
    let Some((tgid, tid)) = traced_task() else { return 0 };
    if !layout::valid() {
        return 0;
    }
    let (node, fused) = if hook == hooks::FUSED_MUL { (third, second) } else { (second, 0) };
    let Some(slot) = VALUE_TASKS.get_ptr_mut(tid & (TASK_SLOTS - 1)) else { return 0 };
    let owner = owner(tgid, tid);
    // SAFETY: an array slot only this thread writes (an owner sharing it is caught at the barrier).
    let last = unsafe { *slot };
    let last = (last.owner == owner).then_some(last);
    // `ith, nth` are adjacent in every layout (`ParamsLayout::check`).
    let (run, nodes_total, barriers_total) = last.map_or((0, 0, 0), |l| (l.run, l.nodes_total, l.barriers_total));
    let nodes_total = nodes_total + 1;
    let test = setting(config::TEST_UNREAD_PARAMS);
    let injected = test != 0 && test as u32 as u64 == nodes_total;
    let mut thread = [0u32; 2];
    let (ith, nth) = if !injected && read_user(&mut thread, params + u64::from(ggml!(params.ith))).is_ok() {
        (thread[0], thread[1])
    } else if let Some(last) = last.filter(|l| !injected && l.params == params && l.run == current_run(tgid)) {
        // A nofault read can fail on a present page (one being migrated).
        // The same `params` in the same run is the same compute call, whose
        // team is known (a later call may reuse the stack slot, with
        // another team size).
        (last.ith, last.nth)
    } else {
        // Read again at the node's first barrier, some time later.
        (team::UNREAD, team::UNREAD)
    };
    let task = ValueTask { node, fused, ith, nth, owner, params, run, barriers: 0, nodes_total, barriers_total };
    unsafe { *slot = task };
    0
}

/// Nodes left unread because a user-memory read failed, by [`unread`] slot.
#[map]
static VALUE_UNREAD: PerCpuArray<u64> = PerCpuArray::with_max_entries(unread::SLOTS, 0);

#[inline(always)]
fn count_unread(slot: u32) {
    if let Some(n) = VALUE_UNREAD.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot (a uprobe program does not migrate; an
        // increment is lost only to a preemption mid-add: a count, not a figure).
        unsafe { *n += 1 };
    }
}

/// The process's run count (0 before its first).
#[inline(always)]
fn current_run(tgid: u32) -> u64 {
    // SAFETY: a map value, read once.
    VALUE_POOLS.get_ptr(tgid).map_or(0, |pool| unsafe { read_volatile(&(*pool).run) })
}

#[inline(always)]
fn owner(tgid: u32, tid: u32) -> u64 {
    u64::from(tgid) << 32 | u64::from(tid)
}

#[uprobe]
pub fn value_barrier(ctx: ProbeContext) -> u32 {
    pinned(|| barrier_with::<false>(&ctx))
}

/// Kernels before 5.17: at most [`BOUNDED_CHUNKS`] chunks per node.
#[uprobe]
pub fn value_barrier_bounded(ctx: ProbeContext) -> u32 {
    barrier_with::<true>(&ctx)
}

/// Chunks the bounded copy reads at most (124 MiB: the verifier keeps a
/// pending state per step of a bounded loop, at most 8192 in all); a larger
/// node is sent as `TOO_BIG`, as one over the `MAX_BYTES` setting is.
const BOUNDED_CHUNKS: u32 = 4000;

#[inline(always)]
fn barrier_with<const BOUNDED: bool>(ctx: &ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let (rsp, rip) = unsafe {
        let r = regs(ctx);
        (read_volatile(&(*r).rsp), read_volatile(&(*r).rip))
    };
    let _ = on_barrier::<BOUNDED>(rsp, rip);
    0
}

fn on_barrier<const BOUNDED: bool>(rsp: u64, rip: u64) -> Result<(), ()> {
    let task = traced_task().ok_or(())?;
    let (Some(state), Some(pool)) =
        (VALUE_TASKS.get_ptr_mut(task.1 & (TASK_SLOTS - 1)), VALUE_POOLS.get_ptr_mut(task.0))
    else {
        // No run started (attached mid-run) or its pool not made: nothing
        // to read against. User space counts the nodes left without values.
        return Err(());
    };
    // SAFETY: map values: the thread's own slot, and its own slot of the
    // process's pool (other slots are only read).
    let (state, pool) = unsafe { (&mut *state, &mut *pool) };
    if state.owner != owner(task.0, task.1) {
        // Not at a node yet, or another thread's tid shares the slot (its
        // nodes are then counted without values by user space).
        return Err(());
    }
    let run = unsafe { read_volatile(&pool.run) };
    state.run = run;
    state.barriers += 1;
    state.barriers_total += 1;
    if !team_known(state) {
        return Err(());
    }
    let (ith, nth) = (state.ith as usize, state.nth as usize);
    if ith >= MAX_TEAM || nth > MAX_TEAM {
        // A team this large is not followed: every barrier counts as a lost value.
        count_lost(EventKind::Value);
        return Err(());
    }
    let mark = run << 16 | state.barriers.min(0xffff);
    // Our mark is stored one short and completed with a locked add: a full
    // fence, so the reads below cannot pass it. With plain stores two
    // threads arriving together could each miss the other's (store-load
    // reordering on x86), and neither would read the node.
    let me = &mut pool.arrivals[ith];
    me.node = state.node;
    me.mark = mark - 1;
    arrive(&mut me.mark);
    for j in 0..MAX_TEAM {
        // `nth` read at every step: with a bound it could hoist, LLVM
        // counts the loop down from `nth`, and 6.1's verifier cannot follow
        // that counter to its end (it reads past `arrivals`).
        if j as u32 >= unsafe { read_volatile(&state.nth) } {
            break;
        }
        // A thread not at this barrier is still computing its share of the
        // node: its mark is from an earlier barrier, node or run.
        let other = &pool.arrivals[j];
        if unsafe { read_volatile(&other.node) } != state.node || unsafe { read_volatile(&other.mark) } != mark {
            return Ok(());
        }
    }
    // Every thread has arrived, and none can leave until we enter. Two
    // arriving at once may both read: user space keeps one.
    let mut ret = 0u64;
    if read_user(&mut ret, rsp).is_err() {
        // Which barrier this is cannot be told: not read, and said.
        count_unread(unread::SITE);
        return Err(());
    }
    // The uprobe's address (or one past it) is in the same page as the
    // probe site's link-time address (BARRIER_VADDR), and the library is
    // mapped at a page-aligned bias.
    let barrier = setting(config::BARRIER_VADDR);
    let bias = (rip & !0xfff).wrapping_sub(barrier & !0xfff);
    let site = ret.wrapping_sub(bias);
    if site < setting(config::LOOP_START) || site >= setting(config::LOOP_END) {
        return Ok(());
    }
    // One read per CPU at a time: the scratch it copies through is per CPU,
    // and a preempted read must not have it overwritten.
    let busy = VALUE_BUSY.get_ptr_mut(0).ok_or(())?;
    // SAFETY: this CPU's slot; a uprobe program does not migrate.
    if unsafe { read_volatile(busy) } != 0 {
        count_unread(unread::BUSY);
        return Err(());
    }
    unsafe { *busy = 1 };
    let sent = send::<BOUNDED>(task, run, *state, site);
    unsafe { *busy = 0 };
    sent
}

/// Whether the thread's place in the team is known: read now if its node's
/// entry could not read it. A node read at neither goes unread, and is said.
#[inline(always)]
fn team_known(state: &mut ValueTask) -> bool {
    match state.nth {
        team::LOST => false,
        team::UNREAD => {
            let mut thread = [0u32; 2];
            let test = setting(config::TEST_UNREAD_PARAMS);
            let injected = test & config::REREAD_FAILS != 0 && test as u32 as u64 == state.nodes_total;
            if !injected
                && layout::valid()
                && read_user(&mut thread, state.params + u64::from(ggml!(params.ith))).is_ok()
            {
                (state.ith, state.nth) = (thread[0], thread[1]);
                true
            } else {
                count_unread(unread::PARAMS);
                (state.ith, state.nth) = (team::LOST, team::LOST);
                false
            }
        }
        _ => true,
    }
}

/// Non-zero while this CPU sends a node (see [`unread::BUSY`]).
#[map]
static VALUE_BUSY: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[cfg(target_arch = "bpf")]
#[inline(always)]
fn arrive(slot: &mut u64) {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};
    // SAFETY: a map value's slot only this thread adds to.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(slot, 1) };
}

/// Host builds only type-check.
#[cfg(not(target_arch = "bpf"))]
fn arrive(slot: &mut u64) {
    *slot += 1;
}

/// Element bytes of the types user space can read; 0 for the rest.
#[inline(always)]
fn element_bytes(type_: i32) -> u64 {
    match type_ {
        0 | 26 => 4, // F32, I32
        1 | 30 => 2, // F16, BF16
        _ => 0,
    }
}

/// What a chunk loop needs in every step.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChunkLoop {
    task: (u32, u32),
    run: u64,
    node: u64,
    data: u64,
    total: u64,
}

fn send<const BOUNDED: bool>(task: (u32, u32), run: u64, state: ValueTask, site: u64) -> Result<(), ()> {
    // SAFETY: per-CPU scratch; a uprobe cannot be preempted by another on this CPU.
    let t = unsafe { &mut *TENSOR_SCRATCH.get_ptr_mut(0).ok_or(())? };
    let e = unsafe { &mut *VALUE_SCRATCH.get_ptr_mut(0).ok_or(())? };
    e.header = header(EventKind::Value, task);
    e.run = run;
    e.node = state.node;
    e.site = site;
    e.fused = state.fused;
    e.offset = 0;
    e.len = 0;
    e.part = part::HEAD;
    e._pad = 0;
    let mut bits = 0u32;
    let mut span = 0u64;
    let mut data = 0u64;
    if read_user_bytes(addr_of_mut!(t.0).cast(), layout::tensor_size(), state.node).is_err() {
        bits |= flags::READ_FAILED;
    } else {
        let ne = t.ne();
        let nb = t.nb();
        let size = element_bytes(t.type_());
        data = t.data();
        if t.u64(ggml!(tensor.view_src)) != 0 {
            bits |= flags::VIEW;
        }
        let empty = ne[0] <= 0 || ne[1] <= 0 || ne[2] <= 0 || ne[3] <= 0;
        if !empty && size != 0 {
            span = size;
            for i in 0..4 {
                span += (ne[i] as u64 - 1) * nb[i];
            }
            let rows = ne[1] as u64 * ne[2] as u64 * ne[3] as u64;
            if nb[0] != size || span != size * ne[0] as u64 * rows {
                bits |= flags::NON_CONTIGUOUS;
            }
        }
        let mut name = t.name();
        if setting(config::FILTERING) != 0 && filtered_out(&mut name) {
            // Not sent at all (see `unread::FILTERED`).
            count_unread(unread::FILTERED);
            return Ok(());
        }
        if size == 0 {
            bits |= flags::UNSUPPORTED_TYPE;
        } else if t.op() as u64 == setting(config::SET_ROWS_OP) {
            bits |= flags::SET_ROWS;
        } else if span > setting(config::MAX_BYTES)
            || (BOUNDED && span > u64::from(BOUNDED_CHUNKS) * VALUE_CHUNK_BYTES as u64)
        {
            bits |= flags::TOO_BIG;
        }
        if bits & (flags::UNSUPPORTED_TYPE | flags::SET_ROWS | flags::TOO_BIG) != 0 {
            span = 0;
        }
        let record = TensorRecord {
            tensor: state.node,
            data,
            ne,
            nb,
            view_src: t.u64(ggml!(tensor.view_src)),
            view_offs: t.u64(ggml!(tensor.view_offs)),
            extra: t.u64(ggml!(tensor.extra)),
            type_: t.type_(),
            op: t.op(),
            op_param0: t.i32(ggml!(tensor.op_params)),
            flags: t.flags(),
            slot: tracer_common::SLOT_DST,
            _pad: 0,
            name,
        };
        // SAFETY: the data area is larger than one TensorRecord.
        unsafe { (e.data.as_mut_ptr() as *mut MaybeUninit<TensorRecord>).write_unaligned(MaybeUninit::new(record)) };
    }
    e.flags = bits;
    e.offset = span;
    let bytes = unsafe {
        core::slice::from_raw_parts((e as *const ValueEvent).cast::<u8>(), tracer_common::values::VALUE_HEAD_BYTES)
    };
    if EVENTS.output::<[u8]>(bytes, submit_flags()).is_err() {
        count_lost(EventKind::Value);
        return Ok(());
    }
    if span == 0 {
        return Ok(());
    }
    let chunks = span.div_ceil(VALUE_CHUNK_BYTES as u64) as u32;
    let mut copy = ChunkLoop { task, run, node: state.node, data, total: span };
    let max = if BOUNDED { BOUNDED_CHUNKS } else { u32::MAX };
    repeat::<BOUNDED, _>(chunks, max, send_chunk, ttrace_send_chunk, &mut copy);
    Ok(())
}

global_step!(ttrace_send_chunk, send_chunk, ChunkLoop);

#[inline(never)]
extern "C" fn send_chunk(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the loop passes back the `ChunkLoop` given to it.
    let copy = unsafe { &*(ctx as *const ChunkLoop) };
    if chunk(copy, index).is_err() { 1 } else { 0 }
}

fn chunk(copy: &ChunkLoop, index: u64) -> Result<(), ()> {
    let offset = index * VALUE_CHUNK_BYTES as u64;
    let left = copy.total.checked_sub(offset).ok_or(())?;
    let len = if left > VALUE_CHUNK_BYTES as u64 { VALUE_CHUNK_BYTES as u32 } else { left as u32 };
    // SAFETY: per-CPU scratch.
    let e = unsafe { &mut *VALUE_SCRATCH.get_ptr_mut(0).ok_or(())? };
    e.header = header(EventKind::Value, copy.task);
    e.run = copy.run;
    e.node = copy.node;
    e.site = 0;
    e.fused = 0;
    e.offset = offset;
    e.part = part::CHUNK;
    e.flags = 0;
    // Bounded for the verifier, which cannot follow `len`'s origin.
    let len = unsafe { read_volatile(&len) };
    // One comparison: LLVM folds `len == 0 || len > N` into a subtraction
    // the verifier cannot carry back to `len`. (`len` > 0: chunks cover `total`.)
    if len as usize > VALUE_CHUNK_BYTES {
        return Err(());
    }
    e.len = len;
    read_user_bytes(e.data.as_mut_ptr(), len, copy.data + offset)?;
    let total = VALUE_EVENT_FIXED + len as usize;
    // SAFETY: total is within the scratch slot (len checked above).
    let bytes = unsafe { core::slice::from_raw_parts((e as *const ValueEvent).cast::<u8>(), total) };
    if EVENTS.output::<[u8]>(bytes, submit_flags()).is_err() {
        count_lost(EventKind::Value);
        return Err(());
    }
    Ok(())
}
