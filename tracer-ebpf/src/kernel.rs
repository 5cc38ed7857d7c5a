//! Reading kernel structs in the BTF-tracepoint programs, at the offsets
//! user space resolved from the running kernel's BTF (see
//! `tracer_common::kernel`).

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{EbpfContext, helpers::generated::bpf_probe_read_kernel, programs::TracePointContext};
use tracer_common::{
    FileKey,
    kernel::KernelLayout,
    tracepoints::{MAX_RWBS, NO_FIELD, PerfLayout},
};

/// Filled in by user space before load (`EbpfLoader::set_global`); all
/// zero, hence `valid == 0`, in the object file.
#[unsafe(no_mangle)]
pub(crate) static KERNEL_LAYOUT: KernelLayout = unsafe { core::mem::zeroed() };

/// One field of [`KERNEL_LAYOUT`]. A volatile read, or the compiler would
/// fold the object file's zeros in.
macro_rules! layout {
    ($field:ident) => {
        // SAFETY: a plain read of a global the loader patched.
        unsafe { core::ptr::read_volatile(&$crate::kernel::KERNEL_LAYOUT.$field) }
    };
}
pub(crate) use layout;

/// One field of [`PERF_LAYOUT`], volatile for the same reason.
macro_rules! perf {
    ($field:ident) => {
        // SAFETY: a plain read of a global the loader may patch.
        unsafe { core::ptr::read_volatile(&$crate::kernel::PERF_LAYOUT.$field) }
    };
}
pub(crate) use perf;

/// Where the perf-event programs find their fields: kernel 6.18's records
/// in the object file, the running kernel's once user space writes them
/// (`EbpfLoader::override_global`, from tracefs's format files).
#[unsafe(no_mangle)]
pub(crate) static PERF_LAYOUT: PerfLayout = PerfLayout::DEFAULT;

/// The `T` at field `offset` (a [`PERF_LAYOUT`] value) of a perf-event
/// tracepoint's record; `T::default()` for a field the record lacks.
#[inline(always)]
pub fn field<T: Default>(ctx: &TracePointContext, offset: u32) -> Result<T, i32> {
    if offset == NO_FIELD {
        return Ok(T::default());
    }
    // SAFETY: a helper read of the record, which checks the address.
    unsafe { ctx.read_at::<T>(offset as usize) }
}

/// The `rwbs` array of a block tracepoint's record at `offset`: its
/// length differs between kernels (`PerfLayout::rwbs_len`).
#[inline(always)]
pub fn rwbs(ctx: &TracePointContext, offset: u32) -> [u8; MAX_RWBS as usize] {
    let mut out = [0u8; MAX_RWBS as usize];
    let len = perf!(rwbs_len);
    if len <= MAX_RWBS {
        // SAFETY: `len` bytes fit `out`; the helper checks the source.
        unsafe {
            bpf_probe_read_kernel(
                out.as_mut_ptr().cast::<c_void>(),
                len,
                ctx.as_ptr().cast::<u8>().add(offset as usize).cast(),
            )
        };
    }
    out
}

/// Whether user space resolved the layout (it always does before attaching).
#[inline(always)]
pub fn layout_valid() -> bool {
    layout!(valid) != 0
}

/// A `T` at `base + offset` in kernel memory; `None` for a null base or a
/// failed read.
#[inline(always)]
pub fn read<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    let mut value = MaybeUninit::<T>::uninit();
    // SAFETY: the helper writes at most size_of::<T>() bytes into `value`.
    let ret = unsafe {
        bpf_probe_read_kernel(
            value.as_mut_ptr().cast::<c_void>(),
            size_of::<T>() as u32,
            (base + u64::from(offset)) as *const c_void,
        )
    };
    // SAFETY: a zero return means all bytes were written.
    if ret == 0 { Some(unsafe { value.assume_init() }) } else { None }
}

/// The file an `address_space` caches, as the filemap tracepoints name it:
/// `host->i_sb->s_dev` (or `host->i_rdev` without a superblock) and
/// `host->i_ino`.
#[inline(always)]
pub fn mapping_file(mapping: u64) -> Option<FileKey> {
    let host: u64 = read(mapping, layout!(mapping_host))?;
    let ino: u64 = read(host, layout!(inode_ino))?;
    let sb: u64 = read(host, layout!(inode_sb))?;
    let dev: u32 = if sb != 0 { read(sb, layout!(sb_dev))? } else { read(host, layout!(inode_rdev))? };
    Some(FileKey { dev, _pad: 0, ino })
}
