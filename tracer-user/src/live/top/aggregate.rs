//! `ttrace top`'s numbers: what happened in one interval, as plain data.
//! The tap ([`super::tap`]) turns events into the calls here; the screen
//! and the JSON lines only read the [`Interval`]s this closes.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::{analyze::sequences::TokenKind, model::Component};

/// A tensor: `(model, tensor)` indices as the resolver numbers them.
pub type TensorKey = (u32, u32);

/// What the screen shows of a model tensor.
#[derive(Clone, Debug)]
pub struct TensorMeta {
    pub name: String,
    pub layer: Option<u32>,
    pub component: Component,
    pub size_bytes: u64,
    pub file: u32,
    pub file_offset: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    disk_bytes: u64,
    faults: u64,
    weight_bytes: u64,
}

/// Page-cache residency at the end of an interval.
#[derive(Clone, Debug, Default)]
pub struct ResidencySample {
    /// Size of every model file.
    pub model_bytes: u64,
    pub resident_bytes: u64,
    pub per_tensor: HashMap<TensorKey, u64>,
}

/// The memory cgroup the target runs in.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct MemoryUse {
    pub usage_bytes: u64,
    pub limit_bytes: u64,
}

/// Which column orders the tensor table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Disk,
    Faults,
    Weights,
    Resident,
}

impl SortKey {
    pub fn next(self) -> Self {
        match self {
            SortKey::Disk => SortKey::Faults,
            SortKey::Faults => SortKey::Weights,
            SortKey::Weights => SortKey::Resident,
            SortKey::Resident => SortKey::Disk,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Disk => "disk",
            SortKey::Faults => "faults",
            SortKey::Weights => "weights",
            SortKey::Resident => "resident",
        }
    }
}

/// One tensor's interval, rates per second.
#[derive(Clone, Debug, Serialize)]
pub struct TensorRow {
    pub name: String,
    pub layer: Option<u32>,
    pub component: &'static str,
    pub size_bytes: u64,
    pub disk_bytes_per_s: f64,
    pub faults_per_s: f64,
    pub weight_bytes_per_s: f64,
    pub resident_bytes: u64,
}

impl TensorRow {
    fn key(&self, by: SortKey) -> f64 {
        match by {
            SortKey::Disk => self.disk_bytes_per_s,
            SortKey::Faults => self.faults_per_s,
            SortKey::Weights => self.weight_bytes_per_s,
            SortKey::Resident => self.resident_bytes as f64,
        }
    }
}

/// A layer's or a component's sum over its tensors.
#[derive(Clone, Debug, Serialize, Default)]
pub struct GroupRow {
    pub name: String,
    pub weight_bytes_per_s: f64,
    pub disk_bytes_per_s: f64,
    pub faults_per_s: f64,
    pub resident_bytes: u64,
    pub size_bytes: u64,
}

/// Tokens of one sequence in the interval.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SequenceRow {
    pub seq: i32,
    pub prompt: u64,
    pub generated: u64,
    pub tokens_per_s: f64,
}

/// One interval, closed.
#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    /// Seconds since `top` started, at the end of the interval.
    pub t: f64,
    pub interval_s: f64,
    /// Prompt and generated tokens per second.
    pub tokens_per_s: f64,
    pub prompt_per_s: f64,
    pub generated_per_s: f64,
    /// Tokens in this interval.
    pub prompt: u64,
    pub generated: u64,
    /// Tokens since `top` started.
    pub prompt_total: u64,
    pub generated_total: u64,
    pub sequences: Vec<SequenceRow>,
    /// Model-file bytes read from disk (read requests, each counted once).
    pub disk_bytes: u64,
    pub disk_bytes_per_s: f64,
    pub disk_bytes_total: u64,
    /// The target's page faults, and those on model-file pages.
    pub faults: u64,
    pub faults_per_s: f64,
    pub model_faults_per_s: f64,
    /// Bytes of the model tensors the ubatch graphs read (whole tensors).
    pub weight_bytes_per_s: f64,
    pub resident_bytes: u64,
    pub model_bytes: u64,
    pub memory: Option<MemoryUse>,
    /// Every model tensor (the JSON line keeps the top ones).
    #[serde(skip)]
    pub tensors: Vec<TensorRow>,
    pub layers: Vec<GroupRow>,
    pub components: Vec<GroupRow>,
    /// MoE: per layer, how often each expert was routed to in the interval.
    pub experts: BTreeMap<u32, Vec<u64>>,
}

impl Interval {
    /// The `n` tensors first by `by`, ties by disk, faults, then weights.
    pub fn top(&self, by: SortKey, n: usize) -> Vec<&TensorRow> {
        let mut rows: Vec<&TensorRow> = self.tensors.iter().collect();
        let order = [by, SortKey::Disk, SortKey::Faults, SortKey::Weights];
        rows.sort_by(|a, b| {
            order
                .iter()
                .map(|&k| b.key(k).total_cmp(&a.key(k)))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        rows.truncate(n);
        rows
    }
}

/// Counts since the last [`Aggregator::close`].
#[derive(Default)]
pub struct Aggregator {
    models: Vec<Vec<TensorMeta>>,
    /// Per model: experts each token is routed to (`expert_used_count`).
    experts_used: Vec<Option<usize>>,
    last_close_s: f64,
    prompt: u64,
    generated: u64,
    per_seq: BTreeMap<i32, (u64, u64)>,
    disk_bytes: u64,
    faults: u64,
    model_faults: u64,
    weight_bytes: u64,
    tensors: HashMap<TensorKey, Counts>,
    experts: BTreeMap<u32, Vec<u64>>,
    prompt_total: u64,
    generated_total: u64,
    disk_total: u64,
}

impl Aggregator {
    /// A model's tensors, in the resolver's order; its index is the next one.
    pub fn add_model(&mut self, tensors: Vec<TensorMeta>, experts_used: Option<usize>) {
        self.models.push(tensors);
        self.experts_used.push(experts_used);
    }

    pub fn n_models(&self) -> usize {
        self.models.len()
    }

    pub fn tensors(&self) -> impl Iterator<Item = (TensorKey, &TensorMeta)> {
        self.models
            .iter()
            .enumerate()
            .flat_map(|(m, ts)| ts.iter().enumerate().map(move |(t, meta)| ((m as u32, t as u32), meta)))
    }

    pub fn on_token(&mut self, seq: i32, kind: TokenKind) {
        let entry = self.per_seq.entry(seq).or_default();
        match kind {
            TokenKind::Generated => {
                self.generated += 1;
                entry.1 += 1;
            }
            TokenKind::Prompt | TokenKind::Warmup => {
                self.prompt += 1;
                entry.0 += 1;
            }
        }
    }

    /// Bytes of a read request inside a model file; `None`: between tensors.
    pub fn on_disk(&mut self, tensor: Option<TensorKey>, bytes: u64) {
        self.disk_bytes += bytes;
        if let Some(key) = tensor {
            self.tensors.entry(key).or_default().disk_bytes += bytes;
        }
    }

    /// A page fault of the target; `Some` when on a model tensor's page.
    pub fn on_fault(&mut self, tensor: Option<TensorKey>) {
        self.faults += 1;
        if let Some(key) = tensor {
            self.model_faults += 1;
            self.tensors.entry(key).or_default().faults += 1;
        }
    }

    /// A ubatch graph read `tensor` (counted whole).
    pub fn on_weights(&mut self, tensor: TensorKey) {
        let Some(meta) = self.meta(tensor) else { return };
        let bytes = meta.size_bytes;
        self.weight_bytes += bytes;
        self.tensors.entry(tensor).or_default().weight_bytes += bytes;
    }

    /// One token's expert ranking in `layer` of `model`: the first
    /// `expert_used_count` are the ones used.
    pub fn on_route(&mut self, model: u32, layer: u32, ranking: &[i32]) {
        let used = self.experts_used.get(model as usize).copied().flatten().unwrap_or(ranking.len());
        let row = self.experts.entry(layer).or_default();
        for &e in ranking.iter().take(used) {
            let Ok(e) = usize::try_from(e) else { continue };
            if row.len() <= e {
                row.resize(e + 1, 0);
            }
            row[e] += 1;
        }
    }

    pub fn has(&self, key: TensorKey) -> bool {
        self.meta(key).is_some()
    }

    fn meta(&self, (m, t): TensorKey) -> Option<&TensorMeta> {
        self.models.get(m as usize)?.get(t as usize)
    }

    /// Close the interval ending `now_s` seconds after the start.
    pub fn close(&mut self, now_s: f64, residency: &ResidencySample, memory: Option<MemoryUse>) -> Interval {
        let dt = (now_s - self.last_close_s).max(1e-9);
        self.last_close_s = now_s;
        self.prompt_total += self.prompt;
        self.generated_total += self.generated;
        self.disk_total += self.disk_bytes;
        let counts = std::mem::take(&mut self.tensors);
        let tensors: Vec<TensorRow> = self
            .tensors()
            .map(|(key, meta)| {
                let c = counts.get(&key).copied().unwrap_or_default();
                TensorRow {
                    name: meta.name.clone(),
                    layer: meta.layer,
                    component: meta.component.as_str(),
                    size_bytes: meta.size_bytes,
                    disk_bytes_per_s: c.disk_bytes as f64 / dt,
                    faults_per_s: c.faults as f64 / dt,
                    weight_bytes_per_s: c.weight_bytes as f64 / dt,
                    resident_bytes: residency.per_tensor.get(&key).copied().unwrap_or(0).min(meta.size_bytes),
                }
            })
            .collect();
        let layers = group(&tensors, |r| r.layer.map_or_else(|| "-".to_string(), |l| l.to_string()));
        let components = group(&tensors, |r| r.component.to_string());
        let sequences = std::mem::take(&mut self.per_seq)
            .into_iter()
            .map(|(seq, (prompt, generated))| SequenceRow {
                seq,
                prompt,
                generated,
                tokens_per_s: (prompt + generated) as f64 / dt,
            })
            .collect();
        let interval = Interval {
            t: now_s,
            interval_s: dt,
            tokens_per_s: (self.prompt + self.generated) as f64 / dt,
            prompt_per_s: self.prompt as f64 / dt,
            generated_per_s: self.generated as f64 / dt,
            prompt: self.prompt,
            generated: self.generated,
            prompt_total: self.prompt_total,
            generated_total: self.generated_total,
            sequences,
            disk_bytes: self.disk_bytes,
            disk_bytes_per_s: self.disk_bytes as f64 / dt,
            disk_bytes_total: self.disk_total,
            faults: self.faults,
            faults_per_s: self.faults as f64 / dt,
            model_faults_per_s: self.model_faults as f64 / dt,
            weight_bytes_per_s: self.weight_bytes as f64 / dt,
            resident_bytes: residency.resident_bytes,
            model_bytes: residency.model_bytes,
            memory,
            tensors,
            layers,
            components,
            experts: std::mem::take(&mut self.experts),
        };
        (self.prompt, self.generated, self.disk_bytes, self.faults, self.model_faults, self.weight_bytes) =
            (0, 0, 0, 0, 0, 0);
        interval
    }
}

/// Rows summed by `name_of`, in order of first appearance.
fn group(rows: &[TensorRow], name_of: impl Fn(&TensorRow) -> String) -> Vec<GroupRow> {
    let mut out: Vec<GroupRow> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for r in rows {
        let name = name_of(r);
        let i = *at.entry(name.clone()).or_insert_with(|| {
            out.push(GroupRow { name, ..Default::default() });
            out.len() - 1
        });
        let g = &mut out[i];
        g.weight_bytes_per_s += r.weight_bytes_per_s;
        g.disk_bytes_per_s += r.disk_bytes_per_s;
        g.faults_per_s += r.faults_per_s;
        g.resident_bytes += r.resident_bytes;
        g.size_bytes += r.size_bytes;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, layer: Option<u32>, component: Component, size_bytes: u64) -> TensorMeta {
        TensorMeta { name: name.into(), layer, component, size_bytes, file: 0, file_offset: 0 }
    }

    fn model() -> Aggregator {
        let mut a = Aggregator::default();
        a.add_model(
            vec![
                meta("token_embd.weight", None, Component::TokenEmbd, 1000),
                meta("blk.0.attn_q.weight", Some(0), Component::AttnQ, 100),
                meta("blk.1.attn_q.weight", Some(1), Component::AttnQ, 100),
                meta("blk.1.ffn_up_exps.weight", Some(1), Component::FfnUpExps, 400),
            ],
            Some(2),
        );
        a
    }

    #[test]
    fn an_interval_counts_rates_and_totals_and_the_next_starts_empty() {
        let mut a = model();
        a.on_token(0, TokenKind::Prompt);
        a.on_token(0, TokenKind::Prompt);
        a.on_token(1, TokenKind::Generated);
        a.on_disk(Some((0, 1)), 4096);
        a.on_disk(None, 512);
        a.on_fault(Some((0, 2)));
        a.on_fault(None);
        a.on_weights((0, 0));
        a.on_weights((0, 1));
        a.on_weights((7, 7)); // unknown: ignored
        a.on_route(0, 1, &[3, 0, 1]);
        a.on_route(0, 1, &[3, 1, 0]);
        let residency = ResidencySample {
            model_bytes: 1600,
            resident_bytes: 8192,
            per_tensor: HashMap::from([((0, 0), 4096), ((0, 1), 4096)]),
        };
        let i = a.close(2.0, &residency, Some(MemoryUse { usage_bytes: 5, limit_bytes: 10 }));
        assert_eq!((i.prompt, i.generated, i.prompt_total, i.generated_total), (2, 1, 2, 1));
        assert_eq!((i.t, i.interval_s, i.tokens_per_s, i.generated_per_s), (2.0, 2.0, 1.5, 0.5));
        assert_eq!(
            i.sequences,
            vec![
                SequenceRow { seq: 0, prompt: 2, generated: 0, tokens_per_s: 1.0 },
                SequenceRow { seq: 1, prompt: 0, generated: 1, tokens_per_s: 0.5 }
            ]
        );
        assert_eq!((i.disk_bytes, i.disk_bytes_per_s, i.disk_bytes_total), (4608, 2304.0, 4608));
        assert_eq!((i.faults, i.faults_per_s, i.model_faults_per_s), (2, 1.0, 0.5));
        assert_eq!(i.weight_bytes_per_s, 550.0);
        // Residency per tensor is clipped to the tensor (pages are whole).
        assert_eq!(i.tensors[1].resident_bytes, 100);
        let top: Vec<&str> = i.top(SortKey::Disk, 2).iter().map(|r| r.name.as_str()).collect();
        assert_eq!(top, ["blk.0.attn_q.weight", "blk.1.attn_q.weight"]);
        let by_weights: Vec<&str> = i.top(SortKey::Weights, 1).iter().map(|r| r.name.as_str()).collect();
        assert_eq!(by_weights, ["token_embd.weight"]);
        let layer1 = i.layers.iter().find(|g| g.name == "1").unwrap();
        assert_eq!((layer1.faults_per_s, layer1.size_bytes), (0.5, 500));
        let attn_q = i.components.iter().find(|g| g.name == "attn_q").unwrap();
        assert_eq!(attn_q.disk_bytes_per_s, 2048.0);
        // Two experts used per token: 3 twice, 0 once, 1 once.
        assert_eq!(i.experts[&1], vec![1, 1, 0, 2]);

        a.on_token(1, TokenKind::Generated);
        let j = a.close(3.0, &ResidencySample::default(), None);
        assert_eq!(
            (j.interval_s, j.generated, j.generated_total, j.disk_bytes, j.disk_bytes_total),
            (1.0, 1, 2, 0, 4608)
        );
        assert!(j.experts.is_empty() && j.faults == 0 && j.weight_bytes_per_s == 0.0);
    }
}
