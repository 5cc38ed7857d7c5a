//! `ttrace report FILE`: the summary a researcher reads first (`--json` for
//! scripts: per-ubatch phases, token ids and weight tensors read).

use std::path::Path;

use anyhow::{Context, Result};

use super::summary;
use crate::{
    cli::ReportArgs,
    correlate,
    record::{TraceReader, WriterStats},
};

pub fn run(args: ReportArgs) -> Result<()> {
    let analysis = analyze(&args.file)?;
    if args.json {
        serde_json::to_writer_pretty(std::io::stdout().lock(), &analysis)?;
        println!();
    } else {
        print!("{}", summary::render(&analysis, &args.file.display().to_string(), None));
    }
    Ok(())
}

pub fn analyze(path: &Path) -> Result<correlate::Analysis> {
    let reader = TraceReader::open(path)?;
    correlate::analyze(reader).with_context(|| format!("reading {}", path.display()))
}

/// After tracing: the summary of what was written, read back from the file.
pub fn print_summary(path: &Path, stats: Option<&WriterStats>) -> Result<()> {
    let analysis = analyze(path)?;
    eprint!("{}", summary::render(&analysis, &path.display().to_string(), stats));
    Ok(())
}
