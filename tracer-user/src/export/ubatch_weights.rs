//! Graph capture times ubatches, not ops: the Perfetto and Chrome timelines
//! draw the weights a ubatch's ops read as slices spanning the ubatch, per
//! layer track, in first-read order. One collector serves both.

use std::collections::BTreeMap;

use crate::analyze::{
    tensor::{model_tensor, weight_of},
    walk::{OpEvent, Tables},
};

/// A weight one ubatch read: `(model, tensor, read as a copy)`.
pub type UbatchWeight = (u32, u32, bool);

#[derive(Default)]
pub struct UbatchWeights {
    /// `(model, layer)` → the weights, in first-read order.
    by_layer: BTreeMap<(u32, Option<u32>), Vec<UbatchWeight>>,
}

impl UbatchWeights {
    pub fn note(&mut self, e: &OpEvent, t: &Tables) {
        for &(_, id) in e.op.srcs.iter() {
            let Some(w) = weight_of(t.descriptor(id)) else { continue };
            let Some(tensor) = model_tensor(t.models, w.model, w.tensor) else { continue };
            let weights = self.by_layer.entry((w.model, tensor.layer)).or_default();
            if !weights.iter().any(|&(m, x, _)| (m, x) == (w.model, w.tensor)) {
                weights.push((w.model, w.tensor, w.copy));
            }
        }
    }

    /// The ubatch ended: its weights per `(model, layer)`, and a fresh start.
    pub fn take(&mut self) -> BTreeMap<(u32, Option<u32>), Vec<UbatchWeight>> {
        std::mem::take(&mut self.by_layer)
    }
}
