//! ggml struct layouts on x86_64, as read by the uprobes.
//!
//! Valid for ggml from Nov 2024 (when `ggml_tensor.grad` was removed, which
//! moved `src` from 160 to 152) through at least llama.cpp 0c1e570 (Oct 2026,
//! ggml 0.25.x). Older ggml needs another layout; the const asserts below pin
//! every offset the probes rely on.

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

/// Mirror of `struct ggml_tensor` (336 bytes).
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

/// `struct ggml_cgraph` fields the graph probe reads (x86_64; `uid` since
/// Aug 2025): `int size, n_nodes, n_leafs; ggml_tensor **nodes, **grads,
/// **grad_accs, **leafs; int32_t *use_counts; ggml_hash_set visited_hash_set;
/// enum order; uint64_t uid`. The scheduler gives every split a fresh `uid`
/// when it (re)builds it, so an unchanged `uid` means an unchanged graph.
pub const CGRAPH_N_NODES: usize = 4;
pub const CGRAPH_NODES: usize = 16;
pub const CGRAPH_UID: usize = 88;
/// `GGML_TENSOR_FLAG_INPUT`: set by `ggml_set_input` (token ids, positions, …).
pub const FLAG_INPUT: i32 = 1;

/// `struct ggml_compute_params` prefix: `int ith, nth`.
pub const PARAMS_ITH: usize = 0;
pub const PARAMS_NTH: usize = 4;

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
