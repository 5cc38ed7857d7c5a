//! `ttrace sweep report`: runs of a sweep compared, from each run's own
//! analysis: per model and domain the MoE experts' activation distribution
//! (prompt and generate ubatches, as [`moe::routing`] counts them), the
//! cosine similarity between domains, stickiness per domain, disk bytes per
//! generated token against the memory limit, and the spread across repeats.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Analysis, Phase,
    diff::{self, Run, RunFacts},
    moe::{self, MoeLayer},
    stats::Stats,
};

/// Which run, as the sweep's plan set it.
#[derive(Clone, Debug, Serialize)]
pub struct RunKey {
    pub run_id: String,
    pub model: String,
    pub domain: String,
    pub mem_limit_bytes: Option<u64>,
    pub repeat: u32,
}

/// What the comparison needs of one run.
#[derive(Clone, Debug)]
pub struct RunFigures {
    pub key: RunKey,
    /// `Some`: the run failed, and why.
    pub error: Option<String>,
    pub facts: Option<RunFacts>,
    pub tokens_per_s: Option<f64>,
    pub routing: Vec<MoeLayer>,
}

/// Generated tokens per second of the generate ubatches' own time.
pub fn tokens_per_s(stats: &Stats) -> Option<f64> {
    let generate: Vec<_> = stats.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).collect();
    let ns: u64 = generate.iter().map(|u| u.duration_ns).sum();
    (ns > 0).then(|| generate.len() as f64 * 1e9 / ns as f64)
}

impl RunFigures {
    pub fn of(key: RunKey, trace: &str, a: &Analysis, stats: &Stats) -> RunFigures {
        RunFigures {
            key,
            error: None,
            facts: Some(diff::facts(&Run { path: trace.to_string(), analysis: a, stats })),
            tokens_per_s: tokens_per_s(stats),
            routing: moe::routing(a, &a.ubatches),
        }
    }

    pub fn failed(key: RunKey, error: String) -> RunFigures {
        RunFigures { key, error: Some(error), facts: None, tokens_per_s: None, routing: Vec::new() }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    pub runs: Vec<RunRow>,
    pub models: Vec<ModelReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    #[serde(flatten)]
    pub key: RunKey,
    pub status: &'static str,
    pub error: Option<String>,
    pub generated_tokens: Option<u64>,
    pub tokens_per_s: Option<f64>,
    pub weight_bytes_per_token: Option<f64>,
    pub disk_bytes_per_token: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelReport {
    pub model: String,
    /// MoE models only: per domain, the experts' activations.
    pub domains: Vec<DomainRouting>,
    /// Between the domains of `domains`, in their order.
    pub similarity: Option<Similarity>,
    pub disk_vs_mem_limit: Vec<LimitRow>,
    /// Per domain and memory limit, across repeats.
    pub spread: Vec<SpreadRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DomainRouting {
    pub domain: String,
    pub runs: u32,
    pub layers: Vec<LayerActivations>,
    /// Generate phase, over its runs and layers: experts kept from one token
    /// to the next over experts routed (each layer's stickiness weighted by
    /// its token pairs).
    pub stickiness: Option<f64>,
    pub token_pairs: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerActivations {
    pub layer: u32,
    /// Per expert id: routed tokens, summed over the domain's runs.
    pub activations: Vec<u64>,
    /// The same as shares of the layer's routings.
    pub distribution: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Similarity {
    /// Cosine of the domains' activation vectors over every (layer, expert).
    pub metric: &'static str,
    pub domains: Vec<String>,
    pub matrix: Vec<Vec<f64>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LimitRow {
    pub mem_limit_bytes: Option<u64>,
    pub runs: u32,
    pub disk_bytes_per_token: Option<Spread>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpreadRow {
    pub domain: String,
    pub mem_limit_bytes: Option<u64>,
    pub runs: u32,
    pub tokens_per_s: Option<Spread>,
    pub disk_bytes_per_token: Option<Spread>,
    pub weight_bytes_per_token: Option<Spread>,
}

/// Mean, sample standard deviation, min and max.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub stdev: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var =
            if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
        Some(Spread {
            mean,
            stdev: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

pub fn compare(runs: &[RunFigures]) -> SweepReport {
    let rows = runs
        .iter()
        .map(|r| RunRow {
            key: r.key.clone(),
            status: if r.error.is_none() { "ok" } else { "failed" },
            error: r.error.clone(),
            generated_tokens: r.facts.as_ref().map(|f| f.generated_tokens),
            tokens_per_s: r.tokens_per_s,
            weight_bytes_per_token: r.facts.as_ref().map(|f| f.weight_bytes_per_token),
            disk_bytes_per_token: r.facts.as_ref().and_then(|f| f.disk_bytes_per_token),
        })
        .collect();
    let mut by_model: BTreeMap<&str, Vec<&RunFigures>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.error.is_none()) {
        by_model.entry(&r.key.model).or_default().push(r);
    }
    let models = by_model.into_iter().map(|(model, runs)| model_report(model, &runs)).collect();
    SweepReport { runs: rows, models }
}

fn model_report(model: &str, runs: &[&RunFigures]) -> ModelReport {
    let mut by_domain: BTreeMap<&str, Vec<&RunFigures>> = BTreeMap::new();
    for r in runs {
        by_domain.entry(&r.key.domain).or_default().push(r);
    }
    let domains: Vec<DomainRouting> = by_domain
        .iter()
        .filter(|(_, rs)| rs.iter().any(|r| !r.routing.is_empty()))
        .map(|(d, rs)| domain_routing(d, rs))
        .collect();
    let similarity = (!domains.is_empty()).then(|| Similarity {
        metric: "cosine",
        domains: domains.iter().map(|d| d.domain.clone()).collect(),
        matrix: domains.iter().map(|a| domains.iter().map(|b| cosine(a, b)).collect()).collect(),
    });
    let mut by_limit: BTreeMap<Option<u64>, Vec<&RunFigures>> = BTreeMap::new();
    let mut by_cell: BTreeMap<(&str, Option<u64>), Vec<&RunFigures>> = BTreeMap::new();
    for r in runs {
        by_limit.entry(r.key.mem_limit_bytes).or_default().push(r);
        by_cell.entry((&r.key.domain, r.key.mem_limit_bytes)).or_default().push(r);
    }
    let disk = |rs: &[&RunFigures]| {
        Spread::of(&rs.iter().filter_map(|r| r.facts.as_ref()?.disk_bytes_per_token).collect::<Vec<_>>())
    };
    ModelReport {
        model: model.to_string(),
        domains,
        similarity,
        disk_vs_mem_limit: by_limit
            .into_iter()
            .map(|(limit, rs)| LimitRow {
                mem_limit_bytes: limit,
                runs: rs.len() as u32,
                disk_bytes_per_token: disk(&rs),
            })
            .collect(),
        spread: by_cell
            .into_iter()
            .map(|((domain, limit), rs)| SpreadRow {
                domain: domain.to_string(),
                mem_limit_bytes: limit,
                runs: rs.len() as u32,
                tokens_per_s: Spread::of(&rs.iter().filter_map(|r| r.tokens_per_s).collect::<Vec<_>>()),
                disk_bytes_per_token: disk(&rs),
                weight_bytes_per_token: Spread::of(
                    &rs.iter().filter_map(|r| Some(r.facts.as_ref()?.weight_bytes_per_token)).collect::<Vec<_>>(),
                ),
            })
            .collect(),
    }
}

fn domain_routing(domain: &str, runs: &[&RunFigures]) -> DomainRouting {
    let mut layers: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let (mut weighted, mut token_pairs) = (0.0, 0u64);
    for r in runs {
        for l in &r.routing {
            let counts = layers.entry(l.layer).or_default();
            for p in &l.phases {
                if counts.len() < p.activations.len() {
                    counts.resize(p.activations.len(), 0);
                }
                for (c, n) in counts.iter_mut().zip(&p.activations) {
                    *c += n;
                }
                if p.phase == Phase::Generate
                    && let Some(s) = p.stickiness
                {
                    weighted += s * p.token_pairs as f64;
                    token_pairs += p.token_pairs;
                }
            }
        }
    }
    DomainRouting {
        domain: domain.to_string(),
        runs: runs.len() as u32,
        layers: layers
            .into_iter()
            .map(|(layer, activations)| {
                let total = activations.iter().sum::<u64>().max(1) as f64;
                let distribution = activations.iter().map(|&n| n as f64 / total).collect();
                LayerActivations { layer, activations, distribution }
            })
            .collect(),
        stickiness: (token_pairs > 0).then(|| weighted / token_pairs as f64),
        token_pairs,
    }
}

/// Over every (layer, expert): missing entries count as zero.
fn cosine(a: &DomainRouting, b: &DomainRouting) -> f64 {
    let vector = |d: &DomainRouting| -> BTreeMap<(u32, usize), f64> {
        d.layers
            .iter()
            .flat_map(|l| l.activations.iter().enumerate().map(move |(e, &n)| ((l.layer, e), n as f64)))
            .collect()
    };
    let (va, vb) = (vector(a), vector(b));
    let dot: f64 = va.iter().map(|(k, x)| x * vb.get(k).copied().unwrap_or(0.0)).sum();
    let norm = |v: &BTreeMap<(u32, usize), f64>| v.values().map(|x| x * x).sum::<f64>().sqrt();
    let (na, nb) = (norm(&va), norm(&vb));
    if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na * nb) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(name: &str, layers: &[(u32, &[u64])]) -> DomainRouting {
        DomainRouting {
            domain: name.into(),
            runs: 1,
            layers: layers
                .iter()
                .map(|(l, a)| LayerActivations { layer: *l, activations: a.to_vec(), distribution: Vec::new() })
                .collect(),
            stickiness: None,
            token_pairs: 0,
        }
    }

    #[test]
    fn cosine_over_layers_and_experts() {
        let a = domain("a", &[(0, &[1, 0]), (1, &[0, 2])]);
        let b = domain("b", &[(0, &[2, 0])]);
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-12);
        assert!((cosine(&a, &b) - 1.0 / 5f64.sqrt()).abs() < 1e-12);
        let spread = Spread::of(&[1.0, 3.0]).unwrap();
        assert_eq!((spread.mean, spread.min, spread.max), (2.0, 1.0, 3.0));
        assert!((spread.stdev - 2f64.sqrt()).abs() < 1e-12);
    }
}
