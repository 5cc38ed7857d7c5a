//! The front end, embedded at compile time from `viewer/dist` (build.rs
//! lists its files); a build without it serves a page saying how to build it.

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/viewer_assets.rs"));
}

/// Whether this binary holds the built front end.
pub fn built() -> bool {
    embedded::ASSETS.iter().any(|(name, _)| *name == "index.html")
}

/// An embedded file by its path under `viewer/dist`, and its media type.
pub fn get(path: &str) -> Option<(&'static [u8], &'static str)> {
    let path = path.trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    let (_, bytes) = embedded::ASSETS.iter().find(|(name, _)| *name == path)?;
    Some((bytes, media_type(path)))
}

fn media_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("wasm") => "application/wasm",
        Some("woff2") => "font/woff2",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

pub const HOW_TO_BUILD: &str = "this ttrace was built without its web front end (viewer/dist): run `cargo xtask setup`, \
which builds it, then rebuild ttrace; the HTTP API (docs/VIEW_API.md) works without it";

/// Served at `/` when the front end is not built in.
pub fn placeholder() -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ttrace view</title></head>\
         <body style=\"font-family:sans-serif;max-width:48em;margin:3em auto\"><h1>ttrace view</h1>\
         <p>The server is running, but {HOW_TO_BUILD}.</p>\
         <p>Try <a href=\"api/v1/meta\">api/v1/meta</a> or <a href=\"api/v1/summary\">api/v1/summary</a>.</p>\
         </body></html>"
    )
}
