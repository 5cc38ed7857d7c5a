//! Stage 1, load: put the embedded eBPF object into the kernel, configure its
//! maps and attach programs. Everything here needs root.

use std::{
    collections::{BTreeMap, HashSet},
    num::NonZeroU32,
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{TracePoint, UProbe, uprobe::UProbeScope},
};
use aya::{
    maps::Array,
    programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint},
};
use aya_log::EbpfLogger;
use strum::IntoEnumIterator;
use tracer_common::{
    EventKind, FileKey, MAP_BLOCK_DEVICES, MAP_CONFIG, MAP_EVENTS, MAP_LOST, MAP_MODEL_FILES, MAP_TARGET_TGIDS, config,
    kernel::KERNEL_LAYOUT,
    layout::{GGML_LAYOUT_SECTION, GgmlLayout},
    markers, programs,
    tracepoints::PERF_LAYOUT,
};

use crate::{
    cli::TracepointChoice,
    format::{Lost, Tracepoints},
    live::kernel_btf::BtfError,
    live::privileges::{PrivilegeError, require_tracing_privileges},
    live::tracefs::{self, TracefsError},
    live::verifier,
};

mod io;
mod kfuncs;
mod processes;
mod support;

use io::{Io, kind_of, plan_io};
pub use io::{IoSource, IoStatus};
pub use kfuncs::Kfuncs;
pub use support::KernelSupport;

/// The object built by tracer-user's build.rs from tracer-ebpf.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

pub type Logger = EbpfLogger<&'static dyn log::Log>;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("ring buffer size {0} is not a power of two of at least 4096 bytes")]
    RingSize(u32),
    #[error("loading the eBPF object into the kernel failed: {0}")]
    Load(Box<aya::EbpfError>),
    #[error("the eBPF object has no {what} `{name}`: tracer-common and tracer-ebpf are out of sync")]
    Missing { what: &'static str, name: &'static str },
    /// One line (`verifier::summary`); the whole verifier log is logged at
    /// debug level where the error is made (`program_error`).
    #[error("eBPF program `{program}`: {}", verifier::summary(.error))]
    Program { program: &'static str, error: Box<aya::programs::ProgramError> },
    #[error("eBPF map `{map}`: {error}")]
    Map { map: &'static str, error: Box<aya::maps::MapError> },
    #[error("attaching a uprobe to `{symbol}` in {binary}: {}", verifier::summary(.error))]
    Attach { symbol: String, binary: String, error: Box<aya::programs::ProgramError> },
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error("reading the kernel's BTF for the tp_btf programs: {0} (use --tracepoints perf)")]
    AyaBtf(Box<aya::BtfError>),
    #[error("reading eBPF program `{program}`'s counters: {error}")]
    ProgramInfo { program: &'static str, error: std::io::Error },
    #[error(transparent)]
    Kfuncs(#[from] kfuncs::KfuncError),
}

pub struct LoadOptions {
    /// Ring buffer bytes: a power of two, at least one page.
    pub ring_bytes: u32,
    /// Which tracepoint flavour the I/O programs use; `None`: no I/O programs.
    pub tracepoints: Option<TracepointChoice>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { ring_bytes: tracer_common::DEFAULT_RING_BYTES, tracepoints: Some(TracepointChoice::Auto) }
    }
}

/// The loaded eBPF object. Dropping it detaches every program.
pub struct Tracer {
    ebpf: Ebpf,
    logger: Option<Logger>,
    loaded: HashSet<&'static str>,
    /// How the I/O programs load (`None`: not loaded).
    io: Option<Io>,
    /// Which uprobe programs load as themselves, which as stand-ins.
    support: KernelSupport,
    /// Whether the uprobe programs run with preemption off.
    kfuncs: Kfuncs,
}

/// `--values`: the kernel's counts of reads it did not send, by reason
/// (`tracer_common::values::unread`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ValueCounts {
    pub unread_params: u64,
    pub unread_site: u64,
    pub unread_runs: u64,
    pub unread_busy: u64,
    /// Reads of nodes `--values-filter` leaves out.
    pub filtered_skipped: u64,
}

/// What the kernel skipped running ttrace's programs for.
#[derive(Debug, Default)]
pub struct RecursionMisses {
    pub per_program: BTreeMap<String, u64>,
    pub per_kind: Lost,
}

impl Tracer {
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        require_tracing_privileges()?;
        tracefs::ensure_mounted()?;
        let ring = options.ring_bytes;
        if !ring.is_power_of_two() || ring < 4096 {
            return Err(LoadError::RingSize(ring));
        }
        let plan = options.tracepoints.map(plan_io).transpose()?;
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(MAP_EVENTS, ring);
        if let Some(layout) = plan.as_ref().and_then(|p| p.kernel.as_ref()) {
            loader.override_global(KERNEL_LAYOUT, layout, true);
        }
        if let Some(layout) = plan.as_ref().and_then(|p| p.perf.as_ref()) {
            loader.override_global(PERF_LAYOUT, layout, true);
        }
        let kfuncs = Kfuncs::of_this_kernel();
        if let Kfuncs::Absent(why) = &kfuncs {
            log::debug!("uprobe programs run preemptibly: {why}");
        }
        let object = kfuncs::link(EBPF_OBJECT, &kfuncs)?;
        let mut ebpf = loader.load(object.bytes()).map_err(|e| LoadError::Load(Box::new(e)))?;
        let io = plan.map(|p| p.io);
        // Kernel-side diagnostics go to the `log` crate; no log calls in the object is fine.
        let logger = EbpfLogger::init(&mut ebpf).inspect_err(|e| log::debug!("aya-log not wired: {e}")).ok();
        Ok(Self { ebpf, logger, loaded: HashSet::new(), io, support: KernelSupport::detect(), kfuncs })
    }

    /// Whether the uprobe programs run with preemption off here (`pinned`
    /// in tracer-ebpf), and why not.
    pub fn kfuncs(&self) -> &Kfuncs {
        &self.kfuncs
    }

    /// What this kernel lets the uprobe programs call.
    pub fn support(&self) -> KernelSupport {
        self.support
    }

    /// Which flavour the I/O programs are (`None`: not loaded).
    pub fn tracepoints(&self) -> Option<Tracepoints> {
        self.io.as_ref().map(|io| io.flavour)
    }

    /// Record events of process `tgid` (and all its threads).
    pub fn add_target(&mut self, tgid: u32) -> Result<(), LoadError> {
        let map =
            self.ebpf.map_mut(MAP_TARGET_TGIDS).ok_or(LoadError::Missing { what: "map", name: MAP_TARGET_TGIDS })?;
        let mut targets: HashMap<_, u32, u8> = HashMap::try_from(map)
            .map_err(|source| LoadError::Map { map: MAP_TARGET_TGIDS, error: Box::new(source) })?;
        targets.insert(tgid, 1, 0).map_err(|source| LoadError::Map { map: MAP_TARGET_TGIDS, error: Box::new(source) })
    }

    /// Settings the programs read: record every worker thread or only `ith == 0`.
    pub fn configure(&mut self, all_threads: bool) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(LoadError::Missing { what: "map", name: MAP_CONFIG })?;
        let mut cfg: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        let flags = if all_threads { config::FLAG_ALL_THREADS } else { 0 };
        cfg.set(config::FLAGS, flags, 0).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })
    }

    /// Where the ggml and llama probes find the fields they read (see
    /// `tracer_common::layout`): before they are attached, and again to turn
    /// the ubatch probe off.
    pub fn set_ggml_layout(&mut self, layout: &GgmlLayout) -> Result<(), LoadError> {
        const MAP: &str = GGML_LAYOUT_SECTION;
        let map = self.ebpf.map_mut(MAP).ok_or(LoadError::Missing { what: "map", name: MAP })?;
        let mut global: Array<_, GgmlLayout> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP, error: Box::new(source) })?;
        global.set(0, layout, 0).map_err(|source| LoadError::Map { map: MAP, error: Box::new(source) })
    }

    /// Set `slots` of the `u64` array map `name` (a probe family's settings).
    pub fn set_array(&mut self, name: &'static str, slots: &[(u32, u64)]) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(name).ok_or(LoadError::Missing { what: "map", name })?;
        let mut array: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: name, error: Box::new(source) })?;
        for &(slot, value) in slots {
            array.set(slot, value, 0).map_err(|source| LoadError::Map { map: name, error: Box::new(source) })?;
        }
        Ok(())
    }

    /// Stop the target with SIGSTOP when its first ubatch graph starts (see
    /// `config::STOP_AT_FIRST_GRAPH`); the caller continues it.
    pub fn stop_at_first_graph(&mut self) -> Result<(), LoadError> {
        self.set_config(config::STOP_AT_FIRST_GRAPH, 1)
    }

    /// Stop the target at each library load (`markers::LIBRARY_LOADED`,
    /// `config::HOLD_AT_LIBRARY_LOAD`) until this is turned off; the caller
    /// continues it each time.
    pub fn hold_at_library_load(&mut self, on: bool) -> Result<(), LoadError> {
        self.set_config(config::HOLD_AT_LIBRARY_LOAD, u64::from(on))
    }

    /// Wake the reader only once this many bytes wait in the ring (0: on
    /// every event). The reader must then also drain on a timer.
    pub fn set_wakeup_bytes(&mut self, bytes: u32) -> Result<(), LoadError> {
        self.set_config(config::WAKEUP_BYTES, u64::from(bytes))
    }

    fn set_config(&mut self, slot: u32, value: u64) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(LoadError::Missing { what: "map", name: MAP_CONFIG })?;
        let mut cfg: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        cfg.set(slot, value, 0).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })
    }

    /// Attach the generic argument-recording uprobe to `symbol` in `binary`,
    /// for process `pid` only, or for every process mapping it.
    pub fn attach_call_args(&mut self, binary: &Path, symbol: &str, pid: Option<u32>) -> Result<(), LoadError> {
        self.attach_uprobe(programs::CALL_ARGS, binary, symbol, pid, markers::SELFTEST)
    }

    /// Attach uprobe (or uretprobe) program `program` to `symbol` in
    /// `binary`; `cookie` tells the program which function fired.
    pub fn attach_uprobe(
        &mut self,
        program: &'static str,
        binary: &Path,
        symbol: &str,
        pid: Option<u32>,
        cookie: u64,
    ) -> Result<(), LoadError> {
        self.attach_uprobe_at(program, binary, symbol, None, pid, cookie)
    }

    /// As `attach_uprobe`, at a known file offset of `symbol` when given
    /// (saves aya a parse of the whole library per probe).
    pub fn attach_uprobe_at(
        &mut self,
        program: &'static str,
        binary: &Path,
        symbol: &str,
        file_offset: Option<u64>,
        pid: Option<u32>,
        cookie: u64,
    ) -> Result<(), LoadError> {
        let (program, cookie) = self.support.stand_in(program, cookie);
        let probe: &mut UProbe = self.program(program)?;
        let scope = match pid.and_then(NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let location = match file_offset {
            Some(offset) => UProbeAttachLocation::AbsoluteOffset(offset),
            None => UProbeAttachLocation::Symbol(symbol),
        };
        let point = UProbeAttachPoint { location, cookie };
        probe.attach(point, binary, scope).map(drop).map_err(|source| LoadError::Attach {
            symbol: symbol.to_string(),
            binary: binary.display().to_string(),
            error: Box::new(source),
        })
    }

    /// Record page-cache events of this file (`dev` in kernel encoding).
    pub fn watch_file(&mut self, file: FileKey) -> Result<(), LoadError> {
        self.insert_key(MAP_MODEL_FILES, file)
    }

    /// `--values-filter`: node names whose bytes the kernel need not copy.
    pub fn skip_value_names(&mut self, names: &[[u8; tracer_common::ggml::MAX_NAME]]) -> Result<(), LoadError> {
        names.iter().try_for_each(|&name| self.insert_key(tracer_common::values::MAP_VALUE_SKIP_NAMES, name))
    }

    /// Record block requests on this device (`dev` in kernel encoding).
    pub fn watch_block_device(&mut self, dev: u32) -> Result<(), LoadError> {
        self.insert_key(MAP_BLOCK_DEVICES, dev)
    }

    fn insert_key<K: aya::Pod>(&mut self, name: &'static str, key: K) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(name).ok_or(LoadError::Missing { what: "map", name })?;
        let mut set: HashMap<_, K, u8> =
            HashMap::try_from(map).map_err(|source| LoadError::Map { map: name, error: Box::new(source) })?;
        set.insert(key, 1, 0).map_err(|source| LoadError::Map { map: name, error: Box::new(source) })
    }

    /// Load a uprobe program without attaching it (`ttrace check`): each of
    /// its stand-ins where this kernel needs them.
    pub fn verify_uprobe(&mut self, program: &'static str) -> Result<(), LoadError> {
        for program in self.support.programs_for(program) {
            self.program::<UProbe>(program)?;
        }
        Ok(())
    }

    /// `ttrace check`'s forced recursion miss (see tracer-ebpf's `selftest`):
    /// each call of `symbol` in `binary` by process `pid` is then one miss of
    /// [`programs::RECURSION_SELFTEST`]. `false` without BTF tracepoints.
    pub fn attach_recursion_selftest(&mut self, binary: &Path, symbol: &str, pid: u32) -> Result<bool, LoadError> {
        if self.tracepoints() != Some(Tracepoints::Btf) {
            return Ok(false);
        }
        self.attach_btf(programs::RECURSION_SELFTEST, "bpf_trace_printk")?;
        self.attach_uprobe(programs::RECURSION_TRIGGER, binary, symbol, Some(pid), 0)?;
        Ok(true)
    }

    /// Per loaded program, the runs the kernel skipped because it (BTF
    /// tracepoints, uprobes) or any BPF program (perf-event tracepoints)
    /// was already running on that CPU: `bpf_prog_info.recursion_misses`.
    pub fn recursion_misses(&self) -> Result<RecursionMisses, LoadError> {
        let mut misses = RecursionMisses::default();
        for &name in &self.loaded {
            let Some(program) = self.ebpf.program(name) else { continue };
            let fd = program.fd().map_err(|source| program_error(name, source))?;
            let n = recursion_misses_of(fd.as_fd()).map_err(|error| LoadError::ProgramInfo { program: name, error })?;
            misses.per_program.insert(name.to_string(), n);
            misses.per_kind[kind_of(programs::compat::original(name))] += n;
        }
        Ok(misses)
    }

    /// Look a program up by name and load it into the kernel on first use.
    fn program<'a, P>(&'a mut self, name: &'static str) -> Result<&'a mut P, LoadError>
    where
        &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
        P: Loadable + 'a,
    {
        let first_use = self.loaded.insert(name);
        let program = self.ebpf.program_mut(name).ok_or(LoadError::Missing { what: "program", name })?;
        let program: &mut P = program.try_into().map_err(|source| program_error(name, source))?;
        if first_use {
            let started = std::time::Instant::now();
            program.load_into_kernel().map_err(|source| program_error(name, source))?;
            log::debug!("program {name} verified and loaded in {:?}", started.elapsed());
        }
        Ok(program)
    }

    /// Sum of the per-CPU lost counters, per event kind.
    pub fn lost(&self) -> Result<Lost, LoadError> {
        let map = self.ebpf.map(MAP_LOST).ok_or(LoadError::Missing { what: "map", name: MAP_LOST })?;
        let per_cpu: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|source| LoadError::Map { map: MAP_LOST, error: Box::new(source) })?;
        let mut lost = Lost::default();
        for kind in EventKind::iter() {
            let values = per_cpu
                .get(&(kind as u32), 0)
                .map_err(|source| LoadError::Map { map: MAP_LOST, error: Box::new(source) })?;
            lost[kind] += values.iter().sum::<u64>();
        }
        Ok(lost)
    }

    /// `--values`: each thread of process `tgid` that computed a node, with
    /// the nodes it started and barriers it entered (empty without the map).
    pub fn value_threads(&self, tgid: u32) -> Result<Vec<crate::format::ValueThread>, LoadError> {
        use tracer_common::values::{MAP_VALUE_TASKS, ValueTask};
        let Some(map) = self.ebpf.map(MAP_VALUE_TASKS) else { return Ok(Vec::new()) };
        let tasks: Array<_, ValueTask> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_VALUE_TASKS, error: Box::new(source) })?;
        let mut threads = Vec::new();
        for task in tasks.iter() {
            let task = task.map_err(|source| LoadError::Map { map: MAP_VALUE_TASKS, error: Box::new(source) })?;
            if task.owner >> 32 == u64::from(tgid) {
                let (tid, nodes, barriers) = (task.owner as u32, task.nodes_total, task.barriers_total);
                threads.push(crate::format::ValueThread { tid, nodes, barriers });
            }
        }
        Ok(threads)
    }

    /// `--values`: nodes and runs the kernel did not send, by reason; zeros
    /// without the map.
    pub fn values_unread(&self) -> Result<ValueCounts, LoadError> {
        use tracer_common::values::{MAP_VALUE_UNREAD, unread};
        let Some(map) = self.ebpf.map(MAP_VALUE_UNREAD) else { return Ok(ValueCounts::default()) };
        let error = |source| LoadError::Map { map: MAP_VALUE_UNREAD, error: Box::new(source) };
        let per_cpu: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(error)?;
        let sum = |slot| -> Result<u64, LoadError> { Ok(per_cpu.get(&slot, 0).map_err(error)?.iter().sum()) };
        Ok(ValueCounts {
            unread_params: sum(unread::PARAMS)?,
            unread_site: sum(unread::SITE)?,
            unread_runs: sum(unread::POOL)?,
            unread_busy: sum(unread::BUSY)?,
            filtered_skipped: sum(unread::FILTERED)?,
        })
    }

    /// Hand the event ring buffer to the collector (once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let map = self.ebpf.take_map(MAP_EVENTS).ok_or(LoadError::Missing { what: "map", name: MAP_EVENTS })?;
        RingBuf::try_from(map).map_err(|source| LoadError::Map { map: MAP_EVENTS, error: Box::new(source) })
    }

    /// Hand the aya-log reader to the collector, if the object logs.
    pub fn take_logger(&mut self) -> Option<Logger> {
        self.logger.take()
    }
}

/// A program error, its whole verifier log (if any) logged at debug level:
/// the error itself says one line (`RUST_LOG=debug` or `-vv` shows the rest).
fn program_error(program: &'static str, error: aya::programs::ProgramError) -> LoadError {
    if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &error {
        log::debug!("verifier log of eBPF program `{program}`:\n{verifier_log}");
    }
    LoadError::Program { program, error: Box::new(error) }
}

/// The program types ttrace loads, behind one `load` call.
pub trait Loadable {
    fn load_into_kernel(&mut self) -> Result<(), aya::programs::ProgramError>;
}

impl Loadable for UProbe {
    fn load_into_kernel(&mut self) -> Result<(), aya::programs::ProgramError> {
        self.load()
    }
}

impl Loadable for TracePoint {
    fn load_into_kernel(&mut self) -> Result<(), aya::programs::ProgramError> {
        self.load()
    }
}

/// `bpf_prog_info.recursion_misses` of a program (`BPF_OBJ_GET_INFO_BY_FD`;
/// aya reads the struct but keeps that field to itself).
fn recursion_misses_of(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u64> {
    /// The `info` member of `union bpf_attr`.
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // SAFETY: a plain C struct of integers; all-zero is a valid value.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<aya_obj::generated::bpf_prog_info>() as u32,
        info: (&raw mut info) as u64,
    };
    // SAFETY: attr and info outlive the call; the kernel writes at most info_len bytes.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, &raw const attr, size_of::<InfoByFd>()) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.recursion_misses)
}
