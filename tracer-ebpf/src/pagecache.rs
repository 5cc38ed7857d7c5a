//! Page-cache tracepoints, for the model files only (their (dev, inode) set
//! comes from user space). Not filtered by process: prefetch and readahead
//! may fill pages from another task, and those reads still belong to the run.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{
    EventKind, FileKey, PageCacheEvent, PageCacheKind, split_pid_tgid,
    tracepoints::{filemap_add_to_page_cache as add, filemap_fault as fault},
};

use crate::maps::{MODEL_FILES, emit, header};

#[tracepoint]
pub fn page_cache_add(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from the tracepoint's format file (tracer-common).
    let fields = unsafe {
        (
            ctx.read_at::<u64>(add::I_INO),
            ctx.read_at::<u32>(add::S_DEV),
            ctx.read_at::<u64>(add::INDEX),
            ctx.read_at::<u8>(add::ORDER),
        )
    };
    let (Ok(ino), Ok(dev), Ok(index), Ok(order)) = fields else { return 0 };
    record(FileKey { dev, _pad: 0, ino }, index, PageCacheKind::Add as u32, u32::from(order));
    0
}

#[tracepoint]
pub fn filemap_fault(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from the tracepoint's format file (tracer-common).
    let fields = unsafe {
        (ctx.read_at::<u64>(fault::I_INO), ctx.read_at::<u32>(fault::S_DEV), ctx.read_at::<u64>(fault::INDEX))
    };
    let (Ok(ino), Ok(dev), Ok(index)) = fields else { return 0 };
    record(FileKey { dev, _pad: 0, ino }, index, PageCacheKind::FilemapFault as u32, 0);
    0
}

#[inline(always)]
fn record(file: FileKey, index: u64, kind: u32, order: u32) {
    if MODEL_FILES.get_ptr(file).is_none() {
        return;
    }
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    let task = split_pid_tgid(pid_tgid);
    emit(EventKind::PageCache, PageCacheEvent { header: header(EventKind::PageCache, task), file, index, kind, order });
}
