//! `ttrace report`'s text: the summary (also printed after `run`/`attach`)
//! and the detail tables that follow it.

use std::fmt::Write as _;

use crate::{
    analyze::{
        Analysis, Phase,
        stats::{Stats, TensorStats},
        summary::Summary,
    },
    units::human_bytes,
};

/// The summary as text: a title line, then one `key   value` line per row.
pub fn render(summary: &Summary) -> String {
    let mut out = format!("{}\n", summary.title());
    for (key, value) in summary.rows() {
        let _ = writeln!(out, "  {key:<12} {value}");
    }
    out
}

/// One line per request: a sequence's prompt and generation.
fn render_requests(out: &mut String, a: &Analysis, s: &Stats) {
    if a.requests.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nper request  seq  prompt  generated  outputs   weight bytes/token     disk read    faults  note"
    );
    const SHOWN: usize = 40;
    for (r, cost) in a.requests.iter().zip(&s.requests).take(SHOWN) {
        let note = if r.warmup {
            "warm-up"
        } else if r.prompt_only {
            "prompt only"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:<10} {:>4} {:>7} {:>10} {:>8} {:>20} {:>13} {:>9.1}  {note}",
            r.index,
            r.seq,
            r.prompt_tokens,
            r.generated_tokens,
            r.outputs,
            human_bytes(cost.weight_bytes_per_token as u64),
            cost.disk_bytes.map_or_else(|| "n/a".to_string(), |d| human_bytes(d as u64)),
            cost.faults
        );
    }
    if s.requests.len() > SHOWN {
        let _ = writeln!(out, "  … {} more requests (`--json` has all)", s.requests.len() - SHOWN);
    }
}

/// `ttrace report`'s sections after the summary: phases, per generated
/// token, per layer and component, hot and cold weights. Bytes per token are
/// `analyze::stats`' exact charges, `*` where one is an upper bound.
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
    render_requests(&mut out, a, s);
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
    // Most tokens first, then most bytes read.
    hot.sort_by_key(|t| std::cmp::Reverse((t.tokens_touched, t.generate_weight_bytes, t.size_bytes)));
    let tensor_line = |out: &mut String, t: &TensorStats| {
        let _ = writeln!(
            out,
            "  {:<36} {:>5} {:>10} {:>12}{:1} {:>8}",
            t.name,
            t.tokens_touched,
            human_bytes(t.size_bytes),
            human_bytes(t.bytes_per_token as u64),
            if t.upper_bound { "*" } else { "" },
            t.faults
        );
    };
    let _ = writeln!(out, "\nhot weights (tokens of {n_gen} that read them)    size   bytes/token   faults");
    for t in hot.iter().take(10) {
        tensor_line(&mut out, t);
    }
    let cold: Vec<_> = hot.iter().rev().filter(|t| t.tokens_touched < n_gen).take(10).collect();
    let never = s.tensors.iter().filter(|t| t.ubatches_touched == 0).count();
    let _ = writeln!(out, "\ncold weights ({never} never read by any graph)");
    for t in cold {
        tensor_line(&mut out, t);
    }
    if let Some(m) = &s.moe {
        out.push_str(&super::research::render_moe(m));
    }
    if let Some(u) = &s.loaded_vs_used {
        out.push_str(&super::research::render_usage(u));
    }
    out.push_str(&super::buffers::render_text(a));
    for note in &s.notes {
        let _ = writeln!(out, "\nnote: {note}");
    }
    out
}
