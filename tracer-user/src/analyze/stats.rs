//! Figures for `ttrace report` and the HTML page, from one [`walk`]: per
//! ubatch (so per generated token), per phase, per layer, per component and
//! per weight tensor.
//!
//! Weight bytes of a ubatch are summed over the distinct weight tensors it
//! read, each counted with the largest view read (the whole tensor for a
//! plain matrix). MoE expert tensors count the routed experts' slices when
//! their layer's routing was recorded, else whole, and any figure that then
//! includes them is an upper bound (`upper_bound`). Disk bytes and
//! major/minor faults come from `correlate::io` (block requests mapped to
//! model-file bytes); they are `null` for traces without I/O records.

use std::{collections::BTreeMap, path::Path};

use indicatif::ProgressBar;
use serde::Serialize;
use tracer_common::markers;

use super::io::When;
use super::{
    Analysis, Phase, moe,
    tensor::{is_expert_tensor, model_tensor, op_weight_bytes, weight_of},
    usage,
    walk::{self, Event, Sink, Tables},
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
    /// Weight bytes per layer (`None` = not in a layer).
    #[serde(skip)]
    pub layer_bytes: BTreeMap<Option<u32>, u64>,
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
    /// Mean weight bytes per generated token.
    pub bytes_per_token: f64,
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
    pub ubatches_touched: u64,
    pub file_backed_accesses: u64,
    pub copy_accesses: u64,
    pub faults: u64,
    /// Bytes of it read from disk over the whole run (`null`: no I/O records).
    pub disk_bytes: Option<u64>,
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
    /// The ubatch being summed: (model, tensor) → largest access bytes.
    open: BTreeMap<u32, BTreeMap<(u32, u32), u64>>,
    tensor_index: BTreeMap<(u32, u32), usize>,
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
                upper_bound: is_expert_tensor(x),
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
                let name = tables.op_name(&e.op);
                let slotted: Vec<(u32, &_)> = e.op.srcs.iter().map(|&(s, id)| (s, tables.descriptor(id))).collect();
                for &(slot, d) in &slotted {
                    let Some(w) = weight_of(d) else { continue };
                    let Some(t) = model_tensor(tables.models, w.model, w.tensor) else { continue };
                    let bytes = op_weight_bytes(&name, slot, d, t, &slotted);
                    let slot = open.entry((w.model, w.tensor)).or_default();
                    *slot = (*slot).max(bytes);
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
                let weights = self.open.remove(&u).unwrap_or_default();
                let Some(us) = self.stats.ubatches.get_mut(u as usize) else { return Ok(()) };
                let correlated = tables.analysis.ubatches.get(u as usize);
                for (&(m, t), &bytes) in &weights {
                    // Expert tensors whose routing was recorded: the routed slices.
                    let routed = correlated
                        .and_then(|c| c.weights.get(&(m, t)))
                        .filter(|w| w.routed_experts.is_some())
                        .map(|w| w.bytes);
                    let bytes = routed.unwrap_or(bytes);
                    us.weight_tensors += 1;
                    us.weight_bytes += bytes;
                    let tensor = model_tensor(tables.models, m, t);
                    let whole_experts = tensor.is_some_and(is_expert_tensor) && routed.is_none();
                    us.upper_bound |= whole_experts;
                    if routed.is_some()
                        && let Some(&i) = self.tensor_index.get(&(m, t))
                    {
                        self.stats.tensors[i].upper_bound = false;
                    }
                    *us.layer_bytes.entry(tensor.and_then(|t| t.layer)).or_default() += bytes;
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
    let has_io = io.disk.issues > 0 || io.page_cache_adds > 0;
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
    let generate: Vec<&UbatchStats> = s.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).collect();
    let n_gen = generate.len().max(1) as f64;
    for t in &mut s.tensors {
        for (u, &cell) in s.ubatches.iter().zip(&t.cells) {
            if cell & 3 != 0 {
                t.ubatches_touched += 1;
                t.tokens_touched += u64::from(u.phase == Some(Phase::Generate));
            }
        }
    }
    // Per layer and component: mean bytes per generated token.
    let mut layers: BTreeMap<Option<u32>, GroupStats> = BTreeMap::new();
    let mut components: BTreeMap<String, GroupStats> = BTreeMap::new();
    for t in &s.tensors {
        for g in [
            layers.entry(t.layer).or_insert_with(|| GroupStats { key: layer_key(t.layer), ..Default::default() }),
            components
                .entry(t.component.clone())
                .or_insert_with(|| GroupStats { key: t.component.clone(), ..Default::default() }),
        ] {
            g.tensors += 1;
            g.size_bytes += t.size_bytes;
            g.upper_bound |= t.upper_bound && t.tokens_touched > 0;
        }
    }
    for u in &generate {
        for (layer, &bytes) in &u.layer_bytes {
            if let Some(g) = layers.get_mut(layer) {
                g.bytes_per_token += bytes as f64 / n_gen;
            }
        }
    }
    // Component bytes: the tensors' own largest reads are not kept per ubatch,
    // so use whole-tensor sizes times the share of tokens that touched them.
    for t in &s.tensors {
        if let Some(g) = components.get_mut(&t.component) {
            g.bytes_per_token += t.size_bytes as f64 * t.tokens_touched as f64 / n_gen;
        }
    }
    s.layers = layers.into_values().collect();
    s.components = components.into_values().filter(|g| g.bytes_per_token > 0.0 || g.tensors > 0).collect();

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
    if s.tensors.iter().any(|t| t.upper_bound && t.tokens_touched > 0) {
        s.notes.push(
            "some MoE expert tensors are counted whole: their routing was not recorded (no \
             ffn_moe_argsort node, or its records were lost), so weight bytes are an upper bound"
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

pub fn layer_key(layer: Option<u32>) -> String {
    layer.map_or_else(|| "-".to_string(), |l| l.to_string())
}
