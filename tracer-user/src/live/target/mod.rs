//! The traced program: which files hold the ggml/llama hooks (found the way
//! ld.so would, before the program runs, or from a live process's maps), facts
//! read from those binaries (op-name tables, build ids), and the held child of
//! `ttrace run`, and the memory cgroup and cache dropping of its experiments.
//! Needs no root except to switch users, create cgroups and drop caches.

pub mod cgroup;
pub mod code;
pub(crate) mod elf;
mod hooks;
mod ldcache;
mod libs;
pub mod memory;
mod probe_site;
mod residency;
mod spawn;
mod user;
mod version;

use std::path::PathBuf;

pub use cgroup::{CgroupError, CgroupVersion, LimitingCgroup, MemLimit, MemoryCgroup, MemoryStats, drop_caches};
pub use elf::{
    ElfIdent, OpNames, build_id, has_symbols, int_variable, interpreter, llama_commit, op_names, returned_string,
    symbol_file_offsets, symbol_ranges,
};
pub use hooks::{
    BASE_HOOKS, BUFFER_FREE, BUFFER_INIT, CPU_HOOKS, HookLibs, HookSource, LLAMA_HOOKS, LOADER_HOOK, OUTPUT_RESERVE,
    PROCESS_UBATCH, REQUIRED_HOOKS, SEQ_RM_CHECK, VERSION_SYMBOLS, WHISPER_DECODE, WHISPER_ENCODE, WHISPER_HOOKS,
    WHISPER_INIT, classify, mapped_files, missing_hooks, running,
};
pub use ldcache::LdCache;
pub use libs::{Closure, NotFound, program_image, resolve, resolve_needed, which, which_in};
pub use probe_site::{ProbeSite, Reads, probe_file_offsets, probe_sites};
pub use residency::{RangePlan, RangeSample, Residency, evict, resident_bytes};
pub use spawn::{HeldChild, RunningChild, SpawnLimitedError, SpawnOptions, spawn_limited};
pub use user::UserSpec;
pub use version::{BuildFacts, SET_USAGE};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not an ELF file", path.display())]
    NotElf { path: PathBuf },
    #[error("{}: {what}; ttrace traces 64-bit little-endian ELF programs only", path.display())]
    UnsupportedElf { path: PathBuf, what: &'static str },
    #[error("{}: malformed ELF: {source}", path.display())]
    Elf {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
    #[error("{}: more than {max} nested `#!` interpreters", path.display())]
    InterpreterLoop { path: PathBuf, max: usize },
    #[error("cannot find `{program}` in PATH")]
    NotInPath { program: String },
    #[error("no process with pid {pid}")]
    NoSuchPid { pid: u32 },
    #[error("cannot read /proc/{pid}/maps: {source} (run ttrace as root or as the owner of pid {pid})")]
    PidAccess {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the memory map of pid {pid}: {source}")]
    Maps {
        pid: u32,
        #[source]
        source: crate::model::MapsError,
    },
    #[error(
        "{}: cannot find the op-name table behind `{function}` ({reason}); \
         is this a libggml-base from an unusual compiler? Please report it",
        path.display()
    )]
    NoOpTable { path: PathBuf, function: &'static str, reason: &'static str },
    #[error(
        "pid {pid} has no ggml library loaded (no mapped file defines ggml_cpu_extra_compute_forward); \
         Python clients load it at `import llama_cpp`, so attach after that or pass --lib PATH"
    )]
    NoGgmlInPid { pid: u32 },
    #[error(
        "{} links no ggml library (no DT_NEEDED closure member defines ggml_cpu_extra_compute_forward); \
         if it loads ggml with dlopen, pass the library with --lib PATH",
        exe.display()
    )]
    NoGgmlInProgram { exe: PathBuf },
    #[error("{} has no symbol {symbol}: not {role} (pass the right library with --lib PATH)", lib.display())]
    NotHookLib { lib: PathBuf, symbol: &'static str, role: &'static str },
    #[error("no library defines {symbol} ({role}); searched: {searched} (pass the right library with --lib PATH)")]
    MissingHook { symbol: &'static str, role: &'static str, searched: String },
    #[error("`ttrace run` needs a command to run")]
    EmptyCommand,
    #[error("argument or environment entry {0:?} contains a NUL byte")]
    NulByte(String),
    #[error("cannot start `{program}`: {step} failed: {source}")]
    Fork {
        program: String,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{program}`: {reason}")]
    Exec { program: String, reason: String, errno: i32 },
    #[error("cannot switch to user {user} ({step}) before running `{program}`: {reason}")]
    SwitchUser { user: String, program: String, step: &'static str, reason: String },
    #[error("waiting for pid {pid}: {source}")]
    Wait {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("no user `{name}` in the passwd database (check --user)")]
    UnknownUser { name: String },
    #[error("looking up user `{name}`: {source}")]
    UserLookup {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl TargetError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io { path: path.to_path_buf(), source }
    }
}

/// `strerror` text without std's " (os error N)" suffix.
pub(crate) fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Whether `pid` exists and has not exited.
pub fn is_running(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z' | 'X'))
}

/// Whether a failed attach failed because `pid` exited. A SIGKILLed target
/// is gone from its maps before it is a zombie: a step may see it gone (or
/// fail on what it tore down) while its state still reads running, for the
/// moments its exit takes.
pub fn exited_while_attaching(pid: u32, error: &anyhow::Error) -> bool {
    let saw_it_gone =
        error.chain().any(|c| matches!(c.downcast_ref(), Some(TargetError::NoSuchPid { pid: p }) if *p == pid));
    saw_it_gone
        || (0..20).any(|_| {
            let gone = !is_running(pid);
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            gone
        })
}

/// The process's resident anonymous memory (`RssAnon` of /proc/PID/status:
/// heap, KV cache, compute buffers, weight copies), sampled while it runs.
/// Open files re-read from offset 0, not an open per sample: the path walk
/// was most of a sample's cost. status is exact but costly to format (a
/// tenth of the recorder's CPU under load, read every tick); statm is cheap
/// but its counters are not summed exactly (a page off). So status is read
/// only when statm's figures moved: a flat anon costs one small read, and
/// what a skipped read misses is under statm's per-CPU batching.
struct AnonRss {
    status: std::fs::File,
    statm: std::fs::File,
    text: Vec<u8>,
    /// statm's resident and shared pages at the last status read, and its RssAnon.
    last: Option<([u8; 64], usize, u64)>,
}

impl AnonRss {
    fn open(pid: u32) -> Option<Self> {
        let status = std::fs::File::open(format!("/proc/{pid}/status")).ok()?;
        let statm = std::fs::File::open(format!("/proc/{pid}/statm")).ok()?;
        Some(Self { status, statm, text: Vec::with_capacity(4096), last: None })
    }

    /// The bytes now, if the process still exists.
    fn bytes(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut statm = [0u8; 64];
        let n = self.statm.read_at(&mut statm, 0).ok()?;
        if let Some((seen, len, bytes)) = self.last
            && (seen, len) == (statm, n)
        {
            return Some(bytes);
        }
        // One read: `RssAnon` is in the first kilobyte, and a second read
        // (to see the end of the file) would format the whole file again.
        self.text.resize(4096, 0);
        let read = self.status.read_at(&mut self.text, 0).ok()?;
        let text = std::str::from_utf8(&self.text[..read]).ok()?;
        let kib = text.lines().find_map(|l| l.strip_prefix("RssAnon:"))?.trim().strip_suffix("kB")?.trim();
        let bytes = kib.parse::<u64>().ok()? * 1024;
        self.last = Some((statm, n, bytes));
        Some(bytes)
    }
}

/// What a run's memory is, sampled every tick and while `run` holds the
/// target at its first graph:
/// - for `simulate --anon auto`, what a memory limit must hold besides the
///   model's pages: the largest resident anonymous memory seen. The 26 MB
///   MoE model generates 24 tokens in 15 ms, so a run can end between two
///   ticks, and the ticks alone saw 0.2 MiB (before the model loaded) in
///   some runs and 4.4 MiB in others;
/// - under `--mem-limit`, the cgroup's memory.stat ([`cgroup::StatSampler`],
///   read by a thread of its own: often enough to keep reclaim's statistics
///   fresh).
pub struct MemorySamples {
    rss: Option<AnonRss>,
    peak: Option<u64>,
    cgroup: Option<cgroup::StatSampler>,
}

impl MemorySamples {
    pub fn open(pid: u32, cgroup_dir: Option<&std::path::Path>) -> Self {
        Self { rss: AnonRss::open(pid), peak: None, cgroup: cgroup_dir.and_then(cgroup::StatSampler::start) }
    }

    pub fn sample(&mut self) {
        self.peak = self.peak.max(self.rss.as_mut().and_then(AnonRss::bytes));
    }

    pub fn peak_anon(&self) -> Option<u64> {
        self.peak
    }

    pub fn cgroup_peak(&self) -> Option<crate::format::CgroupMemory> {
        self.cgroup.as_ref().map(cgroup::StatSampler::peak)
    }
}

/// `pid`'s descendants, nearest first (`/proc/PID/task/TID/children`): a
/// command such as `unshare --fork chroot ROOT PROGRAM` or `sh -c` runs its
/// program in a child. Processes that are gone on the way are skipped.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { continue };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else { continue };
            for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                if !found.contains(&child) && child != pid {
                    found.push(child);
                    next.insert(0, child);
                }
            }
        }
    }
    found
}

/// Sends `signal` to `pid`; a process already gone is no error.
pub fn signal(pid: u32, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: a plain syscall.
    if unsafe { libc::kill(pid, signal) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// The state letter of /proc/PID/stat (R, S, D, T, Z, ...), if the process exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The readahead of the device behind a file, in KiB: the `read_ahead_kb`
/// of its superblock's bdi, named by the filesystem's device (or, for a
/// partition, by its whole disk).
pub fn read_ahead_kb(fs_dev: (u32, u32), disk: Option<(u32, u32)>) -> Option<u32> {
    std::iter::once(fs_dev).chain(disk).find_map(|(major, minor)| {
        let text = std::fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb")).ok()?;
        text.trim().parse().ok()
    })
}

/// The kernel's fault-around size (mm/memory.c): readable in debugfs only;
/// its default, 64 KiB, when debugfs is not mounted.
pub fn fault_around_bytes() -> u64 {
    const DEFAULT: u64 = 64 << 10;
    std::fs::read_to_string("/sys/kernel/debug/fault_around_bytes")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(DEFAULT)
}
