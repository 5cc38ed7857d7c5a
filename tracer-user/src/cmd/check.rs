//! `ttrace check`: every program `run` can load, loaded into this kernel
//! (`live::features`), then the kernel round trip of `selftest`, summarised.

use anyhow::{Result, bail};

use crate::{
    cli::CheckArgs,
    live::{
        features::{self, Status},
        load::{LoadOptions, Tracer},
        selftest::{self, RoundTrip, TAG},
    },
};

pub async fn run(args: CheckArgs) -> Result<()> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("kernel   Linux {}", release.trim());
    // Loaded, never attached, then dropped before the round trip loads its own.
    let checked = {
        let mut tracer = Tracer::load(&LoadOptions { tracepoints: Some(args.tracepoints), ..Default::default() })?;
        features::check(&mut tracer)
    };
    let width = checked.iter().map(|c| c.what.len()).max().unwrap_or(0);
    for c in &checked {
        println!("feature  {:<width$}  {}", c.what, c.status);
    }
    let missing = checked.iter().filter(|c| matches!(c.status, Status::Missing(_))).count();

    let observed = selftest::run(RoundTrip {
        symbol: "ttrace_selftest_probe",
        function: selftest::ttrace_selftest_probe,
        calls: args.calls,
        pages: args.pages as usize,
        ring_bytes: tracer_common::DEFAULT_RING_BYTES,
        read_concurrently: true,
        tracepoints: args.tracepoints,
        recursion_misses: 3,
    })
    .await?;

    let pid = std::process::id();
    let good_calls = observed
        .calls
        .iter()
        .enumerate()
        .filter(|(i, e)| e.header.tgid == pid && e.args[0] == *i as u64 && e.args[1] == (*i as u64) ^ TAG)
        .count();
    let fault_addrs: std::collections::HashSet<u64> = observed.faults.iter().map(|f| f.address).collect();
    let faulted = observed.touched.iter().filter(|a| fault_addrs.contains(a)).count();

    println!(
        "uprobe   ttrace_selftest_probe: {} calls, {} events, {good_calls} with the expected arguments",
        args.calls,
        observed.calls.len()
    );
    let flavour = observed.tracepoints.map_or_else(|| "none".to_string(), |t| t.to_string());
    println!("tracepoints {flavour}");
    println!(
        "faults   exceptions:page_fault_user: {} pages written, {faulted} faulted at the written address ({} fault events in all)",
        observed.touched.len(),
        observed.faults.len()
    );
    println!(
        "lost     call {}, page_fault {}; undecodable records {}",
        observed.lost.call, observed.lost.page_fault, observed.decode_errors
    );
    let recursion_ok = match observed.recursion_misses {
        Some((forced, counted)) => {
            println!("skipped  {forced} forced nested runs of one program, {counted} counted as recursion misses");
            forced == counted
        }
        None => {
            println!("skipped  recursion-miss counting not checked (needs BTF tracepoints)");
            true
        }
    };
    if missing > 0 {
        bail!(
            "{missing} feature(s) cannot load on this kernel (see `missing` above): `ttrace run` would refuse or lack them"
        );
    }
    if !recursion_ok
        || good_calls as u64 != args.calls
        || observed.calls.len() as u64 != args.calls
        || faulted != observed.touched.len()
        || observed.lost.total() != 0
        || observed.decode_errors != 0
    {
        bail!("the kernel round trip did not deliver what was done (see the lines above)");
    }
    println!("ok: eBPF uprobes, tracepoints and the ring buffer work on this machine");
    Ok(())
}
