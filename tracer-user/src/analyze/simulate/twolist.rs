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
    faults::PageCache,
    lru::{RecencyList, Residency, demand_paging},
    stream::Stream,
};

#[derive(Clone, Copy, PartialEq)]
enum List {
    Out,
    Inactive,
    Active,
}

/// An evicted atom's shadow entry (mm/workingset.c): when it left, and
/// whether it had been active (PG_workingset).
#[derive(Clone, Copy)]
struct Shadow {
    age: u64,
    workingset: bool,
}

pub struct TwoList {
    res: Residency,
    inactive: RecencyList,
    active: RecencyList,
    on: Vec<List>,
    /// Page-table accessed bit, set by every access, cleared by a scan.
    young: Vec<bool>,
    /// PG_referenced.
    referenced: Vec<bool>,
    /// PG_workingset: set when an active page is deactivated, kept across
    /// a refault. The fault path's `mmap_miss` does not count such pages
    /// as hits.
    workingset: Vec<bool>,
    shadow: Vec<Option<Shadow>>,
    inactive_pages: u64,
    active_pages: u64,
    /// Evictions plus activations, in pages (`nonresident_age`).
    age: u64,
}

pub fn two_list_one_size(stream: &Stream, capacity: u64) -> Misses {
    demand_paging(stream, &mut TwoList::new(stream.atom_pages.clone()), capacity)
}

impl TwoList {
    pub fn new(sizes: Vec<u32>) -> TwoList {
        let n = sizes.len();
        TwoList {
            res: Residency::new(sizes),
            inactive: RecencyList::new(n),
            active: RecencyList::new(n),
            on: vec![List::Out; n],
            young: vec![false; n],
            referenced: vec![false; n],
            workingset: vec![false; n],
            shadow: vec![None; n],
            inactive_pages: 0,
            active_pages: 0,
            age: 0,
        }
    }

    fn unlink(&mut self, atom: u32) {
        let pages = u64::from(self.res.pages[atom as usize]);
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
    fn insert(&mut self, atom: u32) {
        let a = atom as usize;
        let pages = u64::from(self.res.size(atom));
        let shadow = self.shadow[a].take();
        let refault = shadow.filter(|s| self.age - s.age <= self.active_pages);
        self.referenced[a] = false;
        self.workingset[a] = refault.is_some_and(|s| s.workingset);
        if refault.is_some() {
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
}

impl PageCache for TwoList {
    fn resident(&self, unit: u32) -> bool {
        self.res.whole(unit)
    }

    fn read_in(&mut self, unit: u32) -> u64 {
        self.unlink(unit);
        self.res.evict(unit, u64::MAX);
        let read = self.res.fill(unit);
        self.insert(unit);
        read
    }

    fn accessed(&mut self, unit: u32) {
        self.young[unit as usize] = true;
    }

    fn workingset(&self, unit: u32) -> bool {
        self.workingset[unit as usize]
    }

    fn shrink(&mut self, capacity: u64, pinned: &dyn Fn(u32) -> bool, gone: &mut dyn FnMut(u32)) {
        let res = &mut self.res;
        // Pinned pages met at the inactive tail go back to its head (reclaim
        // skips locked folios), at most once each per call.
        let mut skipped = 0u64;
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
                self.workingset[victim as usize] = true;
                self.inactive.push_head(victim);
                self.inactive_pages += pages;
                self.on[victim as usize] = List::Inactive;
                continue;
            }
            let Some(victim) = self.inactive.tail() else { break };
            let v = victim as usize;
            let pages = u64::from(res.pages[v]);
            if pinned(victim) {
                skipped += pages;
                if skipped > self.inactive_pages {
                    break;
                }
                self.inactive.push_head(victim);
                continue;
            }
            let young = std::mem::take(&mut self.young[v]);
            let referenced = std::mem::take(&mut self.referenced[v]);
            self.inactive.remove(victim);
            self.inactive_pages -= pages;
            if young && referenced {
                self.active.push_head(victim);
                self.active_pages += pages;
                self.on[v] = List::Active;
                self.age += pages;
            } else if young {
                self.referenced[v] = true;
                self.inactive.push_head(victim);
                self.inactive_pages += pages;
            } else {
                let evicted = res.evict(victim, res.total - capacity);
                self.age += evicted;
                self.shadow[v] = Some(Shadow { age: self.age, workingset: self.workingset[v] });
                if res.pages[v] > 0 {
                    // The rest of the atom stays at the tail.
                    self.inactive.push_tail(victim);
                    self.inactive_pages += pages - evicted;
                } else {
                    self.on[v] = List::Out;
                    self.workingset[v] = false;
                    gone(victim);
                }
            }
        }
    }
}
