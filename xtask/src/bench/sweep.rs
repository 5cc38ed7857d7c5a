//! `ttrace sweep`'s dataset: its size per million ops (without and with the
//! `--ops` table) and the time to append a run (read the trace back, analyse
//! it, write its Parquet files), from the runs' own records. Gemma with a
//! warm cache and no memory limit, 64 tokens per run.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, median, min_max, simulate::ops_of};

const RUNS: u32 = 3;
const TOKENS: u32 = 64;

pub struct AppendSample {
    pub ops_table: bool,
    pub run: u32,
    pub ops: u64,
    pub bytes: u64,
    pub rows: u64,
    pub ms: f64,
}

pub struct SweepBench {
    pub samples: Vec<AppendSample>,
    /// The `--ops` sweep's bytes per table (all runs), largest first.
    pub tables: Vec<(String, u64)>,
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<SweepBench> {
    let mut samples = Vec::new();
    let mut tables = Vec::new();
    for ops_table in [false, true] {
        let dir = ctx.out_dir.join(if ops_table { "sweep-ops" } else { "sweep" });
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let plan = dir.with_extension("toml");
        std::fs::write(&plan, plan_text(ctx, model))?;
        let mut cmd = Command::new(&ctx.ttrace);
        cmd.arg("sweep").arg(&plan).arg("-o").arg(&dir).env("LD_PRELOAD", &ctx.flushlog).stdout(Stdio::null());
        if ops_table {
            cmd.arg("--ops");
        }
        let status = cmd.status().context("running ttrace sweep")?;
        if !status.success() {
            bail!("ttrace sweep failed ({status})");
        }
        for (run, record) in records(&dir)?.iter().enumerate() {
            let appended = &record["appended"];
            let trace = dir.join(record["trace"].as_str().context("record without trace")?);
            samples.push(AppendSample {
                ops_table,
                run: run as u32,
                ops: ops_of(ctx, &trace)?,
                bytes: appended["bytes"].as_u64().context("record without appended bytes")?,
                rows: appended["rows"].as_u64().unwrap_or(0),
                ms: appended["ms"].as_f64().context("record without append time")?,
            });
        }
        if ops_table {
            tables = table_bytes(&dir.join("dataset"))?;
        }
    }
    Ok(SweepBench { samples, tables })
}

/// Bytes of each `table=T` directory's Parquet files.
fn table_bytes(dataset: &Path) -> Result<Vec<(String, u64)>> {
    fn size(dir: &Path) -> Result<u64> {
        let mut total = 0;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            total += if path.is_dir() { size(&path)? } else { std::fs::metadata(&path)?.len() };
        }
        Ok(total)
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dataset)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().trim_start_matches("table=").to_string());
        out.push((name.unwrap_or_default(), size(&path)?));
    }
    out.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    Ok(out)
}

fn plan_text(ctx: &Ctx, model: &Path) -> String {
    let program = &ctx.paths.llama.completion;
    format!(
        "models = [\"{}\"]\nthreads = [2]\nrepeats = {RUNS}\nn_predict = {TOKENS}\nctx = 512\ncache = \"warm\"\n\
         [command]\nprogram = \"{}\"\nargs = [\"--ignore-eos\"]\n\
         [[prompts]]\ndomain = \"history\"\ntext = \"The history of the printing press\"\n",
        model.display(),
        program.display()
    )
}

fn records(dir: &Path) -> Result<Vec<serde_json::Value>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Ok(serde_json::from_str(&std::fs::read_to_string(p)?)?)).collect()
}

pub fn section(md: &mut String, bench: &SweepBench) -> Result<()> {
    use std::fmt::Write as _;
    let samples = &bench.samples;
    writeln!(md, "## Sweep dataset size and append time\n")?;
    writeln!(
        md,
        "`ttrace sweep` of Gemma 3 270M, warm cache, no memory limit, {TOKENS} tokens per run, {RUNS} runs, once \
         without and once with `--ops`. Bytes are the run's Parquet files (every table); the append time is \
         reading its trace back, analysing it and writing and renaming those files, from the run's record \
         (`runs/<id>.json` `appended`).\n"
    )?;
    writeln!(
        md,
        "| tables | ops per run | rows per run | dataset bytes per million ops | append time per run (median, min–max) |"
    )?;
    writeln!(md, "|---|---|---|---|---|")?;
    for ops_table in [false, true] {
        let s: Vec<&AppendSample> = samples.iter().filter(|s| s.ops_table == ops_table).collect();
        if s.is_empty() {
            continue;
        }
        let per_mop: Vec<f64> = s.iter().map(|s| s.bytes as f64 / (s.ops as f64 / 1e6)).collect();
        let ms: Vec<f64> = s.iter().map(|s| s.ms).collect();
        let (lo, hi) = min_max(&ms);
        writeln!(
            md,
            "| {} | {:.0} | {:.0} | {:.0} kB | {:.2} s ({:.2}–{:.2} s) |",
            if ops_table { "all, with `ops`" } else { "all but `ops`" },
            median(&s.iter().map(|s| s.ops as f64).collect::<Vec<_>>()),
            median(&s.iter().map(|s| s.rows as f64).collect::<Vec<_>>()),
            median(&per_mop) / 1e3,
            median(&ms) / 1e3,
            lo / 1e3,
            hi / 1e3
        )?;
    }
    let total: u64 = bench.tables.iter().map(|(_, b)| b).sum();
    let shares: Vec<String> = bench
        .tables
        .iter()
        .map(|(t, b)| {
            format!("`{t}` {:.0} kB ({:.0} %)", *b as f64 / RUNS as f64 / 1e3, 100.0 * *b as f64 / total.max(1) as f64)
        })
        .collect();
    writeln!(md, "\nPer run and table, with `--ops`: {}.\n", shares.join(", "))?;
    Ok(())
}

pub fn csv(csv: &mut String, bench: &SweepBench) -> Result<()> {
    use std::fmt::Write as _;
    for (table, bytes) in &bench.tables {
        writeln!(csv, "sweep_table_bytes,{table},0,{bytes}")?;
    }
    for s in &bench.samples {
        let key = if s.ops_table { "with_ops" } else { "without_ops" };
        writeln!(csv, "sweep_bytes_per_mop,{key},{},{}", s.run, s.bytes as f64 / (s.ops as f64 / 1e6))?;
        writeln!(csv, "sweep_append_ms,{key},{},{}", s.run, s.ms)?;
    }
    Ok(())
}
