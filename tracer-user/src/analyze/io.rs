//! I/O correlation: page faults, page-cache fills and block requests tied to
//! model files, tensors, ubatches and phases.
//!
//! A fault's model-file page comes from the maps snapshot taken while
//! recording, or, when the mapping was already gone (a short-lived target),
//! from the `mm_filemap_fault` event the same thread raised next, which
//! names the file and page itself.
//!
//! Major or minor is decided by correlation, not by the kernel's flag: a
//! fault on a model-file page is **major** when the same thread added that
//! very page to the page cache (read it from disk) before its next fault or
//! op, i.e. the fault had to wait for I/O; otherwise the page was already
//! cached (an earlier fault's readahead, the load-time prefetch) and the
//! fault is **minor**. Block requests are turned into file byte ranges
//! through the files' FIEMAP extents (tracepoint sectors are whole-disk
//! sectors; extents are partition-relative, so the partition start is added),
//! then into tensors through the model table.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tracer_common::{BlockKind, PAGE_SIZE as PAGE, PageCacheKind};

use crate::format::{Block, Fault, ModelTable, PageCache};

/// Where in the run an I/O event happened.
/// Serialised (and shown) as `load`, `ubatch K` or `between`, so it can key
/// a JSON object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum When {
    /// Before the first ubatch graph: model loading (llama.cpp's prefetch).
    Load,
    /// Inside ubatch graph `k` (index into `Analysis::ubatches`).
    Ubatch(u32),
    /// Between graphs (sampling, tokenizing, after the last graph).
    Between,
}

impl Serialize for When {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for When {
    /// As serialised: `load`, `ubatch K` or `between` (the view's index
    /// keeps an analysis).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<When, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        match &*text {
            "load" => Ok(When::Load),
            "between" => Ok(When::Between),
            other => other
                .strip_prefix("ubatch ")
                .and_then(|k| k.parse().ok())
                .map(When::Ubatch)
                .ok_or_else(|| serde::de::Error::custom(format!("not a time of the run: {other:?}"))),
        }
    }
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Load => f.write_str("load"),
            When::Ubatch(u) => write!(f, "ubatch {u}"),
            When::Between => f.write_str("between"),
        }
    }
}

/// A byte range of one model tensor read by one block request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorBytes {
    pub model: u32,
    pub tensor: u32,
    pub file_offset: u64,
    pub bytes: u64,
}

impl TensorBytes {
    /// What names a block request split into `hits` (see
    /// [`IoCorrelator::tensors_of`]): the first tensor it read, else its
    /// first range (the header, padding); and the file offset it starts at.
    pub fn naming(hits: &[TensorBytes]) -> Option<(&TensorBytes, u64)> {
        let first = hits.first()?;
        Some((hits.iter().find(|h| h.tensor != u32::MAX).unwrap_or(first), first.file_offset))
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FaultCounts {
    pub total: u64,
    /// Faults on a model file's pages.
    pub model_file: u64,
    pub major: u64,
    pub minor: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DiskTotals {
    /// Read requests overlapping a model file (issued; a requeued request
    /// issued again counts once).
    pub requests: u64,
    /// Issue events and their model-file bytes, re-issues included: what
    /// blktrace counts as `D` records.
    pub issues: u64,
    pub issue_bytes: u64,
    /// Bytes of those requests inside model files.
    pub bytes: u64,
    /// Of `requests`, those whose completion was never recorded: the kernel
    /// did not run the completion program (perf-event flavour: while another
    /// BPF program ran on that CPU, counted in `recursion_misses`; either
    /// flavour: on a VM that hides its agent process from BPF, completions
    /// interrupting that process, uncounted), or the request was still in
    /// flight when tracing stopped.
    pub uncompleted: u64,
    /// Issue→complete latencies in microseconds: p50, p90, p99, max.
    pub latency_us: [u64; 4],
    #[serde(skip)]
    latencies_ns: Vec<u64>,
}

impl DiskTotals {
    fn add(&mut self, bytes: u64) {
        self.requests += 1;
        self.bytes += bytes;
    }

    fn finish(&mut self) {
        let v = &mut self.latencies_ns;
        v.sort_unstable();
        if !v.is_empty() {
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] / 1000;
            self.latency_us = [at(0.5), at(0.9), at(0.99), v[v.len() - 1] / 1000];
        }
    }
}

/// Per tensor: how often and how much of it came from disk.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TensorIo {
    pub model: u32,
    pub tensor: u32,
    pub bytes_read: u64,
    pub times_read: u64,
    pub first_read: Option<When>,
    pub last_read: Option<When>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IoAnalysis {
    pub faults: FaultCounts,
    /// Every model-file fault, classified (at most `MAX_FAULT_PAGES`).
    pub fault_pages: Vec<FaultPage>,
    pub fault_pages_truncated: bool,
    pub page_cache_adds: u64,
    pub page_cache_bytes: u64,
    pub disk: DiskTotals,
    /// Disk totals and faults by when they happened.
    pub by_when: BTreeMap<When, WhenIo>,
    /// Per ubatch: disk bytes by layer (`None` = outside any layer).
    pub ubatch_layer_bytes: BTreeMap<u32, BTreeMap<String, u64>>,
    pub tensors: Vec<TensorIo>,
    /// Disk bytes per (ubatch, model, tensor), sorted; `tensor: null` holds
    /// a ubatch's bytes between tensors (header, padding), so a ubatch's
    /// entries sum to its `by_when` disk bytes. At most
    /// `MAX_UBATCH_TENSORS` entries (`ubatch_tensor_bytes_truncated`).
    pub ubatch_tensor_bytes: Vec<UbatchTensorBytes>,
    pub ubatch_tensor_bytes_truncated: bool,
}

/// Model-file bytes of one tensor read from disk during one ubatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UbatchTensorBytes {
    pub ubatch: u32,
    pub model: u32,
    pub tensor: Option<u32>,
    pub bytes: u64,
}

const MAX_UBATCH_TENSORS: usize = 2_000_000;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WhenIo {
    pub disk: DiskTotals,
    pub faults_major: u64,
    pub faults_minor: u64,
}

/// A model-file fault, as classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPage {
    pub ts_ns: u64,
    pub tid: u32,
    pub model: u32,
    pub file: u32,
    pub file_offset: u64,
    pub major: bool,
    pub when: When,
}

const MAX_FAULT_PAGES: usize = 1 << 20;

/// A fault waiting to be classified: did its thread fill its page? Its file
/// position is unknown until a filemap fault names it when the maps did not.
struct OpenFault {
    ts_ns: u64,
    address: u64,
    pos: Option<(u32, u32, u64)>,
    when: When,
    major: bool,
}

/// `(model, file)`.
type FileId = (u32, u32);
/// A file's disk: its whole-disk dev, and `(disk_start, disk_end, file_offset)`
/// ranges sorted, in whole-disk bytes.
type DiskRanges = (Option<u32>, Vec<(u64, u64, u64)>);

#[derive(Default)]
pub struct IoCorrelator {
    models: Vec<ModelTable>,
    extents: HashMap<FileId, DiskRanges>,
    /// Per model file: tensors `(file_offset, end, index)` sorted.
    spans: HashMap<FileId, Vec<(u64, u64, u32)>>,
    /// Asked on every op (`close`): a fast hash.
    open: foldhash::HashMap<u32, OpenFault>,
    pending: HashMap<(u32, u64), (u64, When)>,
    tensors: BTreeMap<(u32, u32), TensorIo>,
    /// (ubatch, model, tensor) → disk bytes (`u32::MAX`: between tensors).
    ubatch_tensors: BTreeMap<(u32, u32, u32), u64>,
    out: IoAnalysis,
}

impl IoCorrelator {
    /// Model-file bytes of the read requests so far (`DiskTotals::bytes`).
    pub fn disk_bytes(&self) -> u64 {
        self.out.disk.bytes
    }

    pub fn on_model(&mut self, index: u32, table: &ModelTable) {
        for (file, info) in table.file_info.iter().enumerate() {
            // Saturating: these come from the trace file, which may be corrupt.
            let base = info.partition_start_sector.saturating_mul(512);
            let mut ranges: Vec<(u64, u64, u64)> = info
                .extents
                .iter()
                .map(|e| {
                    (
                        base.saturating_add(e.physical),
                        base.saturating_add(e.physical).saturating_add(e.length),
                        e.logical,
                    )
                })
                .collect();
            ranges.sort_unstable();
            self.extents.insert((index, file as u32), (info.disk_dev, ranges));
        }
        for (file, spans) in tensor_spans(table) {
            self.spans.insert((index, file), spans);
        }
        self.models.push(table.clone());
    }

    /// Ops end a thread's open fault: it did not wait for a fill.
    pub fn on_op(&mut self, tid: u32) {
        self.close(tid);
    }

    pub fn on_fault(&mut self, fault: &Fault, when: When) {
        self.close(fault.tid);
        self.out.faults.total += 1;
        let pos = fault.file.map(|p| (p.model, p.file, p.offset));
        let open = OpenFault { ts_ns: fault.ts_ns, address: fault.address, pos, when, major: false };
        self.open.insert(fault.tid, open);
    }

    pub fn on_page_cache(&mut self, event: &PageCache) {
        let Some(open) = self.open.get_mut(&event.tid) else {
            if event.kind == PageCacheKind::Add {
                self.count_fill(event);
            }
            return;
        };
        let Some((model, file)) = event.file else { return };
        if event.kind == PageCacheKind::FilemapFault {
            // The fault's own filemap fault: file and page straight from the kernel.
            if open.pos.is_none() {
                open.pos = Some((model, file, event.index * PAGE + (open.address & (PAGE - 1))));
            }
            return;
        }
        let pages = 1u64 << event.order.min(20);
        if let Some((m, f, offset)) = open.pos
            && (m, f) == (model, file)
            && (event.index..event.index + pages).contains(&(offset / PAGE))
        {
            open.major = true;
        }
        self.count_fill(event);
    }

    fn count_fill(&mut self, event: &PageCache) {
        self.out.page_cache_adds += 1;
        self.out.page_cache_bytes += (1u64 << event.order.min(20)) * PAGE;
    }

    /// A block request: its model-file bytes and tensors (issues only;
    /// completions close the latency).
    pub fn on_block(&mut self, event: &Block, when: When) -> Vec<TensorBytes> {
        let key = (event.dev, event.sector);
        if event.kind == BlockKind::Complete {
            if let Some((issued, when)) = self.pending.remove(&key) {
                let latency = event.ts_ns.saturating_sub(issued);
                self.out.disk.latencies_ns.push(latency);
                self.when(when).disk.latencies_ns.push(latency);
            }
            return Vec::new();
        }
        let hits = self.tensors_of(event.dev, event.sector, event.nr_sector);
        let bytes: u64 = hits.iter().map(|h| h.bytes).sum();
        if bytes == 0 || !event.rwbs.contains('R') {
            return hits;
        }
        self.out.disk.issues += 1;
        self.out.disk.issue_bytes += bytes;
        let w = self.when(when);
        w.disk.issues += 1;
        w.disk.issue_bytes += bytes;
        // A requeued request is issued again: its bytes were read once.
        if self.pending.contains_key(&key) {
            return hits;
        }
        self.pending.insert(key, (event.ts_ns, when));
        self.out.disk.add(bytes);
        self.when(when).disk.add(bytes);
        for h in &hits {
            let table_entry = self.models.get(h.model as usize).and_then(|m| m.tensors.get(h.tensor as usize));
            if let When::Ubatch(u) = when {
                let layer = table_entry.and_then(|t| t.layer).map_or_else(|| "none".to_string(), |l| l.to_string());
                *self.out.ubatch_layer_bytes.entry(u).or_default().entry(layer).or_default() += h.bytes;
                let key = (u, h.model, if table_entry.is_some() { h.tensor } else { u32::MAX });
                if let Some(b) = self.ubatch_tensors.get_mut(&key) {
                    *b += h.bytes;
                } else if self.ubatch_tensors.len() < MAX_UBATCH_TENSORS {
                    self.ubatch_tensors.insert(key, h.bytes);
                } else {
                    self.out.ubatch_tensor_bytes_truncated = true;
                }
            }
            // Bytes between tensors (header, padding) have no tensor to credit.
            if table_entry.is_none() {
                continue;
            }
            let t = self.tensors.entry((h.model, h.tensor)).or_insert_with(|| TensorIo {
                model: h.model,
                tensor: h.tensor,
                ..Default::default()
            });
            t.bytes_read += h.bytes;
            t.times_read += 1;
            t.first_read.get_or_insert(when);
            t.last_read = Some(when);
        }
        hits
    }

    /// Model-file bytes a request covers, split by tensor (bytes between
    /// tensors, e.g. the header, count under tensor `u32::MAX`).
    pub fn tensors_of(&self, dev: u32, sector: u64, nr_sector: u32) -> Vec<TensorBytes> {
        let mut out = Vec::new();
        for (model, file, from, to) in self.file_ranges(dev, sector, nr_sector) {
            self.split_by_tensor(model, file, from, to, &mut out);
        }
        out
    }

    /// Model-file byte ranges a request covers: `(model, file, from, to)`.
    pub fn file_ranges(&self, dev: u32, sector: u64, nr_sector: u32) -> Vec<(u32, u32, u64, u64)> {
        // Flushes carry sector u64::MAX: saturate rather than wrap.
        let start = sector.saturating_mul(512);
        let end = sector.saturating_add(u64::from(nr_sector)).saturating_mul(512);
        let mut out = Vec::new();
        for (&(model, file), (disk, ranges)) in &self.extents {
            if *disk != Some(dev) {
                continue;
            }
            let first = ranges.partition_point(|&(_, e, _)| e <= start);
            for &(s, e, logical) in ranges[first..].iter().take_while(|&&(s, _, _)| s < end) {
                out.push((model, file, logical + start.max(s) - s, logical + end.min(e) - s));
            }
        }
        out
    }

    fn split_by_tensor(&self, model: u32, file: u32, from: u64, to: u64, out: &mut Vec<TensorBytes>) {
        let spans = self.spans.get(&(model, file)).map_or(&[][..], Vec::as_slice);
        split_by_tensor(spans, model, from, to, out);
    }

    fn close(&mut self, tid: u32) {
        if let Some(open) = self.open.remove(&tid) {
            // Faults outside the model files (heap, stack, libraries) are only counted.
            let Some((model, file, file_offset)) = open.pos else { return };
            self.out.faults.model_file += 1;
            if self.out.fault_pages.len() < MAX_FAULT_PAGES {
                let page =
                    FaultPage { ts_ns: open.ts_ns, tid, model, file, file_offset, major: open.major, when: open.when };
                self.out.fault_pages.push(page);
            } else {
                self.out.fault_pages_truncated = true;
            }
            let w = self.when(open.when);
            if open.major {
                w.faults_major += 1;
                self.out.faults.major += 1;
            } else {
                w.faults_minor += 1;
                self.out.faults.minor += 1;
            }
        }
    }

    fn when(&mut self, when: When) -> &mut WhenIo {
        self.out.by_when.entry(when).or_default()
    }

    pub fn finish(mut self) -> IoAnalysis {
        let tids: Vec<u32> = self.open.keys().copied().collect();
        tids.into_iter().for_each(|t| self.close(t));
        let pending: Vec<When> = self.pending.values().map(|&(_, when)| when).collect();
        self.out.disk.uncompleted = pending.len() as u64;
        pending.into_iter().for_each(|when| self.when(when).disk.uncompleted += 1);
        self.out.disk.finish();
        self.out.by_when.values_mut().for_each(|w| w.disk.finish());
        self.out.tensors = self.tensors.into_values().collect();
        self.out.ubatch_tensor_bytes = self
            .ubatch_tensors
            .into_iter()
            .map(|((ubatch, model, tensor), bytes)| UbatchTensorBytes {
                ubatch,
                model,
                tensor: (tensor != u32::MAX).then_some(tensor),
                bytes,
            })
            .collect();
        self.out
    }
}

/// Per file of `table`, its tensors' `(start, end, index)` byte spans,
/// sorted: what [`split_by_tensor`] splits by.
pub(crate) fn tensor_spans(table: &ModelTable) -> HashMap<u32, Vec<(u64, u64, u32)>> {
    let mut spans: HashMap<u32, Vec<(u64, u64, u32)>> = HashMap::new();
    for (i, t) in table.tensors.iter().enumerate() {
        spans.entry(t.file).or_default().push((t.file_offset, t.file_offset + t.size_bytes, i as u32));
    }
    spans.values_mut().for_each(|v| v.sort_unstable());
    spans
}

/// Bytes `[from, to)` of a model file split by the tensors of `spans`
/// ([`tensor_spans`]), byte-exact; bytes between tensors (the header,
/// padding) count under tensor `u32::MAX`. How block reads are charged to
/// tensors, and `ttrace simulate --detail` its predicted reads.
pub(crate) fn split_by_tensor(spans: &[(u64, u64, u32)], model: u32, from: u64, to: u64, out: &mut Vec<TensorBytes>) {
    let mut at = from;
    let mut i = spans.partition_point(|&(_, e, _)| e <= from);
    while at < to {
        match spans.get(i) {
            Some(&(s, e, tensor)) if s <= at => {
                let upto = e.min(to);
                out.push(TensorBytes { model, tensor, file_offset: at, bytes: upto - at });
                at = upto;
                i += 1;
            }
            next => {
                let upto = next.map_or(to, |&(s, _, _)| s.min(to));
                out.push(TensorBytes { model, tensor: u32::MAX, file_offset: at, bytes: upto - at });
                at = upto;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::BlockKind::{Complete as COMPLETE, Issue as ISSUE};

    use super::*;
    use crate::format::fixtures::{self, one_tensor_model};

    fn correlator() -> IoCorrelator {
        let mut io = IoCorrelator::default();
        io.on_model(0, &one_tensor_model());
        io
    }

    fn block(kind: BlockKind, file_offset: u64, ts_ns: u64) -> Block {
        fixtures::block(kind, 1, file_offset, ts_ns)
    }

    #[test]
    fn reads_without_a_recorded_completion_are_counted_where_they_were_issued() {
        let mut io = correlator();
        // Completed; requeued (issued twice) then completed; never completed.
        io.on_block(&block(ISSUE, 0, 10), When::Load);
        io.on_block(&block(COMPLETE, 0, 20), When::Load);
        io.on_block(&block(ISSUE, 4096, 30), When::Ubatch(0));
        io.on_block(&block(ISSUE, 4096, 35), When::Ubatch(0));
        io.on_block(&block(COMPLETE, 4096, 40), When::Ubatch(0));
        io.on_block(&block(ISSUE, 8192, 50), When::Ubatch(0));
        io.on_block(&block(ISSUE, 8192, 55), When::Ubatch(0));
        let out = io.finish();
        assert_eq!((out.disk.requests, out.disk.issues, out.disk.uncompleted), (3, 5, 1));
        assert_eq!(out.by_when[&When::Load].disk.uncompleted, 0);
        assert_eq!(out.by_when[&When::Ubatch(0)].disk.uncompleted, 1);
        assert_eq!(serde_json::to_value(&out.by_when).unwrap()["ubatch 0"]["disk"]["uncompleted"], 1);
        assert_eq!(out.ubatch_layer_bytes[&0]["0"], 2 * 4096);
    }
}
