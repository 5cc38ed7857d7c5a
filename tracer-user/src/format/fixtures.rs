//! Test fixtures shared by the analysis and export tests: one model file
//! holding one tensor, placed on a block device, and block requests on it.

use tracer_common::BlockKind;

use super::{FileExtent, FileInfo, ModelTable, ModelTensor, reader::Block};

/// The fixture model's device (kernel `dev_t` encoding) and where its file starts on it.
pub const DEV: u32 = 7;
pub const DISK_AT: u64 = 1 << 20;

/// `m.gguf`: one 1 MiB F32 tensor `w` of layer 0, the file contiguous at [`DISK_AT`].
pub fn one_tensor_model() -> ModelTable {
    let info = FileInfo {
        disk_dev: Some(DEV),
        extents: vec![FileExtent { logical: 0, physical: DISK_AT, length: 1 << 20 }],
        ..Default::default()
    };
    let tensor = ModelTensor {
        name: "w".into(),
        file: 0,
        file_offset: 0,
        size_bytes: 1 << 20,
        type_name: "F32".into(),
        shape: vec![1 << 18],
        layer: Some(0),
        component: "ffn_up".into(),
        expert_bytes: None,
    };
    ModelTable { files: vec!["m.gguf".into()], file_info: vec![info], tensors: vec![tensor], ..Default::default() }
}

/// A 4 KiB read of the fixture file at `file_offset`, by thread `tid`.
pub fn block(kind: BlockKind, tid: u32, file_offset: u64, ts_ns: u64) -> Block {
    Block {
        ts_ns,
        tid,
        tgid: 1,
        cpu: 0,
        kind,
        dev: DEV,
        sector: (DISK_AT + file_offset) / 512,
        nr_sector: 8,
        error: 0,
        rwbs: "RA".into(),
        comm: "t".into(),
    }
}
