//! What the row formats (JSONL, CSV, Parquet) need from a first pass: each
//! ubatch's phase and token index, and the final header. `correlate::analyze`
//! names and accounts every op, which costs as much as writing the rows; this
//! pass decodes an op only while its ubatch's token count is unknown (the
//! token-embedding GET_ROWS, the graph's first op) and steps over the rest.
//! The phase rules are `correlate`'s; a test holds the two to the same result.

use std::{io::Read, path::Path};

use super::{Analysis, Boundaries, assign_phases, correlate::take_token_input};
use crate::format::{Record, TraceError, TraceReader};

/// An [`Analysis`] holding the header, models, decodes and ubatches (index,
/// times, decode, token count and ids, phase), the op and fault counts, lost
/// counters and trailer. Per-op accounting (op times and counts, weights,
/// I/O, ubatch op counts) is left empty.
pub fn scan<R: Read>(reader: TraceReader<R>) -> Result<Analysis, TraceError> {
    scan_noting_routing(reader).map(|(a, _)| a)
}

/// The first pass of the row formats: [`scan`], unless the trace holds MoE
/// routing, whose per-ubatch expert bytes (the `weight_bytes` of MUL_MAT_ID
/// rows) only `correlate::analyze` accounts; then that, a second read.
pub fn for_rows(trace: &Path) -> Result<Analysis, TraceError> {
    let (a, routed) = scan_noting_routing(TraceReader::open(trace)?)?;
    if routed { super::analyze(TraceReader::open(trace)?) } else { Ok(a) }
}

/// [`scan`], and whether a ROUTING record was seen.
fn scan_noting_routing<R: Read>(mut reader: TraceReader<R>) -> Result<(Analysis, bool), TraceError> {
    let mut routed = false;
    let mut a = Analysis { header: reader.header().clone(), ..Default::default() };
    let mut bounds = Boundaries::default();
    let mut ops = 0u64;
    reader.skip_ops(true);
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Marker(m) => bounds.on_marker(&mut a, &m),
            Record::Op(op) => {
                ops += 1;
                let Some(u) = bounds.current else { continue };
                if a.ubatches[u].n_tokens.is_none() {
                    take_token_input(&mut a.ubatches[u], &op, &reader);
                }
            }
            Record::Fault(_) => a.faults += 1,
            Record::Lost(lost) => a.lost = lost,
            Record::End(trailer) => a.trailer = Some(*trailer),
            Record::Routing(_) => routed = true,
            Record::Batch(b) => bounds.on_batch(b),
            Record::PageCache(_) | Record::Block(_) | Record::Model(_) | Record::Buffer(_) | Record::Value(_) => {}
        }
        // Only ops of a ubatch whose token count is still open can change it.
        reader.skip_ops(bounds.current.is_none_or(|u| a.ubatches[u].n_tokens.is_some()));
    }
    a.ops = ops + reader.skipped_ops();
    a.header = reader.header().clone();
    a.truncated = reader.truncated;
    a.models = reader.models().to_vec();
    assign_phases(&mut a, bounds);
    Ok((a, routed))
}
