//! The ggml and llama struct layout the uprobes read at (see
//! `tracer_common::layout`), and reading fields out of a copy of a struct
//! at those offsets.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_common::layout::{GgmlLayout, TENSOR_OFFSET_MASK, TENSOR_SCRATCH_BYTES};

/// One tensor copied from the target: too big for the 512-byte BPF stack.
#[map]
pub(crate) static TENSOR_SCRATCH: PerCpuArray<RawTensor> = PerCpuArray::with_max_entries(1, 0);

/// Written by user space before any program that reads it is attached
/// (`valid` is 0 in the object file); in a section of its own, so it is a
/// map holding exactly this value.
#[unsafe(link_section = ".data.ggml")]
#[unsafe(no_mangle)]
pub(crate) static mut GGML_LAYOUT: GgmlLayout = GgmlLayout::UNSET;

/// One field of [`GGML_LAYOUT`], e.g. `ggml!(tensor.name)`. A volatile read:
/// user space changes the value after the object is built.
macro_rules! ggml {
    ($($field:ident).+) => {
        // SAFETY: a plain read of a global only user space writes.
        unsafe { core::ptr::read_volatile(&raw const $crate::layout::GGML_LAYOUT.$($field).+) }
    };
}
pub(crate) use ggml;

/// Whether user space has written the layout.
#[inline(always)]
pub fn valid() -> bool {
    ggml!(valid) != 0
}

/// A `ggml_tensor` as copied from the target, read at the layout's offsets.
#[repr(C, align(8))]
pub struct RawTensor(pub [u8; TENSOR_SCRATCH_BYTES]);

impl RawTensor {
    /// The `T` at `offset`. The mask keeps every read inside the buffer for
    /// the verifier, branch-free; user space checks that the layout's
    /// offsets pass through it unchanged (`GgmlLayout::check`). `T` is
    /// 8-byte aligned at most and its offsets are aligned for it, so the
    /// read is an aligned load.
    #[inline(always)]
    pub fn at<T: Copy>(&self, offset: u32) -> T {
        let at = (offset & TENSOR_OFFSET_MASK & !(align_of::<T>() as u32 - 1)) as usize;
        // SAFETY: `at + size_of::<T>()` is within the buffer (checked by
        // tracer-common's const asserts for every `T` read here), and
        // aligned for `T` in an 8-aligned buffer.
        unsafe { self.0.as_ptr().add(at).cast::<T>().read() }
    }

    pub fn i32(&self, offset: u32) -> i32 {
        self.at::<i32>(offset)
    }

    pub fn u64(&self, offset: u32) -> u64 {
        self.at::<u64>(offset)
    }

    pub fn ne(&self) -> [i64; 4] {
        self.at(ggml!(tensor.ne))
    }

    pub fn nb(&self) -> [u64; 4] {
        self.at(ggml!(tensor.nb))
    }

    pub fn type_(&self) -> i32 {
        self.i32(ggml!(tensor.type_))
    }

    pub fn op(&self) -> i32 {
        self.i32(ggml!(tensor.op))
    }

    pub fn flags(&self) -> i32 {
        self.i32(ggml!(tensor.flags))
    }

    pub fn data(&self) -> u64 {
        self.u64(ggml!(tensor.data))
    }

    /// `name[64]`, read as eight words (a byte array would be copied a
    /// byte at a time).
    pub fn name(&self) -> [u8; tracer_common::ggml::MAX_NAME] {
        let words: [u64; 8] = self.at(ggml!(tensor.name));
        // SAFETY: same size, both plain bytes.
        unsafe { core::mem::transmute(words) }
    }
}

/// Bytes of the target's `ggml_tensor` (its layout's size, masked so the
/// verifier sees a bound).
#[inline(always)]
pub fn tensor_size() -> u32 {
    ggml!(tensor.size) & TENSOR_OFFSET_MASK
}
