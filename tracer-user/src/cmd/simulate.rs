//! `ttrace simulate [TRACE]`: page-cache budgets → disk bytes per generated
//! token, per policy, as a table (or --json, --csv, --plot).

use std::io::Write;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{
    analyze::{
        self,
        simulate::{self, Counting, Options, Policy, Replay, Row},
    },
    cli::{Anon, LoadReplay, SimulateArgs},
    export,
    units::human_bytes,
};

/// What `--json` prints.
#[derive(Serialize)]
struct Document<'a> {
    trace: String,
    page_bytes: u64,
    /// The kernel readahead replayed for LRU and 2q; `null`: demand paging.
    readahead: Option<simulate::Readahead>,
    readahead_source: &'a str,
    layout: Option<String>,
    phase: Counting,
    /// Loading replayed as a sequential read (MAP_POPULATE).
    populate: bool,
    anon_bytes: u64,
    anon_source: &'a str,
    generated_tokens: u64,
    /// Model-file bytes the run's ops read at least once.
    footprint_bytes: u64,
    /// Smallest budget at which generation re-reads nothing under LRU.
    fit_budget_bytes: Option<u64>,
    /// Bytes generation reads for the first time whatever the budget.
    first_read_bytes: Option<u64>,
    rows: &'a [Row],
}

pub fn run(args: SimulateArgs) -> Result<()> {
    if !args.page.is_power_of_two() {
        bail!("--page {} is not a power of two (the kernel's page is 4K)", args.page);
    }
    if args.readahead.is_some_and(|r| r % args.page != 0) {
        bail!("--readahead must be a multiple of --page ({})", human_bytes(args.page));
    }
    let mut policies = args.policy.clone();
    policies.sort_unstable();
    policies.dedup();
    let analysis = super::report::read_analysis(&args.file)?;
    let layout = match &args.layout {
        Some(path) => Some(super::diff::read_permutation(path, &args.layout_key)?),
        None => None,
    };
    let (readahead, readahead_source) = match args.readahead {
        Some(0) => (None, "--readahead 0"),
        Some(bytes) => {
            let recorded = simulate::recorded_readahead(&analysis);
            let fault_around = recorded.map_or(simulate::FAULT_AROUND_DEFAULT, |r| r.fault_around_bytes);
            (Some(simulate::Readahead { window_bytes: bytes, fault_around_bytes: fault_around }), "--readahead")
        }
        None => match simulate::recorded_readahead(&analysis) {
            Some(r) => (Some(r), "the model device's read_ahead_kb, recorded, doubled by llama.cpp's FADV_SEQUENTIAL"),
            None => {
                eprintln!(
                    "ttrace: {} did not record the model device's readahead (traced before ttrace kept it): \
                     replaying demand paging, which under a tight budget undercounts the kernel's read-around; \
                     pass --readahead SIZE (twice the device's read_ahead_kb, as llama.cpp advises sequential \
                     reads) to replay it",
                    args.file.display()
                );
                (None, "not recorded in the trace")
            }
        },
    };
    let options = Options {
        page_bytes: args.page,
        readahead,
        layout,
        populate: match args.load {
            LoadReplay::Auto => None,
            LoadReplay::Populate => Some(true),
            LoadReplay::None => Some(false),
        },
    };
    let progress = export::progress_bar(analyze::walk::event_total(&analysis), "reading");
    let replay = simulate::replay(&args.file, &analysis, &options, &progress)
        .with_context(|| format!("replaying {}", args.file.display()))?;
    progress.finish_and_clear();
    let (anon_bytes, anon_source) = match args.anon {
        Anon::Bytes(b) => (b, "--anon"),
        Anon::Auto => match analysis.trailer.as_ref().and_then(|t| t.peak_anon_bytes) {
            Some(peak) => (peak, "the target's peak resident anonymous memory, recorded"),
            None => {
                eprintln!(
                    "ttrace: {} did not record the target's anonymous memory (traced before ttrace sampled it): \
                     counting only the KV cache, compute buffers and weight copies its ops touched, which leaves \
                     out llama.cpp's heap (tens of MiB: vocabulary, caches); pass --anon SIZE to set it",
                    args.file.display()
                );
                (replay.anon_bytes, "touched by the ops (KV cache, compute buffers, weight copies)")
            }
        },
    };
    let footprint = replay.footprint_pages * args.page;
    let budgets = budgets(&args, footprint + anon_bytes);
    let bar = indicatif::ProgressBar::new((budgets.len() * policies.len()) as u64);
    if replay.stream.accesses.len() < 1_000_000 {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let rows = simulate::run(&replay, &budgets, &policies, anon_bytes, args.page, args.phase, &bar);
    bar.finish_and_clear();
    let fit = (args.phase == Counting::Generate).then(|| {
        let f = simulate::lru_fit(&simulate::LruCurve::new(&replay.stream));
        (f.pages * args.page + anon_bytes, f.cold_pages * args.page)
    });
    if let Some(path) = &args.csv {
        write_csv(path, &rows).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ttrace: wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        export::simulate_svg::write(path, &rows, &format!("{}", args.file.display()))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ttrace: wrote {}", path.display());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let doc = Document {
            trace: args.file.display().to_string(),
            page_bytes: args.page,
            readahead,
            readahead_source,
            layout: args.layout.as_ref().map(|p| p.display().to_string()),
            phase: args.phase,
            populate: replay.populate,
            anon_bytes,
            anon_source,
            generated_tokens: replay.generated_tokens,
            footprint_bytes: footprint,
            fit_budget_bytes: fit.map(|f| f.0),
            first_read_bytes: fit.map(|f| f.1),
            rows: &rows,
        };
        serde_json::to_writer_pretty(&mut out, &doc).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        let labels = Labels { anon: anon_source, readahead: readahead_source };
        write!(out, "{}", render(&args, &replay, anon_bytes, labels, &policies, &rows, fit))?;
    }
    out.flush()?;
    Ok(())
}

/// The budgets asked for, or eight up to everything the run needs.
fn budgets(args: &SimulateArgs, everything: u64) -> Vec<u64> {
    if !args.budgets.is_empty() {
        let mut b = args.budgets.clone();
        b.sort_unstable();
        b.dedup();
        return b;
    }
    let (from, to, steps) = args.budget_range.unwrap_or((everything / 8, everything, 8));
    let step = (to - from) as f64 / f64::from(steps - 1);
    (0..steps).map(|i| from + (step * f64::from(i)).round() as u64).collect()
}

/// Where the anonymous memory and the readahead came from.
struct Labels<'a> {
    anon: &'a str,
    readahead: &'a str,
}

fn render(
    args: &SimulateArgs,
    replay: &Replay,
    anon: u64,
    labels: Labels,
    policies: &[Policy],
    rows: &[Row],
    fit: Option<(u64, u64)>,
) -> String {
    let mut s = String::new();
    let per = match args.phase {
        Counting::Generate => "generation's disk bytes per generated token",
        Counting::All => "all disk bytes (from loading on) per generated token",
    };
    s += &format!(
        "ttrace simulate: {} — {} generated tokens; the ops read {} of the model files\n",
        args.file.display(),
        replay.generated_tokens,
        human_bytes(replay.footprint_pages * args.page)
    );
    s += &format!(
        "page {}, readahead {} ({}), loading {}, anonymous memory {} ({}){}\n\n",
        human_bytes(args.page),
        replay.readahead.map_or("none".into(), |r| format!(
            "{} read-around, {} fault-around; OPT without",
            human_bytes(r.window_bytes),
            human_bytes(r.fault_around_bytes)
        )),
        labels.readahead,
        if replay.populate {
            "replayed as MAP_POPULATE's sequential read"
        } else {
            "not replayed (cold at the first op)"
        },
        human_bytes(anon),
        labels.anon,
        args.layout.as_ref().map_or(String::new(), |p| format!(", expert layout from {}", p.display())),
    );
    s += &format!("{per}:\n{:>12} {:>12}", "budget", "cache");
    for p in policies {
        s += &format!(" {:>12}", p.name());
    }
    s += "\n";
    for chunk in rows.chunks(policies.len()) {
        s += &format!("{:>12} {:>12}", human_bytes(chunk[0].budget_bytes), human_bytes(chunk[0].cache_bytes));
        for r in chunk {
            let cell = r.disk_bytes_per_token.map_or("-".into(), |b| human_bytes(b.round() as u64));
            s += &format!(" {cell:>12}");
        }
        s += "\n";
    }
    if replay.generated_tokens == 0 {
        s += "\nno token was generated in this trace: per-token figures are '-'\n";
    }
    if let Some((budget, first)) = fit {
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
