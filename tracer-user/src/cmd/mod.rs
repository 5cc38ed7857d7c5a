//! One module per subcommand; `main.rs` dispatches to them.
pub mod check;
pub mod gguf;
pub mod attach;
pub mod report;
pub mod run;
pub mod session;
pub mod summary;
