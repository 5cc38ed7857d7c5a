//! How much of a file is in the page cache (mincore on a private mapping).
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
    if size == 0 {
        return Ok((0, 0));
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
    let pages = len.div_ceil(PAGE as usize);
    let mut vec = vec![0u8; pages];
    // SAFETY: addr..addr+len is the mapping above; vec holds one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
    Ok(((resident * PAGE).min(size), size))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn a_file_just_read_is_resident_and_an_empty_one_is_zero() {
        let dir = std::env::temp_dir().join(format!("ttrace-residency-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        File::create(&path).unwrap().write_all(&vec![7u8; 3 * 4096 + 10]).unwrap();
        let mut buf = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut buf).unwrap();
        assert_eq!(resident_bytes(&path).unwrap(), (3 * 4096 + 10, 3 * 4096 + 10));
        let empty = dir.join("e");
        File::create(&empty).unwrap();
        assert_eq!(resident_bytes(&empty).unwrap(), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
