//! Command-line definition. Parsing only; `main.rs` dispatches.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ttrace",
    version,
    about = "Trace which tensors a llama.cpp process touches, and the I/O they cause",
    long_about = "ttrace attaches eBPF probes to ggml's CPU backend and to the kernel's page-fault, \
page-cache and block-I/O tracepoints, and ties each tensor access to the disk reads it causes.\n\n\
Tracing needs root: run it with sudo on a normal machine.",
    after_help = "Examples:\n  sudo ttrace check            verify that this kernel can run ttrace's probes"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); also honours RUST_LOG.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check that this machine can run ttrace: load the probes, uprobe a
    /// function in ttrace itself, trace page faults, and compare what arrives
    /// with what was done.
    #[command(after_help = "Examples:\n  sudo ttrace check\n  sudo ttrace check --calls 100000 --pages 256")]
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Calls made to the probed function.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub calls: u64,
    /// Fresh file-backed pages written (one page fault each).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=65_536))]
    pub pages: u64,
}
