//! The sweep dataset: each run of `ttrace sweep` appended as Parquet files in
//! hive layout, `DIR/dataset/table=<t>/model=<m>/run_id=<r>/part-0.parquet`,
//! which DuckDB (`read_parquet(..., hive_partitioning = true)`) and Spark
//! (`spark.read.parquet(DIR/dataset/table=runs)`) read as they are. The
//! schema is [`schema`]; the rows come from the analysis ([`build`]).
//!
//! A run's files are written under hidden names (Spark and the `*.parquet`
//! globs skip them) and renamed into place; [`remove_run`] deletes whatever
//! a run interrupted before it was marked done left behind, so a resumed
//! sweep neither loses nor duplicates rows.

mod build;
pub mod schema;
mod table;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use self::schema::{TABLES, Table};
use super::ExportError;
use crate::analyze::{Analysis, stats::Stats};

/// A run's parameters, as the plan set them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Params {
    pub model_path: String,
    pub domain: String,
    pub prompt: String,
    pub threads: u32,
    pub mem_limit_bytes: Option<u64>,
    /// `cold` or `warm`.
    pub cache: String,
    pub repeat: u32,
    pub n_predict: u32,
    pub command: Vec<String>,
    /// llama-server runs: concurrent clients.
    #[serde(default)]
    pub clients: Option<u32>,
}

/// llama.cpp's own `common_perf_print` figures, when it printed them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LlamaCounters {
    pub load_ms: Option<f64>,
    pub prompt_tokens: Option<u64>,
    pub prompt_ms: Option<f64>,
    pub eval_runs: Option<u64>,
    pub eval_ms: Option<f64>,
}

/// One run as the sweep records it (also its `runs/<id>.json` record).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    /// The `model=` partition value.
    pub model: String,
    pub params: Params,
    pub host: String,
    pub started_unix_ms: u64,
    /// The trace, relative to the sweep directory.
    pub trace: String,
    pub llama: LlamaCounters,
    pub cgroup_peak_bytes: Option<u64>,
    pub cgroup_limit_hits: Option<u64>,
    /// `Some`: the run failed, and why.
    pub error: Option<String>,
    /// What appending it to the dataset wrote, and how long that took
    /// (reading the trace back, analysing it, writing the files).
    #[serde(default)]
    pub appended: Option<Appended>,
    /// llama-server runs: what the server answered each client.
    #[serde(default)]
    pub served: Vec<Served>,
}

/// One `/completion` as llama-server reported it (`id_slot`, `timings`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Served {
    pub slot: Option<i64>,
    pub prompt_n: Option<u64>,
    pub predicted_n: Option<u64>,
}

/// What appending one run wrote.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Appended {
    pub ms: f64,
    pub files: u64,
    pub rows: u64,
    pub bytes: u64,
}

/// A partition value: path-safe, never `=` or `/`.
pub fn partition_value(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

fn run_dir(dataset: &Path, table: Table, info: &RunInfo) -> PathBuf {
    dataset
        .join(format!("table={}", table.name()))
        .join(format!("model={}", partition_value(&info.model)))
        .join(format!("run_id={}", info.run_id))
}

/// Removes every file of `info`'s run from `dataset` (a run cut short).
pub fn remove_run(dataset: &Path, info: &RunInfo) -> Result<(), ExportError> {
    for table in TABLES {
        let dir = run_dir(dataset, table, info);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ExportError::write(&dir)(e)),
        }
    }
    Ok(())
}

/// Appends one run to the dataset under `dataset`: a failed run only its
/// `runs` row; a traced one every table (`ops` with `with_ops`).
pub fn write_run(
    dataset: &Path,
    info: &RunInfo,
    traced: Option<(&Path, &Analysis, &Stats)>,
    with_ops: bool,
) -> Result<Appended, ExportError> {
    remove_run(dataset, info)?;
    let mut out = Appended::default();
    let mut put = |rows: table::TableRows| -> Result<(), ExportError> {
        let n = place(dataset, rows.table, info, |tmp| rows.write(tmp))?;
        out.files += 1;
        out.rows += n.0;
        out.bytes += n.1;
        Ok(())
    };
    put(build::runs(info, traced.map(|(_, a, s)| (a, s)))?)?;
    let Some((trace, a, stats)) = traced else { return Ok(out) };
    put(build::ubatches(stats)?)?;
    put(build::tokens(a)?)?;
    put(build::tensors(stats)?)?;
    put(build::routing(a)?)?;
    put(build::io(trace, a)?)?;
    if with_ops {
        let n = place(dataset, Table::Ops, info, |tmp| {
            super::parquet::write(trace, a, tmp, &indicatif::ProgressBar::hidden()).map(|w| w.items)
        })?;
        out.files += 1;
        out.rows += n.0;
        out.bytes += n.1;
    }
    Ok(out)
}

/// Writes through `write` to a hidden name, then renames it to
/// `part-0.parquet`: rows and file size.
fn place(
    dataset: &Path,
    table: Table,
    info: &RunInfo,
    write: impl FnOnce(&Path) -> Result<u64, ExportError>,
) -> Result<(u64, u64), ExportError> {
    let dir = run_dir(dataset, table, info);
    std::fs::create_dir_all(&dir).map_err(ExportError::write(&dir))?;
    let tmp = dir.join(".part-0.parquet.tmp");
    let rows = write(&tmp)?;
    let file = std::fs::File::open(&tmp).map_err(ExportError::write(&tmp))?;
    file.sync_all().map_err(ExportError::write(&tmp))?;
    let bytes = file.metadata().map_err(ExportError::write(&tmp))?.len();
    let part = dir.join("part-0.parquet");
    std::fs::rename(&tmp, &part).map_err(ExportError::write(&part))?;
    Ok((rows, bytes))
}
