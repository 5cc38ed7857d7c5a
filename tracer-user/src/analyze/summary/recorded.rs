//! The summary at the end of a long run: what the recorder knew (the
//! trace's header, its trailer and the writer's counts), without reading
//! the trace back. Reading back 100 M ops takes most of a minute and
//! memory that grows with the trace; a run of a day would wait longer.

use super::{Program, Stopped, Summary, TraceFile};
use crate::format::{Header, Lost, Trailer, WriterStats};

impl Summary {
    /// The summary of a trace just written, from its header, trailer and
    /// the writer's counts: no figure that needs the ops read back.
    pub fn recorded(header: &Header, trailer: &Trailer, lost: Lost, path: &str, stats: &WriterStats) -> Self {
        let ops = stats.executed_ops();
        let per_op = |bytes: u64| ops.filter(|&n| n > 0).map(|n| bytes as f64 / n as f64);
        Summary {
            program: Program::of(header),
            mode: header.mode.to_string(),
            pid: header.pid,
            commit: header.llama_commit.clone(),
            command: header.command.clone(),
            duration_ns: trailer.end_monotonic_ns.saturating_sub(header.start_monotonic_ns),
            traced_ns: trailer.end_monotonic_ns.saturating_sub(header.start_monotonic_ns),
            stopped: Some(Stopped {
                reason: trailer.stop_reason.to_string(),
                exit_code: trailer.exit_code,
                exit_signal: trailer.exit_signal,
            }),
            ring: header.ring_read.clone(),
            prompt_ubatches: 0,
            prompt_tokens: 0,
            generate_ubatches: 0,
            warmup_ubatches: 0,
            other_graphs: 0,
            encoder_graphs: 0,
            decoder_graphs: 0,
            tokens: None,
            ops: ops.unwrap_or_default(),
            ops_outside_graphs: 0,
            distinct_weights: 0,
            model_files: Vec::new(),
            model_tensors: 0,
            weight_bytes_per_token: 0,
            file_backed_accesses: 0,
            copy_accesses: 0,
            trace: TraceFile {
                path: path.to_string(),
                bytes: Some(stats.total_bytes),
                bytes_per_op_frame: per_op(stats.op_bytes + stats.graph_bytes),
                bytes_per_op_with_descriptors: per_op(stats.op_bytes + stats.graph_bytes + stats.descriptor_bytes),
            },
            lost,
            tracepoints: trailer.tracepoints,
            recursion_misses: trailer.recursion_misses.clone(),
            skipped: trailer.skipped,
            uncompleted_reads: 0,
            decode_errors: trailer.decode_errors,
            build: header.build.clone(),
            layout_check: trailer.layout_check,
            disabled: trailer.disabled.clone(),
            late_attach: trailer.late_attach.clone(),
            values_missing: trailer.values_missing,
            copies: trailer.copies,
            value_threads: trailer.value_threads.clone(),
            not_read_back: Some(*stats),
        }
    }
}

/// The ops row of a summary not read back, with what gives the rest.
pub(super) fn ops_row(stats: &WriterStats, path: &str) -> String {
    let ops = match stats.executed_ops() {
        Some(n) => format!("{n} recorded"),
        None => format!("{} graph runs and {} op records written", stats.computes, stats.ops),
    };
    format!(
        "{ops}; per-phase, token and weight figures are not read back at the end of a run this long \
         (`ttrace report {path}` reads them)"
    )
}
