//! `ttrace report FILE`: the summary a researcher reads first (`--json` for
//! scripts: the analysis — per-ubatch phases, token ids and weight tensors
//! read — plus `summary`, the overview as data, and `stats`: per token,
//! phase, layer, component and tensor;
//! `--html` for a page to look at).

use std::{io::Write, path::Path};

use crate::{
    analyze::{
        self, Analysis,
        report::Document,
        simulate::curve::{self, Curve, Request},
        summary::Summary,
    },
    cli::ReportArgs,
    export::{self, summary},
    format::TraceReader,
};
use anyhow::{Context, Result};

pub fn run(args: ReportArgs) -> Result<()> {
    let analysis = read_analysis(&args.file)?;
    let progress = export::progress_bar(analyze::walk::event_total(&analysis), "summarising");
    let stats = analyze::stats::collect(&args.file, &analysis, &progress)
        .with_context(|| format!("reading {}", args.file.display()))?;
    progress.finish_and_clear();
    let path = args.file.display().to_string();
    let overview = Summary::new(&analysis, &path, None);
    let text = summary::render(&overview);
    if let Some(html) = &args.html {
        let mut pairs = vec![(String::new(), overview.title())];
        pairs.extend(overview.rows().into_iter().map(|(k, v)| (k.to_string(), v)));
        pairs.push(("details".into(), summary::render_details(&analysis, &stats)));
        let curve = simulated(&args.file, &analysis);
        export::html::write(&analysis, &stats, &pairs, &curve, html)
            .with_context(|| format!("writing the HTML report {}", html.display()))?;
        eprintln!("ttrace: wrote {}", html.display());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &Document { analysis: &analysis, summary: &overview, stats: &stats })
            .map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write!(out, "{text}{}", summary::render_details(&analysis, &stats))?;
        if analysis.header.options.values {
            let rows = analyze::values::read(&args.file, &analysis)
                .with_context(|| format!("reading {}", args.file.display()))?;
            write!(out, "{}", values_section(&rows))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The miss-ratio curve at `ttrace simulate`'s defaults, for the HTML
/// report; why not, as the section's text, when the trace has none.
fn simulated(path: &Path, analysis: &Analysis) -> Result<Curve, String> {
    let progress = export::progress_bar(analyze::walk::event_total(analysis), "simulating");
    let curve = curve::compute(path, analysis, &Request::defaults(), &progress, &indicatif::ProgressBar::hidden());
    progress.finish_and_clear();
    curve.map_err(|e| e.to_string())
}

/// `--values` traces: how many outputs were fingerprinted, why the others
/// were not, and the first NaN or Inf.
fn values_section(rows: &[analyze::values::ValueRow]) -> String {
    let done = rows.iter().filter(|r| r.fingerprint.is_some()).count();
    let mut s = format!("\nnode values: {done} outputs fingerprinted");
    for (why, n) in analyze::values::unfingerprinted(rows) {
        s += &format!(", {n} {why}");
    }
    s += "\n";
    s += &match analyze::values::first_non_finite(rows) {
        None => "  first NaN/Inf: none\n".to_string(),
        Some(r) => format!(
            "  first NaN/Inf: token {} (ubatch {}), layer {}, node {} ({})\n",
            r.token_index.map_or("prompt".to_string(), |t| t.to_string()),
            r.ubatch.map_or("-".to_string(), |u| u.to_string()),
            r.layer.map_or("-".to_string(), |l| l.to_string()),
            r.name,
            r.op
        ),
    };
    s
}

/// A ring whose oldest files are gone: every figure covers the files read
/// only, which those that print no summary say here.
pub fn warn_if_partial(path: &Path, analysis: &Analysis) {
    if let Some(ring) = analysis.header.ring_read.as_ref().filter(|r| r.missing.is_some()) {
        eprintln!("ttrace: warning: {}: {ring}", path.display());
    }
}

pub fn read_analysis(path: &Path) -> Result<Analysis> {
    let reader = TraceReader::open(path).with_context(|| format!("reading {}", path.display()))?;
    analyze::analyze(reader).with_context(|| format!("reading {}", path.display()))
}
