//! What the row formats (JSONL, CSV, Parquet) need from a first pass: each
//! ubatch's phase and token index, and the final header. `correlate::analyze`
//! names and accounts every op, which costs as much as writing the rows; this
//! pass decodes an op only while its ubatch's token count is unknown (the
//! token-embedding GET_ROWS, the graph's first op) and steps over the rest.
//! The phase rules are `correlate`'s; a test holds the two to the same result.

use std::io::Read;

use tracer_common::markers;

use crate::{
    correlate::{Analysis, Decode, Phase, Ubatch},
    record::{Memory, Record, TraceError, TraceReader},
};

/// An [`Analysis`] holding the header, models, decodes and ubatches (index,
/// times, decode, token count and ids, phase), the op and fault counts, lost
/// counters and trailer. Per-op accounting (op times and counts, weights,
/// I/O, ubatch op counts) is left empty.
pub fn scan<R: Read>(mut reader: TraceReader<R>) -> Result<Analysis, TraceError> {
    let mut a = Analysis { header: reader.header().clone(), ..Default::default() };
    let mut current: Option<usize> = None;
    let mut decodes_before_reset = 0usize;
    let mut ops = 0u64;
    reader.skip_ops(true);
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Marker(m) => match m.cookie {
                markers::SCHED_GRAPH_COMPUTE => {
                    let index = a.ubatches.len() as u32;
                    let decode = a.decodes.len().checked_sub(1).map(|d| d as u32);
                    if let Some(d) = decode {
                        a.decodes[d as usize].ubatches.push(index);
                    }
                    a.ubatches.push(Ubatch {
                        index,
                        start_ns: m.ts_ns,
                        end_ns: None,
                        decode,
                        n_tokens: None,
                        token_ids: Vec::new(),
                        phase: Phase::Aux,
                        ops: 0,
                        disk_bytes: 0,
                        disk_requests: 0,
                        faults_major: 0,
                        faults_minor: 0,
                        weights: Default::default(),
                    });
                    current = Some(index as usize);
                }
                markers::SCHED_GRAPH_COMPUTE_RETURN => {
                    if let Some(u) = current.take() {
                        a.ubatches[u].end_ns = Some(m.ts_ns);
                    }
                }
                // llama_process(ctx, type, batch): only DECODE (1) runs the decoder.
                markers::LLAMA_DECODE | markers::LLAMA_PROCESS
                    if m.cookie == markers::LLAMA_DECODE || m.args[1] == 1 =>
                {
                    let function = if m.cookie == markers::LLAMA_DECODE { "llama_decode" } else { "llama_process" };
                    let index = a.decodes.len() as u32;
                    a.decodes.push(Decode {
                        index,
                        ts_ns: m.ts_ns,
                        function,
                        ubatches: Vec::new(),
                        n_tokens: 0,
                        phase: Phase::Aux,
                    });
                }
                markers::LLAMA_PERF_RESET => decodes_before_reset = a.decodes.len(),
                _ => {}
            },
            Record::Op(op) => {
                ops += 1;
                let Some(u) = current else { continue };
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
        reader.skip_ops(current.is_none_or(|u| a.ubatches[u].n_tokens.is_some()));
    }
    a.ops = ops + reader.skipped_ops();
    a.header = reader.header().clone();
    a.truncated = reader.truncated;
    a.models = reader.models().to_vec();
    assign_phases(&mut a, decodes_before_reset);
    Ok(a)
}

/// `correlate::assign_phases`.
fn assign_phases(a: &mut Analysis, decodes_before_reset: usize) {
    for decode in &mut a.decodes {
        decode.n_tokens = decode.ubatches.iter().filter_map(|&u| a.ubatches[u as usize].n_tokens).sum();
        decode.phase = if (decode.index as usize) < decodes_before_reset {
            Phase::Warmup
        } else {
            match decode.n_tokens {
                0 => Phase::Aux,
                1 => Phase::Generate,
                _ => Phase::Prompt,
            }
        };
        match decode.phase {
            Phase::Prompt => a.prompt_tokens += u64::from(decode.n_tokens),
            Phase::Generate => a.generate_runs += 1,
            Phase::Warmup => a.warmup_decodes += 1,
            Phase::Aux => {}
        }
    }
    for ubatch in &mut a.ubatches {
        ubatch.phase = match (ubatch.n_tokens, ubatch.decode) {
            (None, _) => Phase::Aux,
            (Some(_), Some(d)) => a.decodes[d as usize].phase,
            (Some(1), None) => Phase::Generate,
            (Some(_), None) => Phase::Prompt,
        };
    }
}
