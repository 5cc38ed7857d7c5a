//! A sweep directory: where each run's trace, log and record go, and which
//! runs are done. A run is done when its record `runs/<id>.json` exists: it
//! is written (to a temporary name, then renamed) only after the run's
//! dataset files are in place, so a rerun skips exactly the finished runs.

use std::path::{Path, PathBuf};

use crate::export::dataset::RunInfo;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a run record")]
    Record { path: String, source: serde_json::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io { path: path.display().to_string(), source }
}

pub struct SweepDir {
    pub root: PathBuf,
}

impl SweepDir {
    pub fn new(root: &Path) -> SweepDir {
        SweepDir { root: root.to_path_buf() }
    }

    pub fn dataset(&self) -> PathBuf {
        self.root.join("dataset")
    }

    pub fn records(&self) -> PathBuf {
        self.root.join("runs")
    }

    /// Relative to the root (as the `runs` table records it).
    pub fn trace_rel(id: &str) -> String {
        format!("traces/{id}.data")
    }

    pub fn trace(&self, id: &str) -> PathBuf {
        self.root.join(Self::trace_rel(id))
    }

    pub fn log(&self, id: &str) -> PathBuf {
        self.root.join("logs").join(format!("{id}.log"))
    }

    /// Private model copies for cold runs.
    pub fn models(&self) -> PathBuf {
        self.root.join("models")
    }

    pub fn create(&self) -> Result<(), StateError> {
        for dir in [self.dataset(), self.records(), self.root.join("traces"), self.root.join("logs")] {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        }
        Ok(())
    }

    fn record(&self, id: &str) -> PathBuf {
        self.records().join(format!("{id}.json"))
    }

    pub fn is_done(&self, id: &str) -> bool {
        self.record(id).is_file()
    }

    /// A finished run that failed (an unreadable record counts as failed,
    /// so that running it again replaces it).
    pub fn failed(&self, id: &str) -> bool {
        let record = std::fs::read_to_string(self.record(id)).ok();
        record.and_then(|t| serde_json::from_str::<RunInfo>(&t).ok()).is_none_or(|r| r.error.is_some())
    }

    /// The run is done: its record, atomically.
    pub fn mark_done(&self, info: &RunInfo) -> Result<(), StateError> {
        let path = self.record(&info.run_id);
        let tmp = self.records().join(format!(".{}.json.tmp", info.run_id));
        let text = serde_json::to_string_pretty(info)
            .map_err(|source| StateError::Record { path: path.display().to_string(), source })?;
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Every finished run's record, in id order.
    pub fn finished(&self) -> Result<Vec<RunInfo>, StateError> {
        let dir = self.records();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "json")
                    && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).map_err(io(p))?;
                serde_json::from_str(&text)
                    .map_err(|source| StateError::Record { path: p.display().to_string(), source })
            })
            .collect()
    }
}
