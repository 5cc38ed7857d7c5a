//! The memory map's buffer track: memory ops read and write that is not the
//! model file mapping — weight copies (repacked, or loaded without mmap) and
//! anonymous memory (KV cache, compute buffers). Per ubatch, the accessed
//! ranges are swept into disjoint segments, each with how often its bytes
//! were accessed: a few hundred per ubatch however long the KV cache grows.
//! The address ranges ever touched are then packed end to end, ranges
//! closer than 1 MiB forming one region.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::disk::column::Column;

use crate::{
    analyze::tensor::view_bytes,
    format::{Descriptor, Memory},
};

/// Address gap that still joins two ranges into one region.
const JOIN_GAP: u64 = 1 << 20;

/// Accessed bytes `[start, end)`, each `count` times.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub count: u32,
}

#[derive(Default)]
pub struct BufferBuilder {
    /// Per descriptor id: its bytes in memory, once seen.
    descs: Vec<Option<(u64, u64)>>,
    counts: Vec<u32>,
    touched: Vec<u32>,
    current: Option<u32>,
    per_ubatch: Vec<(u32, Vec<Segment>)>,
    /// Copies of model tensors: tensor id → address range.
    copies: HashMap<u32, (u64, u64)>,
    edges: Vec<(u64, i64)>,
}

impl BufferBuilder {
    /// Ubatch `u`'s op accessed descriptor `id`.
    pub fn touch(&mut self, u: u32, id: u32, d: &Descriptor, first_of_model: &[u32]) {
        if self.current != Some(u) {
            if let Some(c) = self.current {
                self.flush(c);
            }
            self.current = Some(u);
        }
        let i = id as usize;
        if self.descs.len() <= i {
            self.descs.resize(i + 1, None);
            self.counts.resize(i + 1, 0);
        }
        if self.descs[i].is_none() {
            let bytes = view_bytes(d).unwrap_or(0);
            self.descs[i] = Some((d.data, bytes));
            if let Memory::Copy { model, tensor } = d.memory
                && let Some(first) = first_of_model.get(model as usize)
                && bytes > 0
            {
                let r = self.copies.entry(first + tensor).or_insert((d.data, d.data + bytes));
                *r = (r.0.min(d.data), r.1.max(d.data + bytes));
            }
        }
        if self.counts[i] == 0 {
            self.touched.push(id);
        }
        self.counts[i] += 1;
    }

    /// Ubatch `u` ended: its accesses become segments.
    pub fn flush(&mut self, u: u32) {
        if self.current != Some(u) {
            return;
        }
        self.current = None;
        self.edges.clear();
        for id in self.touched.drain(..) {
            let count = i64::from(std::mem::take(&mut self.counts[id as usize]));
            let Some((data, bytes)) = self.descs[id as usize] else { continue };
            if bytes > 0 && data != 0 {
                self.edges.push((data, count));
                self.edges.push((data.saturating_add(bytes), -count));
            }
        }
        self.edges.sort_unstable();
        let mut segments: Vec<Segment> = Vec::new();
        let mut depth = 0i64;
        for w in 0..self.edges.len() {
            let (at, delta) = self.edges[w];
            depth += delta;
            let next = self.edges.get(w + 1).map_or(at, |e| e.0);
            if depth > 0 && next > at {
                let count = depth as u32;
                match segments.last_mut() {
                    Some(s) if s.end == at && s.count == count => s.end = next,
                    _ => segments.push(Segment { start: at, end: next, count }),
                }
            }
        }
        self.per_ubatch.push((u, segments));
    }

    pub fn finish(mut self) -> BufferTrack {
        if let Some(c) = self.current {
            self.flush(c);
        }
        let mut spans: Vec<(u64, u64)> =
            self.per_ubatch.iter().flat_map(|(_, s)| s.iter().map(|s| (s.start, s.end))).collect();
        spans.sort_unstable();
        let mut regions: Vec<Region> = Vec::new();
        let mut y = 0;
        for (a, b) in spans {
            match regions.last_mut() {
                Some(r) if a <= r.end.saturating_add(JOIN_GAP) => {
                    if b > r.end {
                        y += b - r.end;
                        r.end = b;
                    }
                }
                _ => {
                    regions.push(Region { start: a, end: b, y0: y });
                    y += b - a;
                }
            }
        }
        let mut t = BufferTrack { regions, size: y, ..Default::default() };
        self.per_ubatch.sort_by_key(|(u, _)| *u);
        let mut placed = Vec::new();
        for (u, segments) in self.per_ubatch {
            let n = placed.len();
            for s in segments {
                let y = t.y_of_address(s.start).expect("every segment is in a region");
                placed.push(Segment { start: y, end: y + (s.end - s.start), count: s.count });
            }
            t.ubatch.push((u, n as u32, placed.len() as u32));
        }
        t.segments = placed.into();
        let mut copies: Vec<(u32, u64, u64)> = self
            .copies
            .into_iter()
            .filter_map(|(tensor, (a, b))| Some((tensor, t.y_of_address(a)?, t.y_of_address(b - 1)? + 1)))
            .collect();
        copies.sort_by_key(|c| c.1);
        t.copies = copies;
        t
    }
}

/// Touched addresses `[start, end)` and where they start on the track.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub y0: u64,
}

#[derive(Default, Serialize, Deserialize)]
pub struct BufferTrack {
    pub regions: Vec<Region>,
    pub size: u64,
    /// `(ubatch, first segment, end segment)`, by ubatch.
    pub ubatch: Vec<(u32, u32, u32)>,
    /// On the track (`start`, `end` are track positions).
    pub segments: Column<Segment>,
    /// Weight copies: `(tensor, y0, y1)`.
    pub copies: Vec<(u32, u64, u64)>,
}

impl BufferTrack {
    /// Where `address` is on the track; gaps inside a region count.
    pub fn y_of_address(&self, address: u64) -> Option<u64> {
        let i = self.regions.partition_point(|r| r.end <= address);
        let r = self.regions.get(i).filter(|r| r.start <= address)?;
        Some(r.y0 + (address - r.start))
    }

    /// Segments of the ubatches in `[from, to)`, with their ubatch.
    pub fn segments_of(&self, from: u32, to: u32) -> impl Iterator<Item = (u32, &Segment)> + '_ {
        let first = self.ubatch.partition_point(|&(u, _, _)| u < from);
        self.ubatch[first..]
            .iter()
            .take_while(move |&&(u, _, _)| u < to)
            .flat_map(move |&(u, a, b)| self.segments[a as usize..b as usize].iter().map(move |s| (u, s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_count_overlapping_accesses() {
        let mut b = BufferBuilder {
            descs: vec![Some((1000, 100)), Some((1050, 100)), Some((5_000_000, 10))],
            counts: vec![0; 3],
            current: Some(0),
            ..Default::default()
        };
        for id in [0, 1, 1, 2] {
            if b.counts[id] == 0 {
                b.touched.push(id as u32);
            }
            b.counts[id] += 1;
        }
        b.flush(0);
        let s = &b.per_ubatch[0].1;
        assert_eq!(
            s,
            &[
                Segment { start: 1000, end: 1050, count: 1 },
                Segment { start: 1050, end: 1100, count: 3 },
                Segment { start: 1100, end: 1150, count: 2 },
                Segment { start: 5_000_000, end: 5_000_010, count: 1 },
            ]
        );
        let t = b.finish();
        // Two regions (the gap is more than 1 MiB), packed end to end.
        assert_eq!(t.regions.len(), 2);
        assert_eq!(t.size, 160);
        assert_eq!(t.y_of_address(5_000_000), Some(150));
        let bytes: u64 = t.segments_of(0, 1).map(|(_, s)| (s.end - s.start) * u64::from(s.count)).sum();
        assert_eq!(bytes, 100 + 2 * 100 + 10);
    }
}
