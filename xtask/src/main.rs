//! Project tasks: `cargo xtask setup|demo|test|bench|lint|paths`. Every task runs the
//! idempotent set-up first, so a fresh machine needs nothing else.
mod bench;
mod cache;
mod debian_root;
mod demo;
mod dist;
mod kernels;
mod lint;
mod llama_versions;
mod programs;
mod scratch;
mod setup;
mod shell;
mod targets;
mod test;
mod viewer;
mod whisper;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ttrace's build, set-up and test tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything ttrace's build, tests and demo need (idempotent, cached).
    Setup,
    /// Set up, then trace a real llama-completion run and write a report and a timeline.
    Demo,
    /// Set up, then run the whole test suite, including the root-only eBPF tests.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test-name filter).
        #[arg(trailing_var_arg = true)]
        cargo_args: Vec<String>,
    },
    /// Set up, then measure overhead, ingest, trace size, export speed, a profile and llama-server into
    /// docs/BENCHMARKS.md (root).
    Bench {
        /// Interleaved rounds of the overhead comparison.
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// Smoke run: at most 3 rounds, 16 tokens, small export traces.
        #[arg(long)]
        quick: bool,
        /// Only these parts (comma-separated or repeated): rewrites their sections of docs/BENCHMARKS.md
        /// and their rows of docs/benchmarks.csv, leaving the rest.
        #[arg(long, value_delimiter = ',')]
        only: Vec<bench::Part>,
        /// The same as `--only server`.
        #[arg(long, hide = true)]
        server_only: bool,
    },
    /// Set up, then run the kernel matrix only: ttrace's kernel-dependent tests in each Debian kernel,
    /// booted in qemu (`cargo xtask test` runs it after the host suites).
    Kernels {
        /// Only these kernel series (comma-separated, e.g. `6.1,6.12`).
        #[arg(long, value_delimiter = ',')]
        kernel: Vec<String>,
        /// Only the cases whose name contains this (e.g. `run`).
        #[arg(long)]
        case: Option<String>,
        /// Run each chosen case this many times in one boot (a rare failure's rate);
        /// the table shows `pass xN` or `FAIL k/N`.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=200))]
        repeat: u32,
    },
    /// rustfmt and clippy (-D warnings) on the host crates, and clippy on the eBPF crate for its bpf target.
    Lint,
    /// Print where the set-up put llama-completion, the venv python and the models (JSON).
    Paths,
    /// A release for users without Rust: a static (musl) ttrace with the eBPF object and viewer embedded,
    /// as target/dist/ttrace-<version>-x86_64-linux.tar.gz and ttrace_<version>_amd64.deb.
    Dist {
        /// Then install the .deb in a clean Debian root (debootstrap, cached) without Rust and trace the
        /// tiny model there: `ttrace check`, `run` and `report` (root; runs the whole set-up first).
        #[arg(long)]
        verify: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.task {
        Task::Setup => setup::run().map(drop),
        Task::Demo => demo::run(),
        Task::Test { cargo_args } => test::run(&cargo_args),
        Task::Bench { rounds, quick, mut only, server_only } => {
            if server_only {
                only.push(bench::Part::Server);
            }
            bench::run(rounds, quick, &only)
        }
        Task::Kernels { kernel, case, repeat } => test::run_kernels(&kernel, case.as_deref(), repeat),
        Task::Lint => lint::run(),
        Task::Paths => setup::run_quiet().and_then(|paths| paths.print()),
        Task::Dist { verify } => dist::run(verify),
    };
    if let Err(err) = result {
        eprintln!("xtask: error: {err:#}");
        std::process::exit(1);
    }
}
