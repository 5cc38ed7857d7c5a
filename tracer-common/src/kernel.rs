//! Kernel struct layout for the BTF-tracepoint (`tp_btf`) flavour of the
//! I/O programs. Those programs get the tracepoint's raw arguments (a
//! `struct request *`, a `struct folio *`, …), not the formatted record, so
//! they read kernel structs. The offsets below are resolved by user space
//! from the running kernel's `/sys/kernel/btf/vmlinux` at load time and
//! written into the object's read-only global [`KERNEL_LAYOUT`] before the
//! verifier sees it: nothing is hard-coded for one kernel.

/// Name of the global the programs read the layout from.
pub const KERNEL_LAYOUT: &str = "KERNEL_LAYOUT";

/// Byte offsets of the fields the tracepoints' own `TP_fast_assign` reads,
/// and the enum values they test (`enum req_op`, `enum req_flag_bits`,
/// `enum pageflags`). `valid` is 0 until user space fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    pub valid: u32,
    /// `struct request`: `q`, `cmd_flags`, `__data_len`, `__sector`.
    pub request_q: u32,
    pub request_cmd_flags: u32,
    pub request_data_len: u32,
    pub request_sector: u32,
    /// `struct request_queue.disk`; `struct gendisk.major`, `.first_minor`.
    pub queue_disk: u32,
    pub gendisk_major: u32,
    pub gendisk_first_minor: u32,
    /// `struct folio`: `flags`; the byte holding a large folio's order
    /// (`_folio_order` where the kernel has it, as 6.1 does, else the low
    /// byte of `_flags_1`); `mapping`, `index`.
    pub folio_flags: u32,
    pub folio_order: u32,
    pub folio_mapping: u32,
    pub folio_index: u32,
    /// `PG_head`: a large folio's bit in `flags`.
    pub pg_head: u32,
    /// `struct address_space.host`; `struct inode`: `i_ino`, `i_sb`,
    /// `i_rdev`; `struct super_block.s_dev`.
    pub mapping_host: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub inode_rdev: u32,
    pub sb_dev: u32,
    /// `struct pt_regs.ip` (the faulting instruction).
    pub regs_ip: u32,
    /// `REQ_OP_BITS`: `cmd_flags & ((1 << op_bits) - 1)` is the `req_op`.
    pub req_op_bits: u32,
    /// `enum req_op` values `blk_fill_rwbs` tells apart.
    pub op_read: u32,
    pub op_write: u32,
    pub op_flush: u32,
    pub op_discard: u32,
    pub op_secure_erase: u32,
    /// Passthrough requests (`REQ_OP_DRV_IN`/`_OUT`) report sector 0.
    pub op_drv_in: u32,
    pub op_drv_out: u32,
    /// Bit numbers (`__REQ_*`) of the flags `blk_fill_rwbs` prints; 32 or
    /// more for one this kernel lacks (`__REQ_ATOMIC` is recent).
    pub flag_preflush: u32,
    pub flag_fua: u32,
    pub flag_rahead: u32,
    pub flag_sync: u32,
    pub flag_meta: u32,
    pub flag_atomic: u32,
    /// For the `filemap_fault()` fentry program, where the kernel lacks the
    /// `filemap:mm_filemap_fault` tracepoint (before 6.12): `struct
    /// vm_fault`'s `vma` and `pgoff`, `struct vm_area_struct.vm_file`,
    /// `struct file.f_mapping`. [`NO_FIELD`] where not resolved.
    pub vmf_vma: u32,
    pub vmf_pgoff: u32,
    pub vma_file: u32,
    pub file_mapping: u32,
}

/// A [`KernelLayout`] field this kernel's BTF does not have.
pub const NO_FIELD: u32 = u32::MAX;

impl KernelLayout {
    /// Whether the `filemap_fault()` fentry program has every field it reads.
    pub fn has_fault_fields(&self) -> bool {
        [self.vmf_vma, self.vmf_pgoff, self.vma_file, self.file_mapping].iter().all(|&f| f != NO_FIELD)
    }
}

/// The completion's `error` in the BTF flavour: 0, or `-EIO` for any
/// failed `blk_status_t`. The tracepoint's own record holds the errno from
/// `blk_status_to_errno`, but that table is data (not in BTF) and the status
/// numbering has changed between kernel versions.
#[inline(always)]
pub fn blk_status_errno(status: u8) -> i32 {
    const EIO: i32 = 5;
    if status == 0 { 0 } else { -EIO }
}

#[cfg(feature = "user")]
// SAFETY: plain `u32` fields, no padding.
unsafe impl aya::Pod for KernelLayout {}

const _: () = assert!(size_of::<KernelLayout>() == 37 * 4);
