//! A tracing session, shared by `ttrace run` and `ttrace attach`: attach the
//! probes to the target's ggml/llama libraries, record until the target
//! exits (or Ctrl-C, SIGTERM, the duration), and close the trace cleanly.
//! The probe plan, the signals, the header and the trace file's guard are
//! modules of their own.

mod gate;
mod header;
mod hold;
mod late;
mod plan;
mod ring;
mod signals;
pub mod trace_file;
mod values;

#[cfg(test)]
pub(crate) use plan::{hooks_with_cookies, uprobe_programs};
pub use ring::RingSpec;

use std::{
    fs::File,
    io::BufWriter,
    os::{fd::OwnedFd, unix::process::ExitStatusExt},
    path::PathBuf,
    process::ExitStatus,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};

use self::{
    gate::Layouts,
    header::{header, monotonic_ns, proc_cmdline},
    plan::{Attached, OpOptions},
    signals::{CHILD_GRACE, on_signal, sleep_until},
    trace_file::TraceFile,
};
use crate::{
    cli::TracepointChoice,
    events::Event,
    format::{Lost, Mode, StopReason, Trailer, WriterStats},
    live::collect::{EventStream, spawn_logger},
    live::layouts::Refusal,
    live::load::{LoadOptions, Tracer},
    live::recorder::{Recorder, Resolver},
    live::target::{self, HeldChild, RunningChild, UserSpec},
};

/// What to trace.
pub enum Target {
    /// A child held before exec (`ttrace run`).
    Run { child: HeldChild, argv: Vec<String> },
    /// A running process (`ttrace attach`).
    Attach { pid: u32 },
}

pub struct SessionSpec {
    pub output: PathBuf,
    /// Model files watched from the start (page cache, block I/O).
    pub models: Vec<PathBuf>,
    /// Record page faults, page-cache fills and block requests.
    pub io: bool,
    /// Recorded in the header: the experiment's conditions.
    pub drop_caches: bool,
    pub mem_limit: Option<u64>,
    pub cgroup: Option<String>,
    /// The memory cgroup's directory, whose memory.stat is sampled (`--mem-limit`).
    pub cgroup_dir: Option<PathBuf>,
    pub all_threads: bool,
    /// Per-node probes (op durations) instead of per-graph capture.
    pub op_timing: bool,
    /// `--lib` overrides: searched first for hook symbols.
    pub libs: Vec<PathBuf>,
    pub duration: Option<Duration>,
    pub ring_bytes: u32,
    pub tracepoints: TracepointChoice,
    /// Owner of the trace file (the user behind sudo).
    pub owner: Option<UserSpec>,
    /// `--values`: node output fingerprints.
    pub values: Option<ValuesSpec>,
    /// `--max-size [--max-files]`: a ring of files named after `output`.
    pub ring: Option<RingSpec>,
}

/// `--values [--values-filter REGEX]`.
pub struct ValuesSpec {
    /// Only nodes whose name matches are kept (all are read).
    pub filter: Option<regex_lite::Regex>,
}

/// Sees what a session records, as it records it (`ttrace top`).
pub trait Tap {
    /// The target is about to run: after `--drop-caches`, before a `run`
    /// child is released.
    fn started(&mut self, resolver: &mut Resolver);
    /// Every event the recorder took, after it took it.
    fn on_event(&mut self, event: &Event, recorder: &mut Recorder<BufWriter<File>>);
    /// At every tick of the session; `true` asks it to stop, as Ctrl-C does
    /// (`run`'s child gets SIGINT, an attached target is left running).
    fn tick(&mut self, resolver: &mut Resolver) -> bool;
}

pub struct Outcome {
    pub stop_reason: StopReason,
    pub exit: Option<ExitStatus>,
    pub stats: WriterStats,
    pub lost: Lost,
    /// What the trace's first and last frames say, for a summary made
    /// without reading the trace back.
    pub header: crate::format::Header,
    pub trailer: Trailer,
}

/// The longest wait at the end for model-file reads still in flight.
const IO_SETTLE: Duration = Duration::from_millis(500);

/// How often the ring is drained (a quarter-full ring wakes ttrace sooner)
/// and the trace flushed (so a SIGKILLed tracer leaves a readable file).
/// Every wake-up can take a CPU from the target's threads (on 2 cores, a
/// 20 ms tick cost 2-3 % at `-t 2`).
const TICK: Duration = Duration::from_millis(100);
/// How long after the target's exit a Ctrl-C may still arrive and count.
const SIGNAL_WITH_EXIT: Duration = Duration::from_millis(50);
/// The tick until the op probes are attached: the maps are rescanned for
/// libraries loaded with dlopen, and a late attach misses the first graphs.
const HOOK_SEARCH_TICK: Duration = Duration::from_millis(20);
const FLUSH_EVERY: Duration = Duration::from_millis(100);

pub async fn trace(target: Target, spec: &SessionSpec) -> Result<Outcome> {
    trace_with_tap(target, spec, None).await
}

/// [`trace`], with `tap` shown every event as it is recorded.
pub async fn trace_with_tap(target: Target, spec: &SessionSpec, tap: Option<Box<dyn Tap>>) -> Result<Outcome> {
    let attach_pid = match &target {
        Target::Attach { pid } => Some(*pid),
        Target::Run { .. } => None,
    };
    // Before the target starts: a Ctrl-C while attaching then reaches the
    // loop (a `run` child gets it once released) instead of killing ttrace
    // and orphaning the child.
    let signals = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    // A failed start drops the trace file's guard, which removes the file.
    let live = match start(target, spec, tap) {
        Ok(live) => live,
        Err(e) => {
            // Whatever step failed (maps gone, perf_event_open ESRCH, pidfd),
            // the cause is the target's exit, so say that rather than the step.
            return Err(match attach_pid {
                Some(pid) if target::exited_while_attaching(pid, &e) => {
                    anyhow::anyhow!("pid {pid} exited while ttrace was attaching; nothing was traced")
                }
                _ => e,
            });
        }
    };
    record_until_stop(live, spec, signals).await
}

/// A session with its probes attached and the target running.
struct Live<'a> {
    tracer: Tracer,
    session: Session<'a>,
    stream: EventStream,
    child: Option<RunningChild>,
    exited: AsyncFd<OwnedFd>,
    _log_task: Option<tokio::task::JoinHandle<()>>,
}

/// Load, attach and create the trace file, then let a `run` child go.
fn start<'a>(target: Target, spec: &'a SessionSpec, tap: Option<Box<dyn Tap>>) -> Result<Live<'a>> {
    let (pid, mode, command) = match &target {
        Target::Run { child, argv } => (child.pid(), Mode::Run, argv.clone()),
        Target::Attach { pid } => (*pid, Mode::Attach, proc_cmdline(*pid)),
    };
    let started = Instant::now();
    let mut tracer =
        Tracer::load(&LoadOptions { ring_bytes: spec.ring_bytes, tracepoints: spec.io.then_some(spec.tracepoints) })?;
    tracer.add_target(pid)?;
    // Drained every TICK; a quarter-full ring wakes us early.
    tracer.set_wakeup_bytes(spec.ring_bytes / 4)?;
    log::info!("eBPF object loaded in {:?}", started.elapsed());

    // Hooks known before the target runs: --lib, then the program's own
    // libraries (run) or what it has mapped (attach).
    let mut candidates = spec.libs.clone();
    let program_libs = match &target {
        Target::Run { child, .. } => match child.exe() {
            Some(exe) => target::resolve_needed(exe, child.ld_library_path()).unwrap_or_default(),
            None => Vec::new(),
        },
        Target::Attach { pid } => target::mapped_files(*pid)?,
    };
    candidates.extend(program_libs);
    let libs = target::classify(&candidates);
    // Which struct layouts, before any ggml probe attaches and, for `run`,
    // before the target runs: a build ttrace does not know stops here (an
    // old one before the missing hooks say less).
    let choice = if gate::has_cpu_backend(&libs) { Some(gate::choose(&libs)?) } else { None };
    if !spec.libs.is_empty() {
        libs.require(target::HookSource::Libs(&spec.libs))?;
    }
    if let Target::Attach { pid } = target {
        libs.require(target::HookSource::Pid(pid))?;
    }

    // Models known up front are watched before the target maps them, so
    // load-time reads (llama.cpp's MAP_POPULATE prefetch) are seen.
    let mut resolver = Resolver::new(pid);
    for model in &spec.models {
        resolver.add_model(model).with_context(|| format!("reading model {}", model.display()))?;
    }
    // A `run` child has not exec'd: its maps are ttrace's own image. Its
    // first read comes after exec, when an event needs it.
    if mode == Mode::Attach {
        resolver.refresh();
    }
    if spec.io {
        tracer.attach_page_faults()?;
        tracer.attach_io()?;
    }
    log::info!("I/O tracepoints attached {:?} after start", started.elapsed());
    let names = match libs.path_of("ggml_op_name") {
        Some(base) => Some(target::op_names(base)?),
        None => None,
    };
    let mut header = header(spec, pid, mode, &command, names.as_ref());
    // The build's own commit string: llama.cpp's build info, in
    // libllama-common or (static common code, before 2026) the program.
    header.llama_commit = libs.path_of("LLAMA_COMMIT").and_then(target::llama_commit);
    // attach: the maps just read; run: none yet (a MAPS frame follows exec).
    header.maps = resolver.header_maps();
    // Probes before the header, so it names (and gives the build-ids of)
    // the libraries they are in.
    let mut attached = Attached::new(pid);
    let mut layouts = Layouts::default();
    let mut recorder_layout = None;
    if let (Some(choice), true) = (choice, libs.cpu.is_some()) {
        header.build = Some(choice.build.clone());
        recorder_layout = Some(choice.layout.tensor);
        layouts.arm(&mut tracer, choice, names.as_ref())?;
        if plan::routing_hook(&libs).is_none() {
            layouts.disabled.push(crate::live::layouts::routing_off());
        }
        attached.start_ops(&mut tracer, op_options(spec, &layouts), &libs)?;
        if let Some(spec) = &spec.values {
            values::start(&mut tracer, &libs, names.as_ref(), pid, spec.filter.is_some())?;
        }
    }
    header.libraries = attached.libraries.clone();
    // No ggml linked: it may come with dlopen, and compute at once.
    let hold = match &target {
        Target::Run { child, .. } if !attached.has_ops => {
            child.exe().map(|exe| hold::LibraryHold::arm(&mut tracer, exe, pid)).unwrap_or_default()
        }
        _ => hold::LibraryHold::default(),
    };
    let (first_file, ring) = ring::first_file(&spec.output, spec.ring, spec.owner.as_ref(), &mut header)
        .with_context(|| format!("starting the ring of files {}.NNNN", spec.output.display()))?;
    let (trace_file, writer) = TraceFile::create(&first_file, spec.owner.as_ref(), &header)?;
    let held_at_first_graph = matches!(target, Target::Run { .. });
    if held_at_first_graph {
        tracer.stop_at_first_graph()?;
    }
    let mut recorder = Recorder::new(writer, resolver);
    recorder.ring = ring;
    recorder.values = spec.values.as_ref().map(|v| crate::live::values::ValueRecorder::new(v.filter.clone()));
    recorder.values.iter_mut().for_each(|v| v.set_op_names(names.as_ref()));
    recorder.op_times = spec.op_timing.then(crate::live::op_times::OpTimes::new);
    recorder.op_times.iter_mut().for_each(|t| t.set_op_names(names.as_ref()));
    if let Some(layout) = recorder_layout {
        recorder.graphs.set_layout(layout);
    }
    let mut session = Session {
        target_pid: attached.pid,
        attached,
        recorder,
        layouts,
        spec,
        trace_file,
        held_at_first_graph,
        first_graph_started: false,
        tap,
        exited_while_attaching: None,
        hold,
        late_attach: None,
    };
    session.sync_watches(&mut tracer)?;
    log::info!("probes attached {:?} after start", started.elapsed());

    let _log_task = tracer.take_logger().map(spawn_logger).transpose()?;
    let stream = EventStream::new(tracer.take_events()?)?;
    let (child, exited) = match target {
        Target::Run { child, .. } => {
            // Last, after ttrace itself has read the model's header: a cold start.
            if spec.drop_caches {
                target::drop_caches()?;
                warn_still_cached(&spec.models);
            }
            if let Some(tap) = session.tap.as_mut() {
                tap.started(&mut session.recorder.resolver);
            }
            let running = child.release()?;
            (Some(running), signals::pidfd(pid).context("watching the child for exit")?)
        }
        Target::Attach { pid } => {
            if let Some(tap) = session.tap.as_mut() {
                tap.started(&mut session.recorder.resolver);
            }
            (None, signals::pidfd(pid).with_context(|| format!("watching pid {pid} for exit"))?)
        }
    };
    session.trace_file.keep();
    // `run` shows its target's output; an attach would show nothing until
    // it stops. Said last: a target that exits before this point gets the
    // one-line error alone.
    if mode == Mode::Attach && session.tap.is_none() {
        let until = spec.duration.map(|d| format!(", {} elapse", humantime::format_duration(d))).unwrap_or_default();
        eprintln!("ttrace: attached to pid {pid}; tracing until it exits, Ctrl-C{until} (the summary follows)");
    }
    Ok(Live { tracer, session, stream, child, exited, _log_task })
}

fn op_options(spec: &SessionSpec, layouts: &Layouts) -> OpOptions {
    OpOptions {
        all_threads: spec.all_threads,
        op_timing: spec.op_timing,
        sequences: layouts.sequences(),
        buffers: layouts.buffers(),
    }
}

/// Dropping the page cache cannot evict pages that another process maps (a
/// second llama.cpp on the same model): say how much of each model stayed
/// cached, because those pages will not be read from disk in this run.
fn warn_still_cached(models: &[PathBuf]) {
    for model in models {
        match target::resident_bytes(model) {
            Ok((resident, size)) if resident > 0 => eprintln!(
                "ttrace: warning: {} of {} ({:.1}%) is still in the page cache after dropping it \
                 (another process maps it?); those pages will not be read from disk",
                crate::units::human_bytes(resident),
                model.display(),
                100.0 * resident as f64 / size as f64
            ),
            Ok(_) => {}
            Err(e) => log::debug!("cannot check the page cache for {}: {e}", model.display()),
        }
    }
}

/// Record until the target exits, a signal or the duration; close the trace.
async fn record_until_stop(
    live: Live<'_>,
    spec: &SessionSpec,
    (mut sigint, mut sigterm): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) -> Result<Outcome> {
    let Live { mut tracer, mut session, mut stream, mut child, exited, _log_task } = live;
    let pid = session.attached.pid;

    let mut tick = tokio::time::interval(if session.attached.has_ops { TICK } else { HOOK_SEARCH_TICK });
    let deadline = spec.duration.map(|d| tokio::time::Instant::now() + d);
    let mut last_flush = Instant::now();
    let mut interrupted_at: Option<tokio::time::Instant> = None;
    let mut write_error = None;
    let mut memory = target::MemorySamples::open(pid, spec.cgroup_dir.as_deref());
    let stop_reason = loop {
        let grace_over = interrupted_at.map(|t| t + CHILD_GRACE);
        tokio::select! {
            biased;
            _ = sigint.recv() => if let Some(reason) = on_signal(&mut child, libc::SIGINT, &mut interrupted_at) { break reason },
            _ = sigterm.recv() => if let Some(reason) = on_signal(&mut child, libc::SIGTERM, &mut interrupted_at) { break reason },
            _ = exited.readable() => {
                // A Ctrl-C sent to the process group reaches the target too,
                // which may exit before ttrace's signal stream yields it: a
                // signal arriving with the exit still means interrupted.
                let signalled = interrupted_at.is_some()
                    || tokio::time::timeout(SIGNAL_WITH_EXIT, async {
                        tokio::select! { _ = sigint.recv() => {}, _ = sigterm.recv() => {} }
                    })
                    .await
                    .is_ok();
                break if signalled { StopReason::Interrupted } else { StopReason::TargetExited };
            }
            _ = sleep_until(deadline) => break StopReason::DurationElapsed,
            _ = sleep_until(grace_over) => {
                if let Some(c) = &child { c.kill()?; }
                break StopReason::TargetKilledAfterGrace;
            }
            _ = tick.tick() => {
                memory.sample();
                if session.recorder.ring.is_some() {
                    session.recorder.lost = tracer.lost()?;
                }
                stream.drain_now(&mut |event: Event| session.take(event, &mut write_error));
                if session.hold.has_stops() {
                    session.on_library_load(&mut tracer, child.as_ref())?;
                }
                session.follow_the_graphs(&mut tracer, child.as_ref())?;
                if !session.attached.has_ops {
                    session.scan_on_tick(&mut tracer, child.as_ref())?;
                    if session.attached.has_ops {
                        tick = tokio::time::interval(TICK);
                    }
                } else {
                    session.follow_cpu_backend(&mut tracer)?;
                }
                session.continue_after_first_graph(child.as_ref(), &mut memory)?;
                session.sync_watches(&mut tracer)?;
                values::sync_filter(&mut session.recorder, &mut tracer)?;
                let quit = session.tap.as_mut().is_some_and(|tap| tap.tick(&mut session.recorder.resolver));
                if quit && interrupted_at.is_none() && let Some(reason) = on_signal(&mut child, libc::SIGINT, &mut interrupted_at) {
                    break reason;
                }
                if last_flush.elapsed() >= FLUSH_EVERY {
                    session.recorder.writer.flush()?;
                    last_flush = Instant::now();
                }
            }
            ready = stream.readable() => {
                ready?;
                stream.drain_now(&mut |event: Event| session.take(event, &mut write_error));
                if session.hold.has_stops() {
                    session.on_library_load(&mut tracer, child.as_ref())?;
                    if session.attached.has_ops {
                        tick = tokio::time::interval(TICK);
                    }
                }
                session.continue_after_first_graph(child.as_ref(), &mut memory)?;
            }
        }
        if let Some(e) = write_error.take() {
            return Err(e).with_context(|| format!("writing {}", spec.output.display()));
        }
        if let Some(refusal) = session.layouts.refused.take() {
            return Err(refuse(&mut session, child.as_mut(), refusal));
        }
        session.layouts.apply_ubatch_off(&mut tracer)?;
    };
    // Everything submitted before the stop is still in the ring.
    stream.drain_now(&mut |event: Event| session.take(event, &mut write_error));
    // Reads the target issued (async readahead) may complete after it is
    // gone: wait for them, briefly, so no read lacks its completion.
    let settle = Instant::now();
    while session.recorder.requests_in_flight() > 0 && settle.elapsed() < IO_SETTLE && write_error.is_none() {
        tokio::time::sleep(Duration::from_millis(2)).await;
        stream.drain_now(&mut |event: Event| session.take(event, &mut write_error));
    }
    if let Some(e) = write_error.take() {
        return Err(e).with_context(|| format!("writing {}", spec.output.display()));
    }
    if let Some(refusal) = session.layouts.refused.take() {
        return Err(refuse(&mut session, child.as_mut(), refusal));
    }
    // What the check still held (the target ended before a verdict).
    session
        .layouts
        .finish(&mut session.recorder, &mut session.tap)
        .with_context(|| format!("writing {}", spec.output.display()))?;
    let exit = match child.as_mut() {
        Some(c) => Some(c.wait()?),
        None => None,
    };
    if !session.attached.has_ops && spec.models.is_empty() {
        session.trace_file.discard();
        if let Some(lib) = session.exited_while_attaching.take() {
            bail!(
                "pid {pid} exited while ttrace attached to the ggml it had loaded ({}); nothing was traced. \
                 ttrace finds a library loaded with dlopen in the target's maps, every {} ms: a program that \
                 finishes sooner runs untraced",
                lib.display(),
                HOOK_SEARCH_TICK.as_millis()
            );
        }
        drop(session);
        bail!(
            "pid {pid} and its child processes never loaded a ggml CPU library (no mapped file defines \
             ggml_cpu_extra_compute_forward); nothing was traced. If it loads ggml from an unusual place, pass \
             it with --lib PATH"
        );
    }
    let lost = tracer.lost()?;
    let misses = tracer.recursion_misses()?;
    let (layout_check, disabled) = (session.layouts.check(), session.layouts.disabled.clone());
    let mut recorder = session.recorder;
    let ready = recorder.graphs.settle();
    recorder.write_graphs(ready)?;
    let (values_missing, value_threads) = values::finish(&tracer, &mut recorder, session.attached.pid)?;
    if recorder.graphs.incomplete > 0 {
        log::warn!("{} graphs were not recorded whole (ring buffer full)", recorder.graphs.incomplete);
    }
    recorder.flush_models()?;
    recorder.writer.lost(lost)?;
    let trailer = Trailer {
        stop_reason,
        exit_code: exit.and_then(|e| e.code()),
        exit_signal: exit.and_then(|e| e.signal()),
        end_monotonic_ns: monotonic_ns(),
        decode_errors: stream.decode_errors,
        tracepoints: tracer.tracepoints(),
        recursion_misses: misses.per_program,
        skipped: misses.per_kind,
        layout_check,
        disabled,
        peak_anon_bytes: memory.peak_anon(),
        cgroup_peak: memory.cgroup_peak(),
        fault_around_bytes: Some(crate::live::target::fault_around_bytes()),
        late_attach: session.late_attach.take(),
        values_missing,
        copies: Some(recorder.resolver.copies.counts).filter(|c| *c != Default::default()),
        value_threads,
    };
    let header = recorder.writer.header().clone();
    let (file, stats) = recorder.writer.finish_counted(&trailer)?;
    let file = file.into_inner().map_err(|e| e.into_error())?;
    if !trace_file::is_discard(&spec.output) {
        file.sync_all().with_context(|| format!("syncing {}", spec.output.display()))?;
    }
    Ok(Outcome { stop_reason, exit, stats, lost, header, trailer })
}

/// Stop before anything is kept: a `run` target is killed (ttrace started
/// it to be traced), an attached one keeps running; the trace file goes.
fn refuse(session: &mut Session<'_>, child: Option<&mut RunningChild>, refusal: Refusal) -> anyhow::Error {
    session.trace_file.discard();
    match child {
        Some(c) => {
            let _ = c.kill();
            let _ = c.wait();
            anyhow::Error::new(CommandStopped(refusal))
        }
        None => anyhow::Error::new(refusal),
    }
}

/// A `run` refused: its command is not left running untraced.
#[derive(Debug, thiserror::Error)]
#[error("{0}, and the command was stopped")]
struct CommandStopped(Refusal);

struct Session<'a> {
    /// The process ttrace started or attached to; `attached.pid` may be one
    /// it started.
    target_pid: u32,
    attached: Attached,
    recorder: Recorder<BufWriter<File>>,
    layouts: Layouts,
    spec: &'a SessionSpec,
    trace_file: TraceFile,
    /// A `run` target is stopped by the kernel at its first graph, until
    /// its maps are read.
    held_at_first_graph: bool,
    /// The first ubatch graph's marker has been read.
    first_graph_started: bool,
    tap: Option<Box<dyn Tap>>,
    /// The ggml library a target loaded and exited with before its probes were in.
    exited_while_attaching: Option<PathBuf>,
    /// `run` of a program with no ggml linked: held at each library load.
    hold: hold::LibraryHold,
    /// ggml found after the target started.
    late_attach: Option<crate::format::LateAttach>,
}

impl Session<'_> {
    /// Record one event; the first write error is kept for the loop to report.
    fn take(&mut self, event: Event, error: &mut Option<std::io::Error>) {
        self.hold.on_event(&event);
        if let Event::Call(call) = &event
            && call.cookie == tracer_common::markers::SCHED_GRAPH_COMPUTE
            && !self.first_graph_started
        {
            self.first_graph_started = true;
            self.name_cpu_backend_in_use();
        }
        if error.is_none()
            && let Err(e) = self.layouts.take(&mut self.recorder, &mut self.tap, event)
        {
            *error = Some(e);
        }
    }

    /// Hand model files found since the last call to the kernel's filters.
    fn sync_watches(&mut self, tracer: &mut Tracer) -> Result<()> {
        if !self.spec.io {
            return Ok(());
        }
        for watched in self.recorder.resolver.take_new_watched() {
            tracer.watch_file(watched.key)?;
            if let Some(dev) = watched.disk_dev {
                tracer.watch_block_device(dev)?;
            }
        }
        Ok(())
    }
}
