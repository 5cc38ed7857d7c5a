//! One module per subcommand; `main.rs` dispatches to them.
#[cfg(feature = "live")]
pub mod attach;
#[cfg(feature = "live")]
pub mod check;
pub mod diff;
pub mod export;
pub mod gguf;
pub mod report;
#[cfg(feature = "live")]
pub mod run;
pub mod simulate;
pub mod view;

/// `run` and `attach`'s shared arguments as a session's options, in one
/// place; each command then sets what only it has.
#[cfg(feature = "live")]
fn session_spec(
    args: &crate::cli::TraceArgs,
    owner: Option<crate::live::target::UserSpec>,
) -> crate::live::session::SessionSpec {
    crate::live::session::SessionSpec {
        output: args.output.clone(),
        models: args.model.clone(),
        io: !args.no_io,
        drop_caches: false,
        mem_limit: None,
        cgroup: None,
        all_threads: args.all_threads,
        // Per-thread records need the per-node probes.
        op_timing: args.op_timing || args.all_threads,
        libs: args.lib.clone(),
        duration: None,
        ring_bytes: args.ring_bytes,
        tracepoints: args.tracepoints,
        owner,
    }
}
