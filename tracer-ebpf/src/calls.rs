//! Generic function entry/return uprobes, told apart by their attach cookie
//! (a `tracer_common::markers` value): the self-test's probe, and the rare
//! boundary markers (ubatch graphs, decode calls, perf resets).

use aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP;
use aya_ebpf::helpers::generated::bpf_send_signal;
use aya_ebpf::{
    EbpfContext,
    helpers::generated::bpf_get_attach_cookie,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{CallEvent, EventKind, config, markers};

use crate::{
    looping::cookie_copies,
    maps::{CONFIG, emit, emit_with, header, submit_flags, traced_task},
    pinned::pinned,
};

#[uprobe]
pub fn call_args(ctx: ProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    pinned(|| args_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }))
}

cookie_copies!(uprobe, ProbeContext, args_with;
    call_args_0 = markers::SELFTEST,
    call_args_1 = markers::SCHED_GRAPH_COMPUTE,
    call_args_3 = markers::LLAMA_DECODE,
    call_args_4 = markers::LLAMA_PROCESS,
    call_args_5 = markers::LLAMA_PERF_RESET,
    call_args_19 = markers::OUTPUT_RESERVE,
    call_args_21 = markers::SEQ_RM_CHECK,
    call_args_23 = markers::LIBRARY_LOADED,
    call_args_24 = markers::WHISPER_ENCODE,
    call_args_25 = markers::WHISPER_DECODE,
    call_args_26 = markers::WHISPER_INIT,
);

#[inline(always)]
fn args_with(ctx: &ProbeContext, cookie: u64) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    // The first ubatch graph of a `run` stops the target and wakes the
    // reader at once: it reads the target's maps while the model is surely
    // mapped (a short run may exit before the next timed drain). Later
    // graphs wake nobody: a wake-up per token would take a CPU from the
    // target's threads.
    let first = cookie == markers::SCHED_GRAPH_COMPUTE && stop_once();
    // A library loaded before ggml was found: hold the target while ttrace
    // looks for ggml in its maps, so no graph runs unprobed.
    let held = cookie == markers::LIBRARY_LOADED && hold_at_library_load();
    // whisper.cpp's model path is read from its memory by the reader, while
    // the loader runs: wake it at once (once per model loaded).
    let now = first || held || cookie == markers::WHISPER_INIT;
    let flags = if now { u64::from(BPF_RB_FORCE_WAKEUP) } else { submit_flags() };
    emit_with(
        EventKind::Call,
        CallEvent {
            header: header(EventKind::Call, task),
            cookie,
            args: [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
        },
        flags,
    );
    0
}

/// A short run may exit before the reader gets a CPU on a loaded machine,
/// and its maps go with it: hold the target at its first graph until ttrace
/// has read them (it sends SIGCONT). Only when `run` asked, and only once.
#[inline(always)]
fn stop_once() -> bool {
    let Some(slot) = CONFIG.get_ptr_mut(config::STOP_AT_FIRST_GRAPH) else { return false };
    // SAFETY: a map value; the one graph-computing thread clears it.
    if unsafe { *slot } == 0 {
        return false;
    }
    unsafe {
        *slot = 0;
        bpf_send_signal(SIGSTOP);
    }
    true
}

/// Stop the target at a library load while ttrace asks for it (it
/// continues the target and clears the setting once ggml's probes are in).
#[inline(always)]
fn hold_at_library_load() -> bool {
    if CONFIG.get(config::HOLD_AT_LIBRARY_LOAD).copied().unwrap_or(0) == 0 {
        return false;
    }
    // SAFETY: a helper call with a constant signal.
    unsafe { bpf_send_signal(SIGSTOP) };
    true
}

const SIGSTOP: u32 = 19;

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    // SAFETY: ctx is the program's own context.
    pinned(|| return_with(&ctx, unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }))
}

cookie_copies!(uretprobe, RetProbeContext, return_with;
    call_return_2 = markers::SCHED_GRAPH_COMPUTE_RETURN,
    call_return_6 = markers::GRAPH_COMPUTE_RETURN,
    call_return_20 = markers::OUTPUT_RESERVE_RETURN,
    call_return_22 = markers::SEQ_RM_CHECK_RETURN,
);

#[inline(always)]
fn return_with(ctx: &RetProbeContext, cookie: u64) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    emit(
        EventKind::Call,
        CallEvent { header: header(EventKind::Call, task), cookie, args: [ctx.ret::<u64>(), 0, 0, 0, 0, 0] },
    );
    0
}
