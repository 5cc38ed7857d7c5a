//! What the memory map shows under the pointer, and how its y axis is
//! labelled.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{MemoryMap, Metric, NO_UBATCH, ReadFilter, Track, XAxis, XRange};
use crate::{analyze::Analysis, view::index::Tensors};

impl MemoryMap {
    /// What a cell of the disk track holds, per tensor it overlaps.
    /// `seq_of` names an op row by its `seq`.
    pub fn disk_cell(
        &self,
        a: &Analysis,
        tensors: &Tensors,
        x: XRange,
        (y0, y1): (u64, u64),
        filter: &ReadFilter,
        seq_of: &dyn Fn(u32) -> u64,
    ) -> Value {
        let ids: Vec<u32> = tensors.overlapping(y0, y1).take(64).collect();
        let mut out = Vec::new();
        for id in ids {
            let t = &tensors.rows[id as usize];
            let (lo, hi) = (y0.max(t.y0), y1.min(t.y0 + t.size));
            let overlap = |a: u64, len: u64| (a + len).min(hi).saturating_sub(a.max(lo));
            let (mut read, mut reads) = (0u64, 0u64);
            let mut ubatches = BTreeSet::new();
            let mut op_rows = BTreeSet::new();
            for (_, r) in self.reads_in(x) {
                if r.tensor() == id && filter.keeps(&r, &self.layer_of, &self.phase_of) {
                    let o = overlap(r.y0, u64::from(r.len));
                    if o > 0 {
                        read += o;
                        reads += 1;
                        op_rows.insert(r.row);
                        if r.ubatch != NO_UBATCH {
                            ubatches.insert(r.ubatch);
                        }
                    }
                }
            }
            let io = |m: Metric| -> u64 { self.events_in(m, x).map(|(_, e)| overlap(e.y0, e.len)).sum() };
            // Bytes, not events: a page filled twice (evicted and read
            // again in a cold run) is one byte loaded and never used.
            let bytes_of = |m: Metric| -> u64 {
                let mut spans: Vec<(u64, u64)> =
                    self.events_in(m, x).map(|(_, e)| (e.y0.max(lo), (e.y0 + e.len).min(hi))).collect();
                spans.retain(|(a, b)| a < b);
                spans.sort_unstable();
                let (mut total, mut end) = (0u64, 0u64);
                for (a, b) in spans {
                    total += b.saturating_sub(a.max(end));
                    end = end.max(b);
                }
                total
            };
            let report: u64 = ubatches
                .iter()
                .filter_map(|&u| a.ubatches.get(u as usize)?.weights.get(&(t.model, t.index)))
                .map(|w| w.bytes)
                .sum();
            let tokens: Vec<i32> = ubatches
                .iter()
                .filter_map(|&u| a.ubatches.get(u as usize))
                .flat_map(|u| u.token_ids.iter().copied())
                .take(64)
                .collect();
            out.push(json!({
                "tensor": id, "name": t.name, "y0": t.y0, "y1": t.y0 + t.size,
                "read_bytes": read, "reads": reads, "report_bytes": report,
                "op_count": op_rows.len(),
                "ops": op_rows.iter().take(16).map(|&r| seq_of(r)).collect::<Vec<u64>>(),
                "ubatches": ubatches.len(), "first_ubatch": ubatches.first(), "tokens": tokens,
                "disk_bytes": io(Metric::BlockRead), "faults_major": io(Metric::FaultMajor) / 4096,
                "faults_minor": io(Metric::FaultMinor) / 4096, "cache_fill_bytes": io(Metric::CacheFill),
                "unused_bytes": bytes_of(Metric::Unused),
            }));
        }
        json!({ "tensors": out })
    }

    /// What a cell of the buffer track holds.
    pub fn buffer_cell(&self, x: XRange, (y0, y1): (u64, u64)) -> Value {
        let (from, to) = self.ubatches_of(x);
        let mut bytes = 0u64;
        let mut ubatches = BTreeSet::new();
        for (u, seg) in self.buffer.segments_of(from, to) {
            let inside = x.axis == XAxis::Ubatch || (x.from..x.to).contains(&self.ubatch_time[u as usize].0);
            let overlap = seg.end.min(y1).saturating_sub(seg.start.max(y0));
            if inside && overlap > 0 {
                bytes += overlap * u64::from(seg.count);
                ubatches.insert(u);
            }
        }
        let copies: Vec<u32> =
            self.buffer.copies.iter().filter(|c| c.1 < y1 && c.2 > y0).map(|c| c.0).take(64).collect();
        json!({ "accessed_bytes": bytes, "ubatches": ubatches.len(), "copies_of": copies })
    }

    /// The y layout to label a track with.
    pub fn bands(&self, track: Track, tensors: &Tensors) -> Value {
        match track {
            Track::Disk => {
                let bands: Vec<Value> = tensors
                    .rows
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        json!({"y0": t.y0, "y1": t.y0 + t.size, "tensor": i, "name": t.name, "layer": t.layer,
                               "component": t.component, "memory": "model_file"})
                    })
                    .collect();
                let mut experts = Vec::new();
                for (i, t) in tensors.rows.iter().enumerate() {
                    if let (Some(n), Some(slice)) = (t.n_experts(), t.expert_bytes) {
                        for e in 0..n {
                            let y0 = t.y0 + u64::from(e) * slice;
                            experts
                                .push(json!({"tensor": i, "layer": t.layer, "expert": e, "y0": y0, "y1": y0 + slice}));
                        }
                    }
                }
                let mut groups: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
                for t in &tensors.rows {
                    if let Some(l) = t.layer {
                        let g = groups.entry(l).or_insert((u64::MAX, 0));
                        *g = (g.0.min(t.y0), g.1.max(t.y0 + t.size));
                    }
                }
                let groups: Vec<Value> =
                    groups.into_iter().map(|(l, (a, b))| json!({"layer": l, "y0": a, "y1": b})).collect();
                json!({"size": tensors.disk_size, "bands": bands, "experts": experts, "groups": groups})
            }
            Track::Buffer => {
                let regions: Vec<Value> = self
                    .buffer
                    .regions
                    .iter()
                    .map(|r| json!({"y0": r.y0, "y1": r.y0 + (r.end - r.start), "address": r.start}))
                    .collect();
                let bands: Vec<Value> = self
                    .buffer
                    .copies
                    .iter()
                    .map(|&(t, y0, y1)| {
                        let row = &tensors.rows[t as usize];
                        json!({"y0": y0, "y1": y1, "tensor": t, "name": row.name, "layer": row.layer,
                               "component": row.component, "memory": "copy"})
                    })
                    .collect();
                json!({"size": self.buffer.size, "regions": regions,
                       "bands": bands, "experts": [], "groups": []})
            }
        }
    }
}
