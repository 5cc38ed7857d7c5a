//! `ttrace diff A B`: two runs of the same weights compared; the exit status
//! says whether their tokens and routing match (0), differ (1), or the
//! comparison failed (2, from `main`).

use std::{io::Write, path::Path, process::ExitCode};

use anyhow::{Context, Result, bail};

use crate::{
    analyze::{
        self,
        diff::{Permutation, Run},
    },
    cli::DiffArgs,
    export,
};

pub fn run(args: DiffArgs) -> Result<ExitCode> {
    if args.values {
        return super::diff_values::run(&args);
    }
    let perm = args.perm.as_deref().map(|p| read_permutation(p, &args.perm_key)).transpose()?;
    let (a, sa) = read(&args.a)?;
    let (b, sb) = read(&args.b)?;
    let run_a = Run { path: args.a.display().to_string(), analysis: &a, stats: &sa };
    let run_b = Run { path: args.b.display().to_string(), analysis: &b, stats: &sb };
    let d = analyze::diff::diff(&run_a, &run_b, perm.as_ref());
    if let Some(html) = &args.html {
        export::diff::write_html(&d, html).with_context(|| format!("writing {}", html.display()))?;
        eprintln!("ttrace: wrote {}", html.display());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", export::diff::render(&d))?;
    }
    out.flush()?;
    Ok(if d.same { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn read(path: &Path) -> Result<(analyze::Analysis, analyze::stats::Stats)> {
    let analysis = super::report::read_analysis(path)?;
    super::report::warn_if_partial(path, &analysis);
    let progress = export::progress_bar(analyze::walk::event_total(&analysis), "summarising");
    let stats =
        analyze::stats::collect(path, &analysis, &progress).with_context(|| format!("reading {}", path.display()))?;
    progress.finish_and_clear();
    Ok((analysis, stats))
}

/// mbolt's perms.json (`layers[].{layer, <key>}`), or a plain list of
/// per-layer lists.
pub(crate) fn read_permutation(path: &Path, key: &str) -> Result<Permutation> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let layers = match &doc {
        serde_json::Value::Array(v) => v.clone(),
        _ => match doc.get("layers").and_then(|l| l.as_array()) {
            Some(v) => v.clone(),
            None => bail!("{}: expected mbolt's perms.json (a `layers` list) or a list of lists", path.display()),
        },
    };
    let mut perm = Permutation::new();
    for (i, l) in layers.iter().enumerate() {
        let ids = if l.is_array() { Some(l) } else { l.get(key) };
        let Some(ids) = ids.and_then(|v| v.as_array()) else {
            bail!("{}: layer entry {i} has no `{key}` list (see --perm-key)", path.display());
        };
        let ids: Vec<u32> = ids.iter().filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if sorted != (0..ids.len() as u32).collect::<Vec<_>>() {
            bail!("{}: layer entry {i}'s `{key}` is not a permutation of 0..{}", path.display(), ids.len());
        }
        let layer = l.get("layer").and_then(|v| v.as_u64()).map_or(i as u32, |v| v as u32);
        perm.insert(layer, ids);
    }
    Ok(perm)
}
