//! The kernel's fault path for a read-only file mapping, page by page, as
//! Linux 6.18 runs it (mm/memory.c `do_read_fault`, mm/filemap.c
//! `filemap_map_pages`, `filemap_fault`, `do_sync_mmap_readahead`,
//! `do_async_mmap_readahead`; mm/readahead.c `page_cache_async_ra`):
//!
//! - A fault first maps what is cached around it (fault-around: the aligned
//!   `fault_around_bytes` block, 64 KiB), skipping pages marked
//!   PG_readahead. Every cached page it finds that is not PG_workingset
//!   takes one off the file's `mmap_miss`.
//! - A page not cached is a major fault: `mmap_miss` goes up by one; while
//!   it is at most `MMAP_LOTSAMISS` (100), the kernel reads around the fault
//!   (`ra_pages` centred on it, whatever of it is not cached, marking the
//!   page `ra_pages / 4` before the window's end); above, the page alone.
//! - A cached page that fault-around left unmapped (the marked one) is
//!   found by `filemap_fault`: `mmap_miss` goes down by one and the mark
//!   starts asynchronous readahead: the next `ra_pages` window when the
//!   mark is where the file's readahead state expects it (the window
//!   slides on, so a sequential scan streams), else from the first page
//!   not cached after it.
//!
//! `ra_pages` is the file's: the device's `read_ahead_kb`, doubled by
//! `posix_fadvise(POSIX_FADV_SEQUENTIAL)`, which llama.cpp calls on the
//! model before mapping it (llama-mmap.cpp). Checked on this VM with the
//! `readahead:page_cache_*` tracepoints: `ra_pages=4096` (16 MiB) for
//! `read_ahead_kb` 8192.
//!
//! A window never evicts its own pages: they are locked until their read
//! completes, and readahead allocates with `__GFP_NORETRY`, so under a
//! memory cgroup's limit the window stops when the cache holds nothing
//! else (then the faulting page, if not yet read, is read alone).
//!
//! Large folios: a cache that asks for them ([`PageCache::folios`], the
//! two-list model) gets the windows cut as mm/readahead.c
//! `page_cache_ra_order` cuts them: read-around in single pages
//! (order 0), each asynchronous window two orders above the folio that
//! carried its mark, capped at 2 MiB (order 9) and at the window's `ilog2`,
//! aligned in the file; where a folio would overlap a cached page,
//! the rest of the window is read in single pages (`do_page_cache_ra`). The
//! whole folio carries PG_readahead. LRU replays single pages.
//!
//! This is the straightforward replay, the reference: LRU runs the same
//! path run by run in [`super::lru_faults`].

use super::{Misses, detail::Reads, stream::Stream};
use crate::analyze::usage::Period;

/// `MMAP_LOTSAMISS`: above this many net misses the kernel stops reading
/// around faults in the file.
pub(super) const LOTS_OF_MISSES: u32 = 100;
/// `mmap_miss` saturates at ten times that.
pub(super) const MISS_CAP: u32 = LOTS_OF_MISSES * 10;
/// The page cache's largest folio on x86-64: a PMD, 2 MiB.
const MAX_FOLIO_ORDER: u32 = 9;

/// The kernel's readahead sizes, in pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The file's `ra_pages`: the read-around window and the async step.
    pub pages: u64,
    /// `fault_around_bytes` in pages.
    pub fault_around: u64,
}

/// A replacement policy seen from the fault path: units are atoms (whole
/// runs of pages) or, under readahead, single pages.
pub trait PageCache {
    fn resident(&self, unit: u32) -> bool;
    /// Reads `unit` in; returns the pages read.
    fn read_in(&mut self, unit: u32) -> u64;
    /// The task touched the mapped `unit`.
    fn accessed(&mut self, unit: u32);
    /// PG_workingset: `mmap_miss` does not count it as a hit.
    fn workingset(&self, unit: u32) -> bool;
    /// Whether readahead should read this cache's windows in large folios.
    fn folios(&self) -> bool {
        false
    }
    /// Reads the folio of `pages` pages from `first` in (none of them
    /// cached); returns the pages read.
    fn read_in_folio(&mut self, first: u32, pages: u32) -> u64 {
        (first..first + pages).map(|p| self.read_in(p)).sum()
    }
    /// The first page of the folio `unit` belongs to, and its pages.
    fn folio_of(&self, unit: u32) -> (u32, u32) {
        (unit, 1)
    }
    /// Fault-around mapped `unit` without the task touching it. On x86 such
    /// page-table entries are made young (`arch_wants_old_prefaulted_pte`
    /// is false; mm/memory.c `set_pte_range`).
    fn prefaulted(&mut self, _unit: u32) {}
    /// `unit` is in a read in flight, until [`PageCache::unpin`]: the
    /// `pinned` of [`PageCache::shrink`], for a cache that counts them.
    fn pin(&mut self, _unit: u32) {}
    fn unpin(&mut self, _unit: u32) {}
    /// `folio_mark_accessed` on `unit`: MAP_POPULATE's page walk (mm/gup.c,
    /// `FOLL_TOUCH`) calls it on every page it maps.
    fn touched(&mut self, _unit: u32) {}
    /// Evicts until `capacity` pages remain, telling `gone` each unit that
    /// left; `pinned` units (a read in flight) stay. Stops early when only
    /// pinned units are left.
    fn shrink(&mut self, capacity: u64, pinned: &dyn Fn(u32) -> bool, gone: &mut dyn FnMut(u32));
}

/// One file's `struct file_ra_state`.
#[derive(Clone, Copy, Default)]
pub(super) struct FileRa {
    pub start: u64,
    pub size: u64,
    pub async_size: u64,
    pub mmap_miss: u32,
    /// The folio order readahead asks for (large folios only).
    pub order: u32,
}

impl FileRa {
    /// The read-around window of `window` pages centred on `page`.
    pub(super) fn around(self, page: u64, window: u64, file_start: u64) -> FileRa {
        let start = page.saturating_sub(window / 2).max(file_start);
        FileRa { start, size: window, async_size: window / 4, order: 0, ..self }
    }

    /// The window asynchronous readahead reads from the marked `page`, or
    /// none; `first_missing`: the first page after it, within `window`,
    /// not cached.
    pub(super) fn after_mark(
        self,
        page: u64,
        window: u64,
        first_missing: impl FnOnce() -> Option<u64>,
    ) -> Option<FileRa> {
        let next = if page == self.start + self.size - self.async_size {
            // Where a sequential reader hits it: slide the window on.
            FileRa { start: self.start + self.size, size: next_size(self.size, window), ..self }
        } else {
            // Any other reader: from the first page not cached after it.
            let start = first_missing()?;
            FileRa { start, size: next_size(start - page + window, window), ..self }
        };
        Some(FileRa { async_size: next.size, ..next })
    }
}

struct FaultPath<'a, C: PageCache, R: Reads> {
    cache: &'a mut C,
    /// Told every page read, and the period of the access that read it.
    reads: &'a mut R,
    period: Period,
    capacity: u64,
    ra: Window,
    files: &'a [std::ops::Range<u64>],
    file_ra: Vec<FileRa>,
    /// In the task's page tables.
    mapped: Vec<bool>,
    /// PG_readahead.
    marked: Vec<bool>,
    /// Pages the current readahead window read: locked until it is done.
    in_flight: Vec<u32>,
    /// The same by page, looked up at every folio reclaim scans.
    locked: Vec<bool>,
}

/// Replays `stream` page by page through the fault path on `cache` (whose
/// units must be pages), `capacity` pages large.
pub fn replay(stream: &Stream, ra: Window, cache: &mut impl PageCache, capacity: u64) -> Misses {
    replay_into(stream, ra, cache, capacity, &mut ())
}

/// [`replay`], telling `reads` which pages it reads.
pub fn replay_into(
    stream: &Stream,
    ra: Window,
    cache: &mut impl PageCache,
    capacity: u64,
    reads: &mut impl Reads,
) -> Misses {
    let pages = stream.files.last().map_or(0, |f| f.end) as usize;
    let mut path = FaultPath {
        cache,
        reads,
        period: Period::Load,
        capacity,
        ra,
        files: &stream.files,
        file_ra: vec![FileRa::default(); stream.files.len()],
        mapped: vec![false; pages],
        marked: vec![false; pages],
        in_flight: Vec::new(),
        locked: vec![false; pages],
    };
    let mut misses = Misses::default();
    for (atom, period) in stream.iter() {
        path.period = period;
        let first = stream.atom_first[atom as usize];
        for page in first..first + u64::from(stream.atom_pages[atom as usize]) {
            let page = page as u32;
            if !path.mapped[page as usize] {
                misses.pages[period.index()] += path.fault(page);
            }
            // A cache too small for one page keeps nothing: the next access
            // faults again.
            if path.mapped[page as usize] {
                path.cache.accessed(page);
                if period == Period::Load {
                    path.cache.touched(page);
                }
            }
        }
    }
    misses
}

impl<C: PageCache, R: Reads> FaultPath<'_, C, R> {
    fn file_of(&self, page: u32) -> usize {
        self.files.partition_point(|f| f.end <= u64::from(page))
    }

    /// A fault on the unmapped `page`; maps it and returns the pages read.
    fn fault(&mut self, page: u32) -> u64 {
        let file = self.file_of(page);
        self.fault_around(page, file);
        if self.mapped[page as usize] {
            return 0;
        }
        let mut read = 0;
        if self.cache.resident(page) {
            // Fault-around skipped it: marked PG_readahead.
            let ra = &mut self.file_ra[file];
            ra.mmap_miss = ra.mmap_miss.saturating_sub(1);
            if self.marked[page as usize] {
                read += self.async_readahead(page, file);
            }
        } else {
            let ra = &mut self.file_ra[file];
            ra.mmap_miss = (ra.mmap_miss + 1).min(MISS_CAP);
            read += if ra.mmap_miss > LOTS_OF_MISSES || self.ra.pages == 0 {
                self.read(page)
            } else {
                self.read_around(page, file)
            };
            if !self.cache.resident(page) {
                read += self.read(page);
            }
        }
        self.unmark(page);
        self.mapped[page as usize] = self.cache.resident(page);
        read
    }

    /// Clears PG_readahead: on the folio holding `page`.
    fn unmark(&mut self, page: u32) {
        let (first, pages) = self.cache.folio_of(page);
        for p in first..first + pages {
            self.marked[p as usize] = false;
        }
    }

    /// `filemap_map_pages` over the aligned fault-around block.
    fn fault_around(&mut self, page: u32, file: usize) {
        let span = &self.files[file];
        let block = self.ra.fault_around.max(1);
        let from = (u64::from(page) - span.start) / block * block + span.start;
        let mut hits = 0;
        for p in from..(from + block).min(span.end) {
            let p = p as usize;
            if !self.cache.resident(p as u32) || self.marked[p] {
                continue;
            }
            if !std::mem::replace(&mut self.mapped[p], true) {
                self.cache.prefaulted(p as u32);
            }
            if !self.cache.workingset(p as u32) {
                hits += 1;
            }
        }
        let ra = &mut self.file_ra[file];
        ra.mmap_miss = ra.mmap_miss.saturating_sub(hits);
    }

    /// `do_sync_mmap_readahead`'s read-around.
    fn read_around(&mut self, page: u32, file: usize) -> u64 {
        self.file_ra[file] = self.file_ra[file].around(u64::from(page), self.ra.pages, self.files[file].start);
        self.read_window(file)
    }

    /// `page_cache_async_ra`, from the marked `page`.
    fn async_readahead(&mut self, page: u32, file: usize) -> u64 {
        let (window, end) = (self.ra.pages, self.files[file].end);
        let page = u64::from(page);
        let cache = &*self.cache;
        let first_missing = || (page + 1..(page + 1 + window).min(end)).find(|&p| !cache.resident(p as u32));
        let ra = self.file_ra[file];
        // With folios the kernel expects the fault on the marked folio's
        // first page (`round_down(mark, 1 << order)`).
        let (first, pages) = self.cache.folio_of(page as u32);
        let mark = ra.start + ra.size - ra.async_size;
        let at = if pages > 1 && page == u64::from(first) && (u64::from(first)..page + u64::from(pages)).contains(&mark)
        {
            mark
        } else {
            page
        };
        let Some(mut next) = ra.after_mark(at, window, first_missing) else { return 0 };
        if self.cache.folios() {
            // Two orders above the marked folio's, the window's end aligned
            // to that order where that leaves something (6.18
            // `page_cache_async_ra`).
            next.order = pages.ilog2() + 2;
            let file_start = self.files[file].start;
            let align = 1u64 << next.order.min(window.trailing_zeros());
            let end = next.start + next.size - file_start;
            let aligned_end = end / align * align;
            if aligned_end + file_start > next.start {
                next.size -= end - aligned_end;
                next.async_size = next.size;
            }
        }
        self.file_ra[file] = next;
        self.read_window(file)
    }

    /// Reads what is not cached of the file's readahead window, marking
    /// its `async_size`-from-the-end page when that one is read now.
    fn read_window(&mut self, file: usize) -> u64 {
        let ra = self.file_ra[file];
        let mark = ra.start + ra.size - ra.async_size;
        let mut read = 0;
        let mut from = ra.start;
        if self.cache.folios() {
            (from, read) = self.read_folios(file);
        }
        for p in from..(ra.start + ra.size).min(self.files[file].end) {
            if read >= self.capacity {
                break;
            }
            let p = p as u32;
            if !self.cache.resident(p) {
                self.lock(p);
                read += self.read(p);
                if u64::from(p) == mark {
                    self.marked[p as usize] = true;
                }
            }
        }
        self.unlock_all();
        read
    }

    /// Puts `page` in flight.
    fn lock(&mut self, page: u32) {
        self.in_flight.push(page);
        self.locked[page as usize] = true;
        self.cache.pin(page);
    }

    /// The window's read is done.
    fn unlock_all(&mut self) {
        for p in self.in_flight.drain(..) {
            self.locked[p as usize] = false;
            self.cache.unpin(p);
        }
    }

    /// `page_cache_ra_order`'s large folios over the window, until one
    /// would overlap a cached page or the cache is full; returns where the
    /// single pages take over and the pages read.
    fn read_folios(&mut self, file: usize) -> (u64, u64) {
        let span = self.files[file].clone();
        let ra = &mut self.file_ra[file];
        let limit = (ra.start + ra.size).min(span.end);
        if ra.size < 4 {
            return (ra.start, 0);
        }
        ra.order = ra.order.min(MAX_FOLIO_ORDER).min(ra.size.ilog2());
        let (order, mark) = (ra.order, ra.start + ra.size - ra.async_size);
        let mut at = ra.start;
        let mut read = 0;
        while at < limit && read < self.capacity {
            // Folios are aligned to their size in the file.
            let index = at - span.start;
            let mut o = if index == 0 { order } else { order.min(index.trailing_zeros()) };
            while o > 0 && at + (1 << o) > limit {
                o -= 1;
            }
            let end = at + (1 << o);
            if (at..end).any(|p| self.cache.resident(p as u32)) {
                break;
            }
            for p in at as u32..end as u32 {
                self.lock(p);
            }
            let pages = self.cache.read_in_folio(at as u32, 1 << o);
            self.reads.read(self.period, at, pages);
            read += pages;
            if (at..end).contains(&mark) {
                self.marked[at as usize..end as usize].fill(true);
            }
            self.make_room();
            at = end;
        }
        (at, read)
    }

    /// Reads one page in and makes room for it, sparing the pages in flight.
    fn read(&mut self, page: u32) -> u64 {
        let read = self.cache.read_in(page);
        self.reads.read(self.period, u64::from(page), read);
        self.make_room();
        read
    }

    /// Evicts down to the capacity, sparing the pages in flight.
    fn make_room(&mut self) {
        let (mapped, marked) = (&mut self.mapped, &mut self.marked);
        let locked = &self.locked;
        let pinned = |p: u32| locked[p as usize];
        self.cache.shrink(self.capacity, &pinned, &mut |gone| {
            mapped[gone as usize] = false;
            marked[gone as usize] = false;
        });
    }
}

/// `get_next_ra_size`: ramp up towards `max`.
fn next_size(current: u64, max: u64) -> u64 {
    if current < max / 16 {
        4 * current
    } else if current <= max / 2 {
        2 * current
    } else {
        max
    }
}
