//! Inference overhead on the real model: llama-completion untraced (A),
//! under `ttrace run` (B, graph capture), `ttrace run --op-timing` (C, the
//! per-node probes) and bpftrace counting calls of the per-node hook (D),
//! interleaved A B C D, B C D A, … (each round rotated) at each thread
//! count; llama's own generation tokens/s.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, met, min_max};

pub const VARIANTS: [(&str, &str); 4] = [
    ("A", "untraced"),
    ("B", "ttrace run (graph capture)"),
    ("C", "ttrace run --op-timing (per-node probes)"),
    ("D", "bpftrace, count-only per-node uprobe (scripts/bench/count_ops.bt)"),
];

/// `-t` of each measured series: the cost of per-node probes grows with
/// threads, graph capture's should not.
pub const THREADS: [u32; 2] = [2, 1];

pub const PROMPT: &str = "The history of the printing press begins in";

/// One measured run.
pub struct Sample {
    pub threads: u32,
    pub round: usize,
    pub variant: &'static str,
    pub tokens_per_s: f64,
    /// `ttrace run`'s summary line (B and C), for the trace size.
    pub summary: Option<String>,
}

/// llama-completion's arguments (`-c 512`: Gemma's default context would
/// size a KV cache far bigger than the model).
pub fn llama_args(ctx: &Ctx, model: &Path, threads: u32) -> Vec<String> {
    vec![
        ctx.paths.llama.completion.display().to_string(),
        "-m".into(),
        model.display().to_string(),
        "-p".into(),
        PROMPT.into(),
        "-n".into(),
        ctx.tokens.to_string(),
        "--ignore-eos".into(),
        "-no-cnv".into(),
        "--perf".into(),
        "-c".into(),
        "512".into(),
        "-t".into(),
        threads.to_string(),
    ]
}

/// The bpftrace script with the library path filled in (0.17 takes no
/// positional parameter in a probe's binary path).
fn bpftrace_script(ctx: &Ctx) -> Result<PathBuf> {
    let src = crate::cache::repo_root().join("scripts/bench/count_ops.bt");
    let text = std::fs::read_to_string(&src).with_context(|| format!("reading {}", src.display()))?;
    let lib = ctx.paths.llama.lib_dir.join("libggml-cpu.so.0");
    let lib = std::fs::canonicalize(&lib).with_context(|| format!("resolving {}", lib.display()))?;
    let out = ctx.out_dir.join("count_ops.bt");
    std::fs::write(&out, text.replace("LIBGGML_CPU", &lib.display().to_string()))?;
    Ok(out)
}

pub fn command(ctx: &Ctx, variant: &str, model: &Path, threads: u32, trace: &Path) -> Result<Command> {
    let args = llama_args(ctx, model, threads);
    let mut cmd = match variant {
        "A" => {
            let mut c = Command::new(&args[0]);
            c.args(&args[1..]);
            c
        }
        "B" | "C" => {
            let mut c = Command::new(&ctx.ttrace);
            c.arg("run");
            if variant == "C" {
                c.arg("--op-timing");
            }
            c.arg("-o").arg(trace).arg("--").args(&args);
            c
        }
        "D" => {
            // bpftrace 0.17 splits `-c` on spaces (no quoting), so the prompt
            // goes through a wrapper script that execs llama (same pid).
            let script = bpftrace_script(ctx)?;
            let wrapper = ctx.out_dir.join("run-llama.sh");
            let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
            std::fs::write(&wrapper, format!("#!/bin/sh\nexec {}\n", quoted.join(" ")))?;
            std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("ulimit -l unlimited 2>/dev/null; exec bpftrace -o /dev/null \"$0\" -c \"/bin/sh $1\"")
                .arg(&script)
                .arg(&wrapper);
            c
        }
        other => bail!("no variant {other}"),
    };
    cmd.env("LD_PRELOAD", &ctx.flushlog).stdin(Stdio::null());
    Ok(cmd)
}

/// `…_print:        eval time = X ms / N runs (Y ms per token, Z tokens per second)`:
/// llama's perf line only (the generated text may hold "retrieval time").
pub fn eval_tokens_per_s(text: &str) -> Option<f64> {
    let perf_line =
        |l: &&str| l.split_once("_print:").is_some_and(|(_, rest)| rest.trim_start().starts_with("eval time"));
    let line = text.lines().find(perf_line)?;
    let before = line.split("tokens per second").next()?;
    before.rsplit([',', '(']).next()?.trim().parse().ok()
}

pub fn run_one(ctx: &Ctx, variant: &'static str, threads: u32, round: usize, model: &Path) -> Result<Sample> {
    let trace = ctx.out_dir.join(format!("overhead-{variant}.data"));
    let mut cmd = command(ctx, variant, model, threads, &trace)?;
    let out = cmd.output().with_context(|| format!("starting {}", crate::shell::describe(&cmd)))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{} failed ({}):\n{}", crate::shell::describe(&cmd), out.status, tail(&text, 20));
    }
    let tokens_per_s = eval_tokens_per_s(&text)
        .with_context(|| format!("variant {variant}: no `eval time` line in the output:\n{}", tail(&text, 20)))?;
    let summary = text.lines().find(|l| l.contains("bytes per op frame")).map(str::to_string);
    Ok(Sample { threads, round, variant, tokens_per_s, summary })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<Vec<Sample>> {
    // Warm the page cache (and check everything starts) before measuring.
    eprintln!("bench: overhead warm-up run");
    run_one(ctx, "A", 2, 0, model)?;
    let mut samples = Vec::new();
    for threads in THREADS {
        for round in 1..=ctx.rounds {
            // Each round starts with a different variant, so a slow spell of
            // the machine at a fixed point of the round favours none.
            let mut order = VARIANTS;
            order.rotate_left((round - 1) % VARIANTS.len());
            for (variant, _) in order {
                let s = run_one(ctx, variant, threads, round, model)?;
                eprintln!(
                    "bench: overhead -t {threads} round {round}/{} {variant}: {:.2} tokens/s",
                    ctx.rounds, s.tokens_per_s
                );
                samples.push(s);
            }
        }
    }
    Ok(samples)
}

pub fn section(md: &mut String, ctx: &Ctx, samples: &[Sample]) -> Result<()> {
    writeln!(md, "## Inference overhead\n")?;
    writeln!(
        md,
        "`llama-completion` on the real model (Gemma 3 270M Q4_K_M), prompt \"{}\", `-n {} -c 512 --ignore-eos`, warm \
         page cache (one untraced warm-up run first), {} interleaved rounds per thread count (A B C D, then rotated: B C D A, …). Figure: llama's \
         own generation speed (`eval time … tokens per second`), log drained by an LD_PRELOAD flush at exit.\n",
        PROMPT, ctx.tokens, ctx.rounds
    )?;
    for threads in THREADS {
        let by = |v: &str| {
            samples
                .iter()
                .filter(|s| s.variant == v && s.threads == threads)
                .map(|s| s.tokens_per_s)
                .collect::<Vec<_>>()
        };
        // Per-round ratios (each round's X over the same round's A) are less noise-prone.
        let per_round = |v: &str| {
            let get = |r: usize, w: &str| {
                samples.iter().find(|s| s.threads == threads && s.round == r && s.variant == w).map(|s| s.tokens_per_s)
            };
            median(&(1..=ctx.rounds).filter_map(|r| Some(get(r, v)? / get(r, "A")?)).collect::<Vec<_>>())
        };
        writeln!(md, "### `-t {threads}`\n")?;
        writeln!(md, "| run | setup | median tokens/s | min–max | median of per-round ratios to A |")?;
        writeln!(md, "|---|---|---|---|---|")?;
        for (v, what) in VARIANTS {
            let xs = by(v);
            let (lo, hi) = min_max(&xs);
            writeln!(md, "| {v} | {what} | {:.2} | {lo:.2}–{hi:.2} | {:.3} |", median(&xs), per_round(v))?;
        }
        let b = per_round("B");
        writeln!(md, "\n- Goal B/A ≥ 0.99 at `-t {threads}`: {} ({b:.3})\n", met(b >= 0.99))?;
    }

    Ok(())
}

pub fn csv(csv: &mut String, samples: &[Sample]) -> Result<()> {
    for s in samples {
        writeln!(csv, "overhead_tokens_per_s,{}-t{},{},{}", s.variant, s.threads, s.round, s.tokens_per_s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_llamas_perf_line_counts() {
        let text = "the retrieval time of a page (3 tokens per second, at best)\n\
                    0.04.882 I common_perf_print: prompt eval time =  42.46 ms /  9 tokens (4.72 ms per token, 211.98 tokens per second)\n\
                    0.04.882 I common_perf_print:        eval time = 3709.48 ms / 255 runs (14.55 ms per token, 68.74 tokens per second)\n";
        assert_eq!(super::eval_tokens_per_s(text), Some(68.74));
        assert_eq!(
            super::eval_tokens_per_s(
                "llama_perf_context_print:        eval time = 1 ms / 2 runs (0.5 ms per token, 2000.00 tokens per second)"
            ),
            Some(2000.0)
        );
    }
}
