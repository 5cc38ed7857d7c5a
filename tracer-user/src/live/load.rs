//! Stage 1, load: put the embedded eBPF object into the kernel, configure its
//! maps and attach programs. Everything here needs root.

use std::{collections::HashSet, num::NonZeroU32, path::Path};

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
    markers, programs,
};

use crate::{
    format::Lost,
    live::privileges::{PrivilegeError, require_tracing_privileges},
    live::tracefs::{self, TracefsError},
};

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
    #[error("eBPF program `{program}`: {error}")]
    Program { program: &'static str, error: Box<aya::programs::ProgramError> },
    #[error("eBPF map `{map}`: {error}")]
    Map { map: &'static str, error: Box<aya::maps::MapError> },
    #[error("attaching a uprobe to `{symbol}` in {binary}: {error}")]
    Attach { symbol: String, binary: String, error: Box<aya::programs::ProgramError> },
}

pub struct LoadOptions {
    /// Ring buffer bytes: a power of two, at least one page.
    pub ring_bytes: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { ring_bytes: tracer_common::DEFAULT_RING_BYTES }
    }
}

/// The loaded eBPF object. Dropping it detaches every program.
pub struct Tracer {
    ebpf: Ebpf,
    logger: Option<Logger>,
    loaded: HashSet<&'static str>,
}

impl Tracer {
    pub fn load(options: &LoadOptions) -> Result<Self, LoadError> {
        require_tracing_privileges()?;
        tracefs::ensure_mounted()?;
        let ring = options.ring_bytes;
        if !ring.is_power_of_two() || ring < 4096 {
            return Err(LoadError::RingSize(ring));
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(MAP_EVENTS, ring)
            .load(EBPF_OBJECT)
            .map_err(|e| LoadError::Load(Box::new(e)))?;
        // Kernel-side diagnostics go to the `log` crate; no log calls in the object is fine.
        let logger = EbpfLogger::init(&mut ebpf).inspect_err(|e| log::debug!("aya-log not wired: {e}")).ok();
        Ok(Self { ebpf, logger, loaded: HashSet::new() })
    }

    /// Record events of process `tgid` (and all its threads).
    pub fn add_target(&mut self, tgid: u32) -> Result<(), LoadError> {
        let map =
            self.ebpf.map_mut(MAP_TARGET_TGIDS).ok_or(LoadError::Missing { what: "map", name: MAP_TARGET_TGIDS })?;
        let mut targets: HashMap<_, u32, u8> = HashMap::try_from(map)
            .map_err(|source| LoadError::Map { map: MAP_TARGET_TGIDS, error: Box::new(source) })?;
        targets.insert(tgid, 1, 0).map_err(|source| LoadError::Map { map: MAP_TARGET_TGIDS, error: Box::new(source) })
    }

    /// Settings the programs read: record every worker thread or only
    /// `ith == 0`; the target's GET_ROWS op id (where token ids are read).
    pub fn configure(&mut self, all_threads: bool, get_rows_op: Option<u32>) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(LoadError::Missing { what: "map", name: MAP_CONFIG })?;
        let mut cfg: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        let flags = if all_threads { config::FLAG_ALL_THREADS } else { 0 };
        let get_rows = get_rows_op.map_or(u64::MAX, u64::from);
        for (slot, value) in [(config::FLAGS, flags), (config::GET_ROWS_OP, get_rows)] {
            cfg.set(slot, value, 0).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        }
        Ok(())
    }

    /// Stop the target with SIGSTOP when its first ubatch graph starts (see
    /// `config::STOP_AT_FIRST_GRAPH`); the caller continues it.
    pub fn stop_at_first_graph(&mut self) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(LoadError::Missing { what: "map", name: MAP_CONFIG })?;
        let mut cfg: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        cfg.set(config::STOP_AT_FIRST_GRAPH, 1, 0)
            .map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })
    }

    /// Wake the reader only once this many bytes wait in the ring (0: on
    /// every event). The reader must then also drain on a timer.
    pub fn set_wakeup_bytes(&mut self, bytes: u32) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(LoadError::Missing { what: "map", name: MAP_CONFIG })?;
        let mut cfg: Array<_, u64> =
            Array::try_from(map).map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })?;
        cfg.set(config::WAKEUP_BYTES, u64::from(bytes), 0)
            .map_err(|source| LoadError::Map { map: MAP_CONFIG, error: Box::new(source) })
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
        let probe: &mut UProbe = self.program(program)?;
        let scope = match pid.and_then(NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let location = match file_offset {
            Some(offset) => UProbeAttachLocation::AbsoluteOffset(offset),
            None => UProbeAttachLocation::Symbol(symbol),
        };
        let point = UProbeAttachPoint { location, cookie: Some(cookie) };
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

    /// Page-cache and block-request tracepoints (filtered by the watched
    /// files and devices).
    pub fn attach_io(&mut self) -> Result<(), LoadError> {
        use tracer_common::tracepoints::{block_rq_complete, block_rq_issue, filemap_add_to_page_cache, filemap_fault};
        for (program, group, event) in [
            (programs::PAGE_CACHE_ADD, filemap_add_to_page_cache::GROUP, filemap_add_to_page_cache::NAME),
            (programs::FILEMAP_FAULT, filemap_fault::GROUP, filemap_fault::NAME),
            (programs::BLOCK_RQ_ISSUE, block_rq_issue::GROUP, block_rq_issue::NAME),
            (programs::BLOCK_RQ_COMPLETE, block_rq_complete::GROUP, block_rq_complete::NAME),
        ] {
            let tp: &mut TracePoint = self.program(program)?;
            tp.attach(group, event).map_err(|source| LoadError::Program { program, error: Box::new(source) })?;
        }
        Ok(())
    }

    pub fn attach_page_faults(&mut self) -> Result<(), LoadError> {
        use tracer_common::tracepoints::page_fault_user as tp;
        let name = programs::PAGE_FAULT_USER;
        let program: &mut TracePoint = self.program(name)?;
        program
            .attach(tp::GROUP, tp::NAME)
            .map(drop)
            .map_err(|source| LoadError::Program { program: name, error: Box::new(source) })
    }

    /// Look a program up by name and load it into the kernel on first use.
    fn program<'a, P>(&'a mut self, name: &'static str) -> Result<&'a mut P, LoadError>
    where
        &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
        P: Loadable + 'a,
    {
        let first_use = self.loaded.insert(name);
        let program = self.ebpf.program_mut(name).ok_or(LoadError::Missing { what: "program", name })?;
        let program: &mut P =
            program.try_into().map_err(|source| LoadError::Program { program: name, error: Box::new(source) })?;
        if first_use {
            let started = std::time::Instant::now();
            program
                .load_into_kernel()
                .map_err(|source| LoadError::Program { program: name, error: Box::new(source) })?;
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
