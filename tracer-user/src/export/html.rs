//! `ttrace report FILE --html OUT.html`: one self-contained page (inline
//! script and style, no network) for looking at a trace: a heatmap of each
//! model file (tensors by file offset across, ubatches down; colour = not
//! touched / read through the file mapping / page faults in it / bytes of it
//! read from disk during that ubatch — `correlate::io`'s per-(ubatch, tensor)
//! disk bytes; the page counts such cells of generate rows in
//! `body[data-disk-generate-cells]`), the same layout for
//! copies of model tensors, per-layer bytes per generated token (per
//! tensor in the tooltips; `analyze::stats`' exact charges), and the
//! summary table, and the miss-ratio curve of `ttrace simulate` at its
//! defaults (budget → disk bytes per generated token under LRU, OPT and
//! the two-list model; its table carries the exact figures in `data-*`
//! attributes). Tensors narrower than 2 px are widened to 2 px and every
//! cell has a tooltip. Runs of more than 200 ubatches are shown in bins of
//! consecutive ubatches (a cell shows what any ubatch of its bin did), so the
//! page stays small and drawable for long generations.

use std::{fs, path::Path};

use serde_json::json;

use super::{ExportError, rows::phase_name};
use crate::analyze::stats::{Stats, layer_key};
use crate::analyze::{Analysis, simulate::curve::Curve};

const TEMPLATE: &str = include_str!("report.html");

/// `summary` is the text report, shown as the page's table.
const MAX_ROWS: usize = 200;

pub fn write(
    a: &Analysis,
    stats: &Stats,
    summary: &[(String, String)],
    simulated: &Result<Curve, String>,
    out: &Path,
) -> Result<(), ExportError> {
    let bin = stats.ubatches.len().div_ceil(MAX_ROWS).max(1);
    let label = |u: &crate::analyze::stats::UbatchStats| {
        let phase = u.phase.map_or("aux", phase_name);
        match u.token_index {
            Some(k) => format!("token {k}"),
            None => format!("{phase} ubatch {}", u.index),
        }
    };
    let ubatches: Vec<_> = stats
        .ubatches
        .chunks(bin)
        .map(|group| {
            let (first, last) = (&group[0], &group[group.len() - 1]);
            let phase = first.phase.map_or("aux", phase_name);
            let name = if group.len() == 1 { label(first) } else { format!("{} … {}", label(first), label(last)) };
            json!({"index": first.index, "phase": phase, "label": name, "ubatches": group.len(),
                   "ops": group.iter().map(|u| u.ops).sum::<u64>(),
                   "weight_bytes": group.iter().map(|u| u.weight_bytes).sum::<u64>(),
                   "faults": group.iter().map(|u| u.faults).sum::<u64>(),
                   "disk_bytes": group.iter().filter_map(|u| u.disk_bytes).sum::<u64>()})
        })
        .collect();
    let models: Vec<_> = a
        .models
        .iter()
        .enumerate()
        .map(|(m, model)| {
            let mut tensors: Vec<_> = stats.tensors.iter().filter(|t| t.model == m as u32).collect();
            tensors.sort_by_key(|t| (model.tensors[t.tensor as usize].file, t.file_offset));
            let rows: Vec<_> = tensors
                .iter()
                .map(|t| {
                    // One character per ubatch, '0' + bits: 1 file, 2 copy, 4 faulted, 8 read from disk.
                    let cells: String = t
                        .cells
                        .chunks(bin)
                        .map(|g| char::from(b'0' + g.iter().fold(0, |x, &c| x | c).min(15)))
                        .collect();
                    json!({"name": t.name, "offset": t.file_offset, "size": t.size_bytes, "layer": t.layer,
                           "component": t.component, "tokens": t.tokens_touched, "faults": t.faults, "cells": cells,
                           "bytes_per_token": t.bytes_per_token, "upper_bound": t.upper_bound})
                })
                .collect();
            json!({"file": model.files.first(), "tensors": rows})
        })
        .collect();
    let layers: Vec<_> = stats
        .layers
        .iter()
        .map(|l| json!({"layer": l.key, "bytes_per_token": l.bytes_per_token, "upper_bound": l.upper_bound}))
        .collect();
    let data = json!({
        "title": format!("ttrace: {}", a.header.command.join(" ")),
        "summary": summary,
        "ubatches": ubatches,
        "models": models,
        "layers": layers,
        "notes": stats.notes,
        "moe": stats.moe,
        "usage": stats.loaded_vs_used.as_ref().map(|u| json!({
            "load_mode": u.load_mode, "caches_dropped": u.caches_dropped, "total": u.total, "layers": u.layers,
        })),
        "non_layer": layer_key(None),
        "buffers": super::buffers::html_rows(a),
        "simulate": match simulated {
            Ok(curve) => json!({"curve": curve}),
            Err(why) => json!({"error": why}),
        },
    });
    // `</` inside the JSON would end the script element early.
    let json = serde_json::to_string(&data).map_err(|e| ExportError::Invalid(e.to_string()))?.replace("</", "<\\/");
    let page = TEMPLATE.replace("/*TTRACE_DATA*/null", &json);
    fs::write(out, page).map_err(ExportError::write(out))
}
