//! Reading kernel structs in the BTF-tracepoint programs, at the offsets
//! user space resolved from the running kernel's BTF (see
//! `tracer_common::kernel`).

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::helpers::generated::bpf_probe_read_kernel;
use tracer_common::{FileKey, kernel::KernelLayout};

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
