//! Figures for `ttrace report` and the HTML page, from one [`walk`]: per
//! ubatch (so per generated token), per phase, per layer, per component and
//! per weight tensor.
//!
//! Weight bytes of a ubatch are summed over the distinct weight tensors it
//! read, each charged by [`Tables::weight_read`] with the largest read in
//! the ubatch: the rows a GET_ROWS looked up, the routed experts' slices of
//! an MoE expert tensor, else the view an op read (the whole tensor for a
//! plain matrix). Per tensor, layer and component, bytes per token are those
//! same charges summed over the generate ubatches, so they add up to the
//! ubatches' `weight_bytes` to the byte. Expert tensors whose layer's
//! routing was not recorded are charged whole, and any figure that then
//! includes them is an upper bound (`upper_bound`). Disk bytes and
//! major/minor faults come from `correlate::io` (block requests mapped to
//! model-file bytes); they are `null` for traces without I/O records.

use std::{collections::BTreeMap, path::Path};

use indicatif::ProgressBar;
use serde::Serialize;
use tracer_common::markers;

use super::io::When;
use super::{
    Analysis, Phase, moe, usage,
    walk::{self, Event, Sink, Tables, WeightRead},
};
use crate::format::TraceError;

#[derive(Clone, Debug, Default, Serialize)]
pub struct UbatchStats {
    pub index: u32,
    pub phase: Option<Phase>,
    /// Which generated token (generate ubatches only).
    pub token_index: Option<u32>,
    pub token_ids: Vec<i32>,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub ops: u64,
    pub weight_tensors: u32,
    pub weight_bytes: u64,
    /// `weight_bytes` includes MoE expert tensors counted whole.
    pub upper_bound: bool,
    pub file_backed_accesses: u64,
    pub copy_accesses: u64,
    pub faults: u64,
    /// Faults whose address is inside a model file mapping.
    pub model_faults: u64,
    /// Model-file bytes read from disk during the graph (`null`: no I/O records).
    pub disk_bytes: Option<u64>,
    pub faults_major: Option<u64>,
    pub faults_minor: Option<u64>,
    /// Model tensors with bytes read from disk during the graph.
    pub disk_tensors: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseStats {
    /// `load` (before the first graph), `warmup`, `prompt`, `generate`, `aux`.
    pub phase: &'static str,
    pub ubatches: u64,
    pub tokens: u64,
    pub duration_ns: u64,
    pub ops: u64,
    pub weight_bytes: u64,
    pub faults: u64,
    pub disk_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GroupStats {
    /// Layer number, or a component name.
    pub key: String,
    pub tensors: u64,
    pub size_bytes: u64,
    /// Weight bytes its tensors were charged over all generate ubatches
    /// (see the module comment); summed over the groups, the generate
    /// ubatches' `weight_bytes`.
    pub generate_weight_bytes: u64,
    /// Mean weight bytes per generated token: `generate_weight_bytes` over
    /// the generate ubatches.
    pub bytes_per_token: f64,
    /// Includes an MoE expert tensor charged whole (routing not recorded).
    pub upper_bound: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TensorStats {
    pub model: u32,
    pub tensor: u32,
    pub name: String,
    pub file_offset: u64,
    pub size_bytes: u64,
    pub layer: Option<u32>,
    pub component: String,
    /// Generated tokens whose ubatch read it.
    pub tokens_touched: u64,
    /// Weight bytes it was charged over all generate ubatches (see the
    /// module comment), and their mean per generated token.
    pub generate_weight_bytes: u64,
    pub bytes_per_token: f64,
    pub ubatches_touched: u64,
    pub file_backed_accesses: u64,
    pub copy_accesses: u64,
    pub faults: u64,
    /// Bytes of it read from disk over the whole run (`null`: no I/O records).
    pub disk_bytes: Option<u64>,
    /// A generate ubatch charged it whole: an MoE expert tensor whose
    /// routing was not recorded.
    pub upper_bound: bool,
    /// Per ubatch: 0 untouched, 1 read via the file, 2 read as a copy, +4
    /// faulted, +8 bytes of it read from disk (`correlate::io`).
    #[serde(skip)]
    pub cells: Vec<u8>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub ubatches: Vec<UbatchStats>,
    pub phases: Vec<PhaseStats>,
    pub layers: Vec<GroupStats>,
    pub components: Vec<GroupStats>,
    pub tensors: Vec<TensorStats>,
    pub faults_outside_ubatches: u64,
    /// Loaded vs used, per tensor, expert, layer and in total.
    pub loaded_vs_used: Option<usage::Usage>,
    /// `None` for a model without MoE routing.
    pub moe: Option<moe::MoeStats>,
    /// Per request (a sequence's prompt and generation; see `sequences`).
    pub requests: Vec<RequestStats>,
    pub notes: Vec<String>,
}

/// What request `index` (of `Analysis::requests`) cost, as its share of the
/// ubatches it had tokens in: a ubatch that mixes several requests splits its
/// weight bytes, disk bytes and faults between them by their token counts.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestStats {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub weight_bytes_per_token: f64,
    pub disk_bytes: Option<f64>,
    pub faults: f64,
}

#[derive(Default)]
struct Collector {
    stats: Stats,
    /// The ubatch being summed: (model, tensor) → its charge so far.
    /// Hashed, not ordered: looked up per op and weight (a B-tree's
    /// search was a tenth of the pass), and only summed.
    open: foldhash::HashMap<u32, foldhash::HashMap<(u32, u32), Charge>>,
    tensor_index: foldhash::HashMap<(u32, u32), usize>,
    usage: Option<usage::Collector>,
}

pub fn collect(trace: &Path, a: &Analysis, progress: &ProgressBar) -> Result<Stats, TraceError> {
    let token_of = walk::token_indices(a);
    let mut c = Collector { usage: Some(usage::Collector::new(a)), ..Default::default() };
    c.stats.ubatches = a
        .ubatches
        .iter()
        .map(|u| UbatchStats {
            index: u.index,
            phase: Some(u.phase),
            token_index: token_of[u.index as usize],
            token_ids: u.token_ids.clone(),
            start_ns: u.start_ns,
            duration_ns: u.end_ns.unwrap_or(u.start_ns).saturating_sub(u.start_ns),
            ..Default::default()
        })
        .collect();
    for (m, model) in a.models.iter().enumerate() {
        for (t, x) in model.tensors.iter().enumerate() {
            c.tensor_index.insert((m as u32, t as u32), c.stats.tensors.len());
            c.stats.tensors.push(TensorStats {
                model: m as u32,
                tensor: t as u32,
                name: x.name.clone(),
                file_offset: x.file_offset,
                size_bytes: x.size_bytes,
                layer: x.layer,
                component: x.component.clone(),
                cells: vec![0; a.ubatches.len()],
                ..Default::default()
            });
        }
    }
    walk::walk(trace, a, progress, &mut c)?;
    let mut stats = c.stats;
    finish(&mut stats, a);
    let usage = c.usage.map(|u| u.finish(a));
    stats.moe = usage.as_ref().and_then(|u| moe::collect(a, u));
    stats.loaded_vs_used = usage;
    Ok(stats)
}

impl Sink for Collector {
    type Error = TraceError;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), TraceError> {
        if let Some(u) = &mut self.usage {
            u.event(event, tables);
        }
        match event {
            Event::Op(e) => {
                let Some(u) = e.ctx.ubatch else { return Ok(()) };
                let Some(us) = self.stats.ubatches.get_mut(u as usize) else { return Ok(()) };
                us.ops += 1;
                let open = self.open.entry(u).or_default();
                let name = tables.op_name_ref(&e.op);
                let slotted = tables.slotted(&e.op);
                for &source in &slotted {
                    let Some(read) = tables.weight_read(&name, Some(u), source, &slotted) else { continue };
                    let w = read.weight;
                    open.entry((w.model, w.tensor)).or_default().add(&read);
                    if w.copy {
                        us.copy_accesses += 1;
                    } else {
                        us.file_backed_accesses += 1;
                    }
                    if let Some(&i) = self.tensor_index.get(&(w.model, w.tensor)) {
                        let ts = &mut self.stats.tensors[i];
                        if w.copy {
                            ts.copy_accesses += 1;
                            ts.cells[u as usize] |= 2;
                        } else {
                            ts.file_backed_accesses += 1;
                            ts.cells[u as usize] |= 1;
                        }
                    }
                }
            }
            Event::Marker(ctx, m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                let Some(u) = ctx.ubatch else { return Ok(()) };
                let charges = self.open.remove(&u).unwrap_or_default();
                let Some(us) = self.stats.ubatches.get_mut(u as usize) else { return Ok(()) };
                let generate = us.phase == Some(Phase::Generate);
                for (key, c) in &charges {
                    us.weight_tensors += 1;
                    us.weight_bytes += c.bytes;
                    us.upper_bound |= c.upper_bound;
                    // Per tensor, the same charges: the tables then sum to the ubatches.
                    if generate && let Some(&i) = self.tensor_index.get(key) {
                        let ts = &mut self.stats.tensors[i];
                        ts.generate_weight_bytes += c.bytes;
                        ts.upper_bound |= c.upper_bound;
                    }
                }
            }
            Event::Fault(f) => {
                let us = f.ctx.ubatch.and_then(|u| self.stats.ubatches.get_mut(u as usize));
                match us {
                    Some(us) => {
                        us.faults += 1;
                        us.model_faults += u64::from(f.hit.is_some());
                    }
                    None => self.stats.faults_outside_ubatches += 1,
                }
                if let (Some(hit), Some(u)) = (f.hit, f.ctx.ubatch)
                    && let Some(t) = hit.tensor
                    && let Some(&i) = self.tensor_index.get(&(hit.model, t))
                {
                    let ts = &mut self.stats.tensors[i];
                    ts.faults += 1;
                    if let Some(cell) = ts.cells.get_mut(u as usize) {
                        *cell |= 4;
                    }
                } else if let Some(hit) = f.hit
                    && let Some(t) = hit.tensor
                    && let Some(&i) = self.tensor_index.get(&(hit.model, t))
                {
                    self.stats.tensors[i].faults += 1;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn finish(s: &mut Stats, a: &Analysis) {
    let io = &a.io;
    // I/O tracing ran (its tracepoints are in the trailer), even where it saw
    // nothing: a warm run reads 0 bytes from disk, which is not "n/a".
    let traced_io = a.trailer.as_ref().is_some_and(|t| t.tracepoints.is_some());
    let has_io = traced_io || io.disk.issues > 0 || io.page_cache_adds > 0;
    if has_io {
        for u in &mut s.ubatches {
            let w = io.by_when.get(&When::Ubatch(u.index));
            u.disk_bytes = Some(w.map_or(0, |w| w.disk.bytes));
            u.faults_major = Some(w.map_or(0, |w| w.faults_major));
            u.faults_minor = Some(w.map_or(0, |w| w.faults_minor));
        }
        let index: BTreeMap<(u32, u32), usize> =
            s.tensors.iter().enumerate().map(|(i, t)| ((t.model, t.tensor), i)).collect();
        for e in &io.ubatch_tensor_bytes {
            let Some(t) = e.tensor else { continue };
            if let Some(u) = s.ubatches.get_mut(e.ubatch as usize) {
                *u.disk_tensors.get_or_insert(0) += 1;
            }
            let i = index.get(&(e.model, t));
            if let Some(cell) = i.and_then(|&i| s.tensors[i].cells.get_mut(e.ubatch as usize)) {
                *cell |= 8;
            }
        }
        s.ubatches.iter_mut().for_each(|u| {
            u.disk_tensors.get_or_insert(0);
        });
        let read: BTreeMap<(u32, u32), u64> = io.tensors.iter().map(|t| ((t.model, t.tensor), t.bytes_read)).collect();
        for t in &mut s.tensors {
            t.disk_bytes = Some(read.get(&(t.model, t.tensor)).copied().unwrap_or(0));
        }
    }
    let n_gen = s.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).count().max(1) as f64;
    for t in &mut s.tensors {
        for (u, &cell) in s.ubatches.iter().zip(&t.cells) {
            if cell & 3 != 0 {
                t.ubatches_touched += 1;
                t.tokens_touched += u64::from(u.phase == Some(Phase::Generate));
            }
        }
        t.bytes_per_token = t.generate_weight_bytes as f64 / n_gen;
    }
    (s.layers, s.components) = groups(&s.tensors, n_gen);

    let first_graph = a.ubatches.first().map(|u| u.start_ns);
    let load_end = first_graph.or(a.last_ts_ns).unwrap_or(0);
    // From the target's own first event, not the trace's start: ttrace's
    // attaching and cache dropping happen before that and are not loading.
    let load_start = a.first_ts_ns.unwrap_or(a.header.start_monotonic_ns);
    let mut load = PhaseStats {
        phase: "load",
        duration_ns: load_end.saturating_sub(load_start),
        faults: s.faults_outside_ubatches,
        ops: a.ops_outside_ubatches,
        ..Default::default()
    };
    load.disk_bytes = has_io.then(|| io.by_when.get(&When::Load).map_or(0, |w| w.disk.bytes));
    s.phases.push(load);
    for (phase, name) in
        [(Phase::Warmup, "warmup"), (Phase::Prompt, "prompt"), (Phase::Generate, "generate"), (Phase::Aux, "aux")]
    {
        let mut p = PhaseStats { phase: name, ..Default::default() };
        for (u, au) in s.ubatches.iter().zip(&a.ubatches).filter(|(u, _)| u.phase == Some(phase)) {
            p.ubatches += 1;
            p.tokens += u64::from(au.n_tokens.unwrap_or(0));
            p.duration_ns += u.duration_ns;
            p.ops += u.ops;
            p.weight_bytes += u.weight_bytes;
            p.faults += u.faults;
            if let Some(d) = u.disk_bytes {
                *p.disk_bytes.get_or_insert(0) += d;
            }
        }
        s.phases.push(p);
    }
    s.requests = a.requests.iter().map(|r| request_stats(r, s, a)).collect();
    if s.ubatches.iter().any(|u| u.upper_bound) {
        s.notes.push(
            "some MoE expert tensors are counted whole: their routing was not recorded (no \
             ffn_moe_argsort node, or its records were lost), so weight bytes that include them are an \
             upper bound (marked *)"
                .into(),
        );
    }
    if !has_io {
        s.notes.push("this trace has no I/O records: disk bytes and major/minor faults are unknown".into());
    }
}

fn request_stats(r: &super::sequences::Request, s: &Stats, a: &Analysis) -> RequestStats {
    let mut out = RequestStats { index: r.index, start_ns: u64::MAX, ..Default::default() };
    let mut weight = 0.0;
    for &(u, n) in &r.ubatches {
        let (Some(us), Some(au)) = (s.ubatches.get(u as usize), a.ubatches.get(u as usize)) else { continue };
        let share = f64::from(n) / au.tokens.len().max(1) as f64;
        weight += us.weight_bytes as f64 * share;
        out.faults += us.faults as f64 * share;
        if let Some(d) = us.disk_bytes {
            *out.disk_bytes.get_or_insert(0.0) += d as f64 * share;
        }
        out.start_ns = out.start_ns.min(us.start_ns);
        out.end_ns = out.end_ns.max(us.start_ns + us.duration_ns);
    }
    out.start_ns = out.start_ns.min(out.end_ns);
    out.weight_bytes_per_token = weight / f64::from((r.prompt_tokens + r.generated_tokens).max(1));
    out
}

/// What one ubatch was charged for one weight tensor: its largest read.
#[derive(Clone, Copy, Debug, Default)]
struct Charge {
    bytes: u64,
    upper_bound: bool,
}

impl Charge {
    fn add(&mut self, read: &WeightRead) {
        self.bytes = self.bytes.max(read.bytes);
        self.upper_bound |= read.upper_bound;
    }
}

/// Per layer and per component: their tensors' figures summed.
fn groups(tensors: &[TensorStats], n_gen: f64) -> (Vec<GroupStats>, Vec<GroupStats>) {
    let mut layers: BTreeMap<Option<u32>, GroupStats> = BTreeMap::new();
    let mut components: BTreeMap<&str, GroupStats> = BTreeMap::new();
    for t in tensors {
        for g in [
            layers.entry(t.layer).or_insert_with(|| GroupStats { key: layer_key(t.layer), ..Default::default() }),
            components
                .entry(&t.component)
                .or_insert_with(|| GroupStats { key: t.component.clone(), ..Default::default() }),
        ] {
            g.tensors += 1;
            g.size_bytes += t.size_bytes;
            g.generate_weight_bytes += t.generate_weight_bytes;
            g.upper_bound |= t.upper_bound;
        }
    }
    let mean = |mut g: GroupStats| {
        g.bytes_per_token = g.generate_weight_bytes as f64 / n_gen;
        g
    };
    (layers.into_values().map(mean).collect(), components.into_values().map(mean).collect())
}

pub fn layer_key(layer: Option<u32>) -> String {
    layer.map_or_else(|| "-".to_string(), |l| l.to_string())
}

#[cfg(test)]
pub(crate) mod tests;
