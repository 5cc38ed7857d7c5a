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
//! Left out: large folios (the kernel reads and evicts in folios of up to
//! 2 MiB here; measured in docs/SIMULATE.md, they do not explain where the
//! replay is off).
//!
//! This is the straightforward replay, the reference: LRU runs the same
//! path run by run in [`super::lru_faults`].

use super::{Misses, stream::Stream};

/// `MMAP_LOTSAMISS`: above this many net misses the kernel stops reading
/// around faults in the file.
pub(super) const LOTS_OF_MISSES: u32 = 100;
/// `mmap_miss` saturates at ten times that.
pub(super) const MISS_CAP: u32 = LOTS_OF_MISSES * 10;

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
}

impl FileRa {
    /// The read-around window of `window` pages centred on `page`.
    pub(super) fn around(self, page: u64, window: u64, file_start: u64) -> FileRa {
        let start = page.saturating_sub(window / 2).max(file_start);
        FileRa { start, size: window, async_size: window / 4, ..self }
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

struct FaultPath<'a, C: PageCache> {
    cache: &'a mut C,
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
}

/// Replays `stream` page by page through the fault path on `cache` (whose
/// units must be pages), `capacity` pages large.
pub fn replay(stream: &Stream, ra: Window, cache: &mut impl PageCache, capacity: u64) -> Misses {
    let pages = stream.files.last().map_or(0, |f| f.end) as usize;
    let mut path = FaultPath {
        cache,
        capacity,
        ra,
        files: &stream.files,
        file_ra: vec![FileRa::default(); stream.files.len()],
        mapped: vec![false; pages],
        marked: vec![false; pages],
        in_flight: Vec::new(),
    };
    let mut misses = Misses::default();
    for (atom, period) in stream.iter() {
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
            }
        }
    }
    misses
}

impl<C: PageCache> FaultPath<'_, C> {
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
            if std::mem::take(&mut self.marked[page as usize]) {
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
        self.marked[page as usize] = false;
        self.mapped[page as usize] = self.cache.resident(page);
        read
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
            self.mapped[p] = true;
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
        let Some(next) = self.file_ra[file].after_mark(page, window, first_missing) else { return 0 };
        self.file_ra[file] = next;
        self.read_window(file)
    }

    /// Reads what is not cached of the file's readahead window, marking
    /// its `async_size`-from-the-end page when that one is read now.
    fn read_window(&mut self, file: usize) -> u64 {
        let ra = self.file_ra[file];
        let mark = ra.start + ra.size - ra.async_size;
        let mut read = 0;
        for p in ra.start..(ra.start + ra.size).min(self.files[file].end) {
            if read >= self.capacity {
                break;
            }
            let p = p as u32;
            if !self.cache.resident(p) {
                self.in_flight.push(p);
                read += self.read(p);
                if u64::from(p) == mark {
                    self.marked[p as usize] = true;
                }
            }
        }
        self.in_flight.clear();
        read
    }

    /// Reads one page in and makes room for it, sparing the pages in flight.
    fn read(&mut self, page: u32) -> u64 {
        let read = self.cache.read_in(page);
        let (mapped, marked) = (&mut self.mapped, &mut self.marked);
        // Pages in flight are read in file order: a binary search finds them.
        let in_flight = &self.in_flight;
        let pinned = |p: u32| in_flight.binary_search(&p).is_ok();
        self.cache.shrink(self.capacity, &pinned, &mut |gone| {
            mapped[gone as usize] = false;
            marked[gone as usize] = false;
        });
        read
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
