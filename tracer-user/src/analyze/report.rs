//! The document `ttrace report --json` prints, shared by `report` and `view`
//! (whose summary must be the same figures).

use serde::Serialize;

use super::{Analysis, stats::Stats, summary::Summary};

/// The analysis (per-ubatch phases, token ids and weight tensors read),
/// `summary` (the overview as data) and `stats` (per token, phase, layer,
/// component and tensor), as one JSON object.
#[derive(Serialize)]
pub struct Document<'a> {
    #[serde(flatten)]
    pub analysis: &'a Analysis,
    pub summary: &'a Summary,
    pub stats: &'a Stats,
}
