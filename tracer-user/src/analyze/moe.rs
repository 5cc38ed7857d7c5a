//! The MoE section of `ttrace report`: per MoE layer and phase, how often each
//! expert was routed, which experts were routed together, how "sticky"
//! routing is from one token to the next, and each expert's disk reads and
//! faults ([`super::usage`]).
//!
//! Routing comes from the recorded `ffn_moe_argsort-L` rows
//! ([`super::correlate`]), the first k of each ranking being the experts the
//! layer used. Warm-up and auxiliary graphs are left out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Analysis, Phase, Ubatch,
    tensor::is_expert_tensor,
    usage::{ExpertUsage, Figures, Usage},
};

#[derive(Clone, Debug, Serialize)]
pub struct MoeStats {
    pub layers: Vec<MoeLayer>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MoeLayer {
    pub layer: u32,
    pub n_expert: u32,
    /// Experts used per token.
    pub k: u32,
    /// Prompt and generation apart (only those with routed tokens).
    pub phases: Vec<MoePhase>,
    /// Per expert: disk reads and faults on its slices ([`Figures`]).
    pub experts: Vec<ExpertIo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MoePhase {
    pub phase: Phase,
    /// Routed tokens (rows) of this layer.
    pub tokens: u64,
    /// Per expert id: tokens routed to it.
    pub activations: Vec<u64>,
    /// Co-activation: `(a, b, tokens)` with a < b, for every pair of experts
    /// routed for the same token, most frequent first.
    pub pairs: Vec<(u32, u32, u64)>,
    /// P(an expert routed for token t is routed again for t+1), over the
    /// consecutive token pairs of this phase (`null`: none).
    pub stickiness: Option<f64>,
    pub token_pairs: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExpertIo {
    pub expert: u32,
    #[serde(flatten)]
    pub figures: Figures,
}

/// A layer's routed tokens in order, each its selected experts; `None`
/// breaks the chain where rows are not consecutive tokens.
type TokenChain = Vec<Option<Vec<u32>>>;

/// `None` when no ubatch carries routing (not an MoE model, or routing lost).
pub fn collect(a: &Analysis, usage: &Usage) -> Option<MoeStats> {
    if a.ubatches.iter().all(|u| u.routing.is_empty()) {
        return None;
    }
    let mut notes = Vec::new();
    if a.ubatches.iter().any(|u| u.phase == Phase::Generate && u.n_tokens.is_some_and(|n| n > 1)) {
        notes.push(
            "generate ubatches carry several tokens (several sequences): stickiness pairs their rows in \
             order, which mixes sequences"
                .into(),
        );
    }
    let mut io: BTreeMap<u32, Vec<&ExpertUsage>> = BTreeMap::new();
    for e in &usage.experts {
        io.entry(e.layer).or_default().push(e);
    }
    let mut layers = routing(a, &a.ubatches);
    for l in &mut layers {
        l.experts = io
            .get(&l.layer)
            .map(|v| v.iter().map(|e| ExpertIo { expert: e.expert, figures: e.figures.clone() }).collect())
            .unwrap_or_default();
    }
    Some(MoeStats { layers, notes })
}

/// Activations, co-activation and stickiness per MoE layer and phase over
/// `ubatches` (a run's, or a range of them), without the per-expert I/O.
pub fn routing(a: &Analysis, ubatches: &[Ubatch]) -> Vec<MoeLayer> {
    let mut seqs: BTreeMap<u32, BTreeMap<PhaseKey, TokenChain>> = BTreeMap::new();
    let mut k_of: BTreeMap<u32, u32> = BTreeMap::new();
    for u in ubatches.iter().filter(|u| matches!(u.phase, Phase::Prompt | Phase::Generate)) {
        let mut by_layer: BTreeMap<u32, Vec<(u32, Vec<u32>)>> = BTreeMap::new();
        for r in &u.routing {
            let Some(layer) = r.layer else { continue };
            let selected = r.selected.iter().filter_map(|&e| u32::try_from(e).ok()).collect::<Vec<_>>();
            let k = k_of.entry(layer).or_default();
            *k = (*k).max(selected.len() as u32);
            by_layer.entry(layer).or_default().push((r.row, selected));
        }
        for (layer, mut rows) in by_layer {
            rows.sort_by_key(|&(row, _)| row);
            let seq = seqs.entry(layer).or_default().entry(PhaseKey(u.phase)).or_default();
            // Only outputs kept (a prompt's last layer): rows are not
            // consecutive tokens, so they break the chain around them.
            let consecutive = u.n_tokens.is_none_or(|n| rows.len() as u32 == n);
            if !consecutive {
                seq.push(None);
            }
            for (_, selected) in rows {
                seq.push(Some(selected));
                if !consecutive {
                    seq.push(None);
                }
            }
        }
    }
    seqs.into_iter()
        .map(|(layer, phases)| {
            let max_id = phases.values().flatten().flatten().flatten().max().map_or(0, |&e| e + 1);
            let n_expert = n_expert_of(a, layer).unwrap_or(max_id).max(max_id);
            MoeLayer {
                layer,
                n_expert,
                k: k_of.get(&layer).copied().unwrap_or(0),
                phases: phases.into_iter().map(|(p, seq)| phase_stats(p.0, n_expert, &seq)).collect(),
                experts: Vec::new(),
            }
        })
        .collect()
}

/// Experts of `layer`, from its expert tensors' slice size.
pub fn n_expert_of(a: &Analysis, layer: u32) -> Option<u32> {
    a.models
        .iter()
        .flat_map(|m| &m.tensors)
        .filter(|t| t.layer == Some(layer) && is_expert_tensor(t))
        .find_map(|t| t.expert_bytes.filter(|&s| s > 0).map(|s| (t.size_bytes / s) as u32))
}

/// Orders prompt before generate.
#[derive(PartialEq, Eq)]
struct PhaseKey(Phase);

impl PhaseKey {
    fn rank(&self) -> u8 {
        match self.0 {
            Phase::Warmup => 0,
            Phase::Prompt => 1,
            Phase::Generate => 2,
            Phase::Aux => 3,
        }
    }
}

impl PartialOrd for PhaseKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for PhaseKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&o.rank())
    }
}

fn phase_stats(phase: Phase, n_expert: u32, seq: &[Option<Vec<u32>>]) -> MoePhase {
    let mut activations = vec![0u64; n_expert as usize];
    let mut pairs: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut tokens = 0;
    for selected in seq.iter().flatten() {
        tokens += 1;
        for (i, &a) in selected.iter().enumerate() {
            if let Some(n) = activations.get_mut(a as usize) {
                *n += 1;
            }
            for &b in &selected[i + 1..] {
                *pairs.entry((a.min(b), a.max(b))).or_default() += 1;
            }
        }
    }
    let (mut kept, mut routed, mut token_pairs) = (0u64, 0u64, 0u64);
    for w in seq.windows(2) {
        if let [Some(now), Some(next)] = w {
            token_pairs += 1;
            routed += now.len() as u64;
            kept += now.iter().filter(|e| next.contains(e)).count() as u64;
        }
    }
    let mut pairs: Vec<(u32, u32, u64)> = pairs.into_iter().map(|((a, b), n)| (a, b, n)).collect();
    pairs.sort_by_key(|&(a, b, n)| (std::cmp::Reverse(n), a, b));
    MoePhase {
        phase,
        tokens,
        activations,
        pairs,
        stickiness: (routed > 0).then(|| kept as f64 / routed as f64),
        token_pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stickiness_counts_experts_kept_between_consecutive_tokens() {
        let seq = vec![Some(vec![0, 1]), Some(vec![1, 2]), None, Some(vec![3, 0]), Some(vec![3, 0])];
        let p = phase_stats(Phase::Generate, 4, &seq);
        assert_eq!(p.tokens, 4);
        assert_eq!(p.activations, vec![3, 2, 1, 2]);
        // (0,1): 1 of 2 kept; (3,0)→(3,0): 2 of 2.
        assert_eq!((p.token_pairs, p.stickiness), (2, Some(0.75)));
        assert_eq!(p.pairs[0], (0, 3, 2));
    }
}
