//! What the row formats (JSONL, CSV, Parquet) need from a first pass: each
//! ubatch's phase and token index, and the final header. `correlate::analyze`
//! names and accounts every op, which costs as much as writing the rows; this
//! pass decodes an op only while its ubatch's token count is unknown (the
//! token-embedding GET_ROWS, the graph's first op) and steps over the rest.
//! The phase rules are `correlate`'s; a test holds the two to the same result.

use std::io::Read;

use crate::{
    analyze::{Analysis, Boundaries, assign_phases},
    format::{Memory, Record, TraceError, TraceReader},
};

/// An [`Analysis`] holding the header, models, decodes and ubatches (index,
/// times, decode, token count and ids, phase), the op and fault counts, lost
/// counters and trailer. Per-op accounting (op times and counts, weights,
/// I/O, ubatch op counts) is left empty.
pub fn scan<R: Read>(mut reader: TraceReader<R>) -> Result<Analysis, TraceError> {
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
                // As `correlate::account_op`: a weight at slot 0 of a GET_ROWS,
                // whose slot-1 source holds one id per token.
                let get_rows = reader.header().op_names.iter().position(|n| n == "GET_ROWS").map(|i| i as i32);
                let dst = reader.descriptor(op.dst);
                for &(slot, id) in &op.srcs {
                    let weight = matches!(reader.descriptor(id).memory, Memory::ModelFile { .. } | Memory::Copy { .. });
                    if !weight || slot != 0 || Some(dst.op) != get_rows || a.ubatches[u].n_tokens.is_some() {
                        continue;
                    }
                    if let Some(&(_, ids)) = op.srcs.iter().find(|(s, _)| *s == 1) {
                        a.ubatches[u].n_tokens = u32::try_from(reader.descriptor(ids).ne[0]).ok();
                        a.ubatches[u].token_ids = op.token_ids.clone();
                    }
                }
            }
            Record::Fault(_) => a.faults += 1,
            Record::Lost(lost) => a.lost = lost,
            Record::End(trailer) => a.trailer = Some(trailer),
            Record::PageCache(_) | Record::Block(_) | Record::Model(_) => {}
        }
        // Only ops of a ubatch whose token count is still open can change it.
        reader.skip_ops(bounds.current.is_none_or(|u| a.ubatches[u].n_tokens.is_some()));
    }
    a.ops = ops + reader.skipped_ops();
    a.header = reader.header().clone();
    a.truncated = reader.truncated;
    a.models = reader.models().to_vec();
    assign_phases(&mut a, bounds.decodes_before_reset);
    Ok(a)
}
