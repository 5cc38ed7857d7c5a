//! Overhead on programs users install rather than build: node-llama-cpp
//! (npm; its CPU backend dlopen'd, held at its load) and Debian's packaged
//! llama-completion (ggml 0.27, layouts read from its code) in its own
//! namespaces. Each untraced (A) and under `ttrace run` (B), interleaved
//! A B, B A, …; each program's own generation speed.

use std::{fmt::Write as _, process::Command};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, met, min_max, overhead};

/// One measured run.
pub struct Sample {
    pub program: Program,
    pub round: usize,
    pub variant: &'static str,
    pub tokens_per_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    NodeLlamaCpp,
    Debian,
}

impl Program {
    const ALL: [Program; 2] = [Program::NodeLlamaCpp, Program::Debian];

    fn name(self) -> &'static str {
        match self {
            Program::NodeLlamaCpp => "node-llama-cpp 3.21.1 (npm)",
            Program::Debian => "Debian sid llama-completion (unshare --mount --pid --fork chroot)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Program::NodeLlamaCpp => "node",
            Program::Debian => "debian",
        }
    }

    /// The untraced command line: 2 threads, Gemma, `tokens` generated.
    fn argv(self, ctx: &Ctx, tokens: u32) -> Result<Vec<String>> {
        let p = &ctx.paths;
        let gemma = p.models.get("gemma").context("set-up fetched no `gemma` model")?;
        Ok(match self {
            Program::NodeLlamaCpp => vec![
                "node".into(),
                p.node_llama_cpp.script.display().to_string(),
                gemma.display().to_string(),
                overhead::PROMPT.into(),
                tokens.to_string(),
            ],
            Program::Debian => {
                let d = &p.debian_llama;
                let mut argv: Vec<String> =
                    ["unshare", "--mount", "--pid", "--fork", "--kill-child", "chroot"].map(String::from).into();
                argv.push(d.root.display().to_string());
                argv.extend(["llama-completion", "-m", &d.model, "-p", overhead::PROMPT].map(String::from));
                let n = tokens.to_string();
                argv.extend(["-n", &n, "--ignore-eos", "-no-cnv", "--perf", "-c", "512", "-t", "2"].map(String::from));
                argv
            }
        })
    }

    /// Its own figure: node's `generated_tokens_per_s=`, llama's perf line.
    fn tokens_per_s(self, text: &str) -> Option<f64> {
        match self {
            Program::NodeLlamaCpp => text.lines().find_map(|l| l.strip_prefix("generated_tokens_per_s=")?.parse().ok()),
            Program::Debian => overhead::eval_tokens_per_s(text),
        }
    }
}

fn run_one(ctx: &Ctx, program: Program, variant: &'static str, round: usize, tokens: u32) -> Result<Sample> {
    let argv = program.argv(ctx, tokens)?;
    let mut cmd = if variant == "A" {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    } else {
        let mut c = Command::new(&ctx.ttrace);
        c.arg("run").arg("-o").arg(ctx.out_dir.join(format!("programs-{}.data", program.key()))).arg("--").args(&argv);
        c
    };
    let out = cmd.stdin(std::process::Stdio::null()).output().context("starting a program")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        bail!(
            "{} {variant} failed ({}):\n{}",
            program.name(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let tokens_per_s = program
        .tokens_per_s(&text)
        .with_context(|| format!("{} {variant}: no generation speed printed", program.name()))?;
    Ok(Sample { program, round, variant, tokens_per_s })
}

pub fn run(ctx: &Ctx) -> Result<Vec<Sample>> {
    // node-llama-cpp's script makes a 256-token context.
    let tokens = ctx.tokens.min(200);
    let mut samples = Vec::new();
    for program in Program::ALL {
        eprintln!("bench: programs warm-up run of {}", program.name());
        run_one(ctx, program, "A", 0, tokens)?;
        for round in 1..=ctx.rounds {
            let order: [&'static str; 2] = if round % 2 == 1 { ["A", "B"] } else { ["B", "A"] };
            for variant in order {
                let s = run_one(ctx, program, variant, round, tokens)?;
                eprintln!("bench: {} round {round} {variant}: {:.2} tokens/s", program.key(), s.tokens_per_s);
                samples.push(s);
            }
        }
    }
    Ok(samples)
}

pub fn section(md: &mut String, ctx: &Ctx, samples: &[Sample]) -> Result<()> {
    writeln!(md, "## Overhead on installed programs\n")?;
    writeln!(
        md,
        "Gemma 3 270M Q4_K_M, prompt \"{}\", {} tokens, 2 threads, warm page cache (one untraced warm-up run first), \
         {} rounds per program interleaved (A B, then B A, …). A: untraced; B: `ttrace run` (graph capture). Figure: \
         the program's own generation speed (node-llama-cpp: tokens generated over the time of its \
         `generateCompletion`, taken by our script; Debian's llama-completion: its `eval time` perf line).\n",
        overhead::PROMPT,
        ctx.tokens.min(200),
        ctx.rounds
    )?;
    writeln!(
        md,
        "| program | A median tokens/s (min–max) | B median tokens/s (min–max) | median of per-round B/A | goal ≥ 0.99 |"
    )?;
    writeln!(md, "|---|---|---|---|---|")?;
    for program in Program::ALL {
        let of = |v: &str| -> Vec<f64> {
            samples.iter().filter(|s| s.program == program && s.variant == v).map(|s| s.tokens_per_s).collect()
        };
        let get = |r: usize, v: &str| {
            samples.iter().find(|s| s.program == program && s.round == r && s.variant == v).map(|s| s.tokens_per_s)
        };
        let ratio = median(&(1..=ctx.rounds).filter_map(|r| Some(get(r, "B")? / get(r, "A")?)).collect::<Vec<_>>());
        let (a, b) = (of("A"), of("B"));
        let ((alo, ahi), (blo, bhi)) = (min_max(&a), min_max(&b));
        writeln!(
            md,
            "| {} | {:.2} ({alo:.2}–{ahi:.2}) | {:.2} ({blo:.2}–{bhi:.2}) | {ratio:.3} | {} |",
            program.name(),
            median(&a),
            median(&b),
            met(ratio >= 0.99)
        )?;
    }
    writeln!(md)?;
    Ok(())
}

pub fn csv(csv: &mut String, samples: &[Sample]) -> Result<()> {
    for s in samples {
        writeln!(csv, "programs_tokens_per_s,{}-{},{},{}", s.program.key(), s.variant, s.round, s.tokens_per_s)?;
    }
    Ok(())
}
