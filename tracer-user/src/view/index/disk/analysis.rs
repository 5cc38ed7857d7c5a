//! The trace's analysis (`analyze::analyze`: ubatches, decodes, I/O,
//! buffers, requests), kept in the index so that a reopened trace is not
//! read again before the view answers: on 101 M ops that read is most of a
//! reopen's wait.
//!
//! It is JSON, the encoding `report --json` already gives these types
//! (some of their fields are left out when empty, which postcard cannot
//! express), in byte columns. A long run's ubatches share a few weight
//! lists of ~20 KB each (`analyze::weights`): each distinct list is written
//! once, and each ubatch keeps the number of its own.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::column::Column;
use crate::analyze::{Analysis, weights::Weights};

/// [`SavedAnalysis::lists`] index of a ubatch that read no weights.
const NO_WEIGHTS: u32 = u32::MAX;

#[derive(Default, Serialize, Deserialize)]
pub struct SavedAnalysis {
    /// The analysis as JSON, every ubatch's weight list left empty.
    json: Column<u8>,
    /// The distinct weight lists, as a JSON list of lists.
    lists: Column<u8>,
    /// Per ubatch: the index of its list in `lists`, or [`NO_WEIGHTS`].
    list_of: Column<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("its analysis does not decode: {0}")]
    Json(#[from] serde_json::Error),
    #[error("its analysis names weight list {list} of {lists}")]
    NoSuchList { list: u32, lists: usize },
    #[error("its analysis has {ubatches} ubatches and {lists} weight lists for them")]
    Lists { ubatches: usize, lists: usize },
}

impl SavedAnalysis {
    pub fn of(analysis: &Analysis) -> Result<SavedAnalysis, AnalysisError> {
        let mut lists: Vec<&Weights> = Vec::new();
        // Keyed by the list's allocation: equal lists are already one.
        let mut seen: HashMap<usize, u32> = HashMap::new();
        let list_of: Vec<u32> = analysis
            .ubatches
            .iter()
            .map(|u| {
                if u.weights.is_empty() {
                    return NO_WEIGHTS;
                }
                *seen.entry(u.weights.list_id()).or_insert_with(|| {
                    lists.push(&u.weights);
                    lists.len() as u32 - 1
                })
            })
            .collect();
        let lists = serde_json::to_vec(&lists)?;
        // A copy for as long as it is written (the lists it drops are
        // shared, the rest is copied).
        let mut bare = analysis.clone();
        for u in &mut bare.ubatches {
            u.weights = Weights::default();
        }
        Ok(SavedAnalysis { json: serde_json::to_vec(&bare)?.into(), lists: lists.into(), list_of: list_of.into() })
    }

    pub fn analysis(&self) -> Result<Analysis, AnalysisError> {
        let mut analysis: Analysis = serde_json::from_slice(&self.json)?;
        let lists: Vec<Weights> = serde_json::from_slice(&self.lists)?;
        if self.list_of.len() != analysis.ubatches.len() {
            return Err(AnalysisError::Lists { ubatches: analysis.ubatches.len(), lists: self.list_of.len() });
        }
        for (u, &list) in analysis.ubatches.iter_mut().zip(self.list_of.iter()) {
            if list != NO_WEIGHTS {
                let shared = lists.get(list as usize).ok_or(AnalysisError::NoSuchList { list, lists: lists.len() })?;
                u.weights = shared.clone();
            }
        }
        Ok(analysis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analyze::{analyze, stats::tests::synthetic},
        format::TraceReader,
    };

    #[test]
    fn an_analysis_comes_back_as_saved_with_its_weight_lists_still_shared() {
        let dir = std::env::temp_dir().join(format!("ttrace-saved-analysis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("moe.data");
        let token = vec![vec![3, 1, 0, 2]];
        synthetic(&trace, &[vec![vec![0, 1, 2, 3], vec![1, 0, 3, 2]], token.clone(), token]);
        let mut analysis = analyze(TraceReader::open(&trace).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // As the analysis interns equal lists on a long run.
        analysis.ubatches[2].weights = analysis.ubatches[1].weights.clone();

        let saved = SavedAnalysis::of(&analysis).unwrap();
        let back = saved.analysis().unwrap();
        // `report --json`'s encoding of both, routing and weights included.
        assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(&analysis).unwrap());
        assert!(back.ubatches.len() == 3 && back.ubatches.iter().all(|u| !u.weights.is_empty()));
        assert!(!back.ubatches[0].routing.is_empty());
        // Which ubatches share a list: as before, and written once each.
        let sharing = |a: &Analysis| -> Vec<Vec<bool>> {
            let list = |u: &crate::analyze::Ubatch| u.weights.list_id();
            a.ubatches.iter().map(|u| a.ubatches.iter().map(|v| list(u) == list(v)).collect()).collect()
        };
        assert_eq!(sharing(&back), sharing(&analysis));
        assert!(sharing(&back)[1][2] && !sharing(&back)[0][1]);
        assert_eq!(saved.list_of.iter().copied().collect::<Vec<_>>(), [0, 1, 1]);
    }

    #[test]
    fn a_ubatch_naming_a_list_that_is_not_there_is_an_error() {
        let saved = SavedAnalysis {
            json: serde_json::to_vec(&Analysis::default()).unwrap().into(),
            lists: b"[]".to_vec().into(),
            list_of: vec![0].into(),
        };
        assert!(matches!(saved.analysis(), Err(AnalysisError::Lists { ubatches: 0, lists: 1 })));
    }
}
