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

use crate::maps::{CONFIG, emit, emit_with, header, submit_flags, traced_task};

#[uprobe]
pub fn call_args(ctx: ProbeContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    // SAFETY: ctx is the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // A ubatch graph starting wakes the reader at once: it re-reads the
    // target's maps then, while the model is surely mapped and the target
    // alive (a short run may exit before the next timed drain).
    let flags = if cookie == markers::SCHED_GRAPH_COMPUTE { u64::from(BPF_RB_FORCE_WAKEUP) } else { submit_flags() };
    if cookie == markers::SCHED_GRAPH_COMPUTE {
        stop_once();
    }
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
fn stop_once() {
    let Some(slot) = CONFIG.get_ptr_mut(config::STOP_AT_FIRST_GRAPH) else { return };
    // SAFETY: a map value; the one graph-computing thread clears it.
    if unsafe { *slot } != 0 {
        unsafe {
            *slot = 0;
            bpf_send_signal(SIGSTOP);
        }
    }
}

const SIGSTOP: u32 = 19;

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    // SAFETY: ctx is the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    emit(
        EventKind::Call,
        CallEvent { header: header(EventKind::Call, task), cookie, args: [ctx.ret::<u64>(), 0, 0, 0, 0, 0] },
    );
    0
}
