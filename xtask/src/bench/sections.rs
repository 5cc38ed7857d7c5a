//! The bench's parts. Each is measured on its own and renders its own `## `
//! sections of docs/BENCHMARKS.md and its own rows of docs/benchmarks.csv, so
//! `cargo xtask bench --only PART` measures some parts and puts their
//! sections and rows in place of the old ones, leaving the rest.

use std::{fmt, path::Path};

use anyhow::{Context, Result};

use super::{Ctx, attach, export, longrun, overhead, parts, programs, server, simulate, sweep, values, viewer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Inference overhead (A/B/C/D) and the trace size of its last B run.
    Overhead,
    /// Overhead on node-llama-cpp and Debian's packaged llama-completion (A/B).
    Programs,
    /// Ring-buffer ingest throughput (`tracer-user/benches/ingest.rs`).
    Ingest,
    /// Export speed and size: tiny --all-threads and a 1,500-token Gemma trace.
    Export,
    /// BPF program counters and perf stat of one traced run.
    Profile,
    /// llama-server under concurrent clients.
    Server,
    /// `ttrace top --json` on llama-server under concurrent clients.
    Top,
    /// `ttrace attach` to its first recorded op.
    Attach,
    /// `ttrace view` on a ≥ 10 M-op trace: ready time, RSS, query times, first paint and frames.
    Viewer,
    /// `ttrace run --values` (and with `--values-filter`) against untraced on Gemma.
    Values,
    /// `ttrace simulate` on the viewer's ≥ 10 M-op trace.
    Simulate,
    /// `ttrace sweep`: dataset bytes per million ops, time to append a run.
    Sweep,
    /// A ≥ 100 M-op trace: recording RSS at 1 M/10 M/100 M ops; report, simulate, export on it.
    LongRun,
}

impl Part {
    /// In the order of the full document.
    pub const ALL: [Part; 13] = [
        Part::Overhead,
        Part::Programs,
        Part::Ingest,
        Part::Export,
        Part::Profile,
        Part::Server,
        Part::Top,
        Part::Attach,
        Part::Viewer,
        Part::Values,
        Part::Simulate,
        Part::Sweep,
        Part::LongRun,
    ];

    /// How its `## ` headings start (the rest may hold figures).
    pub fn headings(self) -> &'static [&'static str] {
        match self {
            Part::Overhead => &["Inference overhead", "Trace size"],
            Part::Programs => &["Overhead on installed programs"],
            Part::Ingest => &["Ingest throughput"],
            Part::Export => &["Export speed"],
            Part::Profile => &["Profile of a traced run"],
            Part::Server => &["llama-server under"],
            Part::Top => &["`ttrace top` overhead"],
            Part::Attach => &["Attach latency"],
            Part::Viewer => &["Viewer"],
            Part::Values => &["Values mode overhead"],
            Part::Simulate => &["Simulate speed"],
            Part::Sweep => &["Sweep dataset"],
            Part::LongRun => &["A day of serving"],
        }
    }

    /// How the `part` column of its CSV rows starts.
    pub fn csv_parts(self) -> &'static [&'static str] {
        match self {
            Part::Overhead => &["overhead_", "size_"],
            Part::Programs => &["programs_"],
            Part::Ingest => &["ingest_"],
            Part::Export => &["export_"],
            Part::Profile => &["profile_"],
            Part::Server => &["server_"],
            Part::Top => &["top_"],
            Part::Attach => &["attach_"],
            Part::Viewer => &["viewer_"],
            Part::Values => &["values_"],
            Part::Simulate => &["simulate_"],
            Part::Sweep => &["sweep_"],
            Part::LongRun => &["longrun_"],
        }
    }

    pub fn measure(self, ctx: &Ctx, model: &Path) -> Result<Measured> {
        Ok(match self {
            Part::Overhead => {
                let samples = overhead::run(ctx, model)?;
                let summary = samples
                    .iter()
                    .rev()
                    .find_map(|s| (s.variant == "B" && s.threads == 2).then(|| s.summary.clone()).flatten());
                let trace = ctx.out_dir.join("overhead-B.data");
                let size = summary.as_deref().map(|s| parts::size(ctx, s, &trace)).transpose()?;
                Measured::Overhead(samples, size)
            }
            Part::Programs => Measured::Programs(programs::run(ctx)?),
            Part::Ingest => Measured::Ingest(parts::ingest(ctx)?),
            Part::Export => Measured::Export(export::run(ctx)?),
            Part::Profile => Measured::Profile(parts::profile(ctx, model)?),
            Part::Server => Measured::Server(server::run(ctx, model, "B")?),
            Part::Top => Measured::Top(server::run(ctx, model, "C")?),
            Part::Attach => {
                let tiny = ctx.paths.models.get("tiny").context("set-up generated no `tiny` model")?;
                Measured::Attach(attach::run(ctx, tiny)?)
            }
            Part::Viewer => Measured::Viewer(viewer::run(ctx, model)?),
            Part::Values => Measured::Values(values::run(ctx, model)?),
            Part::Simulate => Measured::Simulate(simulate::run(ctx, model)?),
            Part::Sweep => Measured::Sweep(sweep::run(ctx, model)?),
            Part::LongRun => Measured::LongRun(longrun::run(ctx)?),
        })
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).map(|v| v.get_name().to_string());
        f.write_str(name.as_deref().unwrap_or("?"))
    }
}

/// What a part measured.
pub enum Measured {
    Overhead(Vec<overhead::Sample>, Option<parts::Size>),
    Programs(Vec<programs::Sample>),
    Ingest(parts::Ingest),
    Export(Vec<export::Source>),
    Profile(parts::Profile),
    Server(Vec<server::ServerSample>),
    Top(Vec<server::ServerSample>),
    Attach(Vec<attach::AttachSample>),
    Viewer(viewer::Viewer),
    Values(values::ValuesBench),
    Simulate(simulate::SimulateBench),
    Sweep(sweep::SweepBench),
    LongRun(longrun::LongRun),
}

impl Measured {
    pub fn markdown(&self, ctx: &Ctx, md: &mut String) -> Result<()> {
        match self {
            Measured::Overhead(samples, size) => {
                overhead::section(md, ctx, samples)?;
                parts::size_section(md, size.as_ref())
            }
            Measured::Ingest(ingest) => parts::ingest_section(md, ingest),
            Measured::Export(sources) => export::section(md, sources),
            Measured::Profile(profile) => parts::profile_section(md, ctx, profile),
            Measured::Server(served) => server::section(md, ctx, served),
            Measured::Top(served) => server::top_section(md, ctx, served),
            Measured::Attach(samples) => attach::section(md, samples),
            Measured::Viewer(v) => Ok(viewer::section(md, v)?),
            Measured::Values(bench) => values::section(md, ctx, bench),
            Measured::Programs(samples) => programs::section(md, ctx, samples),
            Measured::Simulate(b) => simulate::section(md, b),
            Measured::Sweep(s) => sweep::section(md, s),
            Measured::LongRun(b) => longrun::section(md, b),
        }
    }

    pub fn csv(&self, csv: &mut String) -> Result<()> {
        match self {
            Measured::Overhead(samples, size) => {
                overhead::csv(csv, samples)?;
                parts::size_csv(csv, size.as_ref())
            }
            Measured::Ingest(ingest) => parts::ingest_csv(csv, ingest),
            Measured::Export(sources) => export::csv(sources, csv),
            Measured::Profile(profile) => parts::profile_csv(csv, profile),
            Measured::Server(served) => server::csv(csv, served, "server"),
            Measured::Top(served) => server::csv(csv, served, "top"),
            Measured::Attach(samples) => attach::csv(csv, samples),
            Measured::Viewer(v) => Ok(viewer::csv(csv, v)?),
            Measured::Values(bench) => values::csv(csv, bench),
            Measured::Programs(samples) => programs::csv(csv, samples),
            Measured::Simulate(b) => simulate::csv(csv, b),
            Measured::Sweep(s) => sweep::csv(csv, s),
            Measured::LongRun(b) => longrun::csv(csv, b),
        }
    }
}

/// `doc` with each `## ` section of `new` in place of the section whose
/// heading starts the same way (one of `headings`); a section `doc` lacks is
/// appended. A section runs to the next `## ` heading.
pub fn splice(doc: &str, new: &str, headings: &[&str]) -> String {
    let mut sections = split(doc);
    for section in split(new).into_iter().filter(|s| s.starts_with("## ")) {
        let key = headings.iter().find(|h| section[3..].starts_with(**h));
        let old =
            key.and_then(|h| sections.iter().position(|s| s.strip_prefix("## ").is_some_and(|t| t.starts_with(h))));
        match old {
            Some(i) => sections[i] = section,
            None => sections.push(section),
        }
    }
    sections.concat()
}

/// The text before the first `## ` heading, then each section from its heading on.
fn split(doc: &str) -> Vec<String> {
    let mut sections = vec![String::new()];
    for line in doc.split_inclusive('\n') {
        if line.starts_with("## ") {
            sections.push(String::new());
        }
        if let Some(last) = sections.last_mut() {
            last.push_str(line);
        }
    }
    sections
}

/// `csv` (header first) without the rows of `parts`, then `rows`.
pub fn splice_csv(csv: &str, rows: &str, parts: &[&str]) -> String {
    let mut out = String::new();
    for (i, line) in csv.lines().enumerate() {
        if i == 0 || !parts.iter().any(|p| line.starts_with(p)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out + rows
}

/// `--only`: measure `parts`, and rewrite their sections of `md_path` and
/// rows of `csv_path`. Each section notes that it was measured alone.
pub fn rewrite(ctx: &Ctx, model: &Path, parts: &[Part], md_path: &Path, csv_path: &Path) -> Result<()> {
    let mut md = std::fs::read_to_string(md_path).unwrap_or_default();
    let mut csv = std::fs::read_to_string(csv_path).unwrap_or_else(|_| super::CSV_HEADER.to_string());
    for &part in parts {
        eprintln!("bench: {part}");
        let measured = part.measure(ctx, model).with_context(|| format!("bench part {part}"))?;
        let mut section = String::new();
        measured.markdown(ctx, &mut section)?;
        section.push_str(&format!(
            "_Measured alone by `cargo xtask bench --only {part}{}` on {}._\n\n",
            if ctx.quick { " --quick" } else { "" },
            super::now()
        ));
        md = splice(&md, &section, part.headings());
        let mut rows = String::new();
        measured.csv(&mut rows)?;
        csv = splice_csv(&csv, &rows, part.csv_parts());
    }
    std::fs::write(md_path, md)?;
    std::fs::write(csv_path, csv)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Benchmarks\n\nintro\n\n## Inference overhead\n\nold A\n\n### `-t 2`\n\nrows\n\n\
                       ## Export speed\n\nold export\n\n## Where the time goes\n\nanalysis\n";

    #[test]
    fn a_part_replaces_its_own_sections_only() {
        let new = "## Export speed\n\nnew export\n\n### Gemma\n\nfigures\n\n";
        let out = splice(DOC, new, Part::Export.headings());
        assert_eq!(out, DOC.replace("## Export speed\n\nold export\n\n", new));
        // A heading with figures in it is found by its start.
        let doc = format!("{DOC}## llama-server under 4 concurrent clients\n\nold\n");
        let out = splice(&doc, "## llama-server under 8 concurrent clients\n\nnew\n", Part::Server.headings());
        assert!(
            out.ends_with("## Where the time goes\n\nanalysis\n## llama-server under 8 concurrent clients\n\nnew\n")
        );
        // Sections the document lacks are appended; several per part.
        let out = splice("# B\n", "## Inference overhead\n\nx\n## Trace size\n\ny\n", Part::Overhead.headings());
        assert_eq!(out, "# B\n## Inference overhead\n\nx\n## Trace size\n\ny\n");
    }

    #[test]
    fn a_part_replaces_its_own_rows_only() {
        let csv = "part,key,round,value\noverhead_tokens_per_s,A-t2,1,70\nexport_secs,jsonl,1,0.4\nsize_ops,B,,9\n";
        let out = splice_csv(csv, "export_secs,gemma:jsonl,1,0.5\n", Part::Export.csv_parts());
        assert_eq!(
            out,
            "part,key,round,value\noverhead_tokens_per_s,A-t2,1,70\nsize_ops,B,,9\nexport_secs,gemma:jsonl,1,0.5\n"
        );
        let out = splice_csv(csv, "", Part::Overhead.csv_parts());
        assert_eq!(out, "part,key,round,value\nexport_secs,jsonl,1,0.4\n");
    }

    #[test]
    fn every_part_has_headings_and_rows_of_its_own() {
        for a in Part::ALL {
            for b in Part::ALL.into_iter().filter(|&b| b != a) {
                assert!(
                    a.headings().iter().all(|h| !b.headings().iter().any(|o| h.starts_with(o) || o.starts_with(h)))
                );
                assert!(
                    a.csv_parts().iter().all(|h| !b.csv_parts().iter().any(|o| h.starts_with(o) || o.starts_with(h)))
                );
            }
        }
    }
}
