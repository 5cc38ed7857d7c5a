//! `ttrace sweep`: a plan of models × prompts × settings, each run traced
//! ([`runner`], live), appended to one Parquet dataset (`export::dataset`)
//! and compared across runs (`ttrace sweep report`: [`report`], reading the
//! runs' traces through `analyze`).
//!
//! ```text
//! plan.rs ──▶ runner.rs ──▶ live::session ──▶ traces/<id>.data
//!                  └──▶ analyze ──▶ export::dataset ──▶ dataset/table=…/…
//!                  └──▶ state.rs: runs/<id>.json (done)
//! report.rs: runs/*.json + traces ──▶ analyze::sweep ──▶ report.json, report.html
//! ```

#[cfg(feature = "live")]
mod llama_log;
pub mod plan;
pub mod report;
#[cfg(feature = "live")]
pub mod runner;
#[cfg(feature = "live")]
mod server;
pub mod state;
