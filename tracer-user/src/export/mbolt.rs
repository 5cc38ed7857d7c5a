//! `--format mbolt`: MoE routing as mbolt's MBLT v1 routing log, the file its
//! llama.cpp patch (`MBOLT_TRACE`) writes, so `mbolt-sim cluster` and mbolt's
//! layout rewrite run on an unmodified binary's trace.
//!
//! Little-endian int32 stream: `0x544C424D` ("MBLT"), version 1, n_expert;
//! then per MoE layer call in graph order: layer, k, n_tokens,
//! ids[n_tokens × k] token-major (each token's experts, best first). As with
//! the patch, a prompt's last layer routes only the output tokens. Warm-up
//! and auxiliary graphs are left out, so decode passes are the generated
//! tokens.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use super::{ExportError, Written};
use crate::analyze::{Analysis, Phase, tensor::is_expert_tensor};

pub const MAGIC: i32 = 0x544C_424D;
pub const VERSION: i32 = 1;

pub fn write(analysis: &Analysis, out: &Path) -> Result<Written, ExportError> {
    let calls = layer_calls(analysis);
    if calls.is_empty() {
        return Err(ExportError::Invalid(
            "this trace has no MoE routing, so there is nothing to write as MBLT: the model has no MoE \
             layers, or no prompt or generate graph ran (see `ttrace report`)"
                .into(),
        ));
    }
    let n_expert = n_expert(analysis, &calls);
    let mut w = BufWriter::new(File::create(out).map_err(ExportError::write(out))?);
    let mut ints = vec![MAGIC, VERSION, n_expert];
    for c in &calls {
        ints.extend([c.layer, c.k, c.rows.len() as i32]);
        for row in &c.rows {
            ints.extend_from_slice(row);
        }
    }
    let bytes: Vec<u8> = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
    w.write_all(&bytes).and_then(|()| w.flush()).map_err(ExportError::write(out))?;
    let tokens = analysis.ubatches.iter().filter(|u| u.phase == Phase::Generate).count();
    Ok(Written { events: calls.len() as u64, items: tokens as u64 })
}

/// One MoE layer's routing in one graph.
struct LayerCall {
    layer: i32,
    k: i32,
    rows: Vec<Vec<i32>>,
}

fn layer_calls(a: &Analysis) -> Vec<LayerCall> {
    let mut calls = Vec::new();
    for u in a.ubatches.iter().filter(|u| matches!(u.phase, Phase::Prompt | Phase::Generate)) {
        let mut by_layer: BTreeMap<u32, Vec<(u32, &Vec<i32>)>> = BTreeMap::new();
        for r in &u.routing {
            if let Some(layer) = r.layer {
                by_layer.entry(layer).or_default().push((r.row, &r.selected));
            }
        }
        for (layer, mut rows) in by_layer {
            rows.sort_by_key(|&(row, _)| row);
            let k = rows.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
            calls.push(LayerCall {
                layer: layer as i32,
                k: k as i32,
                rows: rows.into_iter().map(|(_, s)| s.clone()).collect(),
            });
        }
    }
    calls
}

/// From the model's expert tensors (size / slice), else the largest id seen.
fn n_expert(a: &Analysis, calls: &[LayerCall]) -> i32 {
    let from_table = a
        .models
        .iter()
        .flat_map(|m| &m.tensors)
        .filter(|t| is_expert_tensor(t))
        .filter_map(|t| t.expert_bytes.filter(|&s| s > 0).map(|s| (t.size_bytes / s) as i32))
        .max();
    let seen = calls.iter().flat_map(|c| c.rows.iter().flatten()).max().map_or(0, |&e| e + 1);
    from_table.unwrap_or(0).max(seen)
}
