//! Attach latency: how long after `ttrace attach` starts the kernel records
//! its first op, on a llama-completion that is already generating. Measured
//! from just before the spawn (CLOCK_MONOTONIC) to the first op's kernel
//! timestamp (the same clock), read back through `ttrace export --format
//! jsonl`, so it covers process start, loading and verifying the programs,
//! attaching them and the wait for the target's next graph.

use std::{
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, stopper::StopOnDrop};

/// The goal of issue 24: the first op within half a second.
pub const GOAL_SECS: f64 = 0.5;

pub struct AttachSample {
    pub round: usize,
    pub first_op_secs: f64,
    /// The 1-minute load average when the round started: on 2 cores a busy
    /// machine multiplies every step (verifier, BTF parse) several times.
    pub load: f64,
}

pub fn load_average() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|l| l.parse().ok()).unwrap_or(f64::NAN)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes into the timespec passed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A generation long enough to outlast the round, stopped when the round
/// ends however it ends.
fn start_target(ctx: &Ctx, model: &Path) -> Result<StopOnDrop> {
    let mut cmd = Command::new(&ctx.paths.llama.completion);
    cmd.arg("-m").arg(model);
    cmd.args(["-p", "hello world", "-n", "100000", "-no-cnv", "--ignore-eos", "--context-shift", "-t", "2"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = StopOnDrop::new(cmd.spawn().context("starting llama-completion")?);
    // Generating: its CPU library mapped, then a second of steady state.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap_or_default();
        if maps.contains("libggml-cpu") {
            break;
        }
        if Instant::now() > deadline || child.child().try_wait()?.is_some() {
            bail!("llama-completion did not load libggml-cpu within 60 s");
        }
        sleep(Duration::from_millis(20));
    }
    sleep(Duration::from_secs(1));
    Ok(child)
}

/// Kernel timestamp of the first op in a trace, from its jsonl export.
fn first_op_ns(ctx: &Ctx, trace: &Path) -> Result<u64> {
    let jsonl = trace.with_extension("jsonl");
    crate::shell::run(
        Command::new(&ctx.ttrace).arg("export").arg(trace).args(["--format", "jsonl", "-o"]).arg(&jsonl),
    )?;
    let text = std::fs::read_to_string(&jsonl)?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|row| row["kind"] == "op")
        .and_then(|row| row["ts_ns"].as_u64())
        .with_context(|| format!("no op in {}", trace.display()))
}

fn one_round(ctx: &Ctx, model: &Path, round: usize) -> Result<AttachSample> {
    let target = start_target(ctx, model)?;
    let load = load_average();
    let trace = ctx.out_dir.join("attach.data");
    let spawned = monotonic_ns();
    let tracer = Command::new(&ctx.ttrace)
        .args(["attach", "--pid", &target.id().to_string(), "-o"])
        .arg(&trace)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ttrace attach")?;
    let mut tracer = StopOnDrop::new(tracer);
    // Generous: the figure comes from the trace, not from this wait.
    sleep(Duration::from_secs(5));
    // SAFETY: plain kill(2) on a child we own.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = tracer.child().wait()?;
    if !status.success() {
        bail!("ttrace attach exited with {status}");
    }
    drop(target);
    let first = first_op_ns(ctx, &trace)?;
    Ok(AttachSample { round, first_op_secs: first.saturating_sub(spawned) as f64 / 1e9, load })
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<Vec<AttachSample>> {
    (1..=ctx.rounds.max(3))
        .map(|round| {
            let s = one_round(ctx, model, round)?;
            eprintln!("bench: attach round {round}: first op {:.3} s after start", s.first_op_secs);
            Ok(s)
        })
        .collect()
}

/// The section of docs/BENCHMARKS.md.
pub fn section(md: &mut String, samples: &[AttachSample]) -> Result<()> {
    use std::fmt::Write as _;
    let secs: Vec<f64> = samples.iter().map(|s| s.first_op_secs).collect();
    let median = super::median(&secs);
    let (lo, hi) = super::min_max(&secs);
    writeln!(md, "\n## Attach latency\n")?;
    writeln!(
        md,
        "`ttrace attach --pid N` on a llama-completion already generating on the `tiny` model (`-t 2`): time from \
         just before ttrace is spawned to the kernel timestamp of the first op it records (read back from the \
         trace's jsonl export), over {} rounds, each with a new target. It covers process start, reading the \
         kernel's BTF, loading and verifying the programs, attaching them and the wait for the target's next graph.\n",
        secs.len()
    )?;
    let loads: Vec<f64> = samples.iter().map(|s| s.load).collect();
    let (load_lo, load_hi) = super::min_max(&loads);
    writeln!(md, "| median | min–max | load average (1 min) |\n|---|---|---|")?;
    writeln!(md, "| {median:.3} s | {lo:.3}–{hi:.3} s | {load_lo:.1}–{load_hi:.1} |\n")?;
    writeln!(md, "- Goal ≤ {GOAL_SECS} s: {} ({median:.3} s)", super::met(median <= GOAL_SECS))?;
    Ok(())
}

pub fn csv(csv: &mut String, samples: &[AttachSample]) -> Result<()> {
    use std::fmt::Write as _;
    for s in samples {
        writeln!(csv, "attach_first_op_secs,tiny,{},{}", s.round, s.first_op_secs)?;
        writeln!(csv, "attach_load_average,tiny,{},{}", s.round, s.load)?;
    }
    Ok(())
}
