//! Loaded vs used: per tensor, MoE expert, layer and in total, which model
//! bytes entered the page cache, which were read from disk, and which some op
//! actually read, per period of the run.
//!
//! Everything is kept as byte ranges in model-file offsets, so "loaded, never
//! used" is an exact set difference, not a difference of totals:
//! - loaded: page-cache adds (`mm_filemap_add_to_page_cache`), whole folios;
//! - disk: read requests, through the files' extents ([`IoCorrelator::file_ranges`]);
//! - used: the exact ranges ops read ([`walk::Tables::weight_read`]'s rule as
//!   ranges): the rows a GET_ROWS indexed, the routed experts' slices of an
//!   MoE expert tensor, else the view read. A repacked or read-in copy counts
//!   as using the tensor's file range it was made from.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rangemap::RangeSet;
use serde::Serialize;
use tracer_common::{BlockKind, PAGE_SIZE, PageCacheKind, ggml::OP_GET_ROWS};

use super::{
    Analysis, Phase,
    io::IoCorrelator,
    tensor::{is_expert_tensor, model_tensor, weight_access_bytes, weight_of},
    walk::{Event, Tables},
};
use crate::format::{Descriptor, ModelTensor};

/// When in the run bytes were loaded, read or used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// Before the first graph: model loading.
    Load,
    Warmup,
    Prompt,
    Generate,
    /// Auxiliary graphs and time between graphs.
    Other,
}

pub const PERIODS: [Period; 5] = [Period::Load, Period::Warmup, Period::Prompt, Period::Generate, Period::Other];

impl Period {
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn of(phase: Phase) -> Period {
        match phase {
            Phase::Warmup => Period::Warmup,
            Phase::Prompt => Period::Prompt,
            Phase::Generate => Period::Generate,
            Phase::Aux => Period::Other,
        }
    }
}

/// How the target loaded the model, from its command line (llama.cpp's
/// `-lm/--load-mode`, or the older `--no-mmap` / `--mlock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// llama.cpp's default: mmap with the MAP_POPULATE prefetch.
    Default,
    Mmap,
    /// Read into buffers (`-lm none`, `--no-mmap`).
    NoMmap,
    Mlock,
    MmapMlock,
    DirectIo,
}

impl LoadMode {
    pub fn from_command(command: &[String]) -> LoadMode {
        let mut mode = LoadMode::Default;
        let mut args = command.iter().map(String::as_str);
        while let Some(arg) = args.next() {
            let value = match arg.split_once('=') {
                Some(("-lm" | "--load-mode", v)) => Some(v),
                _ if arg == "-lm" || arg == "--load-mode" => args.next(),
                _ => None,
            };
            mode = match (arg, value) {
                (_, Some("none")) => LoadMode::NoMmap,
                (_, Some("mmap")) => LoadMode::Mmap,
                (_, Some("mlock")) => LoadMode::Mlock,
                (_, Some("mmap+mlock")) => LoadMode::MmapMlock,
                (_, Some("dio")) => LoadMode::DirectIo,
                (_, Some(_)) => LoadMode::Default,
                ("--no-mmap", None) => LoadMode::NoMmap,
                ("--mlock", None) => LoadMode::MmapMlock,
                _ => mode,
            };
        }
        mode
    }
}

/// Distinct bytes in one period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeriodBytes {
    pub loaded: u64,
    pub disk: u64,
    pub used: u64,
    /// Disk bytes with re-reads, and page faults.
    pub disk_read: u64,
    pub faults: u64,
}

/// Loaded, read and used bytes of one span of the model (a tensor, an
/// expert's slices, a layer, everything).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    pub size_bytes: u64,
    /// Distinct bytes over the whole run.
    pub loaded: u64,
    pub disk: u64,
    pub used: u64,
    /// Loaded (or read from disk), never read by any op.
    pub loaded_unused: u64,
    pub disk_unused: u64,
    /// Bytes read from disk counting every re-read (a memory-limited run
    /// reads the same bytes again).
    pub disk_read: u64,
    /// Page faults on it.
    pub faults: u64,
    pub periods: BTreeMap<Period, PeriodBytes>,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.size_bytes += o.size_bytes;
        self.loaded += o.loaded;
        self.disk += o.disk;
        self.used += o.used;
        self.loaded_unused += o.loaded_unused;
        self.disk_unused += o.disk_unused;
        self.disk_read += o.disk_read;
        self.faults += o.faults;
        for (p, b) in &o.periods {
            let mine = self.periods.entry(*p).or_default();
            mine.loaded += b.loaded;
            mine.disk += b.disk;
            mine.used += b.used;
            mine.disk_read += b.disk_read;
            mine.faults += b.faults;
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TensorUsage {
    pub model: u32,
    pub tensor: u32,
    pub name: String,
    pub layer: Option<u32>,
    #[serde(flatten)]
    pub figures: Figures,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExpertUsage {
    pub model: u32,
    pub layer: u32,
    pub expert: u32,
    /// The expert's slices of the layer's expert tensors, summed.
    #[serde(flatten)]
    pub figures: Figures,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerUsage {
    /// `None`: tensors outside any layer (embedding, output).
    pub layer: Option<u32>,
    #[serde(flatten)]
    pub figures: Figures,
}

#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub load_mode: LoadMode,
    /// The page cache was dropped before the run, so "loaded" is everything
    /// the run brought in; otherwise pages already cached are not seen.
    pub caches_dropped: bool,
    pub total: Figures,
    pub layers: Vec<LayerUsage>,
    pub experts: Vec<ExpertUsage>,
    pub tensors: Vec<TensorUsage>,
    pub notes: Vec<String>,
}

/// Per model file and period: loaded, disk and used ranges.
#[derive(Default)]
struct FileRanges {
    loaded: [RangeSet<u64>; 5],
    disk: [RangeSet<u64>; 5],
    used: [RangeSet<u64>; 5],
    /// Disk bytes with re-reads: `(from, to)` of every read piece.
    reads: Vec<(u64, u64, Period)>,
    /// Fault offsets.
    faults: Vec<(u64, Period)>,
}

/// The walk sink: collects ranges, then [`Collector::finish`] cuts them by tensor.
pub struct Collector {
    io: IoCorrelator,
    files: BTreeMap<(u32, u32), FileRanges>,
    /// (ubatch, layer) → experts routed.
    routed: BTreeMap<(u32, u32), BTreeSet<u32>>,
    graphs_seen: bool,
    /// Read requests issued and not completed: `(dev, sector)`.
    in_flight: HashSet<(u32, u64)>,
    notes: BTreeSet<String>,
}

impl Collector {
    pub fn new(a: &Analysis) -> Collector {
        let mut io = IoCorrelator::default();
        for (i, m) in a.models.iter().enumerate() {
            io.on_model(i as u32, m);
        }
        Collector {
            io,
            files: BTreeMap::new(),
            routed: routed_experts(a),
            graphs_seen: false,
            in_flight: HashSet::new(),
            notes: BTreeSet::new(),
        }
    }

    fn period(&mut self, ubatch: Option<u32>, tables: &Tables) -> Period {
        match tables.phase(ubatch) {
            Some(p) => {
                self.graphs_seen = true;
                Period::of(p)
            }
            None if self.graphs_seen => Period::Other,
            None => Period::Load,
        }
    }

    pub fn event(&mut self, event: &Event, tables: &Tables) {
        match event {
            Event::PageCache(ctx, p) if p.kind == PageCacheKind::Add => {
                let period = self.period(ctx.ubatch, tables);
                if let Some(file) = p.file {
                    let from = p.index * PAGE_SIZE;
                    let to = (p.index + (1u64 << p.order.min(20))) * PAGE_SIZE;
                    self.files.entry(file).or_default().loaded[period.index()].insert(from..to);
                }
            }
            Event::Block(_, b) if b.kind == BlockKind::Complete => {
                self.in_flight.remove(&(b.dev, b.sector));
            }
            Event::Block(ctx, b) if b.rwbs.contains('R') => {
                let period = self.period(ctx.ubatch, tables);
                // A requeued request is issued again: its bytes were read once
                // (as `IoCorrelator` counts them).
                if !self.in_flight.insert((b.dev, b.sector)) {
                    return;
                }
                for (model, file, from, to) in self.io.file_ranges(b.dev, b.sector, b.nr_sector) {
                    if from < to {
                        let f = self.files.entry((model, file)).or_default();
                        f.disk[period.index()].insert(from..to);
                        // Cut into MAX_READ pieces, which `figures` relies on.
                        let mut at = from;
                        while at < to {
                            let upto = to.min(at + MAX_READ);
                            f.reads.push((at, upto, period));
                            at = upto;
                        }
                    }
                }
            }
            Event::Fault(f) => {
                let period = self.period(f.ctx.ubatch, tables);
                if let Some(hit) = f.hit {
                    self.files.entry((hit.model, hit.file)).or_default().faults.push((hit.file_offset, period));
                }
            }
            Event::Op(e) => {
                let period = self.period(e.ctx.ubatch, tables);
                let name = tables.op_name_ref(&e.op);
                for &(slot, id) in e.op.srcs.iter() {
                    let d = tables.descriptor(id);
                    let Some(w) = weight_of(d) else { continue };
                    let Some(t) = model_tensor(tables.models, w.model, w.tensor) else { continue };
                    let start = t.file_offset + w.offset;
                    let routed = t.layer.zip(e.ctx.ubatch).and_then(|(layer, u)| self.routed.get(&(u, layer)));
                    let (ranges, whole) = source_ranges(&name, slot, d, t, start, &e.op.token_ids, routed);
                    if let Some(whole) = whole {
                        self.notes.insert(whole.note(&t.name));
                    }
                    let used = &mut self.files.entry((w.model, t.file)).or_default().used[period.index()];
                    for r in ranges {
                        // Most reads repeat one seen before (every token reads
                        // the same weights): looking is cheaper than inserting,
                        // which takes the covering range out and puts it back.
                        if used.gaps(&r).next().is_some() {
                            used.insert(r);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    pub fn finish(self, a: &Analysis) -> Usage {
        let mut tensors = Vec::new();
        let mut experts: BTreeMap<(u32, u32, u32), Figures> = BTreeMap::new();
        let empty = FileRanges::default();
        let mut files = self.files;
        for f in files.values_mut() {
            f.reads.sort_unstable();
            f.faults.sort_unstable();
        }
        for (m, model) in a.models.iter().enumerate() {
            for (i, t) in model.tensors.iter().enumerate() {
                let f = files.get(&(m as u32, t.file)).unwrap_or(&empty);
                let span = t.file_offset..t.file_offset + t.size_bytes;
                if let (true, Some(slice), Some(layer)) = (is_expert_tensor(t), t.expert_bytes, t.layer)
                    && slice > 0
                {
                    for e in 0..t.size_bytes / slice {
                        let from = span.start + e * slice;
                        let fig = figures(f, from..from + slice);
                        experts.entry((m as u32, layer, e as u32)).or_default().add(&fig);
                    }
                }
                tensors.push(TensorUsage {
                    model: m as u32,
                    tensor: i as u32,
                    name: t.name.clone(),
                    layer: t.layer,
                    figures: figures(f, span),
                });
            }
        }
        let mut layers: BTreeMap<Option<u32>, Figures> = BTreeMap::new();
        let mut total = Figures::default();
        for t in &tensors {
            layers.entry(t.layer).or_default().add(&t.figures);
            total.add(&t.figures);
        }
        let caches_dropped = a.header.options.drop_caches;
        let mut notes: Vec<String> = self.notes.into_iter().collect();
        if !a.header.options.io {
            notes.push("this trace has no I/O records: loaded and disk bytes are unknown (0)".into());
        } else if !caches_dropped {
            notes.push(
                "the page cache was not dropped before the run: pages already cached count as neither \
                 loaded nor read (trace with --drop-caches for a cold start)"
                    .into(),
            );
        }
        Usage {
            load_mode: LoadMode::from_command(&a.header.command),
            caches_dropped,
            total,
            layers: layers.into_iter().map(|(layer, figures)| LayerUsage { layer, figures }).collect(),
            experts: experts
                .into_iter()
                .map(|((model, layer, expert), figures)| ExpertUsage { model, layer, expert, figures })
                .collect(),
            tensors,
            notes,
        }
    }
}

/// Per (ubatch, layer): the experts its tokens were routed to.
pub fn routed_experts(a: &Analysis) -> BTreeMap<(u32, u32), BTreeSet<u32>> {
    let mut routed: BTreeMap<(u32, u32), BTreeSet<u32>> = BTreeMap::new();
    for u in &a.ubatches {
        for r in &u.routing {
            if let Some(layer) = r.layer {
                let experts = r.selected.iter().filter_map(|&e| u32::try_from(e).ok());
                routed.entry((u.index, layer)).or_default().extend(experts);
            }
        }
    }
    routed
}

/// Why [`source_ranges`] counted a source's whole view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whole {
    /// A GET_ROWS whose row ids were not recorded.
    RowsUnrecorded,
    /// An MoE expert tensor whose ubatch's routing was not recorded.
    RoutingUnrecorded,
}

impl Whole {
    /// The report's note on `tensor`.
    pub fn note(self, tensor: &str) -> String {
        match self {
            Whole::RowsUnrecorded => {
                format!("{tensor}: the rows GET_ROWS read were not recorded, so its whole view counts as used")
            }
            Whole::RoutingUnrecorded => format!("{tensor}: its routing was not recorded, so it counts as used whole"),
        }
    }
}

/// The model-file ranges op source `slot` (descriptor `d`, model tensor `t`,
/// its view starting at file offset `start`) reads: the rows a GET_ROWS
/// indexed (`ids`), the `routed` experts' slices of an MoE expert tensor,
/// else the view.
#[allow(clippy::too_many_arguments)]
pub fn source_ranges(
    op_name: &str,
    slot: u32,
    d: &Descriptor,
    t: &ModelTensor,
    start: u64,
    ids: &[i32],
    routed: Option<&BTreeSet<u32>>,
) -> (Vec<std::ops::Range<u64>>, Option<Whole>) {
    let end = t.file_offset + t.size_bytes;
    let view = start..(start + weight_access_bytes(d, t)).min(end);
    if op_name == OP_GET_ROWS && slot == 0 {
        if ids.is_empty() {
            return (vec![view], Some(Whole::RowsUnrecorded));
        }
        let row = d.nb[1];
        let rows = ids
            .iter()
            .filter_map(|&id| u64::try_from(id).ok())
            .map(|id| (start + id * row).min(end)..(start + (id + 1) * row).min(end))
            .filter(|r| r.start < r.end)
            .collect();
        return (rows, None);
    }
    if let (true, Some(slice), Some(_)) = (is_expert_tensor(t), t.expert_bytes, t.layer) {
        let Some(experts) = routed else { return (vec![view], Some(Whole::RoutingUnrecorded)) };
        let slices = experts
            .iter()
            .map(|&e| {
                let from = t.file_offset + u64::from(e) * slice;
                from.min(end)..(from + slice).min(end)
            })
            .filter(|r| r.start < r.end)
            .collect();
        return (slices, None);
    }
    (vec![view], None)
}

/// Longest read piece kept (longer ones are cut), so a span's overlapping
/// reads start at most this far before it.
const MAX_READ: u64 = 64 << 20;

/// Figures of one span of one file.
fn figures(f: &FileRanges, span: std::ops::Range<u64>) -> Figures {
    let mut fig = Figures { size_bytes: span.end - span.start, ..Default::default() };
    let all = |sets: &[RangeSet<u64>; 5]| {
        let mut u = RangeSet::new();
        for s in sets {
            for r in s.overlapping(&span) {
                u.insert(r.start.max(span.start)..r.end.min(span.end));
            }
        }
        u
    };
    let (loaded, disk, used) = (all(&f.loaded), all(&f.disk), all(&f.used));
    fig.loaded = covered(&loaded, &span);
    fig.disk = covered(&disk, &span);
    fig.used = covered(&used, &span);
    fig.loaded_unused = fig.loaded - covered_both(&loaded, &used, &span);
    fig.disk_unused = fig.disk - covered_both(&disk, &used, &span);
    // Reads are sorted by start and none is longer than MAX_READ.
    let first = f.reads.partition_point(|&(from, _, _)| from.saturating_add(MAX_READ) <= span.start);
    let mut disk_read = [0u64; 5];
    for &(from, to, p) in f.reads[first..].iter().take_while(|&&(from, _, _)| from < span.end) {
        if to > span.start {
            disk_read[p.index()] += to.min(span.end) - from.max(span.start);
        }
    }
    let first = f.faults.partition_point(|&(o, _)| o < span.start);
    let mut faults = [0u64; 5];
    for &(_, p) in f.faults[first..].iter().take_while(|&&(o, _)| o < span.end) {
        faults[p.index()] += 1;
    }
    fig.disk_read = disk_read.iter().sum();
    fig.faults = faults.iter().sum();
    for p in PERIODS {
        let bytes = PeriodBytes {
            loaded: covered(&f.loaded[p.index()], &span),
            disk: covered(&f.disk[p.index()], &span),
            used: covered(&f.used[p.index()], &span),
            disk_read: disk_read[p.index()],
            faults: faults[p.index()],
        };
        if bytes != PeriodBytes::default() {
            fig.periods.insert(p, bytes);
        }
    }
    fig
}

fn covered(set: &RangeSet<u64>, span: &std::ops::Range<u64>) -> u64 {
    set.overlapping(span).map(|r| r.end.min(span.end) - r.start.max(span.start)).sum()
}

fn covered_both(a: &RangeSet<u64>, b: &RangeSet<u64>, span: &std::ops::Range<u64>) -> u64 {
    a.overlapping(span).map(|r| covered(b, &(r.start.max(span.start)..r.end.min(span.end)))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranges: &[(u64, u64)]) -> RangeSet<u64> {
        ranges.iter().map(|&(a, b)| a..b).collect()
    }

    #[test]
    fn loaded_unused_is_a_set_difference() {
        let mut f = FileRanges::default();
        f.loaded[0] = set(&[(0, 8192)]);
        f.used[3] = set(&[(100, 200), (4096, 4196)]);
        f.used[2] = set(&[(150, 300)]);
        f.reads = vec![(0, 4096, Period::Load), (0, 4096, Period::Generate)];
        let fig = figures(&f, 50..5000);
        assert_eq!(fig.size_bytes, 4950);
        assert_eq!((fig.loaded, fig.used, fig.loaded_unused), (4950, 300, 4650));
        assert_eq!((fig.disk, fig.disk_read), (0, 2 * (4096 - 50)));
        assert_eq!(fig.periods[&Period::Generate].used, 200);
        assert_eq!(fig.periods[&Period::Load].disk_read, 4096 - 50);
    }

    #[test]
    fn load_mode_from_the_command_line() {
        let cmd = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(LoadMode::from_command(&cmd("llama-completion -m x")), LoadMode::Default);
        assert_eq!(LoadMode::from_command(&cmd("llama-completion -lm none -m x")), LoadMode::NoMmap);
        assert_eq!(LoadMode::from_command(&cmd("llama-cli --load-mode=mmap+mlock")), LoadMode::MmapMlock);
        assert_eq!(LoadMode::from_command(&cmd("llama-cli --no-mmap")), LoadMode::NoMmap);
    }
}
