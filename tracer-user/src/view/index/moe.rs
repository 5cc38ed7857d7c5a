//! MoE queries over a range of ubatches, from `analyze::moe`'s own
//! counting (so a whole-run answer is the report's `stats.moe`).

use std::collections::BTreeMap;

use super::{Tokens, lod::Bins};
use crate::analyze::{Analysis, Phase, moe};

/// `(layer, expert, tokens)` routed over ubatches `[from, to)`, in the given
/// phases (all of them when empty).
pub fn grid(a: &Analysis, from: usize, to: usize, phases: &[Phase]) -> Vec<(u32, u32, u64)> {
    let mut out = Vec::new();
    for layer in moe::routing(a, &a.ubatches[from.min(to)..to]) {
        let mut counts = vec![0u64; layer.n_expert as usize];
        for p in layer.phases.iter().filter(|p| phases.is_empty() || phases.contains(&p.phase)) {
            for (c, n) in counts.iter_mut().zip(&p.activations) {
                *c += n;
            }
        }
        out.extend(counts.into_iter().enumerate().map(|(e, n)| (layer.layer, e as u32, n)));
    }
    out
}

/// `(a, b, tokens)` of layer `layer`: experts routed together.
pub fn coactivation(a: &Analysis, layer: u32, from: usize, to: usize, phases: &[Phase]) -> Vec<(u32, u32, u64)> {
    let mut pairs: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for l in moe::routing(a, &a.ubatches[from.min(to)..to]).into_iter().filter(|l| l.layer == layer) {
        for p in l.phases.iter().filter(|p| phases.is_empty() || phases.contains(&p.phase)) {
            for &(x, y, n) in &p.pairs {
                *pairs.entry((x, y)).or_default() += n;
            }
        }
    }
    pairs.into_iter().map(|((x, y), n)| (x, y, n)).collect()
}

/// Layer `layer`'s activations over tokens: `(bucket, expert, tokens)` with
/// x in token ids of `/api/v1/tokens` (a prompt's last layer, which keeps
/// only its outputs, counts them from the ubatch's first token).
pub fn over_tokens(a: &Analysis, tokens: &Tokens, layer: u32, x: Bins) -> Vec<(u32, u32, u64)> {
    let mut cells: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for u in a.ubatches.iter().filter(|u| matches!(u.phase, Phase::Prompt | Phase::Generate)) {
        let first = u64::from(tokens.first_of_ubatch[u.index as usize]);
        for r in u.routing.iter().filter(|r| r.layer == Some(layer)) {
            let Some(ix) = x.index(first + u64::from(r.row)) else { continue };
            for &e in &r.selected {
                if let Ok(e) = u32::try_from(e) {
                    *cells.entry((ix as u32, e)).or_default() += 1;
                }
            }
        }
    }
    cells.into_iter().map(|((ix, e), n)| (ix, e, n)).collect()
}
