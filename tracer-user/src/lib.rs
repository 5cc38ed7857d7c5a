//! ttrace as a library. Data flows one way along two paths:
//!
//! - live ([`live`], feature `live`): load the eBPF programs → collect ring
//!   records → record them into a trace file, resolving every tensor
//!   pointer against the model files ([`model`]) while recording;
//! - offline: read the trace ([`format`]) → [`analyze`] → [`export`], or
//!   → [`view`], the HTTP server of `ttrace view`.
//!
//! `model`, `format` and `analyze` depend on neither `export` nor `live`
//! (a test in `tests/module_deps.rs` checks it), and the offline path builds
//! without the eBPF toolchain: `cargo build -p tracer-user --no-default-features`.
//! The binary in `main.rs` is a thin CLI over [`cmd`].
pub mod analyze;
pub mod cli;
pub mod cmd;
pub mod events;
pub mod export;
pub mod format;
#[cfg(feature = "live")]
pub mod live;
pub mod model;
pub mod sweep;
pub mod units;
pub mod view;
