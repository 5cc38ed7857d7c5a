//! Uprobes on ggml's CPU backend for `--op-timing`: every executed graph
//! node, on the thread that runs it, when it starts.
//!
//! The graph capture (`graph.rs`) already sends every node's tensors once
//! per graph, so a node here costs one 8-byte read (the thread's place in
//! its team) and a 56-byte record: the trap is most of what it costs.

use core::ptr::read_volatile;

use aya_ebpf::{
    EbpfContext, bindings::pt_regs, helpers::generated::bpf_get_attach_cookie, macros::uprobe, programs::ProbeContext,
};
use tracer_common::{EventKind, OpEvent, config, hooks};

use crate::{
    layout::{self, ggml},
    looping::cookie_copies,
    maps::{CONFIG, emit, header, read_user, traced_task},
    pinned::pinned,
};

/// One program for every node hook, told apart by its attach cookie (a
/// `hooks` value), so the verifier checks it once:
/// - `EXTRA`: `ggml_cpu_extra_compute_forward(params, tensor)`, called for
///   every executed node by every worker thread, before the op dispatch;
/// - `FUSED_RMS_NORM`: `ggml_compute_forward_rms_norm_mul_fused(params,
///   rms, mul)`: fused nodes bypass the dispatcher; one record names both.
#[uprobe]
pub fn ggml_op(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    pinned(|| op_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }))
}

cookie_copies!(uprobe, ProbeContext, op_with;
    ggml_op_0 = hooks::EXTRA as u64,
    ggml_op_1 = hooks::FUSED_RMS_NORM as u64,
);

#[inline(always)]
fn op_with(ctx: &ProbeContext, cookie: u64) -> u32 {
    // SAFETY: ctx is the program's own context, a pt_regs.
    let (hook, params, node, third) = unsafe {
        let regs = ctx.as_ptr() as *const pt_regs;
        // Volatile: LLVM would otherwise fold the choice into one load at a
        // computed context offset, which the verifier rejects.
        (
            read_volatile(&cookie) as u32,
            read_volatile(&(*regs).rdi),
            read_volatile(&(*regs).rsi),
            read_volatile(&(*regs).rdx),
        )
    };
    let fused = if hook == hooks::FUSED_RMS_NORM { third } else { 0 };
    let _ = record_node(params, node, fused, hook);
    0
}

fn record_node(params: u64, node: u64, fused: u64, hook: u32) -> Result<(), ()> {
    let task = traced_task().ok_or(())?;
    if !layout::valid() {
        return Err(());
    }
    // `ith, nth` are adjacent in every layout (`ParamsLayout::check`).
    let mut thread = [0u32; 2];
    read_user(&mut thread, params + u64::from(ggml!(params.ith)))?;
    let [ith, nth] = thread;
    let all_threads = CONFIG.get(config::FLAGS).copied().unwrap_or(0) & config::FLAG_ALL_THREADS != 0;
    if ith != 0 && !all_threads {
        return Ok(());
    }
    emit(EventKind::Op, OpEvent { header: header(EventKind::Op, task), node, fused, ith, nth, hook, _pad: 0 });
    Ok(())
}
