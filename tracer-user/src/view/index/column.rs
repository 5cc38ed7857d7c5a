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
