//! `ttrace diff`'s output: text (default) and a self-contained HTML page.

use std::{fmt::Write as _, path::Path};

use super::ExportError;
use crate::{
    analyze::{
        Phase,
        diff::{Diff, Heat, Pair, TokenDivergence},
    },
    units::human_bytes,
};

const SHOWN_TOKENS: usize = 40;

pub fn render(d: &Diff) -> String {
    let mut out = String::new();
    let [a, b] = &d.runs;
    let _ = writeln!(out, "ttrace diff\n  A  {}\n  B  {}", a.path, b.path);
    let verdict = if d.same { "same tokens and routing" } else { "the runs DIFFER" };
    let _ = writeln!(out, "\nverdict        {verdict}");
    let _ = writeln!(
        out,
        "  token ids    {} (prompt {} / {}, generated {} / {})",
        d.first_divergence.as_ref().map_or_else(|| "equal".to_string(), divergence),
        a.prompt_tokens,
        b.prompt_tokens,
        a.generated_tokens,
        b.generated_tokens
    );
    let r = &d.routing;
    let _ = writeln!(
        out,
        "  routing      {} of {} (token, layer) rows equal{} ({} equal as sets){}",
        r.equal,
        r.compared,
        if r.permuted { " under the expert permutation" } else { "" },
        r.equal_as_sets,
        if r.after_divergence > 0 {
            format!("; {} rows from the token divergence on not compared", r.after_divergence)
        } else {
            String::new()
        }
    );
    for m in &r.mismatches {
        let _ = writeln!(
            out,
            "    {:?} ubatch {} layer {} row {}: A {:?}, B {}",
            m.phase,
            m.ubatch,
            m.layer,
            m.row,
            m.a,
            m.b.as_ref().map_or_else(|| "none".to_string(), |b| format!("{b:?}"))
        );
    }
    let opt = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| human_bytes(v as u64));
    let _ = writeln!(out, "\nper generated token (mean)        A            B");
    let _ = writeln!(
        out,
        "  weight bytes            {:>12} {:>12}",
        human_bytes(a.weight_bytes_per_token as u64),
        human_bytes(b.weight_bytes_per_token as u64)
    );
    let _ = writeln!(
        out,
        "  disk bytes              {:>12} {:>12}",
        opt(a.disk_bytes_per_token),
        opt(b.disk_bytes_per_token)
    );
    let _ = writeln!(out, "  model-file faults       {:>12.1} {:>12.1}", a.faults_per_token, b.faults_per_token);
    let _ = writeln!(
        out,
        "  disk bytes, whole run   {:>12} {:>12}",
        human_bytes(a.disk_bytes_total),
        human_bytes(b.disk_bytes_total)
    );
    let _ = writeln!(out, "\nper token      id A    id B   weight A   weight B     disk A     disk B  faults A/B");
    let ob = |v: Option<u64>| v.map_or_else(|| "-".to_string(), human_bytes);
    let on = |v: Option<i32>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for t in d.per_token.iter().take(SHOWN_TOKENS) {
        let _ = writeln!(
            out,
            "  {:<10} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10}  {}/{}",
            t.token,
            on(t.id[0]),
            on(t.id[1]),
            ob(t.weight_bytes[0]),
            ob(t.weight_bytes[1]),
            ob(t.disk_bytes[0]),
            ob(t.disk_bytes[1]),
            t.faults[0].map_or_else(|| "-".to_string(), |f| f.to_string()),
            t.faults[1].map_or_else(|| "-".to_string(), |f| f.to_string()),
        );
    }
    if d.per_token.len() > SHOWN_TOKENS {
        let _ = writeln!(out, "  … {} more tokens (`--json` has all)", d.per_token.len() - SHOWN_TOKENS);
    }
    let _ = writeln!(out, "\nper layer      bytes/token A  bytes/token B   disk read A   disk read B  faults A/B");
    for l in &d.per_layer {
        let key = l.layer.map_or_else(|| "non-layer".to_string(), |l| format!("layer {l}"));
        let _ = writeln!(
            out,
            "  {key:<12} {:>14} {:>14} {:>13} {:>13}  {}/{}",
            human_bytes(l.weight_bytes_per_token[0] as u64),
            human_bytes(l.weight_bytes_per_token[1] as u64),
            human_bytes(l.disk_read[0]),
            human_bytes(l.disk_read[1]),
            l.faults[0],
            l.faults[1]
        );
    }
    let heat = |h: Pair<Heat>| format!("{:?} → {:?}", h[0], h[1]).to_lowercase();
    let _ = writeln!(out, "\ntensors moved between hot and cold: {}", d.tensors_moved.len());
    for m in &d.tensors_moved {
        let _ = writeln!(out, "  {:<40} {} (tokens {} / {})", m.name, heat(m.heat), m.tokens[0], m.tokens[1]);
    }
    let _ = writeln!(out, "experts moved between hot and cold: {}", d.experts_moved.len());
    for m in &d.experts_moved {
        let _ = writeln!(
            out,
            "  layer {} expert {} (B: {}) {} (tokens {} / {})",
            m.layer,
            m.expert[0],
            m.expert[1],
            heat(m.heat),
            m.tokens[0],
            m.tokens[1]
        );
    }
    for note in &d.notes {
        let _ = writeln!(out, "\nnote: {note}");
    }
    out
}

/// "diverge at generated token 11 (A 53, B 308)".
fn divergence(t: &TokenDivergence) -> String {
    let id = |v: Option<i32>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
    let at = match t.phase {
        Phase::Generate if t.row == 0 => format!("generated token {}", t.ubatch),
        phase => format!("{} ubatch {} token {}", format!("{phase:?}").to_lowercase(), t.ubatch, t.row),
    };
    format!("diverge at {at} (A {}, B {})", id(t.id[0]), id(t.id[1]))
}

/// The text and the per-token disk bytes of both runs as bars.
pub fn write_html(d: &Diff, out: &Path) -> Result<(), ExportError> {
    let escape = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let max = d.per_token.iter().flat_map(|t| t.disk_bytes.iter().flatten()).copied().max().unwrap_or(0).max(1);
    let mut bars = String::new();
    for t in &d.per_token {
        let _ = write!(bars, "<tr><td>{}</td>", t.token);
        for (side, class) in [(0, "a"), (1, "b")] {
            let v = t.disk_bytes[side].unwrap_or(0);
            let _ = write!(
                bars,
                "<td><div class=\"bar {class}\" style=\"width:{:.1}%\"></div>{}</td>",
                100.0 * v as f64 / max as f64,
                human_bytes(v)
            );
        }
        bars.push_str("</tr>\n");
    }
    let page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ttrace diff</title><style>\
body{{font-family:sans-serif;margin:2em}}pre{{background:#f6f6f6;padding:1em}}\
table{{border-collapse:collapse}}td{{padding:2px 8px;font:12px monospace;width:40%}}\
.bar{{height:10px;display:inline-block;margin-right:6px}}.a{{background:#4878d0}}.b{{background:#ee854a}}\
</style></head><body data-same=\"{}\"><h1>ttrace diff</h1><pre>{}</pre>\
<h2>disk bytes per generated token (A blue, B orange)</h2><table>{bars}</table></body></html>\n",
        d.same,
        escape(&render(d))
    );
    std::fs::write(out, page).map_err(ExportError::write(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_names_the_generated_token_or_the_prompt_position() {
        let at = |phase, ubatch, row, id| divergence(&TokenDivergence { phase, ubatch, row, id });
        assert_eq!(at(Phase::Generate, 11, 0, [Some(53), Some(308)]), "diverge at generated token 11 (A 53, B 308)");
        assert_eq!(at(Phase::Generate, 3, 0, [Some(5), None]), "diverge at generated token 3 (A 5, B none)");
        assert_eq!(at(Phase::Prompt, 0, 2, [Some(8), Some(9)]), "diverge at prompt ubatch 0 token 2 (A 8, B 9)");
    }
}
