//! Stage 6, export: a trace as files other tools open. Each format is its own
//! module; all share [`walk`], a second streaming pass over the trace after
//! `correlate::analyze` (for the row formats the lighter [`phases::scan`]) has
//! settled ubatches and phases, so memory stays bounded by the interning
//! tables and per-ubatch summaries.
//!
//! | format        | module        | output                                        |
//! |---------------|---------------|-----------------------------------------------|
//! | `perfetto`    | [`perfetto`]  | native protobuf trace (`.pftrace`)            |
//! | `chrome-json` | [`chrome`]    | Trace Event Format JSON                       |
//! | `jsonl`/`csv` | [`rows`]      | one row per event, schema in [`rows`]         |
//! | `parquet`     | [`parquet`]   | the same rows as Parquet                      |
//! | `tokens-json` | [`tokens`]    | the thesis web UI's directory, per token      |
//! | `dot`         | [`dot`]       | one ubatch's executed graph (Graphviz)        |
//! | html report   | [`html`]      | `ttrace report --html`: one self-contained page|
//! | `blkparse`    | [`blkparse`]  | block requests as blkparse text, with tensors |
//! | `mbolt`       | [`mbolt`]     | MoE routing as mbolt's MBLT v1 routing log    |

pub mod blkparse;
pub mod buckets;
pub mod buffers;
pub mod chrome;
pub mod columns;
pub mod dataset;
pub mod diff;
pub mod dot;
pub mod html;
mod json_bytes;
pub mod mbolt;
pub mod parquet;
pub mod perfetto;
mod research;
pub mod rows;
pub mod shape;
pub mod simulate_svg;
pub mod summary;
pub mod sweep_html;
mod text;
pub mod tokens;
pub mod ubatch_weights;
mod values_jsonl;

use std::{io, path::Path};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{
    analyze::Analysis,
    format::{TraceError, TraceReader},
};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("writing {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("writing Parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error("{0}")]
    Invalid(String),
}

impl ExportError {
    pub fn write(path: &Path) -> impl FnOnce(io::Error) -> ExportError + '_ {
        move |source| ExportError::Write { path: path.display().to_string(), source }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Perfetto protobuf (`.pftrace`) for ui.perfetto.dev.
    Perfetto,
    /// Chrome Trace Event Format JSON (small traces; chrome://tracing, Perfetto).
    ChromeJson,
    /// One JSON object per event and line.
    Jsonl,
    /// One row per event, with a header line.
    Csv,
    /// The CSV/JSONL rows as Parquet (pandas, polars, DuckDB).
    Parquet,
    /// A directory the thesis web UI opens: `traces/` and `graphs/token-00000.json`, … per
    /// generated token, `memory-map.json`.
    TokensJson,
    /// The executed graph of one ubatch (`--ubatch K`) as Graphviz.
    Dot,
    /// Block requests on the model files as blkparse text, each line followed
    /// by ` tensor=… file_off=… ubatch=… layer=…`.
    Blkparse,
    /// MoE routing as mbolt's MBLT v1 routing log (`mbolt-sim cluster trace.mblt -o perms.json`).
    Mbolt,
    /// Node output fingerprints (`run --values`), one JSON object per line.
    ValuesJsonl,
}

/// What an export wrote, for the command's message.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    pub events: u64,
    /// Rows, files, nodes or packets, per format.
    pub items: u64,
}

pub struct Options {
    /// `dot`: which ubatch.
    pub ubatch: Option<u32>,
}

/// The first pass `format` needs: the row formats read phases, which
/// [`phases::scan`] finds at a fraction of `correlate::analyze`'s cost, and
/// MoE routing where there is some ([`phases::for_rows`]).
pub fn analyze_for(format: Format, trace: &Path) -> Result<Analysis, TraceError> {
    match format {
        Format::Jsonl | Format::Csv | Format::Parquet => crate::analyze::phases::for_rows(trace),
        _ => crate::analyze::analyze(TraceReader::open(trace)?),
    }
}

pub fn export(
    trace: &Path,
    analysis: &Analysis,
    format: Format,
    out: &Path,
    options: &Options,
) -> Result<Written, ExportError> {
    let progress = progress_bar(crate::analyze::walk::event_total(analysis), "exporting");
    let written = match format {
        Format::Perfetto => perfetto::write(trace, analysis, out, &progress),
        Format::ChromeJson => chrome::write(trace, analysis, out, &progress),
        Format::Jsonl => rows::write(trace, analysis, out, rows::Text::Jsonl, &progress),
        Format::Csv => rows::write(trace, analysis, out, rows::Text::Csv, &progress),
        Format::Parquet => parquet::write(trace, analysis, out, &progress),
        Format::TokensJson => tokens::write(trace, analysis, out, &progress),
        Format::Dot => dot::write(trace, analysis, out, options.ubatch, &progress),
        Format::Blkparse => blkparse::write(trace, out),
        Format::Mbolt => mbolt::write(analysis, out),
        Format::ValuesJsonl => values_jsonl::write(trace, analysis, out),
    };
    progress.finish_and_clear();
    written
}

/// A bar on stderr for traces big enough to wait for; hidden otherwise and
/// when stderr is not a terminal.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if total < 200_000 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg} [{bar:40}] {human_pos}/{human_len} events ({per_sec}, {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}
