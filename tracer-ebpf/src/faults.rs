//! `exceptions:page_fault_user`: every user-space fault of a traced process.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use aya_log_ebpf::warn;
use tracer_common::{EventKind, PageFaultEvent, tracepoints::page_fault_user as tp};

use crate::maps::{emit, header, traced_task};

#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    // SAFETY: offsets come from the tracepoint's format file (tracer-common).
    let fields =
        unsafe { (ctx.read_at::<u64>(tp::ADDRESS), ctx.read_at::<u64>(tp::IP), ctx.read_at::<u64>(tp::ERROR_CODE)) };
    let (Ok(address), Ok(ip), Ok(error_code)) = fields else {
        warn!(&ctx, "page_fault_user: tracepoint record read failed");
        return 0;
    };
    emit(EventKind::PageFault, PageFaultEvent { header: header(EventKind::PageFault, task), address, ip, error_code });
    0
}
