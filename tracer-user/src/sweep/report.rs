//! `ttrace sweep report DIR`: every finished run's trace analysed as `ttrace
//! report` analyses it, then compared ([`crate::analyze::sweep`]).

use indicatif::ProgressBar;

use super::state::{StateError, SweepDir};
use crate::{
    analyze::{
        self,
        sweep::{RunFigures, RunKey, SweepReport},
    },
    format::TraceReader,
};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("reading {path}")]
    Trace { path: String, source: crate::format::TraceError },
    #[error("{0} holds no finished runs (runs/*.json)")]
    Empty(String),
}

pub fn compare(dir: &SweepDir) -> Result<SweepReport, ReportError> {
    let records = dir.finished()?;
    if records.is_empty() {
        return Err(ReportError::Empty(dir.root.display().to_string()));
    }
    let mut figures = Vec::new();
    for info in records {
        let key = RunKey {
            run_id: info.run_id.clone(),
            model: info.model.clone(),
            domain: info.params.domain.clone(),
            mem_limit_bytes: info.params.mem_limit_bytes,
            repeat: info.params.repeat,
        };
        if let Some(error) = info.error {
            figures.push(RunFigures::failed(key, error));
            continue;
        }
        let trace = dir.root.join(&info.trace);
        let traced = || -> Result<_, crate::format::TraceError> {
            let analysis = analyze::analyze(TraceReader::open(&trace)?)?;
            let stats = analyze::stats::collect(&trace, &analysis, &ProgressBar::hidden())?;
            Ok(RunFigures::of(key, &info.trace, &analysis, &stats))
        };
        figures.push(traced().map_err(|source| ReportError::Trace { path: trace.display().to_string(), source })?);
    }
    Ok(analyze::sweep::compare(&figures))
}
