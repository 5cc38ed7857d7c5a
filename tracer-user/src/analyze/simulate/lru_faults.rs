//! The fault path of [`super::faults`] under LRU, replayed run by run
//! instead of page by page, with exactly the same result (the tests replay
//! both on random streams, `ttrace simulate --engine pages` on a real one).
//!
//! What makes it exact:
//! - An access whose pages are all mapped faults nowhere: the pages only
//!   move to the head of the list, in order ([`RunLru::touch`]).
//! - A *minor* fault (the page cached and not marked PG_readahead) only
//!   maps its fault-around block and lowers `mmap_miss` by the cached,
//!   unmarked pages there: a few bitmap words, and nothing on the list.
//!   So the pages of an access are moved to the head in one step per
//!   stretch between the faults that read (major faults, marked pages).
//! - A readahead window reads its uncached pages as runs: each run goes to
//!   the head, then the oldest pages not in flight leave. Page by page,
//!   eviction takes the same pages in the same order (the pages in flight
//!   are the newest, and nothing else moves meanwhile); the window re-reads
//!   what a run evicted ahead of it, because it looks again after each run.

use super::{
    Misses,
    bits::Bits,
    detail::Reads,
    faults::{FileRa, LOTS_OF_MISSES, MISS_CAP, Window},
    runs::RunLru,
    stream::Stream,
};

struct RunPath<'a, R: Reads> {
    lru: RunLru,
    /// Told every page read, and the period of the access that read it.
    reads: &'a mut R,
    period: crate::analyze::usage::Period,
    /// Pages cached (`lru` lists exactly these).
    cached: u64,
    capacity: u64,
    ra: Window,
    files: &'a [std::ops::Range<u64>],
    file_ra: Vec<FileRa>,
    resident: Bits,
    /// In the task's page tables.
    mapped: Bits,
    /// PG_readahead.
    marked: Bits,
    /// Pages the current readahead window read (the newest on the list):
    /// locked until it is done.
    in_flight: u64,
}

/// LRU with a cache of `capacity` pages under the kernel's fault path:
/// equal to `faults::replay(stream, ra, &mut Lru::new(vec![1; pages]), capacity)`.
#[cfg(test)]
pub fn replay(stream: &Stream, ra: Window, capacity: u64) -> Misses {
    replay_into(stream, ra, capacity, &mut ())
}

/// [`replay`], telling `reads` which pages it reads.
pub fn replay_into(stream: &Stream, ra: Window, capacity: u64, reads: &mut impl Reads) -> Misses {
    let pages = stream.files.last().map_or(0, |f| f.end);
    let mut path = RunPath {
        lru: RunLru::new(pages),
        reads,
        period: crate::analyze::usage::Period::Load,
        cached: 0,
        capacity,
        ra,
        files: &stream.files,
        file_ra: vec![FileRa::default(); stream.files.len()],
        resident: Bits::new(pages),
        mapped: Bits::new(pages),
        marked: Bits::new(pages),
        in_flight: 0,
    };
    let mut misses = Misses::default();
    for (atom, period) in stream.iter() {
        path.period = period;
        let a = stream.atom_first[atom as usize];
        let b = a + u64::from(stream.atom_pages[atom as usize]);
        // Atoms tile files: one file per atom.
        let file = path.file_of(a);
        // Pages from `used` on are touched when something reads next.
        let (mut used, mut at) = (a, a);
        loop {
            at = path.minor_faults(at, b, file);
            if at == b {
                break;
            }
            path.lru.touch(used, at);
            misses.pages[period.index()] += path.fault(at, file);
            // A cache too small for one page keeps nothing: not touched.
            used = if path.mapped.get(at) { at } else { at + 1 };
            at += 1;
        }
        path.lru.touch(used, b);
    }
    misses
}

impl<R: Reads> RunPath<'_, R> {
    fn file_of(&self, page: u64) -> usize {
        self.files.partition_point(|f| f.end <= page)
    }

    /// Takes the minor faults from `at` on (each maps its fault-around
    /// block); returns the first page of `[at, b)` still unmapped then, one
    /// not cached or marked, or `b`.
    fn minor_faults(&mut self, mut at: u64, b: u64, file: usize) -> u64 {
        loop {
            at = self.mapped.next_zero(at, b);
            if at == b || !self.resident.get(at) || self.marked.get(at) {
                return at;
            }
            // Up to `stop` every page is cached and unmarked. When none of
            // them is mapped yet, each of their blocks faults once in turn:
            // map all those blocks at once (the hits add up the same).
            let stop = self.resident.next_zero(at, b).min(self.marked.next_one(at, b));
            if self.mapped.next_one(at, stop) == stop {
                let span = &self.files[file];
                let block = self.ra.fault_around.max(1);
                let from = (at - span.start) / block * block + span.start;
                let to = ((stop - 1 - span.start) / block * block + span.start + block).min(span.end);
                let hits = self.mapped.set_where(&self.resident, &self.marked, from, to);
                let ra = &mut self.file_ra[file];
                ra.mmap_miss = ra.mmap_miss.saturating_sub(hits);
                at = stop;
            } else {
                self.fault_around(at, file);
            }
        }
    }

    /// A fault on the unmapped `page` that reads or is marked (see
    /// `faults::FaultPath::fault`).
    fn fault(&mut self, page: u64, file: usize) -> u64 {
        self.fault_around(page, file);
        if self.mapped.get(page) {
            return 0;
        }
        let mut read = 0;
        if self.resident.get(page) {
            let ra = &mut self.file_ra[file];
            ra.mmap_miss = ra.mmap_miss.saturating_sub(1);
            if self.marked.take(page) {
                read += self.async_readahead(page, file);
            }
        } else {
            let ra = &mut self.file_ra[file];
            ra.mmap_miss = (ra.mmap_miss + 1).min(MISS_CAP);
            read += if ra.mmap_miss > LOTS_OF_MISSES || self.ra.pages == 0 {
                self.read(page, page + 1)
            } else {
                self.read_around(page, file)
            };
            if !self.resident.get(page) {
                read += self.read(page, page + 1);
            }
        }
        self.marked.take(page);
        if self.resident.get(page) {
            self.mapped.set(page);
        }
        read
    }

    /// `filemap_map_pages` over the aligned fault-around block (LRU pages
    /// are never PG_workingset: every cached unmarked page is a hit).
    fn fault_around(&mut self, page: u64, file: usize) {
        let span = &self.files[file];
        let block = self.ra.fault_around.max(1);
        let from = (page - span.start) / block * block + span.start;
        let hits = self.mapped.set_where(&self.resident, &self.marked, from, (from + block).min(span.end));
        let ra = &mut self.file_ra[file];
        ra.mmap_miss = ra.mmap_miss.saturating_sub(hits);
    }

    fn read_around(&mut self, page: u64, file: usize) -> u64 {
        self.file_ra[file] = self.file_ra[file].around(page, self.ra.pages, self.files[file].start);
        self.read_window(file)
    }

    fn async_readahead(&mut self, page: u64, file: usize) -> u64 {
        let (window, end) = (self.ra.pages, self.files[file].end);
        let upto = (page + 1 + window).min(end);
        let resident = &self.resident;
        let first_missing = || Some(resident.next_zero(page + 1, upto)).filter(|&p| p < upto);
        let Some(next) = self.file_ra[file].after_mark(page, window, first_missing) else { return 0 };
        self.file_ra[file] = next;
        self.read_window(file)
    }

    /// Reads what is not cached of the file's window, run by run.
    fn read_window(&mut self, file: usize) -> u64 {
        let ra = self.file_ra[file];
        let mark = ra.start + ra.size - ra.async_size;
        let end = (ra.start + ra.size).min(self.files[file].end);
        let (mut read, mut at) = (0, ra.start);
        while read < self.capacity && at < end {
            let from = self.resident.next_zero(at, end);
            if from == end {
                break;
            }
            let to = self.resident.next_one(from, end).min(from + (self.capacity - read));
            self.in_flight += to - from;
            read += self.read(from, to);
            if (from..to).contains(&mark) {
                self.marked.set(mark);
            }
            at = to;
        }
        self.in_flight = 0;
        read
    }

    /// Reads `[from, to)` in and makes room, sparing the pages in flight.
    fn read(&mut self, from: u64, to: u64) -> u64 {
        self.lru.push(from, to);
        self.reads.read(self.period, from, to - from);
        self.resident.set_range(from, to);
        self.cached += to - from;
        let excess = self.cached.saturating_sub(self.capacity);
        let evict = excess.min(self.cached - self.in_flight);
        let (resident, mapped, marked) = (&mut self.resident, &mut self.mapped, &mut self.marked);
        self.lru.evict(evict, &mut |s, e| {
            resident.clear_range(s, e);
            mapped.clear_range(s, e);
            marked.clear_range(s, e);
        });
        self.cached -= evict;
        to - from
    }
}
