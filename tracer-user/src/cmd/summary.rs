//! The end-of-run summary (stderr after `run`/`attach`) and `ttrace report`'s
//! text: what was traced, per phase, and whether anything was lost.

use std::{collections::BTreeSet, fmt::Write as _};

use crate::{
    correlate::{Analysis, Phase},
    record::WriterStats,
};

pub fn render(a: &Analysis, path: &str, stats: Option<&WriterStats>) -> String {
    let mut out = String::new();
    let h = &a.header;
    let command = h.command.join(" ");
    let _ = writeln!(out, "ttrace: {} of pid {} ({command}), {:.3} s", h.mode, h.pid, a.duration_ns() as f64 / 1e9);
    if let Some(t) = &a.trailer {
        let exit = match (t.exit_code, t.exit_signal) {
            (Some(code), _) => format!(", exit status {code}"),
            (None, Some(sig)) => format!(", killed by signal {sig}"),
            _ => String::new(),
        };
        let _ = writeln!(out, "  stopped      {}{exit}", t.stop_reason);
    } else {
        let _ = writeln!(out, "  stopped      trace cut short (no end record): read up to its last complete record");
    }
    let count = |p: Phase| a.ubatches.iter().filter(|u| u.phase == p).count();
    let _ = writeln!(
        out,
        "  ubatches     {} prompt ({} tokens), {} generate, {} warm-up, {} other graphs",
        count(Phase::Prompt),
        a.prompt_tokens,
        count(Phase::Generate),
        count(Phase::Warmup),
        count(Phase::Aux)
    );
    let _ = writeln!(out, "  ops          {} recorded ({} outside any graph)", a.ops, a.ops_outside_ubatches);

    let size_of = |(m, t): (u32, u32)| {
        a.models.get(m as usize).and_then(|model| model.tensors.get(t as usize)).map_or(0, |t| t.size_bytes)
    };
    let distinct: BTreeSet<(u32, u32)> = a.ubatches.iter().flat_map(|u| u.weights.keys().copied()).collect();
    let generate: Vec<_> = a.ubatches.iter().filter(|u| u.phase == Phase::Generate).collect();
    let per_token = if generate.is_empty() {
        0.0
    } else {
        generate.iter().map(|u| u.weights.keys().map(|&k| size_of(k)).sum::<u64>()).sum::<u64>() as f64
            / generate.len() as f64
    };
    let (file, copy) = a
        .ubatches
        .iter()
        .flat_map(|u| u.weights.values())
        .fold((0u64, 0u64), |(f, c), w| (f + u64::from(w.file_backed), c + u64::from(w.copy)));
    let share = |n: u64| if file + copy == 0 { 0.0 } else { 100.0 * n as f64 / (file + copy) as f64 };
    let _ = writeln!(
        out,
        "  weights      {} distinct tensors touched; {} per generated token; accesses {:.1}% file-backed, {:.1}% copies",
        distinct.len(),
        human_bytes(per_token as u64),
        share(file),
        share(copy)
    );
    if let Some(s) = stats {
        let per_op = |bytes: u64| if s.ops == 0 { 0.0 } else { bytes as f64 / s.ops as f64 };
        let _ = writeln!(
            out,
            "  trace        {path}: {}, {:.1} bytes per op frame ({:.1} with tensor descriptors)",
            human_bytes(s.total_bytes),
            per_op(s.op_bytes),
            per_op(s.op_bytes + s.descriptor_bytes)
        );
    } else {
        let _ = writeln!(out, "  trace        {path}");
    }
    let lost = a.lost;
    if lost.total() == 0 {
        let _ = writeln!(out, "  lost events  none");
    } else {
        let _ = writeln!(
            out,
            "  LOST EVENTS  op {}, call {}, page_fault {}: the ring buffer overflowed; raise --ring-mb",
            lost.op, lost.call, lost.page_fault
        );
    }
    if let Some(t) = &a.trailer
        && t.decode_errors > 0
    {
        let _ = writeln!(out, "  WARNING      {} kernel records did not decode (layout mismatch)", t.decode_errors);
    }
    out
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
