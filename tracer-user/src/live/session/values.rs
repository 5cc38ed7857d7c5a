//! `--values`: tell the probes where the node loop is, then attach them.
//! Which barrier ends a node is told by its caller: only barriers called
//! from `ggml_graph_compute_thread` (the node loop, a static function: its
//! name is in .symtab) can, so a build without that symbol is refused.

use anyhow::{Context, Result, bail};
use tracer_common::{
    hooks,
    values::{config, programs},
};

use crate::{
    format::{ValueThread, ValuesMissing},
    live::{
        load::Tracer,
        recorder::Recorder,
        target::{self, HookLibs, OpNames, Reads},
    },
};

/// The node loop (a static function, maybe a compiler clone of it).
const NODE_LOOP: &str = "ggml_graph_compute_thread";
const BARRIER: &str = "ggml_barrier";
/// Larger node outputs are flagged, not copied.
const MAX_VALUE_BYTES: u64 = 256 << 20;

/// Probes in attach order: a run's state exists before nodes set theirs,
/// and both before a barrier reads them. Each sits where what its program
/// reads is still as at the call ([`Reads`]): the node probes read their
/// arguments, the barrier's its return address.
pub(super) const PROBES: [(&str, &str, u32, Reads); 4] = [
    ("ggml_graph_compute", programs::VALUE_GRAPH, 0, Reads::Arguments),
    ("ggml_cpu_extra_compute_forward", programs::VALUE_NODE, hooks::EXTRA, Reads::Arguments),
    ("ggml_compute_forward_rms_norm_mul_fused", programs::VALUE_NODE, hooks::FUSED_MUL, Reads::Arguments),
    (BARRIER, programs::VALUE_BARRIER, 0, Reads::ReturnAddress),
];

pub(super) fn start(
    tracer: &mut Tracer,
    libs: &HookLibs,
    names: Option<&OpNames>,
    pid: u32,
    filtering: bool,
) -> Result<()> {
    let Some(cpu) = libs.cpu.as_deref() else {
        bail!("--values: no libggml-cpu found to probe");
    };
    let ranges = target::symbol_ranges(cpu, &[BARRIER, NODE_LOOP])
        .with_context(|| format!("--values: reading symbols of {}", cpu.display()))?;
    let (Some(_), Some((start, size))) = (ranges[0], ranges[1]) else {
        bail!(
            "--values: {} lacks `{BARRIER}` or `{NODE_LOOP}` (a stripped .symtab?): \
             a node's own barrier cannot be told from an op's",
            cpu.display()
        );
    };
    // Each probe's library and site, found once: the barrier's site is
    // also what its program tells the load bias from.
    let mut sites = Vec::new();
    for (symbol, program, cookie, reads) in PROBES {
        // ggml_barrier is not among the hook symbols searched: it is in the CPU library.
        let path = if symbol == BARRIER { Some(cpu) } else { libs.path_of(symbol) };
        let Some(path) = path else {
            if symbol == "ggml_compute_forward_rms_norm_mul_fused" {
                continue; // a build from before the fusion
            }
            bail!("--values: no library defines `{symbol}`");
        };
        let site = target::probe_sites(path, &[(symbol, reads)])?[0];
        sites.push((symbol, program, cookie, path, site));
    }
    let barrier = sites
        .iter()
        .find_map(|s| (s.0 == BARRIER).then_some(s.4).flatten())
        .with_context(|| format!("--values: `{BARRIER}` of {} is in no loaded segment", cpu.display()))?;
    let set_rows = names.and_then(|n| n.ops.iter().position(|o| o == "SET_ROWS")).map_or(u64::MAX, |i| i as u64);
    tracer.set_array(
        tracer_common::values::MAP_VALUE_CONFIG,
        &[
            (config::BARRIER_VADDR, barrier.vaddr),
            (config::LOOP_START, start),
            (config::LOOP_END, start + size),
            (config::SET_ROWS_OP, set_rows),
            (config::MAX_BYTES, MAX_VALUE_BYTES),
            (config::TEST_UNREAD_PARAMS, test_unread_params()),
            (config::FILTERING, u64::from(filtering)),
        ],
    )?;
    for (symbol, program, cookie, path, site) in sites {
        tracer.attach_uprobe_at(program, path, symbol, site.map(|s| s.file_offset), Some(pid), u64::from(cookie))?;
    }
    Ok(())
}

/// Hand the names `--values-filter` leaves out, found since the last
/// call, to the kernel, which then copies no bytes of those nodes.
pub(super) fn sync_filter<W: std::io::Write>(recorder: &mut Recorder<W>, tracer: &mut Tracer) -> Result<()> {
    let Some(values) = recorder.values.as_mut() else { return Ok(()) };
    Ok(tracer.skip_value_names(&values.take_skipped_names())?)
}

/// `TTRACE_TEST_UNREAD_PARAMS=N[,again]`, for tests: each thread's N-th
/// node takes its team read as failed (and its read again too, `again`).
const TEST_UNREAD_PARAMS_ENV: &str = "TTRACE_TEST_UNREAD_PARAMS";

fn test_unread_params() -> u64 {
    let Ok(value) = std::env::var(TEST_UNREAD_PARAMS_ENV) else { return 0 };
    let (node, again) = value.split_once(',').map_or((value.as_str(), false), |(n, a)| (n, a == "again"));
    let node = node.parse::<u32>().unwrap_or(0);
    log::warn!("{TEST_UNREAD_PARAMS_ENV}: node {node} of each thread reads its team as failed (again: {again})");
    u64::from(node) | if again { config::REREAD_FAILS } else { 0 }
}

/// The trace ends: the last node outputs written, the nodes no barrier
/// read (with the kernel's reasons) and the team's counts, for the
/// trailer; nothing without `--values`.
pub(super) fn finish<W: std::io::Write>(
    tracer: &Tracer,
    recorder: &mut Recorder<W>,
    pid: u32,
) -> Result<(Option<ValuesMissing>, Vec<ValueThread>)> {
    let Some(missing) = recorder.close_values()? else { return Ok((None, Vec::new())) };
    let counts = tracer.values_unread()?;
    let missing = ValuesMissing {
        unread_params: counts.unread_params,
        unread_site: counts.unread_site,
        unread_runs: counts.unread_runs,
        unread_busy: counts.unread_busy,
        // Reads, not nodes: a node an op's inlined barrier read mid-way is
        // read twice, and a run left unchecked counts none; a count of
        // nodes never exceeds the nodes left out.
        filtered_uncopied: counts.filtered_skipped.min(missing.filtered),
        ..missing
    };
    if missing.nodes > 0 {
        log::warn!(
            "--values: {} computed nodes in {} of {} graph runs have no output record (no barrier after them was read)",
            missing.nodes,
            missing.runs,
            missing.runs_checked
        );
    }
    Ok((Some(missing), tracer.value_threads(pid)?))
}
