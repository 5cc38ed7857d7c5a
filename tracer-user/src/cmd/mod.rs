//! One module per subcommand; `main.rs` dispatches to them.
pub mod attach;
pub mod check;
pub mod export;
pub mod gguf;
pub mod report;
pub mod run;
pub mod session;
pub mod summary;
