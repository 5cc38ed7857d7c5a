//! Node output fingerprints (`--values`) in order, placed in their ubatch,
//! token and layer: what `export --format values-jsonl`, the report's first
//! NaN/Inf and `diff --values` read.

use std::{fs::File, io::BufReader, path::Path};

use serde::Serialize;
use tracer_common::{markers, values::flags};

use super::{
    Analysis,
    tensor::{name_layer, view_bytes},
    walk::token_indices,
};
use crate::{
    format::{
        Record, TraceError, TraceReader,
        values::{Fingerprint, user_flags},
    },
    model::ggml_types::GgmlType,
};

/// What the flags say, in words (kernel bits, then user-space ones).
const FLAG_NAMES: [(u32, &str); 7] = [
    (flags::VIEW, "view"),
    (flags::NON_CONTIGUOUS, "non_contiguous"),
    (flags::UNSUPPORTED_TYPE, "unsupported_type"),
    (flags::SET_ROWS, "set_rows"),
    (flags::TOO_BIG, "too_big"),
    (flags::READ_FAILED, "read_failed"),
    (user_flags::INCOMPLETE, "incomplete"),
];

/// One node output (or, with `fused_into`, a node fused away: never written).
#[derive(Clone, Debug, Serialize)]
pub struct ValueRow {
    pub ubatch: Option<u32>,
    /// Among generated tokens (`None` for the prompt).
    pub token_index: Option<u32>,
    pub seq_ids: Vec<i32>,
    pub node_index: Option<u32>,
    pub name: String,
    pub op: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub ne: [i64; 4],
    pub nbytes: Option<u64>,
    pub layer: Option<u32>,
    /// Why bytes are missing or read specially: `view`, `set_rows`, ….
    pub flags: Vec<&'static str>,
    /// The node this one was fused into (its output never exists).
    pub fused_into: Option<String>,
    /// Reads of the same node replaced by this one (barriers inside an op).
    pub superseded: u32,
    #[serde(skip)]
    pub fingerprint: Option<Fingerprint>,
}

impl ValueRow {
    /// The first NaN or Inf, if this output has one.
    pub fn non_finite(&self) -> bool {
        self.fingerprint.as_ref().is_some_and(|f| f.nan + f.inf > 0)
    }
}

/// Every VALUE frame of `path`, in order, with the fused-away nodes listed
/// before the node they were fused into.
pub fn read(path: &Path, analysis: &Analysis) -> Result<Vec<ValueRow>, TraceError> {
    let mut reader: TraceReader<BufReader<File>> = TraceReader::open(path)?;
    let token_of = token_indices(analysis);
    let (mut ubatch, mut next) = (None, 0u32);
    let mut rows = Vec::new();
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Marker(m) if m.cookie == markers::SCHED_GRAPH_COMPUTE => {
                ubatch = Some(next);
                next += 1;
            }
            Record::Marker(m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => ubatch = None,
            Record::Value(v) => {
                let u = ubatch.and_then(|u| analysis.ubatches.get(u as usize));
                let seq_ids: Vec<i32> = u.map(|u| u.tokens.iter().map(|t| t.seq).collect()).unwrap_or_default();
                let token_index = ubatch.and_then(|u| token_of.get(u as usize).copied().flatten());
                let row = |id: u32, fingerprint: Option<Fingerprint>, fused_into: Option<String>| {
                    let d = reader.descriptor(id);
                    ValueRow {
                        ubatch,
                        token_index,
                        seq_ids: seq_ids.clone(),
                        node_index: None,
                        name: d.name.clone(),
                        op: super::op_name(&analysis.header, d.op),
                        type_name: u32::try_from(d.type_id)
                            .ok()
                            .and_then(GgmlType::from_id)
                            .map_or_else(|| d.type_id.to_string(), |t| t.name.to_string()),
                        ne: d.ne,
                        nbytes: view_bytes(d),
                        layer: name_layer(&d.name),
                        flags: Vec::new(),
                        fused_into,
                        superseded: 0,
                        fingerprint,
                    }
                };
                let name = reader.descriptor(v.dst).name.clone();
                if let Some(f) = v.fused {
                    rows.push(row(f, None, Some(name)));
                }
                let mut main = row(v.dst, v.fingerprint, None);
                main.node_index = v.node_index;
                main.superseded = v.superseded;
                main.flags = FLAG_NAMES.iter().filter(|(bit, _)| v.flags & bit != 0).map(|&(_, n)| n).collect();
                rows.push(main);
            }
            _ => {}
        }
    }
    Ok(rows)
}

/// The first output with a NaN or Inf.
pub fn first_non_finite(rows: &[ValueRow]) -> Option<&ValueRow> {
    rows.iter().find(|r| r.non_finite())
}

/// Outputs that have no fingerprint, by reason (fused, not copied, lost).
pub fn unfingerprinted(rows: &[ValueRow]) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = Vec::new();
    for r in rows.iter().filter(|r| r.fingerprint.is_none()) {
        let why = if r.fused_into.is_some() { "fused" } else { r.flags.last().copied().unwrap_or("unknown") };
        match counts.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => counts.push((why, 1)),
        }
    }
    counts
}
