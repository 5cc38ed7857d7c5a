//! Page-cache tracepoints, for the model files only (their (dev, inode) set
//! comes from user space). Not filtered by process: prefetch and readahead
//! may fill pages from another task, and those reads still belong to the run.
//! BTF flavour (default) and perf-event flavour, as in `block`.

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{
    EventKind, FileKey, PageCacheEvent, PageCacheKind, split_pid_tgid,
    tracepoints::{filemap_add_to_page_cache as add, filemap_fault as fault},
};

use crate::{
    kernel::{layout, layout_valid, mapping_file, read},
    maps::{MODEL_FILES, emit, header},
};

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

/// `mm_filemap_add_to_page_cache(struct folio *folio)`: the folio's file
/// (`folio->mapping`), index and order (`folio_order`: the low byte of
/// `_flags_1` for a large folio, one with `PG_head` set, else 0).
#[btf_tracepoint(function = "mm_filemap_add_to_page_cache")]
pub fn page_cache_add_btf(ctx: BtfTracePointContext) -> u32 {
    if !layout_valid() {
        return 0;
    }
    let folio: u64 = ctx.arg(0);
    let Some(mapping) = read::<u64>(folio, layout!(folio_mapping)) else { return 0 };
    let Some(file) = mapping_file(mapping) else { return 0 };
    let (Some(index), Some(flags)) =
        (read::<u64>(folio, layout!(folio_index)), read::<u64>(folio, layout!(folio_flags)))
    else {
        return 0;
    };
    let large = (flags >> (layout!(pg_head) & 63)) & 1 != 0;
    let order = if large { read::<u64>(folio, layout!(folio_flags_1)).map_or(0, |f| (f & 0xff) as u32) } else { 0 };
    record(file, index, PageCacheKind::Add as u32, order);
    0
}

/// `mm_filemap_fault(struct address_space *mapping, pgoff_t index)`.
#[btf_tracepoint(function = "mm_filemap_fault")]
pub fn filemap_fault_btf(ctx: BtfTracePointContext) -> u32 {
    if !layout_valid() {
        return 0;
    }
    let mapping: u64 = ctx.arg(0);
    let index: u64 = ctx.arg(1);
    let Some(file) = mapping_file(mapping) else { return 0 };
    record(file, index, PageCacheKind::FilemapFault as u32, 0);
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
