//! The I/O programs: page faults, page-cache fills and faults, block
//! requests. Each event comes from its BTF tracepoint (the default), its
//! perf-event one (`--tracepoints perf`), or, where this kernel lacks the
//! tracepoint, an fentry program on the function that fires it (only
//! `filemap:mm_filemap_fault`, which 6.1 lacks, has one); which is decided
//! once at load, by asking the kernel (its BTF, tracefs), not its version.

use std::path::Path;

use aya::{
    Btf,
    programs::{BtfTracePoint, FEntry, TracePoint},
};
use tracer_common::{
    EventKind,
    kernel::KernelLayout,
    programs,
    tracepoints::{MAX_RWBS, NO_FIELD, PerfLayout},
};

use super::{LoadError, Tracer, program_error};
use crate::{
    cli::TracepointChoice,
    format::Tracepoints,
    live::kernel_btf::{self, BtfError, KernelTypes, Scope},
    live::tracefs,
};

/// The I/O programs' flavour, the kernel's types, and where each event
/// comes from on this kernel.
pub(super) struct Io {
    pub(super) flavour: Tracepoints,
    /// What aya loads `tp_btf` and fentry programs against: always there in
    /// the BTF flavour, in the perf one only when a stand-in needs it.
    btf: Option<Box<Btf>>,
    /// Per entry of `IO_TRACEPOINTS`.
    sources: Vec<IoSource>,
}

/// Where this kernel gets one I/O event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoSource {
    /// Its BTF tracepoint (`tp_btf`).
    Btf,
    /// Its perf-event tracepoint.
    Perf,
    /// The kernel lacks the tracepoint: its fentry stand-in on the kernel
    /// function that fires it.
    FEntry,
    /// Not recordable here, and why.
    Unavailable(String),
}

/// An I/O event as `ttrace check` reports it: where it comes from here, and
/// whether the kernel took its program.
#[derive(Debug)]
pub struct IoStatus {
    /// What it records (`page faults`).
    pub what: &'static str,
    /// `group:event`.
    pub event: String,
    pub kind: EventKind,
    pub source: IoSource,
    /// The program loaded, if any.
    pub program: Option<&'static str>,
    /// The function the fentry stand-in attaches to.
    pub function: Option<&'static str>,
    pub loaded: Result<(), LoadError>,
}

/// One I/O tracepoint: what it records, its program in each flavour, the
/// perf-event (group, event), the BTF tracepoint's name, the kind of event,
/// its fentry stand-in (program, kernel function) if it has one, and the
/// release that brought the tracepoint where it is recent.
#[derive(Clone, Copy)]
pub(super) struct IoTracepoint {
    what: &'static str,
    perf: &'static str,
    btf: &'static str,
    group: &'static str,
    event: &'static str,
    btf_name: &'static str,
    kind: EventKind,
    fentry: Option<(&'static str, &'static str)>,
    since: Option<&'static str>,
}

pub(super) const IO_TRACEPOINTS: [IoTracepoint; 5] = {
    use tracer_common::tracepoints::{
        block_rq_complete as complete, block_rq_issue as issue, filemap_add_to_page_cache as add,
        filemap_fault as fault, page_fault_user as pf,
    };
    const fn tp(
        what: &'static str,
        perf: &'static str,
        btf: &'static str,
        (group, event): (&'static str, &'static str),
        kind: EventKind,
    ) -> IoTracepoint {
        // The BTF tracepoint is the perf-event one without its group.
        IoTracepoint { what, perf, btf, group, event, btf_name: event, kind, fentry: None, since: None }
    }
    let mut filemap_fault = tp(
        "page-cache faults",
        programs::FILEMAP_FAULT,
        programs::FILEMAP_FAULT_BTF,
        (fault::GROUP, fault::NAME),
        EventKind::PageCache,
    );
    filemap_fault.fentry = Some((programs::FILEMAP_FAULT_FENTRY, programs::FILEMAP_FAULT_FUNCTION));
    filemap_fault.since = Some("6.10");
    [
        tp(
            "page faults",
            programs::PAGE_FAULT_USER,
            programs::PAGE_FAULT_USER_BTF,
            (pf::GROUP, pf::NAME),
            EventKind::PageFault,
        ),
        tp(
            "page-cache fills",
            programs::PAGE_CACHE_ADD,
            programs::PAGE_CACHE_ADD_BTF,
            (add::GROUP, add::NAME),
            EventKind::PageCache,
        ),
        filemap_fault,
        tp(
            "block requests",
            programs::BLOCK_RQ_ISSUE,
            programs::BLOCK_RQ_ISSUE_BTF,
            (issue::GROUP, issue::NAME),
            EventKind::Block,
        ),
        tp(
            "block completions",
            programs::BLOCK_RQ_COMPLETE,
            programs::BLOCK_RQ_COMPLETE_BTF,
            (complete::GROUP, complete::NAME),
            EventKind::Block,
        ),
    ]
};

/// The kind of event a program records, for its recursion misses.
pub(super) fn kind_of(program: &str) -> EventKind {
    let stand_in = |t: &IoTracepoint| t.fentry.is_some_and(|(fentry, _)| fentry == program);
    match IO_TRACEPOINTS.iter().find(|t| t.perf == program || t.btf == program || stand_in(t)) {
        Some(t) => t.kind,
        None if program == programs::CALL_ARGS || program == programs::CALL_RETURN => EventKind::Call,
        None if program == programs::UBATCH => EventKind::Batch,
        None => EventKind::Op,
    }
}

impl Tracer {
    /// Page-cache and block-request tracepoints (filtered by the watched
    /// files and devices).
    pub fn attach_io(&mut self) -> Result<(), LoadError> {
        for tp in IO_TRACEPOINTS.iter().filter(|t| t.kind != EventKind::PageFault) {
            self.attach_tracepoint(tp)?;
        }
        Ok(())
    }

    pub fn attach_page_faults(&mut self) -> Result<(), LoadError> {
        self.attach_tracepoint(&IO_TRACEPOINTS[0])
    }

    /// Attach one I/O tracepoint from the source chosen at load.
    fn attach_tracepoint(&mut self, tp: &IoTracepoint) -> Result<(), LoadError> {
        let IoTracepoint { perf, btf, group, event, btf_name, .. } = *tp;
        match self.io_source(tp) {
            IoSource::Btf => self.attach_btf(btf, btf_name),
            IoSource::Perf => {
                let tp: &mut TracePoint = self.program(perf)?;
                tp.attach(group, event).map(drop).map_err(|source| program_error(perf, source))
            }
            IoSource::FEntry => {
                let (program, function) = tp.fentry.ok_or(LoadError::Missing { what: "program", name: perf })?;
                log::info!("{group}:{event} is not in this kernel: recording `{function}` entry with fentry instead");
                let fentry = self.load_fentry(program, function)?;
                fentry.attach().map(drop).map_err(|source| program_error(program, source))
            }
            IoSource::Unavailable(why) => {
                log::warn!("{group}:{event} is not recorded: {why}");
                Ok(())
            }
        }
    }

    /// Where this kernel gets `tp`'s events (chosen at load).
    fn io_source(&self, tp: &IoTracepoint) -> IoSource {
        let i = IO_TRACEPOINTS.iter().position(|t| t.perf == tp.perf);
        match (&self.io, i) {
            (Some(io), Some(i)) => io.sources[i].clone(),
            _ => IoSource::Unavailable("the I/O programs were not loaded".into()),
        }
    }

    /// Load (once) fentry program `program` on kernel function `function`.
    fn load_fentry(&mut self, program: &'static str, function: &str) -> Result<&mut FEntry, LoadError> {
        let Some(types) = self.io.as_ref().and_then(|io| io.btf.as_deref()) else {
            return Err(LoadError::Btf(BtfError::Missing("the kernel's BTF".into())));
        };
        let first_use = self.loaded.insert(program);
        let found = self.ebpf.program_mut(program).ok_or(LoadError::Missing { what: "program", name: program })?;
        let found: &mut FEntry = found.try_into().map_err(|source| program_error(program, source))?;
        if first_use {
            found.load(function, types).map_err(|source| program_error(program, source))?;
        }
        Ok(found)
    }

    /// Load (once) and attach BTF tracepoint program `program` to `tracepoint`.
    pub(super) fn attach_btf(&mut self, program: &'static str, tracepoint: &str) -> Result<(), LoadError> {
        let found = self.load_btf(program, tracepoint)?;
        found.attach().map(drop).map_err(|source| program_error(program, source))
    }

    /// Load (once) BTF tracepoint program `program` for `tracepoint`.
    fn load_btf(&mut self, program: &'static str, tracepoint: &str) -> Result<&mut BtfTracePoint, LoadError> {
        let Some(types) = self.io.as_ref().and_then(|io| io.btf.as_deref()) else {
            return Err(LoadError::Btf(BtfError::Missing("the kernel's BTF (loaded with --tracepoints perf)".into())));
        };
        let first_use = self.loaded.insert(program);
        let found = self.ebpf.program_mut(program).ok_or(LoadError::Missing { what: "program", name: program })?;
        let found: &mut BtfTracePoint = found.try_into().map_err(|source| program_error(program, source))?;
        if first_use {
            found.load(tracepoint, types).map_err(|source| program_error(program, source))?;
        }
        Ok(found)
    }

    /// Load each I/O program this kernel would run, without attaching it
    /// (`ttrace check`).
    pub fn verify_io(&mut self) -> Vec<IoStatus> {
        let mut out = Vec::new();
        for tp in &IO_TRACEPOINTS {
            let source = self.io_source(tp);
            let (program, function, loaded) = match (&source, tp.fentry) {
                (IoSource::Btf, _) => (Some(tp.btf), None, self.load_btf(tp.btf, tp.btf_name).map(drop)),
                (IoSource::Perf, _) => (Some(tp.perf), None, self.program::<TracePoint>(tp.perf).map(drop)),
                (IoSource::FEntry, Some((program, function))) => {
                    (Some(program), Some(function), self.load_fentry(program, function).map(drop))
                }
                (IoSource::FEntry | IoSource::Unavailable(_), _) => (None, None, Ok(())),
            };
            let event = format!("{}:{}", tp.group, tp.event);
            out.push(IoStatus { what: tp.what, event, kind: tp.kind, source, program, function, loaded });
        }
        out
    }
}

/// Where each I/O event comes from on this kernel, for flavour `choice`,
/// and the kernel layout the object needs (`None` when no program reads it).
pub(super) fn plan_io(choice: TracepointChoice) -> Result<IoPlan, LoadError> {
    let mut types = match choice {
        TracepointChoice::Perf => None,
        TracepointChoice::Btf => Some(kernel_types(Scope::Tracepoints)?),
        TracepointChoice::Auto => kernel_types(Scope::Tracepoints)
            .inspect_err(|e| log::warn!("BTF tracepoints unavailable, using perf-event ones: {e}"))
            .ok(),
    };
    let flavour = if types.is_some() { Tracepoints::Btf } else { Tracepoints::Perf };
    let in_kernel = |tp: &IoTracepoint, types: Option<&(KernelTypes, Btf)>| match flavour {
        Tracepoints::Btf => types.is_some_and(|(t, _)| t.has_tracepoint(tp.btf_name)),
        Tracepoints::Perf => Path::new(tracefs::TRACEFS).join("events").join(tp.group).join(tp.event).is_dir(),
    };
    // The perf flavour reads the kernel's types only for a stand-in.
    if types.is_none() && IO_TRACEPOINTS.iter().any(|tp| tp.fentry.is_some() && !in_kernel(tp, None)) {
        types = kernel_types(Scope::StandIns).inspect_err(|e| log::debug!("no fentry stand-ins: {e}")).ok();
    }
    let sources = IO_TRACEPOINTS
        .iter()
        .map(|tp| {
            if in_kernel(tp, types.as_ref()) {
                return if flavour == Tracepoints::Btf { IoSource::Btf } else { IoSource::Perf };
            }
            let since = tp.since.map(|v| format!(", Linux {v}+")).unwrap_or_default();
            let missing = format!("needs tracepoint {}:{}{since}", tp.group, tp.event);
            match (tp.fentry, &types) {
                (Some(_), Some((t, _))) if t.layout.has_fault_fields() => IoSource::FEntry,
                (Some(_), _) => IoSource::Unavailable(format!("{missing}; its fentry stand-in needs the kernel's BTF")),
                (None, _) => IoSource::Unavailable(missing),
            }
        })
        .collect();
    let kernel = types.as_ref().map(|(t, _)| t.layout);
    let perf = match flavour {
        Tracepoints::Perf => Some(perf_layout(|group, event| tracefs::format(group, event).ok().flatten())),
        Tracepoints::Btf => None,
    };
    let btf = types.map(|(_, btf)| Box::new(btf));
    Ok(IoPlan { io: Io { flavour, btf, sources }, kernel, perf })
}

/// What `plan_io` decided, and the layouts the object is loaded with.
pub(super) struct IoPlan {
    pub io: Io,
    /// For the BTF programs and fentry stand-ins (`None`: none loads).
    pub kernel: Option<KernelLayout>,
    /// For the perf-event programs (`None`: BTF flavour).
    pub perf: Option<PerfLayout>,
}

/// The running kernel's record layout for the perf-event programs, from
/// the format files `format(group, event)` returns; 6.18's for a
/// tracepoint the kernel lacks (its program is not loaded then).
fn perf_layout(format: impl Fn(&str, &str) -> Option<String>) -> PerfLayout {
    use tracer_common::tracepoints::{
        block_rq_complete as complete, block_rq_issue as issue, filemap_add_to_page_cache as add,
        filemap_fault as fault, page_fault_user as pf,
    };
    let mut l = PerfLayout::DEFAULT;
    let read = |(group, event): (&str, &str), fields: &mut [(&mut u32, &str)]| {
        let Some(text) = format(group, event) else { return };
        for (slot, name) in fields.iter_mut() {
            **slot = match tracefs::parse_field(&text, name) {
                Some(field) => field.offset as u32,
                None => {
                    // Older kernels' page-cache record has no `order`: single pages then.
                    if *name == "order" {
                        log::debug!("{group}:{event} has no field `order`: recorded as 0");
                    } else {
                        log::warn!("{group}:{event} has no field `{name}`: recorded as 0");
                    }
                    NO_FIELD
                }
            };
        }
    };
    read(
        (pf::GROUP, pf::NAME),
        &mut [(&mut l.fault_address, "address"), (&mut l.fault_ip, "ip"), (&mut l.fault_error_code, "error_code")],
    );
    read(
        (add::GROUP, add::NAME),
        &mut [
            (&mut l.add_ino, "i_ino"),
            (&mut l.add_index, "index"),
            (&mut l.add_dev, "s_dev"),
            (&mut l.add_order, "order"),
        ],
    );
    read(
        (fault::GROUP, fault::NAME),
        &mut [
            (&mut l.filemap_fault_ino, "i_ino"),
            (&mut l.filemap_fault_dev, "s_dev"),
            (&mut l.filemap_fault_index, "index"),
        ],
    );
    read(
        (issue::GROUP, issue::NAME),
        &mut [
            (&mut l.issue_dev, "dev"),
            (&mut l.issue_sector, "sector"),
            (&mut l.issue_nr_sector, "nr_sector"),
            (&mut l.issue_rwbs, "rwbs"),
            (&mut l.issue_comm, "comm"),
        ],
    );
    read(
        (complete::GROUP, complete::NAME),
        &mut [
            (&mut l.complete_dev, "dev"),
            (&mut l.complete_sector, "sector"),
            (&mut l.complete_nr_sector, "nr_sector"),
            (&mut l.complete_error, "error"),
            (&mut l.complete_rwbs, "rwbs"),
        ],
    );
    let rwbs = format(issue::GROUP, issue::NAME).and_then(|text| tracefs::parse_field(&text, "rwbs"));
    if let Some(field) = rwbs {
        l.rwbs_len = (field.size as u32).min(MAX_RWBS);
    }
    l
}

/// The struct layout the tp_btf and fentry programs read, the tracepoints
/// the kernel declares, and aya's view of the same BTF (it loads those
/// programs against their target's type).
fn kernel_types(scope: Scope) -> Result<(KernelTypes, Btf), LoadError> {
    let types = kernel_btf::resolve(Path::new(kernel_btf::VMLINUX_BTF), scope)?;
    let btf = Btf::from_sys_fs().map_err(|e| LoadError::AyaBtf(Box::new(e)))?;
    Ok((types, btf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Format files of Debian's 6.1 and 7.2 kernels (fields only), where
    /// the perf records moved from 6.18's.
    fn debian(kernel: &str, group: &str, event: &str) -> Option<String> {
        let fields: &[(&str, usize, usize)] = match (kernel, group, event) {
            ("6.1", "block", "block_rq_issue") => {
                &[("dev", 8, 4), ("sector", 16, 8), ("nr_sector", 24, 4), ("rwbs", 32, 8), ("comm", 40, 16)]
            }
            ("6.1", "block", "block_rq_complete") => {
                &[("dev", 8, 4), ("sector", 16, 8), ("nr_sector", 24, 4), ("error", 28, 4), ("rwbs", 32, 8)]
            }
            ("7.2", "filemap", "mm_filemap_add_to_page_cache") => {
                &[("i_ino", 8, 8), ("pfn", 16, 8), ("index", 24, 8), ("s_dev", 32, 4), ("order", 36, 1)]
            }
            _ => return None,
        };
        let line = |(name, offset, size): &(&str, usize, usize)| {
            let decl =
                if *name == "rwbs" || *name == "comm" { format!("char {name}[{size}]") } else { format!("u64 {name}") };
            format!("\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:0;\n")
        };
        Some(fields.iter().map(line).collect())
    }

    #[test]
    fn the_perf_layout_follows_the_kernels_format_files() {
        let old = perf_layout(|g, e| debian("6.1", g, e));
        assert_eq!((old.issue_rwbs, old.issue_comm, old.complete_rwbs, old.rwbs_len), (32, 40, 32, 8));
        // No filemap events in that kernel's table: 6.18's stay.
        assert_eq!(old.add_ino, PerfLayout::DEFAULT.add_ino);
        let new = perf_layout(|g, e| debian("7.2", g, e));
        assert_eq!((new.add_ino, new.add_index, new.add_dev, new.add_order), (8, 24, 32, 36));
        assert_eq!(new.issue_rwbs, PerfLayout::DEFAULT.issue_rwbs);
    }
}
