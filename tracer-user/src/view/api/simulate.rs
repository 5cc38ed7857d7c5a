//! `/api/v1/simulate`: `ttrace simulate TRACE --json`'s document, computed
//! by its own code (`analyze::simulate::curve`) and kept. A replay of a long
//! trace takes minutes, so the first request starts it in the background
//! ([`Background`]) and every request until it is done is answered 202 with
//! its progress; the other queries answer meanwhile.

use axum::{
    Json, Router,
    extract::{RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::json;

use super::Shared;
use crate::{
    analyze::{
        simulate::curve::{self, Request},
        walk,
    },
    view::{background::Status, index::Index, params::ApiError, params::Params},
};

/// Reading the trace's share of the whole; the (budget, policy) rows'
/// replays are the rest (a 1000-token run of the tiny model: 6 s of
/// reading, then minutes of replays, the 2q rows the longest).
const READ_SHARE: f64 = 0.05;

pub fn routes() -> Router<Shared> {
    Router::new().route("/api/v1/simulate", get(simulate))
}

async fn simulate(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    let events = walk::event_total(&idx.analysis);
    let work = idx.clone();
    let stages = [(READ_SHARE, events), (1.0 - READ_SHARE, 0)];
    let status = (idx.simulated)
        .poll("simulate", &stages, move |bars| document(&work, &bars[0], &bars[1]))
        .map_err(|e| ApiError::Internal(format!("cannot start the simulation: {e}")))?;
    match status {
        Status::Computing(progress) => {
            let progress = (progress * 1000.0).round() / 1000.0;
            Ok((StatusCode::ACCEPTED, Json(json!({"state": "computing", "progress": progress}))).into_response())
        }
        Status::Done(Ok(body)) => {
            Ok(([(header::CONTENT_TYPE, "application/json")], body.as_ref().clone()).into_response())
        }
        Status::Done(Err(why)) => Err(ApiError::NotFound(why)),
    }
}

/// The document, or why there is none (a trace that read no model file).
fn document(idx: &Index, read: &indicatif::ProgressBar, rows: &indicatif::ProgressBar) -> Result<Vec<u8>, String> {
    let curve = curve::compute(&idx.path, &idx.analysis, &Request::defaults(), read, rows)
        .map_err(|e| format!("cannot simulate {}: {e}", idx.path.display()))?;
    let mut doc = serde_json::to_value(&curve).map_err(|e| e.to_string())?;
    if let Some(fields) = doc.as_object_mut() {
        fields.insert("trace".into(), idx.path.display().to_string().into());
        fields.insert("layout".into(), serde_json::Value::Null);
    }
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}
