//! A track per sequence (a llama-server slot, a llama-batched-bench batch
//! entry): one slice per ubatch it had tokens in, named by its request and
//! what those tokens were (`request R: prompt N` / `request R: generate P`).

use std::io::Write;

use super::{ExportError, PROCESS_UUID, PerfettoSink, proto::*, track};
use crate::analyze::{
    Analysis,
    sequences::{TokenInfo, TokenKind},
};

/// `+ sequence id` (ids are non-negative in llama.cpp).
pub const SEQUENCE_UUID: u64 = 0x4_0000_0000;

impl<W: Write> PerfettoSink<W> {
    pub(super) fn sequence_tracks(&mut self, a: &Analysis) -> Result<(), ExportError> {
        let mut seqs: Vec<i32> = a.requests.iter().map(|r| r.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        for s in seqs {
            self.descriptor(TrackDescriptor {
                sibling_order_rank: Some(-3),
                ..track(SEQUENCE_UUID + u64::from(s as u32), &format!("sequence {s}"), Some(PROCESS_UUID))
            })?;
        }
        Ok(())
    }

    /// At a ubatch's start: a slice on each of its sequences' tracks.
    pub(super) fn sequence_slices_begin(&mut self, ts: u64, tokens: &[TokenInfo]) -> Result<(), ExportError> {
        let mut seen: Vec<i32> = Vec::new();
        for t in tokens {
            if seen.contains(&t.seq) {
                continue;
            }
            seen.push(t.seq);
            let mine: Vec<&TokenInfo> = tokens.iter().filter(|x| x.seq == t.seq).collect();
            let generated = mine.iter().all(|x| x.kind == TokenKind::Generated);
            let name = match (mine[0].kind, generated) {
                (TokenKind::Warmup, _) => "warm-up".to_string(),
                (_, true) => format!("request {}: generate {}", t.request, t.pos.map_or("?".into(), |p| p.to_string())),
                _ => format!("request {}: prompt {}", t.request, mine.len()),
            };
            let track_uuid = SEQUENCE_UUID + u64::from(t.seq as u32);
            let e = TrackEvent {
                r#type: Some(TYPE_SLICE_BEGIN),
                track_uuid: Some(track_uuid),
                name: Some(name),
                ..Default::default()
            };
            self.event(ts, e, Default::default())?;
            self.open_sequences.push(track_uuid);
        }
        Ok(())
    }

    pub(super) fn sequence_slices_end(&mut self, ts: u64) -> Result<(), ExportError> {
        for track in std::mem::take(&mut self.open_sequences) {
            self.end(ts, track)?;
        }
        Ok(())
    }
}
