use std::process::ExitCode;

#[cfg(feature = "live")]
use anyhow::Context;
use anyhow::Result;
use clap::Parser;
use ttrace::{
    cli::{Cli, Command},
    cmd,
};

/// See mimalloc in Cargo.toml: glibc's allocator needs no replacement.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    // `diff`'s status says same (0) or different (1), so its errors are 2.
    let failure = if matches!(cli.command, Command::Diff(_)) { ExitCode::from(2) } else { ExitCode::FAILURE };
    match run(cli) {
        Ok(code) => code,
        // The reader went away (`ttrace report T | head`): not an error, as
        // for any Unix filter. Every stdout write returns its io::Error here.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ttrace: error: {err:#}");
            failure
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default)).format_timestamp(None).init();
}

fn run(cli: Cli) -> Result<ExitCode> {
    if let Command::Diff(args) = cli.command {
        return cmd::diff::run(args);
    }
    run_command(cli).map(|()| ExitCode::SUCCESS)
}

fn run_command(cli: Cli) -> Result<()> {
    match cli.command {
        #[cfg(feature = "live")]
        Command::Check(args) => runtime()?.block_on(cmd::check::run(args)),
        // Reads files only: no root, no async runtime.
        Command::Gguf(args) => cmd::gguf::run(args),
        #[cfg(feature = "live")]
        Command::Run(args) => runtime()?.block_on(cmd::run::run(args)),
        #[cfg(feature = "live")]
        Command::Attach(args) => runtime()?.block_on(cmd::attach::run(args)),
        #[cfg(feature = "live")]
        Command::Top(args) => runtime()?.block_on(cmd::top::run(args)),
        Command::Report(args) => cmd::report::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Diff(args) => cmd::diff::run(args).map(drop),
        Command::View(args) => cmd::view::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Sweep(args) => cmd::sweep::run(args),
    }
}

#[cfg(feature = "live")]
fn runtime() -> Result<tokio::runtime::Runtime> {
    // One thread: the recording loop itself waits on epoll. With worker
    // threads, each ring wake-up or tick woke a worker that then woke the
    // main thread (two context switches, on cores the target needs).
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}
