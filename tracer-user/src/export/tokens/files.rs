//! Worker threads that encode and write a ubatch's two files while the walk
//! goes on reading the trace: the walk hands each ubatch over as a [`Job`]
//! (its entries refer to shared, already-encoded shape and graph bytes), so
//! the bulk of the output, entry by entry, is formatted off the reading
//! thread. A bounded channel keeps memory to a few ubatches.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, SyncSender, sync_channel},
    },
    thread,
};

use super::{
    FORMAT_VERSION, Stem,
    entry::{Entry, UbatchFields},
    ms,
};
use crate::export::{
    ExportError,
    json_bytes::{float, ints, n, num, string},
};

/// A ubatch's fields both of its files end with.
pub struct Header {
    pub phase: &'static str,
    pub token_ids: Vec<i32>,
    pub token_index: Option<u32>,
    pub ubatch: u32,
}

/// One ubatch's files.
pub struct Job {
    pub stem: Stem,
    pub header: Header,
    pub entries: Vec<Entry>,
    /// `ubatch_start_ns` and the graph's return.
    pub span: (u64, u64),
    /// The graph file without the ubatch's fields ([`super::graph::GraphCache`]).
    pub graph: Arc<[u8]>,
}

pub struct Writers {
    jobs: SyncSender<Job>,
}

impl Writers {
    /// Fails when the workers stopped, on an error [`scope`] returns.
    pub fn send(&self, job: Job) -> Result<(), ExportError> {
        self.jobs.send(job).map_err(|_| ExportError::Invalid("the tokens-json writers stopped".into()))
    }
}

/// Runs `walk` with writers for the export directory `dir`; returns once
/// every file is written. A write error is the result even when the walk
/// failed first for want of writers.
pub fn scope<R>(dir: &Path, walk: impl FnOnce(&Writers) -> Result<R, ExportError>) -> Result<R, ExportError> {
    // Two cores: the walk on one, the workers mostly on the other; more
    // workers than cores only where there are more.
    let workers = thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    thread::scope(|s| {
        let (jobs, queue) = sync_channel::<Job>(2 * workers);
        let queue = Arc::new(Mutex::new(queue));
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let queue = queue.clone();
                s.spawn(move || work(dir, &queue))
            })
            .collect();
        // The workers own the receiver now: if all stop, sending fails.
        drop(queue);
        let walked = walk(&Writers { jobs });
        let mut written = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| Err(ExportError::Invalid("a tokens-json writer panicked".into())));
            written = written.and(r);
        }
        match (walked, written) {
            (Ok(r), Ok(())) => Ok(r),
            (Ok(_), Err(e)) | (Err(ExportError::Invalid(_)), Err(e)) | (Err(e), _) => Err(e),
        }
    })
}

fn work(dir: &Path, queue: &Mutex<Receiver<Job>>) -> Result<(), ExportError> {
    let mut buf = Vec::new();
    loop {
        // The lock is held only while taking a job.
        let job = match queue.lock() {
            Ok(q) => q.recv(),
            Err(_) => return Err(ExportError::Invalid("a tokens-json writer panicked".into())),
        };
        let Ok(job) = job else { return Ok(()) };
        let name = format!("{}.json", job.stem);
        buf.clear();
        trace_file(&job, &mut buf);
        write(&dir.join("traces").join(&name), &buf)?;
        buf.clear();
        buf.extend_from_slice(&job.graph);
        job.header.write(&mut buf);
        write(&dir.join("graphs").join(&name), &buf)?;
    }
}

fn write(path: &PathBuf, bytes: &[u8]) -> Result<(), ExportError> {
    fs::write(path, bytes).map_err(ExportError::write(path))
}

/// `{"entries":[…],"metadata":{…}` and the header. Times count from the
/// first entry, as the UI's timeline does: at 0 it shows that entry's reads
/// (under graph capture, all of them).
fn trace_file(job: &Job, out: &mut Vec<u8>) {
    let (start_ns, end_ns) = job.span;
    let first_ns = job.entries.iter().map(|e| e.ts_ns).min().unwrap_or(start_ns);
    let fields = UbatchFields {
        phase: job.header.phase,
        token_id: job.header.token_ids.last().copied().unwrap_or(super::UNKNOWN_TOKEN),
        first_ns,
    };
    out.reserve(job.entries.len() * 1024);
    out.extend_from_slice(b"{\"entries\":[");
    for (i, e) in job.entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        e.write(i, &fields, out);
    }
    out.extend_from_slice(b"],\"metadata\":{\"duration_ms\":");
    float(out, ms(end_ns.saturating_sub(start_ns)));
    out.extend_from_slice(b",\"format_version\":");
    string(out, FORMAT_VERSION);
    out.extend_from_slice(b",\"timestamp_start_ns\":");
    num(out, first_ns);
    out.extend_from_slice(b",\"total_entries\":");
    num(out, job.entries.len());
    out.extend_from_slice(b",\"ubatch_start_ns\":");
    num(out, start_ns);
    out.push(b'}');
    job.header.write(out);
}

impl Header {
    /// `,"phase":…,"token_id":…,"token_ids":[…],"token_index":…,"ubatch":…}`:
    /// `token_id` is the last of `token_ids` (null when they were not captured).
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"phase\":");
        string(out, self.phase);
        out.extend_from_slice(b",\"token_id\":");
        n(out, self.token_ids.last().copied());
        out.extend_from_slice(b",\"token_ids\":");
        ints(out, &self.token_ids);
        out.extend_from_slice(b",\"token_index\":");
        n(out, self.token_index);
        out.extend_from_slice(b",\"ubatch\":");
        num(out, self.ubatch);
        out.push(b'}');
    }
}
