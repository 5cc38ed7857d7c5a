//! ggml's backend buffers in the outputs: the report's section (text, and
//! the rows the HTML page draws), and the thesis web UI's
//! `buffer-timeline.json` (its `src/types/data.ts`: `BufferTimeline`).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::{
    analyze::{
        Analysis,
        buffers::{Buffer, ggml_usage_name},
    },
    units::human_bytes,
};

const MIB: f64 = 1024.0 * 1024.0;

/// The thesis's "no layer" value (`BufferInfo.layer`).
const NO_LAYER: u32 = 65535;

/// The time buffers are sized as llama.cpp logs them: when its first
/// ubatch graph starts (loading and the compute reserve are done); the end
/// of the trace when it ran none.
pub fn sized_at(a: &Analysis) -> u64 {
    a.ubatches.first().map_or(u64::MAX - 1, |u| u.start_ns)
}

/// The report's section: every buffer, then the bytes per usage and type
/// at the first graph, in MiB as llama.cpp prints its buffer sizes.
pub fn render_text(a: &Analysis) -> String {
    let mut out = String::new();
    if a.buffers.is_empty() {
        return out;
    }
    let start = a.header.start_monotonic_ns;
    let ms =
        |t: Option<u64>| t.map_or_else(|| "-".to_string(), |t| format!("{:.1}", t.saturating_sub(start) as f64 / 1e6));
    let _ = writeln!(
        out,
        "\nbackend buffers     type          usage              size   created ms   freed ms   op reads ({} empty left out)",
        a.buffers.empty
    );
    for b in &a.buffers.list {
        let _ = writeln!(
            out,
            "  buffer {:<10} {:<13} {:<16} {:>10} {:>12} {:>10} {:>10}",
            b.id,
            if b.type_name.is_empty() { "?" } else { &b.type_name },
            b.label(),
            human_bytes(b.size),
            ms(b.created_ns),
            ms(b.freed_ns),
            b.source_reads,
        );
    }
    let _ = writeln!(out, "\nbuffer bytes at the first graph, per usage and type");
    for ((usage, type_name), bytes) in a.buffers.sizes_at(sized_at(a)) {
        let _ = writeln!(out, "  {usage:<10} {type_name:<13} {:>10.2} MiB", bytes as f64 / MIB);
    }
    out
}

/// Rows for the HTML report's buffer table.
pub fn html_rows(a: &Analysis) -> Value {
    let start = a.header.start_monotonic_ns;
    let ms = |t: Option<u64>| t.map(|t| t.saturating_sub(start) as f64 / 1e6);
    let buffers: Vec<Value> = a
        .buffers
        .list
        .iter()
        .map(|b| {
            json!({"id": b.id, "type": b.type_name, "usage": b.label(), "size": b.size,
                   "created_ms": ms(b.created_ns), "freed_ms": ms(b.freed_ns), "op_reads": b.source_reads})
        })
        .collect();
    let sums: Vec<Value> = a
        .buffers
        .sizes_at(sized_at(a))
        .into_iter()
        .map(|((usage, type_name), bytes)| json!({"usage": usage, "type": type_name, "size": bytes}))
        .collect();
    json!({"buffers": buffers, "at_first_graph": sums})
}

/// `buffer-timeline.json`: the thesis UI's fields, and ttrace's own beside
/// them (`type_name`, `usage_label`, `base`, `address`). `None` when the
/// trace holds no buffer records (older traces, or buffers off).
pub fn timeline(a: &Analysis) -> Option<Value> {
    if a.buffers.is_empty() {
        return None;
    }
    let start = a.header.start_monotonic_ns;
    let ms = |t: u64| t.saturating_sub(start) as f64 / 1e6;
    let buffers: Vec<Value> = a
        .buffers
        .list
        .iter()
        .map(|b| {
            json!({
                "id": b.id, "name": b.name(), "size": b.size, "backend": backend(&b.type_name),
                "usage": b.ggml_usage, "usage_name": ggml_usage_name(b.ggml_usage), "layer": NO_LAYER,
                "alloc_time_ms": ms(b.created_ns.unwrap_or(start)), "dealloc_time_ms": b.freed_ns.map(ms),
                "type_name": b.type_name, "usage_label": b.label(),
                "base": b.base.map(|p| format!("{p:#x}")), "address": format!("{:#x}", b.address),
            })
        })
        .collect();
    // Allocations before frees at the same instant, so the running sum never dips below 0.
    let mut events: Vec<(u64, bool, &Buffer)> = Vec::new();
    for b in &a.buffers.list {
        events.push((b.created_ns.unwrap_or(start), false, b));
        if let Some(f) = b.freed_ns {
            events.push((f, true, b));
        }
    }
    events.sort_by_key(|&(t, freed, b)| (t, freed, b.id));
    let (mut total, mut active, mut peak) = (0u64, 0u64, 0u64);
    let timeline: Vec<Value> = events
        .iter()
        .map(|&(t, freed, b)| {
            if freed {
                total = total.saturating_sub(b.size);
                active = active.saturating_sub(1);
            } else {
                total += b.size;
                active += 1;
            }
            peak = peak.max(total);
            json!({"timestamp_ms": ms(t), "event": if freed { "dealloc" } else { "alloc" }, "buffer_id": b.id,
                   "buffer_name": b.name(), "size": b.size, "cumulative_size": total,
                   "num_active_buffers": active})
        })
        .collect();
    let mut breakdown = serde_json::Map::new();
    for b in &a.buffers.list {
        let n = breakdown.entry(ggml_usage_name(b.ggml_usage)).or_insert(json!(0));
        *n = json!(n.as_u64().unwrap_or(0) + 1);
    }
    let end = a.trailer.as_ref().map_or_else(|| a.last_ts_ns.unwrap_or(start), |t| t.end_monotonic_ns);
    Some(json!({
        "metadata": {
            "total_events": timeline.len(), "total_buffers": buffers.len(), "peak_occupancy_bytes": peak,
            "peak_occupancy_mb": peak as f64 / MIB, "duration_ms": ms(end), "usage_breakdown": breakdown,
        },
        "buffers": buffers,
        "timeline": timeline,
    }))
}

/// The backend of a buffer type: `CPU` for `CPU`, `CPU_Mapped`, `CPU_REPACK`.
fn backend(type_name: &str) -> &str {
    match type_name.split_once('_') {
        Some((backend, _)) => backend,
        None if type_name.is_empty() => "unknown",
        None => type_name,
    }
}
