//! A model of the kernel's two-list page reclaim for mapped file pages
//! (mm/vmscan.c and mm/workingset.c without MGLRU, as on this kernel):
//! - a faulted-in folio joins the inactive list, or the active list at once
//!   when it refaults within the working set (its refault distance, the
//!   evictions and activations since it left, is at most the active list);
//! - an access only sets the page-table accessed bit, and so does
//!   fault-around, which makes its entries young on x86;
//! - reclaim looks at the bits when it scans the inactive tail
//!   (`folio_check_references`): a folio with a young entry anywhere in it
//!   gets PG_referenced and, if it had it already, is activated, else goes
//!   round again; a folio with none is evicted. PG_referenced stays on an
//!   activated folio, so one deactivated and used again is activated on
//!   its next trip. `folio_referenced` counts the mappings that referenced
//!   the folio, not its young entries: llama.cpp maps the model once, so a
//!   large folio needs two trips as a page does;
//! - a reclaim (`try_to_free_mem_cgroup_pages`, when a charge would pass
//!   the limit) frees at least SWAP_CLUSTER_MAX (32) pages, scanning from
//!   DEF_PRIORITY (12) down each list's size shifted right by the
//!   priority, 32 pages at a time, the inactive list then the active one
//!   (`shrink_lruvec`), whole folios however few pages were asked
//!   (`isolate_lru_folios`). The active list is scanned, its tail moved
//!   to the inactive head, only while the inactive list is smaller (below
//!   1 GiB the ratio is 1, `inactive_is_low`) or after refaults were
//!   activated since the last reclaim (`prepare_scan_control`).
//!
//! Folios are activated and evicted whole. Under readahead its units are
//! pages, grouped in the folios readahead made ([`PageCache::read_in_folio`]);
//! on demand paging they are atoms, one folio each: an atom's pages share
//! their bits.

use super::{
    Misses,
    detail::Reads,
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

/// An evicted folio's shadow entry (mm/workingset.c): when it left, and
/// whether it had been active (PG_workingset).
#[derive(Clone, Copy)]
struct Shadow {
    age: u64,
    workingset: bool,
}

/// Per-folio state lives at the folio's first unit.
pub struct TwoList {
    res: Residency,
    inactive: RecencyList,
    active: RecencyList,
    /// Whether readahead reads large folios into this cache.
    large_folios: bool,
    /// The first unit of each unit's folio.
    folio: Vec<u32>,
    /// Units in the folio, at its first unit.
    folio_units: Vec<u32>,
    on: Vec<List>,
    /// Some page-table entry of the folio is young: set by an access or by
    /// fault-around, cleared by a scan.
    young: Vec<bool>,
    /// PG_referenced.
    referenced: Vec<bool>,
    /// PG_workingset: set when an active folio is deactivated, kept across
    /// a refault. The fault path's `mmap_miss` does not count such pages
    /// as hits.
    workingset: Vec<bool>,
    /// Per unit: a folio's shadow is left in every slot it covered.
    shadow: Vec<Option<Shadow>>,
    inactive_pages: u64,
    active_pages: u64,
    /// Evictions plus activations, in pages (`nonresident_age`).
    age: u64,
    /// Refaults activated (WORKINGSET_ACTIVATE_FILE), and their count at
    /// the last reclaim.
    refaults: u64,
    refaults_seen: u64,
    /// Pages one reclaim frees at least (SWAP_CLUSTER_MAX).
    cluster: u64,
    /// Units in a read in flight ([`PageCache::pin`]); a folio is pinned
    /// by its first unit.
    pinned: Vec<bool>,
    /// Pages of pinned folios on the inactive list: when they are all of
    /// it, a reclaim that does not deactivate changes nothing (see
    /// [`TwoList::futile`]).
    inactive_pinned: u64,
    /// Whether a futile reclaim is skipped (tests compare both).
    skip_futile: bool,
}

/// `SWAP_CLUSTER_MAX`: a reclaim's least target and its scan batch.
const SWAP_CLUSTER_MAX: u64 = 32;
/// Reclaim's first priority: it scans each list's size shifted right by
/// the priority, from this down to 0.
const DEF_PRIORITY: u32 = 12;

pub fn two_list_one_size(stream: &Stream, capacity: u64) -> Misses {
    two_list_one_size_into(stream, capacity, &mut ())
}

/// [`two_list_one_size`], telling `reads` which pages it reads.
pub fn two_list_one_size_into(stream: &Stream, capacity: u64, reads: &mut impl Reads) -> Misses {
    demand_paging(stream, &mut TwoList::new(stream.atom_pages.clone()), capacity, reads)
}

impl TwoList {
    /// Units of `sizes` pages, one folio each.
    pub fn new(sizes: Vec<u32>) -> TwoList {
        let n = sizes.len();
        TwoList {
            res: Residency::new(sizes),
            inactive: RecencyList::new(n),
            active: RecencyList::new(n),
            large_folios: false,
            folio: (0..n as u32).collect(),
            folio_units: vec![1; n],
            on: vec![List::Out; n],
            young: vec![false; n],
            referenced: vec![false; n],
            workingset: vec![false; n],
            shadow: vec![None; n],
            inactive_pages: 0,
            active_pages: 0,
            age: 0,
            refaults: 0,
            refaults_seen: 0,
            cluster: SWAP_CLUSTER_MAX,
            pinned: vec![false; n],
            inactive_pinned: 0,
            skip_futile: true,
        }
    }

    /// `pages` single pages, which readahead reads in large folios.
    pub fn with_large_folios(pages: usize) -> TwoList {
        TwoList { large_folios: true, ..TwoList::new(vec![1; pages]) }
    }

    /// Reclaims of at least `pages` pages: tests of the other rules on
    /// caches a few pages large use 1.
    #[cfg(test)]
    pub fn with_cluster(self, pages: u64) -> TwoList {
        TwoList { cluster: pages, ..self }
    }

    /// Every reclaim in full, even a futile one: the reference the
    /// shortcut must equal.
    #[cfg(test)]
    pub fn without_shortcut(self) -> TwoList {
        TwoList { skip_futile: false, ..self }
    }

    /// The inactive list's pinned pages change by `pages` if the folio at
    /// `head` is pinned.
    fn count_pinned(&mut self, head: u32, pages: u64, joins: bool) {
        if self.pinned[head as usize] {
            if joins {
                self.inactive_pinned += pages;
            } else {
                self.inactive_pinned -= pages;
            }
        }
    }

    /// A reclaim that can only rotate pinned folios: every inactive folio
    /// is in flight and the active list is not deactivated (no refault
    /// since the last reclaim, the inactive list not the smaller). The
    /// scan then goes round the inactive list once, each folio from the
    /// tail back to the head, and stops where it began (over its
    /// priorities it scans more pages than the list holds): the lists come
    /// out as they went in. Under a window larger than the
    /// inactive list this happened at every page read, each time the
    /// length of the list.
    fn futile(&self, refaulting: bool) -> bool {
        self.skip_futile
            && !refaulting
            && self.inactive_pages >= self.active_pages
            && self.inactive_pinned == self.inactive_pages
    }

    /// Resident pages of the folio at `head`.
    fn folio_pages(&self, head: u32) -> u64 {
        let h = head as usize;
        (h..h + self.folio_units[h] as usize).map(|u| u64::from(self.res.pages[u])).sum()
    }

    fn unlink(&mut self, head: u32) {
        let pages = self.folio_pages(head);
        match self.on[head as usize] {
            List::Inactive => {
                self.inactive.remove(head);
                self.inactive_pages -= pages;
                self.count_pinned(head, pages, false);
            }
            List::Active => {
                self.active.remove(head);
                self.active_pages -= pages;
            }
            List::Out => {}
        }
        self.on[head as usize] = List::Out;
    }

    /// The folio at `head`, just read in: the active list if it refaults
    /// within the working set, else the inactive list.
    fn insert(&mut self, head: u32, pages: u64) {
        let h = head as usize;
        let shadow = self.shadow[h].take();
        let refault = shadow.filter(|s| self.age - s.age <= self.active_pages);
        self.referenced[h] = false;
        self.young[h] = false;
        self.workingset[h] = refault.is_some_and(|s| s.workingset);
        if refault.is_some() {
            self.refaults += 1;
            self.activate(head, pages);
        } else {
            self.inactive.push_head(head);
            self.inactive_pages += pages;
            self.count_pinned(head, pages, true);
            self.on[h] = List::Inactive;
        }
    }

    fn activate(&mut self, head: u32, pages: u64) {
        self.active.push_head(head);
        self.active_pages += pages;
        self.on[head as usize] = List::Active;
        self.age += pages;
    }

    /// Evicts the folio at `head` whole, or, for a one-unit folio (an
    /// atom), up to `want` pages of it; returns the pages evicted.
    fn evict(&mut self, head: u32, want: u64, gone: &mut dyn FnMut(u32)) -> u64 {
        let h = head as usize;
        let units = self.folio_units[h] as usize;
        let shadow = Shadow { age: 0, workingset: self.workingset[h] };
        if units == 1 {
            let evicted = self.res.evict(head, want);
            self.age += evicted;
            self.shadow[h] = Some(Shadow { age: self.age, ..shadow });
            if self.res.pages[h] == 0 {
                self.on[h] = List::Out;
                self.workingset[h] = false;
                gone(head);
            }
            return evicted;
        }
        let mut evicted = 0;
        for u in h..h + units {
            evicted += self.res.evict(u as u32, u64::MAX);
        }
        self.age += evicted;
        for u in h..h + units {
            self.shadow[u] = Some(Shadow { age: self.age, ..shadow });
            self.folio[u] = u as u32;
            self.folio_units[u] = 1;
            gone(u as u32);
        }
        self.on[h] = List::Out;
        self.workingset[h] = false;
        evicted
    }
}

impl PageCache for TwoList {
    fn resident(&self, unit: u32) -> bool {
        self.res.whole(unit)
    }

    fn read_in(&mut self, unit: u32) -> u64 {
        let head = self.folio[unit as usize];
        debug_assert_eq!(head, unit, "only a whole folio leaves");
        self.unlink(unit);
        self.res.evict(unit, u64::MAX);
        let read = self.res.fill(unit);
        self.insert(unit, u64::from(self.res.size(unit)));
        read
    }

    fn folios(&self) -> bool {
        self.large_folios
    }

    fn read_in_folio(&mut self, first: u32, pages: u32) -> u64 {
        let (f, n) = (first as usize, pages as usize);
        let mut read = 0;
        for u in f..f + n {
            debug_assert!(self.on[u] == List::Out && self.folio[u] == u as u32);
            read += self.res.fill(u as u32);
            self.folio[u] = first;
            self.folio_units[u] = 1;
        }
        // The shadow the new folio finds: its first slot's.
        for u in f + 1..f + n {
            self.shadow[u] = None;
        }
        self.folio_units[f] = pages;
        self.insert(first, u64::from(pages));
        read
    }

    fn folio_of(&self, unit: u32) -> (u32, u32) {
        let head = self.folio[unit as usize];
        (head, self.folio_units[head as usize])
    }

    fn accessed(&mut self, unit: u32) {
        self.young[self.folio[unit as usize] as usize] = true;
    }

    fn prefaulted(&mut self, unit: u32) {
        self.accessed(unit);
    }

    fn touched(&mut self, unit: u32) {
        // Referenced once, then activated (mm/swap.c `folio_mark_accessed`):
        // a large folio is on its second page.
        let head = self.folio[unit as usize];
        let h = head as usize;
        if !std::mem::replace(&mut self.referenced[h], true) || self.on[h] != List::Inactive {
            return;
        }
        let pages = self.folio_pages(head);
        self.inactive.remove(head);
        self.inactive_pages -= pages;
        self.count_pinned(head, pages, false);
        self.activate(head, pages);
    }

    fn pin(&mut self, unit: u32) {
        if !std::mem::replace(&mut self.pinned[unit as usize], true) && self.on[unit as usize] == List::Inactive {
            self.inactive_pinned += self.folio_pages(unit);
        }
    }

    fn unpin(&mut self, unit: u32) {
        if std::mem::take(&mut self.pinned[unit as usize]) && self.on[unit as usize] == List::Inactive {
            self.inactive_pinned -= self.folio_pages(unit);
        }
    }

    fn workingset(&self, unit: u32) -> bool {
        self.workingset[self.folio[unit as usize] as usize]
    }

    fn shrink(&mut self, capacity: u64, pinned: &dyn Fn(u32) -> bool, gone: &mut dyn FnMut(u32)) {
        if self.res.total <= capacity {
            return;
        }
        // One memcg reclaim (`try_to_free_mem_cgroup_pages`): at least
        // SWAP_CLUSTER_MAX pages, from DEF_PRIORITY down.
        let target = (self.res.total - capacity).max(self.cluster);
        // Refaults activated since the last reclaim (`prepare_scan_control`;
        // `snapshot_refaults` at its end).
        let refaulting = std::mem::replace(&mut self.refaults_seen, self.refaults) != self.refaults;
        if self.futile(refaulting) {
            return;
        }
        let mut reclaim = Reclaim { target, reclaimed: 0, skipped: 0 };
        for priority in (0..=DEF_PRIORITY).rev() {
            // `shrink_lruvec`: both lists by their sizes, the active one
            // only if it may be deactivated (refaults, or `inactive_is_low`).
            let deactivate = refaulting || self.inactive_pages < self.active_pages;
            let mut inactive = self.inactive_pages >> priority;
            let mut active = if deactivate { self.active_pages >> priority } else { 0 };
            while inactive > 0 || active > 0 {
                let scan = inactive.min(self.cluster);
                inactive -= scan;
                if !self.shrink_inactive(scan, &mut reclaim, pinned, gone) {
                    return;
                }
                let scan = active.min(self.cluster);
                active -= scan;
                self.shrink_active(scan);
                if reclaim.reclaimed >= reclaim.target {
                    return;
                }
            }
        }
    }
}

/// One reclaim's progress.
struct Reclaim {
    target: u64,
    reclaimed: u64,
    /// Pinned pages met at the inactive tail.
    skipped: u64,
}

impl TwoList {
    /// `shrink_inactive_list`: folios off the inactive tail, whole, until
    /// `scan` pages (`isolate_lru_folios`) or the target; false when only
    /// pinned folios are left.
    fn shrink_inactive(
        &mut self,
        scan: u64,
        reclaim: &mut Reclaim,
        pinned: &dyn Fn(u32) -> bool,
        gone: &mut dyn FnMut(u32),
    ) -> bool {
        let mut scanned = 0;
        while scanned < scan && reclaim.reclaimed < reclaim.target {
            let Some(victim) = self.inactive.tail() else { return false };
            let v = victim as usize;
            let pages = self.folio_pages(victim);
            scanned += pages;
            if pinned(victim) {
                // Reclaim skips locked folios: back to the head, at most
                // once each per reclaim.
                reclaim.skipped += pages;
                if reclaim.skipped > self.inactive_pages {
                    return false;
                }
                self.inactive.push_head(victim);
                continue;
            }
            let young = std::mem::take(&mut self.young[v]);
            self.inactive.remove(victim);
            self.inactive_pages -= pages;
            if young {
                // `folio_check_references`: referenced again, activate;
                // else keep it one more round.
                if std::mem::replace(&mut self.referenced[v], true) {
                    self.activate(victim, pages);
                } else {
                    self.inactive.push_head(victim);
                    self.inactive_pages += pages;
                }
                continue;
            }
            self.referenced[v] = false;
            let evicted = self.evict(victim, reclaim.target - reclaim.reclaimed, gone);
            reclaim.reclaimed += evicted;
            if evicted < pages {
                // The rest of the atom stays at the tail.
                self.inactive.push_tail(victim);
                self.inactive_pages += pages - evicted;
            }
        }
        true
    }

    /// `shrink_active_list`: folios off the active tail, whole, until
    /// `scan` pages, to the inactive head. Their accessed bits are tested
    /// and cleared, but only executable file folios stay active for it;
    /// PG_referenced stays.
    fn shrink_active(&mut self, scan: u64) {
        let mut scanned = 0;
        while scanned < scan {
            let Some(victim) = self.active.tail() else { return };
            let pages = self.folio_pages(victim);
            scanned += pages;
            self.active.remove(victim);
            self.active_pages -= pages;
            self.young[victim as usize] = false;
            self.workingset[victim as usize] = true;
            self.inactive.push_head(victim);
            self.inactive_pages += pages;
            self.count_pinned(victim, pages, true);
            self.on[victim as usize] = List::Inactive;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{List, PageCache, TwoList};

    /// A 4-page folio (pages 0..4), then single pages 4..10: the folio is
    /// the inactive tail.
    fn folio_and_pages() -> TwoList {
        let mut cache = TwoList::with_large_folios(10).with_cluster(1);
        assert_eq!(cache.read_in_folio(0, 4), 4);
        assert_eq!((4..10).map(|p| cache.read_in(p)).sum::<u64>(), 6);
        cache
    }

    fn shrink_to(cache: &mut TwoList, capacity: u64) -> Vec<u32> {
        let mut gone = Vec::new();
        cache.shrink(capacity, &|_| false, &mut |u| gone.push(u));
        gone
    }

    #[test]
    fn a_folio_young_on_two_pages_needs_two_trips_like_a_page() {
        let mut cache = folio_and_pages();
        // Two young entries in the folio, one on each of pages 4..9, none
        // on page 9.
        for page in [0, 1, 4, 5, 6, 7, 8] {
            cache.accessed(page);
        }
        // `folio_referenced` counts mappings, not entries: the folio, like
        // the young pages, only gets PG_referenced; page 9 goes.
        assert_eq!(shrink_to(&mut cache, 9), [9]);
        assert!(cache.on[0] == List::Inactive && cache.referenced[0]);
        assert!(cache.on[4] == List::Inactive && cache.referenced[4]);
        // Young again at its next trip: activated whole; page 4, not young,
        // is evicted in spite of PG_referenced.
        cache.accessed(3);
        assert_eq!(shrink_to(&mut cache, 8), [4]);
        assert!(cache.on[0] == List::Active);
        assert_eq!((cache.active_pages, cache.inactive_pages), (4, 4));
        // Not young at its first trip: evicted whole.
        let mut cache = folio_and_pages();
        assert_eq!(shrink_to(&mut cache, 9), [0, 1, 2, 3]);
        assert!((0..4).all(|p| !cache.resident(p) && cache.folio_of(p) == (p, 1)));
    }

    #[test]
    fn refaults_make_reclaim_deactivate_though_the_inactive_list_is_not_low() {
        // Pages 0..4 active (marked accessed twice), 4..12 inactive.
        let setup = |refault: bool| {
            let mut cache = TwoList::new(vec![1; 12]).with_cluster(1);
            for page in 0..12 {
                cache.read_in(page);
            }
            for page in (0..4).chain(0..4) {
                cache.touched(page);
            }
            if refault {
                // Page 4 leaves and comes back within the active list's
                // distance: a refault, activated.
                assert_eq!(shrink_to(&mut cache, 11), [4]);
                cache.read_in(4);
                assert!(cache.on[4] == List::Active);
            }
            cache
        };
        let mut cache = setup(false);
        assert_eq!(shrink_to(&mut cache, 8), [4, 5, 6, 7]);
        assert!((0..4).all(|p| cache.on[p] == List::Active));
        // 5 active against 7 inactive pages, each scanned by its size
        // shifted by the priority: at 2 one page of each, at 1 three and
        // two, until 4 pages are evicted; the oldest active first.
        let mut cache = setup(true);
        assert_eq!(shrink_to(&mut cache, 8), [5, 6, 7, 8]);
        assert!((0..3).all(|p| cache.on[p] == List::Inactive && cache.workingset[p]));
        assert!((3..5).all(|p| cache.on[p] == List::Active));
    }

    #[test]
    fn a_reclaim_frees_swap_cluster_max_and_deactivates_whole_folios() {
        // A 4-page folio activated by MAP_POPULATE's walk, 64 single pages
        // inactive; with an activated refault since the last reclaim or not.
        let setup = |refault: bool| {
            let mut cache = TwoList::with_large_folios(68);
            cache.read_in_folio(0, 4);
            for page in 0..4 {
                cache.touched(page);
            }
            for page in 4..68 {
                cache.read_in(page);
            }
            if refault {
                cache.refaults += 1;
            }
            cache
        };
        // One page over the limit: one reclaim frees 32, the oldest.
        let oldest: Vec<u32> = (4..36).collect();
        let mut cache = setup(false);
        assert_eq!(shrink_to(&mut cache, 67), oldest);
        assert!(cache.on[0] == List::Active);
        // After a refault the active list is scanned too, by its size
        // shifted by the priority: from priority 2 on, one page, and the
        // scan takes the folio whole.
        let mut cache = setup(true);
        assert_eq!(shrink_to(&mut cache, 67), oldest);
        assert!(cache.on[0] == List::Inactive && cache.workingset[0]);
        assert_eq!((cache.active_pages, cache.inactive_pages), (0, 36));
    }

    #[test]
    fn map_populate_activates_large_folios_and_marks_single_pages_referenced() {
        let mut cache = folio_and_pages();
        // MAP_POPULATE's walk marks every page accessed: the folio twice.
        for page in 0..10 {
            cache.touched(page);
        }
        assert!(cache.on[0] == List::Active);
        assert!((4..10).all(|p| cache.on[p] == List::Inactive && cache.referenced[p]));
        // A single page young at its first trip is activated then.
        cache.accessed(4);
        assert_eq!(shrink_to(&mut cache, 9), [5]);
        assert!(cache.on[4] == List::Active);
    }
}
