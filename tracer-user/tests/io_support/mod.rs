//! Shared by the I/O-correlation tests (`mod io_support;`): the kernel's
//! block tracer as an oracle ([`BlkTrace`], see `blk.rs` for its format and
//! how its sectors map to file extents), page-cache residency, test files,
//! and the `touch` fault generator.

#![allow(dead_code, unused_imports)]

mod blk;
pub mod blkparse;

use std::{
    fs::File,
    io::Write,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

pub use blk::{
    BlkLog, BlkRecord, BlkTrace, covered_bytes, final_issues, in_extents, overlapping, overlapping_final, parse_trace,
    records_in_extents,
};

/// Root-only tests fail with one line saying why; they never skip.
pub fn require_root(what: &str) {
    // SAFETY: geteuid has no failure modes.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test uses {what} and needs root: run `sudo -E cargo xtask test`");
    }
}

/// A fresh directory for test files on a real disk (the target dir, so the
/// files have block extents: /tmp may be tmpfs elsewhere).
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("io-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// Writes `len` pseudo-random bytes to `path` and fsyncs it, so its
/// extents are allocated (not delalloc) and its pages clean.
pub fn write_file(path: &Path, len: u64) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ len;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            // xorshift64: incompressible, so no layer can shortcut the I/O.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        left -= n as u64;
    }
    f.sync_all().unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
}

/// Evicts one clean file from the page cache (unlike drop_caches, without
/// disturbing anything else on the machine).
pub fn evict(path: &Path) {
    let f = File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    // SAFETY: plain syscalls on an fd we own.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// (resident bytes, file size) of `path` in the page cache, by mincore.
pub fn resident_bytes(path: &Path) -> (u64, u64) {
    let f = File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let size = f.metadata().unwrap_or_else(|e| panic!("stat {}: {e}", path.display())).len();
    if size == 0 {
        return (0, 0);
    }
    // SAFETY: sysconf has no failure modes for _SC_PAGESIZE.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let pages = size.div_ceil(page) as usize;
    // SAFETY: a read-only shared mapping that is never dereferenced; mincore
    // fills one byte per page into a vector of exactly that length.
    unsafe {
        let addr = libc::mmap(std::ptr::null_mut(), size as usize, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(addr, libc::MAP_FAILED, "mmap {}: {}", path.display(), std::io::Error::last_os_error());
        let mut vec = vec![0u8; pages];
        let rc = libc::mincore(addr, size as usize, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(addr, size as usize);
        assert_eq!(rc, 0, "mincore {}: {err}", path.display());
        let resident = vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
        ((resident * page).min(size), size)
    }
}

/// Builds `touch` (touch.c) once per test process and returns its path.
/// `touch FILE OFFSET...` maps FILE shared read-only with MADV_RANDOM,
/// reads one byte at each offset in order and prints `addr=0x... offset=N`.
pub fn build_touch() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/io_support/touch.c");
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("io_support");
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            // Per-process output, renamed into place: test binaries may build
            // it concurrently in the shared target dir.
            let tmp = dir.join(format!("touch.{}.tmp", std::process::id()));
            let out = Command::new("cc")
                .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
                .arg(&tmp)
                .arg(&src)
                .output()
                .unwrap_or_else(|e| panic!("cannot run cc ({e}): these tests build touch.c with a C compiler"));
            assert!(out.status.success(), "cc {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
            let exe = dir.join("touch");
            std::fs::rename(&tmp, &exe).unwrap_or_else(|e| panic!("cannot rename to {}: {e}", exe.display()));
            exe
        })
        .clone()
}

/// One line of `touch` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touched {
    pub addr: u64,
    pub offset: u64,
}

/// Parses `touch` output; panics on anything else.
pub fn parse_touched(stdout: &str) -> Vec<Touched> {
    stdout
        .lines()
        .map(|l| {
            let parse = || {
                let (a, o) = l.split_once(' ')?;
                let addr = u64::from_str_radix(a.strip_prefix("addr=0x")?, 16).ok()?;
                let offset = o.strip_prefix("offset=")?.parse().ok()?;
                Some(Touched { addr, offset })
            };
            parse().unwrap_or_else(|| panic!("unexpected touch output line {l:?}"))
        })
        .collect()
}
