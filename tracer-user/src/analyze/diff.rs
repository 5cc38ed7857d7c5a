//! `ttrace diff`: two runs of the same weights (e.g. before and after a
//! layout rewrite) side by side. Tensors are matched by name; MoE experts
//! through an optional permutation per layer, since a rewrite renumbers them
//! (mbolt: `perm[p]` is the original expert stored at position `p`, so run
//! B's expert `p` is run A's `perm[p]`). Ubatches are paired by order within
//! their phase. Routing is compared only up to the first ubatch whose token
//! ids differ: from there on the runs compute on different inputs.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Analysis, Phase, stats::Stats};

/// Per MoE layer: B's expert id → A's.
pub type Permutation = BTreeMap<u32, Vec<u32>>;

/// How often generated tokens read a tensor or routed to an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Heat {
    /// By at least half of the generated tokens.
    Hot,
    /// By some.
    Warm,
    /// By none.
    Cold,
}

impl Heat {
    fn of(tokens: u64, of: u64) -> Heat {
        match tokens {
            0 => Heat::Cold,
            t if 2 * t >= of => Heat::Hot,
            _ => Heat::Warm,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RunFacts {
    pub path: String,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Means per generated token.
    pub weight_bytes_per_token: f64,
    pub disk_bytes_per_token: Option<f64>,
    pub faults_per_token: f64,
    pub disk_bytes_total: u64,
}

/// A pair of figures: run A's, run B's.
pub type Pair<T> = [T; 2];

#[derive(Clone, Debug, Serialize)]
pub struct TokenRow {
    pub token: u32,
    pub id: Pair<Option<i32>>,
    pub weight_bytes: Pair<Option<u64>>,
    pub disk_bytes: Pair<Option<u64>>,
    pub faults: Pair<Option<u64>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerRow {
    pub layer: Option<u32>,
    pub weight_bytes_per_token: Pair<f64>,
    pub disk_read: Pair<u64>,
    pub faults: Pair<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Moved {
    pub name: String,
    pub heat: Pair<Heat>,
    pub tokens: Pair<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExpertMoved {
    pub layer: u32,
    /// Run A's id and run B's id for the same expert.
    pub expert: Pair<u32>,
    pub heat: Pair<Heat>,
    pub tokens: Pair<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RoutingMismatch {
    pub phase: Phase,
    /// Index of the ubatch within its phase, and the row (token) in it.
    pub ubatch: u32,
    pub layer: u32,
    pub row: u32,
    pub a: Vec<i32>,
    /// B's experts in A's numbering (`None`: B has no such row).
    pub b: Option<Vec<i32>>,
}

/// Where the runs' token ids first differ, in phase order (prompt, then
/// generate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenDivergence {
    pub phase: Phase,
    /// Index of the ubatch within its phase (for generate ubatches, the
    /// generated token it feeds), and of the token in it.
    pub ubatch: u32,
    pub row: u32,
    /// The two ids (`None`: that run has no such token).
    pub id: Pair<Option<i32>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RoutingDiff {
    /// (token, layer) rows compared, and those equal (same experts, same order).
    pub compared: u64,
    pub equal: u64,
    pub equal_as_sets: u64,
    /// The first differences (at most [`MAX_MISMATCHES`]).
    pub mismatches: Vec<RoutingMismatch>,
    pub permuted: bool,
    /// Rows not compared, of A's ubatches from the token divergence on and
    /// of the ubatches only B has.
    pub after_divergence: u64,
}

pub const MAX_MISMATCHES: usize = 20;

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub runs: Pair<RunFacts>,
    /// Token ids of every prompt and generate ubatch are equal.
    pub tokens_equal: bool,
    pub first_divergence: Option<TokenDivergence>,
    pub routing: RoutingDiff,
    /// Same tokens and routing: what `ttrace diff`'s exit status says.
    pub same: bool,
    pub per_token: Vec<TokenRow>,
    pub per_layer: Vec<LayerRow>,
    pub tensors_moved: Vec<Moved>,
    pub experts_moved: Vec<ExpertMoved>,
    pub notes: Vec<String>,
}

/// One run: its path, analysis and report figures.
pub struct Run<'a> {
    pub path: String,
    pub analysis: &'a Analysis,
    pub stats: &'a Stats,
}

pub fn diff(a: &Run, b: &Run, perm: Option<&Permutation>) -> Diff {
    let mut notes = Vec::new();
    let names = |r: &Run| -> BTreeSet<String> { r.stats.tensors.iter().map(|t| t.name.clone()).collect() };
    let (na, nb) = (names(a), names(b));
    if na != nb {
        notes.push(format!(
            "the runs' tensors differ ({} only in A, {} only in B): are these the same weights?",
            na.difference(&nb).count(),
            nb.difference(&na).count()
        ));
    }
    let first_divergence = first_divergence(a.analysis, b.analysis);
    let tokens_equal = first_divergence.is_none();
    let routing = routing(a.analysis, b.analysis, perm, first_divergence.as_ref());
    let same = tokens_equal && routing.equal == routing.compared && routing.mismatches.is_empty();
    Diff {
        runs: [facts(a), facts(b)],
        tokens_equal,
        first_divergence,
        same,
        routing,
        per_token: per_token(a, b),
        per_layer: per_layer(a, b),
        tensors_moved: tensors_moved(a, b),
        experts_moved: experts_moved(a, b, perm),
        notes,
    }
}

fn in_phase(a: &Analysis, phase: Phase) -> impl Iterator<Item = &super::Ubatch> {
    a.ubatches.iter().filter(move |u| u.phase == phase)
}

/// A run's figures per generated token (also the sweep dataset's `runs` row).
pub fn facts(r: &Run) -> RunFacts {
    let generate = generated(r.stats);
    let n = generate.len().max(1) as f64;
    let disk: Option<u64> = generate.iter().map(|u| u.disk_bytes).sum();
    RunFacts {
        path: r.path.clone(),
        prompt_tokens: r.analysis.prompt_tokens,
        generated_tokens: generate.len() as u64,
        weight_bytes_per_token: generate.iter().map(|u| u.weight_bytes).sum::<u64>() as f64 / n,
        disk_bytes_per_token: disk.map(|d| d as f64 / n),
        faults_per_token: generate.iter().map(|u| u.model_faults).sum::<u64>() as f64 / n,
        disk_bytes_total: r.analysis.io.disk.bytes,
    }
}

fn per_token(a: &Run, b: &Run) -> Vec<TokenRow> {
    let (ga, gb) = (generated(a.stats), generated(b.stats));
    (0..ga.len().max(gb.len()))
        .map(|i| {
            let (x, y) = (ga.get(i), gb.get(i));
            TokenRow {
                token: i as u32,
                id: [x.and_then(|u| u.token_ids.first().copied()), y.and_then(|u| u.token_ids.first().copied())],
                weight_bytes: [x.map(|u| u.weight_bytes), y.map(|u| u.weight_bytes)],
                disk_bytes: [x.and_then(|u| u.disk_bytes), y.and_then(|u| u.disk_bytes)],
                faults: [x.map(|u| u.model_faults), y.map(|u| u.model_faults)],
            }
        })
        .collect()
}

fn generated(s: &Stats) -> Vec<&super::stats::UbatchStats> {
    s.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).collect()
}

fn per_layer(a: &Run, b: &Run) -> Vec<LayerRow> {
    let mut rows: BTreeMap<Option<u32>, LayerRow> = BTreeMap::new();
    for (side, r) in [a, b].into_iter().enumerate() {
        for g in &r.stats.layers {
            let layer = g.key.parse().ok();
            rows.entry(layer).or_insert_with(|| empty_layer(layer)).weight_bytes_per_token[side] = g.bytes_per_token;
        }
        for l in r.stats.loaded_vs_used.iter().flat_map(|u| &u.layers) {
            let row = rows.entry(l.layer).or_insert_with(|| empty_layer(l.layer));
            row.disk_read[side] = l.figures.disk_read;
            row.faults[side] = l.figures.faults;
        }
    }
    rows.into_values().collect()
}

fn empty_layer(layer: Option<u32>) -> LayerRow {
    LayerRow { layer, weight_bytes_per_token: [0.0; 2], disk_read: [0; 2], faults: [0; 2] }
}

fn n_generated(r: &Run) -> u64 {
    in_phase(r.analysis, Phase::Generate).count() as u64
}

fn tensors_moved(a: &Run, b: &Run) -> Vec<Moved> {
    let tokens_b: BTreeMap<&str, u64> = b.stats.tensors.iter().map(|t| (t.name.as_str(), t.tokens_touched)).collect();
    let (ga, gb) = (n_generated(a), n_generated(b));
    a.stats
        .tensors
        .iter()
        .filter_map(|t| {
            let tb = *tokens_b.get(t.name.as_str())?;
            let heat = [Heat::of(t.tokens_touched, ga), Heat::of(tb, gb)];
            (heat[0] != heat[1]).then(|| Moved { name: t.name.clone(), heat, tokens: [t.tokens_touched, tb] })
        })
        .collect()
}

/// Generated tokens routed to each expert, per layer.
fn activations(r: &Run) -> BTreeMap<u32, Vec<u64>> {
    let Some(moe) = &r.stats.moe else { return BTreeMap::new() };
    moe.layers
        .iter()
        .filter_map(|l| {
            let p = l.phases.iter().find(|p| p.phase == Phase::Generate)?;
            Some((l.layer, p.activations.clone()))
        })
        .collect()
}

fn experts_moved(a: &Run, b: &Run, perm: Option<&Permutation>) -> Vec<ExpertMoved> {
    let (act_a, act_b) = (activations(a), activations(b));
    let (ga, gb) = (n_generated(a), n_generated(b));
    let mut out = Vec::new();
    for (&layer, xa) in &act_a {
        let Some(xb) = act_b.get(&layer) else { continue };
        for (eb, &tb) in xb.iter().enumerate() {
            let ea = to_a(perm, layer, eb as u32);
            let ta = xa.get(ea as usize).copied().unwrap_or(0);
            let heat = [Heat::of(ta, ga), Heat::of(tb, gb)];
            if heat[0] != heat[1] {
                out.push(ExpertMoved { layer, expert: [ea, eb as u32], heat, tokens: [ta, tb] });
            }
        }
    }
    out
}

fn to_a(perm: Option<&Permutation>, layer: u32, expert_b: u32) -> u32 {
    perm.and_then(|p| p.get(&layer)).and_then(|p| p.get(expert_b as usize)).copied().unwrap_or(expert_b)
}

/// The first token whose ids differ, or that only one run has.
fn first_divergence(a: &Analysis, b: &Analysis) -> Option<TokenDivergence> {
    [Phase::Prompt, Phase::Generate].into_iter().find_map(|phase| {
        fn ids(r: &Analysis, phase: Phase) -> Vec<&[i32]> {
            in_phase(r, phase).map(|u| u.token_ids.as_slice()).collect()
        }
        let (ia, ib) = (ids(a, phase), ids(b, phase));
        (0..ia.len().max(ib.len())).find_map(|u| {
            let (ta, tb) = (ia.get(u), ib.get(u));
            let row = match (ta, tb) {
                (Some(x), Some(y)) => (0..x.len().max(y.len())).find(|&r| x.get(r) != y.get(r))?,
                // A ubatch only one run has, even one whose ids were not recorded.
                _ => 0,
            };
            let id = |t: Option<&&[i32]>| t.and_then(|t| t.get(row)).copied();
            Some(TokenDivergence { phase, ubatch: u as u32, row: row as u32, id: [id(ta), id(tb)] })
        })
    })
}

/// Whether the `index`th ubatch of `phase` comes before the divergence.
fn before(divergence: Option<&TokenDivergence>, phase: Phase, index: usize) -> bool {
    match divergence {
        None => true,
        Some(d) if d.phase == phase => index < d.ubatch as usize,
        // Prompt ubatches come before generate ones.
        Some(d) => d.phase == Phase::Generate && phase == Phase::Prompt,
    }
}

fn routing(
    a: &Analysis,
    b: &Analysis,
    perm: Option<&Permutation>,
    divergence: Option<&TokenDivergence>,
) -> RoutingDiff {
    let mut d = RoutingDiff { permuted: perm.is_some(), ..Default::default() };
    for phase in [Phase::Prompt, Phase::Generate] {
        let ub: Vec<_> = in_phase(b, phase).collect();
        for (i, ua) in in_phase(a, phase).enumerate() {
            if !before(divergence, phase, i) {
                d.after_divergence += ua.routing.len() as u64;
                continue;
            }
            let rows_b: BTreeMap<(u32, u32), Vec<i32>> = ub
                .get(i)
                .into_iter()
                .flat_map(|u| &u.routing)
                .filter_map(|r| {
                    let layer = r.layer?;
                    let mapped = r.selected.iter().map(|&e| to_a(perm, layer, e as u32) as i32).collect();
                    Some(((layer, r.row), mapped))
                })
                .collect();
            for r in &ua.routing {
                let Some(layer) = r.layer else { continue };
                d.compared += 1;
                let other = rows_b.get(&(layer, r.row));
                let equal = other == Some(&r.selected);
                let as_sets = other
                    .is_some_and(|o| o.iter().collect::<BTreeSet<_>>() == r.selected.iter().collect::<BTreeSet<_>>());
                d.equal += u64::from(equal);
                d.equal_as_sets += u64::from(as_sets);
                if !equal && d.mismatches.len() < MAX_MISMATCHES {
                    d.mismatches.push(RoutingMismatch {
                        phase,
                        ubatch: i as u32,
                        layer,
                        row: r.row,
                        a: r.selected.clone(),
                        b: other.cloned(),
                    });
                }
            }
            // Rows only B has are differences too.
            let only_b = rows_b.len().saturating_sub(ua.routing.iter().filter(|r| r.layer.is_some()).count());
            d.compared += only_b as u64;
        }
        // Ubatches only B has differ in token ids too, so they lie past any divergence.
        let extra: usize = ub.iter().skip(in_phase(a, phase).count()).map(|u| u.routing.len()).sum();
        d.after_divergence += extra as u64;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::{Ubatch, correlate::RoutedToken};

    #[test]
    fn heat_classes() {
        assert_eq!(Heat::of(0, 10), Heat::Cold);
        assert_eq!(Heat::of(4, 10), Heat::Warm);
        assert_eq!(Heat::of(5, 10), Heat::Hot);
    }

    /// A ubatch of `phase` with these token ids, routed (in B's numbering
    /// where it is B's) to `experts` in layer 0 for every token.
    fn ubatch(phase: Phase, ids: &[i32], experts: &[i32]) -> Ubatch {
        let routing = (0..ids.len() as u32)
            .map(|row| RoutedToken { layer: Some(0), row, selected: experts.to_vec(), ranking: experts.to_vec() })
            .collect();
        Ubatch { phase, token_ids: ids.to_vec(), routing, ..Ubatch::started(0, 0, None) }
    }

    fn run(ubatches: Vec<Ubatch>) -> Analysis {
        Analysis { ubatches, ..Default::default() }
    }

    #[test]
    fn routing_is_compared_up_to_the_first_token_divergence() {
        // B stores A's expert 2 at position 0 and A's 0 at position 1.
        let perm: Permutation = [(0, vec![2, 0, 1])].into_iter().collect();
        let a = run(vec![
            ubatch(Phase::Prompt, &[1, 7, 8], &[2, 0]),
            ubatch(Phase::Generate, &[5], &[0, 1]),
            ubatch(Phase::Generate, &[6], &[1, 2]),
            ubatch(Phase::Generate, &[9], &[1, 0]),
        ]);
        // Same routing under the permutation while the tokens agree; then a
        // different token (6 → 4) and, from it on, other experts.
        let b = run(vec![
            ubatch(Phase::Prompt, &[1, 7, 8], &[0, 1]),
            ubatch(Phase::Generate, &[5], &[1, 2]),
            ubatch(Phase::Generate, &[4], &[0, 0]),
            ubatch(Phase::Generate, &[3], &[0, 0]),
            ubatch(Phase::Generate, &[3], &[0, 0]),
        ]);
        let div = first_divergence(&a, &b);
        assert_eq!(div, Some(TokenDivergence { phase: Phase::Generate, ubatch: 1, row: 0, id: [Some(6), Some(4)] }));
        let r = routing(&a, &b, Some(&perm), div.as_ref());
        // 3 prompt rows and generated token 0 compared and equal; A's 2 later
        // rows and the row of the ubatch only B has not.
        assert_eq!((r.compared, r.equal, r.after_divergence), (4, 4, 3));
        assert!(r.mismatches.is_empty());
        // Without the permutation, the same rows differ.
        let plain = routing(&a, &b, None, div.as_ref());
        assert_eq!((plain.compared, plain.equal), (4, 0));
        // Nothing diverges in a run compared with itself: all 6 rows compared.
        assert_eq!(first_divergence(&a, &a), None);
        assert_eq!(routing(&a, &a, None, None).equal, 6);
    }

    #[test]
    fn divergence_in_the_prompt_or_in_length() {
        let a = run(vec![ubatch(Phase::Prompt, &[1, 7, 8], &[0]), ubatch(Phase::Generate, &[5], &[0])]);
        let b = run(vec![ubatch(Phase::Prompt, &[1, 7, 9], &[0]), ubatch(Phase::Generate, &[5], &[0])]);
        let div = first_divergence(&a, &b);
        assert_eq!(div, Some(TokenDivergence { phase: Phase::Prompt, ubatch: 0, row: 2, id: [Some(8), Some(9)] }));
        assert_eq!(routing(&a, &b, None, div.as_ref()).compared, 0);
        // B generated one token fewer: it diverges where it has no ubatch.
        let short = run(vec![ubatch(Phase::Prompt, &[1, 7, 8], &[0])]);
        let div = first_divergence(&a, &short);
        assert_eq!(div, Some(TokenDivergence { phase: Phase::Generate, ubatch: 0, row: 0, id: [Some(5), None] }));
        assert_eq!(routing(&a, &short, None, div.as_ref()).compared, 3);
    }

    #[test]
    fn permutation_maps_b_ids_to_a_ids() {
        let perm: Permutation = [(0, vec![2, 0, 1])].into_iter().collect();
        assert_eq!(to_a(Some(&perm), 0, 0), 2);
        assert_eq!(to_a(Some(&perm), 1, 0), 0);
        assert_eq!(to_a(None, 0, 1), 1);
    }
}
