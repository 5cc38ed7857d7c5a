//! A memory-limited cgroup for `ttrace run --mem-limit SIZE`, so a model can
//! be run with less page cache than it needs and its re-faults observed.
//!
//! The cgroup is created *inside ttrace's own cgroup* (as `/proc/self/cgroup`
//! names it), not at the hierarchy root: that keeps whatever limits and
//! accounting the caller's environment imposes, and needs no write access
//! anywhere else. cgroup v2 is used when its mount offers the memory
//! controller to that cgroup; otherwise the v1 `memory` hierarchy. Hybrid
//! systems (v1 controllers plus a v2 mount with few or no controllers) are
//! common, so "v2 is mounted" alone decides nothing.
//!
//! Names are `ttrace-<pid>-<n>[-hint]` with ttrace's pid, so cgroups left by a
//! crashed run can be recognised and removed ([`MemoryCgroup::remove_stale`]).

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

/// The smallest accepted limit: below this even a tiny program thrashes or
/// is OOM-killed before it reaches main, which tells nothing about a model.
pub const MIN_LIMIT: u64 = 4 << 20;

/// Which cgroup interface a [`MemoryCgroup`] lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl std::fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        })
    }
}

// Causes are in the message, not `source`s, so anyhow prints them once.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("bad memory size {text:?}: {reason} (examples: 512M, 1.5G, 64MiB, 1500000000)")]
    BadSize { text: String, reason: String },
    #[error("memory limit {text:?} ({bytes} bytes) is below the minimum of {} MiB", MIN_LIMIT >> 20)]
    TooSmall { text: String, bytes: u64 },
    #[error(
        "no cgroup memory controller is available: cgroup v2: {v2}; cgroup v1: {v1}. \
         Mount one (e.g. `mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory`) or run without --mem-limit"
    )]
    NoMemoryController { v2: String, v1: String },
    #[error("cannot {op} {}: {error}{}", path.display(), root_hint(error))]
    Io { op: &'static str, path: PathBuf, error: io::Error },
    #[error("no process with pid {pid} to move into cgroup {}", path.display())]
    NoSuchPid { pid: u32, path: PathBuf },
    #[error(
        "cannot remove cgroup {}: processes {pids:?} are still in it after moving them out; \
         move them to {} and `rmdir` it",
        path.display(), parent.display()
    )]
    Busy { path: PathBuf, parent: PathBuf, pids: Vec<u32> },
    #[error("cannot drop the page cache (writing 3 to /proc/sys/vm/drop_caches): {error}{}", root_hint(error))]
    DropCaches { error: io::Error },
}

fn root_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => " (this needs root: run ttrace with sudo)",
        Some(libc::EROFS) => " (the file system is read-only here, e.g. in a container without privileges)",
        _ => "",
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |error| CgroupError::Io { op, path: path.to_path_buf(), error }
}

/// Memory sizes as given to `--mem-limit`.
pub struct MemLimit;

impl MemLimit {
    /// Parses `1500000000`, `512M`, `1.5G`, `64KiB`, `2gb`... Suffixes are
    /// case-insensitive and all binary (K = 1024), as in cgroup files,
    /// systemd and docker, so `1G` means the same here as there. Sizes below
    /// [`MIN_LIMIT`] are refused.
    pub fn parse(text: &str) -> Result<u64, CgroupError> {
        let bytes = crate::units::parse_size(text)
            .map_err(|reason| CgroupError::BadSize { text: text.to_string(), reason: reason.to_string() })?;
        if bytes < MIN_LIMIT {
            return Err(CgroupError::TooSmall { text: text.to_string(), bytes });
        }
        Ok(bytes)
    }
}

/// Usage figures for the end-of-run summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// Bytes charged now (anonymous memory plus page cache).
    pub usage_bytes: u64,
    /// Highest charge seen; None on v2 kernels before 5.19 (no memory.peak).
    pub peak_bytes: Option<u64>,
    /// The limit the kernel applies (the request rounded down to pages).
    pub limit_bytes: u64,
    /// Times a charge hit the limit and forced reclaim (v1 memory.failcnt
    /// plus memory.memsw.failcnt, v2 memory.events `max`).
    pub limit_hits: u64,
    /// Processes the cgroup's OOM killer killed.
    pub oom_kills: u64,
}

/// A cgroup with a memory limit. Dropping it moves any processes left in it
/// back to the parent cgroup and removes it; [`MemoryCgroup::remove`] does the
/// same and reports errors.
#[derive(Debug)]
pub struct MemoryCgroup {
    version: CgroupVersion,
    path: PathBuf,
    /// The cgroup of the hierarchy's mount root, for when the parent refuses
    /// processes (v2's no-internal-processes rule).
    root: PathBuf,
    limit_bytes: u64,
    why_not_v2: Option<String>,
    removed: bool,
}

mod discover;

use discover::Placement;

static NEXT: AtomicU32 = AtomicU32::new(0);

impl MemoryCgroup {
    /// Creates `ttrace-<pid>-<n>[-hint]` inside ttrace's own memory cgroup
    /// and limits it to `limit_bytes` of memory and no swap.
    pub fn create(name_hint: &str, limit_bytes: u64) -> Result<MemoryCgroup, CgroupError> {
        let place = Placement::find(true)?;
        let (version, parent, root) = place.chosen;
        let hint: String =
            name_hint.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')).take(32).collect();
        let path = loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let mut name = format!("ttrace-{}-{n}", std::process::id());
            if !hint.is_empty() {
                name = format!("{name}-{hint}");
            }
            let path = parent.join(name);
            match fs::create_dir(&path) {
                Ok(()) => break path,
                // A cgroup left by an earlier ttrace with the same pid.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create cgroup", &path)(e)),
            }
        };
        let mut cg = MemoryCgroup { version, path, root, limit_bytes, why_not_v2: place.why_not_v2, removed: false };
        // On failure `cg` drops here, which removes the directory again.
        cg.limit_bytes = cg.set_limit(limit_bytes)?;
        Ok(cg)
    }

    fn set_limit(&self, bytes: u64) -> Result<u64, CgroupError> {
        match self.version {
            CgroupVersion::V2 => {
                write_file(&self.path.join("memory.max"), &bytes.to_string())?;
                let swap = self.path.join("memory.swap.max");
                if swap.exists() {
                    write_file(&swap, "0")?;
                }
                Ok(read_u64_or_max(&self.path.join("memory.max"))?.unwrap_or(bytes))
            }
            CgroupVersion::V1 => {
                write_file(&self.path.join("memory.limit_in_bytes"), &bytes.to_string())?;
                let effective = read_u64(&self.path.join("memory.limit_in_bytes"))?;
                // memsw (memory+swap) must stay >= the memory limit, so it
                // goes second; equal values mean no swap. Only with swap
                // configured: memsw is charged first and, on 6.x kernels,
                // keeps no failcnt, so setting it would hide every limit hit.
                let memsw = self.path.join("memory.memsw.limit_in_bytes");
                if memsw.exists() && swap_configured() {
                    write_file(&memsw, &effective.to_string())?;
                }
                Ok(effective)
            }
        }
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The limit as the kernel applies it (rounded down to whole pages).
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Why cgroup v2 was not used, when v1 was (for the trace header).
    pub fn why_not_v2(&self) -> Option<&str> {
        self.why_not_v2.as_deref()
    }

    /// Moves process `pid` (all its threads) into the cgroup. Memory it has
    /// already touched stays charged where it was, so do this before exec.
    pub fn add_pid(&self, pid: u32) -> Result<(), CgroupError> {
        let procs = self.path.join("cgroup.procs");
        match write_file(&procs, &pid.to_string()) {
            Err(CgroupError::Io { error, .. }) if error.raw_os_error() == Some(libc::ESRCH) => {
                Err(CgroupError::NoSuchPid { pid, path: self.path.clone() })
            }
            other => other,
        }
    }

    /// Processes in the cgroup now.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        read_pids(&self.path.join("cgroup.procs"))
    }

    /// Current and peak usage and how often the limit bit. Read it before
    /// [`remove`](Self::remove): the files go with the cgroup.
    pub fn stats(&self) -> Result<MemoryStats, CgroupError> {
        read_stats(self.version, &self.path)
    }

    /// Moves every process still inside back to the parent cgroup (or the
    /// hierarchy root if the parent refuses them), then removes the cgroup.
    /// Processes keep running. Idempotent; also done on drop.
    pub fn remove(&mut self) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        let parent = self.path.parent().map(Path::to_path_buf).unwrap_or_else(|| self.root.clone());
        let mut last = Vec::new();
        // Retries: a process may fork while being moved, and a task that just
        // exited keeps the cgroup busy for a moment.
        for attempt in 0..100 {
            let pids = match read_pids(&self.path.join("cgroup.procs")) {
                Ok(p) => p,
                Err(_) if !self.path.exists() => {
                    self.removed = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            for &pid in &pids {
                move_out(pid, &parent, &self.root);
            }
            if pids.is_empty() {
                match fs::remove_dir(&self.path) {
                    Ok(()) => {
                        self.removed = true;
                        return Ok(());
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.removed = true;
                        return Ok(());
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(e) => return Err(io_err("remove cgroup", &self.path)(e)),
                }
            }
            last = pids;
            std::thread::sleep(Duration::from_millis(if attempt < 10 { 2 } else { 20 }));
        }
        Err(CgroupError::Busy { path: self.path.clone(), parent, pids: last })
    }

    /// Removes empty `ttrace-<pid>-*` cgroups whose ttrace (`pid`) no longer
    /// exists, in the places [`create`](Self::create) would use. Cgroups that
    /// still hold processes are left alone. Returns what it removed.
    pub fn remove_stale() -> Result<Vec<PathBuf>, CgroupError> {
        let place = Placement::find(false)?;
        let mut removed = Vec::new();
        for parent in place.parents {
            let Ok(entries) = fs::read_dir(&parent) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(stale_pid) else { continue };
                if pid_alive(pid) || !entry.path().is_dir() {
                    continue;
                }
                let path = entry.path();
                if read_pids(&path.join("cgroup.procs")).map(|p| p.is_empty()).unwrap_or(false)
                    && fs::remove_dir(&path).is_ok()
                {
                    removed.push(path);
                }
            }
        }
        Ok(removed)
    }
}

/// Someone else's memory cgroup, read only: the nearest one above a process
/// that sets a limit (a systemd unit's `MemoryMax`, another `ttrace run
/// --mem-limit`), for `top --pid`.
#[derive(Debug, Clone)]
pub struct LimitingCgroup {
    version: CgroupVersion,
    path: PathBuf,
}

impl LimitingCgroup {
    /// None when no cgroup between the process and the hierarchy's root
    /// limits its memory, or the process is gone.
    pub fn of_process(pid: u32) -> Option<LimitingCgroup> {
        let (version, dir, root) = discover::of_process(pid)?;
        let mut at = dir.as_path();
        loop {
            let stats = read_stats(version, at).ok()?;
            // v1 reports "no limit" as a page-rounded i64::MAX.
            if stats.limit_bytes < (1u64 << 62) {
                return Some(LimitingCgroup { version, path: at.to_path_buf() });
            }
            if at == root {
                return None;
            }
            at = at.parent()?;
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> Result<MemoryStats, CgroupError> {
        read_stats(self.version, &self.path)
    }
}

fn read_stats(version: CgroupVersion, dir: &Path) -> Result<MemoryStats, CgroupError> {
    let p = |f: &str| dir.join(f);
    match version {
        CgroupVersion::V1 => {
            let oom = read_keyed(&p("memory.oom_control"))?;
            // With a memsw limit the memsw counter is charged first and
            // fails first; count it too where the kernel tracks it.
            let memsw = p("memory.memsw.failcnt");
            let memsw_hits = if memsw.exists() { read_u64(&memsw)? } else { 0 };
            Ok(MemoryStats {
                usage_bytes: read_u64(&p("memory.usage_in_bytes"))?,
                peak_bytes: Some(read_u64(&p("memory.max_usage_in_bytes"))?),
                limit_bytes: read_u64(&p("memory.limit_in_bytes"))?,
                limit_hits: read_u64(&p("memory.failcnt"))? + memsw_hits,
                oom_kills: key(&oom, "oom_kill"),
            })
        }
        CgroupVersion::V2 => {
            let events = read_keyed(&p("memory.events"))?;
            let peak = p("memory.peak");
            Ok(MemoryStats {
                usage_bytes: read_u64(&p("memory.current"))?,
                peak_bytes: if peak.exists() { Some(read_u64(&peak)?) } else { None },
                limit_bytes: read_u64_or_max(&p("memory.max"))?.unwrap_or(u64::MAX),
                limit_hits: key(&events, "max"),
                oom_kills: key(&events, "oom_kill"),
            })
        }
    }
}

/// The cgroup's memory.stat, read every [`STAT_PERIOD`] by a thread of its
/// own through a limited run: its peak charges for the trailer, and, as a
/// side effect that matters more, fresh reclaim statistics. Reclaim in a
/// memory cgroup decides from per-cgroup counters (the active list's size in
/// the refault test, mm/workingset.c `workingset_test_recent`; the list
/// sizes and activated refaults in `prepare_scan_control`) that the kernel
/// aggregates only every 2 s, or when memory.stat is read. A new cgroup's
/// counters lag its lists for its first seconds, so which pages a short run
/// keeps depended on when the 2 s flusher last ran: cold `moe` runs at 24M
/// read 0.8 to 7.0 MiB per token, Gemma 3 270M's at 256M 75 to 230; with
/// memory.stat read every 5 ms, 0.9 to 1.0 and 231.0 to 231.4. Every 100 ms
/// was not enough for Gemma (150.6 to 190.3; docs/SIMULATE.md).
pub struct StatSampler {
    peak: std::sync::Arc<std::sync::Mutex<crate::format::CgroupMemory>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often memory.stat is read: a read costs 10-20 us.
pub const STAT_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);

impl StatSampler {
    pub fn start(cgroup_dir: &Path) -> Option<Self> {
        use std::sync::{Arc, Mutex, atomic::AtomicBool};
        let file = fs::File::open(cgroup_dir.join("memory.stat")).ok()?;
        let peak = Arc::new(Mutex::new(crate::format::CgroupMemory::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("ttrace-memstat".into())
            .spawn(move || {
                let mut text = Vec::with_capacity(8192);
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(stat) = read_whole(&file, &mut text)
                        && let Ok(mut peak) = p.lock()
                    {
                        record_peaks(&mut peak, stat);
                    }
                    std::thread::sleep(STAT_PERIOD);
                }
            })
            .ok()?;
        Some(Self { peak, stop, thread: Some(thread) })
    }

    pub fn peak(&self) -> crate::format::CgroupMemory {
        self.peak.lock().map(|p| *p).unwrap_or_default()
    }
}

impl Drop for StatSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The whole of a file the kernel generates at offset 0 (and whose
/// statistics it flushes then).
fn read_whole<'a>(file: &fs::File, text: &'a mut Vec<u8>) -> Option<&'a str> {
    use std::os::unix::fs::FileExt;
    text.resize(text.capacity().max(8192), 0);
    let mut len = 0;
    loop {
        match file.read_at(&mut text[len..], len as u64).ok()? {
            0 => break,
            n => len += n,
        }
        if len == text.len() {
            text.resize(len * 2, 0);
        }
    }
    std::str::from_utf8(&text[..len]).ok()
}

/// Raises `peak` to the charges in a memory.stat text (v1 or v2).
fn record_peaks(peak: &mut crate::format::CgroupMemory, memory_stat: &str) {
    for (k, v) in memory_stat.lines().filter_map(|l| l.split_once(' ')) {
        let slot = match k {
            "rss" | "anon" => &mut peak.anon_bytes,
            "cache" | "file" => &mut peak.file_bytes,
            _ => continue,
        };
        *slot = (*slot).max(v.trim().parse().unwrap_or(0));
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            log::warn!("{e}");
        }
    }
}

/// Empties the page cache (after writing back dirty pages) for cold-cache
/// runs. Needs root; affects the whole machine.
pub fn drop_caches() -> Result<(), CgroupError> {
    // Dirty pages cannot be dropped: writing them back first makes the drop complete.
    nix::unistd::sync();
    fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .and_then(|mut f| f.write_all(b"3"))
        .map_err(|error| CgroupError::DropCaches { error })
}

/// Whether the machine has swap space (SwapTotal > 0 in /proc/meminfo).
fn swap_configured() -> bool {
    let Ok(meminfo) = fs::read_to_string("/proc/meminfo") else { return true };
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .is_none_or(|kb| kb > 0)
}

/// The pid in a `ttrace-<pid>-<n>...` name.
fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("ttrace-")?;
    let (pid, n) = rest.split_once('-')?;
    let n = n.split('-').next()?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
    pid.parse().ok()
}

fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

fn move_out(pid: u32, parent: &Path, root: &Path) {
    let to_parent = write_file(&parent.join("cgroup.procs"), &pid.to_string());
    if let Err(CgroupError::Io { error, .. }) = to_parent
        && error.raw_os_error() != Some(libc::ESRCH)
    {
        let _ = write_file(&root.join("cgroup.procs"), &pid.to_string());
    }
}

fn read_text(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(io_err("read", path))
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    // One write(2): cgroup files act on each write, not on the whole file.
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|error| CgroupError::Io { op: "write", path: path.to_path_buf(), error })
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    read_u64_or_max(path)?.ok_or_else(|| CgroupError::Io {
        op: "parse",
        path: path.to_path_buf(),
        error: io::Error::new(io::ErrorKind::InvalidData, "expected a number, found `max`"),
    })
}

/// A number, or None for v2's `max`.
fn read_u64_or_max(path: &Path) -> Result<Option<u64>, CgroupError> {
    let text = read_text(path)?;
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    t.parse().map(Some).map_err(|_| CgroupError::Io {
        op: "parse",
        path: path.to_path_buf(),
        error: io::Error::new(io::ErrorKind::InvalidData, format!("expected a number, found {t:?}")),
    })
}

/// `key value` lines (memory.events, memory.oom_control).
fn read_keyed(path: &Path) -> Result<Vec<(String, u64)>, CgroupError> {
    Ok(read_text(path)?
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect())
}

fn key(pairs: &[(String, u64)], name: &str) -> u64 {
    pairs.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v)
}

fn read_pids(path: &Path) -> Result<Vec<u32>, CgroupError> {
    Ok(read_text(path)?.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stat_peaks_from_v1_and_v2_keys_only() {
        let mut peak = crate::format::CgroupMemory::default();
        // v1: `rss` and `cache`, not `rss_huge`, `total_rss` or `mapped_file`.
        record_peaks(&mut peak, "cache 4096\nrss 8192\nrss_huge 0\nmapped_file 99999\ntotal_rss 77777\n");
        assert_eq!((peak.anon_bytes, peak.file_bytes), (8192, 4096));
        // v2: `anon` and `file`; a peak stays when the charge falls.
        record_peaks(&mut peak, "anon 4096\nfile 12288\nanon_thp 0\nfile_mapped 99999\n");
        assert_eq!((peak.anon_bytes, peak.file_bytes), (8192, 12288));
    }

    #[test]
    fn stale_names() {
        assert_eq!(stale_pid("ttrace-123-0"), Some(123));
        assert_eq!(stale_pid("ttrace-123-7-llama.completion"), Some(123));
        assert_eq!(stale_pid("ttrace-123"), None);
        assert_eq!(stale_pid("ttrace-x-1"), None);
        assert_eq!(stale_pid("other-123-1"), None);
        assert_eq!(stale_pid("ttrace-123-"), None);
    }
}
