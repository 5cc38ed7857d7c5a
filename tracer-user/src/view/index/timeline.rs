//! The timeline (docs/VIEW_API.md "Timeline"): slice tracks per phase,
//! ubatch, sequence, layer and thread, and counters of faults and disk
//! reads, each answered at the level of detail asked for.

use std::{
    collections::BTreeMap,
    sync::{Mutex, OnceLock},
};

use serde::{Deserialize, Serialize};

use super::{
    disk::column::{Column, once},
    lod::{Pyramid, Slice},
    memmap::IoEvent,
    ops::Ops,
    phase_code,
};
use crate::analyze::Analysis;

/// A track, as its id in the API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TrackId {
    Phase,
    Ubatch,
    Seq(i32),
    Layer(u32),
    Ops(u32),
    Counter(Counter),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Counter {
    FaultsMajor,
    FaultsMinor,
    CacheFill,
    BlockRead,
}

impl Counter {
    pub const ALL: [Counter; 4] = [Counter::FaultsMajor, Counter::FaultsMinor, Counter::CacheFill, Counter::BlockRead];

    pub fn name(self) -> &'static str {
        match self {
            Counter::FaultsMajor => "faults_major",
            Counter::FaultsMinor => "faults_minor",
            Counter::CacheFill => "cache_fill",
            Counter::BlockRead => "block_read",
        }
    }
}

impl TrackId {
    pub fn parse(s: &str) -> Option<TrackId> {
        Some(match s.split_once(':') {
            None if s == "phase" => TrackId::Phase,
            None if s == "ubatch" => TrackId::Ubatch,
            Some(("seq", v)) => TrackId::Seq(v.parse().ok()?),
            Some(("layer", v)) => TrackId::Layer(v.parse().ok()?),
            Some(("ops", v)) => TrackId::Ops(v.parse().ok()?),
            Some(("counter", v)) => TrackId::Counter(Counter::ALL.into_iter().find(|c| c.name() == v)?),
            _ => return None,
        })
    }

    pub fn name(&self) -> String {
        match self {
            TrackId::Phase => "phase".into(),
            TrackId::Ubatch => "ubatch".into(),
            TrackId::Seq(s) => format!("seq:{s}"),
            TrackId::Layer(l) => format!("layer:{l}"),
            TrackId::Ops(t) => format!("ops:{t}"),
            TrackId::Counter(c) => format!("counter:{}", c.name()),
        }
    }
}

/// Events in time order with running sums, so a bucket's total is one
/// subtraction.
#[derive(Serialize, Deserialize)]
struct CounterTrack {
    t: Column<u64>,
    /// `prefix[i]`: the values of the first `i` events.
    prefix: Column<u64>,
}

#[derive(Serialize, Deserialize)]
pub struct Timeline {
    /// Phase, ubatch and sequence tracks.
    slices: BTreeMap<TrackId, Pyramid>,
    counters: BTreeMap<Counter, CounterTrack>,
    threads: BTreeMap<u32, ThreadTrack>,
    layer_ids: Vec<u32>,
    #[serde(with = "once")]
    layers: OnceLock<BTreeMap<u32, Pyramid>>,
}

/// A thread's timed op rows, until its track is built at first use
/// (millions of rows: not before the server is ready).
#[derive(Serialize, Deserialize)]
struct ThreadTrack {
    rows: Mutex<Column<u32>>,
    #[serde(with = "once")]
    built: OnceLock<Pyramid>,
}

/// An op row's slice on its thread's track.
pub fn op_slice(ops: &Ops, row: u32) -> Slice {
    let i = row as usize;
    let start = ops.start(i);
    Slice { start, end: start + ops.dur(i).map_or(0, u64::from), id: ops.seq(i), name: ops.sig_of(i).op, count: 1 }
}

impl Timeline {
    /// `timed`: the timed ops' `(row, thread)`, by row.
    /// `io`: faults major, minor, page-cache fills and block reads.
    pub fn new(a: &Analysis, ops: &Ops, timed: &[(u32, u32)], io: [&[IoEvent]; 4]) -> Timeline {
        let base = a.header.start_monotonic_ns;
        let span = |u: &crate::analyze::Ubatch| {
            let s = u.start_ns.saturating_sub(base);
            (s, u.end_ns.map_or(s, |e| e.saturating_sub(base)).max(s))
        };
        let mut slices = BTreeMap::new();
        let ubatches: Vec<Slice> = a
            .ubatches
            .iter()
            .map(|u| {
                let (start, end) = span(u);
                Slice { start, end, id: u64::from(u.index), name: u32::from(phase_code(u.phase)), count: 1 }
            })
            .collect();
        let mut phases: Vec<Slice> = Vec::new();
        for s in &ubatches {
            match phases.last_mut() {
                Some(p) if p.name == s.name => p.end = p.end.max(s.end),
                _ => phases.push(*s),
            }
        }
        let mut seqs: BTreeMap<i32, Vec<Slice>> = BTreeMap::new();
        for (u, s) in a.ubatches.iter().zip(&ubatches) {
            let mut ids: Vec<i32> = u.tokens.iter().map(|t| t.seq).collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                seqs.entry(id).or_default().push(*s);
            }
        }
        let mut threads: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &(row, tid) in timed {
            threads.entry(tid).or_default().push(row);
        }
        slices.insert(TrackId::Phase, Pyramid::new(phases));
        slices.insert(TrackId::Ubatch, Pyramid::new(ubatches));
        for (id, mut v) in seqs {
            v.sort_by_key(|s| s.start);
            slices.insert(TrackId::Seq(id), Pyramid::new(v));
        }
        let threads = threads
            .into_iter()
            .map(|(tid, rows)| (tid, ThreadTrack { rows: Mutex::new(rows.into()), built: OnceLock::new() }))
            .collect();
        let mut layer_ids: Vec<u32> =
            if !timed.is_empty() { ops.sigs.iter().filter_map(|s| s.layer).collect() } else { Vec::new() };
        layer_ids.sort_unstable();
        layer_ids.dedup();
        let mut counters = BTreeMap::new();
        for (c, events) in Counter::ALL.into_iter().zip(io) {
            let mut sorted: Vec<(u64, u64)> = events
                .iter()
                .map(|e| (e.t, if matches!(c, Counter::FaultsMajor | Counter::FaultsMinor) { 1 } else { e.len }))
                .collect();
            sorted.sort_unstable();
            let mut prefix = Vec::with_capacity(sorted.len() + 1);
            prefix.push(0u64);
            for &(_, v) in &sorted {
                prefix.push(prefix.last().copied().unwrap_or(0) + v);
            }
            let t: Vec<u64> = sorted.iter().map(|s| s.0).collect();
            counters.insert(c, CounterTrack { t: t.into(), prefix: prefix.into() });
        }
        Timeline { slices, counters, threads, layer_ids, layers: OnceLock::new() }
    }

    /// Builds the op and layer tracks now rather than at their first query.
    pub fn warm(&self, ops: &Ops) {
        self.layer_tracks(ops);
        for tid in self.threads.keys() {
            self.thread_track(*tid, ops);
        }
    }

    fn thread_track(&self, tid: u32, ops: &Ops) -> Option<&Pyramid> {
        let ThreadTrack { rows, built } = self.threads.get(&tid)?;
        Some(built.get_or_init(|| {
            let mut rows = std::mem::take(&mut *rows.lock().unwrap_or_else(|e| e.into_inner())).into_vec();
            rows.sort_by_key(|&r| ops.start(r as usize));
            Pyramid::of_rows(rows, &|r| op_slice(ops, r))
        }))
    }

    /// Runs of a ubatch's timed ops on one layer.
    fn layer_tracks(&self, ops: &Ops) -> &BTreeMap<u32, Pyramid> {
        self.layers.get_or_init(|| {
            let mut layers: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
            let timed = if ops.timed() { ops.ubatch_ops.as_slice() } else { &[] };
            for &(first, end) in timed {
                let mut run: Option<(u32, Slice)> = None;
                let rows = first as usize..(end as usize).max(first as usize);
                for i in rows.filter(|&i| ops.dur(i).is_some()) {
                    let s = op_slice(ops, i as u32);
                    let layer = ops.sig_of(i).layer;
                    match (&mut run, layer) {
                        (Some((l, r)), Some(layer)) if *l == layer => r.end = r.end.max(s.end),
                        _ => {
                            if let Some((l, r)) = run.take() {
                                layers.entry(l).or_default().push(r);
                            }
                            run = layer.map(|l| (l, Slice { name: l, ..s }));
                        }
                    }
                }
                if let Some((l, r)) = run {
                    layers.entry(l).or_default().push(r);
                }
            }
            layers
                .into_iter()
                .map(|(l, mut v)| {
                    v.sort_by_key(|s| s.start);
                    (l, Pyramid::new(v))
                })
                .collect()
        })
    }

    /// Every track, with its rows when known without building it.
    pub fn tracks(&self) -> Vec<(TrackId, Option<usize>)> {
        let mut out: Vec<(TrackId, Option<usize>)> = self.slices.iter().map(|(id, p)| (*id, Some(p.len()))).collect();
        out.extend(self.layer_ids.iter().map(|&l| (TrackId::Layer(l), None)));
        out.extend(self.threads.keys().map(|&t| (TrackId::Ops(t), None)));
        out.extend(self.counters.iter().map(|(c, t)| (TrackId::Counter(*c), Some(t.t.len()))));
        out
    }

    pub fn slices(&self, track: TrackId, from: u64, to: u64, bin: u64, ops: &Ops) -> Option<Vec<Slice>> {
        let p = match track {
            TrackId::Ops(tid) => self.thread_track(tid, ops)?,
            TrackId::Layer(l) => self.layer_tracks(ops).get(&l)?,
            _ => self.slices.get(&track)?,
        };
        Some(p.query(from, to, bin, &|r| op_slice(ops, r)))
    }

    /// Per bucket of `bin` from `from` (`n` of them): the counter's total.
    pub fn counter(&self, c: Counter, from: u64, bin: u64, n: usize) -> Vec<u64> {
        let Some(track) = self.counters.get(&c) else { return vec![0; n] };
        let at = |t: u64| track.prefix[track.t.partition_point(|&x| x < t)];
        (0..n as u64).map(|i| at(from + (i + 1) * bin) - at(from + i * bin)).collect()
    }
}
