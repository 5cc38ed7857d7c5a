//! ttrace as a library, split by stage: load → collect → (resolve → correlate
//! → record → export). The binary in `main.rs` is a thin CLI over it.
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod correlate;
pub mod events;
pub mod export;
pub mod load;
pub mod privileges;
pub mod record;
pub mod resolve;
pub mod selftest;
pub mod target;
pub mod tracefs;
