//! `cargo xtask bench`: inference overhead, ingest throughput, trace size,
//! export speed, a profile of a traced run and llama-server under load,
//! written to `docs/BENCHMARKS.md` with the raw numbers in
//! `docs/benchmarks.csv`. Each [`Part`] renders its own sections and rows;
//! `--only PART` measures some and rewrites only theirs.

mod attach;
mod export;
mod longrun;
mod longrun_view;
mod overhead;
mod parts;
mod programs;
mod sections;
mod server;
mod simulate;
mod stopper;
mod sweep;
mod thesis_webui;
mod values;
mod values_account;
mod viewer;

use std::{fmt::Write as _, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{cache, demo, setup, shell};

pub struct Ctx {
    pub paths: setup::Paths,
    pub ttrace: PathBuf,
    pub out_dir: PathBuf,
    pub flushlog: PathBuf,
    pub rounds: usize,
    pub tokens: u32,
    pub quick: bool,
}

const FLUSH_LOG_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
__attribute__((destructor)) static void ttrace_flush_common_log(void) {
    void *(*log_main)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*log_pause)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (log_main && log_pause) log_pause(log_main());
}
"#;

/// llama.cpp's async logger loses the last lines (the perf print) in about
/// half the runs; this LD_PRELOAD library drains it at exit.
fn build_flushlog(cache: &std::path::Path) -> Result<PathBuf> {
    let dir = cache.join("bench");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("flushlog.c");
    let so = dir.join("flushlog.so");
    std::fs::write(&src, FLUSH_LOG_C)?;
    shell::run(Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&so).arg(&src).arg("-ldl"))?;
    Ok(so)
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A distribution-free 95 % confidence interval of the median: the order
/// statistics whose ranks the binomial(n, ½) puts outside 2.5 % on each side.
/// None below 6 values, where no such pair exists.
pub fn median_ci95(v: &[f64]) -> Option<(f64, f64)> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // k: the largest rank with P(X < k) <= 0.025 for X ~ Binomial(n, 1/2).
    let (mut pmf, mut below, mut k) = (0.5f64.powi(n as i32), 0.0, 0);
    for i in 0..n {
        below += pmf;
        if below > 0.025 {
            break;
        }
        k = i + 1;
        pmf *= (n - i) as f64 / (i + 1) as f64;
    }
    (k >= 1).then(|| (v[k - 1], v[n - k]))
}

pub fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

fn cmd_line(cmd: &mut Command) -> String {
    shell::output(cmd).map(|s| s.lines().next().unwrap_or("").trim().to_string()).unwrap_or_else(|e| format!("? ({e})"))
}

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`), if the process
/// is still there.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
}

pub fn met(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**not met**" }
}

pub use sections::Part;

pub const CSV_HEADER: &str = "part,key,round,value\n";

/// Today in UTC, as `date -u` prints it.
pub fn now() -> String {
    cmd_line(Command::new("date").arg("-u"))
}

/// Measures every part, or only `only`'s (rewriting their sections and rows).
pub fn run(rounds: usize, quick: bool, only: &[Part]) -> Result<()> {
    if !shell::is_root() {
        bail!("`cargo xtask bench` loads eBPF programs and needs root: run it with sudo");
    }
    stopper::default_sigint();
    let paths = setup::run_quiet()?;
    let ttrace = demo::build_ttrace()?;
    let root = cache::repo_root();
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let flushlog = build_flushlog(&paths.cache)?;
    let rounds = if quick { rounds.min(3) } else { rounds };
    // 256 tokens: about 4 s of generation per run on 2 cores, long enough
    // that a scheduling hiccup of the machine does not decide a round.
    let tokens = if quick { 16 } else { 256 };
    let ctx = Ctx { paths, ttrace, out_dir, flushlog, rounds, tokens, quick };
    let model = ctx.paths.models.get("gemma").context("set-up fetched no `gemma` model")?.clone();
    std::fs::create_dir_all(root.join("docs"))?;
    let (md_path, csv_path) = (root.join("docs/BENCHMARKS.md"), root.join("docs/benchmarks.csv"));
    if !only.is_empty() {
        let mut parts: Vec<Part> = Vec::new();
        for &p in only {
            if !parts.contains(&p) {
                parts.push(p);
            }
        }
        sections::rewrite(&ctx, &model, &parts, &md_path, &csv_path)?;
        let names: Vec<String> = parts.iter().map(Part::to_string).collect();
        println!("bench: rewrote the {} part(s) of docs/BENCHMARKS.md and docs/benchmarks.csv", names.join(", "));
        return Ok(());
    }

    let mut measured = Vec::new();
    for part in Part::ALL {
        eprintln!("bench: {part}");
        measured.push((part, part.measure(&ctx, &model)?));
    }
    let mut csv = CSV_HEADER.to_string();
    let mut md = header(&ctx)?;
    for (part, m) in &measured {
        m.csv(&mut csv)?;
        m.markdown(&ctx, &mut md)?;
        if *part == Part::Profile {
            // Read at run time, so the analysis can be revised without a rebuild.
            let analysis = cache::repo_root().join("xtask/src/bench/analysis.md");
            writeln!(md, "{}\n", std::fs::read_to_string(&analysis).unwrap_or_default().trim())?;
        }
    }
    std::fs::write(csv_path, csv)?;
    std::fs::write(md_path, md)?;
    println!("bench: wrote docs/BENCHMARKS.md and docs/benchmarks.csv");
    Ok(())
}

/// The title, how to regenerate, the machine.
fn header(ctx: &Ctx) -> Result<String> {
    let mut md = String::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = cmd_line(Command::new("sh").args(["-c", "free -g | awk '/Mem:/{print $2\" GiB\"}'"]));
    writeln!(md, "# Benchmarks\n")?;
    writeln!(md, "Generated by `cargo xtask bench{}` on {}.", if ctx.quick { " --quick" } else { "" }, now())?;
    writeln!(
        md,
        "Raw numbers: [benchmarks.csv](benchmarks.csv). Regenerate with `sudo -E cargo xtask bench [--rounds N] [--quick]`, \
         or one part's sections with `--only PART` ({}).\n",
        Part::ALL.map(|p| format!("`{p}`")).join(", ")
    )?;
    writeln!(md, "## Machine and versions\n")?;
    writeln!(md, "- CPU: {cpu}, {} cores; memory {mem}", std::thread::available_parallelism().map_or(0, |n| n.get()))?;
    writeln!(md, "- kernel {}", cmd_line(Command::new("uname").arg("-r")))?;
    writeln!(md, "- llama.cpp commit {}; ttrace {}", ctx.paths.llama.commit, env!("CARGO_PKG_VERSION"))?;
    writeln!(
        md,
        "- {}; {}",
        cmd_line(Command::new("bpftrace").arg("--version")),
        cmd_line(Command::new("rustc").arg("--version"))
    )?;
    writeln!(md, "- The machine is shared and noisy: runs are interleaved and medians reported with min–max.\n")?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::median_ci95;

    #[test]
    fn median_confidence_ranks_match_the_binomial_tables() {
        let ranks = |n: usize| {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            median_ci95(&v).map(|(lo, hi)| (lo as usize, hi as usize))
        };
        assert_eq!(ranks(5), None);
        assert_eq!(ranks(6), Some((1, 6)));
        assert_eq!(ranks(7), Some((1, 7)));
        assert_eq!(ranks(21), Some((6, 16)));
        assert_eq!(ranks(31), Some((10, 22)));
    }
}
