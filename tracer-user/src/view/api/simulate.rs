//! `/api/v1/simulate`: `ttrace simulate TRACE --json`'s document, computed
//! by its own code (`analyze::simulate::curve`) on first request and kept:
//! a replay of the trace takes seconds on a long run, so not at start-up.

use axum::{
    Router,
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
    routing::get,
};

use super::{Shared, blocking};
use crate::{
    analyze::simulate::curve::{self, Request},
    view::{index::Index, params::ApiError, params::Params},
};

pub fn routes() -> Router<Shared> {
    Router::new().route("/api/v1/simulate", get(simulate))
}

async fn simulate(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    Params::parse(q.as_deref(), &[])?;
    blocking(idx, |idx| {
        // Concurrent first requests wait for the one computation.
        let body = idx.simulated.get_or_init(|| document(idx)).clone().map_err(ApiError::NotFound)?;
        Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
    })
    .await
}

/// The document, or why there is none (a trace that read no model file).
fn document(idx: &Index) -> Result<Vec<u8>, String> {
    let started = std::time::Instant::now();
    let hidden = indicatif::ProgressBar::hidden();
    let curve = curve::compute(&idx.path, &idx.analysis, &Request::defaults(), &hidden, &hidden)
        .map_err(|e| format!("cannot simulate {}: {e}", idx.path.display()))?;
    let mut doc = serde_json::to_value(&curve).map_err(|e| e.to_string())?;
    if let Some(fields) = doc.as_object_mut() {
        fields.insert("trace".into(), idx.path.display().to_string().into());
        fields.insert("layout".into(), serde_json::Value::Null);
    }
    log::info!("simulated in {:.2?}", started.elapsed());
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}
