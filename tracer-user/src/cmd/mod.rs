//! One module per subcommand; `main.rs` dispatches to them.
#[cfg(feature = "live")]
pub mod attach;
#[cfg(feature = "live")]
pub mod check;
pub mod export;
pub mod gguf;
pub mod report;
#[cfg(feature = "live")]
pub mod run;
