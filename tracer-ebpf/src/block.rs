//! Block-request tracepoints on the devices holding the model files. Every
//! request on those devices is sent; user space keeps the ones whose sectors
//! fall in a model file's extents.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{
    BlockEvent, BlockKind, EventKind, split_pid_tgid,
    tracepoints::{block_rq_complete as complete, block_rq_issue as issue},
};

use crate::maps::{BLOCK_DEVICES, emit, header};

#[tracepoint]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from the tracepoint's format file (tracer-common).
    let Ok(dev) = (unsafe { ctx.read_at::<u32>(issue::DEV) }) else { return 0 };
    if BLOCK_DEVICES.get_ptr(dev).is_none() {
        return 0;
    }
    // SAFETY: as above.
    let (Ok(sector), Ok(nr_sector)) =
        (unsafe { (ctx.read_at::<u64>(issue::SECTOR), ctx.read_at::<u32>(issue::NR_SECTOR)) })
    else {
        return 0;
    };
    let mut event = BlockEvent {
        header: header(EventKind::Block, task()),
        dev,
        nr_sector,
        sector,
        kind: BlockKind::Issue as u32,
        ..Default::default()
    };
    // SAFETY: as above; rwbs is char[10], comm char[16].
    unsafe {
        if let Ok(rwbs) = ctx.read_at::<[u8; issue::RWBS_LEN]>(issue::RWBS) {
            event.rwbs[..issue::RWBS_LEN].copy_from_slice(&rwbs);
        }
        if let Ok(comm) = ctx.read_at::<[u8; 16]>(issue::COMM) {
            event.comm = comm;
        }
    }
    emit(EventKind::Block, event);
    0
}

#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from the tracepoint's format file (tracer-common).
    let Ok(dev) = (unsafe { ctx.read_at::<u32>(complete::DEV) }) else { return 0 };
    if BLOCK_DEVICES.get_ptr(dev).is_none() {
        return 0;
    }
    // SAFETY: as above.
    let fields = unsafe {
        (
            ctx.read_at::<u64>(complete::SECTOR),
            ctx.read_at::<u32>(complete::NR_SECTOR),
            ctx.read_at::<i32>(complete::ERROR),
        )
    };
    let (Ok(sector), Ok(nr_sector), Ok(error)) = fields else { return 0 };
    let mut event = BlockEvent {
        header: header(EventKind::Block, task()),
        dev,
        nr_sector,
        sector,
        kind: BlockKind::Complete as u32,
        error,
        ..Default::default()
    };
    // SAFETY: as above.
    if let Ok(rwbs) = unsafe { ctx.read_at::<[u8; issue::RWBS_LEN]>(complete::RWBS) } {
        event.rwbs[..issue::RWBS_LEN].copy_from_slice(&rwbs);
    }
    emit(EventKind::Block, event);
    0
}

/// Completions run in interrupt context: the task is whoever was running.
#[inline(always)]
fn task() -> (u32, u32) {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    split_pid_tgid(pid_tgid)
}
