//! u64 columns in 4 bytes a row: 10 M ops cost 40 MB a column, not 80.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::disk::column::Column;

/// A u64 column whose high 32 bits change rarely (the ops' `seq`, and their
/// start in ns: the high half steps every 4.3 s): each value's low 32 bits,
/// and the rows where the high bits change. Half the bytes of `u64`s.
#[derive(Default, Serialize, Deserialize)]
pub struct Stepped {
    lo: Column<u32>,
    /// `(first row, high bits)`, by row.
    high: Vec<(u32, u32)>,
}

impl Stepped {
    pub fn with_capacity(n: usize) -> Stepped {
        Stepped { lo: Vec::with_capacity(n).into(), high: Vec::new() }
    }

    pub fn new(values: &[u64]) -> Stepped {
        let mut s = Stepped::with_capacity(values.len());
        for &v in values {
            s.push(v);
        }
        s
    }

    pub fn push(&mut self, v: u64) {
        let hi = (v >> 32) as u32;
        if self.high.last().map_or(hi != 0, |&(_, h)| h != hi) {
            self.high.push((self.lo.len() as u32, hi));
        }
        self.lo.edit(|lo| lo.push(v as u32));
    }

    pub fn len(&self) -> usize {
        self.lo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lo.is_empty()
    }

    pub fn get(&self, i: usize) -> u64 {
        let k = self.high.partition_point(|&(row, _)| row as usize <= i);
        let hi = if k == 0 { 0 } else { self.high[k - 1].1 };
        u64::from(hi) << 32 | u64::from(self.lo[i])
    }

    /// Row `k` of the result is row `order[k]` of this.
    pub fn permute(&self, order: &[u32]) -> Stepped {
        let mut out = Stepped::with_capacity(order.len());
        for &i in order {
            out.push(self.get(i as usize));
        }
        out
    }

    /// The row holding `value`, in a column of increasing values.
    pub fn find(&self, value: u64) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid).cmp(&value) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }
}

/// A u64 column as runs where its runs are long, else [`Stepped`]. In a
/// run, values rise by `step` a row: the ops' `seq` by 1 (other events
/// come between ubatches), graph-captured ops' start by 0 (each has its
/// graph's). 101 M ops then cost a few MB, not 400 MB a column.
#[derive(Serialize, Deserialize)]
pub enum Packed {
    Runs {
        len: u64,
        step: u64,
        /// First row and first value of each run, by row.
        rows: Column<u32>,
        values: Column<u64>,
    },
    Each(Stepped),
}

/// Runs are kept when there is at most one per this many rows.
const ROWS_PER_RUN: usize = 8;

impl Packed {
    pub fn new(each: Stepped, step: u64) -> Packed {
        Packed::runs(each.len(), step, |i| each.get(i)).unwrap_or(Packed::Each(each))
    }

    /// Rows `0..n` of `value`.
    pub fn of(n: usize, step: u64, value: impl Fn(usize) -> u64) -> Packed {
        Packed::runs(n, step, &value).unwrap_or_else(|| {
            let mut each = Stepped::with_capacity(n);
            (0..n).for_each(|i| each.push(value(i)));
            Packed::Each(each)
        })
    }

    /// As runs, unless they are short.
    fn runs(n: usize, step: u64, value: impl Fn(usize) -> u64) -> Option<Packed> {
        let (mut rows, mut values) = (Vec::new(), Vec::new());
        let mut prev: Option<u64> = None;
        for i in 0..n {
            let v = value(i);
            if prev.and_then(|p| p.checked_add(step)) != Some(v) {
                if rows.len() > n / ROWS_PER_RUN {
                    return None;
                }
                rows.push(i as u32);
                values.push(v);
            }
            prev = Some(v);
        }
        Some(Packed::Runs { len: n as u64, step, rows: rows.into(), values: values.into() })
    }

    /// Rows `[from, to)`, one after another (no search per row).
    pub fn iter(&self, from: usize, to: usize) -> impl Iterator<Item = u64> + '_ {
        let to = to.min(self.len());
        let (starts, mut k): (&[u32], usize) = match self {
            Packed::Runs { rows, .. } => (rows, rows.partition_point(|&r| r as usize <= from).saturating_sub(1)),
            Packed::Each(_) => (&[], 0),
        };
        (from..to).map(move |i| match self {
            Packed::Runs { step, values, .. } => {
                while starts.get(k + 1).is_some_and(|&r| r as usize <= i) {
                    k += 1;
                }
                values[k] + step * (i - starts[k] as usize) as u64
            }
            Packed::Each(e) => e.get(i),
        })
    }

    pub fn len(&self) -> usize {
        match self {
            Packed::Runs { len, .. } => *len as usize,
            Packed::Each(e) => e.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> u64 {
        match self {
            Packed::Runs { step, rows, values, .. } => {
                let k = rows.partition_point(|&r| r as usize <= i) - 1;
                values[k] + step * (i - rows[k] as usize) as u64
            }
            Packed::Each(e) => e.get(i),
        }
    }

    /// The row holding `value`, in a column of increasing values.
    pub fn find(&self, value: u64) -> Option<usize> {
        match self {
            Packed::Runs { len, step, rows, values } => {
                let k = values.partition_point(|&v| v <= value).checked_sub(1)?;
                let end = rows.get(k + 1).map_or(*len, |&r| u64::from(r));
                let ahead = value - values[k];
                let row = u64::from(rows[k]) + if *step == 0 { 0 } else { ahead / step };
                (row < end && values[k] + step * (row - u64::from(rows[k])) == value).then_some(row as usize)
            }
            Packed::Each(e) => e.find(value),
        }
    }
}

/// A column whose values nearly always fit 32 bits; the rest on the side.
#[derive(Default, Serialize, Deserialize)]
pub struct Narrow {
    lo: Column<u32>,
    big: HashMap<u32, u64>,
}

const BIG: u32 = u32::MAX;

impl Narrow {
    pub fn with_capacity(n: usize) -> Narrow {
        Narrow { lo: Vec::with_capacity(n).into(), big: HashMap::new() }
    }

    pub fn push(&mut self, v: u64) {
        let small = match u32::try_from(v) {
            Ok(small) if small != BIG => small,
            _ => {
                self.big.insert(self.lo.len() as u32, v);
                BIG
            }
        };
        self.lo.edit(|lo| lo.push(small));
    }

    pub fn get(&self, i: usize) -> u64 {
        match self.lo[i] {
            BIG => self.big[&(i as u32)],
            v => u64::from(v),
        }
    }

    /// Row `k` of the result is row `order[k]` of this.
    pub fn permute(self, order: &[u32]) -> Narrow {
        let mut out = Narrow::with_capacity(order.len());
        for &i in order {
            out.push(self.get(i as usize));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_values_survive() {
        let values = [1, 5, (1 << 32) + 2, (1 << 32) + 9, (3 << 32) + 1];
        let r = Stepped::new(&values);
        assert_eq!((0..5).map(|i| r.get(i)).collect::<Vec<_>>(), values);
        assert_eq!(r.find((1 << 32) + 9), Some(3));
        assert_eq!(r.find(6), None);
        // As runs, and as Stepped when the runs are short.
        let seq: Vec<u64> = (0..100).chain(105..300).chain((1 << 33)..(1 << 33) + 50).collect();
        let starts: Vec<u64> = (0..400).map(|i| (i / 40) * 1000 + (1 << 32)).collect();
        let gappy: Vec<u64> = (0..100).map(|i| i * 2).collect();
        for (values, step, runs) in [(&seq, 1, true), (&starts, 0, true), (&gappy, 1, false)] {
            let p = Packed::new(Stepped::new(values), step);
            assert_eq!(matches!(p, Packed::Runs { .. }), runs);
            assert_eq!((0..values.len()).map(|i| p.get(i)).collect::<Vec<_>>(), *values);
            if step == 1 {
                for (i, &v) in values.iter().enumerate() {
                    assert_eq!(p.find(v), Some(i));
                }
                let absent = if runs { [100, 300, 1 << 40] } else { [1, 3, 1 << 40] };
                assert_eq!(absent.map(|v| p.find(v)), [None; 3]);
            }
        }
        // Not increasing: read back all the same.
        let jumpy = [(2 << 32) + 1, 3, (2 << 32) + 1, 1 << 33, 0];
        let p = Stepped::new(&jumpy).permute(&[4, 3, 2, 1, 0]);
        assert_eq!((0..5).map(|i| p.get(i)).collect::<Vec<_>>(), jumpy.iter().rev().copied().collect::<Vec<_>>());
        let mut n = Narrow::default();
        for v in [7, u64::from(u32::MAX), 1 << 40] {
            n.push(v);
        }
        assert_eq!((0..3).map(|i| n.get(i)).collect::<Vec<_>>(), [7, u64::from(u32::MAX), 1 << 40]);
        let p = n.permute(&[2, 0]);
        assert_eq!((p.get(0), p.get(1)), (1 << 40, 7));
    }
}
