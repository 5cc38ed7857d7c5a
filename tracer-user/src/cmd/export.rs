//! `ttrace export FILE --format F -o OUT`: a trace as files other tools open
//! (see `export` for the formats and their schemas).

use std::time::Instant;

use anyhow::{Context, Result};

use crate::{cli::ExportArgs, export};

pub fn run(args: ExportArgs) -> Result<()> {
    let started = Instant::now();
    let analysis =
        export::analyze_for(args.format, &args.file).with_context(|| format!("reading {}", args.file.display()))?;
    super::report::warn_if_partial(&args.file, &analysis);
    let options = export::Options { ubatch: args.ubatch };
    let written = export::export(&args.file, &analysis, args.format, &args.output, &options)
        .with_context(|| format!("exporting {} as {:?}", args.file.display(), args.format))?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "ttrace: wrote {} ({} events, {} items) in {secs:.2} s ({:.0} events/s)",
        args.output.display(),
        written.events,
        written.items,
        written.events as f64 / secs.max(1e-9)
    );
    Ok(())
}
