//! One module per subcommand; `main.rs` dispatches to them.
pub mod check;
