//! `ttrace simulate`'s arguments.

use clap::Args;

use crate::analyze::simulate::TokenWindow;

/// A size argument (`160M`, `1.5G`, `4K`, bytes).
fn size(text: &str) -> Result<u64, String> {
    match crate::units::parse_size(text) {
        Ok(0) => Err("the size must be above zero".into()),
        Ok(n) => Ok(n),
        Err(reason) => Err(format!("{text:?}: {reason}")),
    }
}

/// `--readahead`: a size, or 0 (`none`) for demand paging.
fn readahead(text: &str) -> Result<u64, String> {
    match text {
        "none" | "0" => Ok(0),
        _ => size(text),
    }
}

/// `--budget-range FROM..TO[/STEPS]`.
fn budget_range(text: &str) -> Result<(u64, u64, u32), String> {
    let (range, steps) = match text.split_once('/') {
        Some((r, n)) => (r, n.parse::<u32>().map_err(|_| format!("{n:?} is not a number of steps"))?),
        None => (text, 16),
    };
    let Some((from, to)) = range.split_once("..") else {
        return Err(format!("{text:?}: expected FROM..TO or FROM..TO/STEPS, e.g. 64M..1G"));
    };
    let (from, to) = (size(from)?, size(to)?);
    if from >= to || steps < 2 {
        return Err(format!("{text:?}: FROM must be below TO, and STEPS at least 2"));
    }
    Ok((from, to, steps))
}

/// `--anon`: `auto` or a size.
fn anon(text: &str) -> Result<Anon, String> {
    match text {
        "auto" => Ok(Anon::Auto),
        "0" => Ok(Anon::Bytes(0)),
        _ => size(text).map(Anon::Bytes),
    }
}

/// `--tokens`: `auto`, `all` or a count.
fn tokens(text: &str) -> Result<TokenWindow, String> {
    match text {
        "auto" => Ok(TokenWindow::Auto),
        "all" => Ok(TokenWindow::All),
        _ => match text.parse::<u64>() {
            Ok(0) => Err("replay at least one generated token (or `all`)".into()),
            Ok(n) => Ok(TokenWindow::First(n)),
            Err(_) => Err(format!("{text:?}: expected a number of generated tokens, `all` or `auto`")),
        },
    }
}

/// Anonymous memory inside the budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Anon {
    /// From the trace's backend buffers (KV cache, compute, repacked and
    /// read-in weights, outputs).
    Auto,
    Bytes(u64),
}

/// How model loading is replayed.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum LoadReplay {
    /// From the target's command line: MAP_POPULATE unless `-lm mmap` or
    /// `--no-mmap`.
    Auto,
    /// A sequential read of every model file before the first op.
    Populate,
    /// Nothing: the cache starts empty at the first op.
    None,
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Trace file written by `ttrace run` or `ttrace attach`.
    #[arg(default_value = "ttrace.data")]
    pub file: std::path::PathBuf,
    /// Memory budgets, comma-separated (default: 8 from anonymous memory
    /// plus an eighth of the model's footprint to anonymous memory plus all
    /// of it, or to the smallest budget that reads nothing when larger).
    #[arg(long, value_delimiter = ',', value_parser = size, conflicts_with = "budget_range")]
    pub budgets: Vec<u64>,
    /// Evenly spaced budgets: FROM..TO, 16 of them, or FROM..TO/STEPS.
    #[arg(long, value_name = "FROM..TO", value_parser = budget_range)]
    pub budget_range: Option<(u64, u64, u32)>,
    #[arg(long, value_delimiter = ',', default_value = "lru,opt,2q")]
    pub policy: Vec<crate::analyze::simulate::Policy>,
    /// Page size.
    #[arg(long, default_value = "4K", value_parser = size)]
    pub page: u64,
    /// The kernel's mmap read-around window (the file's ra_pages) replayed
    /// for lru and 2q; 0: demand paging. Default: recorded in the trace
    /// (the model device's read_ahead_kb, doubled by llama.cpp's
    /// POSIX_FADV_SEQUENTIAL).
    #[arg(long, value_name = "SIZE|0", value_parser = readahead)]
    pub readahead: Option<u64>,
    /// Replay on another expert layout: mbolt's perms.json (`perm[p]` is the
    /// original expert stored at position p), or a JSON list of per-layer lists.
    #[arg(long, value_name = "perms.json")]
    pub layout: Option<std::path::PathBuf>,
    /// Which permutation of perms.json: chain_perm, clique_perm or heat_perm.
    #[arg(long, default_value = "chain_perm", requires = "layout")]
    pub layout_key: String,
    /// How LRU replays the kernel's fault path under readahead: `runs` of
    /// pages, or `pages` one by one (the straightforward replay, slow on
    /// long traces; the figures are the same).
    #[arg(long, value_enum, default_value = "runs")]
    pub engine: crate::analyze::simulate::Engine,
    /// What the figures count.
    #[arg(long, value_enum, default_value = "generate")]
    pub phase: crate::analyze::simulate::Counting,
    /// Which generated tokens to replay: the first N (and everything the
    /// run did before them), `all`, or `auto`: all when the ops read fewer
    /// than 16 Mi pages in all, else the first tokens within that many (at
    /// least 64), so that a day-long trace answers in about half a minute.
    /// The figures are exact for the tokens replayed, and say how many.
    /// Example: `ttrace simulate --tokens all long.data`.
    #[arg(long, value_name = "N|all|auto", default_value = "auto", value_parser = tokens)]
    pub tokens: TokenWindow,
    /// Anonymous memory inside the budget: `auto` (from the trace) or a size.
    #[arg(long, default_value = "auto", value_parser = anon)]
    pub anon: Anon,
    /// How to replay model loading.
    #[arg(long, value_enum, default_value = "auto")]
    pub load: LoadReplay,
    /// Where the reads go at this budget (added to the budgets replayed
    /// when not among them): each policy's disk bytes per tensor, layer and
    /// MoE expert (all of them under --json, the top tensors in the table).
    /// Example: `ttrace simulate --detail 1G --json`.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub detail: Option<u64>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write one row per (budget, policy) as CSV.
    #[arg(long, value_name = "OUT")]
    pub csv: Option<std::path::PathBuf>,
    /// Also draw the curves as SVG.
    #[arg(long, value_name = "OUT.svg")]
    pub plot: Option<std::path::PathBuf>,
}
