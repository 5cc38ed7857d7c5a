//! The kernel's own block tracer (`current_tracer = blk`, the in-kernel half
//! of blktrace, printed through ftrace) as an independent oracle for ttrace's
//! block events.
//!
//! # Line format (checked on kernel 6.18 with the default trace options)
//!
//! ```text
//!              cat-30939   [000] d..1.  2787.653510: 254,0    D  RA 320561152 + 1024 [cat]
//!            rustc-30477   [001] d.s1.  2787.654088: 254,0    C  RA 320561152 + 1024 [0]
//!         opt cgu.10-30930 [001] d.s1.  2787.650157: 254,0    C  RA 10486280 + 112 [0]
//!              cat-30939   [000] d..1.  2787.646086: 254,0    P   N [cat]
//!            rustc-30477   [001] dN.1.  2787.670047: 254,0    X  RA 10142072 / 10144336 [rustc]
//! ```
//!
//! `TASK-PID [CPU] FLAGS TIMESTAMP: MAJOR,MINOR ACTION RWBS SECTOR + NR [COMM]`.
//! The task name may contain spaces (`opt cgu.10`); the flags column goes
//! away with `noirq-info`. The timestamp is in seconds with microseconds;
//! [`BlkTrace`] switches `trace_clock` to `mono` so it is CLOCK_MONOTONIC,
//! the clock of `bpf_ktime_get_ns`, and so comparable with ttrace's events.
//!
//! Actions: Q bio queued, G request allocated, M/F back/front merge, I
//! inserted into the scheduler, **D issued to the driver**, C completed, P/U
//! plug/unplug (no sector: `N`), X split (`SECTOR / NEW_SECTOR`), R requeued,
//! A remapped (partition to disk). RWBS: R read, W write, D discard, F flush,
//! then S sync, M metadata, A readahead, ...
//!
//! # What a D record is
//!
//! One `D` line is one request handed to the device driver: the
//! `block:block_rq_issue` tracepoint, after merging, so `SECTOR + NR` is the
//! whole request as the disk sees it. This is the same point ttrace's block
//! events hook, so per-request comparisons use D records. A requeued request
//! (an `R` line) is issued, and so printed as D, again. The task column is
//! whoever was running at issue time: usually the reader (plugged I/O is
//! issued at unplug in its context) but often a kblockd kworker
//! (`kworker/1:1H`), e.g. for re-issues after a requeue. Requeues are common
//! on this machine's virtio disk under a cold sequential read (a 32 MiB read
//! gave 38 D records for 21 requests): [`overlapping`] counts every D, as
//! `block_rq_issue` does; [`overlapping_final`] and [`final_issues`] drop the
//! requeued ones. On `C` lines the
//! task is whoever the completion interrupt hit and the bracket holds the
//! error code, not a name.
//!
//! # Sectors and a file's extents
//!
//! Sectors are 512-byte units of the *whole disk* (`/sys/block/vda`), whatever
//! the logical block size. FIEMAP (`ttrace gguf MODEL --extents`,
//! `ttrace::model::FileExtents::read`) gives each extent's `physical` byte
//! offset on the *file system's* device, which for a partition starts
//! `device.partition_start_sector` sectors into the disk. So file bytes
//! `[logical, logical + length)` of an extent are disk sectors
//! `partition_start_sector + physical / 512` onwards, `length / 512` of them.
//! On this machine the root file system is the whole disk vda (254:0), so
//! the partition start is 0. Extents of freshly written, unsynced files are
//! `delalloc` with no physical place yet: sync before reading extents
//! (FileExtents uses FIEMAP_FLAG_SYNC).

use std::{
    fs::{self, File},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
};

use ttrace::model::FileExtents;

const SECTOR: u64 = 512;
const BUFFER_KB: &str = "65536";

/// One parsed block-tracer line that names a sector range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkRecord {
    /// Trace clock (CLOCK_MONOTONIC under [`BlkTrace`]), microsecond precision.
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    /// Task name from the TASK-PID column (`<...>` if the kernel lost it).
    pub comm: String,
    pub action: char,
    pub rwbs: String,
    pub sector: u64,
    pub nr_sectors: u64,
    pub dev: (u32, u32),
    /// The bracket of a `C` line: the completion's error (0 = success).
    pub error: Option<i32>,
}

impl BlkRecord {
    /// Byte range on the whole disk.
    pub fn disk_bytes(&self) -> (u64, u64) {
        (self.sector * SECTOR, (self.sector + self.nr_sectors) * SECTOR)
    }
}

/// Everything read back from the tracer.
#[derive(Debug, Default)]
pub struct BlkLog {
    pub records: Vec<BlkRecord>,
    /// Lines not turned into records: headers, plug/unplug/split lines,
    /// messages, anything unrecognised.
    pub skipped: usize,
    /// Up to 10 skipped lines that were neither `#` headers nor known
    /// sector-less actions, for diagnosing format changes.
    pub unrecognised: Vec<String>,
    /// Events the ring buffer overwrote or dropped: non-zero means the
    /// oracle is incomplete and coverage checks are meaningless.
    pub lost_events: u64,
}

/// Parses the text of `/sys/kernel/tracing/trace` under the blk tracer.
pub fn parse_trace(text: &str) -> BlkLog {
    let mut log = BlkLog::default();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Parsed::Record(r) => log.records.push(r),
            Parsed::Known => log.skipped += 1,
            Parsed::Unknown => {
                log.skipped += 1;
                if let Some(n) = lost_in(line) {
                    log.lost_events += n;
                } else if !line.starts_with('#') && log.unrecognised.len() < 10 {
                    log.unrecognised.push(line.to_string());
                }
            }
        }
    }
    log
}

enum Parsed {
    Record(BlkRecord),
    /// A well-formed block-tracer line without a sector range (P, U, X...).
    Known,
    Unknown,
}

/// `CPU:1 [LOST 42 EVENTS]`.
fn lost_in(line: &str) -> Option<u64> {
    let rest = &line[line.find("[LOST ")? + 6..];
    rest.split_whitespace().next()?.parse().ok()
}

fn parse_line(line: &str) -> Parsed {
    let Some((comm, pid, cpu, ts_ns, body)) = parse_context(line) else { return Parsed::Unknown };
    let mut tok = body.split_whitespace();
    let Some(dev) = tok.next().and_then(|d| {
        let (a, b) = d.split_once(',')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }) else {
        return Parsed::Unknown;
    };
    let Some(action) = tok.next().filter(|a| a.chars().count() == 1).and_then(|a| a.chars().next()) else {
        return Parsed::Unknown;
    };
    let Some(rwbs) = tok.next() else { return Parsed::Unknown };
    let rest: Vec<&str> = tok.collect();
    let (Some(sector), Some(&"+"), Some(nr)) = (rest.first(), rest.get(1), rest.get(2)) else { return Parsed::Known };
    let (Ok(sector), Ok(nr_sectors)) = (sector.parse(), nr.parse()) else { return Parsed::Unknown };
    let error = match (action, rest.get(3)) {
        ('C', Some(b)) => b.strip_prefix('[').and_then(|b| b.strip_suffix(']')).and_then(|b| b.parse().ok()),
        _ => None,
    };
    Parsed::Record(BlkRecord {
        ts_ns,
        cpu,
        pid,
        comm: comm.to_string(),
        action,
        rwbs: rwbs.to_string(),
        sector,
        nr_sectors,
        dev,
        error,
    })
}

/// Splits `TASK-PID [CPU] [FLAGS] SECS.USECS: BODY`. The task name may hold
/// spaces, dashes and brackets, so try each ` [` until the rest fits.
fn parse_context(line: &str) -> Option<(&str, u32, u32, u64, &str)> {
    for (i, _) in line.match_indices(" [") {
        let Some((comm, pid)) = line[..i].trim().rsplit_once('-') else { continue };
        let Ok(pid) = pid.parse() else { continue };
        let Some((cpu, rest)) = line[i + 2..].split_once(']') else { continue };
        let Ok(cpu) = cpu.parse() else { continue };
        let rest = rest.trim_start();
        let (first, after) = rest.split_once(' ').unwrap_or((rest, ""));
        let (ts, body) = if first.ends_with(':') {
            (first, after)
        } else {
            after.trim_start().split_once(' ').unwrap_or((after, ""))
        };
        let Some(ts_ns) = ts.strip_suffix(':').and_then(parse_ts) else { continue };
        return Some((comm, pid, cpu, ts_ns, body));
    }
    None
}

fn parse_ts(ts: &str) -> Option<u64> {
    let (secs, frac) = ts.split_once('.')?;
    if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_ns: u64 = format!("{frac:0<9}").parse().ok()?;
    secs.parse::<u64>().ok()?.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// Whole-disk byte ranges `[start, end)`.
type Ranges = Vec<(u64, u64)>;

/// Whole-disk byte ranges of `extents`, and the disk's (major, minor) if known.
fn disk_ranges(extents: &FileExtents) -> (Ranges, Option<(u32, u32)>) {
    let base = extents.device.partition_start_sector * SECTOR;
    let ranges = extents.extents.iter().map(|e| (base + e.physical, base + e.physical + e.length)).collect();
    let dev = extents.device.disk_major.zip(extents.device.disk_minor);
    (ranges, dev)
}

/// The D records that reached the device: each D minus those undone by a
/// later R (requeue) of the same request. virtio-blk here requeues often when
/// its queue is full (`D`, `R`, then `D` again from a kblockd kworker), so
/// raw D counts overstate requests and bytes.
pub fn final_issues(records: &[BlkRecord]) -> Vec<&BlkRecord> {
    let mut keep: Vec<bool> = records.iter().map(|r| r.action == 'D').collect();
    for (i, r) in records.iter().enumerate().filter(|(_, r)| r.action == 'R') {
        let same = |d: &&BlkRecord| d.dev == r.dev && d.sector == r.sector && d.nr_sectors == r.nr_sectors;
        if let Some(j) = (0..i).rev().find(|&j| keep[j] && same(&&records[j])) {
            keep[j] = false;
        }
    }
    records.iter().zip(keep).filter_map(|(r, k)| k.then_some(r)).collect()
}

/// D records (issues) on the file's disk whose sectors overlap the file's
/// extents: how many, and the overlapping bytes summed over them. Every D
/// counts, re-issues after a requeue too, as `block_rq_issue` fires for each;
/// [`overlapping_final`] counts each request once.
pub fn overlapping(records: &[BlkRecord], extents: &FileExtents) -> (u64, u64) {
    overlap_sum(records.iter().filter(|r| r.action == 'D'), extents)
}

/// `(sector, sectors)` of each `D` record overlapping the file's extents.
pub fn in_extents(records: &[BlkRecord], extents: &FileExtents) -> Vec<(u64, u64)> {
    records_in_extents(records, extents, 'D').into_iter().map(|r| (r.sector, r.nr_sectors)).collect()
}

/// The records of one action (`D`, `C`, ...) on the file's disk whose
/// sectors overlap the file's extents.
pub fn records_in_extents<'a>(records: &'a [BlkRecord], extents: &FileExtents, action: char) -> Vec<&'a BlkRecord> {
    let (ranges, dev) = disk_ranges(extents);
    records
        .iter()
        .filter(|r| r.action == action && dev.is_none_or(|d| d == r.dev))
        .filter(|r| {
            let (a, b) = r.disk_bytes();
            ranges.iter().any(|&(s, e)| b.min(e) > a.max(s))
        })
        .collect()
}

/// Like [`overlapping`] over [`final_issues`]: requeued issues do not count,
/// so the bytes are what the device transferred.
pub fn overlapping_final(records: &[BlkRecord], extents: &FileExtents) -> (u64, u64) {
    overlap_sum(final_issues(records).into_iter(), extents)
}

fn overlap_sum<'a>(issues: impl Iterator<Item = &'a BlkRecord>, extents: &FileExtents) -> (u64, u64) {
    let (ranges, dev) = disk_ranges(extents);
    let mut requests = 0;
    let mut bytes = 0;
    for r in issues.filter(|r| dev.is_none_or(|d| d == r.dev)) {
        let (a, b) = r.disk_bytes();
        let overlap: u64 = ranges.iter().map(|&(s, e)| b.min(e).saturating_sub(a.max(s))).sum();
        if overlap > 0 {
            requests += 1;
            bytes += overlap;
        }
    }
    (requests, bytes)
}

/// Distinct bytes of the file's extents that some final issue covered.
pub fn covered_bytes(records: &[BlkRecord], extents: &FileExtents) -> u64 {
    let (ranges, dev) = disk_ranges(extents);
    let mut pieces: Vec<(u64, u64)> = Vec::new();
    for r in final_issues(records).into_iter().filter(|r| dev.is_none_or(|d| d == r.dev)) {
        let (a, b) = r.disk_bytes();
        pieces.extend(ranges.iter().map(|&(s, e)| (a.max(s), b.min(e))).filter(|(s, e)| s < e));
    }
    pieces.sort_unstable();
    let (mut total, mut end) = (0, 0);
    for (s, e) in pieces {
        let s = s.max(end);
        if e > s {
            total += e - s;
            end = e;
        }
    }
    total
}

/// Serialises users of the global ftrace state: threads of one test binary
/// through the mutex, separate processes through an flock.
static IN_PROCESS: Mutex<()> = Mutex::new(());
const LOCK_FILE: &str = "/tmp/ttrace-blktrace.lock";

/// The blk tracer running on one device. Everything it changed is put back
/// by [`stop`](Self::stop) or on drop, so a panicking test leaves no tracer
/// behind.
pub struct BlkTrace {
    tracefs: PathBuf,
    enable: PathBuf,
    saved: Vec<(PathBuf, String)>,
    restored: bool,
    _lock: File,
    _guard: MutexGuard<'static, ()>,
}

impl BlkTrace {
    /// Starts tracing block device `device_name` (e.g. "vda", or a partition
    /// such as "vda1"). Panics with the reason if it cannot (tests need
    /// root and a kernel with CONFIG_BLK_DEV_IO_TRACE).
    pub fn start(device_name: &str) -> BlkTrace {
        super::require_root("the kernel's block tracer");
        let guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .unwrap_or_else(|e| panic!("cannot open {LOCK_FILE}: {e}"));
        // SAFETY: flock on an fd we own; blocks until other users finish.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            panic!("cannot lock {LOCK_FILE}: {}", std::io::Error::last_os_error());
        }
        let tracefs = ttrace::live::tracefs::ensure_mounted().unwrap_or_else(|e| panic!("{e}")).to_path_buf();
        let enable = Path::new("/sys/class/block").join(device_name).join("trace/enable");
        assert!(
            enable.exists(),
            "{} does not exist: no block device {device_name:?}, or the kernel lacks CONFIG_BLK_DEV_IO_TRACE",
            enable.display()
        );
        let tracer = read(&tracefs.join("current_tracer"));
        // "blk" with the lock free means an earlier test was killed mid-run.
        assert!(
            tracer == "nop" || tracer == "blk",
            "ftrace's current_tracer is {tracer:?}: something else is using ftrace; wait or `echo nop > {}`",
            tracefs.join("current_tracer").display()
        );
        let mut t = BlkTrace { tracefs, enable, saved: Vec::new(), restored: false, _lock: lock, _guard: guard };
        let clock = read(&t.tracefs.join("trace_clock"));
        let clock = clock.split_whitespace().find_map(|c| c.strip_prefix('[')?.strip_suffix(']')).unwrap_or("local");
        let clock = clock.to_string();
        // "7 (expanded: 1408)": the buffer is still unallocated; 1408 is what
        // it would become, and the closest restorable state.
        let kb = read(&t.tracefs.join("buffer_size_kb"));
        let kb = kb.split_once("(expanded: ").map(|(_, e)| e.trim_end_matches(')')).unwrap_or(&kb).to_string();
        let on = read(&t.tracefs.join("tracing_on"));
        let ts = t.tracefs.clone();
        t.saved = vec![
            (t.enable.clone(), "0".into()),
            (ts.join("current_tracer"), "nop".into()),
            (ts.join("trace_clock"), clock),
            (ts.join("buffer_size_kb"), kb),
            (ts.join("tracing_on"), on),
        ];
        t.set("trace_clock", "mono");
        t.set("buffer_size_kb", BUFFER_KB);
        write(&t.enable, "1");
        t.set("current_tracer", "blk");
        t.set("tracing_on", "1");
        // Truncating `trace` clears every CPU's buffer (and its overrun counts).
        File::create(t.tracefs.join("trace")).unwrap_or_else(|e| panic!("cannot clear the trace buffer: {e}"));
        t
    }

    fn set(&self, file: &str, value: &str) {
        write(&self.tracefs.join(file), value);
    }

    /// Stops tracing and returns the records; panics if events were lost.
    pub fn stop(self) -> Vec<BlkRecord> {
        let log = self.stop_log();
        assert_eq!(log.lost_events, 0, "the blk tracer lost events: the buffer ({BUFFER_KB} KiB per CPU) overflowed");
        if !log.unrecognised.is_empty() {
            eprintln!("blk tracer: {} unrecognised lines, e.g. {:?}", log.unrecognised.len(), log.unrecognised[0]);
        }
        log.records
    }

    /// Stops tracing and returns everything read back.
    pub fn stop_log(mut self) -> BlkLog {
        // Freeze first: switching tracers clears the buffer.
        self.set("tracing_on", "0");
        let text = fs::read_to_string(self.tracefs.join("trace")).unwrap_or_else(|e| panic!("cannot read trace: {e}"));
        let mut log = parse_trace(&text);
        log.lost_events += self.overruns();
        self.restore();
        log
    }

    /// Overwritten plus dropped events, from each CPU's ring-buffer stats.
    fn overruns(&self) -> u64 {
        let Ok(cpus) = fs::read_dir(self.tracefs.join("per_cpu")) else { return 0 };
        cpus.flatten()
            .filter_map(|c| fs::read_to_string(c.path().join("stats")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        matches!(k.trim(), "overrun" | "dropped events").then(|| v.trim().parse::<u64>().ok())?
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    fn restore(&mut self) {
        if std::mem::replace(&mut self.restored, true) {
            return;
        }
        // Best effort, all of it: one failure must not leave the rest set.
        for (path, value) in &self.saved {
            if let Err(e) = fs::write(path, value) {
                eprintln!("blk tracer: cannot restore {} to {value:?}: {e}", path.display());
            }
        }
    }
}

impl Drop for BlkTrace {
    fn drop(&mut self) {
        self.restore();
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())).trim().to_string()
}

fn write(path: &Path, value: &str) {
    fs::write(path, value).unwrap_or_else(|e| panic!("cannot write {value:?} to {}: {e}", path.display()));
}
