//! Belady's OPT (1966): on a miss, evict what is read again furthest in the
//! future. No policy that reads only on demand misses less, and prefetching
//! cannot read fewer pages either, so OPT is the floor for any page cache of
//! that size. Here the page just read may go too (MIN with bypass), which
//! keeps the replay exact at atom granularity and the floor a floor.

use std::{cmp::Reverse, collections::BinaryHeap};

use super::{Misses, detail::Reads, lru::Residency, stream::Stream};

const NEVER: u32 = u32::MAX;

/// For every access, when its atom is read next (`NEVER` if not again),
/// computed backwards once and shared by every size.
pub fn next_uses(stream: &Stream) -> Vec<u32> {
    let mut next = vec![NEVER; stream.accesses.len()];
    let mut seen = vec![NEVER; stream.atom_pages.len()];
    for (t, &atom) in stream.accesses.iter().enumerate().rev() {
        next[t] = seen[atom as usize];
        seen[atom as usize] = t as u32;
    }
    next
}

/// OPT with a cache of `capacity` pages, where a page just read may be the
/// one dropped (Belady's MIN with bypass): a floor at or below classic OPT,
/// which must keep it, so below every policy a page cache can run. Pages
/// of one atom are read in order, so the furthest-used are its last ones:
/// evicting part of an atom keeps its first pages, and its next read
/// misses the rest.
pub fn opt_one_size(stream: &Stream, next: &[u32], capacity: u64) -> Misses {
    opt_one_size_into(stream, next, capacity, &mut ())
}

/// [`opt_one_size`], telling `reads` which pages it reads: an atom's last
/// ones, those a partial eviction took.
pub fn opt_one_size_into(stream: &Stream, next: &[u32], capacity: u64, reads: &mut impl Reads) -> Misses {
    let mut misses = Misses::default();
    let mut res = Residency::new(stream.atom_pages.clone());
    // Resident atoms by next use, furthest first; an entry is stale when the
    // atom was read again since (its `next_of` moved).
    let mut heap: BinaryHeap<(u32, Reverse<u32>)> = BinaryHeap::new();
    let mut next_of = vec![NEVER; stream.atom_pages.len()];
    for (t, (atom, period)) in stream.iter().enumerate() {
        let kept = u64::from(res.pages[atom as usize]);
        let read = res.fill(atom);
        reads.read(period, stream.atom_first[atom as usize] + kept, read);
        misses.pages[period.index()] += read;
        next_of[atom as usize] = next[t];
        heap.push((next[t], Reverse(atom)));
        while res.total > capacity {
            let Some((when, Reverse(victim))) = heap.pop() else { break };
            if next_of[victim as usize] != when || res.pages[victim as usize] == 0 {
                continue;
            }
            res.evict(victim, res.total - capacity);
            if res.pages[victim as usize] > 0 {
                heap.push((when, Reverse(victim)));
            }
        }
    }
    misses
}
