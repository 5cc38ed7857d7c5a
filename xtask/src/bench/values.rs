//! `--values` overhead: llama-completion on Gemma, untraced (A) against
//! `ttrace run --values` (V) and `--values --values-filter ffn_out` (F),
//! interleaved rounds at `-t 2`; then one accounting run of V and of F says
//! where their time goes. Values mode traps every node and every barrier on every thread and
//! copies every output through the ring (F: only the kept nodes'), so it is
//! opt-in; this says what it costs.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use super::{
    Ctx, median, min_max, overhead,
    values_account::{Account, ProgramGroup, account},
};

pub struct ValuesSample {
    pub round: usize,
    pub variant: &'static str,
    pub tokens_per_s: f64,
    /// V and F: bytes of the trace written.
    pub trace_bytes: Option<u64>,
    /// The 1-minute load average before the run: on 2 cores other work
    /// swamps the figure.
    pub load: f64,
}

const THREADS: u32 = 2;
/// F's filter: one node a layer (issue 42's example).
const FILTER: &str = "ffn_out";
/// Issue 42's goals: V/A and F/A.
const V_GOAL: f64 = 0.8;
const F_GOAL: f64 = 0.95;

/// What the measured results are.
pub struct ValuesBench {
    pub samples: Vec<ValuesSample>,
    pub accounts: Vec<Account>,
}

/// `ttrace run --values` (V; F with the filter) of llama.
fn traced(ctx: &Ctx, model: &Path, variant: &str, trace: &Path) -> Command {
    traced_tokens(ctx, model, variant, trace, ctx.tokens)
}

/// As [`traced`], generating `tokens`.
fn traced_tokens(ctx: &Ctx, model: &Path, variant: &str, trace: &Path, tokens: u32) -> Command {
    let mut args = overhead::llama_args(ctx, model, THREADS);
    if let Some(n) = args.iter().position(|a| a == "-n") {
        args[n + 1] = tokens.to_string();
    }
    let mut c = Command::new(&ctx.ttrace);
    c.args(["run", "--values", "-o"]).arg(trace);
    if variant == "F" {
        c.args(["--values-filter", FILTER]);
    }
    c.arg("--").args(&args);
    c.env("LD_PRELOAD", &ctx.flushlog).stdin(std::process::Stdio::null());
    c
}

fn one(ctx: &Ctx, model: &Path, variant: &'static str, round: usize) -> Result<ValuesSample> {
    let load = super::attach::load_average();
    let trace = ctx.out_dir.join(format!("values-{variant}.data"));
    let mut cmd = match variant {
        "A" => overhead::command(ctx, "A", model, THREADS, &trace)?,
        _ => traced(ctx, model, variant, &trace),
    };
    let out = cmd.output().with_context(|| format!("starting {}", crate::shell::describe(&cmd)))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{} failed ({}):\n{}", crate::shell::describe(&cmd), out.status, text);
    }
    let tokens_per_s = overhead::eval_tokens_per_s(&text).context("no `eval time` line in llama's output")?;
    let trace_bytes = (variant != "A").then(|| std::fs::metadata(&trace).map(|m| m.len())).transpose()?;
    Ok(ValuesSample { round, variant, tokens_per_s, trace_bytes, load })
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<ValuesBench> {
    one(ctx, model, "A", 0)?; // warm-up
    let mut samples = Vec::new();
    const VARIANTS: [&str; 3] = ["A", "F", "V"];
    for round in 1..=ctx.rounds {
        // Each variant in each place in turn.
        for i in 0..VARIANTS.len() {
            let variant = VARIANTS[(round + i) % VARIANTS.len()];
            let s = one(ctx, model, variant, round)?;
            eprintln!("bench: values round {round}/{} {variant}: {:.2} tokens/s", ctx.rounds, s.tokens_per_s);
            samples.push(s);
        }
    }
    let mut accounts = Vec::new();
    for variant in ["V", "F"] {
        let trace = ctx.out_dir.join(format!("values-account-{variant}.data"));
        let short = ctx.tokens / 4;
        let long = (ctx.tokens, traced_tokens(ctx, model, variant, &trace, ctx.tokens));
        accounts.push(account(ctx, variant, long, (short, traced_tokens(ctx, model, variant, &trace, short)))?);
        eprintln!("bench: values accounting run {variant} done");
    }
    Ok(ValuesBench { samples, accounts })
}

fn speeds(samples: &[ValuesSample], variant: &str) -> Vec<f64> {
    samples.iter().filter(|s| s.variant == variant).map(|s| s.tokens_per_s).collect()
}

/// The median over rounds of `variant`'s speed over A's in the same round.
fn ratio(samples: &[ValuesSample], variant: &str) -> f64 {
    let of = |round, v: &str| samples.iter().find(|s| s.round == round && s.variant == v).map(|s| s.tokens_per_s);
    let ratios: Vec<f64> = samples
        .iter()
        .filter(|s| s.variant == "A")
        .filter_map(|a| Some(of(a.round, variant)? / a.tokens_per_s))
        .collect();
    median(&ratios)
}

pub fn section(md: &mut String, ctx: &Ctx, bench: &ValuesBench) -> Result<()> {
    let samples = &bench.samples;
    writeln!(md, "## Values mode overhead\n")?;
    writeln!(
        md,
        "`llama-completion` on Gemma 3 270M Q4_K_M as in the overhead section (`-n {} -c 512 -t {THREADS}`), \
         untraced (A) against `ttrace run --values` (V: every node output fingerprinted), `ttrace run --values \
         --values-filter {FILTER}` (F: the kernel sends nothing of the nodes the filter leaves out once it knows \
         their names), {} interleaved rounds. Every node entry and every `ggml_barrier` \
         traps on every thread, so the mode is opt-in.\n",
        ctx.tokens, ctx.rounds
    )?;
    writeln!(md, "| variant | median tokens/s | min–max | median of per-round ratios to A |\n|---|---|---|---|")?;
    let labels = [
        ("A", "untraced".to_string()),
        ("F", format!("`--values --values-filter {FILTER}`")),
        ("V", "`--values`".to_string()),
    ];
    for (variant, label) in &labels {
        let speed = speeds(samples, variant);
        let (lo, hi) = min_max(&speed);
        let r = if *variant == "A" { 1.0 } else { ratio(samples, variant) };
        writeln!(md, "| {variant} {label} | {:.2} | {lo:.2}–{hi:.2} | {r:.3} |", median(&speed))?;
    }
    let loads: Vec<f64> = samples.iter().map(|s| s.load).collect();
    let (load_lo, load_hi) = min_max(&loads);
    writeln!(md, "\n1-minute load average before the runs: {load_lo:.1}–{load_hi:.1} (2 cores).")?;
    let size = |v: &str| samples.iter().rev().find_map(|s| (s.variant == v).then_some(s.trace_bytes).flatten());
    let (v_a, f_a) = (ratio(samples, "V"), ratio(samples, "F"));
    writeln!(
        md,
        "\nV/A = {v_a:.3} (goal ≥ {V_GOAL}: {}), F/A = {f_a:.3} (goal ≥ {F_GOAL}: {}). Trace of the last V run: \
         {:.1} MiB ({:.0} KiB per generated token); of the last F run: {:.2} MiB.\n",
        super::met(v_a >= V_GOAL),
        super::met(f_a >= F_GOAL),
        size("V").unwrap_or(0) as f64 / (1 << 20) as f64,
        size("V").unwrap_or(0) as f64 / 1024.0 / f64::from(ctx.tokens.max(1)),
        size("F").unwrap_or(0) as f64 / (1 << 20) as f64,
    )?;
    where_the_time_goes(md, ctx, bench)
}

/// Each part of V's and F's cost as a share of the two cores' time in a
/// traced token: llama keeps both busy (its threads spin at barriers), so
/// whatever CPU tracing takes, it takes from them. The traps themselves
/// are what is left: no counter times a trap.
fn where_the_time_goes(md: &mut String, ctx: &Ctx, bench: &ValuesBench) -> Result<()> {
    let samples = &bench.samples;
    let ms_per_token = |v: &str| 1000.0 / median(&speeds(samples, v));
    let accounts: Vec<&Account> =
        ["F", "V"].iter().filter_map(|v| bench.accounts.iter().find(|a| a.variant == *v)).collect();
    writeln!(md, "### Where the time goes\n")?;
    writeln!(
        md,
        "A token takes {:.2} ms untraced. Per generated token, each share below is of the two cores' time in a \
         traced token (twice its median duration). Program run counts and times are from runs of each variant \
         with `kernel.bpf_stats_enabled`, the recorder's CPU time from `/proc/PID/task/*/schedstat`, both sampled \
         every 100 ms: a run of {} tokens less one of {} (the recorder's start slows no token). Each program run \
         is one trap.\n",
        ms_per_token("A"),
        ctx.tokens,
        ctx.tokens / 4,
    )?;
    let variants: Vec<&str> = accounts.iter().map(|a| a.variant).collect();
    writeln!(md, "| part | {} |\n|---|{}", variants.join(" | "), "---|".repeat(accounts.len()))?;
    let core_ns = |a: &Account| 2.0 * ms_per_token(a.variant) * 1e6;
    let row = |md: &mut String, label: &str, cell: &dyn Fn(&Account) -> String| -> Result<()> {
        let cells: Vec<String> = accounts.iter().map(|a| cell(a)).collect();
        Ok(writeln!(md, "| {label} | {} |", cells.join(" | "))?)
    };
    let lost = |a: &Account| 1.0 - ratio(samples, a.variant);
    row(md, "throughput lost (1 − X/A)", &|a| format!("{:.1} %", 100.0 * lost(a)))?;
    for group in [ProgramGroup::NodeEntry, ProgramGroup::Barrier, ProgramGroup::Other] {
        row(md, group.label(), &|a| {
            let cost = a.programs.get(&group).copied().unwrap_or_default();
            let per_run = cost.ns as f64 / cost.runs.max(1) as f64;
            let share = cost.ns as f64 / f64::from(a.tokens) / core_ns(a);
            format!(
                "{:.1} % ({:.0} runs/token × {per_run:.0} ns)",
                100.0 * share,
                cost.runs as f64 / f64::from(a.tokens)
            )
        })?;
    }
    row(md, "recorder CPU (ring, fingerprints, writing)", &|a| {
        let per_token = a.recorder_ns as f64 / f64::from(a.tokens);
        format!("{:.1} % ({:.0} µs/token)", 100.0 * per_token / core_ns(a), per_token / 1e3)
    })?;
    row(md, "the rest: the traps themselves, and what they disturb", &|a| {
        let programs: u64 = a.programs.values().map(|c| c.ns).sum();
        let explained = (programs + a.recorder_ns) as f64 / f64::from(a.tokens) / core_ns(a);
        let traps: u64 = a.programs.iter().filter(|(g, _)| **g != ProgramGroup::Other).map(|(_, c)| c.runs).sum();
        let rest_ns = (lost(a) - explained) * core_ns(a);
        format!(
            "{:.1} % ({:.0} value traps/token: {:.2} µs each)",
            100.0 * (lost(a) - explained),
            traps as f64 / f64::from(a.tokens),
            rest_ns / (traps as f64 / f64::from(a.tokens)).max(1.0) / 1e3
        )
    })?;
    writeln!(
        md,
        "\nWhat would remove each part. The traps: probing the node loop's own calls of `ggml_barrier` instead of \
         its entry (the ops' barriers, such as each matrix multiplication's, would stop trapping) and finding the \
         node at its barrier from the recorded graph, so that the node-entry probe goes: one trap per node and \
         thread instead of two or more. The calls go through the PLT and the loop's code differs by build, so \
         this means reading each build's code, as the layouts are. The barrier programs: every arrival checks the \
         team, and the last one reads the node, looks its name up and, unless filtered out, copies its bytes \
         into the ring. The recorder: it drains the ring, fingerprints every node (BLAKE3 and sums) and writes \
         the trace, on the cores llama computes on; F leaves it little to do.\n"
    )?;
    Ok(())
}

pub fn csv(csv: &mut String, bench: &ValuesBench) -> Result<()> {
    for s in &bench.samples {
        writeln!(csv, "values_tokens_per_s,{}-t{THREADS},{},{}", s.variant, s.round, s.tokens_per_s)?;
        writeln!(csv, "values_load_average,{}-t{THREADS},{},{}", s.variant, s.round, s.load)?;
        if let Some(bytes) = s.trace_bytes {
            writeln!(csv, "values_trace_bytes,{}-t{THREADS},{},{bytes}", s.variant, s.round)?;
        }
    }
    for a in &bench.accounts {
        writeln!(csv, "values_account_tokens,{}-t{THREADS},account,{}", a.variant, a.tokens)?;
        writeln!(csv, "values_recorder_cpu_ns,{}-t{THREADS},account,{}", a.variant, a.recorder_ns)?;
        for (group, cost) in &a.programs {
            writeln!(csv, "values_program_ns,{}-t{THREADS},{group:?},{}", a.variant, cost.ns)?;
            writeln!(csv, "values_program_runs,{}-t{THREADS},{group:?},{}", a.variant, cost.runs)?;
        }
    }
    Ok(())
}
