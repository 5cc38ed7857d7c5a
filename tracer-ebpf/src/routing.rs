//! MoE routing from the unmodified binary. llama.cpp ranks each token's
//! experts in an `ffn_moe_argsort-L` node, whose buffer is reused later in
//! the graph, so the ids are read when computed: at the return of
//! `ggml_compute_forward_argsort(params, dst)`, each thread has sorted rows
//! `ith, ith + nth, …` and sends those. Two traps per MoE layer and thread.

use core::{
    ffi::c_void,
    mem::MaybeUninit,
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::generated::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{map, uprobe, uretprobe},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{EventKind, MAX_EXPERTS, MAX_ROUTING_ROWS, MOE_ARGSORT_PREFIX, MOE_DOWN_PREFIX, RoutingEvent};

use crate::{
    layout::{self, ggml},
    looping::{global_step, repeat},
    maps::{EVENTS, count_lost, count_lost_n, header, read_user, submit_flags, traced_task},
    pinned::pinned,
};

/// An argsort call in flight on a thread (pid_tgid key).
#[repr(C)]
#[derive(Clone, Copy)]
struct Call {
    dst: u64,
    ith: u32,
    nth: u32,
}

#[map]
static ARGSORT_CALLS: HashMap<u64, Call> = HashMap::with_max_entries(1024, 0);

/// Rows one thread sends per argsort in the bounded copies: the verifier
/// keeps a pending state per step of a bounded loop, at most 8192 in all
/// (half of MAX_ROUTING_ROWS's 8192 rows is every thread's share at `-t 2`).
const BOUNDED_ROWS: u32 = 4000;

/// What each loop step of a return needs.
#[repr(C)]
#[derive(Clone, Copy)]
struct Rows {
    task: (u32, u32),
    dst: u64,
    data: u64,
    row_bytes: u64,
    first: u32,
    step: u32,
    n_experts: u32,
}

#[uprobe]
pub fn argsort_entry(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let regs = ctx.as_ptr() as *const pt_regs;
    let (params, dst) = unsafe { (read_volatile(&(*regs).rdi), read_volatile(&(*regs).rsi)) };
    let _ = pinned(|| entry(params, dst));
    0
}

fn entry(params: u64, dst: u64) -> Result<(), ()> {
    traced_task().ok_or(())?;
    if !layout::valid() {
        return Err(());
    }
    let mut name = [0u8; 15];
    read_user(&mut name, dst + u64::from(ggml!(tensor.name)))?;
    if &name != MOE_ARGSORT_PREFIX {
        return Ok(());
    }
    // `ith, nth` are adjacent in every layout (`ParamsLayout::check`).
    let mut thread = [0i32; 2];
    read_user(&mut thread, params + u64::from(ggml!(params.ith)))?;
    let [ith, nth] = thread;
    let call = Call { dst, ith: ith.max(0) as u32, nth: nth.max(1) as u32 };
    // SAFETY: plain helper call.
    let key = unsafe { bpf_get_current_pid_tgid() };
    ARGSORT_CALLS.insert(key, call, 0).map_err(|_| ())
}

/// Builds whose argsort has no symbol: at the entry of the layer's last
/// expert matmul (`ffn_moe_down-L`), thread 0 sends every row of the
/// argsort node its `ids` source views. One trap per MUL_MAT_ID and thread.
#[uprobe]
pub fn mul_mat_id_entry(ctx: ProbeContext) -> u32 {
    pinned(|| mul_mat_id_with::<false>(&ctx))
}

/// Kernels before 5.17 (`looping`).
#[uprobe]
pub fn mul_mat_id_bounded(ctx: ProbeContext) -> u32 {
    mul_mat_id_with::<true>(&ctx)
}

#[inline(always)]
fn mul_mat_id_with<const BOUNDED: bool>(ctx: &ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let regs = ctx.as_ptr() as *const pt_regs;
    let (params, dst) = unsafe { (read_volatile(&(*regs).rdi), read_volatile(&(*regs).rsi)) };
    let _ = at_mul_mat_id::<BOUNDED>(params, dst);
    0
}

fn at_mul_mat_id<const BOUNDED: bool>(params: u64, dst: u64) -> Result<(), ()> {
    traced_task().ok_or(())?;
    if !layout::valid() {
        return Err(());
    }
    let mut ith = 0i32;
    read_user(&mut ith, params + u64::from(ggml!(params.ith)))?;
    let mut name = [0u8; 12];
    read_user(&mut name, dst + u64::from(ggml!(tensor.name)))?;
    if ith != 0 || &name != MOE_DOWN_PREFIX {
        return Ok(());
    }
    // ids = dst->src[2], a view of the argsort node.
    let (mut ids, mut argsort) = (0u64, 0u64);
    read_user(&mut ids, dst + u64::from(ggml!(tensor.src)) + 16)?;
    read_user(&mut argsort, ids + u64::from(ggml!(tensor.view_src)))?;
    let mut name = [0u8; 15];
    read_user(&mut name, argsort + u64::from(ggml!(tensor.name)))?;
    if &name != MOE_ARGSORT_PREFIX {
        return Ok(());
    }
    send_rows::<BOUNDED>(Call { dst: argsort, ith: 0, nth: 1 })
}

#[uretprobe]
pub fn argsort_return(_ctx: RetProbeContext) -> u32 {
    pinned(argsort_return_with::<false>)
}

/// Kernels before 5.17 (`looping`).
#[uretprobe]
pub fn argsort_return_bounded(_ctx: RetProbeContext) -> u32 {
    argsort_return_with::<true>()
}

#[inline(always)]
fn argsort_return_with<const BOUNDED: bool>() -> u32 {
    // SAFETY: plain helper call.
    let key = unsafe { bpf_get_current_pid_tgid() };
    // SAFETY: a map value, copied out before it is removed.
    let Some(call) = (unsafe { ARGSORT_CALLS.get(key) }).copied() else { return 0 };
    let _ = ARGSORT_CALLS.remove(key);
    let _ = send_rows::<BOUNDED>(call);
    0
}

fn send_rows<const BOUNDED: bool>(call: Call) -> Result<(), ()> {
    let task = traced_task().ok_or(())?;
    let base = call.dst;
    let (mut ne, mut nb1, mut data) = ([0i64; 4], 0u64, 0u64);
    read_user(&mut ne, base + u64::from(ggml!(tensor.ne)))?;
    read_user(&mut nb1, base + u64::from(ggml!(tensor.nb)) + 8)?;
    read_user(&mut data, base + u64::from(ggml!(tensor.data)))?;
    // Unsigned arithmetic: BPF has no signed division.
    let rows = ne[1].max(1) as u64 * ne[2].max(1) as u64 * ne[3].max(1) as u64;
    let (ith, nth) = (u64::from(call.ith), u64::from(call.nth));
    let mine = if rows > ith { (rows - ith).div_ceil(nth) } else { 0 };
    let n_experts = ne[0].clamp(0, MAX_EXPERTS as i64) as u32;
    let mut walk = Rows { task, dst: base, data, row_bytes: nb1, first: call.ith, step: call.nth, n_experts };
    let max = if BOUNDED { BOUNDED_ROWS } else { MAX_ROUTING_ROWS };
    if mine > u64::from(max) {
        // Rows past the bound are counted, never dropped silently.
        count_lost_n(EventKind::Routing, mine - u64::from(max));
    }
    repeat::<BOUNDED, _>(mine as u32, max, send_row, ttrace_send_row, &mut walk);
    Ok(())
}

global_step!(ttrace_send_row, send_row, Rows);

#[inline(never)]
extern "C" fn send_row(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the loop passes back the `Rows` given to it.
    let walk = unsafe { &*(ctx as *const Rows) };
    let row = walk.first + k as u32 * walk.step;
    let Some(mut entry) = EVENTS.reserve::<RoutingEvent>(0) else {
        count_lost(EventKind::Routing);
        return 0;
    };
    let event: &mut MaybeUninit<RoutingEvent> = &mut entry;
    let e = event.as_mut_ptr();
    let bytes = (walk.n_experts as usize * 4).min(MAX_EXPERTS * 4) as u32;
    // SAFETY: the reservation is RoutingEvent-sized; `bytes` fits `ids`.
    unsafe {
        (*e).header = header(EventKind::Routing, walk.task);
        (*e).tensor = walk.dst;
        (*e).row = row;
        (*e).n_experts = walk.n_experts;
        let src = walk.data + u64::from(row) * walk.row_bytes;
        if bpf_probe_read_user(addr_of_mut!((*e).ids).cast(), bytes, src as *const c_void) != 0 {
            entry.discard(0);
            return 0;
        }
    }
    entry.submit(submit_flags());
    0
}
