//! One module per subcommand; `main.rs` dispatches to them.
#[cfg(feature = "live")]
pub mod attach;
#[cfg(feature = "live")]
pub mod check;
pub mod diff;
mod diff_values;
pub mod export;
pub mod gguf;
pub mod report;
#[cfg(feature = "live")]
pub mod run;
pub mod simulate;
pub mod sweep;
#[cfg(feature = "live")]
pub mod top;
#[cfg(feature = "live")]
mod traced;
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
        cgroup_dir: None,
        all_threads: args.all_threads,
        // Per-thread records need the per-node probes.
        op_timing: args.op_timing || args.all_threads,
        libs: args.lib.clone(),
        duration: None,
        // Node outputs need room: Gemma 3 270M sends ~2 MiB per token.
        ring_bytes: if args.values { args.ring_bytes.max(128 << 20) } else { args.ring_bytes },
        tracepoints: args.tracepoints,
        owner,
        values: args.values.then(|| crate::live::session::ValuesSpec { filter: args.values_filter.clone() }),
        ring: args.max_size.map(|max_size| crate::live::session::RingSpec { max_size, max_files: args.max_files }),
    }
}
