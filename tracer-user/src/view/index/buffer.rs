//! The memory map's buffer track: memory ops read and write that is not the
//! model file mapping — weight copies (repacked, or loaded without mmap) and
//! anonymous memory (KV cache, compute buffers). Each ubatch's accesses are
//! summed into 64 KiB bins of address space at load (a whole run of them
//! raw would not fit in memory); the bins ever touched are then packed end
//! to end, runs closer than 1 MiB forming one region.

use std::collections::HashMap;

use crate::{
    analyze::tensor::view_bytes,
    format::{Descriptor, Memory},
};

/// log2 of the bin: the buffer track's finest resolution.
pub const BIN_SHIFT: u32 = 16;
/// Bins apart that still join one region.
const JOIN_BINS: u64 = 16;

#[derive(Default)]
pub struct BufferBuilder {
    /// Per descriptor id: its bytes in memory, once seen.
    descs: Vec<Option<(u64, u64)>>,
    counts: Vec<u32>,
    touched: Vec<u32>,
    current: Option<u32>,
    per_ubatch: Vec<(u32, Vec<(u64, u64)>)>,
    /// Copies of model tensors: tensor id → address range.
    copies: HashMap<u32, (u64, u64)>,
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

    /// Ubatch `u` ended: its accesses become bins.
    pub fn flush(&mut self, u: u32) {
        if self.current != Some(u) {
            return;
        }
        self.current = None;
        let mut bins: HashMap<u64, u64> = HashMap::new();
        for id in self.touched.drain(..) {
            let count = u64::from(std::mem::take(&mut self.counts[id as usize]));
            let Some((data, bytes)) = self.descs[id as usize] else { continue };
            if bytes == 0 || data == 0 {
                continue;
            }
            let end = data.saturating_add(bytes);
            for b in data >> BIN_SHIFT..=(end - 1) >> BIN_SHIFT {
                let lo = (b << BIN_SHIFT).max(data);
                let hi = ((b + 1) << BIN_SHIFT).min(end);
                *bins.entry(b).or_default() += (hi - lo) * count;
            }
        }
        let mut bins: Vec<(u64, u64)> = bins.into_iter().collect();
        bins.sort_unstable();
        self.per_ubatch.push((u, bins));
    }

    pub fn finish(mut self) -> BufferTrack {
        if let Some(c) = self.current {
            self.flush(c);
        }
        let mut all: Vec<u64> = self.per_ubatch.iter().flat_map(|(_, b)| b.iter().map(|&(bin, _)| bin)).collect();
        all.sort_unstable();
        all.dedup();
        let mut regions: Vec<Region> = Vec::new();
        for b in all {
            match regions.last_mut() {
                Some(r) if b - r.bin1 <= JOIN_BINS => r.bin1 = b + 1,
                _ => {
                    let y0 = regions.last().map_or(0, |r| r.y0 + ((r.bin1 - r.bin0) << BIN_SHIFT));
                    regions.push(Region { bin0: b, bin1: b + 1, y0 });
                }
            }
        }
        let size = regions.last().map_or(0, |r| r.y0 + ((r.bin1 - r.bin0) << BIN_SHIFT));
        let mut t = BufferTrack { regions, size, ..Default::default() };
        self.per_ubatch.sort_by_key(|(u, _)| *u);
        for (u, bins) in self.per_ubatch {
            let n = t.ubatch.len();
            for (bin, bytes) in bins {
                let y = t.y_of_address(bin << BIN_SHIFT).expect("every touched bin is in a region");
                t.entries.push((y >> BIN_SHIFT, bytes));
            }
            t.ubatch.push((u, n as u32, t.entries.len() as u32));
        }
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

/// A run of touched bins, and where it starts on the track.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub bin0: u64,
    pub bin1: u64,
    pub y0: u64,
}

#[derive(Default)]
pub struct BufferTrack {
    pub regions: Vec<Region>,
    pub size: u64,
    /// `(ubatch, first entry, end entry)`, by ubatch.
    pub ubatch: Vec<(u32, u32, u32)>,
    /// `(track bin, bytes accessed)`.
    pub entries: Vec<(u64, u64)>,
    /// Weight copies: `(tensor, y0, y1)`.
    pub copies: Vec<(u32, u64, u64)>,
}

impl BufferTrack {
    pub fn y_of_address(&self, address: u64) -> Option<u64> {
        let bin = address >> BIN_SHIFT;
        let i = self.regions.partition_point(|r| r.bin1 <= bin);
        let r = self.regions.get(i).filter(|r| r.bin0 <= bin)?;
        Some(r.y0 + (address - (r.bin0 << BIN_SHIFT)))
    }

    /// Entries of the ubatches in `[from, to)`, with their ubatch.
    pub fn entries_of(&self, from: u32, to: u32) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        let first = self.ubatch.partition_point(|&(u, _, _)| u < from);
        self.ubatch[first..].iter().take_while(move |&&(u, _, _)| u < to).flat_map(move |&(u, a, b)| {
            self.entries[a as usize..b as usize].iter().map(move |&(bin, bytes)| (u, bin << BIN_SHIFT, bytes))
        })
    }
}
