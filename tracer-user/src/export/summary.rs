//! The end-of-run summary (stderr after `run`/`attach`) and `ttrace report`'s
//! text: what was traced, per phase, and whether anything was lost.

use std::{collections::BTreeSet, fmt::Write as _};

use crate::{
    analyze::stats::Stats,
    analyze::{Analysis, Phase},
    format::WriterStats,
    units::human_bytes,
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

    let distinct: BTreeSet<(u32, u32)> = a.ubatches.iter().flat_map(|u| u.weights.keys().copied()).collect();
    let generate: Vec<_> = a.ubatches.iter().filter(|u| u.phase == Phase::Generate).collect();
    // Bytes read, as the report's per-token table counts them (the embedding
    // lookup reads one row per token, not the whole table).
    let per_token = if generate.is_empty() {
        0.0
    } else {
        generate.iter().map(|u| u.weights.values().map(|w| w.bytes).sum::<u64>()).sum::<u64>() as f64
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
            "  LOST EVENTS  op {}, call {}, page_fault {}, page_cache {}, block {}: the ring buffer overflowed; \
             raise --ring-mb",
            lost.op, lost.call, lost.page_fault, lost.page_cache, lost.block
        );
    }
    if a.io.disk.uncompleted > 0 {
        let _ = writeln!(
            out,
            "  WARNING      {} model-file reads issued without a completion recorded: the kernel skips a \
             tracepoint program while another BPF program runs on that CPU (or the read was still in flight when \
             tracing stopped); their latencies and disk slices are missing",
            a.io.disk.uncompleted
        );
    }
    if let Some(t) = &a.trailer
        && t.decode_errors > 0
    {
        let _ = writeln!(out, "  WARNING      {} kernel records did not decode (layout mismatch)", t.decode_errors);
    }
    out
}

/// The summary's `key   value` lines as pairs (for the HTML table).
pub fn pairs(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            match line.find("  ") {
                Some(i) => (line[..i].to_string(), line[i..].trim().to_string()),
                None => (String::new(), line.to_string()),
            }
        })
        .collect()
}

/// `ttrace report`'s sections after the summary: phases, per generated
/// token, per layer and component, hot and cold weights.
pub fn render_details(a: &Analysis, s: &Stats) -> String {
    let mut out = String::new();
    let ms = |ns: u64| ns as f64 / 1e6;
    let opt_bytes = |b: Option<u64>| b.map_or_else(|| "n/a".to_string(), human_bytes);
    let _ =
        writeln!(out, "\nphases         ubatches  tokens        time       ops  weight bytes   faults    disk read");
    for p in &s.phases {
        let _ = writeln!(
            out,
            "  {:<12} {:>8} {:>7} {:>9.2} ms {:>9} {:>13} {:>8} {:>12}",
            p.phase,
            p.ubatches,
            p.tokens,
            ms(p.duration_ns),
            p.ops,
            human_bytes(p.weight_bytes),
            p.faults,
            opt_bytes(p.disk_bytes)
        );
    }
    let generate: Vec<_> = s.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).collect();
    if !generate.is_empty() {
        let _ = writeln!(
            out,
            "\nper generated token   id      time     ops  weight bytes  tensors  file/copy accesses  faults (model, major)  disk read (tensors)"
        );
        const SHOWN: usize = 40;
        for u in generate.iter().take(SHOWN) {
            let _ = writeln!(
                out,
                "  token {:<6} {:>9} {:>7.2} ms {:>7} {:>12}{} {:>8} {:>9}/{:<9} {:>6} ({:>5}, {:>5}) {:>10} ({})",
                u.token_index.unwrap_or(0),
                u.token_ids.first().map_or_else(|| "-".to_string(), |t| t.to_string()),
                ms(u.duration_ns),
                u.ops,
                human_bytes(u.weight_bytes),
                if u.upper_bound { "*" } else { " " },
                u.weight_tensors,
                u.file_backed_accesses,
                u.copy_accesses,
                u.faults,
                u.model_faults,
                u.faults_major.map_or_else(|| "n/a".to_string(), |m| m.to_string()),
                opt_bytes(u.disk_bytes),
                u.disk_tensors.map_or_else(|| "n/a".to_string(), |n| n.to_string())
            );
        }
        if generate.len() > SHOWN {
            let _ = writeln!(out, "  … {} more tokens (`--json` has all)", generate.len() - SHOWN);
        }
    }
    let _ = writeln!(out, "\nper layer       tensors        size   bytes/token");
    for l in &s.layers {
        let key = if l.key == "-" { "non-layer".to_string() } else { format!("layer {}", l.key) };
        let _ = writeln!(
            out,
            "  {key:<12} {:>8} {:>11} {:>12}{}",
            l.tensors,
            human_bytes(l.size_bytes),
            human_bytes(l.bytes_per_token as u64),
            if l.upper_bound { "*" } else { "" }
        );
    }
    let _ = writeln!(out, "\nper component   tensors        size   bytes/token");
    for c in s.components.iter().filter(|c| c.tensors > 0) {
        let _ = writeln!(
            out,
            "  {:<14} {:>6} {:>11} {:>12}{}",
            c.key,
            c.tensors,
            human_bytes(c.size_bytes),
            human_bytes(c.bytes_per_token as u64),
            if c.upper_bound { "*" } else { "" }
        );
    }
    let n_gen = generate.len() as u64;
    let mut hot: Vec<_> = s.tensors.iter().collect();
    hot.sort_by_key(|t| (std::cmp::Reverse(t.tokens_touched), std::cmp::Reverse(t.size_bytes)));
    let _ = writeln!(out, "\nhot weights (tokens of {n_gen} that read them)    size   faults");
    for t in hot.iter().take(10) {
        let _ =
            writeln!(out, "  {:<36} {:>5} {:>10} {:>8}", t.name, t.tokens_touched, human_bytes(t.size_bytes), t.faults);
    }
    let cold: Vec<_> = hot.iter().rev().filter(|t| t.tokens_touched < n_gen).take(10).collect();
    let never = s.tensors.iter().filter(|t| t.ubatches_touched == 0).count();
    let _ = writeln!(out, "\ncold weights ({never} never read by any graph)");
    for t in cold {
        let _ =
            writeln!(out, "  {:<36} {:>5} {:>10} {:>8}", t.name, t.tokens_touched, human_bytes(t.size_bytes), t.faults);
    }
    for note in &s.notes {
        let _ = writeln!(out, "\nnote: {note}{}", if note.starts_with("MoE") { " (marked *)" } else { "" });
    }
    let _ = a;
    out
}
