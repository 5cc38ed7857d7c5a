//! `--values` overhead: llama-completion on Gemma, untraced (A) against
//! `ttrace run --values` (V) and `--values --values-filter ffn_out` (F),
//! interleaved rounds at `-t 2`. Values mode traps every node and every
//! barrier on every thread and copies every output through the ring (F: only
//! the kept nodes'), so it is opt-in; this says what it costs.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, min_max, overhead};

pub struct ValuesSample {
    pub round: usize,
    pub variant: &'static str,
    pub tokens_per_s: f64,
    /// V: bytes of the trace written.
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

fn one(ctx: &Ctx, model: &Path, variant: &'static str, round: usize) -> Result<ValuesSample> {
    let load = super::attach::load_average();
    let trace = ctx.out_dir.join(format!("values-{variant}.data"));
    let mut cmd = if variant == "A" {
        overhead::command(ctx, "A", model, THREADS, &trace)?
    } else {
        let args = overhead::llama_args(ctx, model, THREADS);
        let mut c = Command::new(&ctx.ttrace);
        c.args(["run", "--values", "-o"]).arg(&trace);
        if variant == "F" {
            c.args(["--values-filter", FILTER]);
        }
        c.arg("--").args(&args);
        c.env("LD_PRELOAD", &ctx.flushlog).stdin(std::process::Stdio::null());
        c
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

pub fn run(ctx: &Ctx, model: &Path) -> Result<Vec<ValuesSample>> {
    one(ctx, model, "A", 0)?; // warm-up
    let mut samples = Vec::new();
    for round in 1..=ctx.rounds {
        // Each variant first, second and last in turn.
        let orders = [["A", "V", "F"], ["V", "F", "A"], ["F", "A", "V"]];
        let order = orders[round % orders.len()];
        for variant in order {
            let s = one(ctx, model, variant, round)?;
            eprintln!("bench: values round {round}/{} {variant}: {:.2} tokens/s", ctx.rounds, s.tokens_per_s);
            samples.push(s);
        }
    }
    Ok(samples)
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

pub fn section(md: &mut String, ctx: &Ctx, samples: &[ValuesSample]) -> Result<()> {
    let (a, v, f) = (speeds(samples, "A"), speeds(samples, "V"), speeds(samples, "F"));
    let ((a_lo, a_hi), (v_lo, v_hi), (f_lo, f_hi)) = (min_max(&a), min_max(&v), min_max(&f));
    writeln!(md, "## Values mode overhead\n")?;
    writeln!(
        md,
        "`llama-completion` on Gemma 3 270M Q4_K_M as in the overhead section (`-n {} -c 512 -t {THREADS}`), \
         untraced (A) against `ttrace run --values` (V: every node output fingerprinted) and `ttrace run --values \
         --values-filter {FILTER}` (F: the kernel copies only the kept nodes' bytes once it knows the names the \
         filter leaves out), {} interleaved rounds. Every node entry and every `ggml_barrier` traps on every \
         thread, so the mode is opt-in.\n",
        ctx.tokens, ctx.rounds
    )?;
    writeln!(md, "| variant | median tokens/s | min–max |\n|---|---|---|")?;
    writeln!(md, "| A untraced | {:.2} | {a_lo:.2}–{a_hi:.2} |", median(&a))?;
    writeln!(md, "| V `--values` | {:.2} | {v_lo:.2}–{v_hi:.2} |", median(&v))?;
    writeln!(md, "| F `--values --values-filter {FILTER}` | {:.2} | {f_lo:.2}–{f_hi:.2} |", median(&f))?;
    let loads: Vec<f64> = samples.iter().map(|s| s.load).collect();
    let (load_lo, load_hi) = min_max(&loads);
    writeln!(md, "\n1-minute load average before the runs: {load_lo:.1}–{load_hi:.1} (2 cores).")?;
    let size = samples.iter().rev().find_map(|s| (s.variant == "V").then_some(s.trace_bytes).flatten()).unwrap_or(0);
    let (v_a, f_a) = (ratio(samples, "V"), ratio(samples, "F"));
    writeln!(
        md,
        "\nMedians of per-round ratios: V/A = {v_a:.3} (goal ≥ {V_GOAL}: {}), F/A = {f_a:.3} (goal ≥ {F_GOAL}: {}). \
         Trace of the last V run: {:.1} MiB ({:.0} KiB per generated token).\n",
        super::met(v_a >= V_GOAL),
        super::met(f_a >= F_GOAL),
        size as f64 / (1 << 20) as f64,
        size as f64 / 1024.0 / f64::from(ctx.tokens.max(1))
    )?;
    Ok(())
}

pub fn csv(csv: &mut String, samples: &[ValuesSample]) -> Result<()> {
    for s in samples {
        writeln!(csv, "values_tokens_per_s,{}-t{THREADS},{},{}", s.variant, s.round, s.tokens_per_s)?;
        writeln!(csv, "values_load_average,{}-t{THREADS},{},{}", s.variant, s.round, s.load)?;
        if let Some(bytes) = s.trace_bytes {
            writeln!(csv, "values_trace_bytes,{}-t{THREADS},{},{bytes}", s.variant, s.round)?;
        }
    }
    Ok(())
}
