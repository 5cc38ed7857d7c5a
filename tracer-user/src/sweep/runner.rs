//! Runs a plan: each run traced as `ttrace run` traces it (a held child, the
//! memory cgroup, the session), then read back, analysed and appended to the
//! dataset, then marked done. Ctrl-C stops the run in progress (it is
//! discarded, and redone by the next `ttrace sweep`) and the sweep after it.

use std::{
    ffi::OsString,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{
    llama_log,
    plan::{CacheMode, CommandKind, Plan, RunSpec},
    server,
    state::SweepDir,
};
use crate::{
    analyze,
    cli::TracepointChoice,
    cmd::report::read_analysis,
    export::dataset::{self, Appended, RunInfo},
    format::StopReason,
    live::{
        session::{self, SessionSpec, Target},
        target::{MemoryCgroup, SpawnOptions, UserSpec, evict, spawn_limited},
    },
};

pub struct Options {
    pub dir: PathBuf,
    /// Also write the `ops` table.
    pub ops: bool,
    /// Run again the runs recorded as failed.
    pub retry_failed: bool,
    pub owner: Option<UserSpec>,
}

/// How a sweep ended.
#[derive(Debug, Default)]
pub struct Finished {
    pub skipped: usize,
    pub ok: usize,
    pub failed: usize,
    /// Ctrl-C: runs not started (and the one stopped).
    pub interrupted: bool,
}

/// How one run ended.
enum Ended {
    Done(Box<RunInfo>),
    /// Ctrl-C during the run: nothing of it is kept.
    Interrupted,
}

pub async fn run(plan: &Plan, options: &Options) -> Result<Finished> {
    let dir = SweepDir::new(&options.dir);
    dir.create()?;
    // Ctrl-C between runs (and while one starts) stops the sweep after it;
    // during a run the session sees it too and stops the target.
    let stop = Arc::new(AtomicBool::new(false));
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let flag = stop.clone();
    tokio::spawn(async move {
        tokio::select! { _ = sigint.recv() => {}, _ = sigterm.recv() => {} }
        flag.store(true, Ordering::SeqCst);
    });
    let bar = progress(plan.runs.len() as u64);
    let mut finished = Finished::default();
    for run in &plan.runs {
        if stop.load(Ordering::SeqCst) {
            finished.interrupted = true;
            break;
        }
        bar.set_message(format!("{} {} {}", run.model, run.params.domain, run.id));
        if dir.is_done(&run.id) && !(options.retry_failed && dir.failed(&run.id)) {
            finished.skipped += 1;
            bar.inc(1);
            continue;
        }
        let started = Instant::now();
        match one(run, &dir, options).await? {
            Ended::Interrupted => {
                finished.interrupted = true;
                break;
            }
            Ended::Done(info) => {
                let line = match &info.error {
                    None => {
                        finished.ok += 1;
                        format!("ttrace: run {} done in {:.1} s", info.run_id, started.elapsed().as_secs_f64())
                    }
                    Some(e) => {
                        finished.failed += 1;
                        format!("ttrace: run {} failed: {e}", info.run_id)
                    }
                };
                bar.suspend(|| eprintln!("{line}"));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !finished.interrupted {
        // Every run is done: the private copies are not needed to resume.
        let models = dir.models();
        if models.is_dir() {
            std::fs::remove_dir_all(&models).with_context(|| format!("removing {}", models.display()))?;
        }
    }
    Ok(finished)
}

fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("sweep [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, ETA {eta}  {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| h.trim().to_string())
}

/// One run, start to record.
async fn one(run: &RunSpec, dir: &SweepDir, options: &Options) -> Result<Ended> {
    let mut info = RunInfo {
        run_id: run.id.clone(),
        model: run.model.clone(),
        params: run.params.clone(),
        host: host(),
        started_unix_ms: unix_ms(),
        trace: SweepDir::trace_rel(&run.id),
        ..Default::default()
    };
    let (trace, log) = (dir.trace(&run.id), dir.log(&run.id));
    // What an interrupted attempt left.
    dataset::remove_run(&dir.dataset(), &info)?;
    for leftover in [&trace, &log] {
        let _ = std::fs::remove_file(leftover);
    }
    let traced = trace_one(run, dir, options, &trace, &log, &mut info).await;
    info.llama = llama_log::counters(&log);
    match traced {
        Ok(StopReason::Interrupted | StopReason::InterruptedTwice | StopReason::TargetKilledAfterGrace) => {
            let _ = std::fs::remove_file(&trace);
            let _ = std::fs::remove_file(&log);
            return Ok(Ended::Interrupted);
        }
        Ok(_) if info.error.is_none() => {
            let clock = Instant::now();
            let appended = (|| -> Result<_> {
                let analysis = read_analysis(&trace)?;
                let stats = analyze::stats::collect(&trace, &analysis, &ProgressBar::hidden())
                    .with_context(|| format!("reading {}", trace.display()))?;
                Ok(dataset::write_run(&dir.dataset(), &info, Some((&trace, &analysis, &stats)), options.ops)?)
            })();
            match appended {
                Ok(appended) => info.appended = Some(Appended { ms: clock.elapsed().as_secs_f64() * 1e3, ..appended }),
                Err(e) => {
                    // A trace that does not read back: the run failed.
                    info.error = Some(format!("{e:#}"));
                    dataset::write_run(&dir.dataset(), &info, None, false)?;
                }
            }
        }
        Ok(_) => {
            dataset::write_run(&dir.dataset(), &info, None, false)?;
        }
        Err(e) => {
            info.error = Some(format!("{e:#}"));
            dataset::write_run(&dir.dataset(), &info, None, false)?;
        }
    }
    dir.mark_done(&info)?;
    Ok(Ended::Done(Box::new(info)))
}

/// Traces the run; `info.error` says how the command failed. `Err`: the
/// tracing itself failed (a failed run too, recorded as such).
async fn trace_one(
    run: &RunSpec,
    dir: &SweepDir,
    options: &Options,
    trace: &Path,
    log: &Path,
    info: &mut RunInfo,
) -> Result<StopReason> {
    let model = prepare_model(run, dir)?;
    let port = match run.kind {
        CommandKind::Server => Some(server::free_port().context("finding a free port for llama-server")?),
        CommandKind::Completion => None,
    };
    let argv = run.argv(&model, port);
    info.params.command = argv.clone();
    let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let os_argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
    let log_fd = Some(log_file.as_raw_fd());
    let spawn = SpawnOptions { user: options.owner.clone(), env: Vec::new(), stdout: log_fd, stderr: log_fd };
    let (child, mut cgroup) = spawn_limited(&os_argv, spawn, run.params.mem_limit_bytes, "sweep")?;
    drop(log_file);
    let spec = SessionSpec {
        output: trace.to_path_buf(),
        models: vec![model],
        io: true,
        drop_caches: false,
        mem_limit: cgroup.as_ref().map(MemoryCgroup::limit_bytes),
        cgroup: cgroup.as_ref().map(|c| c.version().to_string()),
        cgroup_dir: cgroup.as_ref().map(|c| c.path().to_path_buf()),
        all_threads: false,
        op_timing: false,
        libs: Vec::new(),
        duration: None,
        ring_bytes: 16 << 20,
        tracepoints: TracepointChoice::Auto,
        owner: options.owner.clone(),
        values: None,
        ring: None,
    };
    // The server's clients, from when it answers until they are served.
    let cancel = Arc::new(AtomicBool::new(false));
    let clients = port.map(|port| {
        let (pid, n, body, cancel) = (child.pid(), run.clients, run.request.clone(), cancel.clone());
        std::thread::spawn(move || server::drive(port, pid, n, body, cancel))
    });
    let outcome = session::trace(Target::Run { child, argv }, &spec).await;
    cancel.store(true, Ordering::SeqCst);
    let served = clients.map(|c| c.join().unwrap_or_else(|_| Err("the clients' thread panicked".into())));
    let outcome = outcome?;
    match served {
        Some(Ok(served)) => info.served = served,
        Some(Err(e)) => info.error = Some(format!("llama-server's clients: {e}")),
        None => {}
    }
    if let Some(cgroup) = cgroup.as_mut() {
        if let Ok(stats) = cgroup.stats() {
            info.cgroup_peak_bytes = stats.peak_bytes;
            info.cgroup_limit_hits = Some(stats.limit_hits);
        }
        cgroup.remove()?;
    }
    if let Some(status) = outcome.exit
        && !status.success()
        && info.error.is_none()
    {
        use std::os::unix::process::ExitStatusExt;
        info.error = Some(match (status.code(), status.signal()) {
            (Some(code), _) => format!("the command exited with status {code}; its output is in {}", log.display()),
            (_, Some(sig)) => format!("the command was killed by signal {sig}; its output is in {}", log.display()),
            _ => "the command failed".into(),
        });
    }
    Ok(outcome.stop_reason)
}

/// The model file the run reads: cold runs a private copy (made once per
/// sweep directory), evicted from the page cache now; warm runs the plan's
/// file, read through once so its pages are cached.
fn prepare_model(run: &RunSpec, dir: &SweepDir) -> Result<PathBuf> {
    match run.cache {
        CacheMode::Warm => {
            let mut f = std::fs::File::open(&run.model_path)
                .with_context(|| format!("opening {}", run.model_path.display()))?;
            std::io::copy(&mut f, &mut std::io::sink())
                .with_context(|| format!("reading {}", run.model_path.display()))?;
            Ok(run.model_path.clone())
        }
        CacheMode::Cold => {
            let models = dir.models();
            std::fs::create_dir_all(&models).with_context(|| format!("creating {}", models.display()))?;
            let copy = models.join(format!("{}.gguf", run.model));
            if !copy.is_file() {
                let tmp = models.join(format!(".{}.gguf.tmp", run.model));
                std::fs::copy(&run.model_path, &tmp)
                    .with_context(|| format!("copying {} to {}", run.model_path.display(), tmp.display()))?;
                std::fs::rename(&tmp, &copy).with_context(|| format!("renaming {}", tmp.display()))?;
            }
            evict(&copy).with_context(|| format!("evicting {} from the page cache", copy.display()))?;
            Ok(copy)
        }
    }
}
