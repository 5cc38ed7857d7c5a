//! The HTTP server: the API, the embedded front end, nothing else. With a
//! token (a non-loopback address), every request must carry it, in the
//! query or in the cookie the index page sets.

use std::sync::Arc;

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use tower_http::compression::{CompressionLayer, CompressionLevel};

use super::{api, assets, index::Index, params::ApiError};

const COOKIE: &str = "ttrace_token";

pub fn router(index: Arc<Index>, token: Option<String>) -> Router {
    let token = Arc::new(token);
    api::routes()
        .fallback(static_file)
        .with_state(index)
        .layer(middleware::from_fn(server_timing))
        .layer(middleware::from_fn_with_state(token, check_token))
        // The fastest level: at gzip's default, compressing the ubatch list
        // of a 100 M-op trace (14 MB) took 0.5 s, longer than computing any
        // answer; zstd (Chromium and Firefox ask for it) at level 1 takes
        // 0.03 s for a 3.8 MB body.
        .layer(CompressionLayer::new().quality(CompressionLevel::Fastest))
}

/// `Server-Timing: app;dur=MS`: the time the server spent on a request
/// before compression (`cargo xtask bench` reads it per query kind).
async fn server_timing(req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let mut response = next.run(req).await;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={ms:.3}")) {
        response.headers_mut().insert("server-timing", v);
    }
    response
}

async fn check_token(State(token): State<Arc<Option<String>>>, req: Request, next: Next) -> Response {
    let Some(token) = token.as_deref() else { return next.run(req).await };
    let in_query = req
        .uri()
        .query()
        .is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "token" && same(&v, token)));
    let in_cookie = req
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && same(v, token));
    if !in_query && !in_cookie {
        return ApiError::Forbidden.into_response();
    }
    let mut response = next.run(req).await;
    if in_query
        && let Ok(cookie) = HeaderValue::from_str(&format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"))
    {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// Compares without stopping at the first difference.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn static_file(method: Method, req: Request<Body>) -> Response {
    let path = req.uri().path();
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "only GET").into_response();
    }
    if path.starts_with("/api/") {
        return ApiError::NotFound(format!("no query {path} (see docs/VIEW_API.md)")).into_response();
    }
    match assets::get(path) {
        Some((bytes, media)) => ([(header::CONTENT_TYPE, media)], bytes).into_response(),
        None if path == "/" || path == "/index.html" => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], assets::placeholder()).into_response()
        }
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}
