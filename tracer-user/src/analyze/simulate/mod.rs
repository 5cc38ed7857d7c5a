//! `ttrace simulate`: the disk bytes a run would read under any page-cache
//! budget, replayed from the exact model-file ranges its ops read (the rule
//! the report charges by, [`usage::source_ranges`]), without re-running it.
//!
//! One pass over the trace builds a [`Stream`]; LRU is then answered for
//! every size at once ([`LruCurve`]), OPT and the kernel-like two-list model
//! one size at a time. With the kernel's readahead ([`Readahead`], recorded
//! in the trace), LRU and the two-list model replay the fault path page by
//! page ([`faults`]), one size at a time. At one budget, [`detail`] says
//! which tensors, layers and experts the pages read belong to.

mod bits;
pub mod curve;
pub mod detail;
pub mod faults;
pub mod lru;
mod lru_faults;
pub mod opt;
mod rows;
mod runs;
pub mod stream;
pub mod twolist;
pub mod window;

#[cfg(test)]
mod tests;

use std::path::Path;

use indicatif::ProgressBar;
use serde::Serialize;

use super::{
    Analysis,
    diff::Permutation,
    tensor::{is_expert_tensor, model_tensor, view_bytes, weight_of},
    usage::{LoadMode, PERIODS, Period, routed_experts, source_ranges},
    walk::{self, Event, OpEvent, Sink, Tables},
};
use crate::format::{Memory, ModelTensor, TraceError};
pub use lru::LruCurve;
pub use rows::{TWO_LIST_BAND_BYTES, run};
pub use stream::{Stream, StreamBuilder};
pub use window::{Cut, TokenWindow};

/// Replacement policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Least recently used, exact at every size (stack distances).
    Lru,
    /// Belady's optimum: the floor no policy can beat.
    Opt,
    /// The kernel's active/inactive lists with refault detection: the
    /// median of replays within 256 KiB either side of each budget.
    #[value(name = "2q")]
    #[serde(rename = "2q")]
    TwoList,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Opt => "opt",
            Policy::TwoList => "2q",
        }
    }
}

/// Which accesses a figure counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Counting {
    /// Token generation only: disk bytes per generated token.
    #[default]
    Generate,
    /// Everything from model load on.
    All,
}

/// How the fault path is replayed under readahead (LRU only; the two-list
/// model is always replayed page by page).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// Runs of pages ([`lru_faults`]): the same figures, fast.
    #[default]
    Runs,
    /// Page by page ([`faults`]): the straightforward replay, the reference
    /// `runs` must equal.
    Pages,
}

/// What to replay and how.
#[derive(Clone, Debug)]
pub struct Options {
    pub page_bytes: u64,
    pub engine: Engine,
    /// The kernel's mmap readahead to replay, or demand paging.
    pub readahead: Option<Readahead>,
    /// Expert permutation per layer to replay the run on (mbolt's layout).
    pub layout: Option<Permutation>,
    /// Replay model loading as a sequential read of every model file
    /// (llama.cpp's default MAP_POPULATE), else from the first op.
    pub populate: Option<bool>,
    /// Which generated tokens to replay.
    pub tokens: TokenWindow,
}

/// The kernel's readahead for the model's mapping, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Readahead {
    /// The file's `ra_pages`: read-around window and async step.
    pub window_bytes: u64,
    pub fault_around_bytes: u64,
}

/// The kernel's fault-around default (mm/memory.c).
pub const FAULT_AROUND_DEFAULT: u64 = 64 << 10;

/// The readahead the traced run had: its model device's `read_ahead_kb`,
/// doubled because llama.cpp advises `POSIX_FADV_SEQUENTIAL` on the file it
/// maps (llama-mmap.cpp; the kernel then sets the file's `ra_pages` to
/// twice the device's), and the kernel's fault-around. `None` for traces
/// recorded before ttrace kept them.
pub fn recorded_readahead(a: &Analysis) -> Option<Readahead> {
    let kb = a.models.iter().flat_map(|m| &m.file_info).find_map(|f| f.read_ahead_kb)?;
    let fault_around = a.trailer.as_ref().and_then(|t| t.fault_around_bytes).unwrap_or(FAULT_AROUND_DEFAULT);
    Some(Readahead { window_bytes: 2 * u64::from(kb) * 1024, fault_around_bytes: fault_around })
}

/// Pages missed, per period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misses {
    pub pages: [u64; 5],
}

impl Counting {
    /// Whether accesses in `period` count.
    pub fn counts(self, period: Period) -> bool {
        self == Counting::All || period == Period::Generate
    }
}

impl Misses {
    pub fn counted(&self, counting: Counting) -> u64 {
        PERIODS.into_iter().filter(|&p| counting.counts(p)).map(|p| self.pages[p.index()]).sum()
    }
}

/// Why the walk feeding the replay stopped early.
#[derive(Debug)]
enum Stop {
    Trace(TraceError),
    /// The token window ended before this ubatch.
    WindowEnd(u32),
}

impl From<TraceError> for Stop {
    fn from(e: TraceError) -> Stop {
        Stop::Trace(e)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(
        "the trace has no op reading a model file, so there is nothing to replay (trace a run of a GGUF model \
         with `ttrace run`; copies made with --no-mmap or repacked weights are not read from the file)"
    )]
    NoModelReads,
    #[error("--layout: layer {layer} has {given} experts in the permutation but {tensor} has {actual}")]
    LayoutMismatch { layer: u32, given: usize, tensor: String, actual: u64 },
}

/// The replayed stream and what it counts.
pub struct Replay {
    pub stream: Stream,
    pub page_bytes: u64,
    /// Generated tokens replayed (tokens of generate ubatches).
    pub generated_tokens: u64,
    /// Where the replay stopped, when before the trace's end.
    pub cut: Option<Cut>,
    /// Whether loading was replayed as a sequential read.
    pub populate: bool,
    /// The readahead replayed (from [`Options`]).
    pub readahead: Option<Readahead>,
    pub engine: Engine,
    /// Model-file pages the run's ops read at least once.
    pub footprint_pages: u64,
    /// Anonymous memory the ops touched: the pages of every KV-cache,
    /// compute-buffer and weight-copy tensor they read or wrote (what is
    /// resident, not what was allocated: a compute buffer sized for a
    /// 512-token batch is mostly never touched by decoding).
    pub anon_bytes: u64,
}

/// Reads the trace once into a [`Replay`].
/// `touched_anon`: collect the anonymous pages the ops touch (`--anon
/// auto`'s fallback for traces that recorded no peak; inserting them was a
/// sixth of a long trace's replay).
pub fn replay(
    path: &Path,
    a: &Analysis,
    options: &Options,
    touched_anon: bool,
    progress: &ProgressBar,
) -> Result<Replay, SimulateError> {
    let populate = options.populate.unwrap_or(LoadMode::from_command(&a.header.command) == LoadMode::Default);
    let mut sink = Collector {
        builder: StreamBuilder::default(),
        page: options.page_bytes,
        layout: options.layout.as_ref(),
        routed: routed_experts(a),
        error: None,
        touched_anon,
        anon: rangemap::RangeSet::new(),
        anon_seen: Default::default(),
        window: window::Windowing::new(options.tokens, a),
    };
    sink.builder.period(Period::Load);
    for (m, model) in a.models.iter().enumerate() {
        let mut files: Vec<(u32, u64)> = Vec::new();
        for t in &model.tensors {
            match files.iter_mut().find(|(f, _)| *f == t.file) {
                Some((_, end)) => *end = (*end).max(t.file_offset + t.size_bytes),
                None => files.push((t.file, t.file_offset + t.size_bytes)),
            }
        }
        for (file, end) in files {
            let size = model.file_info.get(file as usize).map_or(end, |f| f.size.max(end));
            let key = file_key(m as u32, file);
            sink.builder.extent(key, size.div_ceil(sink.page));
            if populate {
                sink.builder.access(key, 0..end.div_ceil(sink.page));
            }
        }
    }
    let cut = match walk::walk(path, a, progress, &mut sink) {
        Ok(()) => None,
        Err(Stop::WindowEnd(ubatch)) => Some(sink.window.cut(ubatch)),
        Err(Stop::Trace(e)) => return Err(e.into()),
    };
    if let Some(e) = sink.error {
        return Err(e);
    }
    if sink.builder.is_empty() {
        return Err(SimulateError::NoModelReads);
    }
    let stream = sink.builder.build();
    let generated_tokens = window::generated_tokens(a, cut.map(|c| c.ubatch));
    let footprint_pages = footprint(&stream);
    let anon_bytes = sink.anon.iter().map(|r| r.end - r.start).sum();
    Ok(Replay {
        stream,
        page_bytes: options.page_bytes,
        generated_tokens,
        cut,
        populate,
        readahead: options.readahead,
        engine: options.engine,
        footprint_pages,
        anon_bytes,
    })
}

/// Pages of atoms read at least once after loading.
fn footprint(stream: &Stream) -> u64 {
    let mut seen = vec![false; stream.atom_pages.len()];
    let mut pages = 0;
    for (atom, period) in stream.iter() {
        if period != Period::Load && !std::mem::replace(&mut seen[atom as usize], true) {
            pages += u64::from(stream.atom_pages[atom as usize]);
        }
    }
    pages
}

/// Distinct per (model, file).
fn file_key(model: u32, file: u32) -> u32 {
    (model << 16) | (file & 0xffff)
}

/// `(model, file)` of a [`file_key`].
fn file_of_key(key: u32) -> (u32, u32) {
    (key >> 16, key & 0xffff)
}

struct Collector<'a> {
    builder: StreamBuilder,
    touched_anon: bool,
    /// Pages of anonymous memory (KV cache, compute buffers, weight
    /// copies) some op read or wrote, by address.
    anon: rangemap::RangeSet<u64>,
    /// The page ranges already in `anon`: a decode reads the same tensors
    /// every token, and a set lookup is a fraction of a RangeSet insert
    /// (which was a sixth of a long trace's replay).
    anon_seen: foldhash::HashSet<(u64, u64)>,
    page: u64,
    layout: Option<&'a Permutation>,
    routed: std::collections::BTreeMap<(u32, u32), std::collections::BTreeSet<u32>>,
    error: Option<SimulateError>,
    window: window::Windowing<'a>,
}

impl Sink for Collector<'_> {
    type Error = Stop;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), Stop> {
        let Event::Op(e) = event else { return Ok(()) };
        if self.window.ends_before(e.ctx.ubatch) {
            return Err(Stop::WindowEnd(e.ctx.ubatch.expect("a window ends before a ubatch")));
        }
        let period = match tables.phase(e.ctx.ubatch) {
            Some(p) => Period::of(p),
            None => Period::Other,
        };
        self.builder.period(period);
        let name = tables.op_name_ref(&e.op);
        if self.touched_anon {
            self.touch_anon(e, tables);
        }
        for &(slot, id) in e.op.srcs.iter() {
            let d = tables.descriptor(id);
            // Copies (repacked, or read in with --no-mmap) live in anonymous
            // memory: reading them touches no file page.
            let Some(w) = weight_of(d).filter(|w| !w.copy) else { continue };
            let Some(t) = model_tensor(tables.models, w.model, w.tensor) else { continue };
            let routed = t.layer.zip(e.ctx.ubatch).and_then(|(layer, u)| self.routed.get(&(u, layer)));
            let start = t.file_offset + w.offset;
            let (ranges, _) = source_ranges(&name, slot, d, t, start, &e.op.token_ids, routed);
            for r in ranges {
                for r in self.relocate(t, r) {
                    let pages = r.start / self.page..r.end.div_ceil(self.page);
                    self.window.pages += pages.end - pages.start;
                    self.builder.access(file_key(w.model, t.file), pages);
                }
            }
        }
        Ok(())
    }
}

impl Collector<'_> {
    /// Adds the anonymous pages op `e` reads or writes to `anon`.
    fn touch_anon(&mut self, e: &OpEvent, tables: &Tables) {
        for id in std::iter::once(e.op.dst).chain(e.op.srcs.iter().map(|s| s.1)) {
            let d = tables.descriptor(id);
            if matches!(d.memory, Memory::Anon | Memory::Copy { .. })
                && let Some(bytes) = view_bytes(d).filter(|&b| b > 0)
            {
                let pages = (d.data / self.page * self.page, (d.data + bytes).div_ceil(self.page) * self.page);
                if self.anon_seen.insert(pages) {
                    self.anon.insert(pages.0..pages.1);
                }
            }
        }
    }

    /// Where byte range `r` of tensor `t` lies in the permuted layout: an
    /// expert tensor's slice of expert `e` moves to the position `p` with
    /// `perm[p] == e`; everything else stays.
    fn relocate(&mut self, t: &ModelTensor, r: std::ops::Range<u64>) -> Vec<std::ops::Range<u64>> {
        let (Some(perm), true, Some(slice), Some(layer)) = (self.layout, is_expert_tensor(t), t.expert_bytes, t.layer)
        else {
            return vec![r];
        };
        let Some(order) = perm.get(&layer).filter(|_| slice > 0) else { return vec![r] };
        let experts = t.size_bytes / slice;
        if order.len() as u64 != experts {
            self.error.get_or_insert(SimulateError::LayoutMismatch {
                layer,
                given: order.len(),
                tensor: t.name.clone(),
                actual: experts,
            });
            return vec![r];
        }
        let mut position = vec![0u64; order.len()];
        for (p, &e) in order.iter().enumerate() {
            position[e as usize] = p as u64;
        }
        let mut out = Vec::new();
        let mut at = r.start;
        while at < r.end {
            let e = (at - t.file_offset) / slice;
            let upto = r.end.min(t.file_offset + (e + 1) * slice);
            let moved = t.file_offset + position[e as usize] * slice;
            let within = at - (t.file_offset + e * slice);
            out.push(moved + within..moved + within + (upto - at));
            at = upto;
        }
        out
    }
}

/// One row of the result: a budget under a policy.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub budget_bytes: u64,
    /// Bytes left for the model's pages: the budget less anonymous memory.
    pub cache_bytes: u64,
    pub policy: Policy,
    pub disk_bytes: u64,
    pub disk_bytes_per_token: Option<f64>,
    pub misses: u64,
}

/// The smallest cache, in pages, at which generation under LRU reads
/// nothing again: only pages it reads for the first time (none, when
/// loading read the whole file), which `cold_pages` counts.
pub struct Fit {
    pub pages: u64,
    pub cold_pages: u64,
}

pub fn lru_fit(curve: &LruCurve) -> Fit {
    Fit { pages: curve.max_need(Period::Generate), cold_pages: curve.misses(u64::MAX).pages[Period::Generate.index()] }
}
