//! `ttrace simulate [TRACE]`: page-cache budgets → disk bytes per generated
//! token, per policy, as a table (or --json, --csv, --plot).

use std::io::Write;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{
    analyze::{
        self,
        simulate::{
            Counting, Options, Policy, Row,
            curve::{self, AnonChoice, AnonSource, Budgets, Curve, ReadaheadChoice, ReadaheadSource, Request},
            detail::Detail,
        },
    },
    cli::{Anon, LoadReplay, SimulateArgs},
    export,
    units::human_bytes,
};

/// What `--json` prints.
#[derive(Serialize)]
struct Document<'a> {
    trace: String,
    layout: Option<String>,
    #[serde(flatten)]
    curve: &'a Curve,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    if !args.page.is_power_of_two() {
        bail!("--page {} is not a power of two (the kernel's page is 4K)", args.page);
    }
    if args.readahead.is_some_and(|r| r % args.page != 0) {
        bail!("--readahead must be a multiple of --page ({})", human_bytes(args.page));
    }
    let analysis = super::report::read_analysis(&args.file)?;
    super::report::warn_if_partial(&args.file, &analysis);
    let layout = match &args.layout {
        Some(path) => Some(super::diff::read_permutation(path, &args.layout_key)?),
        None => None,
    };
    let request = Request {
        options: Options {
            page_bytes: args.page,
            engine: args.engine,
            // From `readahead_choice`.
            readahead: None,
            layout,
            populate: match args.load {
                LoadReplay::Auto => None,
                LoadReplay::Populate => Some(true),
                LoadReplay::None => Some(false),
            },
            tokens: args.tokens,
        },
        readahead_choice: match args.readahead {
            Some(0) => ReadaheadChoice::None,
            Some(bytes) => ReadaheadChoice::Window(bytes),
            None => ReadaheadChoice::Recorded,
        },
        budgets: match (&args.budgets, args.budget_range) {
            (list, _) if !list.is_empty() => Budgets::List(list.clone()),
            (_, Some((from, to, steps))) => Budgets::Range { from, to, steps },
            _ => Budgets::Default,
        },
        policies: args.policy.clone(),
        anon: match args.anon {
            Anon::Auto => AnonChoice::Auto,
            Anon::Bytes(b) => AnonChoice::Bytes(b),
        },
        counting: args.phase,
        detail: args.detail,
    };
    let events = analyze::walk::event_total(&analysis);
    let progress = export::progress_bar(events, "reading");
    let rows_bar = indicatif::ProgressBar::new(0);
    if events < 1_000_000 {
        rows_bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let curve = curve::compute(&args.file, &analysis, &request, &progress, &rows_bar)
        .with_context(|| format!("replaying {}", args.file.display()))?;
    progress.finish_and_clear();
    rows_bar.finish_and_clear();
    if curve.readahead_source == ReadaheadSource::NotRecorded {
        eprintln!(
            "ttrace: {} did not record the model device's readahead (traced before ttrace kept it): \
             replaying demand paging, which under a tight budget undercounts the kernel's read-around; \
             pass --readahead SIZE (twice the device's read_ahead_kb, as llama.cpp advises sequential \
             reads) to replay it",
            args.file.display()
        );
    }
    if curve.anon_source == AnonSource::Touched {
        eprintln!(
            "ttrace: {} did not record the target's anonymous memory (traced before ttrace sampled it): \
             counting only the KV cache, compute buffers and weight copies its ops touched, which leaves \
             out llama.cpp's heap (tens of MiB: vocabulary, caches); pass --anon SIZE to set it",
            args.file.display()
        );
    }
    if let Some(path) = &args.csv {
        write_csv(path, &curve.rows).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ttrace: wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        export::simulate_svg::write(path, &curve.rows, &format!("{}", args.file.display()))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ttrace: wrote {}", path.display());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let doc = Document {
            trace: args.file.display().to_string(),
            layout: args.layout.as_ref().map(|p| p.display().to_string()),
            curve: &curve,
        };
        serde_json::to_writer_pretty(&mut out, &doc).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render(&args, &curve))?;
    }
    out.flush()?;
    Ok(())
}

fn render(args: &SimulateArgs, curve: &Curve) -> String {
    let mut policies = args.policy.clone();
    policies.sort_unstable();
    policies.dedup();
    let mut s = String::new();
    let per = match args.phase {
        Counting::Generate => "generation's disk bytes per generated token",
        Counting::All => "all disk bytes (from loading on) per generated token",
    };
    let tokens = match curve.window {
        Some(cut) => format!(
            "the first {} of {} generated tokens replayed (--tokens all replays every one)",
            cut.tokens, cut.trace_tokens
        ),
        None => format!("{} generated tokens", curve.generated_tokens),
    };
    s += &format!(
        "ttrace simulate: {} — {tokens}; the ops read {} of the model files\n",
        args.file.display(),
        human_bytes(curve.footprint_bytes)
    );
    s += &format!(
        "page {}, readahead {} ({}), loading {}, anonymous memory {} ({}){}\n\n",
        human_bytes(args.page),
        curve.readahead.map_or("none".into(), |r| format!(
            "{} read-around, {} fault-around; OPT without",
            human_bytes(r.window_bytes),
            human_bytes(r.fault_around_bytes)
        )),
        <&str>::from(curve.readahead_source),
        if curve.populate {
            "replayed as MAP_POPULATE's sequential read"
        } else {
            "not replayed (cold at the first op)"
        },
        human_bytes(curve.anon_bytes),
        <&str>::from(curve.anon_source),
        args.layout.as_ref().map_or(String::new(), |p| format!(", expert layout from {}", p.display())),
    );
    s += &format!("{per}:\n{:>12} {:>12}", "budget", "cache");
    for p in &policies {
        s += &format!(" {:>12}", p.name());
    }
    s += "\n";
    for chunk in curve.rows.chunks(policies.len()) {
        s += &format!("{:>12} {:>12}", human_bytes(chunk[0].budget_bytes), human_bytes(chunk[0].cache_bytes));
        for r in chunk {
            let cell = r.disk_bytes_per_token.map_or("-".into(), |b| human_bytes(b.round() as u64));
            s += &format!(" {cell:>12}");
        }
        s += "\n";
    }
    if policies.contains(&Policy::TwoList) {
        s += &format!(
            "2q: the median of its replays from {0} below to {0} above each cache size (at one exact size \
             it resonates with the model's cyclic reads; docs/SIMULATE.md)\n",
            human_bytes(curve.two_list_band_bytes)
        );
    }
    if curve.generated_tokens == 0 {
        s += "\nno token was generated in this trace: per-token figures are '-'\n";
    }
    if let (Some(budget), Some(first)) = (curve.fit_budget_bytes, curve.first_read_bytes) {
        s += &format!(
            "\nsmallest budget at which generation reads nothing from disk (LRU, demand paging): {}",
            human_bytes(budget)
        );
        if first > 0 {
            s += &format!(
                " (besides {} it reads for the first time, which no budget avoids; see --load)",
                human_bytes(first)
            );
        }
        s += "\n";
    }
    if let Some(m) = &curve.measured {
        s += &format!(
            "\nthis trace ran under --mem-limit {}: generation read {} per generated token from disk{} \
             (block reads in the model files; the row at {} is its prediction)\n",
            human_bytes(m.budget_bytes),
            m.disk_bytes_per_token.map_or("-".into(), |b| human_bytes(b.round() as u64)),
            if curve.window.is_some() { " in the tokens replayed" } else { "" },
            human_bytes(m.budget_bytes),
        );
    }
    if let Some(d) = &curve.detail {
        s += &render_detail(d, curve.generated_tokens);
    }
    s
}

/// Tensors shown in the text table.
const TOP_TENSORS: usize = 12;

/// The tensors the most is read from at the `--detail` budget (by the
/// largest of the policies), a column per policy.
fn render_detail(d: &Detail, tokens: u64) -> String {
    let per = |bytes: u64| human_bytes(if tokens > 0 { (bytes as f64 / tokens as f64).round() as u64 } else { bytes });
    let mut by_name: std::collections::BTreeMap<Option<&str>, Vec<u64>> = Default::default();
    for (i, p) in d.policies.iter().enumerate() {
        for t in &p.tensors {
            by_name.entry(t.name.as_deref()).or_insert_with(|| vec![0; d.policies.len()])[i] = t.bytes.disk_bytes;
        }
    }
    let mut top: Vec<(Option<&str>, Vec<u64>)> = by_name.into_iter().collect();
    top.sort_by_key(|(name, b)| (std::cmp::Reverse(b.iter().copied().max().unwrap_or(0)), *name));
    let shown = top.len().min(TOP_TENSORS);
    let mut s = format!(
        "\nwhere the reads go at {} ({} per generated token; top {shown} of {} entries, --json has all):\n{:<40}",
        human_bytes(d.budget_bytes),
        if tokens > 0 { "disk bytes" } else { "disk bytes, total: no token generated" },
        top.len(),
        "tensor"
    );
    for p in &d.policies {
        s += &format!(" {:>10}", p.policy.name());
    }
    s += "\n";
    for (name, bytes) in top.iter().take(TOP_TENSORS) {
        s += &format!("{:<40}", name.unwrap_or("(outside tensors)"));
        for &b in bytes {
            s += &format!(" {:>10}", per(b));
        }
        s += "\n";
    }
    s
}

fn write_csv(path: &std::path::Path, rows: &[Row]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "budget_bytes,policy,disk_bytes,disk_bytes_per_token,misses,cache_bytes")?;
    for r in rows {
        let per = r.disk_bytes_per_token.map_or(String::new(), |v| format!("{v:.1}"));
        writeln!(f, "{},{},{},{per},{},{}", r.budget_bytes, r.policy.name(), r.disk_bytes, r.misses, r.cache_bytes)?;
    }
    f.flush()
}
