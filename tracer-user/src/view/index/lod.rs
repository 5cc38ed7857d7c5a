//! Level of detail (docs/VIEW_API.md §1): power-of-two buckets no more
//! than the pixels asked for, with ranges widened to bucket boundaries so
//! that nearby requests ask for the same buckets; and slices shorter than
//! a bucket merged.

use serde::{Deserialize, Serialize};

use super::disk::column::Column;

/// Buckets of `bin` covering `[from, to)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bins {
    pub bin: u64,
    pub from: u64,
    pub to: u64,
    pub n: usize,
}

impl Bins {
    /// The smallest power-of-two bucket (at least `min_bin`) that cuts
    /// `[from, to)` into at most `max_n` buckets, the range widened to it.
    pub fn new(from: u64, to: u64, max_n: u64, min_bin: u64) -> Bins {
        let span = to.saturating_sub(from).max(1);
        let mut bin = min_bin.max(1).next_power_of_two();
        while span.div_ceil(bin) > max_n.max(1) {
            bin *= 2;
        }
        let from = from / bin * bin;
        let to = to.max(from + 1).div_ceil(bin).saturating_mul(bin);
        Bins { bin, from, to, n: ((to - from) / bin) as usize }
    }

    pub fn index(&self, v: u64) -> Option<usize> {
        (self.from..self.to).contains(&v).then(|| ((v - self.from) / self.bin) as usize)
    }

    pub fn meta(&self, axis: &str) -> [(String, serde_json::Value); 4] {
        [
            (format!("{axis}_bin"), self.bin.into()),
            (format!("{axis}_from"), self.from.into()),
            (format!("{axis}_to"), self.to.into()),
            (format!("n{axis}"), self.n.into()),
        ]
    }
}

/// A timeline row: a slice, or slices merged into one bucket (`count > 1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Slice {
    pub start: u64,
    pub end: u64,
    pub id: u64,
    pub name: u32,
    pub count: u32,
}

/// Merges `slices` (sorted by start) for buckets of `bin`: a single slice
/// at least a bucket long stays; shorter ones and merged rows starting in
/// the same bucket become one row. Merging merged rows again with a larger
/// power-of-two bucket gives what merging the originals would.
pub fn merge(slices: impl Iterator<Item = Slice>, bin: u64, out: &mut Vec<Slice>) {
    let mut pending: Option<(u64, Slice)> = None;
    for s in slices {
        if s.count == 1 && s.end - s.start >= bin {
            if let Some((_, p)) = pending.take() {
                out.push(p);
            }
            out.push(s);
            continue;
        }
        let bucket = s.start / bin;
        match &mut pending {
            Some((b, p)) if *b == bucket => {
                p.end = p.end.max(s.end);
                p.count += s.count;
            }
            _ => {
                if let Some((_, p)) = pending.take() {
                    out.push(p);
                }
                pending = Some((bucket, s));
            }
        }
    }
    if let Some((_, p)) = pending {
        out.push(p);
    }
}

/// A track's slices with coarser merged copies, for whole-run views of
/// millions of slices: each level is kept only if it at least halves the
/// rows of the finest one below it.
#[derive(Serialize, Deserialize)]
pub struct Pyramid {
    base: Base,
    /// `(log2 bucket, rows)`, finest first.
    levels: Vec<(u32, Column<Slice>)>,
    /// Longest slice: how far before a range a slice overlapping it starts.
    longest: u64,
}

/// The unmerged slices: kept as they are, or as rows of a table that
/// `resolve` turns into slices (the op columns: 4 bytes per op, not 32).
#[derive(Serialize, Deserialize)]
pub enum Base {
    Slices(Column<Slice>),
    Rows(Column<u32>),
}

/// Turns a [`Base::Rows`] row into its slice.
pub type Resolve<'a> = &'a dyn Fn(u32) -> Slice;

const LEVEL_STEP: u32 = 3;
const FIRST_LEVEL: u32 = 10;

impl Pyramid {
    pub fn new(slices: Vec<Slice>) -> Pyramid {
        Self::build(Base::Slices(slices.into()), &|_| unreachable!("slices need no resolving"))
    }

    /// `rows` sorted by their slices' start.
    pub fn of_rows(rows: Vec<u32>, resolve: Resolve) -> Pyramid {
        Self::build(Base::Rows(rows.into()), resolve)
    }

    fn build(base: Base, resolve: Resolve) -> Pyramid {
        let mut p = Pyramid { base, levels: Vec::new(), longest: 0 };
        p.longest = p.base_range(0, p.len(), resolve).map(|s| s.end - s.start).max().unwrap_or(0);
        let mut below = p.len();
        let mut shift = FIRST_LEVEL;
        while shift < 48 && below >= 4096 {
            let mut rows = Vec::new();
            match p.levels.last() {
                Some((_, finer)) => merge(finer.iter().copied(), 1 << shift, &mut rows),
                None => merge(p.base_range(0, p.len(), resolve), 1 << shift, &mut rows),
            }
            if rows.len() * 2 <= below {
                below = rows.len();
                p.levels.push((shift, rows.into()));
            }
            shift += LEVEL_STEP;
        }
        p
    }

    fn base_range<'a>(&'a self, a: usize, b: usize, resolve: Resolve<'a>) -> Box<dyn Iterator<Item = Slice> + 'a> {
        match &self.base {
            Base::Slices(v) => Box::new(v[a..b].iter().copied()),
            Base::Rows(v) => Box::new(v[a..b].iter().map(move |&r| resolve(r))),
        }
    }

    pub fn len(&self) -> usize {
        match &self.base {
            Base::Slices(v) => v.len(),
            Base::Rows(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows overlapping `[from, to)` for buckets of `bin` (a power of two).
    pub fn query(&self, from: u64, to: u64, bin: u64, resolve: Resolve) -> Vec<Slice> {
        let after = from.saturating_sub(self.longest);
        let overlaps = move |s: &Slice| s.end > from || s.start >= from;
        let mut out = Vec::new();
        match self.levels.iter().rev().find(|(shift, _)| 1u64 << shift <= bin) {
            Some((_, rows)) => {
                let first = rows.partition_point(|s| s.start < after);
                merge(
                    rows[first..].iter().take_while(|s| s.start < to).filter(|s| overlaps(s)).copied(),
                    bin,
                    &mut out,
                );
            }
            None => {
                let start_of = |i: usize| match &self.base {
                    Base::Slices(v) => v[i].start,
                    Base::Rows(v) => resolve(v[i]).start,
                };
                let (mut lo, mut hi) = (0, self.len());
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if start_of(mid) < after { lo = mid + 1 } else { hi = mid }
                }
                let rows = self.base_range(lo, self.len(), resolve).take_while(|s| s.start < to).filter(overlaps);
                merge(rows, bin, &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_powers_of_two_within_the_pixels() {
        let b = Bins::new(1000, 5000, 100, 1);
        assert_eq!(b.bin, 64);
        assert_eq!((b.from, b.to), (960, 5056));
        assert!(b.n as u64 <= 100 + 1);
        // A small pan asks for the same buckets.
        assert_eq!(Bins::new(1010, 5010, 100, 1).bin, 64);
        assert_eq!(Bins::new(0, 10, 100, 65536).bin, 65536);
    }

    fn s(start: u64, end: u64, id: u64) -> Slice {
        Slice { start, end, id, name: 0, count: 1 }
    }

    #[test]
    fn merging_is_the_same_from_any_finer_level() {
        let slices: Vec<Slice> = (0..10_000u64).map(|i| s(i * 37, i * 37 + 5 + i % 50, i)).collect();
        let mut direct = Vec::new();
        merge(slices.iter().copied(), 4096, &mut direct);
        let mut fine = Vec::new();
        merge(slices.iter().copied(), 512, &mut fine);
        let mut twice = Vec::new();
        merge(fine.iter().copied(), 4096, &mut twice);
        assert_eq!(direct, twice);
        assert_eq!(direct.iter().map(|r| u64::from(r.count)).sum::<u64>(), 10_000);
        let p = Pyramid::new(slices);
        assert_eq!(p.query(0, 370_000, 4096, &|_| unreachable!()), direct);
        assert_eq!(p.query(0, 370_000, 1, &|_| unreachable!()).len(), 10_000);
    }
}
