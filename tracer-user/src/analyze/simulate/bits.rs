//! A fixed-size set of page numbers as a bitmap, with range operations a
//! word (64 pages) at a time: the run-level fault path asks "where is the
//! next page of this atom not mapped", "where is the next page not cached", "map every cached
//! page of this block" far more often than it looks at one page.

#[derive(Clone, Debug)]
pub struct Bits {
    words: Vec<u64>,
}

/// The bits of word `w` that fall in `[from, to)`.
fn mask(w: u64, from: u64, to: u64) -> u64 {
    let lo = from.max(w * 64) - w * 64;
    let hi = to.min(w * 64 + 64) - w * 64;
    let upper = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upper & !((1u64 << lo) - 1)
}

impl Bits {
    pub fn new(len: u64) -> Bits {
        Bits { words: vec![0; len.div_ceil(64) as usize] }
    }

    pub fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }

    pub fn set(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
    }

    /// Clears bit `i`; returns whether it was set.
    pub fn take(&mut self, i: u64) -> bool {
        let was = self.get(i);
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
        was
    }

    fn words_of(from: u64, to: u64) -> std::ops::Range<u64> {
        from / 64..to.div_ceil(64)
    }

    pub fn set_range(&mut self, from: u64, to: u64) {
        for w in Self::words_of(from, to) {
            self.words[w as usize] |= mask(w, from, to);
        }
    }

    pub fn clear_range(&mut self, from: u64, to: u64) {
        for w in Self::words_of(from, to) {
            self.words[w as usize] &= !mask(w, from, to);
        }
    }

    /// The first clear bit in `[from, to)`, or `to`.
    pub fn next_zero(&self, from: u64, to: u64) -> u64 {
        self.next(from, to, true)
    }

    /// The first set bit in `[from, to)`, or `to`.
    pub fn next_one(&self, from: u64, to: u64) -> u64 {
        self.next(from, to, false)
    }

    /// The last set bit in `[from, to)`.
    pub fn prev_one(&self, from: u64, to: u64) -> Option<u64> {
        for w in Self::words_of(from, to).rev() {
            let hit = self.words[w as usize] & mask(w, from, to);
            if hit != 0 {
                return Some(w * 64 + 63 - u64::from(hit.leading_zeros()));
            }
        }
        None
    }

    fn next(&self, from: u64, to: u64, zero: bool) -> u64 {
        for w in Self::words_of(from, to) {
            let word = if zero { !self.words[w as usize] } else { self.words[w as usize] };
            let hit = word & mask(w, from, to);
            if hit != 0 {
                return w * 64 + u64::from(hit.trailing_zeros());
            }
        }
        to
    }

    /// Sets, in `[from, to)`, every bit set in `yes` and clear in `no`;
    /// returns how many bits of `[from, to)` that selects (set before or
    /// not): `filemap_map_pages` maps every cached page of the block that
    /// is not marked PG_readahead, and counts each as a hit.
    pub fn set_where(&mut self, yes: &Bits, no: &Bits, from: u64, to: u64) -> u32 {
        let mut count = 0;
        for w in Self::words_of(from, to) {
            let w = w as usize;
            let pick = yes.words[w] & !no.words[w] & mask(w as u64, from, to);
            self.words[w] |= pick;
            count += pick.count_ones();
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    impl Bits {
        fn all(&self, from: u64, to: u64) -> bool {
            self.next_zero(from, to) == to
        }
    }

    #[test]
    fn ranges_across_word_boundaries() {
        let mut b = Bits::new(200);
        b.set_range(60, 130);
        assert!(b.all(60, 130) && !b.get(59) && !b.get(130));
        assert_eq!((b.next_one(0, 200), b.next_zero(60, 200)), (60, 130));
        b.clear_range(64, 128);
        assert_eq!((b.next_zero(60, 200), b.next_one(64, 200)), (64, 128));
        assert_eq!(b.next_one(64, 128), 128);
        assert_eq!((b.prev_one(0, 130), b.prev_one(0, 128), b.prev_one(61, 128)), (Some(129), Some(63), Some(63)));
        assert_eq!(b.prev_one(0, 60), None);
        assert!(b.all(5, 5));
        let mut yes = Bits::new(200);
        yes.set_range(0, 200);
        let mut no = Bits::new(200);
        no.set(100);
        let mut m = Bits::new(200);
        assert_eq!(m.set_where(&yes, &no, 96, 112), 15);
        assert!(m.all(96, 100) && !m.get(100) && m.all(101, 112) && !m.get(112));
        assert!(b.take(60) && !b.take(60));
    }
}
