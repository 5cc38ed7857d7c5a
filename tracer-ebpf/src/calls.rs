//! Generic function-entry uprobe: records the first six integer arguments.
//! Used by the self-test round trip and as the building block for
//! argument-only hooks.

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use tracer_common::{CallEvent, EventKind};

use crate::maps::{emit, header, traced_task};

#[uprobe]
pub fn call_args(ctx: ProbeContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    emit(
        EventKind::Call,
        CallEvent {
            header: header(EventKind::Call, task),
            args: [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
        },
    );
    0
}
