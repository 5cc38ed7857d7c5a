//! The memory map's reads as stored: each read's range, tag and op row in
//! 20 bytes, and its time and ubatch as runs (the reads of a graph-captured
//! op's graph all have its start and ubatch): 20 bytes a read, not 32.

use serde::{Deserialize, Serialize};

use super::Read;
use crate::view::index::{
    column::{Packed, Stepped},
    disk::column::Column,
};

/// What a read keeps per row.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Range {
    y0: u64,
    len: u32,
    tag: u32,
    row: u32,
}

/// The reads in the order the walk met them (ops arrive as they end).
#[derive(Default)]
pub struct ReadsBuilder {
    t: Stepped,
    ubatch: Vec<u32>,
    ranges: Vec<Range>,
}

impl ReadsBuilder {
    /// Adds `r` covering `len` bytes, cut into pieces that fit `Read::len`.
    pub fn push(&mut self, r: Read, len: u64) {
        let mut at = 0;
        while at < len {
            let n = (len - at).min(u64::from(u32::MAX));
            self.t.push(r.t);
            self.ubatch.push(r.ubatch);
            self.ranges.push(Range { y0: r.y0 + at, len: n as u32, tag: r.tag, row: r.row });
            at += n;
        }
    }

    /// The reads by time (then as they came), op rows renumbered by
    /// `row_of_arrival` when the ops' rows are not their arrival order.
    pub fn finish(self, row_of_arrival: Option<&[u32]>) -> Reads {
        let ReadsBuilder { t, mut ubatch, mut ranges } = self;
        let n = ranges.len();
        let sorted = (1..n).all(|i| t.get(i - 1) <= t.get(i));
        let t = if sorted {
            t
        } else {
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by_key(|&i| t.get(i as usize));
            ubatch = order.iter().map(|&i| ubatch[i as usize]).collect();
            ranges = order.iter().map(|&i| ranges[i as usize]).collect();
            t.permute(&order)
        };
        if let Some(rows) = row_of_arrival {
            for r in &mut ranges {
                r.row = rows[r.row as usize];
            }
        }
        Reads { t: Packed::new(t, 0), ubatch: Packed::of(n, 0, |i| u64::from(ubatch[i])), ranges: ranges.into() }
    }
}

/// The reads, by time.
#[derive(Serialize, Deserialize)]
pub struct Reads {
    t: Packed,
    ubatch: Packed,
    ranges: Column<Range>,
}

impl Reads {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn get(&self, i: usize) -> Read {
        self.at(i, self.t.get(i), self.ubatch.get(i))
    }

    fn at(&self, i: usize, t: u64, ubatch: u64) -> Read {
        let Range { y0, len, tag, row } = self.ranges[i];
        Read { t, y0, len, ubatch: ubatch as u32, tag, row }
    }

    /// The first read at or after `t`.
    pub fn first_at(&self, t: u64) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.t.get(mid) < t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Reads `[from, to)`.
    pub fn iter(&self, from: usize, to: usize) -> impl Iterator<Item = Read> + '_ {
        let to = to.min(self.len()).max(from);
        self.t.iter(from, to).zip(self.ubatch.iter(from, to)).zip(from..to).map(|((t, u), i)| self.at(i, t, u))
    }

    /// Every read's disk range `[y0, y1)`.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|&Range { y0, len, .. }| (y0, y0 + u64::from(len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_come_back_by_time_with_their_rows_renumbered() {
        let mut b = ReadsBuilder::default();
        let read = |t, y0, ubatch, row| Read::new(t, y0, ubatch, 3, false, 1, row);
        b.push(read(10, 100, 0, 0), 5);
        b.push(read(10, 200, 0, 0), 6);
        b.push(read(5, 300, 1, 1), (1 << 32) + 10);
        let reads = b.finish(Some(&[1, 0]));
        let got: Vec<(u64, u64, u32, u32, u32)> =
            reads.iter(0, reads.len()).map(|r| (r.t, r.y0, r.len, r.ubatch, r.row)).collect();
        let split = 300 + u64::from(u32::MAX);
        assert_eq!(got, [(5, 300, u32::MAX, 1, 0), (5, split, 11, 1, 0), (10, 100, 5, 0, 1), (10, 200, 6, 0, 1)]);
        assert_eq!((reads.first_at(6), reads.first_at(10), reads.first_at(11)), (2, 2, 4));
        assert_eq!(reads.get(3).tensor(), 3);
        assert_eq!(reads.iter(1, 3).map(|r| r.y0).collect::<Vec<_>>(), [split, 100]);
    }
}
