//! Building the op table as ops arrive: signatures and combinations
//! interned, columns appended, then put in `seq` order.

use std::{collections::HashMap, sync::OnceLock};

use tracer_common::ggml::MAX_SRC;

use super::{Combo, MemoryClass, Ops, Sig};
use crate::{
    analyze::{
        tensor::{op_layer, weight_of},
        walk::Tables,
    },
    format::{Descriptor, Memory, Op},
    view::{
        frame::NONE_U32,
        index::column::{Narrow, Packed, Stepped},
    },
};

#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
    values: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.values.len() as u32;
        self.ids.insert(s.to_string(), id);
        self.values.push(s.to_string());
        id
    }
}

/// The op columns, in arrival order while building.
#[derive(Default)]
struct Columns {
    seq: Stepped,
    start: Stepped,
    /// Empty until an op is timed (graph capture times none).
    dur: Vec<u32>,
    ubatch: Vec<u32>,
    combo: Vec<u32>,
    weight_bytes: Narrow,
}

#[derive(Default)]
pub struct OpsBuilder {
    strings: Interner,
    op_names: Interner,
    sigs: HashMap<Sig, u32>,
    sig_list: Vec<Sig>,
    /// Per output descriptor id: `(sources key, combination)`. An output
    /// has one or a few source lists, so a short scan finds it unhashed.
    combos: Vec<Vec<(Box<[u32]>, u32)>>,
    combo_list: Vec<Combo>,
    key: Vec<u32>,
    rows: Columns,
}

impl OpsBuilder {
    /// The combination of `op`'s output and sources, interned.
    pub fn combo(&mut self, op: &Op, name: &str, tables: &Tables, first_of_model: &[u32]) -> u32 {
        self.key.clear();
        for &(slot, id) in op.srcs.iter() {
            self.key.extend([slot, id]);
        }
        let by_dst = op.dst as usize;
        if let Some(&(_, c)) = self.combos.get(by_dst).and_then(|v| v.iter().find(|(k, _)| **k == *self.key)) {
            return c;
        }
        let dst = tables.descriptor(op.dst);
        let n = op.srcs.len().min(MAX_SRC);
        let mut srcs: [&Descriptor; MAX_SRC] = [dst; MAX_SRC];
        for (i, &(_, id)) in op.srcs.iter().take(n).enumerate() {
            srcs[i] = tables.descriptor(id);
        }
        let srcs = &srcs[..n];
        let src_names: Vec<u32> = srcs.iter().map(|d| self.strings.id(&d.name)).collect();
        let joined = srcs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(";");
        let buffer = |d: &Descriptor| match d.memory {
            Memory::ModelFile { .. } => None,
            _ => tables.analysis.buffers.at(d.data).map(|b| b.id),
        };
        let sig = Sig {
            op: self.op_names.id(name),
            dst: self.strings.id(&dst.name),
            srcs: self.strings.id(&joined),
            src_names,
            layer: op_layer(tables.models, dst, srcs),
            memory: MemoryClass::of(&dst.memory),
            weights: srcs
                .iter()
                .filter_map(|d| weight_of(d))
                .filter_map(|w| Some(first_of_model.get(w.model as usize)? + w.tensor))
                .collect(),
            dst_buffer: buffer(dst),
            src_buffers: srcs.iter().map(|d| buffer(d)).collect(),
        };
        let next = self.sig_list.len() as u32;
        let sig_id = *self.sigs.entry(sig.clone()).or_insert(next);
        if sig_id == next {
            self.sig_list.push(sig);
        }
        let id = self.combo_list.len() as u32;
        self.combo_list.push(Combo {
            sig: sig_id,
            dst_tensor: dst.tensor,
            srcs: srcs.iter().map(|d| (d.tensor, d.view_src)).collect(),
        });
        if self.combos.len() <= by_dst {
            self.combos.resize_with(by_dst + 1, Vec::new);
        }
        self.combos[by_dst].push((self.key.clone().into_boxed_slice(), id));
        id
    }

    pub fn has_weights(&self, combo: u32) -> bool {
        !self.sig_list[self.combo_list[combo as usize].sig as usize].weights.is_empty()
    }

    pub fn op_name_id(&self, combo: u32) -> u32 {
        self.sig_list[self.combo_list[combo as usize].sig as usize].op
    }

    /// Room for `n` ops: the columns then never grow by doubling.
    pub fn reserve(&mut self, n: usize) {
        let r = &mut self.rows;
        (r.seq, r.start) = (Stepped::with_capacity(n), Stepped::with_capacity(n));
        r.ubatch.reserve_exact(n);
        r.combo.reserve_exact(n);
        r.weight_bytes = Narrow::with_capacity(n);
    }

    pub fn push(&mut self, seq: u64, start: u64, dur: Option<u64>, ubatch: Option<u32>, combo: u32, weight_bytes: u64) {
        let r = &mut self.rows;
        r.seq.push(seq);
        r.start.push(start);
        // Saturating: an op of more than 4.3 s shows as 4.3 s.
        let dur = dur.map_or(NONE_U32, |d| d.min(u64::from(NONE_U32 - 1)) as u32);
        if dur != NONE_U32 || !r.dur.is_empty() {
            // The rows before the first timed one are untimed.
            r.dur.resize(r.combo.len(), NONE_U32);
            r.dur.push(dur);
        }
        r.ubatch.push(ubatch.unwrap_or(NONE_U32));
        r.combo.push(combo);
        r.weight_bytes.push(weight_bytes);
    }

    /// The columns in `seq` order, and the arrival index of each row when
    /// that is not the row itself (ops arrive as they end: with several
    /// threads, not always in `seq` order).
    pub fn finish(self) -> (Ops, Option<Vec<u32>>) {
        let Columns { seq, start, dur, ubatch, combo, weight_bytes } = self.rows;
        let n = seq.len();
        let order = (!(1..n).all(|i| seq.get(i - 1) < seq.get(i))).then(|| {
            let mut order: Vec<u32> = (0..n as u32).collect();
            // Nearly sorted: near linear.
            order.sort_by_key(|&i| seq.get(i as usize));
            order
        });
        let (seq, start, weight_bytes, dur, ubatch, combo) = match &order {
            None => (seq, start, weight_bytes, dur, ubatch, combo),
            Some(order) => {
                fn permute<T: Copy>(v: Vec<T>, order: &[u32]) -> Vec<T> {
                    if v.is_empty() { v } else { order.iter().map(|&i| v[i as usize]).collect() }
                }
                (
                    seq.permute(order),
                    start.permute(order),
                    weight_bytes.permute(order),
                    permute(dur, order),
                    permute(ubatch, order),
                    permute(combo, order),
                )
            }
        };
        let (ubatch_ops, spans, ubatch_spans_pure) = ubatch_spans(&ubatch);
        // The spans then say each row's ubatch: its column is not kept.
        let ubatch = if ubatch_spans_pure { Vec::new() } else { ubatch };
        let ops = Ops {
            seq: Packed::new(seq, 1),
            start: Packed::new(start, 0),
            dur: dur.into(),
            ubatch: ubatch.into(),
            combo: combo.into(),
            weight_bytes,
            combos: self.combo_list,
            sigs: self.sig_list,
            strings: self.strings.values,
            op_names: self.op_names.values,
            ubatch_ops,
            ubatch_spans_pure,
            spans: spans.into(),
            by_dur: OnceLock::new(),
            by_weight: OnceLock::new(),
            by_layer: OnceLock::new(),
        };
        (ops, order)
    }
}

/// Per ubatch `[first, end)` of its rows (empty: `(MAX, 0)`); the
/// non-empty spans as `[first, end, ubatch]` by row; and whether each
/// span holds its own rows only.
pub(super) fn ubatch_spans(ubatch: &[u32]) -> (Vec<(u32, u32)>, Vec<[u32; 3]>, bool) {
    let mut ubatch_ops: Vec<(u32, u32)> = Vec::new();
    for (i, &u) in ubatch.iter().enumerate().filter(|(_, u)| **u != NONE_U32) {
        if ubatch_ops.len() <= u as usize {
            ubatch_ops.resize(u as usize + 1, (u32::MAX, 0));
        }
        let r = &mut ubatch_ops[u as usize];
        *r = (r.0.min(i as u32), r.1.max(i as u32 + 1));
    }
    // Each row of a ubatch is in its span, so the spans' lengths add up to
    // the rows in ubatches exactly when no span holds another's row or one
    // outside any ubatch.
    let in_ubatches = ubatch.iter().filter(|&&u| u != NONE_U32).count() as u64;
    let spanned: u64 = ubatch_ops.iter().map(|&(a, b)| u64::from(b.saturating_sub(a))).sum();
    let mut spans: Vec<[u32; 3]> =
        ubatch_ops.iter().enumerate().filter(|(_, s)| s.0 < s.1).map(|(u, s)| [s.0, s.1, u as u32]).collect();
    spans.sort_unstable();
    (ubatch_ops, spans, spanned == in_ubatches)
}
