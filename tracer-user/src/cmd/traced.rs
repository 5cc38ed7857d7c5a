//! After `run`, `attach` and `top -o`: the summary of the trace written.

use std::path::Path;

use anyhow::{Context, Result};

use super::report::read_analysis;
use crate::{
    analyze::summary::{Summary, Unread},
    export::summary,
    format::TraceReader,
    live::session::{Outcome, trace_file},
};

/// Above this many ops, the summary after tracing is made from what the
/// recorder knew, not read back: reading back takes about half a second
/// per million ops, and memory that grows with the trace (a run of a day's
/// serving would wait a quarter of an hour at its end).
const READ_BACK_MAX_OPS: u64 = 5_000_000;

/// `TTRACE_TEST_READ_BACK_MAX_OPS=N`, for tests: a short run takes the
/// long run's path.
const READ_BACK_MAX_OPS_ENV: &str = "TTRACE_TEST_READ_BACK_MAX_OPS";

fn read_back_max_ops() -> u64 {
    std::env::var(READ_BACK_MAX_OPS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(READ_BACK_MAX_OPS)
}

/// After tracing: the summary of what was written, read back from the file
/// (for a long run, or one written to /dev/null, from the recorder's
/// counts, header and trailer).
pub fn print_summary(path: &Path, outcome: &Outcome) -> Result<()> {
    let name = path.display().to_string();
    let (stats, trailer, lost) = (&outcome.stats, &outcome.trailer, outcome.lost);
    let summary = if trace_file::is_discard(path) {
        Summary::recorded(&outcome.header, trailer, lost, &name, stats, Unread::Discarded)
    } else if stats.executed_ops().is_none_or(|ops| ops > read_back_max_ops()) {
        // The file's header: a ring's says which of its files are kept.
        let reader = TraceReader::open(path).with_context(|| format!("reading {name}"))?;
        Summary::recorded(reader.header(), trailer, lost, &name, stats, Unread::LongRun)
    } else {
        Summary::new(&read_analysis(path)?, &name, Some(&outcome.stats))
    };
    eprint!("{}", summary::render(&summary));
    Ok(())
}
