//! Beside the viewer's figures: what the thesis's React web UI (ErsjanKeri/BSC,
//! `tensor-tracing/webui`) does with the same trace's `tokens-json` export.
//! Measuring it needs that UI built from GitHub, so the bench does not run it:
//! `scripts/bench/thesis_webui.py` does, and its output is kept in
//! docs/bench/thesis-webui.json, which this renders.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cache;

const RESULT: &str = "docs/bench/thesis-webui.json";

#[derive(Deserialize)]
struct Measured {
    measured: String,
    export: Export,
    stock: Load,
    merged: Vec<Load>,
}

#[derive(Deserialize)]
struct Export {
    tokens: u64,
    bytes: u64,
}

#[derive(Deserialize)]
struct Load {
    #[serde(default)]
    tokens: u64,
    #[serde(default)]
    entries: u64,
    outcome: String,
    rendered_ms: Option<f64>,
    js_heap_used_mb: Option<f64>,
    renderer_peak_rss_mb: Option<f64>,
    error: Option<String>,
    switch_ms_median: Option<f64>,
}

/// The section's table, or a line saying the result is missing.
pub fn section(md: &mut String) -> std::fmt::Result {
    writeln!(md, "\n### Beside it: the thesis web UI on the same trace\n")?;
    let text = std::fs::read_to_string(cache::repo_root().join(RESULT)).unwrap_or_default();
    let Ok(m) = serde_json::from_str::<Measured>(&text) else {
        return writeln!(md, "No result in {RESULT}; run `scripts/bench/thesis_webui.py` (see its docstring).");
    };
    let opt = |v: Option<f64>, unit: &str| v.map_or("–".to_string(), |v| format!("{v:.1} {unit}"));
    writeln!(
        md,
        "`ttrace export --format tokens-json` of the trace above: {} token files, {:.2} GB. Measured by \
         `scripts/bench/thesis_webui.py` ({}). The UI as written opens only token 0 (it has no token \
         selector): first render {}, token switch {} (median, through its store's own `loadTokenData`). \
         To hold N tokens at once, as the thesis's traces did before their per-token split, their entries \
         are merged into the one file it loads:\n",
        m.export.tokens,
        m.export.bytes as f64 / 1e9,
        m.measured,
        opt(m.stock.rendered_ms.map(|v| v / 1e3), "s"),
        opt(m.stock.switch_ms_median, "ms"),
    )?;
    writeln!(md, "| tokens | entries | first render | JS heap | renderer peak RSS | outcome |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    for l in &m.merged {
        let outcome = l.error.as_ref().map_or(l.outcome.clone(), |e| format!("{}: {e}", l.outcome));
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {outcome} |",
            l.tokens,
            l.entries,
            opt(l.rendered_ms.map(|v| v / 1e3), "s"),
            opt(l.js_heap_used_mb, "MB"),
            opt(l.renderer_peak_rss_mb, "MB"),
        )?;
    }
    writeln!(
        md,
        "\nok = rendered within 60 s; slow = after more than 60 s; unresponsive = not rendered within the \
         script's timeout. Past about 963 tokens of this model the one file is longer than V8's longest string."
    )
}
