//! A model of the kernel's two-list page reclaim for mapped file pages
//! (mm/vmscan.c and mm/workingset.c without MGLRU, as on this kernel):
//! - a faulted-in page joins the inactive list, or the active list at once
//!   when it refaults within the working set (its refault distance, the
//!   evictions and activations since it left, is at most the active list);
//! - an access only sets the page-table accessed bit; reclaim looks at it
//!   when it scans the inactive tail: referenced once, the page gets
//!   PG_referenced and another round; referenced again, it is activated;
//!   not referenced, it is evicted;
//! - while the inactive list is smaller than the active one (below 1 GiB
//!   the ratio is 1), the active tail is moved to the inactive head.
//!
//! It runs at atom granularity: an atom's pages share their bits.

use super::{
    Misses,
    lru::{RecencyList, Residency},
    stream::Stream,
};

#[derive(Clone, Copy, PartialEq)]
enum List {
    Out,
    Inactive,
    Active,
}

struct Lists {
    inactive: RecencyList,
    active: RecencyList,
    on: Vec<List>,
    /// Page-table accessed bit, set by every access, cleared by a scan.
    young: Vec<bool>,
    /// PG_referenced.
    referenced: Vec<bool>,
    /// `age` when the atom was last evicted (its shadow entry).
    shadow: Vec<Option<u64>>,
    inactive_pages: u64,
    active_pages: u64,
    /// Evictions plus activations, in pages (`nonresident_age`).
    age: u64,
}

pub fn two_list_one_size(stream: &Stream, capacity: u64) -> Misses {
    let n = stream.atom_pages.len();
    let mut misses = Misses::default();
    let mut res = Residency::new(n);
    let mut l = Lists {
        inactive: RecencyList::new(n),
        active: RecencyList::new(n),
        on: vec![List::Out; n],
        young: vec![false; n],
        referenced: vec![false; n],
        shadow: vec![None; n],
        inactive_pages: 0,
        active_pages: 0,
        age: 0,
    };
    for (atom, period) in stream.iter() {
        if !res.whole(atom, stream) {
            let mut read = res.read_ahead(atom, stream, |other| l.insert(other, stream));
            l.unlink(atom, &res);
            res.evict(atom, u64::MAX);
            read += res.fill(atom, stream);
            l.insert(atom, stream);
            misses.pages[period.index()] += read;
        }
        l.young[atom as usize] = true;
        l.reclaim(&mut res, capacity);
    }
    misses
}

impl Lists {
    fn unlink(&mut self, atom: u32, res: &Residency) {
        let pages = u64::from(res.pages[atom as usize]);
        match self.on[atom as usize] {
            List::Inactive => {
                self.inactive.remove(atom);
                self.inactive_pages -= pages;
            }
            List::Active => {
                self.active.remove(atom);
                self.active_pages -= pages;
            }
            List::Out => {}
        }
        self.on[atom as usize] = List::Out;
    }

    /// A page read in: the active list if it refaults within the working
    /// set, else the inactive list.
    fn insert(&mut self, atom: u32, stream: &Stream) {
        let a = atom as usize;
        let pages = u64::from(stream.atom_pages[a]);
        let refault = self.shadow[a].take().is_some_and(|evicted| self.age - evicted <= self.active_pages);
        self.referenced[a] = false;
        if refault {
            self.activate(atom, pages);
        } else {
            self.inactive.push_head(atom);
            self.inactive_pages += pages;
            self.on[a] = List::Inactive;
        }
    }

    fn activate(&mut self, atom: u32, pages: u64) {
        self.active.push_head(atom);
        self.active_pages += pages;
        self.on[atom as usize] = List::Active;
        self.age += pages;
    }

    fn reclaim(&mut self, res: &mut Residency, capacity: u64) {
        while res.total > capacity {
            if self.inactive_pages < self.active_pages
                && let Some(victim) = self.active.tail()
            {
                // Deactivate: the accessed bit is tested and cleared, but only
                // executable file pages stay active for it.
                let pages = u64::from(res.pages[victim as usize]);
                self.active.remove(victim);
                self.active_pages -= pages;
                self.young[victim as usize] = false;
                self.inactive.push_head(victim);
                self.inactive_pages += pages;
                self.on[victim as usize] = List::Inactive;
                continue;
            }
            let Some(victim) = self.inactive.tail() else { break };
            let v = victim as usize;
            let pages = u64::from(res.pages[v]);
            let young = std::mem::take(&mut self.young[v]);
            let referenced = std::mem::take(&mut self.referenced[v]);
            self.inactive.remove(victim);
            self.inactive_pages -= pages;
            if young && referenced {
                self.activate(victim, pages);
            } else if young {
                self.referenced[v] = true;
                self.inactive.push_head(victim);
                self.inactive_pages += pages;
            } else {
                let gone = res.evict(victim, res.total - capacity);
                self.age += gone;
                self.shadow[v] = Some(self.age);
                if res.pages[v] > 0 {
                    // The rest of the atom stays at the tail.
                    self.inactive.push_tail(victim);
                    self.inactive_pages += pages - gone;
                } else {
                    self.on[v] = List::Out;
                }
            }
        }
    }
}
