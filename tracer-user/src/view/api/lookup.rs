//! Lookups by id (docs/VIEW_API.md "Lookups by id"): what one ubatch,
//! token, op, tensor, layer, expert or sequence is, so views can link.

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    response::Response,
    routing::get,
};
use serde_json::{Value, json};

use super::{Shared, blocking, json_value};
use crate::view::{
    index::{Index, ops::MemoryClass},
    params::{ApiError, Params},
};

pub fn routes() -> axum::Router<Shared> {
    Router::new()
        .route("/api/v1/ubatch/{id}", get(ubatch))
        .route("/api/v1/token/{id}", get(token))
        .route("/api/v1/op/{id}", get(op))
        .route("/api/v1/tensor/{id}", get(tensor))
        .route("/api/v1/layer/{id}", get(layer))
        .route("/api/v1/expert/{layer}/{expert}", get(expert))
        .route("/api/v1/sequence/{id}", get(sequence))
}

fn not_found(what: &str, id: impl std::fmt::Display) -> ApiError {
    ApiError::NotFound(format!("no {what} {id} in this trace"))
}

/// A path id: a number, else 400.
fn id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a valid {what} id")))
}

async fn lookup(
    idx: Shared,
    q: Option<String>,
    f: impl FnOnce(&Index) -> Result<Value, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    blocking(idx, move |idx| f(idx).map(json_value)).await
}

async fn ubatch(
    State(idx): State<Shared>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let u: u32 = id(&raw, "ubatch")?;
    lookup(idx, q, move |idx| {
        let ub = idx.analysis.ubatches.get(u as usize).ok_or_else(|| not_found("ubatch", u))?;
        let mut v = serde_json::to_value(ub).map_err(|e| ApiError::Internal(e.to_string()))?;
        let rows = idx.ops.ubatch_ops.get(u as usize).filter(|r| r.0 < r.1);
        v["op_seq_range"] = json!(rows.map(|r| [idx.ops.seq(r.0 as usize), idx.ops.seq(r.1 as usize - 1)]));
        v["first_token"] = json!(idx.tokens.first_of_ubatch.get(u as usize));
        let (start, end) = idx.ubatch_span(u);
        v["start_rel_ns"] = json!(start);
        v["end_rel_ns"] = json!(end);
        Ok(v)
    })
    .await
}

async fn token(
    State(idx): State<Shared>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let t: usize = id(&raw, "token")?;
    lookup(idx, q, move |idx| {
        let k = &idx.tokens;
        if t >= k.len() {
            return Err(not_found("token", t));
        }
        let kind = match k.generated[t] {
            1 => "generated",
            0 => "prompt",
            _ => "unknown",
        };
        Ok(json!({"token": t, "ubatch": k.ubatch[t], "row": k.row[t], "token_id": k.token_id[t], "seq": k.seq[t],
                  "pos": k.pos[t], "kind": kind}))
    })
    .await
}

async fn op(State(idx): State<Shared>, Path(raw): Path<String>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let seq: u64 = id(&raw, "op")?;
    lookup(idx, q, move |idx| {
        let ops = &idx.ops;
        let i = ops.row_of_seq(seq).ok_or_else(|| not_found("op", seq))?;
        let sig = ops.sig_of(i);
        let reads: Vec<Value> = idx
            .memmap
            .reads_of_op(i as u32, ops.start(i))
            .map(|r| json!({"tensor": r.tensor(), "y0": r.y0, "y1": r.y0 + u64::from(r.len), "copy": r.copy()}))
            .collect();
        let weights: Vec<Value> = sig
            .weights
            .iter()
            .map(|&t| json!({"tensor": t, "name": idx.tensors.rows.get(t as usize).map(|r| r.name.as_str())}))
            .collect();
        let ubatch = ops.ubatch(i);
        let buffer = |id: &Option<u32>| {
            id.and_then(|id| idx.analysis.buffers.list.get(id as usize)).map(|b| {
                json!({"id": b.id, "name": b.name(), "usage": b.label()})
            })
        };
        Ok(json!({
            "op": seq, "row": i, "name": ops.op_names[sig.op as usize], "ubatch": ubatch,
            "phase": ubatch.and_then(|u| idx.phase_of(u)), "start_ns": ops.start(i),
            "dur_ns": ops.dur(i), "layer": sig.layer,
            "dst": ops.strings[sig.dst as usize], "dst_memory": MemoryClass::NAMES[sig.memory as usize],
            "srcs": sig.src_names.iter().map(|&n| ops.strings[n as usize].as_str()).collect::<Vec<_>>(),
            "weight_bytes": ops.weight_bytes(i), "weights": weights, "reads": reads,
            "dst_buffer": buffer(&sig.dst_buffer), "src_buffers": sig.src_buffers.iter().map(buffer).collect::<Vec<_>>(),
        }))
    })
    .await
}

async fn tensor(
    State(idx): State<Shared>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let t: u32 = id(&raw, "tensor")?;
    lookup(idx, q, move |idx| {
        let row = idx.tensors.rows.get(t as usize).ok_or_else(|| not_found("tensor", t))?;
        let reported = idx.report().map_err(ApiError::Internal)?;
        let stats = &reported.stats;
        let usage = stats
            .loaded_vs_used
            .as_ref()
            .and_then(|u| u.tensors.iter().find(|x| x.model == row.model && x.tensor == row.index));
        let tstats = stats.tensors.iter().find(|x| x.model == row.model && x.tensor == row.index);
        let io = idx.analysis.io.tensors.iter().find(|x| x.model == row.model && x.tensor == row.index);
        let reading: Vec<bool> = idx.ops.sigs.iter().map(|s| s.weights.contains(&t)).collect();
        let combo_reads: Vec<bool> = idx.ops.combos.iter().map(|c| reading[c.sig as usize]).collect();
        let ops = idx.ops.combo.iter().filter(|&&c| combo_reads[c as usize]).count();
        let ubatches = idx.analysis.ubatches.iter().filter(|u| u.weights.contains_key(&(row.model, row.index))).count();
        Ok(json!({
            "tensor": t, "model": row.model, "index": row.index, "name": row.name, "file": row.file, "y0": row.y0,
            "size": row.size, "type": row.type_name, "shape": row.shape, "layer": row.layer,
            "component": row.component, "n_experts": row.n_experts(), "expert_bytes": row.expert_bytes,
            "ops": ops, "ubatches": ubatches, "usage": usage, "stats": tstats, "io": io,
        }))
    })
    .await
}

async fn layer(
    State(idx): State<Shared>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let l: u32 = id(&raw, "layer")?;
    lookup(idx, q, move |idx| {
        let tensors: Vec<usize> =
            idx.tensors.rows.iter().enumerate().filter(|(_, t)| t.layer == Some(l)).map(|(i, _)| i).collect();
        if tensors.is_empty() {
            return Err(not_found("layer", l));
        }
        let reported = idx.report().map_err(ApiError::Internal)?;
        let stats = &reported.stats;
        let key = crate::analyze::stats::layer_key(Some(l));
        Ok(json!({
            "layer": l, "tensors": tensors,
            "stats": stats.layers.iter().find(|g| g.key == key),
            "usage": stats.loaded_vs_used.as_ref().and_then(|u| u.layers.iter().find(|x| x.layer == Some(l))),
        }))
    })
    .await
}

async fn expert(
    State(idx): State<Shared>,
    Path((raw_layer, raw_expert)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (l, e): (u32, u32) = (id(&raw_layer, "layer")?, id(&raw_expert, "expert")?);
    lookup(idx, q, move |idx| {
        let slices: Vec<Value> = idx
            .tensors
            .rows
            .iter()
            .enumerate()
            .filter(|(_, t)| t.layer == Some(l) && t.n_experts().is_some_and(|n| e < n))
            .map(|(i, t)| {
                let slice = t.expert_bytes.unwrap_or(0);
                let y0 = t.y0 + u64::from(e) * slice;
                json!({"tensor": i, "name": t.name, "y0": y0, "y1": y0 + slice})
            })
            .collect();
        if slices.is_empty() {
            return Err(not_found("expert", format!("{e} of layer {l}")));
        }
        let reported = idx.report().map_err(ApiError::Internal)?;
        let stats = &reported.stats;
        let layer = stats.moe.as_ref().and_then(|m| m.layers.iter().find(|x| x.layer == l));
        let activations: Vec<Value> = layer
            .map(|x| {
                x.phases
                    .iter()
                    .map(|p| json!({"phase": p.phase, "tokens": p.activations.get(e as usize).copied().unwrap_or(0)}))
                    .collect()
            })
            .unwrap_or_default();
        let usage =
            stats.loaded_vs_used.as_ref().and_then(|u| u.experts.iter().find(|x| x.layer == l && x.expert == e));
        Ok(json!({"layer": l, "expert": e, "slices": slices, "activations": activations, "usage": usage}))
    })
    .await
}

async fn sequence(
    State(idx): State<Shared>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let s: i32 = id(&raw, "sequence")?;
    lookup(idx, q, move |idx| {
        let ubatches: Vec<u32> =
            idx.analysis.ubatches.iter().filter(|u| u.tokens.iter().any(|t| t.seq == s)).map(|u| u.index).collect();
        if ubatches.is_empty() {
            return Err(not_found("sequence", s));
        }
        let tokens = idx.tokens.seq.iter().filter(|&&x| x == s).count();
        let requests: Vec<&crate::analyze::sequences::Request> =
            idx.analysis.requests.iter().filter(|r| r.seq == s).collect();
        let reported = idx.report().map_err(ApiError::Internal)?;
        let costs: Vec<_> =
            requests.iter().filter_map(|r| reported.stats.requests.iter().find(|x| x.index == r.index)).collect();
        Ok(json!({"seq": s, "ubatches": ubatches, "tokens": tokens, "requests": requests, "request_stats": costs}))
    })
    .await
}
