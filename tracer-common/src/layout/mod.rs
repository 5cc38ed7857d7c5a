//! Where the probes find the fields of ggml's and llama.cpp's structs, as
//! data. ttrace reads `ggml_tensor`, `ggml_cgraph`, `ggml_compute_params`
//! and llama.cpp's C++ `llama_ubatch` in the traced process, and their
//! offsets move between llama.cpp versions (an offset that moved reads
//! garbage, not an error). So no probe hard-codes one: user space picks the
//! build's tables from [`known`] by what the build says about itself,
//! writes them into the object's global [`GGML_LAYOUT`] before any ggml
//! program is attached, and checks them on the live target before the trace
//! keeps anything they produced.
//!
//! The global is an ordinary (writable) data section rather than `.rodata`
//! like the kernel layout: a program that loads ggml with `dlopen` (the
//! Python client) shows which ggml it runs only after the object is loaded,
//! and a frozen map cannot be written then. The programs never write it.

pub mod known;

use crate::ggml::{GgmlTensor, MAX_NAME, MAX_OP_PARAMS, MAX_SRC};

/// Name of the global the programs read the layout from.
pub const GGML_LAYOUT: &str = "GGML_LAYOUT";
/// The section (and so the map aya makes of it) that holds only [`GGML_LAYOUT`].
pub const GGML_LAYOUT_SECTION: &str = ".data.ggml";

/// An optional field the build does not have (`ggml_cgraph.uid` before ggml 0.10).
pub const ABSENT: u32 = u32::MAX;

/// Bytes of a `ggml_tensor` the probes copy at most: the largest known one.
pub const MAX_TENSOR_BYTES: usize = known::max_tensor_size();
/// The probes read a tensor into a scratch buffer of this size and mask
/// every field offset with [`TENSOR_OFFSET_MASK`], so the verifier sees each
/// read in bounds without a branch per field: an offset below 512 plus the
/// largest field read at once (the 80-byte `src` array) stays inside.
pub const TENSOR_SCRATCH_BYTES: usize = 1024;
pub const TENSOR_OFFSET_MASK: u32 = 0x1ff;
/// The same for the head of a `llama_ubatch`.
pub const UBATCH_HEAD_BYTES: usize = 128;
pub const UBATCH_OFFSET_MASK: u32 = 0x7f;

/// Byte offsets in `struct ggml_tensor`, and its size (read whole).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    pub size: u32,
    pub type_: u32,
    pub ne: u32,
    pub nb: u32,
    pub op: u32,
    pub op_params: u32,
    pub flags: u32,
    pub src: u32,
    pub view_src: u32,
    pub view_offs: u32,
    pub data: u32,
    pub name: u32,
    pub extra: u32,
}

/// Byte offsets in `struct ggml_cgraph`; `uid` may be [`ABSENT`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CgraphLayout {
    /// `sizeof(struct ggml_cgraph)`, for the record (the probe reads fields).
    pub bytes: u32,
    /// `int size`: capacity of `nodes`.
    pub size: u32,
    pub n_nodes: u32,
    pub nodes: u32,
    /// `uint64_t uid`: the scheduler gives a rebuilt split a fresh one.
    pub uid: u32,
}

/// Byte offsets of `int ith, nth` in `struct ggml_compute_params`. The
/// probes read the pair in one go: [`ParamsLayout::check`] holds them adjacent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ParamsLayout {
    pub ith: u32,
    pub nth: u32,
}

/// Byte offsets in the head of llama.cpp's `struct llama_ubatch`, up to its
/// `output` pointer; `size == 0` means the layout is unknown and the ubatch
/// probe records nothing (sequences off).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UbatchLayout {
    /// Bytes of the head read at once.
    pub size: u32,
    pub n_tokens: u32,
    pub token: u32,
    pub pos: u32,
    pub seq_id: u32,
    pub output: u32,
}

/// Byte offsets in `struct ggml_backend_buffer` (after its `iface` of
/// function pointers, which grew in 2026); all 0: unknown, and the buffer
/// probes record nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BufferLayout {
    pub buft: u32,
    pub context: u32,
    pub size: u32,
    pub usage: u32,
}

/// Everything the ggml and llama probes read, as one global. `valid` is 0
/// until user space writes it; the programs record nothing before.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GgmlLayout {
    pub valid: u32,
    pub tensor: TensorLayout,
    pub cgraph: CgraphLayout,
    pub params: ParamsLayout,
    pub ubatch: UbatchLayout,
    pub buffer: BufferLayout,
}

impl GgmlLayout {
    /// All zero, `valid == 0`: what the object file holds.
    pub const UNSET: Self = Self {
        valid: 0,
        tensor: TensorLayout {
            size: 0,
            type_: 0,
            ne: 0,
            nb: 0,
            op: 0,
            op_params: 0,
            flags: 0,
            src: 0,
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: 0,
            extra: 0,
        },
        cgraph: CgraphLayout { bytes: 0, size: 0, n_nodes: 0, nodes: 0, uid: 0 },
        params: ParamsLayout { ith: 0, nth: 0 },
        ubatch: UbatchLayout { size: 0, n_tokens: 0, token: 0, pos: 0, seq_id: 0, output: 0 },
        buffer: BufferLayout { buft: 0, context: 0, size: 0, usage: 0 },
    };

    /// Whether the probes can use it as it is: every offset inside its
    /// struct, aligned for its type and under the probes' masks.
    pub const fn check(&self) -> Result<(), LayoutError> {
        if let Err(e) = self.tensor.check() {
            return Err(e);
        }
        if let Err(e) = self.cgraph.check() {
            return Err(e);
        }
        if let Err(e) = self.params.check() {
            return Err(e);
        }
        if let Err(e) = self.buffer.check() {
            return Err(e);
        }
        self.ubatch.check()
    }
}

/// A layout the probes cannot use as it is (a table or a patch is wrong).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutError {
    pub structure: &'static str,
    pub field: &'static str,
    pub offset: u32,
    pub why: &'static str,
}

impl core::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{} at offset {}: {}", self.structure, self.field, self.offset, self.why)
    }
}

/// `offset .. offset + len` inside `size` bytes, `align`-aligned, and read
/// through a mask of `mask` without change.
const fn fits(
    structure: &'static str,
    field: &'static str,
    offset: u32,
    len: u32,
    align: u32,
    size: u32,
    mask: u32,
) -> Result<(), LayoutError> {
    let why = if !offset.is_multiple_of(align) {
        "not aligned for its type"
    } else if offset as u64 + len as u64 > size as u64 {
        "past the end of the struct"
    } else if offset & mask != offset {
        "beyond what the probes read"
    } else {
        return Ok(());
    };
    Err(LayoutError { structure, field, offset, why })
}

macro_rules! check_fields {
    ($structure:literal, $size:expr, $mask:expr, [$(($field:literal, $offset:expr, $len:expr, $align:expr)),* $(,)?]) => {{
        $(
            if let Err(e) = fits($structure, $field, $offset, $len, $align, $size, $mask) {
                return Err(e);
            }
        )*
        Ok(())
    }};
}

impl TensorLayout {
    pub const fn check(&self) -> Result<(), LayoutError> {
        if self.size == 0 || self.size as usize > MAX_TENSOR_BYTES {
            return Err(LayoutError {
                structure: "ggml_tensor",
                field: "(size)",
                offset: self.size,
                why: "larger than any known ggml_tensor",
            });
        }
        let src = (MAX_SRC * 8) as u32;
        let params = (MAX_OP_PARAMS * 4) as u32;
        check_fields!(
            "ggml_tensor",
            self.size,
            TENSOR_OFFSET_MASK,
            [
                ("type", self.type_, 4, 4),
                ("ne", self.ne, 32, 8),
                ("nb", self.nb, 32, 8),
                ("op", self.op, 4, 4),
                ("op_params", self.op_params, params, 4),
                ("flags", self.flags, 4, 4),
                ("src", self.src, src, 8),
                ("view_src", self.view_src, 8, 8),
                ("view_offs", self.view_offs, 8, 8),
                ("data", self.data, 8, 8),
                ("name", self.name, MAX_NAME as u32, 8),
                ("extra", self.extra, 8, 8),
            ]
        )
    }

    /// The tensor in `raw` (its bytes as the target holds them), in the
    /// form the rest of ttrace uses; `None` when `raw` is too short.
    pub fn decode(&self, raw: &[u8]) -> Option<GgmlTensor> {
        if raw.len() < self.size as usize || self.check().is_err() {
            return None;
        }
        let at = |offset: u32, i: usize, width: usize| {
            let start = offset as usize + i * width;
            &raw[start..start + width]
        };
        let i32_at = |offset, i| i32::from_le_bytes(at(offset, i, 4).try_into().unwrap_or_default());
        let u64_at = |offset, i| u64::from_le_bytes(at(offset, i, 8).try_into().unwrap_or_default());
        let mut name = [0u8; MAX_NAME];
        name.copy_from_slice(at(self.name, 0, MAX_NAME));
        Some(GgmlTensor {
            type_: i32_at(self.type_, 0),
            _pad0: 0,
            buffer: 0,
            ne: core::array::from_fn(|i| u64_at(self.ne, i) as i64),
            nb: core::array::from_fn(|i| u64_at(self.nb, i)),
            op: i32_at(self.op, 0),
            op_params: core::array::from_fn(|i| i32_at(self.op_params, i)),
            flags: i32_at(self.flags, 0),
            src: core::array::from_fn(|i| u64_at(self.src, i)),
            view_src: u64_at(self.view_src, 0),
            view_offs: u64_at(self.view_offs, 0),
            data: u64_at(self.data, 0),
            name,
            extra: u64_at(self.extra, 0),
            padding: [0; 8],
        })
    }
}

impl CgraphLayout {
    pub const fn check(&self) -> Result<(), LayoutError> {
        // Fields are read straight from the target: no mask applies.
        let r = check_fields!(
            "ggml_cgraph",
            self.bytes,
            u32::MAX,
            [("size", self.size, 4, 4), ("n_nodes", self.n_nodes, 4, 4), ("nodes", self.nodes, 8, 8),]
        );
        if r.is_err() || self.uid == ABSENT {
            return r;
        }
        fits("ggml_cgraph", "uid", self.uid, 8, 8, self.bytes, u32::MAX)
    }

    pub const fn has_uid(&self) -> bool {
        self.uid != ABSENT
    }
}

impl ParamsLayout {
    pub const fn check(&self) -> Result<(), LayoutError> {
        if !self.ith.is_multiple_of(4) || self.nth != self.ith + 4 {
            return Err(LayoutError {
                structure: "ggml_compute_params",
                field: "nth",
                offset: self.nth,
                why: "not right after ith (the probes read the pair at once)",
            });
        }
        Ok(())
    }
}

impl UbatchLayout {
    pub const fn check(&self) -> Result<(), LayoutError> {
        if self.size == 0 {
            return Ok(());
        }
        if self.size > UBATCH_OFFSET_MASK {
            return Err(LayoutError {
                structure: "llama_ubatch",
                field: "(head size)",
                offset: self.size,
                why: "beyond what the probes read",
            });
        }
        check_fields!(
            "llama_ubatch",
            self.size,
            UBATCH_OFFSET_MASK,
            [
                ("n_tokens", self.n_tokens, 4, 4),
                ("token", self.token, 8, 8),
                ("pos", self.pos, 8, 8),
                ("seq_id", self.seq_id, 8, 8),
                ("output", self.output, 8, 8),
            ]
        )
    }

    pub const fn known(&self) -> bool {
        self.size != 0
    }
}

impl BufferLayout {
    /// Fields are read straight from the target, each on its own: only
    /// alignment and a sane bound (the struct is 120 bytes today).
    pub const fn check(&self) -> Result<(), LayoutError> {
        if !self.known() {
            return Ok(());
        }
        check_fields!(
            "ggml_backend_buffer",
            BUFFER_MAX_BYTES,
            u32::MAX,
            [
                ("buft", self.buft, 8, 8),
                ("context", self.context, 8, 8),
                ("size", self.size, 8, 8),
                ("usage", self.usage, 4, 4),
            ]
        )
    }

    pub const fn known(&self) -> bool {
        self.usage != 0
    }
}

/// Upper bound of `sizeof(struct ggml_backend_buffer)` the checks accept.
pub const BUFFER_MAX_BYTES: u32 = 256;

#[cfg(feature = "user")]
// SAFETY: `u32` fields only, no padding.
unsafe impl aya::Pod for GgmlLayout {}

const _: () = {
    assert!(size_of::<GgmlLayout>() == 4 * (1 + 13 + 5 + 2 + 6 + 4));
    // A masked (aligned) offset plus the widest read at it stays in the
    // buffer, and so does the masked read size.
    assert!((TENSOR_OFFSET_MASK & !7) as usize + MAX_SRC * 8 <= TENSOR_SCRATCH_BYTES);
    assert!((TENSOR_OFFSET_MASK & !7) as usize + MAX_NAME <= TENSOR_SCRATCH_BYTES);
    assert!((UBATCH_OFFSET_MASK & !7) as usize + 8 <= UBATCH_HEAD_BYTES);
    assert!(UBATCH_OFFSET_MASK as usize <= UBATCH_HEAD_BYTES);
    assert!(MAX_TENSOR_BYTES <= TENSOR_OFFSET_MASK as usize);
};

#[cfg(test)]
mod tests {
    use super::{known::*, *};

    #[test]
    fn a_tensor_decodes_at_its_layouts_offsets() {
        // The Dec 2024 layout is GgmlTensor itself: decoding its bytes is the identity.
        // SAFETY: GgmlTensor holds only integers and byte arrays.
        let mut t: GgmlTensor = unsafe { core::mem::zeroed() };
        t.type_ = 12;
        t.ne = [256, 3, 1, 1];
        t.nb = [144, 144, 432, 432];
        t.op = 29;
        t.op_params[0] = 7;
        t.flags = 16;
        t.src[9] = 0xabc;
        t.data = 0x7f00;
        t.name[..4].copy_from_slice(b"blk.");
        t.extra = 0x55;
        // SAFETY: the bytes of a repr(C) POD value.
        let raw: [u8; 336] = unsafe { core::mem::transmute(t) };
        assert_eq!(TENSOR_2024_12.layout.decode(&raw), Some(t));
        assert_eq!(TENSOR_2024_12.layout.decode(&raw[..335]), None, "too short");
        // Read with the older layout, `src` starts 8 bytes on.
        let old = TENSOR_WITH_GRAD.layout.decode(&raw).unwrap();
        assert_eq!(old.src[8], 0xabc);
    }

    #[test]
    fn ggml_versions_parse() {
        assert_eq!(GgmlVersion::parse("0.25.3"), Some(GgmlVersion::new(0, 25, 3)));
        assert_eq!(GgmlVersion::parse(" 0.0.6123\n"), Some(GgmlVersion::new(0, 0, 6123)));
        for bad in ["", "0.25", "0.25.3.1", "v0.25.3", "0.x.1", "unknown"] {
            assert_eq!(GgmlVersion::parse(bad), None, "{bad}");
        }
        assert!(GgmlVersion::new(0, 9, 11) < GgmlVersion::new(0, 10, 0));
    }

    #[test]
    fn layout_checks_catch_unusable_tables() {
        let mut l = RELEASES[3].layout();
        assert_eq!(l.check(), Ok(()));
        l.tensor.name = 304;
        assert_eq!(l.check().unwrap_err().why, "past the end of the struct");
        let mut l = RELEASES[3].layout();
        l.params.nth = 8;
        assert_eq!(l.check().unwrap_err().structure, "ggml_compute_params");
        let mut l = RELEASES[3].layout();
        l.cgraph.uid = 92;
        assert_eq!(l.check().unwrap_err().why, "not aligned for its type");
    }
}
