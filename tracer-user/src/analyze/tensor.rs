//! What exports need to know about one tensor sighting: its bytes, its
//! layer, its memory class, and where a fault address falls in a model file.

use std::collections::BTreeMap;

use tracer_common::ggml::OP_GET_ROWS;

use crate::{
    format::{Descriptor, Memory, ModelTable, ModelTensor},
    model::ggml_types::GgmlType,
};

/// Bytes a tensor (or view) spans, as `ggml_nbytes` computes them; `None`
/// for a type whose block size is unknown.
pub fn view_bytes(d: &Descriptor) -> Option<u64> {
    let t = GgmlType::from_id(u32::try_from(d.type_id).ok()?)?;
    if d.ne.iter().any(|&n| n <= 0) {
        return Some(0);
    }
    let ne = d.ne.map(|n| n as u64);
    let block = u64::from(t.block);
    let mut n = if block == 1 {
        u64::from(t.block_bytes).checked_add((ne[0] - 1).checked_mul(d.nb[0])?)?
    } else {
        ne[0].checked_mul(d.nb[0])? / block
    };
    for (&n_i, &nb_i) in ne.iter().zip(&d.nb).skip(1) {
        n = n.checked_add((n_i - 1).checked_mul(nb_i)?)?;
    }
    Some(n)
}

/// A weight source: the model tensor it reads and whether through the file
/// mapping (`copy` false) or a heap copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightRef {
    pub model: u32,
    pub tensor: u32,
    pub copy: bool,
    /// Offset of the view into the model tensor (file-backed only).
    pub offset: u64,
}

pub fn weight_of(d: &Descriptor) -> Option<WeightRef> {
    match d.memory {
        Memory::ModelFile { model, tensor, offset } => Some(WeightRef { model, tensor, copy: false, offset }),
        Memory::Copy { model, tensor } => Some(WeightRef { model, tensor, copy: true, offset: 0 }),
        _ => None,
    }
}

/// A tensor's name for people: a weight the program left unnamed (ggml
/// calls a nameless leaf `leaf_N`; whisper.cpp names none of its weights)
/// goes by its model tensor's name.
pub fn display_name<'a>(models: &'a [ModelTable], d: &'a Descriptor) -> &'a str {
    let unnamed = d.name.strip_prefix("leaf_").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match weight_of(d) {
        Some(w) if unnamed => model_tensor(models, w.model, w.tensor).map_or(&d.name, |t| &t.name),
        _ => &d.name,
    }
}

pub fn model_tensor(models: &[ModelTable], model: u32, tensor: u32) -> Option<&ModelTensor> {
    models.get(model as usize)?.tensors.get(tensor as usize)
}

/// Bytes one access to a weight reads: the view, capped at the tensor.
pub fn weight_access_bytes(d: &Descriptor, t: &ModelTensor) -> u64 {
    view_bytes(d).map_or(t.size_bytes, |b| b.min(t.size_bytes))
}

/// Bytes an op reads from weight source `slot`: GET_ROWS reads one row per
/// index (the token embedding lookup), anything else the whole view.
pub fn op_weight_bytes(op_name: &str, slot: u32, d: &Descriptor, t: &ModelTensor, srcs: &[(u32, &Descriptor)]) -> u64 {
    let whole = weight_access_bytes(d, t);
    if op_name == OP_GET_ROWS
        && slot == 0
        && let Some((_, ids)) = srcs.iter().find(|(s, _)| *s == 1)
        && ids.ne[0] > 0
    {
        return (ids.ne[0] as u64).saturating_mul(d.nb[1]).min(whole);
    }
    whole
}

/// MoE expert tensors: only the routed experts' slices are read. The figure
/// is exact once the ubatch's routing is known (`correlate::select_experts`,
/// `walk::Tables::weight_read`), the whole tensor, an upper bound, otherwise.
pub fn is_expert_tensor(t: &ModelTensor) -> bool {
    t.expert_bytes.is_some() || t.component.ends_with("_exps")
}

/// `model_file`, `copy`, `anon`, `other_file`, `unmapped`.
pub fn memory_class(m: &Memory) -> &'static str {
    match m {
        Memory::ModelFile { .. } => "model_file",
        Memory::Copy { .. } => "copy",
        Memory::Anon => "anon",
        Memory::OtherFile => "other_file",
        Memory::Unmapped => "unmapped",
    }
}

/// The layer an op works on: its weights' layer, else the `-N` suffix
/// llama.cpp gives intermediate tensors (`Qcur-3`).
pub fn op_layer(models: &[ModelTable], dst: &Descriptor, srcs: &[&Descriptor]) -> Option<u32> {
    srcs.iter()
        .filter_map(|d| weight_of(d))
        .find_map(|w| model_tensor(models, w.model, w.tensor).and_then(|t| t.layer))
        .or_else(|| name_layer(&dst.name))
}

pub fn name_layer(name: &str) -> Option<u32> {
    let (_, suffix) = name.rsplit_once('-')?;
    suffix.parse().ok()
}

/// Where in a model file an address is: learnt from file-backed descriptors
/// (mapping base = data − view offset − tensor file offset), so faults can be
/// tied to tensors without re-reading /proc/PID/maps.
#[derive(Default)]
pub struct AddressIndex {
    /// base address → (end, model, file).
    spans: BTreeMap<u64, (u64, u32, u32)>,
    seen: usize,
    /// Per (model, file): tensor indices sorted by file offset.
    by_offset: BTreeMap<(u32, u32), Vec<(u64, u32)>>,
}

/// A fault address resolved to a model tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHit {
    pub model: u32,
    pub file: u32,
    pub file_offset: u64,
    pub tensor: Option<u32>,
}

impl AddressIndex {
    /// Learn from descriptors defined since the last call.
    pub fn learn(&mut self, descriptors: &[Descriptor], models: &[ModelTable]) {
        for d in &descriptors[self.seen.min(descriptors.len())..] {
            let Memory::ModelFile { model, tensor, offset } = d.memory else { continue };
            let Some(t) = model_tensor(models, model, tensor) else { continue };
            let Some(base) = d.data.checked_sub(offset).and_then(|a| a.checked_sub(t.file_offset)) else { continue };
            if self.spans.contains_key(&base) {
                continue;
            }
            let table = &models[model as usize];
            let end = table
                .tensors
                .iter()
                .filter(|x| x.file == t.file)
                .map(|x| x.file_offset + x.size_bytes)
                .max()
                .unwrap_or(0);
            self.spans.insert(base, (base + end, model, t.file));
            self.by_offset.entry((model, t.file)).or_insert_with(|| sorted_tensors(models, model, t.file));
        }
        self.seen = descriptors.len();
    }

    /// Model files whose mapping base is known.
    pub fn files(&self) -> usize {
        self.spans.len()
    }

    pub fn lookup(&mut self, address: u64, models: &[ModelTable]) -> Option<FileHit> {
        let (&base, &(end, model, file)) = self.spans.range(..=address).next_back()?;
        if address >= end {
            return None;
        }
        let file_offset = address - base;
        let tensor = self.tensor_at(model, file, file_offset, models);
        Some(FileHit { model, file, file_offset, tensor })
    }

    /// The tensor holding byte `file_offset` of a model file.
    pub fn tensor_at(&mut self, model: u32, file: u32, file_offset: u64, models: &[ModelTable]) -> Option<u32> {
        let sorted = self.by_offset.entry((model, file)).or_insert_with(|| sorted_tensors(models, model, file));
        let i = sorted.partition_point(|&(o, _)| o <= file_offset).checked_sub(1)?;
        let (o, t) = sorted[i];
        let size = model_tensor(models, model, t)?.size_bytes;
        (file_offset < o + size).then_some(t)
    }
}

fn sorted_tensors(models: &[ModelTable], model: u32, file: u32) -> Vec<(u64, u32)> {
    let Some(table) = models.get(model as usize) else { return Vec::new() };
    let mut v: Vec<(u64, u32)> = table
        .tensors
        .iter()
        .enumerate()
        .filter(|(_, x)| x.file == file)
        .map(|(i, x)| (x.file_offset, i as u32))
        .collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(type_id: i32, ne: [i64; 4], nb: [u64; 4]) -> Descriptor {
        Descriptor {
            tensor: 0,
            name: "t".into(),
            type_id,
            op: 0,
            op_param0: 0,
            flags: 0,
            ne,
            nb,
            data: 0,
            view_src: 0,
            view_offs: 0,
            has_extra: false,
            memory: Memory::Anon,
        }
    }

    #[test]
    fn nbytes_like_ggml() {
        // F32 4x3 contiguous.
        assert_eq!(view_bytes(&desc(0, [4, 3, 1, 1], [4, 16, 48, 48])), Some(48));
        // Q8_0 (32 elements in 34 bytes), 64x2.
        assert_eq!(view_bytes(&desc(8, [64, 2, 1, 1], [34, 68, 136, 136])), Some(136));
        // A one-row view of a larger F16 matrix.
        assert_eq!(view_bytes(&desc(1, [256, 1, 1, 1], [2, 512, 512, 512])), Some(512));
        assert_eq!(view_bytes(&desc(4, [1, 1, 1, 1], [0; 4])), None);
        assert_eq!(view_bytes(&desc(0, [0, 1, 1, 1], [4; 4])), Some(0));
    }

    #[test]
    fn layers_from_names() {
        assert_eq!(name_layer("Qcur-12"), Some(12));
        assert_eq!(name_layer("result_output"), None);
        assert_eq!(name_layer("cache_k_l0 (view)"), None);
    }
}
