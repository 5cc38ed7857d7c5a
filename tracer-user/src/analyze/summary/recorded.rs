//! The summary at the end of a long run: what the recorder knew (the
//! trace's header, its trailer and the writer's counts), without reading
//! the trace back. Reading back 100 M ops takes most of a minute and
//! memory that grows with the trace; a run of a day would wait longer.

use super::{Program, Stopped, Summary, TraceFile};
use crate::format::{Header, Lost, Trailer, WriterStats};

/// Why a summary was not read back from its trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unread {
    /// Past the ops a run's end reads back.
    LongRun,
    /// Written to `/dev/null`: there is nothing to read.
    Discarded,
}

impl Summary {
    /// The summary of a trace just written, from its header, trailer and
    /// the writer's counts: no figure that needs the ops read back.
    pub fn recorded(
        header: &Header,
        trailer: &Trailer,
        lost: Lost,
        path: &str,
        stats: &WriterStats,
        unread: Unread,
    ) -> Self {
        Summary {
            not_read_back: Some((*stats, unread)),
            ..Self::of_record(header, Some(trailer), lost, path, Some(stats), stats.executed_ops())
        }
    }

    /// What the header, the trailer and the writer's counts say, with every
    /// figure only a read of the ops gives left empty: both summaries' base.
    /// `ops`: the executed ops, where known (per-op trace sizes need them).
    pub(super) fn of_record(
        header: &Header,
        trailer: Option<&Trailer>,
        lost: Lost,
        path: &str,
        stats: Option<&WriterStats>,
        ops: Option<u64>,
    ) -> Self {
        // Per executed op, whichever frames carried the ops (OP frames with
        // --op-timing; GRAPH and COMPUTE frames with graph capture).
        let per_op = |bytes: u64| ops.map(|n| if n == 0 { 0.0 } else { bytes as f64 / n as f64 });
        let traced_ns = trailer.map_or(0, |t| t.end_monotonic_ns.saturating_sub(header.start_monotonic_ns));
        Summary {
            program: Program::of(header),
            mode: header.mode.to_string(),
            pid: header.pid,
            commit: header.llama_commit.clone(),
            command: header.command.clone(),
            duration_ns: traced_ns,
            traced_ns,
            stopped: trailer.map(|t| Stopped {
                reason: t.stop_reason.to_string(),
                exit_code: t.exit_code,
                exit_signal: t.exit_signal,
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
                bytes: stats.map(|s| s.total_bytes),
                bytes_per_op_frame: stats.and_then(|s| per_op(s.op_bytes + s.graph_bytes)),
                bytes_per_op_with_descriptors: stats
                    .and_then(|s| per_op(s.op_bytes + s.graph_bytes + s.descriptor_bytes)),
            },
            lost,
            tracepoints: trailer.and_then(|t| t.tracepoints),
            recursion_misses: trailer.map(|t| t.recursion_misses.clone()).unwrap_or_default(),
            skipped: trailer.map(|t| t.skipped).unwrap_or_default(),
            uncompleted_reads: 0,
            decode_errors: trailer.map_or(0, |t| t.decode_errors),
            build: header.build.clone(),
            layout_check: trailer.and_then(|t| t.layout_check),
            disabled: trailer.map(|t| t.disabled.clone()).unwrap_or_default(),
            late_attach: trailer.and_then(|t| t.late_attach.clone()),
            values_missing: trailer.and_then(|t| t.values_missing),
            copies: trailer.and_then(|t| t.copies),
            value_threads: trailer.map(|t| t.value_threads.clone()).unwrap_or_default(),
            not_read_back: None,
        }
    }
}

/// The ops row of a summary not read back, with what gives the rest.
pub(super) fn ops_row(stats: &WriterStats, unread: Unread, path: &str) -> String {
    let ops = match stats.executed_ops() {
        Some(n) => format!("{n} recorded"),
        None => format!("{} graph runs and {} op records written", stats.computes, stats.ops),
    };
    match unread {
        Unread::LongRun => format!(
            "{ops}; per-phase, token and weight figures are not read back at the end of a run this long \
             (`ttrace report {path}` reads them)"
        ),
        Unread::Discarded => format!("{ops}; written to {path}, so per-phase, token and weight figures are not known"),
    }
}
