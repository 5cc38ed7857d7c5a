//! The memory map's offset × time pyramid: for groups of 2^k consecutive
//! ubatches (k = 2, 4, 6, …), the byte ranges their ops touched with equal
//! ranges merged and counted. Token after token reads the same weights, so
//! a group holds about as many ranges as one ubatch: a whole-run grid sums a
//! few hundred ranges per column whatever the run's length.

use serde::{Deserialize, Serialize};

use super::disk::column::Column;

/// Bytes `[y0, y0 + len)` touched `count` times; `tag` is the caller's
/// (the tensor and whether through a copy, on the disk track). Packed: 20
/// bytes, not 24, in memory and in the index.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Entry {
    pub y0: u64,
    pub len: u32,
    pub tag: u32,
    pub count: u32,
}

#[derive(Serialize, Deserialize)]
pub struct Level {
    pub shift: u32,
    /// Group `g` (ubatches `g << shift ..`) is `entries[starts[g]..starts[g + 1]]`.
    starts: Column<u32>,
    entries: Column<Entry>,
}

impl Level {
    pub fn groups(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn entries(&self, g: usize) -> &[Entry] {
        &self.entries[self.starts[g] as usize..self.starts[g + 1] as usize]
    }
}

#[derive(Default, Serialize, Deserialize)]
pub struct Pyramid {
    /// Finest first.
    levels: Vec<Level>,
}

/// Groups of 4, 16, 64, …: a grid of buckets under 4 ubatches reads ranges
/// one by one, at most 4 × its pixels of ubatches.
const FIRST: u32 = 2;
const STEP: u32 = 2;

/// Sorts and merges equal ranges, adding their counts.
fn coalesce(v: &mut Vec<Entry>) {
    v.sort_unstable_by_key(|e| (e.y0, e.len, e.tag));
    v.dedup_by(|next, kept| {
        let same = (next.y0, next.len, next.tag) == (kept.y0, kept.len, kept.tag);
        if same {
            kept.count += next.count;
        }
        same
    });
}

impl Pyramid {
    /// `of_ubatch(u, out)` appends ubatch `u`'s ranges.
    pub fn build(n_ubatches: usize, mut of_ubatch: impl FnMut(u32, &mut Vec<Entry>)) -> Pyramid {
        let mut levels: Vec<Level> = Vec::new();
        let mut shift = FIRST;
        let mut buf = Vec::new();
        while n_ubatches > 1 << (shift - STEP) {
            let n_groups = n_ubatches.div_ceil(1 << shift);
            let (mut starts, mut entries) = (vec![0u32], Vec::new());
            for g in 0..n_groups {
                buf.clear();
                match levels.last() {
                    Some(finer) => {
                        let per = 1usize << STEP;
                        for child in g * per..((g + 1) * per).min(finer.groups()) {
                            buf.extend_from_slice(finer.entries(child));
                        }
                    }
                    None => {
                        for u in g << shift..((g + 1) << shift).min(n_ubatches) {
                            of_ubatch(u as u32, &mut buf);
                        }
                    }
                }
                coalesce(&mut buf);
                entries.extend_from_slice(&buf);
                starts.push(entries.len() as u32);
            }
            levels.push(Level { shift, starts: starts.into(), entries: entries.into() });
            shift += STEP;
        }
        Pyramid { levels }
    }

    /// The coarsest level whose groups fit in buckets of `bin` ubatches.
    pub fn level_for(&self, bin: u64) -> Option<&Level> {
        self.levels.iter().rev().find(|l| 1u64 << l.shift <= bin)
    }

    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    pub fn entries(&self) -> usize {
        self.levels.iter().map(|l| l.entries.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_merge_equal_ranges() {
        // 20 ubatches each reading [0, 10) once and its own [100 + u, 101 + u).
        let p = Pyramid::build(20, |u, out| {
            out.push(Entry { y0: 0, len: 10, tag: 0, count: 1 });
            out.push(Entry { y0: 100 + u64::from(u), len: 1, tag: 0, count: 1 });
        });
        let l = p.level_for(8).unwrap();
        assert_eq!((l.shift, l.groups()), (2, 5));
        assert_eq!(l.entries(0)[0], Entry { y0: 0, len: 10, tag: 0, count: 4 });
        assert_eq!(l.entries(0).len(), 5);
        let l = p.level_for(16).unwrap();
        assert_eq!((l.shift, l.groups()), (4, 2));
        assert_eq!({ l.entries(1)[0].count }, 4);
        let top = p.level_for(64).unwrap();
        assert_eq!((top.shift, top.groups()), (6, 1));
        assert_eq!({ top.entries(0)[0].count }, 20);
        assert!(p.level_for(2).is_none());
    }
}
