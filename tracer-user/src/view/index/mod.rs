//! What `view` precomputes at load, so every query of docs/VIEW_API.md
//! answers from memory: one pass of `analyze::analyze`, then one
//! `analyze::walk` whose events [`build`] files into columns. The report
//! document (`summary`) is built by `ttrace report --json`'s own code in a
//! second thread, so the server is ready before it. The columns are saved
//! to an index file ([`disk`]) once built, and a later open of the same
//! trace maps them from there instead of walking the trace again.

pub mod buffer;
pub mod build;
pub mod column;
pub mod disk;
pub mod graph;
pub mod lod;
pub mod memmap;
pub mod moe;
pub mod ops;
pub mod pyramid;
pub mod rows;
pub mod timeline;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex},
};

use crate::{
    analyze::{self, Analysis, Phase, walk},
    format::{ModelTable, TraceError, TraceReader},
};

/// A model tensor as the views address it (`tensor` id = index here).
#[derive(Clone, Debug)]
pub struct TensorRow {
    pub model: u32,
    /// Index in its model's table.
    pub index: u32,
    pub file: u32,
    /// Row on the disk track: its file's start there + its file offset.
    pub y0: u64,
    pub size: u64,
    pub layer: Option<u32>,
    pub name: String,
    pub component: String,
    pub type_name: String,
    pub shape: Vec<u64>,
    pub expert_bytes: Option<u64>,
}

impl TensorRow {
    pub fn n_experts(&self) -> Option<u32> {
        self.expert_bytes.filter(|&b| b > 0).map(|b| (self.size / b) as u32)
    }
}

/// The model tensors of every model, and the disk track's layout: the
/// model files end to end, in model then file order.
#[derive(Default)]
pub struct Tensors {
    pub rows: Vec<TensorRow>,
    /// Tensor ids by `y0`.
    by_y: Vec<u32>,
    first_of_model: Vec<u32>,
    /// Per model, per file: where the file starts on the disk track.
    pub file_y0: Vec<Vec<u64>>,
    pub disk_size: u64,
}

impl Tensors {
    pub fn new(models: &[ModelTable]) -> Tensors {
        let mut t = Tensors::default();
        let mut y = 0u64;
        for m in models {
            let mut starts = Vec::new();
            for f in 0..m.files.len() {
                starts.push(y);
                // Files of old traces carry no size: the end of their last tensor.
                let end = m.tensors.iter().filter(|x| x.file as usize == f).map(|x| x.file_offset + x.size_bytes).max();
                y += m.file_info.get(f).map(|i| i.size).filter(|&s| s > 0).or(end).unwrap_or(0);
            }
            t.file_y0.push(starts);
        }
        t.disk_size = y;
        for (mi, m) in models.iter().enumerate() {
            t.first_of_model.push(t.rows.len() as u32);
            for (i, x) in m.tensors.iter().enumerate() {
                let base = t.file_y0[mi].get(x.file as usize).copied().unwrap_or(0);
                t.rows.push(TensorRow {
                    model: mi as u32,
                    index: i as u32,
                    file: x.file,
                    y0: base + x.file_offset,
                    size: x.size_bytes,
                    layer: x.layer,
                    name: x.name.clone(),
                    component: x.component.clone(),
                    type_name: x.type_name.clone(),
                    shape: x.shape.clone(),
                    expert_bytes: x.expert_bytes,
                });
            }
        }
        t.by_y = (0..t.rows.len() as u32).collect();
        t.by_y.sort_by_key(|&i| t.rows[i as usize].y0);
        t
    }

    /// The id of model `model`'s tensor `tensor`.
    pub fn id(&self, model: u32, tensor: u32) -> Option<u32> {
        let id = self.first_of_model.get(model as usize)? + tensor;
        (self.rows.get(id as usize)?.model == model).then_some(id)
    }

    /// Disk-track row of byte `offset` of file `file` of model `model`.
    pub fn y_of(&self, model: u32, file: u32, offset: u64) -> Option<u64> {
        Some(self.file_y0.get(model as usize)?.get(file as usize)? + offset)
    }

    /// Tensors overlapping `[y0, y1)` on the disk track, by position.
    pub fn overlapping(&self, y0: u64, y1: u64) -> impl Iterator<Item = u32> + '_ {
        // Tensors do not overlap one another, so those starting before y0
        // can reach into the range only from the one just before.
        let first = self.by_y.partition_point(|&i| self.rows[i as usize].y0 < y0).saturating_sub(1);
        self.by_y[first..]
            .iter()
            .copied()
            .take_while(move |&i| self.rows[i as usize].y0 < y1)
            .filter(move |&i| self.rows[i as usize].y0 + self.rows[i as usize].size > y0)
    }
}

/// The report document and its stats, built in the background: `None`
/// while they are.
type Report = Option<Result<Reported, String>>;

#[derive(Clone)]
pub struct Reported {
    /// `ttrace report --json`'s document, gzipped.
    pub document_gz: Arc<Vec<u8>>,
    pub stats: Arc<analyze::stats::Stats>,
}

/// One trace, indexed.
pub struct Index {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub index_file: IndexFile,
    pub analysis: Arc<Analysis>,
    pub tensors: Tensors,
    pub tokens: Tokens,
    pub ops: ops::Ops,
    pub memmap: memmap::MemoryMap,
    pub timeline: timeline::Timeline,
    report: Arc<(Mutex<Report>, Condvar)>,
    /// Recent grid answers.
    pub cache: crate::view::cache::Cache,
    /// `/api/v1/ubatches`'s answer, once asked for.
    pub ubatches_frame: std::sync::OnceLock<Vec<u8>>,
    /// `/api/v1/meta`'s answer, once asked for.
    pub meta: std::sync::OnceLock<Vec<u8>>,
    /// What the op table filters by and shows, per ubatch: built once, not
    /// per request (20 ms a request on 176 k ubatches).
    per_ubatch: std::sync::OnceLock<PerUbatch>,
    /// `/api/v1/simulate`'s answer (JSON), or why there is none, computed
    /// in the background from the first request on.
    pub simulated: Arc<crate::view::background::Background>,
}

/// Per ubatch: its tokens' sequence ids, and its generated token's number
/// (`None`: it generated none). Phases are the memory map's
/// ([`memmap::MemoryMap::phase_of`]).
pub struct PerUbatch {
    pub seqs: Vec<Vec<i32>>,
    pub token_of: Vec<Option<u32>>,
}

/// Every token of every ubatch, in ubatch then row order.
#[derive(Default)]
pub struct Tokens {
    pub ubatch: Vec<u32>,
    pub row: Vec<u32>,
    pub token_id: Vec<i32>,
    pub seq: Vec<i32>,
    pub pos: Vec<i32>,
    /// 1 generated, 0 prompt, 255 unknown.
    pub generated: Vec<u8>,
    /// Per ubatch: its first token.
    pub first_of_ubatch: Vec<u32>,
}

impl Tokens {
    fn new(a: &Analysis) -> Tokens {
        let mut t = Tokens::default();
        for u in &a.ubatches {
            t.first_of_ubatch.push(t.ubatch.len() as u32);
            for (row, &id) in u.token_ids.iter().enumerate() {
                let info = u.tokens.get(row);
                t.ubatch.push(u.index);
                t.row.push(row as u32);
                t.token_id.push(id);
                t.seq.push(info.map_or(-1, |i| i.seq));
                t.pos.push(info.and_then(|i| i.pos).unwrap_or(-1));
                t.generated.push(match info.map(|i| i.kind) {
                    Some(analyze::sequences::TokenKind::Generated) => 1,
                    Some(analyze::sequences::TokenKind::Prompt) => 0,
                    _ => 255,
                });
            }
        }
        t
    }

    pub fn len(&self) -> usize {
        self.ubatch.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ubatch.is_empty()
    }
}

/// `phase` as docs/VIEW_API.md numbers it.
pub fn phase_code(p: Phase) -> u8 {
    match p {
        Phase::Warmup => 0,
        Phase::Prompt => 1,
        Phase::Generate => 2,
        Phase::Aux => 3,
    }
}

/// The phase of a docs/VIEW_API.md `phase` code.
pub fn index_phase(code: u8) -> Phase {
    match code {
        0 => Phase::Warmup,
        1 => Phase::Prompt,
        2 => Phase::Generate,
        _ => Phase::Aux,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// What the index file holds, in this order (saved from references).
type Saved = (ops::Ops, memmap::MemoryMap, timeline::Timeline, disk::analysis::SavedAnalysis);

/// Where the index of this trace comes from, or is to go.
pub enum IndexFile {
    /// Mapped from this file.
    Reused(PathBuf),
    /// Built now: to be saved for this state of the trace (`None`: its
    /// state could not be read, so nothing is saved).
    Built(Option<disk::Identity>),
}

impl Index {
    /// Reads and indexes `path`. A file still being written (or cut short)
    /// is read up to its last complete frame; a malformed one is an error.
    pub fn load(path: &Path) -> Result<Index, LoadError> {
        // Before the trace is read: a trace still being written is then
        // longer than its index says, and the index is not reused for it.
        let identity = disk::Identity::of(path);
        // Its size (a ring's members' bytes, `--max-size`), or why it has
        // none: a trace that cannot be read is one error, not a warning too.
        let file_bytes = match &identity {
            Ok(id) => id.size,
            Err(e) => {
                let bytes = crate::format::ring::trace_bytes(path)
                    .map_err(|error| TraceError::Open { path: path.display().to_string(), error })?;
                log::warn!("no index for {}: {e}", path.display());
                bytes
            }
        };
        let identity = identity.ok();
        let started = std::time::Instant::now();
        // A saved index holds the analysis too: the trace is then not read
        // before the first answer (only by the report's pass, after it).
        let (analysis, tensors, ops, memmap, timeline, index_file) =
            match identity.as_ref().and_then(|id| reuse(path, id)) {
                Some(((ops, memmap, timeline, analysis), file)) => {
                    log::info!("index mapped in {:.2?}, RSS {} MiB", started.elapsed(), rss_mib());
                    let tensors = Tensors::new(&analysis.models);
                    (Arc::new(analysis), tensors, ops, memmap, timeline, IndexFile::Reused(file))
                }
                None => {
                    let analysis = Arc::new(analyze::analyze(TraceReader::open(path)?)?);
                    let analysed = started.elapsed();
                    log::info!("analysed in {analysed:.2?} (CPU {:.2} s), RSS {} MiB", cpu_s(), rss_mib());
                    let tensors = Tensors::new(&analysis.models);
                    let built = Self::build(path, &analysis, &tensors, (started, analysed))?;
                    (analysis, tensors, built.ops, built.memmap, built.timeline, IndexFile::Built(identity))
                }
            };
        let tokens = Tokens::new(&analysis);
        // The report's own pass starts now, not beside the index's: on a
        // small machine that would only slow both.
        let report = Arc::new((Mutex::new(None), Condvar::new()));
        spawn_report(path, &analysis, &report);
        Ok(Index {
            path: path.to_path_buf(),
            file_bytes,
            index_file,
            tensors,
            tokens,
            ops,
            memmap,
            timeline,
            analysis,
            report,
            meta: std::sync::OnceLock::new(),
            per_ubatch: std::sync::OnceLock::new(),
            simulated: Arc::default(),
            ubatches_frame: std::sync::OnceLock::new(),
            cache: Default::default(),
        })
    }

    /// Walks the trace into the columns.
    fn build(
        path: &Path,
        analysis: &Analysis,
        tensors: &Tensors,
        (started, analysed): (std::time::Instant, std::time::Duration),
    ) -> Result<build::Built, LoadError> {
        let walk_started = std::time::Instant::now();
        let mut builder = build::Builder::new(analysis, tensors);
        walk::walk(path, analysis, &indicatif::ProgressBar::hidden(), &mut builder)?;
        let walk = walk_started.elapsed();
        log::info!("walked in {walk:.2?} (CPU so far {:.2} s), RSS {} MiB", cpu_s(), rss_mib());
        let built = builder.finish(analysis, tensors);
        give_back_memory();
        log::info!(
            "indexed in {:.2?} (analysis {analysed:.2?}, walk {walk:.2?}, CPU {:.2} s), RSS {} MiB: {} ops, {} \
             signatures, {} combinations, {} reads, {} buffer segments, {} + {} pyramid entries",
            started.elapsed(),
            cpu_s(),
            rss_mib(),
            built.ops.len(),
            built.ops.sigs.len(),
            built.ops.combos.len(),
            built.memmap.reads(),
            built.memmap.buffer.segments.len(),
            built.memmap.pyramid_entries().0,
            built.memmap.pyramid_entries().1,
        );
        Ok(built)
    }

    /// Saves what was built to the index file, beside the trace or else in
    /// the cache, and says where (or why not) on stderr. Nothing to do for
    /// an index that was reused.
    pub fn save(&self) {
        let IndexFile::Built(Some(identity)) = &self.index_file else { return };
        let started = std::time::Instant::now();
        let analysis = match disk::analysis::SavedAnalysis::of(&self.analysis) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("ttrace: the index could not be saved ({e}): the next view indexes again");
                return;
            }
        };
        let saved = (&self.ops, &self.memmap, &self.timeline, &analysis);
        let mut failures = Vec::new();
        for place in disk::places(&self.path) {
            match disk::write(&place, identity, &saved) {
                Ok(()) => {
                    let mb = std::fs::metadata(&place).map_or(0, |m| m.len() >> 20);
                    eprintln!(
                        "ttrace: index saved to {} ({mb} MB, {:.1} s): the next view of this trace maps it",
                        place.display(),
                        started.elapsed().as_secs_f64()
                    );
                    return;
                }
                Err(e) => failures.push(format!("{}: {e}", place.display())),
            }
        }
        eprintln!("ttrace: the index could not be saved ({}): the next view indexes again", failures.join("; "));
    }

    /// The `ttrace report --json` document, waiting for it if need be.
    pub fn report(&self) -> Result<Reported, String> {
        let (lock, ready) = &*self.report;
        let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(done) = state.as_ref() {
                return done.clone();
            }
            state = ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether [`Self::report`] would answer at once.
    pub fn report_ready(&self) -> bool {
        self.report.0.lock().map(|s| s.is_some()).unwrap_or(true)
    }

    pub fn per_ubatch(&self) -> &PerUbatch {
        self.per_ubatch.get_or_init(|| {
            let ubatches = &self.analysis.ubatches;
            PerUbatch {
                seqs: ubatches.iter().map(|u| u.tokens.iter().map(|t| t.seq).collect()).collect(),
                token_of: analyze::walk::token_indices(&self.analysis),
            }
        })
    }

    pub fn phase_of(&self, ubatch: u32) -> Option<Phase> {
        self.analysis.ubatches.get(ubatch as usize).map(|u| u.phase)
    }

    /// Start of ubatch `u` relative to the trace's start (its end for `end`).
    pub fn ubatch_span(&self, u: u32) -> (u64, u64) {
        let base = self.analysis.header.start_monotonic_ns;
        let ub = &self.analysis.ubatches[u as usize];
        let start = ub.start_ns.saturating_sub(base);
        (start, ub.end_ns.map_or(start, |e| e.saturating_sub(base)).max(start))
    }
}

/// The saved index of `trace` as it is now, from the first place holding
/// one; says on stderr which was used, and why any other was not.
fn reuse(
    trace: &Path,
    identity: &disk::Identity,
) -> Option<((ops::Ops, memmap::MemoryMap, timeline::Timeline, Analysis), PathBuf)> {
    for place in disk::places(trace) {
        if !place.exists() {
            continue;
        }
        let opened = disk::open::<Saved>(&place, identity).map_err(|e| e.to_string()).and_then(
            |(ops, memmap, timeline, saved)| {
                let decoding = std::time::Instant::now();
                let analysis = saved.analysis().map_err(|e| e.to_string())?;
                log::info!("analysis decoded in {:.2?}", decoding.elapsed());
                Ok((ops, memmap, timeline, analysis))
            },
        );
        match opened {
            Ok(saved) => {
                eprintln!("ttrace: index {} reused", place.display());
                return Some((saved, place));
            }
            Err(e) => eprintln!("ttrace: index {} not used: {e}; indexing the trace again", place.display()),
        }
    }
    None
}

/// Returns the freed heap of the passes to the system (glibc keeps it
/// otherwise, in every thread's arena). musl (the static release build) has
/// no malloc_trim: its allocator unmaps large freed chunks by itself.
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    let _ = unsafe { libc::malloc_trim(0) };
}

/// CPU time of this thread, for the load's log lines.
fn cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Resident memory, for the load's log lines.
fn rss_mib() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    (pages * 4096) >> 20
}

/// `ttrace report --json`'s document, from the same code, in another thread
/// that yields to queries: at normal priority its pass (half a minute on
/// 100 M ops) took a CPU from the first queries after a reopen (the time ×
/// offset grid's p95 136 ms, against 79 ms once it was done).
fn spawn_report(path: &Path, analysis: &Arc<Analysis>, slot: &Arc<(Mutex<Report>, Condvar)>) {
    let (path, analysis, slot) = (path.to_path_buf(), analysis.clone(), slot.clone());
    std::thread::spawn(move || {
        crate::view::background::yield_to_queries();
        let started = std::time::Instant::now();
        let done = report_document(&path, &analysis).map_err(|e| e.to_string());
        give_back_memory();
        log::info!("report document built in {:.2?} (CPU {:.2} s), RSS {} MiB", started.elapsed(), cpu_s(), rss_mib());
        let (lock, ready) = &*slot;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
        ready.notify_all();
    });
}

fn report_document(path: &Path, a: &Analysis) -> Result<Reported, TraceError> {
    let stats = analyze::stats::collect(path, a, &indicatif::ProgressBar::hidden())?;
    let summary = analyze::summary::Summary::new(a, &path.display().to_string(), None);
    let doc = analyze::report::Document { analysis: a, summary: &summary, stats: &stats };
    // serde_json writes a few bytes at a time; gzip wants large blocks.
    let mut gz = std::io::BufWriter::with_capacity(
        1 << 20,
        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()),
    );
    serde_json::to_writer(&mut gz, &doc).expect("the report serialises into memory");
    let gz = gz.into_inner().map_err(|e| e.into_error()).expect("gzip into memory");
    let document_gz = Arc::new(gz.finish().expect("gzip into memory"));
    log::info!("report document: {} MB gzipped", document_gz.len() >> 20);
    Ok(Reported { document_gz, stats: Arc::new(stats) })
}
