//! Export speed, on two traces: `tiny --all-threads` (many short events:
//! the row formats' rate) and Gemma under graph capture, the default (the
//! per-token formats' rate and Perfetto's size per op).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Ctx, median, met, min_max};

/// One trace the formats are exported from.
pub struct Source {
    /// Short name, the CSV key's prefix.
    pub key: &'static str,
    /// What was traced, for the text.
    pub what: String,
    pub trace_bytes: u64,
    /// Op records (`ttrace report --json` `ops`).
    pub ops: u64,
    pub exports: Vec<Export>,
}

/// Export speed of one format.
pub struct Export {
    pub format: &'static str,
    pub events: u64,
    pub secs: Vec<f64>,
    pub max_rss_kb: Option<u64>,
    /// Bytes written (a directory's files added up).
    pub out_bytes: u64,
}

impl Export {
    pub fn median_secs(&self) -> f64 {
        median(&self.secs)
    }
}

const TINY_FORMATS: [&str; 4] = ["jsonl", "csv", "parquet", "perfetto"];
const GEMMA_FORMATS: [&str; 3] = ["tokens-json", "jsonl", "perfetto"];
/// Goals: rows per second (jsonl, csv, parquet on tiny), ops per second of
/// tokens-json on Gemma, Perfetto bytes per op on Gemma.
const ROWS_PER_S: f64 = 2e6;
const TOKENS_JSON_OPS_PER_S: f64 = 250_000.0;
const PERFETTO_BYTES_PER_OP: f64 = 30.0;
const RUNS: usize = 3;

/// How a source trace is recorded: `ttrace run RUN_OPTS -- llama-completion
/// -m MODEL -p PROMPT -c CONTEXT -n TOKENS -t 2 --ignore-eos -no-cnv`.
struct Plan<'a> {
    key: &'static str,
    model: &'a Path,
    run_opts: &'static [&'static str],
    prompt: &'static str,
    context: u32,
    tokens: u32,
    formats: &'static [&'static str],
}

pub fn run(ctx: &Ctx) -> Result<Vec<Source>> {
    let plans = [
        Plan {
            key: "tiny-all-threads",
            model: ctx.paths.models.get("tiny").context("set-up generated no `tiny` model")?,
            run_opts: &["--all-threads"],
            prompt: "hello world",
            context: 8192,
            tokens: if ctx.quick { 1000 } else { 7000 },
            formats: &TINY_FORMATS,
        },
        Plan {
            key: "gemma",
            model: ctx.paths.models.get("gemma").context("set-up fetched no `gemma` model")?,
            run_opts: &[],
            prompt: super::overhead::PROMPT,
            context: 2048,
            tokens: if ctx.quick { 150 } else { 1500 },
            formats: &GEMMA_FORMATS,
        },
    ];
    let mut sources = Vec::new();
    for plan in &plans {
        let trace = ctx.out_dir.join(format!("export-{}.data", plan.key));
        let what = plan.describe();
        eprintln!("bench: export source: {what}");
        plan.record(ctx, &trace)?;
        let ops = report_ops(ctx, &trace)?;
        let trace_bytes = std::fs::metadata(&trace)?.len();
        let exports = time_exports(ctx, &trace, plan.key, plan.formats)?;
        sources.push(Source { key: plan.key, what, trace_bytes, ops, exports });
    }
    Ok(sources)
}

impl Plan<'_> {
    fn llama_args(&self) -> Vec<String> {
        let (c, n) = (self.context.to_string(), self.tokens.to_string());
        ["-c", &c, "-n", &n, "-t", "2", "--ignore-eos", "-no-cnv"].map(String::from).to_vec()
    }

    fn describe(&self) -> String {
        let run = std::iter::once("ttrace run").chain(self.run_opts.iter().copied()).collect::<Vec<_>>().join(" ");
        let model = self.model.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let capture = if self.run_opts.is_empty() { " (graph capture, the default)" } else { "" };
        format!("`{run}`{capture} of llama-completion on `{model}`, `{}`", self.llama_args().join(" "))
    }

    fn record(&self, ctx: &Ctx, trace: &Path) -> Result<()> {
        let out = Command::new(&ctx.ttrace)
            .arg("run")
            .args(self.run_opts)
            .arg("-o")
            .arg(trace)
            .arg("--")
            .arg(&ctx.paths.llama.completion)
            .arg("-m")
            .arg(self.model)
            .args(["-p", self.prompt])
            .args(self.llama_args())
            .stdout(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!("tracing the export source failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

fn report_ops(ctx: &Ctx, trace: &Path) -> Result<u64> {
    let json = crate::shell::output(Command::new(&ctx.ttrace).arg("report").arg("--json").arg(trace))?;
    let report: Value = serde_json::from_str(&json)?;
    report["ops"].as_u64().context("`ttrace report --json` has no `ops`")
}

/// [`RUNS`] interleaved runs of each format: wall time of the whole
/// `ttrace export` process, peak RSS from `/usr/bin/time -v` where it exists.
///
/// Each format first writes its output once untimed; the timed runs rewrite
/// it in place, each after a `sync`. What a run then costs is the export's
/// own work, not two kernel costs that vary by seconds with the machine's
/// history. Outputs kept side by side (3.5 GB for Gemma) take fresh
/// page-cache pages: `perf` showed the copy into them
/// (`copy_folio_from_iter_atomic`) dominating, tokens-json at 3 s instead
/// of 1.5 (a VM whose host backs guest pages on first touch, presumably).
/// Outputs deleted between runs make ext4 without a journal (this root)
/// create files within minutes of deleting thousands, when its inode
/// allocator skips each recently deleted inode: `perf` showed
/// `find_inode_bit`/`recently_deleted`, seconds of kernel time per run.
fn time_exports(ctx: &Ctx, trace: &Path, key: &str, formats: &[&'static str]) -> Result<Vec<Export>> {
    let mut results: Vec<Export> = formats
        .iter()
        .map(|&format| Export { format, events: 0, secs: Vec::new(), max_rss_kb: None, out_bytes: 0 })
        .collect();
    let dest = |format: &str| ctx.out_dir.join(format!("export-{key}.{format}"));
    let time_v = Path::new("/usr/bin/time").exists();
    for run in 0..=RUNS {
        for r in &mut results {
            let dest = dest(r.format);
            sync()?;
            let mut cmd = if time_v {
                let mut c = Command::new("/usr/bin/time");
                c.arg("-v").arg(&ctx.ttrace);
                c
            } else {
                Command::new(&ctx.ttrace)
            };
            cmd.args(["export", "--format", r.format, "-o"]).arg(&dest).arg(trace);
            let start = Instant::now();
            let out = cmd.stdout(Stdio::null()).output()?;
            let secs = start.elapsed().as_secs_f64();
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                bail!("export {} failed: {err}", r.format);
            }
            if run == 0 {
                continue;
            }
            // `ttrace: wrote … (N events, M items) in …`
            r.events = err
                .split_once(" events, ")
                .and_then(|(h, _)| h.rsplit('(').next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(r.events);
            r.max_rss_kb = err
                .lines()
                .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
                .and_then(|v| v.trim().parse().ok())
                .or(r.max_rss_kb);
            r.secs.push(secs);
            r.out_bytes = bytes_under(&dest)?;
        }
    }
    formats.iter().try_for_each(|f| remove(&dest(f)))?;
    Ok(results)
}

fn sync() -> Result<()> {
    crate::shell::run(&mut Command::new("sync"))
}

fn remove(path: &PathBuf) -> Result<()> {
    let removed = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// A file's size, or a directory's files' sizes added up.
fn bytes_under(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        total += bytes_under(&entry?.path())?;
    }
    Ok(total)
}

pub fn csv(sources: &[Source], csv: &mut String) -> Result<()> {
    for s in sources {
        writeln!(csv, "export_ops,{},,{}", s.key, s.ops)?;
        writeln!(csv, "export_trace_bytes,{},,{}", s.key, s.trace_bytes)?;
        for e in &s.exports {
            let key = format!("{}:{}", s.key, e.format);
            for (i, secs) in e.secs.iter().enumerate() {
                writeln!(csv, "export_secs,{key},{},{secs}", i + 1)?;
            }
            writeln!(csv, "export_events,{key},,{}", e.events)?;
            writeln!(csv, "export_output_bytes,{key},,{}", e.out_bytes)?;
        }
    }
    Ok(())
}

pub fn section(md: &mut String, sources: &[Source]) -> Result<()> {
    writeln!(md, "## Export speed\n")?;
    writeln!(
        md,
        "Median of {RUNS} interleaved runs per format; wall time of the whole `ttrace export` process (its first pass \
         over the trace included). Each format writes its output once untimed, then the timed runs rewrite it \
         in place, each after a `sync` (see `xtask/src/bench/export.rs`: fresh page-cache pages of this VM and \
         ext4 inode allocation after mass deletes otherwise vary a run by seconds).\n"
    )?;
    for s in sources {
        let gemma = s.key == "gemma";
        writeln!(md, "### {}\n", if gemma { "Gemma, graph capture" } else { "tiny, one record per worker thread" })?;
        let events = s.exports.first().map_or(0, |e| e.events);
        writeln!(md, "Source: {}; {} ops, {events} events, trace {} bytes.\n", s.what, s.ops, s.trace_bytes)?;
        writeln!(md, "| format | median s | min–max s | events/s | ops/s | output bytes | bytes per op | peak RSS |")?;
        writeln!(md, "|---|---|---|---|---|---|---|---|")?;
        for e in &s.exports {
            let m = e.median_secs();
            let (lo, hi) = min_max(&e.secs);
            let rss = e.max_rss_kb.map_or("?".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
            writeln!(
                md,
                "| {} | {m:.3} | {lo:.3}–{hi:.3} | {:.0} | {:.0} | {} | {:.1} | {rss} |",
                e.format,
                e.events as f64 / m,
                s.ops as f64 / m,
                e.out_bytes,
                e.out_bytes as f64 / s.ops.max(1) as f64
            )?;
        }
        writeln!(md)?;
        goals(md, s)?;
    }
    Ok(())
}

fn goals(md: &mut String, s: &Source) -> Result<()> {
    let by = |format: &str| s.exports.iter().find(|e| e.format == format);
    if s.key == "gemma" {
        if let Some(e) = by("tokens-json") {
            let rate = s.ops as f64 / e.median_secs();
            writeln!(md, "- Goal tokens-json ≥ 250,000 ops/s: {} ({rate:.0})", met(rate >= TOKENS_JSON_OPS_PER_S))?;
        }
        if let Some(e) = by("jsonl") {
            writeln!(md, "- jsonl of the same trace: {:.0} ops/s", s.ops as f64 / e.median_secs())?;
        }
        if let Some(e) = by("perfetto") {
            let per_op = e.out_bytes as f64 / s.ops.max(1) as f64;
            writeln!(md, "- Goal Perfetto ≤ 30 bytes per op: {} ({per_op:.1})", met(per_op <= PERFETTO_BYTES_PER_OP))?;
        }
    } else {
        let rows = ["jsonl", "csv", "parquet"].iter().filter_map(|f| by(f));
        let slowest = rows.map(|e| e.events as f64 / e.median_secs()).fold(f64::INFINITY, f64::min);
        let note = if s.exports.first().map_or(0, |e| e.events) < 1_000_000 {
            " Below the 1 M events the method asks for (quick run)."
        } else {
            ""
        };
        writeln!(
            md,
            "- Goal ≥ 2,000,000 events/s for jsonl/csv/parquet: {} (slowest {slowest:.0}).{note}",
            met(slowest >= ROWS_PER_S)
        )?;
    }
    writeln!(md)?;
    Ok(())
}
