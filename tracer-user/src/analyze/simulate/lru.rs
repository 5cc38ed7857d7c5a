//! LRU: every cache size at once from stack distances (Mattson et al. 1970),
//! counted with a Fenwick tree over access times (Olken 1981), and one size
//! at a time when readahead makes LRU no longer a stack algorithm.

use super::{Misses, detail::Reads, faults::PageCache, stream::Stream};
use crate::analyze::usage::PERIODS;

/// Pages missed at every cache size, per period.
pub struct LruCurve {
    /// Per period: `needed[c]` pages of accesses that hit only in a cache of
    /// at least `c` pages; the last slot holds first accesses (cold misses).
    needed: [Vec<u64>; 5],
    /// Per period, suffix sums of `needed`: pages missed at each size.
    missed_at: [Vec<u64>; 5],
}

impl LruCurve {
    pub fn new(stream: &Stream) -> LruCurve {
        let total = stream.total_pages() as usize;
        let cold = total + 1;
        let mut needed: [Vec<u64>; 5] = std::array::from_fn(|_| vec![0u64; total + 2]);
        let mut recency = Recency::new(stream.atom_pages.len());
        for (atom, period) in stream.iter() {
            let w = stream.atom_pages[atom as usize];
            let slot = match recency.access(atom, w) {
                Some(between) => (between + u64::from(w)) as usize,
                None => cold,
            };
            needed[period.index()][slot] += u64::from(w);
        }
        let missed_at = std::array::from_fn(|p| {
            let mut sums = vec![0u64; total + 2];
            let mut acc = 0u64;
            for c in (0..total + 2).rev() {
                // A cache of `c` pages misses what needs more than `c`.
                sums[c] = acc;
                acc += needed[p][c];
            }
            sums
        });
        LruCurve { needed, missed_at }
    }

    /// Pages missed by a cache of `capacity` pages.
    pub fn misses(&self, capacity: u64) -> Misses {
        let mut m = Misses::default();
        for p in PERIODS {
            let sums = &self.missed_at[p.index()];
            // Beyond every need only cold misses remain.
            let c = (capacity as usize).min(sums.len() - 2);
            m.pages[p.index()] = sums[c];
        }
        m
    }

    /// Pages read at least once: every cold miss.
    pub fn footprint(&self) -> u64 {
        self.needed.iter().map(|n| n[n.len() - 1]).sum()
    }

    /// The largest need of any re-read in `period`: the smallest cache that
    /// misses nothing but first reads there.
    pub fn max_need(&self, period: crate::analyze::usage::Period) -> u64 {
        let n = &self.needed[period.index()];
        n[..n.len() - 1].iter().rposition(|&p| p > 0).unwrap_or(0) as u64
    }
}

/// Each atom's last access, in access order, weighted by its pages: the
/// pages of the atoms read between two accesses of one are a range sum.
///
/// Only the last access of each atom is live, so the times are renumbered
/// (in order) whenever they run out: the tree stays a few times the number
/// of atoms, in cache, instead of one slot per access of the whole trace
/// (tens of millions on a long one, where the misses were most of
/// `simulate`).
struct Recency {
    tree: Fenwick,
    /// Per atom, the slot of its last access (`NONE`: not read yet).
    last: Vec<u32>,
    /// Per slot, the atom last read there (`NONE`: no live access).
    atom_at: Vec<u32>,
    weight_at: Vec<u32>,
    now: usize,
}

const NONE: u32 = u32::MAX;

impl Recency {
    fn new(atoms: usize) -> Recency {
        let slots = (4 * atoms).max(1024);
        Recency {
            tree: Fenwick::new(slots),
            last: vec![NONE; atoms],
            atom_at: vec![NONE; slots],
            weight_at: vec![0; slots],
            now: 0,
        }
    }

    /// Reads `atom` of `w` pages now: the pages of the other atoms read
    /// since its last read, or `None` on its first.
    fn access(&mut self, atom: u32, w: u32) -> Option<u64> {
        if self.now == self.atom_at.len() {
            self.renumber();
        }
        let prev = self.last[atom as usize];
        let between = (prev != NONE).then(|| {
            let prev = prev as usize;
            let between = self.tree.prefix(self.now) - self.tree.prefix(prev + 1);
            self.tree.add(prev, -i64::from(self.weight_at[prev]));
            self.atom_at[prev] = NONE;
            between
        });
        self.tree.add(self.now, i64::from(w));
        (self.atom_at[self.now], self.weight_at[self.now]) = (atom, w);
        self.last[atom as usize] = self.now as u32;
        self.now += 1;
        between
    }

    /// Moves the live accesses to the first slots, keeping their order.
    fn renumber(&mut self) {
        let slots = self.atom_at.len();
        let live: Vec<(u32, u32)> =
            (0..slots).filter(|&s| self.atom_at[s] != NONE).map(|s| (self.atom_at[s], self.weight_at[s])).collect();
        self.tree.0.fill(0);
        self.atom_at.fill(NONE);
        for (slot, &(atom, w)) in live.iter().enumerate() {
            self.tree.add(slot, i64::from(w));
            (self.atom_at[slot], self.weight_at[slot]) = (atom, w);
            self.last[atom as usize] = slot as u32;
        }
        self.now = live.len();
    }
}

/// Sums of `u64` weights over access times.
struct Fenwick(Vec<u64>);

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick(vec![0; n + 1])
    }

    fn add(&mut self, i: usize, delta: i64) {
        let mut i = i + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum over `[0, i)`.
    fn prefix(&self, i: usize) -> u64 {
        let mut i = i;
        let mut s = 0u64;
        while i > 0 {
            s = s.wrapping_add(self.0[i]);
            i &= i - 1;
        }
        s
    }
}

/// Atoms in recency order, most recent at the head: an intrusive doubly
/// linked list over atom ids, so moving one is O(1).
pub struct RecencyList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    linked: Vec<bool>,
}

const NIL: u32 = u32::MAX;

impl RecencyList {
    pub fn new(atoms: usize) -> RecencyList {
        RecencyList { prev: vec![NIL; atoms], next: vec![NIL; atoms], head: NIL, tail: NIL, linked: vec![false; atoms] }
    }

    pub fn contains(&self, atom: u32) -> bool {
        self.linked[atom as usize]
    }

    pub fn remove(&mut self, atom: u32) {
        let a = atom as usize;
        if !self.linked[a] {
            return;
        }
        let (p, n) = (self.prev[a], self.next[a]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n as usize] = p
        }
        self.linked[a] = false;
    }

    pub fn push_head(&mut self, atom: u32) {
        self.remove(atom);
        let a = atom as usize;
        self.prev[a] = NIL;
        self.next[a] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = atom;
        } else {
            self.tail = atom;
        }
        self.head = atom;
        self.linked[a] = true;
    }

    pub fn push_tail(&mut self, atom: u32) {
        self.remove(atom);
        let a = atom as usize;
        self.next[a] = NIL;
        self.prev[a] = self.tail;
        if self.tail != NIL {
            self.next[self.tail as usize] = atom;
        } else {
            self.head = atom;
        }
        self.tail = atom;
        self.linked[a] = true;
    }

    pub fn tail(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }
}

/// Resident pages per atom and in total, for the one-size simulations.
pub struct Residency {
    /// Pages of each atom.
    sizes: Vec<u32>,
    pub pages: Vec<u32>,
    pub total: u64,
}

impl Residency {
    pub fn new(sizes: Vec<u32>) -> Residency {
        Residency { pages: vec![0; sizes.len()], sizes, total: 0 }
    }

    /// Brings `atom` in whole; returns the pages read.
    pub fn fill(&mut self, atom: u32) -> u64 {
        let w = self.sizes[atom as usize];
        let read = u64::from(w - self.pages[atom as usize]);
        self.pages[atom as usize] = w;
        self.total += read;
        read
    }

    /// Evicts up to `want` pages of `atom`; returns the pages evicted.
    pub fn evict(&mut self, atom: u32, want: u64) -> u64 {
        let have = u64::from(self.pages[atom as usize]);
        let gone = have.min(want);
        self.pages[atom as usize] -= gone as u32;
        self.total -= gone;
        gone
    }

    pub fn whole(&self, atom: u32) -> bool {
        self.pages[atom as usize] == self.sizes[atom as usize]
    }

    pub fn size(&self, atom: u32) -> u32 {
        self.sizes[atom as usize]
    }
}

/// LRU with a cache of `capacity` pages, one size at a time: the page-level
/// replay of the kernel's fault path drives it through [`PageCache`].
pub struct Lru {
    list: RecencyList,
    res: Residency,
}

impl Lru {
    pub fn new(sizes: Vec<u32>) -> Lru {
        Lru { list: RecencyList::new(sizes.len()), res: Residency::new(sizes) }
    }
}

impl PageCache for Lru {
    fn resident(&self, unit: u32) -> bool {
        self.res.whole(unit)
    }

    fn read_in(&mut self, unit: u32) -> u64 {
        // An atom not wholly resident misses whole, as its pages would under
        // page LRU (they share one stack distance).
        self.res.evict(unit, u64::MAX);
        let read = self.res.fill(unit);
        self.list.push_head(unit);
        read
    }

    fn accessed(&mut self, unit: u32) {
        self.list.push_head(unit);
    }

    fn workingset(&self, _unit: u32) -> bool {
        false
    }

    fn shrink(&mut self, capacity: u64, pinned: &dyn Fn(u32) -> bool, gone: &mut dyn FnMut(u32)) {
        while self.res.total > capacity {
            // Pages in flight were read last, so they are the newest: a
            // pinned tail means nothing else is left.
            let Some(victim) = self.list.tail().filter(|&v| !pinned(v)) else { break };
            let excess = self.res.total - capacity;
            self.res.evict(victim, excess);
            if self.res.pages[victim as usize] == 0 {
                self.list.remove(victim);
                gone(victim);
            }
        }
    }
}

/// LRU on atoms, one size: the cross-check of the stack-distance curve.
#[cfg(test)]
pub fn lru_one_size(stream: &Stream, capacity: u64) -> Misses {
    lru_one_size_into(stream, capacity, &mut ())
}

/// [`lru_one_size`], telling `reads` which pages it reads: the curve has
/// every size's totals but not which pages.
pub fn lru_one_size_into(stream: &Stream, capacity: u64, reads: &mut impl Reads) -> Misses {
    demand_paging(stream, &mut Lru::new(stream.atom_pages.clone()), capacity, reads)
}

/// Replays `stream` on `cache` reading only what is accessed (no
/// readahead), at atom granularity; `reads` is told the pages read (an
/// atom's last ones: a partial eviction keeps its first).
pub fn demand_paging(stream: &Stream, cache: &mut impl PageCache, capacity: u64, reads: &mut impl Reads) -> Misses {
    let mut misses = Misses::default();
    for (atom, period) in stream.iter() {
        if !cache.resident(atom) {
            let read = cache.read_in(atom);
            let end = stream.atom_first[atom as usize] + u64::from(stream.atom_pages[atom as usize]);
            reads.read(period, end - read, read);
            misses.pages[period.index()] += read;
        }
        cache.accessed(atom);
        cache.shrink(capacity, &|_| false, &mut |_| {});
    }
    misses
}
