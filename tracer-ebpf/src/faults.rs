//! `exceptions:page_fault_user`: every user-space fault of a traced process,
//! as a BTF tracepoint (default) or a perf-event one.

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use tracer_common::{EventKind, PageFaultEvent};

use crate::{
    kernel::{field, layout, layout_valid, perf, read},
    maps::{emit, header, traced_task},
};

#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    // Offsets from the running kernel's format file (`PERF_LAYOUT`).
    let fields = (
        field::<u64>(&ctx, perf!(fault_address)),
        field::<u64>(&ctx, perf!(fault_ip)),
        field::<u64>(&ctx, perf!(fault_error_code)),
    );
    let (Ok(address), Ok(ip), Ok(error_code)) = fields else {
        warn!(&ctx, "page_fault_user: tracepoint record read failed");
        return 0;
    };
    emit(EventKind::PageFault, PageFaultEvent { header: header(EventKind::PageFault, task), address, ip, error_code });
    0
}

/// `page_fault_user(unsigned long address, struct pt_regs *regs, unsigned
/// long error_code)`: ip is `regs->ip`.
#[btf_tracepoint(function = "page_fault_user")]
pub fn page_fault_user_btf(ctx: BtfTracePointContext) -> u32 {
    let Some(task) = traced_task() else { return 0 };
    if !layout_valid() {
        return 0;
    }
    let address: u64 = ctx.arg(0);
    let regs: u64 = ctx.arg(1);
    let error_code: u64 = ctx.arg(2);
    let ip = read::<u64>(regs, layout!(regs_ip)).unwrap_or(0);
    emit(EventKind::PageFault, PageFaultEvent { header: header(EventKind::PageFault, task), address, ip, error_code });
    0
}
