//! Where `--values` spends its time, measured: one traced run per variant
//! with the kernel's per-program counters on (`kernel.bpf_stats_enabled`,
//! not in the timed rounds: it adds two clock reads to every program run),
//! sampling the recorder's CPU time and its programs' run counts and times
//! every 100 ms until the run ends. Each variant runs twice, generating
//! more and fewer tokens: the difference is what the extra tokens cost,
//! without the recorder's start (loading and verifying its programs,
//! reading the libraries), which slows no token.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{Ctx, server};

/// Which probes a program serves, by its (15-character) BPF name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum ProgramGroup {
    /// Every node's entry (`value_node*`): the node and the thread's place in its team.
    NodeEntry,
    /// Every `ggml_barrier` (`value_barrier*`): the last arrival reads the node.
    Barrier,
    /// Graph capture and the I/O tracepoints, as in a run without `--values`.
    Other,
}

impl ProgramGroup {
    fn of(name: &str) -> Self {
        if name.starts_with("value_node") {
            Self::NodeEntry
        } else if name.starts_with("value_barrier") {
            Self::Barrier
        } else {
            Self::Other
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::NodeEntry => "node-entry programs",
            Self::Barrier => "barrier programs (the copies included)",
            Self::Other => "graph capture and I/O programs",
        }
    }
}

/// Runs and kernel time of one group's programs.
#[derive(Clone, Copy, Default, Debug)]
pub struct ProgramCost {
    pub runs: u64,
    pub ns: u64,
}

/// One variant's accounting: the costs of `tokens` generated tokens.
pub struct Account {
    pub variant: &'static str,
    pub tokens: u32,
    pub programs: BTreeMap<ProgramGroup, ProgramCost>,
    /// The recorder's CPU time (all its threads), user and system.
    pub recorder_ns: u64,
}

/// What the tokens `long` generates beyond `short`'s cost (both a `ttrace
/// run` of llama, `(tokens, command)`).
pub fn account(ctx: &Ctx, variant: &'static str, long: (u32, Command), short: (u32, Command)) -> Result<Account> {
    let ((long_ns, mut programs), (short_ns, before)) =
        (measure(ctx, variant, long.1)?, measure(ctx, variant, short.1)?);
    for (group, cost) in &mut programs {
        let before = before.get(group).copied().unwrap_or_default();
        (cost.runs, cost.ns) = (cost.runs.saturating_sub(before.runs), cost.ns.saturating_sub(before.ns));
    }
    let recorder_ns = long_ns.saturating_sub(short_ns);
    Ok(Account { variant, tokens: long.0.saturating_sub(short.0).max(1), programs, recorder_ns })
}

/// Trace `command` (a `ttrace run` of llama) to its end, sampling as it
/// goes: the recorder's CPU time and its programs' costs.
fn measure(ctx: &Ctx, variant: &str, mut command: Command) -> Result<(u64, BTreeMap<ProgramGroup, ProgramCost>)> {
    let _stats = server::BpfStats::enable();
    let log = ctx.out_dir.join(format!("values-account-{variant}.log"));
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    command.stdout(Stdio::from(file.try_clone()?)).stderr(Stdio::from(file)).stdin(Stdio::null());
    let mut child = command.spawn().with_context(|| format!("starting {}", crate::shell::describe(&command)))?;
    let pid = child.id();
    // The counters only grow, and a program's fd closes as the recorder
    // ends: each program's and the recorder's last figures are their largest.
    let (mut recorder_ns, mut by_id) = (0, std::collections::HashMap::new());
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        // A sample can fail as the process ends; those before stand.
        if let (Ok(cpu), Ok(stats)) = (server::cpu_ns(pid), server::program_stats(pid)) {
            recorder_ns = recorder_ns.max(cpu);
            for (id, (name, ns, runs)) in stats {
                let seen = by_id.entry(id).or_insert((name, 0, 0));
                (seen.1, seen.2) = (seen.1.max(ns), seen.2.max(runs));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        bail!("values accounting run {variant} failed ({status}); its output is in {}", log.display());
    }
    let mut programs: BTreeMap<ProgramGroup, ProgramCost> = BTreeMap::new();
    for (name, ns, runs) in by_id.into_values() {
        let cost = programs.entry(ProgramGroup::of(&name)).or_default();
        cost.runs += runs;
        cost.ns += ns;
    }
    if programs.get(&ProgramGroup::Barrier).is_none_or(|c| c.runs == 0) {
        bail!("values accounting run {variant}: no barrier program run seen (bpftool); output:\n{text}");
    }
    Ok((recorder_ns, programs))
}
