//! `memory-map.json`: the model's GGUF tensor table as the thesis UI's
//! heatmap reads it (`MemoryMap` in its `data.ts`), one entry per tensor and
//! per expert slice: an MoE expert tensor is listed as its experts,
//! `blk.0.ffn_down_exps.weight[3]` with `expert_id` 3, so the heatmap can
//! colour the slices the routing picked (its trace entries carry
//! `expert_ids`). The whole expert tensor is not listed beside them: the
//! heatmap draws every entry at its offsets and would cover the slices.

use std::{borrow::Cow, path::Path};

use serde::Serialize;

use super::{
    FORMAT_VERSION,
    category::{Category, component_type, role},
};
use crate::{
    format::{ModelTable, ModelTensor},
    model::{Component, classify::classify},
};

#[derive(Serialize)]
pub struct MemoryMap<'a> {
    pub model_name: String,
    /// The end of the furthest tensor: the span the heatmap draws.
    pub total_size_bytes: u64,
    pub metadata: Metadata,
    pub tensors: Vec<MemoryTensor<'a>>,
    // ttrace's own.
    pub format_version: &'static str,
    pub model: Option<&'a str>,
    pub files: &'a [String],
    pub architecture: Option<&'a str>,
    pub total_tensors: usize,
}

#[derive(Serialize)]
pub struct Metadata {
    pub n_layers: u32,
    pub n_vocab: u64,
    pub n_embd: u64,
    pub n_tensors: usize,
}

#[derive(Serialize)]
pub struct MemoryTensor<'a> {
    pub name: Cow<'a, str>,
    pub offset_start: u64,
    pub offset_end: u64,
    pub size_bytes: u64,
    pub shape: &'a [u64],
    pub dtype: String,
    pub category: Category,
    pub layer_id: Option<u32>,
    pub component: &'static str,
    pub component_type: String,
    // ttrace's own: the GGUF base name (`attn_q`) and the shard holding it.
    pub gguf_component: &'a str,
    pub file: Option<&'a str>,
    #[serde(flatten)]
    pub expert: Option<ExpertSlice<'a>>,
}

/// One expert's slice of an expert tensor.
#[derive(Serialize)]
pub struct ExpertSlice<'a> {
    pub expert_id: u32,
    pub n_experts: u32,
    /// The GGUF tensor it is a slice of.
    pub expert_of: &'a str,
}

pub fn build(model: &ModelTable) -> MemoryMap<'_> {
    let tensors: Vec<MemoryTensor> = model.tensors.iter().flat_map(|t| entries(model, t)).collect();
    let total_size_bytes = tensors.iter().map(|t| t.offset_end).max().unwrap_or(0);
    MemoryMap {
        model_name: model_name(model),
        total_size_bytes,
        metadata: metadata(model, tensors.len()),
        format_version: FORMAT_VERSION,
        model: model.files.first().map(String::as_str),
        files: &model.files,
        architecture: model.architecture.as_deref(),
        total_tensors: tensors.len(),
        tensors,
    }
}

/// A tensor's entries: itself, or one per expert when it splits evenly.
fn entries<'a>(model: &'a ModelTable, t: &'a ModelTensor) -> Vec<MemoryTensor<'a>> {
    let component = classify(&t.name).component;
    let entry =
        |name: Cow<'a, str>, offset: u64, size: u64, shape: &'a [u64], expert: Option<ExpertSlice<'a>>| MemoryTensor {
            name,
            offset_start: offset,
            offset_end: offset + size,
            size_bytes: size,
            shape,
            dtype: t.type_name.to_ascii_lowercase(),
            category: Category::of_weight(&t.name),
            layer_id: t.layer,
            component: role(component),
            component_type: component_type(component, expert.as_ref().map(|e| e.expert_id)),
            gguf_component: &t.component,
            file: model.files.get(t.file as usize).map(String::as_str),
            expert,
        };
    match experts(t) {
        Some((n, slice)) => (0..n)
            .map(|e| {
                let expert = ExpertSlice { expert_id: e, n_experts: n, expert_of: &t.name };
                let offset = t.file_offset + u64::from(e) * slice;
                // One expert is the tensor without its last (expert) dimension.
                entry(format!("{}[{e}]", t.name).into(), offset, slice, &t.shape[..t.shape.len() - 1], Some(expert))
            })
            .collect(),
        None => vec![entry(Cow::Borrowed(&t.name), t.file_offset, t.size_bytes, &t.shape, None)],
    }
}

/// `(experts, bytes each)` of an expert tensor whose slices tile it exactly.
fn experts(t: &ModelTensor) -> Option<(u32, u64)> {
    let slice = t.expert_bytes.filter(|&b| b > 0)?;
    let n = u32::try_from(*t.shape.last()?).ok().filter(|&n| n > 0)?;
    (u64::from(n) * slice == t.size_bytes && t.shape.len() >= 2).then_some((n, slice))
}

/// The first file's name without `.gguf`: the trace keeps no `general.name`.
fn model_name(model: &ModelTable) -> String {
    let first = model.files.first().map(Path::new);
    first.and_then(|p| p.file_stem()).map_or_else(String::new, |s| s.to_string_lossy().into_owned())
}

/// The trace keeps the tensor table, not the GGUF metadata: the sizes come
/// from it. `token_embd` is `[n_embd, n_vocab]` (ggml order); the layers are
/// the `blk.N` numbers. 0 where the table has no such tensor.
fn metadata(model: &ModelTable, n_tensors: usize) -> Metadata {
    let embd = model.tensors.iter().find(|t| classify(&t.name).component == Component::TokenEmbd);
    let dim = |i: usize| embd.and_then(|t| t.shape.get(i)).copied().unwrap_or(0);
    Metadata {
        n_layers: model.tensors.iter().filter_map(|t| t.layer).max().map_or(0, |l| l + 1),
        n_vocab: dim(1),
        n_embd: dim(0),
        n_tensors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::classify::expert_layout;

    fn tensor(name: &str, file_offset: u64, size_bytes: u64, shape: &[u64]) -> ModelTensor {
        let c = classify(name);
        ModelTensor {
            name: name.into(),
            file: 0,
            file_offset,
            size_bytes,
            type_name: "Q8_0".into(),
            shape: shape.to_vec(),
            layer: c.layer,
            component: c.component.as_str().into(),
            expert_bytes: expert_layout(c.component, shape, size_bytes).map(|e| e.1),
        }
    }

    #[test]
    fn experts_are_listed_one_slice_each() {
        let model = ModelTable {
            files: vec!["/m/tiny-moe.gguf".into()],
            file_info: Vec::new(),
            architecture: Some("llama".into()),
            tensors: vec![
                tensor("token_embd.weight", 1000, 64 * 100, &[64, 100]),
                tensor("blk.0.attn_q.weight", 7400, 64 * 64, &[64, 64]),
                tensor("blk.1.ffn_down_exps.weight", 11496, 4 * 64 * 32, &[32, 64, 4]),
                tensor("blk.1.ffn_gate_exps.bias", 19688, 4 * 32, &[32, 4]),
            ],
        };
        let map = build(&model);
        assert_eq!(map.model_name, "tiny-moe");
        assert_eq!((map.metadata.n_layers, map.metadata.n_vocab, map.metadata.n_embd), (2, 100, 64));
        let names: Vec<&str> = map.tensors.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.0.attn_q.weight",
                "blk.1.ffn_down_exps.weight[0]",
                "blk.1.ffn_down_exps.weight[1]",
                "blk.1.ffn_down_exps.weight[2]",
                "blk.1.ffn_down_exps.weight[3]",
                // A bias has no expert dimension of its own to split on.
                "blk.1.ffn_gate_exps.bias",
            ]
        );
        let e3 = &map.tensors[5];
        assert_eq!((e3.offset_start, e3.size_bytes, e3.offset_end), (11496 + 3 * 2048, 2048, 11496 + 4 * 2048));
        assert_eq!((e3.shape, e3.layer_id, e3.component, e3.category), (&[32, 64][..], Some(1), "down", Category::Ffn));
        assert_eq!(e3.component_type, "FFN Down Expert 3");
        let json = serde_json::to_value(e3).unwrap();
        assert_eq!((json["expert_id"].as_u64(), json["n_experts"].as_u64()), (Some(3), Some(4)));
        assert_eq!(json["expert_of"], "blk.1.ffn_down_exps.weight");
        assert_eq!(json["dtype"], "q8_0");
        assert!(serde_json::to_value(&map.tensors[0]).unwrap().get("expert_id").is_none());
        assert_eq!(map.total_size_bytes, 19688 + 128);
        assert_eq!(map.total_tensors, 7);
    }
}
