//! Serving overhead: llama-server on loopback with 4 slots, untraced (A) and
//! under `ttrace run` (B) or `ttrace top --json` (C), both up in a round and
//! their timed waves of 4 concurrent completions (curl clients) alternating
//! A B B A …; request throughput per round. The traced server's waves also
//! read each BPF program's kernel time (`kernel.bpf_stats_enabled`) and the
//! tracer's CPU time.

use std::{
    fmt::Write as _,
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, median_ci95, min_max, stopper::StopOnDrop};

pub const CLIENTS: usize = 4;
/// Waves of [`CLIENTS`] requests timed per round, and tokens each generates.
pub const WAVES: usize = 4;
pub const N_PREDICT: u32 = 32;
const PROMPTS: [&str; CLIENTS] = [
    "Tell me about the sea.",
    "One two three four five six seven eight nine ten",
    "Why is the sky blue?",
    "Write a short poem about a cat on a warm windowsill",
];

pub struct ServerSample {
    pub round: usize,
    pub variant: &'static str,
    pub requests_per_s: f64,
    /// Per BPF program of the tracer: (name, run_time_ns, run_cnt) over the timed waves.
    pub programs: Vec<(String, u64, u64)>,
    /// CPU time of the tracer's own process (its threads' schedstat run time) over the timed waves, in ns.
    pub tracer_cpu_ns: u64,
}

impl ServerSample {
    /// Ubatches in the timed waves: runs of the `ubatch` probe.
    fn ubatches(&self) -> u64 {
        self.programs.iter().filter(|p| p.0 == "ubatch").map(|p| p.2).sum()
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start(ctx: &Ctx, variant: &str, model: &Path, port: u16) -> Result<Child> {
    let server = ctx.paths.llama.lib_dir.join("llama-server");
    let args: Vec<String> = vec![
        server.display().to_string(),
        "-m".into(),
        model.display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "-np".into(),
        CLIENTS.to_string(),
        "-c".into(),
        "4096".into(),
        "-t".into(),
        "2".into(),
        "--no-webui".into(),
    ];
    let mut cmd = match variant {
        "A" => Command::new(&args[0]),
        "C" => {
            let mut c = Command::new(&ctx.ttrace);
            c.args(["top", "--json", "--"]).arg(&args[0]);
            c
        }
        _ => {
            let mut c = Command::new(&ctx.ttrace);
            c.arg("run").arg("-o").arg(ctx.out_dir.join("server-B.data")).arg("--").arg(&args[0]);
            c
        }
    };
    cmd.args(&args[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd.spawn().with_context(|| format!("starting {}", crate::shell::describe(&cmd)))
}

fn curl(port: u16, path: &str, body: Option<String>) -> Command {
    let mut c = Command::new("curl");
    c.args(["-sf", "-m", "120"]).arg(format!("http://127.0.0.1:{port}{path}"));
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "-d", &b]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c
}

fn wait_healthy(port: u16, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !curl(port, "/health", None).status().is_ok_and(|s| s.success()) {
        if child.try_wait()?.is_some() || Instant::now() > deadline {
            bail!("llama-server did not come up on port {port}");
        }
        sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// One wave: every client's completion at once; fails if any fails.
fn wave(port: u16) -> Result<()> {
    let mut clients = Vec::new();
    for prompt in PROMPTS {
        let body = serde_json::json!({"prompt": prompt, "n_predict": N_PREDICT, "cache_prompt": false,
                                      "temperature": 0, "ignore_eos": true});
        // Stopped with the wave when another fails.
        clients.push(StopOnDrop::new(curl(port, "/completion", Some(body.to_string())).spawn()?));
    }
    for mut c in clients {
        if !c.child().wait()?.success() {
            bail!("a completion request to llama-server failed");
        }
    }
    Ok(())
}

/// SIGINT: llama-server exits, and `ttrace run` stops it and writes the
/// trace (what dropping the guard does, also on an error or a panic).
fn stop(child: StopOnDrop) {
    drop(child);
}

/// A server up and warmed (the first requests pay for lazy set-up), and
/// what was measured over its timed waves so far.
struct Served {
    variant: &'static str,
    child: StopOnDrop,
    port: u16,
    /// The tracer's pid (B, C): its BPF programs and CPU time are read.
    tracer: Option<u32>,
    secs: f64,
    programs: std::collections::HashMap<u64, (String, u64, u64)>,
    tracer_cpu_ns: u64,
}

impl Served {
    fn start(ctx: &Ctx, variant: &'static str, model: &Path) -> Result<Self> {
        let port = free_port()?;
        let mut child = StopOnDrop::new(start(ctx, variant, model, port)?);
        let ready = wait_healthy(port, child.child()).and_then(|()| wave(port));
        let tracer = (variant != "A").then(|| child.id());
        let served = Self { variant, child, port, tracer, secs: 0.0, programs: Default::default(), tracer_cpu_ns: 0 };
        match ready {
            Ok(()) => Ok(served),
            Err(e) => {
                stop(served.child);
                Err(e)
            }
        }
    }

    /// One timed wave, with the tracer's kernel and CPU time over it.
    fn timed_wave(&mut self) -> Result<()> {
        let before = self.tracer.map(program_stats).transpose()?;
        let cpu_before = self.tracer.map(cpu_ns).transpose()?;
        let started = Instant::now();
        wave(self.port)?;
        self.secs += started.elapsed().as_secs_f64();
        if let (Some(pid), Some(before), Some(cpu_before)) = (self.tracer, before, cpu_before) {
            self.tracer_cpu_ns += cpu_ns(pid)?.saturating_sub(cpu_before);
            for (id, (name, ns, n)) in program_stats(pid)? {
                let (ns0, n0) = before.get(&id).map_or((0, 0), |b| (b.1, b.2));
                let sum = self.programs.entry(id).or_insert((name, 0, 0));
                (sum.1, sum.2) = (sum.1 + ns - ns0, sum.2 + n - n0);
            }
        }
        Ok(())
    }

    fn sample(self, round: usize) -> Result<ServerSample> {
        let Self { variant, child, secs, programs, tracer_cpu_ns, .. } = self;
        stop(child);
        Ok(ServerSample {
            round,
            variant,
            requests_per_s: (WAVES * CLIENTS) as f64 / secs,
            programs: programs.into_values().collect(),
            tracer_cpu_ns,
        })
    }
}

/// One round: the untraced server and the traced one both up, their timed
/// waves alternating A B B A … (B A A B … in even rounds), so that a change
/// in the machine's speed over seconds or minutes (this VM's host) falls
/// on both alike. The server not being timed is idle meanwhile.
fn run_round(ctx: &Ctx, traced: &'static str, round: usize, model: &Path) -> Result<[ServerSample; 2]> {
    let (first, second) = if round % 2 == 1 { ("A", traced) } else { (traced, "A") };
    let mut one = Served::start(ctx, first, model)?;
    let mut two = match Served::start(ctx, second, model) {
        Ok(two) => two,
        Err(e) => {
            stop(one.child);
            return Err(e);
        }
    };
    let timed = (|| {
        for pair in 0..WAVES {
            let (x, y) = if pair % 2 == 0 { (&mut one, &mut two) } else { (&mut two, &mut one) };
            x.timed_wave()?;
            y.timed_wave()?;
        }
        Ok::<_, anyhow::Error>(())
    })();
    let (one, two) = (one.sample(round), two.sample(round));
    timed?;
    Ok([one?, two?])
}

/// CPU time of process `pid` in ns: the run time of each of its threads
/// (`/proc/PID/task/*/schedstat`, exact to the ns; utime + stime of
/// /proc/PID/stat are sampled at the 10 ms tick, coarser than a round's
/// 20-50 ms). A thread that ended during the window is not counted: the
/// recorder's runtime has one thread.
pub(super) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else { continue };
        total += text.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).context("schedstat's run time")?;
    }
    Ok(total)
}

/// The tracer's BPF programs (by the fds it holds) and their kernel counters, by id.
pub(super) fn program_stats(pid: u32) -> Result<std::collections::HashMap<u64, (String, u64, u64)>> {
    let mut ids: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(fd?.path()) else { continue };
        let id = text.lines().find_map(|l| l.strip_prefix("prog_id:")).and_then(|v| v.trim().parse::<u64>().ok());
        ids.extend(id);
    }
    let out = crate::shell::output(Command::new("bpftool").args(["-j", "prog", "show"]))?;
    let all: Vec<serde_json::Value> = serde_json::from_str(&out).context("bpftool's JSON")?;
    Ok(all
        .iter()
        .filter_map(|p| {
            let id = p["id"].as_u64().filter(|id| ids.contains(id))?;
            let name = p["name"].as_str().unwrap_or("?").to_string();
            Some((id, (name, p["run_time_ns"].as_u64().unwrap_or(0), p["run_cnt"].as_u64().unwrap_or(0))))
        })
        .collect())
}

/// Kernel time per BPF program needs `kernel.bpf_stats_enabled`; the old
/// value is put back when the guard goes.
pub struct BpfStats(Option<String>);

impl BpfStats {
    const KNOB: &str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn enable() -> Self {
        let old = std::fs::read_to_string(Self::KNOB).ok();
        if let Err(e) = std::fs::write(Self::KNOB, "1") {
            eprintln!("bench: cannot enable {}: {e} (kernel times will read 0)", Self::KNOB);
        }
        Self(old)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(Self::KNOB, old.trim());
        }
    }
}

/// `rounds` interleaved rounds of untraced (A) and `traced` ("B": `ttrace
/// run`, "C": `ttrace top --json`).
pub fn run(ctx: &Ctx, model: &Path, traced: &'static str) -> Result<Vec<ServerSample>> {
    let _stats = BpfStats::enable();
    let mut samples = Vec::new();
    for round in 1..=ctx.rounds {
        for s in run_round(ctx, traced, round, model)? {
            eprintln!("bench: server round {round}/{} {}: {:.3} requests/s", ctx.rounds, s.variant, s.requests_per_s);
            samples.push(s);
        }
    }
    Ok(samples)
}

pub fn section(md: &mut String, ctx: &Ctx, served: &[ServerSample]) -> Result<()> {
    writeln!(md, "## llama-server under {CLIENTS} concurrent clients\n")?;
    setup(md, ctx)?;
    throughput(md, ctx, served, "B", "ttrace run (graph capture, sequences)")?;
    kernel_time(md, served, "B")
}

/// `ttrace top`'s own overhead: the same set-up, C for B.
pub fn top_section(md: &mut String, ctx: &Ctx, served: &[ServerSample]) -> Result<()> {
    writeln!(md, "## `ttrace top` overhead under {CLIENTS} concurrent clients\n")?;
    setup(md, ctx)?;
    writeln!(
        md,
        "C runs the server under `ttrace top --json` (1 s intervals, stdout to /dev/null): the same probes as `run`, plus the per-interval aggregation and a cachestat(2) per tensor each second, and no trace file.\n"
    )?;
    throughput(md, ctx, served, "C", "ttrace top --json")?;
    kernel_time(md, served, "C")
}

fn setup(md: &mut String, ctx: &Ctx) -> Result<()> {
    writeln!(
        md,
        "`llama-server -np {clients} -c 4096 -t 2` on the real model, loopback; per round, an untraced server (A) and a \
         traced one are both started and given one warm-up wave each, then {waves} waves each of {clients} concurrent \
         `/completion` requests (curl; `n_predict` {n}, `ignore_eos`, `cache_prompt` false) are timed, alternating A B B A A B B A \
         (the reverse in even rounds), so that the host's changes of speed over seconds to minutes fall on both alike; the \
         server not being timed is idle. {} rounds. Figure: requests per second of wall time, per round over its timed waves. \
         While A is timed, the idle traced server's tracer still wakes on its 100 ms tick and its page-fault tracepoint \
         filters A's faults (about 0.1 % of A's time, measured below as its CPU and kernel time per ubatch), which favours \
         the traced run by at most that.\n",
        ctx.rounds,
        clients = CLIENTS,
        waves = WAVES,
        n = N_PREDICT,
    )?;
    Ok(())
}

fn throughput(md: &mut String, ctx: &Ctx, served: &[ServerSample], traced: &str, what: &str) -> Result<()> {
    let by = |v: &str| served.iter().filter(|s| s.variant == v).map(|s| s.requests_per_s).collect::<Vec<_>>();
    let get = |r: usize, v: &str| served.iter().find(|s| s.round == r && s.variant == v).map(|s| s.requests_per_s);
    let ratios: Vec<f64> = (1..=ctx.rounds).filter_map(|r| Some(get(r, traced)? / get(r, "A")?)).collect();
    writeln!(md, "| run | setup | median requests/s | min–max |")?;
    writeln!(md, "|---|---|---|---|")?;
    for (v, what) in [("A", "untraced"), (traced, what)] {
        let xs = by(v);
        let (lo, hi) = min_max(&xs);
        writeln!(md, "| {v} | {what} | {:.3} | {lo:.3}–{hi:.3} |", median(&xs))?;
    }
    let (lo, hi) = min_max(&ratios);
    let ci = median_ci95(&ratios).map_or_else(
        || "too few rounds for a 95 % interval".to_string(),
        |(a, b)| format!("95 % confidence interval of the median {a:.3}–{b:.3}, distribution-free"),
    );
    writeln!(
        md,
        "\n- Traced/untraced request throughput, median of per-round ratios: {:.3} (range {lo:.3}–{hi:.3}; {ci})\n",
        median(&ratios)
    )?;
    Ok(())
}

/// Kernel time of each BPF program over the timed waves of every traced
/// round, per ubatch: not sensitive to other load the way throughput is.
fn kernel_time(md: &mut String, served: &[ServerSample], traced: &str) -> Result<()> {
    let rounds: Vec<&ServerSample> = served.iter().filter(|s| s.variant == traced).collect();
    let ubatches: u64 = rounds.iter().map(|s| s.ubatches()).sum();
    if ubatches == 0 {
        return Ok(());
    }
    let mut per: Vec<(String, u64, u64)> = Vec::new();
    for (name, ns, n) in rounds.iter().flat_map(|s| &s.programs) {
        match per.iter_mut().find(|p| &p.0 == name) {
            Some(p) => (p.1, p.2) = (p.1 + ns, p.2 + n),
            None => per.push((name.clone(), *ns, *n)),
        }
    }
    per.retain(|p| p.2 > 0);
    per.sort_by_key(|p| std::cmp::Reverse(p.1));
    writeln!(
        md,
        "Kernel time of the tracer's BPF programs over the timed waves ({ubatches} ubatches, `bpftool prog show` run_time_ns/run_cnt). The page-fault and page-cache tracepoints fire for every process on the machine and filter in the program, so their runs include other processes' faults.\n"
    )?;
    writeln!(md, "| program | runs per ubatch | ns per run | µs per ubatch |")?;
    writeln!(md, "|---|---|---|---|")?;
    let mut total = 0.0;
    for (name, ns, n) in &per {
        let us = *ns as f64 / ubatches as f64 / 1000.0;
        total += us;
        writeln!(md, "| {name} | {:.1} | {} | {us:.1} |", *n as f64 / ubatches as f64, ns / n)?;
    }
    writeln!(md, "\n- Kernel time per ubatch, all programs: {total:.1} µs")?;
    let cpu: Vec<f64> = rounds
        .iter()
        .filter(|s| s.ubatches() > 0)
        .map(|s| s.tracer_cpu_ns as f64 / s.ubatches() as f64 / 1000.0)
        .collect();
    let (lo, hi) = min_max(&cpu);
    writeln!(
        md,
        "- The recorder's own CPU time (the run time of the ttrace process's threads over the timed waves, schedstat) per ubatch, median of rounds: {:.0} µs ({lo:.0}–{hi:.0}); with `-t 2` on 2 cores it competes with llama.cpp's threads\n",
        median(&cpu)
    )?;
    Ok(())
}

/// Rows of the server part (`prefix` "server") or the top part ("top").
pub fn csv(csv: &mut String, served: &[ServerSample], prefix: &str) -> Result<()> {
    for s in served {
        writeln!(csv, "{prefix}_requests_per_s,{},{},{}", s.variant, s.round, s.requests_per_s)?;
        if s.variant != "A" {
            writeln!(csv, "{prefix}_tracer_cpu_ns,{},{},{}", s.variant, s.round, s.tracer_cpu_ns)?;
        }
        for (name, ns, n) in &s.programs {
            writeln!(csv, "{prefix}_kernel_ns,{}:{name},{},{ns}/{n}", s.variant, s.round)?;
        }
    }
    Ok(())
}
