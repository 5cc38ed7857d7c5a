//! ggml's constants, and [`GgmlTensor`]: the form every tensor is decoded
//! into, whatever layout the target's `ggml_tensor` has (x86_64). Where the
//! probes find each field in the target is data: see [`crate::layout`].

/// `GGML_MAX_SRC`.
pub const MAX_SRC: usize = 10;
/// ggml's name of the row-gather op (`ggml_op_name(GGML_OP_GET_ROWS)`). Op
/// enum values move between ggml versions, so ops are found by name in the
/// target's own table.
pub const OP_GET_ROWS: &str = "GET_ROWS";
/// The MoE expert matmul: `MUL_MAT_ID(experts, input, ids)`.
pub const OP_MUL_MAT_ID: &str = "MUL_MAT_ID";
/// `GGML_MAX_NAME`.
pub const MAX_NAME: usize = 64;
/// `GGML_MAX_OP_PARAMS / sizeof(int32_t)`.
pub const MAX_OP_PARAMS: usize = 16;
/// `GGML_TYPE_I32`: token ids and MoE routing ids.
pub const TYPE_I32: i32 = 26;

/// Mirror of `struct ggml_tensor` as declared since Dec 2024 (336 bytes;
/// the table `layout::known::TENSOR_2024_12` is derived from it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlTensor {
    pub type_: i32,
    pub _pad0: u32,
    pub buffer: u64,
    pub ne: [i64; 4],
    pub nb: [u64; 4],
    pub op: i32,
    pub op_params: [i32; MAX_OP_PARAMS],
    pub flags: i32,
    pub src: [u64; MAX_SRC],
    pub view_src: u64,
    pub view_offs: u64,
    pub data: u64,
    pub name: [u8; MAX_NAME],
    pub extra: u64,
    pub padding: [u8; 8],
}

/// `GGML_TENSOR_FLAG_INPUT`: set by `ggml_set_input` (token ids, positions, …).
pub const FLAG_INPUT: i32 = 1;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<GgmlTensor>() == 336);
    assert!(offset_of!(GgmlTensor, buffer) == 8);
    assert!(offset_of!(GgmlTensor, ne) == 16);
    assert!(offset_of!(GgmlTensor, nb) == 48);
    assert!(offset_of!(GgmlTensor, op) == 80);
    assert!(offset_of!(GgmlTensor, op_params) == 84);
    assert!(offset_of!(GgmlTensor, flags) == 148);
    assert!(offset_of!(GgmlTensor, src) == 152);
    assert!(offset_of!(GgmlTensor, view_src) == 232);
    assert!(offset_of!(GgmlTensor, view_offs) == 240);
    assert!(offset_of!(GgmlTensor, data) == 248);
    assert!(offset_of!(GgmlTensor, name) == 256);
    assert!(offset_of!(GgmlTensor, extra) == 320);
};
