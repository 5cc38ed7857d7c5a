//! `diff --values`: two runs' node outputs walked in step, paired by
//! (ubatch, node name, occurrence of that name in the ubatch). The first
//! pair whose fingerprints differ is where the runs part; per layer, how far
//! they drift (RMS) and how much they still point the same way (cosine of
//! the projections, comparable across precisions).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::values::ValueRow;
use crate::format::values::Fingerprint;

/// Where a node output is, in both runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NodeKey {
    pub ubatch: u32,
    pub name: String,
    /// How many outputs of the same name came before it in the ubatch.
    pub occurrence: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct Divergence {
    pub node: NodeKey,
    pub op: String,
    pub layer: Option<u32>,
    pub node_index: [Option<u32>; 2],
    pub blake3: [String; 2],
    pub sum: [f64; 2],
    pub rms: [f64; 2],
    pub cosine: f64,
    /// Why it counts as different: `shape`, `bytes` or `beyond rtol`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayerDrift {
    pub layer: Option<u32>,
    pub nodes: u64,
    /// Pairs whose bytes differ.
    pub differing: u64,
    /// Largest |rms_b - rms_a| / rms_a among the layer's outputs.
    pub max_rms_drift: f64,
    /// Smallest cosine similarity of the projections.
    pub min_cosine: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ValuesDiff {
    pub rtol: Option<f64>,
    /// Pairs with a fingerprint on both sides.
    pub compared: u64,
    pub first: Option<Divergence>,
    /// Outputs only one run has (or fingerprinted on one side only).
    pub only_a: Vec<NodeKey>,
    pub only_b: Vec<NodeKey>,
    pub layers: Vec<LayerDrift>,
}

impl ValuesDiff {
    pub fn same(&self) -> bool {
        self.first.is_none() && self.only_a.is_empty() && self.only_b.is_empty()
    }
}

/// Each fingerprinted output with its key, in run order.
fn keyed(rows: &[ValueRow]) -> Vec<(NodeKey, &ValueRow, &Fingerprint)> {
    let mut seen: HashMap<(u32, &str), u32> = HashMap::new();
    let mut out = Vec::new();
    for r in rows {
        let (Some(ubatch), Some(fp)) = (r.ubatch, r.fingerprint.as_ref()) else { continue };
        let n = seen.entry((ubatch, r.name.as_str())).or_insert(0);
        out.push((NodeKey { ubatch, name: r.name.clone(), occurrence: *n }, r, fp));
        *n += 1;
    }
    out
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 && nb == 0.0 {
        1.0
    } else if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

fn relative(a: f64, b: f64) -> f64 {
    let scale = a.abs().max(b.abs());
    if scale == 0.0 { 0.0 } else { (a - b).abs() / scale }
}

/// Why `a` and `b` differ, if they do: exactly (`rtol` None) or beyond
/// `rtol` in RMS or in the projection (relative L2 of the difference).
fn differs(a: &ValueRow, fa: &Fingerprint, b: &ValueRow, fb: &Fingerprint, rtol: Option<f64>) -> Option<&'static str> {
    if a.ne != b.ne {
        return Some("shape");
    }
    let Some(rtol) = rtol else { return (fa.blake3 != fb.blake3).then_some("bytes") };
    let diff: f64 =
        fa.projection.iter().zip(&fb.projection).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
    let norm = |p: &[f32]| p.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let scale = norm(&fa.projection).max(norm(&fb.projection));
    let projected = if scale == 0.0 { 0.0 } else { diff.sqrt() / scale };
    (relative(fa.rms, fb.rms) > rtol || projected > rtol || fa.nan + fa.inf != fb.nan + fb.inf).then_some("beyond rtol")
}

pub fn diff(a: &[ValueRow], b: &[ValueRow], rtol: Option<f64>) -> ValuesDiff {
    let (ka, kb) = (keyed(a), keyed(b));
    let by_key: HashMap<&NodeKey, (&ValueRow, &Fingerprint)> = kb.iter().map(|(k, r, f)| (k, (*r, *f))).collect();
    let in_a: HashMap<&NodeKey, ()> = ka.iter().map(|(k, _, _)| (k, ())).collect();
    let mut layers: BTreeMap<Option<u32>, LayerDrift> = BTreeMap::new();
    let mut first = None;
    let mut only_a = Vec::new();
    let mut compared = 0;
    for (key, ra, fa) in &ka {
        let Some(&(rb, fb)) = by_key.get(key) else {
            only_a.push(key.clone());
            continue;
        };
        compared += 1;
        let cos = cosine(&fa.projection, &fb.projection);
        let reason = differs(ra, fa, rb, fb, rtol);
        let layer = layers.entry(ra.layer).or_insert(LayerDrift {
            layer: ra.layer,
            nodes: 0,
            differing: 0,
            max_rms_drift: 0.0,
            min_cosine: 1.0,
        });
        layer.nodes += 1;
        layer.differing += u64::from(fa.blake3 != fb.blake3);
        layer.max_rms_drift = layer.max_rms_drift.max(relative(fa.rms, fb.rms));
        layer.min_cosine = layer.min_cosine.min(cos);
        if first.is_none()
            && let Some(reason) = reason
        {
            first = Some(Divergence {
                node: key.clone(),
                op: ra.op.clone(),
                layer: ra.layer,
                node_index: [ra.node_index, rb.node_index],
                blake3: [hex(&fa.blake3), hex(&fb.blake3)],
                sum: [fa.sum, fb.sum],
                rms: [fa.rms, fb.rms],
                cosine: cos,
                reason,
            });
        }
    }
    let only_b = kb.iter().filter(|(k, _, _)| !in_a.contains_key(k)).map(|(k, _, _)| k.clone()).collect();
    ValuesDiff { rtol, compared, first, only_a, only_b, layers: layers.into_values().collect() }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ubatch: u32, name: &str, v: f32) -> ValueRow {
        let mut projection = [0f32; 64];
        projection[0] = v;
        projection[1] = 1.0;
        ValueRow {
            ubatch: Some(ubatch),
            token_index: None,
            seq_ids: vec![],
            node_index: Some(0),
            name: name.into(),
            op: "ADD".into(),
            type_name: "F32".into(),
            ne: [1, 1, 1, 1],
            nbytes: Some(4),
            layer: Some(0),
            flags: vec![],
            fused_into: None,
            superseded: 0,
            fingerprint: Some(Fingerprint {
                elements: 1,
                blake3: *blake3::hash(&v.to_le_bytes()).as_bytes(),
                sum: f64::from(v),
                rms: f64::from(v).abs(),
                min: f64::from(v),
                max: f64::from(v),
                nan: 0,
                inf: 0,
                first: vec![v],
                last: vec![v],
                projection,
            }),
        }
    }

    #[test]
    fn names_the_first_differing_occurrence() {
        let a = [row(0, "x-0", 1.0), row(0, "x-0", 2.0), row(1, "x-0", 3.0)];
        let b = [row(0, "x-0", 1.0), row(0, "x-0", 2.001), row(1, "x-0", 4.0)];
        let exact = diff(&a, &b, None);
        let first = exact.first.unwrap();
        assert_eq!((first.node.ubatch, first.node.occurrence, first.reason), (0, 1, "bytes"));
        // Within 1e-2 the second pair agrees; the third does not.
        let loose = diff(&a, &b, Some(1e-2)).first.unwrap();
        assert_eq!((loose.node.ubatch, loose.reason), (1, "beyond rtol"));
        assert!(diff(&a, &a, None).same());
    }
}
