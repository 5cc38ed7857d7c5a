//! Page-cache tracepoints, for the model files only (their (dev, inode) set
//! comes from user space). Not filtered by process: prefetch and readahead
//! may fill pages from another task, and those reads still belong to the run.
//! BTF flavour (default) and perf-event flavour, as in `block`; an fentry
//! program stands in for the fault tracepoint where the kernel lacks it.

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, tracepoint},
    programs::{BtfTracePointContext, FEntryContext, TracePointContext},
};
use tracer_common::{EventKind, FileKey, PageCacheEvent, PageCacheKind, split_pid_tgid};

use crate::{
    kernel::{field, layout, layout_valid, mapping_file, perf, read},
    maps::{MODEL_FILES, emit, header},
};

#[tracepoint]
pub fn page_cache_add(ctx: TracePointContext) -> u32 {
    // Offsets from the running kernel's format file (`PERF_LAYOUT`).
    let fields = (
        field::<u64>(&ctx, perf!(add_ino)),
        field::<u32>(&ctx, perf!(add_dev)),
        field::<u64>(&ctx, perf!(add_index)),
        field::<u8>(&ctx, perf!(add_order)),
    );
    let (Ok(ino), Ok(dev), Ok(index), Ok(order)) = fields else { return 0 };
    record(FileKey { dev, _pad: 0, ino }, index, PageCacheKind::Add as u32, u32::from(order));
    0
}

#[tracepoint]
pub fn filemap_fault(ctx: TracePointContext) -> u32 {
    // Offsets from the running kernel's format file (`PERF_LAYOUT`).
    let fields = (
        field::<u64>(&ctx, perf!(filemap_fault_ino)),
        field::<u32>(&ctx, perf!(filemap_fault_dev)),
        field::<u64>(&ctx, perf!(filemap_fault_index)),
    );
    let (Ok(ino), Ok(dev), Ok(index)) = fields else { return 0 };
    record(FileKey { dev, _pad: 0, ino }, index, PageCacheKind::FilemapFault as u32, 0);
    0
}

/// `mm_filemap_add_to_page_cache(struct folio *folio)`: the folio's file
/// (`folio->mapping`), index and order (`folio_order`: for a large folio,
/// one with `PG_head` set, the byte `KernelLayout::folio_order` names;
/// else 0).
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
    let order = if large { read::<u8>(folio, layout!(folio_order)).map_or(0, u32::from) } else { 0 };
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

/// `filemap_fault(struct vm_fault *vmf)` entry, where a kernel without the
/// `mm_filemap_fault` tracepoint (before 6.12) has nothing to attach to: the
/// tracepoint fires first thing there, with `vmf->vma->vm_file->f_mapping`
/// and `vmf->pgoff`, which this reads. Same record.
#[fentry(function = "filemap_fault")]
pub fn filemap_fault_fentry(ctx: FEntryContext) -> u32 {
    if !layout_valid() {
        return 0;
    }
    let vmf: u64 = ctx.arg(0);
    let Some(vma) = read::<u64>(vmf, layout!(vmf_vma)) else { return 0 };
    let Some(file) = read::<u64>(vma, layout!(vma_file)) else { return 0 };
    let Some(mapping) = read::<u64>(file, layout!(file_mapping)) else { return 0 };
    let (Some(index), Some(key)) = (read::<u64>(vmf, layout!(vmf_pgoff)), mapping_file(mapping)) else { return 0 };
    record(key, index, PageCacheKind::FilemapFault as u32, 0);
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
