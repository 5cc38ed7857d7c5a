//! The miss-ratio curve as one document: what `ttrace simulate --json`
//! prints, the HTML report's section and `ttrace view`'s `/api/v1/simulate`
//! answer are this one computation, so their figures cannot drift apart.

use std::path::Path;

use indicatif::ProgressBar;
use serde::Serialize;

use super::{
    Counting, Cut, Engine, FAULT_AROUND_DEFAULT, LruCurve, Options, Policy, Readahead, Row, SimulateError, TokenWindow,
    detail::{self, Detail},
    lru_fit, recorded_readahead, replay, run,
};
use crate::analyze::{Analysis, Phase, io::When};

/// Anonymous memory inside the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnonChoice {
    /// The target's recorded peak, else what the ops touched.
    Auto,
    Bytes(u64),
}

/// Where the anonymous figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum AnonSource {
    Given,
    Recorded,
    /// Traces from before ttrace sampled the target's anonymous memory.
    Touched,
}

impl From<AnonSource> for &'static str {
    fn from(source: AnonSource) -> &'static str {
        match source {
            AnonSource::Given => "--anon",
            AnonSource::Recorded => "the target's peak resident anonymous memory, recorded",
            AnonSource::Touched => "touched by the ops (KV cache, compute buffers, weight copies)",
        }
    }
}

/// The kernel readahead to replay for LRU and the two-list model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadaheadChoice {
    /// The model device's, recorded in the trace; demand paging in traces
    /// from before ttrace kept it.
    Recorded,
    /// This read-around window (the recorded fault-around).
    Window(u64),
    /// Demand paging.
    None,
}

/// Where the readahead replayed came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum ReadaheadSource {
    Given,
    Off,
    Recorded,
    NotRecorded,
}

impl From<ReadaheadSource> for &'static str {
    fn from(source: ReadaheadSource) -> &'static str {
        match source {
            ReadaheadSource::Given => "--readahead",
            ReadaheadSource::Off => "--readahead 0",
            ReadaheadSource::Recorded => {
                "the model device's read_ahead_kb, recorded, doubled by llama.cpp's FADV_SEQUENTIAL"
            }
            ReadaheadSource::NotRecorded => "not recorded in the trace",
        }
    }
}

/// Which budgets to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budgets {
    /// Eight, from anon plus an eighth of the rest to the footprint plus
    /// anon, or to the budget that reads nothing when that is larger (a
    /// budget below anon leaves no page cache at all).
    Default,
    List(Vec<u64>),
    /// `steps` evenly spaced from `from` to `to`.
    Range {
        from: u64,
        to: u64,
        steps: u32,
    },
}

/// Everything a curve is computed from.
#[derive(Clone, Debug)]
pub struct Request {
    /// `readahead` is taken from `readahead_choice`.
    pub options: Options,
    pub readahead_choice: ReadaheadChoice,
    pub budgets: Budgets,
    pub policies: Vec<Policy>,
    pub anon: AnonChoice,
    pub counting: Counting,
    /// The budget at which to say where the reads go (replayed too when
    /// not among `budgets`).
    pub detail: Option<u64>,
}

impl Request {
    /// The curve the report and the viewer show: `ttrace simulate TRACE`'s
    /// defaults.
    pub fn defaults() -> Request {
        Request {
            options: Options {
                page_bytes: 4096,
                engine: Engine::Runs,
                readahead: None,
                layout: None,
                populate: None,
                tokens: TokenWindow::Auto,
            },
            readahead_choice: ReadaheadChoice::Recorded,
            budgets: Budgets::Default,
            policies: vec![Policy::Lru, Policy::Opt, Policy::TwoList],
            anon: AnonChoice::Auto,
            counting: Counting::Generate,
            detail: None,
        }
    }
}

/// The curve and what it was computed from.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    pub page_bytes: u64,
    /// The kernel readahead replayed for LRU and 2q; `null`: demand paging.
    pub readahead: Option<Readahead>,
    pub readahead_source: ReadaheadSource,
    pub phase: Counting,
    /// Loading replayed as a sequential read (MAP_POPULATE).
    pub populate: bool,
    pub anon_bytes: u64,
    pub anon_source: AnonSource,
    /// 2q's rows: the median of its replays at capacities this far either
    /// side of the budget's ([`super::TWO_LIST_BAND_BYTES`]).
    pub two_list_band_bytes: u64,
    /// Generated tokens replayed: the figures are per one of these.
    pub generated_tokens: u64,
    /// Where the replay stopped (`--tokens`), when before the trace's end:
    /// every figure is of the ops before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<Cut>,
    /// Model-file bytes the run's ops read at least once.
    pub footprint_bytes: u64,
    /// Smallest budget at which generation re-reads nothing under LRU on
    /// demand paging (counting generation only).
    pub fit_budget_bytes: Option<u64>,
    /// Bytes generation reads for the first time whatever the budget.
    pub first_read_bytes: Option<u64>,
    /// One per (budget, policy), in budget then policy order.
    pub rows: Vec<Row>,
    /// Where the reads go at the `--detail` budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
    /// A trace recorded under `--mem-limit`: what the run itself read, to
    /// set beside the rows at its budget (which are always replayed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// What a run under a memory limit read from disk during generation: the
/// block reads in its model files in generate ubatches (the report's
/// figure), per generated token.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Measured {
    pub budget_bytes: u64,
    pub disk_bytes: u64,
    pub disk_bytes_per_token: Option<f64>,
}

/// The run's own reads, when it ran under a limit, recorded block I/O, and
/// generation is what is counted; within the replay's window.
fn measured(a: &Analysis, counting: Counting, generated_tokens: u64, cut: Option<&Cut>) -> Option<Measured> {
    let budget_bytes = a.header.options.mem_limit.filter(|_| counting == Counting::Generate && a.io.disk.issues > 0)?;
    let end = cut.map_or(u32::MAX, |c| c.ubatch);
    let disk_bytes = (a.ubatches.iter())
        .filter(|u| u.phase == Phase::Generate && u.index < end)
        .filter_map(|u| a.io.by_when.get(&When::Ubatch(u.index)))
        .map(|w| w.disk.bytes)
        .sum();
    let per_token = (generated_tokens > 0).then(|| disk_bytes as f64 / generated_tokens as f64);
    Some(Measured { budget_bytes, disk_bytes, disk_bytes_per_token: per_token })
}

/// Replays the trace at `path` and answers `request`; `rows_progress`
/// counts (budget, policy) rows, `read_progress` the trace's events.
pub fn compute(
    path: &Path,
    a: &Analysis,
    request: &Request,
    read_progress: &ProgressBar,
    rows_progress: &ProgressBar,
) -> Result<Curve, SimulateError> {
    let mut policies = request.policies.clone();
    policies.sort_unstable();
    policies.dedup();
    let page = request.options.page_bytes;
    let (readahead, readahead_source) = match request.readahead_choice {
        ReadaheadChoice::None => (None, ReadaheadSource::Off),
        ReadaheadChoice::Window(bytes) => {
            let fault_around = recorded_readahead(a).map_or(FAULT_AROUND_DEFAULT, |r| r.fault_around_bytes);
            (Some(Readahead { window_bytes: bytes, fault_around_bytes: fault_around }), ReadaheadSource::Given)
        }
        ReadaheadChoice::Recorded => match recorded_readahead(a) {
            Some(r) => (Some(r), ReadaheadSource::Recorded),
            None => (None, ReadaheadSource::NotRecorded),
        },
    };
    let recorded_anon = a.trailer.as_ref().and_then(|t| t.peak_anon_bytes);
    let touched_anon = request.anon == AnonChoice::Auto && recorded_anon.is_none();
    let options = Options { readahead, ..request.options.clone() };
    let replay = replay(path, a, &options, touched_anon, read_progress)?;
    let (anon_bytes, anon_source) = match request.anon {
        AnonChoice::Bytes(b) => (b, AnonSource::Given),
        AnonChoice::Auto => match recorded_anon {
            Some(peak) => (peak, AnonSource::Recorded),
            None => (replay.anon_bytes, AnonSource::Touched),
        },
    };
    let footprint_bytes = replay.footprint_pages * page;
    let fit = (request.counting == Counting::Generate).then(|| {
        let f = lru_fit(&LruCurve::new(&replay.stream));
        (f.pages * page + anon_bytes, f.cold_pages * page)
    });
    // Up to where the curve reaches zero: past the footprint when loading
    // left pages the ops never read in the cache ahead of them.
    let everything = (footprint_bytes + anon_bytes).max(fit.map_or(0, |f| f.0));
    let measured = measured(a, request.counting, replay.generated_tokens, replay.cut.as_ref());
    let mut budgets = budgets(&request.budgets, anon_bytes, everything);
    for b in [request.detail, measured.map(|m| m.budget_bytes)].into_iter().flatten() {
        if !budgets.contains(&b) {
            budgets.push(b);
        }
    }
    budgets.sort_unstable();
    rows_progress.set_length((budgets.len() * policies.len()) as u64);
    let (rows, reads) = run(&replay, &budgets, &policies, anon_bytes, request.counting, request.detail, rows_progress);
    let detail = request.detail.map(|budget_bytes| {
        let model = detail::Model {
            models: &a.models,
            stream: &replay.stream,
            page_bytes: page,
            layout: options.layout.as_ref(),
            generated_tokens: replay.generated_tokens,
        };
        let policies = reads
            .iter()
            .filter_map(|(policy, reads)| {
                let row = rows.iter().find(|r| r.budget_bytes == budget_bytes && r.policy == *policy)?;
                Some(model.charge(row, reads))
            })
            .collect();
        Detail { budget_bytes, policies }
    });
    Ok(Curve {
        page_bytes: page,
        readahead,
        readahead_source,
        phase: request.counting,
        populate: replay.populate,
        anon_bytes,
        anon_source,
        two_list_band_bytes: super::TWO_LIST_BAND_BYTES,
        generated_tokens: replay.generated_tokens,
        window: replay.cut,
        footprint_bytes,
        fit_budget_bytes: fit.map(|f| f.0),
        first_read_bytes: fit.map(|f| f.1),
        rows,
        detail,
        measured,
    })
}

/// The budgets asked for; by default eight from `anon` up to `everything`
/// (where the curve reaches zero).
pub fn budgets(asked: &Budgets, anon: u64, everything: u64) -> Vec<u64> {
    let (from, to, steps) = match asked {
        Budgets::List(list) => {
            let mut b = list.clone();
            b.sort_unstable();
            b.dedup();
            return b;
        }
        Budgets::Default => {
            let rest = everything.saturating_sub(anon);
            (anon + rest / 8, anon + rest, 8)
        }
        Budgets::Range { from, to, steps } => (*from, *to, *steps),
    };
    if steps < 2 {
        return vec![to];
    }
    let step = (to - from) as f64 / f64::from(steps - 1);
    (0..steps).map(|i| from + (step * f64::from(i)).round() as u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_budgets_start_above_anon_and_end_at_everything() {
        assert_eq!(budgets(&Budgets::Default, 0, 800), vec![100, 200, 300, 400, 500, 600, 700, 800]);
        assert_eq!(budgets(&Budgets::Default, 200, 1000), vec![300, 400, 500, 600, 700, 800, 900, 1000]);
        assert_eq!(budgets(&Budgets::List(vec![3, 1, 3]), 0, 0), vec![1, 3]);
        assert_eq!(budgets(&Budgets::Range { from: 0, to: 10, steps: 3 }, 0, 0), vec![0, 5, 10]);
    }
}
