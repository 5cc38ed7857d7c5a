//! Sequences and requests: each token's sequence id and position, whether it
//! is a prompt token or a generated one, and the requests they make up.
//!
//! The source is each ubatch as llama.cpp is about to compute it
//! (`llama_context::process_ubatch`, `FrameKind::Batch`): the graph's inputs
//! hold token ids and positions but no sequence ids (those only shape the KQ
//! mask), and the caller's batch is an opaque C++ object. By then llama.cpp
//! has filled in what the caller left out (sequence 0, positions that
//! continue, an output for the last token).
//!
//! A token is **generated** when it is its sequence's only token in the
//! ubatch, asks for an output, and continues that sequence's positions right
//! after a token whose output was asked for (the token sampled from it is
//! this one): one decode step. Everything else is **prompt**, including the
//! last token of a prompt fed in chunks. A **request** is
//! a sequence's prompt and its generation: a new one starts when a sequence
//! gets prompt tokens after generating, or its positions start over (a slot
//! reused). Requests that never ask for an output compute nothing anyone
//! reads (llama-batched-bench's warm-up batch) and, like decodes before
//! llama.cpp's perf reset, are warm-up: counted apart. Requests that never
//! generate are counted apart too, as prompt-only: llama-server's start-up
//! probe of its KV cache is one; so is a request for a single token, whose
//! one output is sampled but never decoded.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Analysis, Phase};
use crate::format::reader::{Batch, BatchArray};

/// The arrays of one ubatch (each at most `MAX_BATCH_TOKENS`).
#[derive(Clone, Debug, Default)]
pub struct UbatchArrays {
    pub n_tokens: u32,
    pub token: Option<Vec<i32>>,
    pub pos: Option<Vec<i32>>,
    pub seq: Option<Vec<i32>>,
    pub output: Option<Vec<i32>>,
}

impl UbatchArrays {
    pub fn set(&mut self, b: Batch) {
        self.n_tokens = b.n_tokens;
        let slot = match b.array {
            BatchArray::Token => &mut self.token,
            BatchArray::Pos => &mut self.pos,
            BatchArray::Seq => &mut self.seq,
            BatchArray::Output => &mut self.output,
        };
        *slot = Some(b.values);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    Prompt,
    Generated,
    /// A warm-up request's token.
    Warmup,
}

/// One token of a ubatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub seq: i32,
    /// `None` when the caller left positions to llama.cpp.
    pub pos: Option<i32>,
    pub kind: TokenKind,
    pub output: bool,
    pub request: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Request {
    pub index: u32,
    pub seq: i32,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// Outputs it asked for: what the caller could sample. A server samples
    /// one token more than it decodes (the last is never fed back), so its
    /// own count of predicted tokens is this.
    pub outputs: u32,
    pub warmup: bool,
    /// Not warm-up, and generated nothing (see the module comment).
    pub prompt_only: bool,
    pub first_decode: u32,
    pub last_decode: u32,
    /// Begun before the trace read (a ring whose oldest files are gone):
    /// its prompt, and the tokens generated before, are not in it.
    pub begun_before: bool,
    /// `(ubatch, tokens of this request in it)`.
    pub ubatches: Vec<(u32, u32)>,
}

/// Token totals, warm-up apart.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TokenCounts {
    pub prompt: u64,
    pub generated: u64,
    /// Distinct sequence ids of the counted requests.
    pub sequences: u64,
    pub requests: u64,
    pub warmup_tokens: u64,
    pub prompt_only_requests: u64,
    pub prompt_only_tokens: u64,
    /// Ubatches longer than ttrace records (`MAX_BATCH_TOKENS`): their tail
    /// tokens are not counted.
    pub truncated_batches: u64,
}

#[derive(Default)]
struct SeqState {
    last_pos: Option<i32>,
    /// Whether its last token asked for an output.
    last_output: bool,
    request: Option<usize>,
}

/// The rule of the module comment applied one ubatch at a time: what
/// [`classify`] runs over a whole trace and `ttrace top` runs live.
#[derive(Default)]
pub struct RequestTracker {
    seqs: HashMap<i32, SeqState>,
    pub requests: Vec<Request>,
    /// The trace starts in the middle of the run: a sequence first seen past
    /// position 0 continues a request begun before.
    pub mid_run: bool,
}

impl RequestTracker {
    /// Classify the tokens of ubatch `b` (of decode `decode`; `warm` for a
    /// warm-up decode) as prompt or generated, opening requests as needed.
    /// The flag says the ubatch was longer than what was recorded.
    pub fn ubatch(&mut self, b: &UbatchArrays, decode: Option<u32>, warm: bool) -> (Vec<TokenInfo>, bool) {
        let n = (b.n_tokens as usize).min(b.token.as_ref().map_or(usize::MAX, Vec::len));
        let seq_of = |i: usize| b.seq.as_ref().and_then(|s| s.get(i)).copied().unwrap_or(0);
        let mut per_seq: HashMap<i32, u32> = HashMap::new();
        (0..n).for_each(|i| *per_seq.entry(seq_of(i)).or_default() += 1);
        let requests = &mut self.requests;
        let mut tokens = Vec::with_capacity(n);
        for i in 0..n {
            let seq = seq_of(i);
            let pos = b.pos.as_ref().and_then(|p| p.get(i)).copied();
            let output = b.output.as_ref().map_or(i + 1 == n, |o| o.get(i).is_some_and(|&f| f != 0));
            let st = self.seqs.entry(seq).or_default();
            if self.mid_run && st.last_pos.is_none() && pos.is_some_and(|p| p > 0) {
                let first_decode = decode.unwrap_or(0);
                let index = requests.len() as u32;
                requests.push(Request { index, seq, first_decode, begun_before: true, ..Default::default() });
                (st.request, st.last_pos, st.last_output) = (Some(index as usize), pos.map(|p| p - 1), true);
            }
            let (continues, restarts) = match (pos, st.last_pos) {
                (Some(p), Some(l)) => (p == l + 1, p <= l),
                (None, Some(_)) => (true, false),
                _ => (false, false),
            };
            let open = st.request.filter(|&r| !restarts && requests[r].warmup == warm);
            let generated = !warm
                && per_seq[&seq] == 1
                && output
                && continues
                && st.last_output
                && open.is_some_and(|r| requests[r].prompt_tokens > 0 || requests[r].begun_before);
            let r = match open {
                Some(r) if generated || requests[r].generated_tokens == 0 => r,
                _ => {
                    let index = requests.len() as u32;
                    let first_decode = decode.unwrap_or(0);
                    requests.push(Request { index, seq, warmup: warm, first_decode, ..Default::default() });
                    requests.len() - 1
                }
            };
            st.request = Some(r);
            st.last_output = output;
            st.last_pos = pos.or(st.last_pos.map(|l| l + 1)).or(Some(0));
            let req = &mut requests[r];
            req.last_decode = decode.unwrap_or(req.last_decode);
            req.outputs += u32::from(output);
            if generated {
                req.generated_tokens += 1;
            } else {
                req.prompt_tokens += 1;
            }
            let kind = if generated { TokenKind::Generated } else { TokenKind::Prompt };
            tokens.push(TokenInfo { seq, pos, kind, output, request: r as u32 });
        }
        (tokens, n < b.n_tokens as usize)
    }
}

/// Classify every token of the ubatches whose arrays were recorded, build
/// the requests, and set each decode's phase from its tokens: generate when
/// all are generated ones, warm-up when all belong to warm-up requests.
pub fn classify(a: &mut Analysis) {
    if a.ubatches.iter().all(|u| u.arrays.is_none()) {
        return;
    }
    let mid_run = a.header.ring_read.as_ref().is_some_and(|r| r.missing.is_some());
    let mut tracker = RequestTracker { mid_run, ..Default::default() };
    let mut truncated = 0;
    for u in 0..a.ubatches.len() {
        let Some(b) = a.ubatches[u].arrays.take() else { continue };
        let decode = a.ubatches[u].decode;
        let warm = decode.is_some_and(|d| a.decodes[d as usize].phase == Phase::Warmup);
        let (tokens, cut) = tracker.ubatch(&b, decode, warm);
        truncated += u64::from(cut);
        a.ubatches[u].tokens = tokens;
    }
    let mut requests = tracker.requests;
    // Never asked for an output: nothing was read from it.
    for r in &mut requests {
        r.warmup |= r.outputs == 0;
        r.prompt_only = !r.warmup && r.generated_tokens == 0;
    }
    for u in &mut a.ubatches {
        u.sequences = columns(&u.tokens);
        let mut per_request: HashMap<u32, u32> = HashMap::new();
        for t in &mut u.tokens {
            if requests[t.request as usize].warmup {
                t.kind = TokenKind::Warmup;
            }
            *per_request.entry(t.request).or_default() += 1;
        }
        let mut shares: Vec<(u32, u32)> = per_request.into_iter().collect();
        shares.sort_unstable();
        for (r, n) in shares {
            requests[r as usize].ubatches.push((u.index, n));
        }
    }
    for d in &mut a.decodes {
        let tokens: Vec<&TokenInfo> = d.ubatches.iter().flat_map(|&u| &a.ubatches[u as usize].tokens).collect();
        // llama-server's context check stays aux, whatever its tokens.
        if tokens.is_empty() || d.context_check {
            continue;
        }
        if tokens.iter().all(|t| t.kind == TokenKind::Warmup) {
            d.phase = Phase::Warmup;
        } else if d.phase != Phase::Warmup {
            let all_generated = tokens.iter().all(|t| t.kind == TokenKind::Generated);
            d.phase = if all_generated { Phase::Generate } else { Phase::Prompt };
        }
    }
    let counted: Vec<&Request> = requests.iter().filter(|r| !r.warmup && !r.prompt_only).collect();
    let prompt_only: Vec<&Request> = requests.iter().filter(|r| r.prompt_only).collect();
    let mut ids: Vec<i32> = counted.iter().map(|r| r.seq).collect();
    ids.sort_unstable();
    ids.dedup();
    a.tokens = Some(TokenCounts {
        prompt: counted.iter().map(|r| u64::from(r.prompt_tokens)).sum(),
        generated: counted.iter().map(|r| u64::from(r.generated_tokens)).sum(),
        sequences: ids.len() as u64,
        requests: counted.len() as u64,
        warmup_tokens: requests
            .iter()
            .filter(|r| r.warmup)
            .map(|r| u64::from(r.prompt_tokens + r.generated_tokens))
            .sum(),
        prompt_only_requests: prompt_only.len() as u64,
        prompt_only_tokens: prompt_only.iter().map(|r| u64::from(r.prompt_tokens)).sum(),
        truncated_batches: truncated,
    });
    a.requests = requests;
}

/// `seq_ids` and `positions` of a ubatch: its sequences in token order, and
/// each one's positions as `first-last` (`first` alone for one token; `?`
/// where positions were not recorded).
fn columns(tokens: &[TokenInfo]) -> Option<(String, String)> {
    let mut order: Vec<(i32, Option<i32>, Option<i32>)> = Vec::new();
    for t in tokens {
        match order.iter_mut().find(|(s, _, _)| *s == t.seq) {
            Some((_, first, last)) => {
                *first = first.zip(t.pos).map(|(f, p)| f.min(p));
                *last = last.zip(t.pos).map(|(l, p)| l.max(p));
            }
            None => order.push((t.seq, t.pos, t.pos)),
        }
    }
    if order.is_empty() {
        return None;
    }
    let ids: Vec<String> = order.iter().map(|(s, _, _)| s.to_string()).collect();
    let positions: Vec<String> = order
        .iter()
        .map(|(_, first, last)| match (first, last) {
            (Some(f), Some(l)) if f == l => f.to_string(),
            (Some(f), Some(l)) => format!("{f}-{l}"),
            _ => "?".to_string(),
        })
        .collect();
    Some((ids.join(";"), positions.join(";")))
}
