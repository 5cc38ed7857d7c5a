//! Serving overhead: llama-server on loopback with 4 slots, untraced (A) and
//! under `ttrace run` (B), each round timing waves of 4 concurrent
//! completions (curl clients); request throughput per round, rounds
//! interleaved A B, B A, ….

use std::{
    fmt::Write as _,
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, min_max};

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
        clients.push(curl(port, "/completion", Some(body.to_string())).spawn()?);
    }
    for mut c in clients {
        if !c.wait()?.success() {
            bail!("a completion request to llama-server failed");
        }
    }
    Ok(())
}

fn stop(mut child: Child) -> Result<()> {
    // SIGINT: llama-server exits, and `ttrace run` stops it and writes the trace.
    Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
    child.wait()?;
    Ok(())
}

pub fn run_one(ctx: &Ctx, variant: &'static str, round: usize, model: &Path) -> Result<ServerSample> {
    let port = free_port()?;
    let mut child = start(ctx, variant, model, port)?;
    let timed = (|| {
        wait_healthy(port, &mut child)?;
        wave(port)?; // warm: first requests pay for lazy set-up
        let started = Instant::now();
        for _ in 0..WAVES {
            wave(port)?;
        }
        Ok::<_, anyhow::Error>(started.elapsed().as_secs_f64())
    })();
    stop(child)?;
    let secs = timed?;
    Ok(ServerSample { round, variant, requests_per_s: (WAVES * CLIENTS) as f64 / secs })
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<Vec<ServerSample>> {
    let mut samples = Vec::new();
    for round in 1..=ctx.rounds {
        let order: [&'static str; 2] = if round % 2 == 1 { ["A", "B"] } else { ["B", "A"] };
        for variant in order {
            let s = run_one(ctx, variant, round, model)?;
            eprintln!("bench: server round {round}/{} {variant}: {:.3} requests/s", ctx.rounds, s.requests_per_s);
            samples.push(s);
        }
    }
    Ok(samples)
}

pub fn section(md: &mut String, ctx: &Ctx, served: &[ServerSample]) -> Result<()> {
    writeln!(md, "## llama-server under {CLIENTS} concurrent clients\n")?;
    writeln!(
        md,
        "`llama-server -np {clients} -c 4096 -t 2` on the real model, loopback; per round, after one warm-up wave, {waves} waves \
         of {clients} concurrent `/completion` requests (curl; `n_predict` {n}, `ignore_eos`, `cache_prompt` false) are \
         timed. {} interleaved rounds (A B, then B A, …). Figure: requests per second of wall time.\n",
        ctx.rounds,
        clients = CLIENTS,
        waves = WAVES,
        n = N_PREDICT,
    )?;
    let by = |v: &str| served.iter().filter(|s| s.variant == v).map(|s| s.requests_per_s).collect::<Vec<_>>();
    let get = |r: usize, v: &str| served.iter().find(|s| s.round == r && s.variant == v).map(|s| s.requests_per_s);
    let ratios: Vec<f64> = (1..=ctx.rounds).filter_map(|r| Some(get(r, "B")? / get(r, "A")?)).collect();
    writeln!(md, "| run | setup | median requests/s | min–max |")?;
    writeln!(md, "|---|---|---|---|")?;
    for (v, what) in [("A", "untraced"), ("B", "ttrace run (graph capture, sequences)")] {
        let xs = by(v);
        let (lo, hi) = min_max(&xs);
        writeln!(md, "| {v} | {what} | {:.3} | {lo:.3}–{hi:.3} |", median(&xs))?;
    }
    let (lo, hi) = min_max(&ratios);
    writeln!(
        md,
        "\n- Traced/untraced request throughput, median of per-round ratios: {:.3} ({lo:.3}–{hi:.3})\n",
        median(&ratios)
    )?;
    Ok(())
}

pub fn csv(csv: &mut String, served: &[ServerSample]) -> Result<()> {
    for s in served {
        writeln!(csv, "server_requests_per_s,{},{},{}", s.variant, s.round, s.requests_per_s)?;
    }
    Ok(())
}
