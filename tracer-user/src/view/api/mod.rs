//! The `/api/v1` queries of docs/VIEW_API.md: parameters in, answers from
//! the [`Index`] out. Each runs on the blocking pool, off the I/O threads.

mod lookup;
mod memmap;
mod simulate;
mod tables;

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Value, json};

use super::{
    frame::{self, Column, Frame, NONE_U32},
    index::{Index, phase_code},
    params::{ApiError, Params},
};

pub type Shared = Arc<Index>;

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/v1/meta", get(meta))
        .route("/api/v1/summary", get(summary))
        .route("/api/v1/ubatches", get(ubatches))
        .route("/api/v1/tokens", get(tokens))
        .merge(lookup::routes())
        .merge(memmap::routes())
        .merge(simulate::routes())
        .merge(tables::routes())
}

/// Runs `f` on the blocking pool.
pub async fn blocking<F>(idx: Shared, f: F) -> Result<Response, ApiError>
where
    F: FnOnce(&Index) -> Result<Response, ApiError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || f(&idx)).await.map_err(|e| ApiError::Internal(e.to_string()))?
}

pub fn columns(frame: Frame) -> Response {
    ([(header::CONTENT_TYPE, frame::CONTENT_TYPE)], frame.encode()).into_response()
}

/// Cells `(a, b, n)` as three columns (a grid's sparse form).
pub fn triples(meta: Value, names: [&'static str; 3], cells: &[(u32, u32, u64)]) -> Response {
    columns(
        Frame::new(meta)
            .column(names[0], Column::U32(cells.iter().map(|c| c.0).collect()))
            .column(names[1], Column::U32(cells.iter().map(|c| c.1).collect()))
            .column(names[2], Column::U64(cells.iter().map(|c| c.2).collect())),
    )
}

pub fn json_value(v: Value) -> Response {
    Json(v).into_response()
}

pub fn opt_u32(v: Option<u32>) -> u32 {
    v.unwrap_or(NONE_U32)
}

async fn meta(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    blocking(idx, |idx| {
        let body = idx.meta.get_or_init(|| serde_json::to_vec(&meta_value(idx)).expect("meta serialises"));
        Ok(([(header::CONTENT_TYPE, "application/json")], body.clone()).into_response())
    })
    .await
}

fn meta_value(idx: &Index) -> Value {
    let a = &idx.analysis;
    let tensors: Vec<Value> = idx
        .tensors
        .rows
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": i, "model": t.model, "file": t.file, "name": t.name, "offset": t.y0 - idx.tensors.file_y0[t.model as usize][t.file as usize],
                   "size": t.size, "type": t.type_name, "shape": t.shape, "layer": t.layer, "component": t.component,
                   "n_experts": t.n_experts(), "expert_bytes": t.expert_bytes, "y0": t.y0})
        })
        .collect();
    let models: Vec<Value> = a
        .models
        .iter()
        .enumerate()
        .map(|(m, model)| {
            let files: Vec<Value> = model
                .files
                .iter()
                .enumerate()
                .map(|(f, path)| {
                    let size = model.file_info.get(f).map(|i| i.size);
                    json!({"path": path, "size": size, "y0": idx.tensors.file_y0[m][f]})
                })
                .collect();
            json!({"files": files, "architecture": model.architecture})
        })
        .collect();
    let mut layers: Vec<u32> = idx.tensors.rows.iter().filter_map(|t| t.layer).collect();
    layers.sort_unstable();
    layers.dedup();
    let mut components: Vec<&str> = idx.tensors.rows.iter().map(|t| t.component.as_str()).collect();
    components.sort_unstable();
    components.dedup();
    let moe: Vec<Value> =
        moe_layers(idx).into_iter().map(|l| json!({"layer": l.layer, "n_expert": l.n_expert, "k": l.k})).collect();
    let mut seqs: Vec<i32> = idx.tokens.seq.iter().copied().filter(|&s| s >= 0).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let counts = a.tokens.as_ref();
    json!({
        "trace": {
            "path": idx.path.display().to_string(), "bytes": idx.file_bytes, "truncated": a.truncated,
            "op_timing": a.header.options.op_timing, "duration_ns": idx.memmap.duration,
            "command": a.header.command, "mode": a.header.mode,
        },
        "counts": {
            "ubatches": a.ubatches.len(), "tokens": idx.tokens.len(), "ops": idx.ops.len(), "reads": idx.memmap.reads(),
            "faults": a.faults, "prompt": counts.map(|c| c.prompt), "generated": counts.map(|c| c.generated),
        },
        "op_names": idx.ops.op_names,
        "phases": ["warmup", "prompt", "generate", "aux"],
        "memory_classes": super::index::ops::MemoryClass::NAMES,
        "models": models,
        "tensors": tensors,
        "layers": layers,
        "components": components,
        "moe": moe,
        "sequences": seqs,
        "tracks": {"disk": {"size": idx.tensors.disk_size}, "buffer": {"size": idx.memmap.buffer.size}},
    })
}

/// MoE layers and their expert counts, from the whole run's routing.
fn moe_layers(idx: &Index) -> Vec<crate::analyze::moe::MoeLayer> {
    crate::analyze::moe::routing(&idx.analysis, &idx.analysis.ubatches)
}

/// The report document: as kept (gzipped) to clients that take gzip,
/// else unzipped.
async fn summary(
    State(idx): State<Shared>,
    headers: axum::http::HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|e| e.trim().split(';').next() == Some("gzip")));
    blocking(idx, move |idx| {
        let doc = idx.report().map_err(|e| ApiError::Internal(format!("building the report failed: {e}")))?;
        let json = [(header::CONTENT_TYPE, "application/json")];
        if gzip {
            return Ok((json, [(header::CONTENT_ENCODING, "gzip")], doc.document_gz.as_ref().clone()).into_response());
        }
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(doc.document_gz.as_slice()), &mut body)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok((json, body).into_response())
    })
    .await
}

async fn ubatches(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    blocking(idx, |idx| {
        let body = idx.ubatches_frame.get_or_init(|| ubatches_frame(idx).encode());
        Ok(([(header::CONTENT_TYPE, frame::CONTENT_TYPE)], body.clone()).into_response())
    })
    .await
}

fn ubatches_frame(idx: &Index) -> Frame {
    {
        let a = &idx.analysis;
        let token_of = crate::analyze::walk::token_indices(a);
        let ubs = &a.ubatches;
        let u32s = |f: &dyn Fn(usize) -> u32| Column::U32((0..ubs.len()).map(f).collect());
        let u64s = |f: &dyn Fn(usize) -> u64| Column::U64((0..ubs.len()).map(f).collect());
        Frame::new(json!({}))
            .column("ubatch", u32s(&|i| ubs[i].index))
            .column("decode", u32s(&|i| opt_u32(ubs[i].decode)))
            .column("phase", Column::U8(ubs.iter().map(|u| phase_code(u.phase)).collect()))
            .column("start_ns", u64s(&|i| idx.ubatch_span(i as u32).0))
            .column("end_ns", u64s(&|i| idx.ubatch_span(i as u32).1))
            .column("n_tokens", u32s(&|i| opt_u32(ubs[i].n_tokens)))
            .column("first_token", u32s(&|i| idx.tokens.first_of_ubatch[i]))
            .column("gen", u32s(&|i| opt_u32(token_of[i])))
            .column("seq", Column::I32(ubs.iter().map(|u| u.tokens.first().map_or(-1, |t| t.seq)).collect()))
            .column("ops", u64s(&|i| ubs[i].ops))
            .column("weight_bytes", u64s(&|i| ubs[i].weights.values().map(|w| w.bytes).sum()))
            .column("disk_bytes", u64s(&|i| ubs[i].disk_bytes))
            .column("faults_major", u64s(&|i| ubs[i].faults_major))
            .column("faults_minor", u64s(&|i| ubs[i].faults_minor))
    }
}

async fn tokens(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    blocking(idx, |idx| {
        let t = &idx.tokens;
        let frame = Frame::new(json!({}))
            .column("token", Column::U32((0..t.len() as u32).collect()))
            .column("ubatch", Column::U32(t.ubatch.clone()))
            .column("row", Column::U32(t.row.clone()))
            .column("token_id", Column::I32(t.token_id.clone()))
            .column("seq", Column::I32(t.seq.clone()))
            .column("pos", Column::I32(t.pos.clone()))
            .column("generated", Column::U8(t.generated.clone()));
        Ok(columns(frame))
    })
    .await
}
