//! `ttrace simulate --detail BUDGET`: where one budget's predicted disk
//! reads go. Every policy's replay at that budget tells [`PageReads`] which
//! pages it read in the counted phase; each page's bytes are then charged
//! to the tensors it overlaps, byte-exact, by the rule the report charges
//! block reads by ([`io::split_by_tensor`]): a page two tensors share
//! counts for both, in proportion to their bytes in it, and the bytes in
//! no tensor (header, metadata, alignment padding, past the file's end)
//! for one "outside tensors" entry, so that the entries sum to the row's
//! disk bytes. An MoE expert tensor's bytes are also charged to the expert
//! whose slice (`expert_bytes`) they are in.
//!
//! With `--layout` the pages replayed are those of the permuted file: the
//! bytes at expert slot `p` are charged to that slot (`position`) and name
//! the original expert stored there (`expert`, `perm[p]`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Counting, Policy, Row, file_of_key, stream::Stream};
use crate::{
    analyze::{
        diff::Permutation,
        io::{self, TensorBytes},
        usage::Period,
    },
    format::ModelTable,
};

/// Where a replay reports the pages it reads, in the stream's page
/// numbering. `()` records nothing and costs nothing: the normal path.
pub trait Reads {
    /// Whether anything is recorded (a replay may then check itself).
    const RECORDS: bool;
    /// `pages` pages from `first` were read by an access counted as `period`.
    fn read(&mut self, period: Period, first: u64, pages: u64);
}

impl Reads for () {
    const RECORDS: bool = false;

    #[inline(always)]
    fn read(&mut self, _: Period, _: u64, _: u64) {}
}

/// How many times each page was read in the counted phase.
pub struct PageReads {
    counting: Counting,
    pub counts: Vec<u32>,
}

impl PageReads {
    pub fn new(counting: Counting, pages: u64) -> PageReads {
        PageReads { counting, counts: vec![0; pages as usize] }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

impl Reads for PageReads {
    const RECORDS: bool = true;

    fn read(&mut self, period: Period, first: u64, pages: u64) {
        if self.counting.counts(period) {
            for c in &mut self.counts[first as usize..(first + pages) as usize] {
                *c += 1;
            }
        }
    }
}

/// Where the reads at one budget go, per policy.
#[derive(Clone, Debug, Serialize)]
pub struct Detail {
    pub budget_bytes: u64,
    pub policies: Vec<PolicyDetail>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PolicyDetail {
    pub policy: Policy,
    /// The row's: what `tensors` and `layers` each sum to.
    pub disk_bytes: u64,
    /// Tensors some read fell in, in file order, then one entry with every
    /// field but the bytes `null`: the bytes outside every tensor.
    pub tensors: Vec<TensorReads>,
    /// Per layer (`null`: tensors of no layer, and bytes outside tensors).
    pub layers: Vec<LayerReads>,
    /// Per MoE expert slot of a layer, summed over its expert tensors.
    pub experts: Vec<ExpertReads>,
}

/// A tensor as the report names it.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReads {
    pub model: Option<u32>,
    pub tensor: Option<u32>,
    pub name: Option<String>,
    pub layer: Option<u32>,
    pub component: Option<String>,
    pub file_offset: Option<u64>,
    pub size_bytes: Option<u64>,
    #[serde(flatten)]
    pub bytes: Bytes,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerReads {
    pub layer: Option<u32>,
    #[serde(flatten)]
    pub bytes: Bytes,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExpertReads {
    pub model: u32,
    pub layer: u32,
    /// The expert slot in the file replayed.
    pub position: u32,
    /// The original expert stored there (`position` without `--layout`).
    pub expert: u32,
    #[serde(flatten)]
    pub bytes: Bytes,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Bytes {
    pub disk_bytes: u64,
    pub disk_bytes_per_token: Option<f64>,
}

impl Bytes {
    fn new(disk_bytes: u64, tokens: u64) -> Bytes {
        Bytes { disk_bytes, disk_bytes_per_token: (tokens > 0).then(|| disk_bytes as f64 / tokens as f64) }
    }
}

/// What the charges are made against.
pub struct Model<'a> {
    pub models: &'a [ModelTable],
    pub stream: &'a Stream,
    pub page_bytes: u64,
    pub layout: Option<&'a Permutation>,
    pub generated_tokens: u64,
}

impl Model<'_> {
    /// Charges `reads` (a policy's [`PageReads::counts`] at `row`'s budget).
    pub fn charge(&self, row: &Row, reads: &[u32]) -> PolicyDetail {
        let spans: Vec<_> = self.models.iter().map(io::tensor_spans).collect();
        let mut tensors: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        let mut experts: BTreeMap<(u32, u32, u32), u64> = BTreeMap::new();
        let mut outside = 0u64;
        let mut hits: Vec<TensorBytes> = Vec::new();
        for (span, &(key, origin)) in self.stream.files.iter().zip(&self.stream.file_ids) {
            let (model, file) = file_of_key(key);
            let spans = spans.get(model as usize).and_then(|s| s.get(&file)).map_or(&[][..], Vec::as_slice);
            for page in span.clone() {
                let times = u64::from(reads[page as usize]);
                if times == 0 {
                    continue;
                }
                let from = (origin + page - span.start) * self.page_bytes;
                hits.clear();
                io::split_by_tensor(spans, model, from, from + self.page_bytes, &mut hits);
                for h in &hits {
                    let Some(t) = self.models.get(model as usize).and_then(|m| m.tensors.get(h.tensor as usize)) else {
                        outside += h.bytes * times;
                        continue;
                    };
                    *tensors.entry((model, h.tensor)).or_default() += h.bytes * times;
                    let (Some(slice), Some(layer)) = (t.expert_bytes.filter(|&s| s > 0), t.layer) else { continue };
                    // The expert slots the bytes lie in.
                    let (mut at, end) = (h.file_offset - t.file_offset, h.file_offset - t.file_offset + h.bytes);
                    while at < end {
                        let slot = at / slice;
                        let upto = end.min((slot + 1) * slice);
                        *experts.entry((model, layer, slot as u32)).or_default() += (upto - at) * times;
                        at = upto;
                    }
                }
            }
        }
        let tokens = self.generated_tokens;
        let mut layers: BTreeMap<Option<u32>, u64> = BTreeMap::new();
        let mut entries: Vec<TensorReads> = tensors
            .into_iter()
            .map(|((model, tensor), bytes)| {
                let t = &self.models[model as usize].tensors[tensor as usize];
                *layers.entry(t.layer).or_default() += bytes;
                TensorReads {
                    model: Some(model),
                    tensor: Some(tensor),
                    name: Some(t.name.clone()),
                    layer: t.layer,
                    component: Some(t.component.clone()),
                    file_offset: Some(t.file_offset),
                    size_bytes: Some(t.size_bytes),
                    bytes: Bytes::new(bytes, tokens),
                }
            })
            .collect();
        entries.sort_by_key(|e| (e.model, e.file_offset));
        *layers.entry(None).or_default() += outside;
        entries.push(TensorReads {
            model: None,
            tensor: None,
            name: None,
            layer: None,
            component: None,
            file_offset: None,
            size_bytes: None,
            bytes: Bytes::new(outside, tokens),
        });
        let original = |layer: u32, slot: u32| {
            self.layout.and_then(|l| l.get(&layer)).and_then(|order| order.get(slot as usize)).copied().unwrap_or(slot)
        };
        PolicyDetail {
            policy: row.policy,
            disk_bytes: row.disk_bytes,
            tensors: entries,
            layers: layers.into_iter().map(|(layer, b)| LayerReads { layer, bytes: Bytes::new(b, tokens) }).collect(),
            experts: experts
                .into_iter()
                .map(|((model, layer, position), b)| ExpertReads {
                    model,
                    layer,
                    position,
                    expert: original(layer, position),
                    bytes: Bytes::new(b, tokens),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ModelTensor;

    fn tensor(name: &str, offset: u64, size: u64, layer: Option<u32>, expert_bytes: Option<u64>) -> ModelTensor {
        ModelTensor {
            name: name.into(),
            file: 0,
            file_offset: offset,
            size_bytes: size,
            layer,
            component: name.split('.').nth(2).unwrap_or(name).into(),
            expert_bytes,
            type_name: String::new(),
            shape: Vec::new(),
        }
    }

    /// One file of 5 pages of 100 bytes: a header to 30, `a` over 30..130
    /// (sharing page 1 with `b`), `b` over 150..250, padding to 300, an
    /// expert tensor of 3 experts of 60 bytes over 300..480, the rest past
    /// every tensor.
    #[test]
    fn pages_are_charged_byte_exact_to_the_tensors_and_expert_slices_they_hold() {
        let model = ModelTable {
            tensors: vec![
                tensor("blk.0.a", 30, 100, Some(0), None),
                tensor("blk.0.b", 150, 100, Some(0), None),
                tensor("blk.1.ffn_up_exps", 300, 180, Some(1), Some(60)),
            ],
            ..Default::default()
        };
        let models = [model];
        let stream = Stream::of(&[5], &[0]);
        let row = Row {
            budget_bytes: 0,
            cache_bytes: 0,
            policy: Policy::Lru,
            disk_bytes: 700,
            disk_bytes_per_token: None,
            misses: 7,
        };
        // Page 0 once, page 1 twice, pages 3 and 4 twice each.
        let reads = [1, 2, 0, 2, 2];
        let layout: Permutation = [(1, vec![2, 0, 1])].into_iter().collect();
        for layout in [None, Some(&layout)] {
            let m = Model { models: &models, stream: &stream, page_bytes: 100, layout, generated_tokens: 7 };
            let d = m.charge(&row, &reads);
            let by_name: Vec<(Option<&str>, u64)> =
                d.tensors.iter().map(|t| (t.name.as_deref(), t.bytes.disk_bytes)).collect();
            // a: 70 of page 0, 30 of page 1 twice; b: 50 of page 1 twice;
            // the experts: all of page 3 and 80 of page 4, twice.
            assert_eq!(
                by_name,
                [(Some("blk.0.a"), 70 + 60), (Some("blk.0.b"), 100), (Some("blk.1.ffn_up_exps"), 360), (None, 110)]
            );
            let layers: Vec<(Option<u32>, u64)> = d.layers.iter().map(|l| (l.layer, l.bytes.disk_bytes)).collect();
            assert_eq!(layers, [(None, 110), (Some(0), 230), (Some(1), 360)]);
            // Slot 0 is 300..360, slot 1 360..420, slot 2 420..480.
            let experts: Vec<(u32, u32, u64)> =
                d.experts.iter().map(|e| (e.position, e.expert, e.bytes.disk_bytes)).collect();
            let named = |slot: u32| if layout.is_some() { [2, 0, 1][slot as usize] } else { slot };
            assert_eq!(experts, [(0, named(0), 120), (1, named(1), 120), (2, named(2), 120)]);
            assert_eq!(d.tensors.iter().map(|t| t.bytes.disk_bytes).sum::<u64>(), 700);
            assert_eq!(d.tensors[0].bytes.disk_bytes_per_token, Some(130.0 / 7.0));
        }
    }
}
