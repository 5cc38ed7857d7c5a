//! Generic function entry/return uprobes, told apart by their attach cookie
//! (a `tracer_common::markers` value): the self-test's probe, and the rare
//! boundary markers (ubatch graphs, decode calls, perf resets).

use aya_ebpf::{
    EbpfContext,
    helpers::generated::bpf_get_attach_cookie,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{CallEvent, EventKind};

use crate::maps::{emit, header, traced_task};

#[uprobe]
pub fn call_args(ctx: ProbeContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    // SAFETY: ctx is the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    emit(
        EventKind::Call,
        CallEvent {
            header: header(EventKind::Call, task),
            cookie,
            args: [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
        },
    );
    0
}

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
