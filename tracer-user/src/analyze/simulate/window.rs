//! Which generated tokens a replay covers: on a long trace, the first ones.
//!
//! A replay's cost grows with the pages the ops read, and the page-level
//! policies (2q, LRU under readahead, OPT) replay each budget separately:
//! a day of serving (100 M ops, 175 k tokens of SmolLM2) took over 15
//! minutes. A replay of the first tokens is exact for those tokens, so
//! `simulate` says how many it replayed instead of estimating the rest.
//! The window ends at a ubatch boundary, and everything before it
//! (loading, prompts, other requests' ubatches) is replayed as it ran.

use serde::Serialize;

use crate::analyze::{Analysis, Phase};

/// Which generated tokens to replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenWindow {
    /// All of them, when the ops read fewer than [`AUTO_PAGES`] pages in
    /// all; else the first tokens within that many (at least
    /// [`AUTO_MIN_TOKENS`]).
    #[default]
    Auto,
    /// The first `n` generated tokens.
    First(u64),
    /// Every generated token.
    All,
}

/// The page reads (after loading) `Auto` stops after. On the bench
/// machine (2 cores), the default policies replay about 0.8 M pages a
/// second (SmolLM2: 1024 tokens, 24 M pages, in 29.6 s), so about 20 s;
/// reading a 100 M-op trace's summary first takes as long again.
pub const AUTO_PAGES: u64 = 1 << 24;
/// `Auto` replays at least this many generated tokens, however many pages
/// they read.
pub const AUTO_MIN_TOKENS: u64 = 64;

/// A replay that stopped before the trace's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// The first ubatch not replayed.
    pub ubatch: u32,
    /// Generated tokens replayed.
    pub tokens: u64,
    /// Generated tokens in the trace.
    pub trace_tokens: u64,
}

/// Decides, as the replay meets each ubatch, whether the window ends there.
pub(super) struct Windowing<'a> {
    window: TokenWindow,
    analysis: &'a Analysis,
    last_ubatch: Option<u32>,
    /// Tokens of the generate ubatches begun so far.
    tokens: u64,
    /// Pages the ops read so far.
    pub pages: u64,
}

impl<'a> Windowing<'a> {
    pub fn new(window: TokenWindow, analysis: &'a Analysis) -> Windowing<'a> {
        Windowing { window, analysis, last_ubatch: None, tokens: 0, pages: 0 }
    }

    /// An op of `ubatch` is next: whether the window ends before it.
    pub fn ends_before(&mut self, ubatch: Option<u32>) -> bool {
        let Some(u) = ubatch.filter(|&u| Some(u) != self.last_ubatch) else { return false };
        let full = match self.window {
            TokenWindow::All => false,
            TokenWindow::First(n) => self.tokens >= n,
            TokenWindow::Auto => self.pages >= AUTO_PAGES && self.tokens >= AUTO_MIN_TOKENS,
        };
        if full {
            return true;
        }
        self.last_ubatch = Some(u);
        self.tokens += ubatch_tokens(self.analysis, u);
        false
    }

    /// The window's end, had the replay stopped before `ubatch`: its tokens
    /// counted as the per-token figures count them (a ubatch whose ops were
    /// lost counts too).
    pub fn cut(&self, ubatch: u32) -> Cut {
        let a = self.analysis;
        Cut { ubatch, tokens: generated_tokens(a, Some(ubatch)), trace_tokens: generated_tokens(a, None) }
    }
}

/// Tokens ubatch `u` generated: one per token of a generate ubatch.
fn ubatch_tokens(a: &Analysis, u: u32) -> u64 {
    a.ubatches
        .get(u as usize)
        .filter(|u| u.phase == Phase::Generate)
        .map_or(0, |u| u64::from(u.n_tokens.unwrap_or(1).max(1)))
}

/// Generated tokens of the ubatches before ubatch `end` (all, when `None`).
pub fn generated_tokens(a: &Analysis, end: Option<u32>) -> u64 {
    let end = end.unwrap_or(u32::MAX);
    a.ubatches.iter().filter(|u| u.index < end).map(|u| ubatch_tokens(a, u.index)).sum()
}
