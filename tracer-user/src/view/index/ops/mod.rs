//! The op table: every op as columns, in `seq` order. Graphs repeat, so an
//! op's descriptive fields (name, output, sources, layer, memory class,
//! weights) are one interned [`Sig`]; a filter is decided once per
//! signature and then applied by one scan over the columns.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

mod builder;

pub use builder::OpsBuilder;

use super::{
    column::{Narrow, Packed},
    disk::column::{Column, once},
    rows::{set_bits, sorted_rows},
};
use crate::{format::Memory, view::frame::NONE_U32};

/// An op's fields that depend only on its output and sources.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sig {
    /// Index into [`Ops::op_names`].
    pub op: u32,
    /// Indexes into [`Ops::strings`]: the output name, and the source names
    /// joined by `;` as the exports' `srcs`.
    pub dst: u32,
    pub srcs: u32,
    pub src_names: Vec<u32>,
    pub layer: Option<u32>,
    pub memory: MemoryClass,
    /// Model tensors read (through the mapping or a copy), source order.
    pub weights: Vec<u32>,
    /// The backend buffer (`Buffer::id`) holding the output and each
    /// source, where they are not model-file bytes.
    pub dst_buffer: Option<u32>,
    pub src_buffers: Vec<Option<u32>>,
}

/// docs/VIEW_API.md's `memory` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum MemoryClass {
    ModelFile = 0,
    Copy = 1,
    Anon = 2,
    OtherFile = 3,
    Unmapped = 4,
}

impl MemoryClass {
    pub fn of(m: &Memory) -> MemoryClass {
        match m {
            Memory::ModelFile { .. } => MemoryClass::ModelFile,
            Memory::Copy { .. } => MemoryClass::Copy,
            Memory::Anon => MemoryClass::Anon,
            Memory::OtherFile => MemoryClass::OtherFile,
            Memory::Unmapped => MemoryClass::Unmapped,
        }
    }

    pub const NAMES: [&str; 5] = ["model_file", "copy", "anon", "other_file", "unmapped"];
}

/// One (output, sources) descriptor combination: its signature and the
/// tensor addresses that give the graph's edges.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Combo {
    pub sig: u32,
    /// `ggml_tensor` address of the output.
    pub dst_tensor: u64,
    /// Per source: its address and the tensor it views (0: none).
    pub srcs: Vec<(u64, u64)>,
}

/// Every op, in `seq` order.
#[derive(Serialize, Deserialize)]
pub struct Ops {
    seq: Packed,
    /// Since the trace's start.
    start: Packed,
    /// `NONE_U32`: not timed. Empty when no op is (graph capture).
    dur: Column<u32>,
    /// `NONE_U32`: outside any ubatch. Empty when the ubatches' spans say
    /// it (`ubatch_spans_pure`): 4 bytes an op less.
    ubatch: Column<u32>,
    pub combo: Column<u32>,
    weight_bytes: Narrow,
    pub combos: Vec<Combo>,
    pub sigs: Vec<Sig>,
    pub strings: Vec<String>,
    pub op_names: Vec<String>,
    /// Per ubatch: `[first, end)` of its rows (empty: `(MAX, 0)`).
    pub ubatch_ops: Vec<(u32, u32)>,
    /// Whether each ubatch's span holds its rows only (ubatches ran one
    /// after another): a filter by ubatch alone is then set span by span.
    ubatch_spans_pure: bool,
    /// The ubatches' non-empty spans as `[first, end, ubatch]`, by row.
    spans: Column<[u32; 3]>,
    #[serde(with = "once")]
    by_dur: OnceLock<Column<u32>>,
    #[serde(with = "once")]
    by_weight: OnceLock<Column<u32>>,
    #[serde(with = "once")]
    by_layer: OnceLock<Column<u32>>,
}

/// How the op table is sorted (then by `seq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortKey {
    Seq,
    Dur,
    WeightBytes,
    Layer,
    Ubatch,
}

/// Which ops the table shows: each list ORs its values, the lists AND.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub layers: Vec<u32>,
    pub ops: Vec<u32>,
    pub tensors: Vec<u32>,
    pub name: Option<regex_lite::Regex>,
    pub ubatches: Option<(u32, u32)>,
    pub phases: Vec<u8>,
    pub memories: Vec<u8>,
    pub seqs: Vec<i32>,
}

/// Ubatch-level facts a filter needs.
pub struct UbatchFacts<'a> {
    pub phase: &'a [u8],
    /// Sequence ids of each ubatch's tokens.
    pub seqs: &'a [Vec<i32>],
}

pub struct Page {
    pub rows: Vec<u32>,
    pub total: u64,
}

impl Ops {
    pub fn len(&self) -> usize {
        self.seq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    /// Op `row`'s `seq` (its id, as in the exports).
    pub fn seq(&self, row: usize) -> u64 {
        self.seq.get(row)
    }

    /// Op `row`'s start, since the trace's.
    pub fn start(&self, row: usize) -> u64 {
        self.start.get(row)
    }

    /// Op `row`'s duration, when it was timed.
    pub fn dur(&self, row: usize) -> Option<u32> {
        self.dur.get(row).copied().filter(|&d| d != NONE_U32)
    }

    /// Whether any op was timed (`--op-timing`, `--all-threads`).
    pub fn timed(&self) -> bool {
        !self.dur.is_empty()
    }

    /// The ubatch op `row` ran in.
    pub fn ubatch(&self, row: usize) -> Option<u32> {
        let u = if self.ubatch.is_empty() {
            let k = self.spans.partition_point(|s| s[0] as usize <= row);
            match k.checked_sub(1).map(|k| self.spans[k]) {
                Some([_, end, u]) if row < end as usize => u,
                _ => NONE_U32,
            }
        } else {
            self.ubatch[row]
        };
        (u != NONE_U32).then_some(u)
    }

    /// Calls `f` with each run of rows in `[lo, hi)` of one ubatch
    /// (`NONE_U32`: outside any), in row order.
    fn for_ubatch_runs(&self, lo: usize, hi: usize, mut f: impl FnMut(std::ops::Range<usize>, u32)) {
        if !self.ubatch.is_empty() {
            let mut i = lo;
            while i < hi {
                let u = self.ubatch[i];
                let run = self.ubatch[i..hi].iter().take_while(|&&v| v == u).count();
                f(i..i + run, u);
                i += run;
            }
            return;
        }
        // Disjoint spans by first row are by end too.
        let mut at = lo;
        let first = self.spans.partition_point(|s| s[1] as usize <= lo);
        for &[a, b, u] in &self.spans[first..] {
            let (a, b) = (a as usize, (b as usize).min(hi));
            if a >= hi {
                break;
            }
            if at < a {
                f(at..a, NONE_U32);
            }
            if a.max(at) < b {
                f(a.max(at)..b, u);
            }
            at = at.max(b);
        }
        if at < hi {
            f(at..hi, NONE_U32);
        }
    }

    pub fn weight_bytes(&self, row: usize) -> u64 {
        self.weight_bytes.get(row)
    }

    pub fn sig_of(&self, row: usize) -> &Sig {
        &self.sigs[self.combos[self.combo[row] as usize].sig as usize]
    }

    /// The row of op `seq`.
    pub fn row_of_seq(&self, seq: u64) -> Option<usize> {
        self.seq.find(seq)
    }

    /// Builds the sorted orders now rather than at the first query.
    pub fn warm(&self) {
        for key in [SortKey::Dur, SortKey::WeightBytes, SortKey::Layer] {
            self.order(key);
        }
    }

    fn order(&self, key: SortKey) -> Option<&[u32]> {
        Some(match key {
            SortKey::Seq | SortKey::Ubatch => return None,
            // Nothing timed: every key ties, and the order is the rows'.
            SortKey::Dur if !self.timed() => return None,
            SortKey::Dur => self.by_dur.get_or_init(|| sorted_rows(self.len(), |i| u64::from(self.dur[i]))),
            SortKey::WeightBytes => {
                self.by_weight.get_or_init(|| sorted_rows(self.len(), |i| self.weight_bytes.get(i)))
            }
            SortKey::Layer => {
                let layer_of: Vec<u64> = self
                    .combos
                    .iter()
                    .map(|c| u64::from(self.sigs[c.sig as usize].layer.unwrap_or(NONE_U32)))
                    .collect();
                self.by_layer.get_or_init(|| sorted_rows(self.len(), |i| layer_of[self.combo[i] as usize]))
            }
        })
    }

    /// Which signatures pass the filter's signature-level conditions.
    fn sig_mask(&self, f: &Filter) -> Vec<bool> {
        let name_hits: Vec<bool> =
            f.name.as_ref().map(|re| self.strings.iter().map(|s| re.is_match(s)).collect()).unwrap_or_default();
        self.sigs
            .iter()
            .map(|s| {
                (f.layers.is_empty() || s.layer.is_some_and(|l| f.layers.contains(&l)))
                    && (f.ops.is_empty() || f.ops.contains(&s.op))
                    && (f.tensors.is_empty() || s.weights.iter().any(|w| f.tensors.contains(w)))
                    && (f.memories.is_empty() || f.memories.contains(&(s.memory as u8)))
                    && (f.name.is_none()
                        || name_hits[s.dst as usize]
                        || s.src_names.iter().any(|&n| name_hits[n as usize]))
            })
            .collect()
    }

    /// One page of the ops matching `f`, sorted, and how many match.
    ///
    /// The matching rows are found by one sequential scan into a bitset
    /// (nothing to scan without a filter); a sorted page then walks the
    /// precomputed order testing bits, which stay in cache.
    pub fn query(&self, f: &Filter, facts: &UbatchFacts, sort: SortKey, desc: bool, offset: u64, limit: usize) -> Page {
        let order = self.order(sort);
        let Some(mask) = self.mask(f, facts) else {
            // Everything matches.
            let n = self.len() as u64;
            let pick = |k: u64| -> u32 {
                let k = if desc { n - 1 - k } else { k };
                order.map_or(k as u32, |o| o[k as usize])
            };
            let rows = (offset..n.min(offset.saturating_add(limit as u64))).map(pick).collect();
            return Page { rows, total: n };
        };
        let total: u64 = mask.iter().map(|w| u64::from(w.count_ones())).sum();
        let hit = |i: u32| mask[i as usize / 64] >> (i % 64) & 1 == 1;
        let mut rows = Vec::with_capacity(limit);
        let mut skipped = 0u64;
        let mut take = |i: u32| {
            if hit(i) {
                if skipped < offset {
                    skipped += 1;
                } else {
                    rows.push(i);
                }
            }
            rows.len() < limit
        };
        // In row order, a word of the mask at a time: a range late in the
        // run starts past millions of clear bits (45 ms on 101 M ops).
        let set_in = |w: usize| {
            let (mut bits, base) = (mask[w], w as u32 * 64);
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    base + b
                })
            })
        };
        match (order, desc) {
            (None, false) => {
                'rows: for w in (0..mask.len()).filter(|&w| mask[w] != 0) {
                    for i in set_in(w) {
                        if !take(i) {
                            break 'rows;
                        }
                    }
                }
            }
            (None, true) => {
                'rows: for w in (0..mask.len()).rev().filter(|&w| mask[w] != 0) {
                    let bits: Vec<u32> = set_in(w).collect();
                    for &i in bits.iter().rev() {
                        if !take(i) {
                            break 'rows;
                        }
                    }
                }
            }
            (Some(order), false) => {
                for &i in order {
                    if !take(i) {
                        break;
                    }
                }
            }
            (Some(order), true) => {
                for &i in order.iter().rev() {
                    if !take(i) {
                        break;
                    }
                }
            }
        }
        Page { rows, total }
    }

    /// Bit `i` set when row `i` matches `f`; `None` when every row does.
    fn mask(&self, f: &Filter, facts: &UbatchFacts) -> Option<Vec<u64>> {
        let by_ubatch = f.ubatches.is_some() || !f.phases.is_empty() || !f.seqs.is_empty();
        let by_sig = !f.layers.is_empty()
            || !f.ops.is_empty()
            || !f.tensors.is_empty()
            || !f.memories.is_empty()
            || f.name.is_some();
        if !by_ubatch && !by_sig {
            return None;
        }
        let sig_ok = self.sig_mask(f);
        let combo_ok: Vec<bool> = self.combos.iter().map(|c| sig_ok[c.sig as usize]).collect();
        // Per ubatch, and one more entry for "outside any ubatch".
        let n_ub = facts.phase.len();
        let mut ub_ok: Vec<bool> = (0..n_ub)
            .map(|u| {
                f.ubatches.is_none_or(|(a, b)| (a..b).contains(&(u as u32)))
                    && (f.phases.is_empty() || f.phases.contains(&facts.phase[u]))
                    && (f.seqs.is_empty() || facts.seqs[u].iter().any(|s| f.seqs.contains(s)))
            })
            .collect();
        ub_ok.push(!by_ubatch);
        // In seq order a ubatch range is a row range (ubatches run one after another).
        let (lo, hi) = match f.ubatches {
            Some((a, b)) => {
                let rows = self.ubatch_ops.get(a as usize..(b as usize).min(self.ubatch_ops.len())).unwrap_or(&[]);
                let lo = rows.iter().map(|r| r.0).min().unwrap_or(0);
                let hi = rows.iter().map(|r| r.1).max().unwrap_or(0);
                (lo as usize, hi.max(lo) as usize)
            }
            _ => (0, self.len()),
        };
        let mut mask = vec![0u64; self.len().div_ceil(64)];
        if !by_sig && self.ubatch_spans_pure {
            // Without reading a row: on 101 M ops the scan below took
            // 55-140 ms for a filter by phase and ubatch range.
            for (u, &(first, end)) in self.ubatch_ops.iter().enumerate() {
                if u < n_ub && ub_ok[u] && first < end {
                    set_bits(&mut mask, first as usize, end as usize);
                }
            }
            return Some(mask);
        }
        if !by_ubatch {
            // By signature only: 64 rows a word, no ubatch looked up.
            for (w, combos) in mask.iter_mut().zip(self.combo.chunks(64)) {
                *w = combos.iter().enumerate().fold(0, |w, (b, &c)| w | u64::from(combo_ok[c as usize]) << b);
            }
            return Some(mask);
        }
        self.for_ubatch_runs(lo, hi, |rows, u| {
            if ub_ok[(u as usize).min(n_ub)] {
                for i in rows.filter(|&i| combo_ok[self.combo[i] as usize]) {
                    mask[i / 64] |= 1 << (i % 64);
                }
            }
        });
        Some(mask)
    }
}

#[cfg(test)]
mod tests;
