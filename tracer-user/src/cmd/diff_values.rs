//! `ttrace diff A B --values [--rtol X]`: where two runs' node outputs part
//! ways. Exit status 0 when every output matches, 1 when one differs.

use std::{io::Write, path::Path, process::ExitCode};

use anyhow::{Context, Result, bail};

use crate::{
    analyze::{
        values::{self, ValueRow},
        values_diff::{self, ValuesDiff},
    },
    cli::DiffArgs,
};

pub fn run(args: &DiffArgs) -> Result<ExitCode> {
    if args.rtol.is_some_and(|r| !(r >= 0.0 && r.is_finite())) {
        bail!("--rtol must be a finite number >= 0");
    }
    let a = read(&args.a)?;
    let b = read(&args.b)?;
    let d = values_diff::diff(&a, &b, args.rtol);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render(&d))?;
    }
    out.flush()?;
    Ok(if d.same() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn read(path: &Path) -> Result<Vec<ValueRow>> {
    let analysis = super::report::read_analysis(path)?;
    let rows = values::read(path, &analysis).with_context(|| format!("reading {}", path.display()))?;
    if rows.iter().all(|r| r.fingerprint.is_none()) {
        bail!("{} holds no node values: record them with `ttrace run --values`", path.display());
    }
    Ok(rows)
}

fn render(d: &ValuesDiff) -> String {
    let mut s = String::new();
    let tolerance = d.rtol.map_or_else(|| "exact".to_string(), |r| format!("rtol {r}"));
    s += &format!("node outputs compared: {} ({tolerance})\n", d.compared);
    match &d.first {
        None => s += "first divergence: none\n",
        Some(f) => {
            s += &format!(
                "first divergence: ubatch {} node {} (occurrence {}, op {}, index {}) — {}\n",
                f.node.ubatch,
                f.node.name,
                f.node.occurrence,
                f.op,
                f.node_index[0].map_or("?".to_string(), |i| i.to_string()),
                f.reason
            );
            s += &format!("  A: blake3 {} sum {:e} rms {:e}\n", &f.blake3[0][..16], f.sum[0], f.rms[0]);
            s += &format!("  B: blake3 {} sum {:e} rms {:e}\n", &f.blake3[1][..16], f.sum[1], f.rms[1]);
            s += &format!("  cosine {:.6}\n", f.cosine);
        }
    }
    for (which, keys) in [("A", &d.only_a), ("B", &d.only_b)] {
        if let Some(k) = keys.first() {
            s += &format!("only in {which}: {} outputs, first ubatch {} {}\n", keys.len(), k.ubatch, k.name);
        }
    }
    s += "layer   nodes  differ  max rms drift  min cosine\n";
    for l in &d.layers {
        let layer = l.layer.map_or("-".to_string(), |l| l.to_string());
        s += &format!(
            "{layer:>5} {:>7} {:>7} {:>14.3e} {:>11.6}\n",
            l.nodes, l.differing, l.max_rms_drift, l.min_cosine
        );
    }
    s
}
