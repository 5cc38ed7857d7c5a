//! `ttrace sweep report`'s page and its text summary: one self-contained
//! HTML file of tables (the similarity matrix shaded by value).

use std::fmt::Write as _;

use crate::{
    analyze::sweep::{ModelReport, Spread, SweepReport},
    units::human_bytes,
};

fn limit(l: Option<u64>) -> String {
    l.map_or_else(|| "none".to_string(), human_bytes)
}

fn bytes(s: Option<Spread>) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{} ± {}", human_bytes(s.mean as u64), human_bytes(s.stdev as u64)))
}

fn rate(s: Option<Spread>) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.1} ± {:.1}", s.mean, s.stdev))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The text `ttrace sweep report` prints.
pub fn text(r: &SweepReport) -> String {
    let failed = r.runs.iter().filter(|x| x.error.is_some()).count();
    let mut out = format!("{} runs, {} failed\n", r.runs.len(), failed);
    for m in &r.models {
        let _ = writeln!(out, "\nmodel {}", m.model);
        for l in &m.disk_vs_mem_limit {
            let _ = writeln!(
                out,
                "  mem limit {:<8} {} runs, disk per token {}",
                limit(l.mem_limit_bytes),
                l.runs,
                bytes(l.disk_bytes_per_token)
            );
        }
        for d in &m.domains {
            let sticky = d.stickiness.map_or("-".into(), |s| format!("{s:.3}"));
            let _ = writeln!(out, "  domain {:<12} {} runs, stickiness {sticky}", d.domain, d.runs);
        }
        if let Some(s) = &m.similarity {
            let _ = writeln!(out, "  {} similarity: {}", s.metric, s.domains.join(", "));
            for (name, row) in s.domains.iter().zip(&s.matrix) {
                let cells: Vec<String> = row.iter().map(|v| format!("{v:.3}")).collect();
                let _ = writeln!(out, "    {name:<12} {}", cells.join(" "));
            }
        }
    }
    out
}

pub fn render(r: &SweepReport) -> String {
    let mut h = String::from(
        "<!doctype html><meta charset=utf-8><title>ttrace sweep report</title><style>\
         body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0 1.5em}\
         td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}\
         td.l{text-align:left}</style><h1>ttrace sweep report</h1>",
    );
    h += "<h2>Runs</h2><table><tr><th>run</th><th>model</th><th>domain</th><th>mem limit</th><th>repeat</th>\
          <th>status</th><th>tokens</th><th>tokens/s</th><th>weight bytes/token</th><th>disk bytes/token</th></tr>";
    for x in &r.runs {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td class=l>{}</td><td class=l>{}</td><td>{}</td><td>{}</td><td class=l>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            x.key.run_id,
            escape(&x.key.model),
            escape(&x.key.domain),
            limit(x.key.mem_limit_bytes),
            x.key.repeat,
            x.error.as_deref().map_or_else(|| "ok".into(), |e| format!("failed: {}", escape(e))),
            x.generated_tokens.map_or("-".into(), |n| n.to_string()),
            x.tokens_per_s.map_or("-".into(), |v| format!("{v:.1}")),
            x.weight_bytes_per_token.map_or("-".into(), |v| human_bytes(v as u64)),
            x.disk_bytes_per_token.map_or("-".into(), |v| human_bytes(v as u64)),
        );
    }
    h += "</table>";
    for m in &r.models {
        model_section(&mut h, m);
    }
    h
}

fn model_section(h: &mut String, m: &ModelReport) {
    let _ = write!(h, "<h2>{}</h2><h3>Disk bytes per token against memory limit</h3>", escape(&m.model));
    *h +=
        "<table><tr><th>mem limit</th><th>runs</th><th>disk bytes/token (mean ± sd)</th><th>min</th><th>max</th></tr>";
    for l in &m.disk_vs_mem_limit {
        let (lo, hi) = l
            .disk_bytes_per_token
            .map_or(("-".into(), "-".into()), |s| (human_bytes(s.min as u64), human_bytes(s.max as u64)));
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{lo}</td><td>{hi}</td></tr>",
            limit(l.mem_limit_bytes),
            l.runs,
            bytes(l.disk_bytes_per_token)
        );
    }
    *h += "</table><h3>Run-to-run spread across repeats</h3><table><tr><th>domain</th><th>mem limit</th><th>runs</th>\
           <th>tokens/s</th><th>disk bytes/token</th><th>weight bytes/token</th></tr>";
    for s in &m.spread {
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&s.domain),
            limit(s.mem_limit_bytes),
            s.runs,
            rate(s.tokens_per_s),
            bytes(s.disk_bytes_per_token),
            bytes(s.weight_bytes_per_token)
        );
    }
    *h += "</table>";
    if m.domains.is_empty() {
        return;
    }
    *h += "<h3>Expert activations per domain</h3><table><tr><th>domain</th><th>runs</th><th>stickiness</th>\
           <th>layer: share of routings per expert</th></tr>";
    for d in &m.domains {
        let layers: Vec<String> = d
            .layers
            .iter()
            .map(|l| {
                let shares: Vec<String> = l.distribution.iter().map(|v| format!("{v:.2}")).collect();
                format!("{}: {}", l.layer, shares.join(" "))
            })
            .collect();
        let _ = write!(
            h,
            "<tr><td class=l>{}</td><td>{}</td><td>{}</td><td class=l>{}</td></tr>",
            escape(&d.domain),
            d.runs,
            d.stickiness.map_or("-".into(), |s| format!("{s:.3}")),
            layers.join("<br>")
        );
    }
    *h += "</table>";
    if let Some(s) = &m.similarity {
        let _ = write!(h, "<h3>Domain similarity ({})</h3><table><tr><th></th>", s.metric);
        for d in &s.domains {
            let _ = write!(h, "<th>{}</th>", escape(d));
        }
        *h += "</tr>";
        for (d, row) in s.domains.iter().zip(&s.matrix) {
            let _ = write!(h, "<tr><th>{}</th>", escape(d));
            for v in row {
                let shade = (255.0 - 120.0 * v.clamp(0.0, 1.0)) as u8;
                let _ = write!(h, "<td style=\"background:rgb({shade},{shade},255)\">{v:.3}</td>");
            }
            *h += "</tr>";
        }
        *h += "</table>";
    }
}
