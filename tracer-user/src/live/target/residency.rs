//! How much of a file is in the page cache: cachestat(2) on a byte range
//! where the kernel has it (6.5+), else mincore on a private mapping.
//!
//! `--drop-caches` cannot evict pages that another process has mapped (a
//! second llama.cpp on the same model, say), so a "cold" run would silently
//! be warm for those pages; the session checks residency after the drop and
//! says so.

use std::{fs::File, io, os::fd::AsRawFd, path::Path};

use tracer_common::PAGE_SIZE as PAGE;

/// (resident bytes, file size), resident counted in whole pages.
pub fn resident_bytes(path: &Path) -> io::Result<(u64, u64)> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let resident = mincore_pages(&file, size)?.iter().filter(|&&b| b & 1 != 0).count() as u64;
    Ok(((resident * PAGE).min(size), size))
}

/// Write a file back and drop its pages from the page cache: a cold start
/// for that file alone, never the machine's whole cache. Pages another
/// process maps stay (see above).
pub fn evict(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: a valid fd; posix_fadvise only reads its arguments.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// cachestat(2)'s number on x86_64 and aarch64 (the same in the generic table).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Page-cache residency of an open file by byte range: cachestat(2), one
/// syscall per range and no mapping, or mincore over the whole file when
/// the kernel lacks it (ENOSYS).
pub struct Residency {
    file: File,
    size: u64,
    /// mincore's page bitmap, read once per [`Residency::refresh`].
    pages: Option<Vec<u8>>,
}

impl Residency {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        let mut r = Self { file, size, pages: None };
        if r.cachestat(0, 1).is_err_and(|e| e.raw_os_error() == Some(libc::ENOSYS)) {
            r.pages = Some(Vec::new());
            r.refresh()?;
        }
        Ok(r)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Take a new mincore snapshot (cachestat needs none).
    pub fn refresh(&mut self) -> io::Result<()> {
        if self.pages.is_some() {
            self.pages = Some(mincore_pages(&self.file, self.size)?);
        }
        Ok(())
    }

    /// Resident bytes of `[offset, offset + len)`: its cached pages, the
    /// partial ones at either end counted whole (as fincore does), clipped to the file.
    pub fn resident(&self, offset: u64, len: u64) -> io::Result<u64> {
        let pages = match &self.pages {
            // cachestat reads a length of 0 as "to the end of the file".
            _ if len == 0 => 0,
            Some(bitmap) => {
                let (first, last) = (offset / PAGE, (offset + len).div_ceil(PAGE));
                let range = bitmap.get(first as usize..(last as usize).min(bitmap.len())).unwrap_or(&[]);
                range.iter().filter(|&&b| b & 1 != 0).count() as u64
            }
            None => self.cachestat(offset, len)?,
        };
        Ok(pages * PAGE)
    }

    /// Resident bytes of every range of `plan`, and of the whole file, from
    /// one pass over the file (a range and the total apart would walk the
    /// file's page cache twice a sample: most of `top`'s own CPU time).
    pub fn sample(&self, plan: &RangePlan) -> io::Result<RangeSample> {
        let mut before = Vec::with_capacity(plan.cuts.len());
        let mut pages = 0;
        before.push(0);
        for w in plan.cuts.windows(2) {
            pages += self.resident(w[0] * PAGE, (w[1] - w[0]) * PAGE)? / PAGE;
            before.push(pages);
        }
        let per_range = plan.spans.iter().map(|&(first, end)| (before[end] - before[first]) * PAGE).collect();
        Ok(RangeSample { total: pages * PAGE, per_range })
    }

    fn cachestat(&self, offset: u64, len: u64) -> io::Result<u64> {
        let range = CachestatRange { off: offset, len };
        let mut stat = Cachestat::default();
        // SAFETY: both structs are the kernel's layout and live across the call.
        let rc = unsafe { libc::syscall(SYS_CACHESTAT, self.file.as_raw_fd(), &raw const range, &raw mut stat, 0u32) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat.nr_cache)
    }
}

/// Byte ranges of one file (its tensors) cut into disjoint page runs, so
/// that each range is a run of whole segments and the file their union.
/// A page two ranges share is a segment of its own, counted in both (as
/// fincore and [`Residency::resident`] count partial pages) and once in the total.
pub struct RangePlan {
    /// Segment boundaries in pages, from 0 to the file's page count.
    cuts: Vec<u64>,
    /// Per range: its first segment and one past its last.
    spans: Vec<(usize, usize)>,
}

impl RangePlan {
    /// `ranges` as (offset, len) in bytes; what lies past `size` is left out.
    pub fn new(size: u64, ranges: &[(u64, u64)]) -> Self {
        let last = size.div_ceil(PAGE);
        let pages = |&(offset, len): &(u64, u64)| {
            let end = offset.saturating_add(len).div_ceil(PAGE).min(last);
            ((offset / PAGE).min(end), end)
        };
        let mut cuts: Vec<u64> =
            [0, last].into_iter().chain(ranges.iter().flat_map(|r| <[u64; 2]>::from(pages(r)))).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let at = |page| cuts.binary_search(&page).unwrap_or_default();
        let spans = ranges.iter().map(pages).map(|(first, end)| (at(first), at(end))).collect();
        Self { cuts, spans }
    }
}

/// Resident bytes per range of a [`RangePlan`], in its order, and of the file.
pub struct RangeSample {
    pub total: u64,
    pub per_range: Vec<u64>,
}

/// One byte per page of the file, bit 0 set when resident.
fn mincore_pages(file: &File, size: u64) -> io::Result<Vec<u8>> {
    if size == 0 {
        return Ok(Vec::new());
    }
    let len = usize::try_from(size).map_err(|_| io::Error::other("file too large to map"))?;
    // SAFETY: a fresh read-only private mapping of an open file; never
    // dereferenced, only passed to mincore and unmapped below. Mapping does not
    // read the file, so the check itself adds nothing to the page cache.
    let addr =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; len.div_ceil(PAGE as usize)];
    // SAFETY: addr..addr+len is the mapping above; vec holds one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    Ok(vec)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A fresh directory of its own holding `f`, `len` bytes long.
    fn temp_file(tag: &str, len: usize) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ttrace-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        File::create(&path).unwrap().write_all(&vec![7u8; len]).unwrap();
        (dir, path)
    }

    #[test]
    fn a_file_just_read_is_resident_and_an_empty_one_is_zero() {
        let (dir, path) = temp_file("residency", 3 * 4096 + 10);
        let mut buf = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut buf).unwrap();
        assert_eq!(resident_bytes(&path).unwrap(), (3 * 4096 + 10, 3 * 4096 + 10));
        let empty = dir.join("e");
        File::create(&empty).unwrap();
        assert_eq!(resident_bytes(&empty).unwrap(), (0, 0));
        // cachestat and mincore agree: whole pages, the partial last one too.
        let mut by_range = Residency::open(&path).unwrap();
        assert_eq!(by_range.resident(0, 3 * 4096 + 10).unwrap(), 4 * 4096);
        assert_eq!(by_range.resident(4096, 10).unwrap(), 4096);
        by_range.pages = Some(Vec::new());
        by_range.refresh().unwrap();
        assert_eq!(by_range.resident(0, 3 * 4096 + 10).unwrap(), 4 * 4096);
        assert_eq!(by_range.resident(4096, 10).unwrap(), 4096);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plan_gives_each_range_what_resident_gives_it_and_the_file_its_total() {
        let (dir, path) = temp_file("residency-plan", 40 * 4096 + 100);
        // Pages 10..20 and 30.. dropped, the rest resident as written (no
        // read, so no readahead changes it under the test).
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        for (first, pages) in [(10, 10), (30, 0)] {
            // SAFETY: a valid fd; posix_fadvise only reads its arguments.
            let rc =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), first * 4096, pages * 4096, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0);
        }
        // Overlapping, page-sharing, empty and past-the-end ranges.
        let ranges =
            [(0, 100), (100, 5 * 4096), (9 * 4096 + 7, 2 * 4096), (25 * 4096, 0), (12 * 4096, 30 * 4096), (0, 1 << 40)];
        for pages in [false, true] {
            let mut r = Residency::open(&path).unwrap();
            if pages {
                r.pages = Some(Vec::new());
                r.refresh().unwrap();
            }
            let plan = RangePlan::new(r.size(), &ranges);
            let sample = r.sample(&plan).unwrap();
            assert_eq!(sample.total, r.resident(0, r.size()).unwrap());
            let alone: Vec<u64> =
                ranges.iter().map(|&(o, l)| r.resident(o, l.min(r.size().saturating_sub(o))).unwrap()).collect();
            assert_eq!(sample.per_range, alone, "mincore: {pages}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
