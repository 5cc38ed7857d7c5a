//! The memory map (docs/VIEW_API.md "Memory map"): bytes by position (disk
//! track: the model files; buffer track: copies and anonymous memory) and
//! by ubatch or time. Reads are the exact ranges each op read, kept in time
//! order; a grid sums their overlap with each cell.

use std::{collections::HashMap, sync::OnceLock};

use serde::{Deserialize, Serialize};

mod grid;
mod inspect;
mod reads;

use super::{
    Tensors,
    buffer::BufferTrack,
    disk::column::{Column, once},
    lod::Bins,
    pyramid::{Entry, Pyramid},
};
use crate::analyze::Analysis;

use self::reads::Reads;
pub use self::reads::ReadsBuilder;
pub use super::buffer::BufferBuilder;

pub const NO_UBATCH: u32 = u32::MAX;

/// One op's read of one contiguous range of a model tensor (stored as
/// [`reads::Reads`] keeps it).
#[derive(Clone, Copy, Debug)]
pub struct Read {
    /// The op's start, since the trace's start.
    pub t: u64,
    /// Disk-track position.
    pub y0: u64,
    pub len: u32,
    pub ubatch: u32,
    /// The tensor, the op's name and whether through a copy: see [`Read::new`].
    tag: u32,
    /// The op's row in [`super::ops::Ops`] (its arrival index while building).
    pub row: u32,
}

/// In a [`Read`]'s tag: read through a copy (repacked, or loaded without
/// mmap), not the mapping.
pub const COPY: u32 = 1 << 31;
const TENSOR_BITS: u32 = 24;
const TENSOR_MASK: u32 = (1 << TENSOR_BITS) - 1;
/// Op-name ids a read keeps; later ones share the last.
const OP_MASK: u32 = 0x7f;

impl Read {
    pub fn new(t: u64, y0: u64, ubatch: u32, tensor: u32, copy: bool, op: u32, row: u32) -> Read {
        let tag = (tensor & TENSOR_MASK) | (op.min(OP_MASK) << TENSOR_BITS) | if copy { COPY } else { 0 };
        Read { t, y0, len: 0, ubatch, tag, row }
    }

    pub fn tensor(&self) -> u32 {
        self.tag & TENSOR_MASK
    }

    pub fn copy(&self) -> bool {
        self.tag & COPY != 0
    }

    pub fn op(&self) -> u32 {
        (self.tag >> TENSOR_BITS) & OP_MASK
    }
}

/// A read's tensor, with [`COPY`] set when through a copy.
fn tag(r: &Read) -> u32 {
    r.tag & (TENSOR_MASK | COPY)
}

/// Adds `(x, y0, len, times)` to a grid.
type AddFn<'a> = dyn FnMut(u64, u64, u64, f64) + 'a;

/// A fault, page-cache fill or block read, on the disk track.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct IoEvent {
    pub t: u64,
    pub y0: u64,
    pub len: u64,
    pub ubatch: u32,
}

#[derive(Serialize, Deserialize)]
pub struct IoEvents {
    pub fault_major: Column<IoEvent>,
    pub fault_minor: Column<IoEvent>,
    pub cache_fill: Column<IoEvent>,
    pub block_read: Column<IoEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Disk,
    Buffer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    Ubatch,
    Time,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    Read,
    FaultMajor,
    FaultMinor,
    CacheFill,
    BlockRead,
    Unused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryFilter {
    File,
    Copy,
    All,
}

/// Which reads count (the `read` metric).
#[derive(Clone, Debug)]
pub struct ReadFilter {
    pub memory: MemoryFilter,
    pub ops: Vec<u16>,
    pub layers: Vec<u32>,
    pub phases: Vec<u8>,
}

impl ReadFilter {
    /// Whether the pyramid (which keeps tensors and copies apart, nothing
    /// else) can answer.
    fn by_pyramid(&self) -> bool {
        self.ops.is_empty() && self.layers.is_empty() && self.phases.is_empty()
    }

    fn keeps_tag(&self, tag: u32) -> bool {
        match self.memory {
            MemoryFilter::All => true,
            MemoryFilter::File => tag & COPY == 0,
            MemoryFilter::Copy => tag & COPY != 0,
        }
    }

    fn keeps(&self, r: &Read, layer_of: &[Option<u32>], phase_of: &[u8]) -> bool {
        self.keeps_tag(r.tag)
            && (self.ops.is_empty() || self.ops.iter().any(|&o| u32::from(o).min(OP_MASK) == r.op()))
            && (self.phases.is_empty() || phase_of.get(r.ubatch as usize).is_some_and(|p| self.phases.contains(p)))
            && (self.layers.is_empty()
                || layer_of.get(r.tensor() as usize).copied().flatten().is_some_and(|l| self.layers.contains(&l)))
    }
}

/// An x range: ubatches or nanoseconds, `[from, to)`.
#[derive(Clone, Copy, Debug)]
pub struct XRange {
    pub axis: XAxis,
    pub from: u64,
    pub to: u64,
}

pub struct Grid {
    pub x: Bins,
    pub y: Bins,
    /// Row-major by x: `values[ix * ny + iy]`.
    pub values: Vec<f32>,
}

/// A cell of the token × tensor matrix: bytes read of a tensor (`tag`:
/// the tensor, | [`COPY`] through a copy).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MatrixCell {
    pub tag: u32,
    pub bytes: u64,
}

#[derive(Serialize, Deserialize)]
pub struct MemoryMap {
    reads: Reads,
    io: IoEvents,
    pub buffer: BufferTrack,
    /// Per ubatch: `(start, end)` since the trace's start.
    pub ubatch_time: Vec<(u64, u64)>,
    pub duration: u64,
    layer_of: Vec<Option<u32>>,
    /// Per ubatch: its phase code.
    phase_of: Vec<u8>,
    /// Per ubatch: `[first, end)` of its reads (empty: `(0, 0)`).
    ubatch_reads: Vec<(u32, u32)>,
    /// Reads outside any ubatch.
    outside: Column<u32>,
    /// Reads, and buffer accesses, of groups of ubatches.
    read_pyramid: Pyramid,
    buffer_pyramid: Pyramid,
    /// The token × tensor matrix: ubatch `u`'s cells are row
    /// `matrix_row[u]`, `matrix[row_starts[r]..row_starts[r + 1]]`, by tag.
    /// Token after token reads the same bytes of the same tensors, so rows
    /// repeat: each is kept once (a sixth of the index, kept per ubatch).
    matrix_row: Column<u32>,
    row_starts: Column<u32>,
    matrix: Column<MatrixCell>,
    /// Loaded and never read, by fill time (built at first use).
    #[serde(with = "once")]
    unused: OnceLock<Column<IoEvent>>,
}

/// Largest grid answered, in cells.
pub const MAX_CELLS: u64 = 4 << 20;

impl MemoryMap {
    pub fn new(
        a: &Analysis,
        tensors: &Tensors,
        reads: ReadsBuilder,
        buffer: BufferBuilder,
        io: [Vec<IoEvent>; 4],
        row_of_arrival: Option<&[u32]>,
    ) -> MemoryMap {
        let reads = reads.finish(row_of_arrival);
        let [fault_major, fault_minor, cache_fill, block_read] = io.map(|mut v| {
            v.sort_by_key(|e| e.t);
            Column::from(v)
        });
        let io = IoEvents { fault_major, fault_minor, cache_fill, block_read };
        let base = a.header.start_monotonic_ns;
        let ubatch_time: Vec<(u64, u64)> = a
            .ubatches
            .iter()
            .map(|u| {
                let s = u.start_ns.saturating_sub(base);
                (s, u.end_ns.map_or(s, |e| e.saturating_sub(base)).max(s))
            })
            .collect();
        let mut ubatch_reads = vec![(u32::MAX, 0u32); a.ubatches.len()];
        for (i, r) in reads.iter(0, reads.len()).enumerate() {
            if let Some(span) = ubatch_reads.get_mut(r.ubatch as usize) {
                *span = (span.0.min(i as u32), span.1.max(i as u32 + 1));
            }
        }
        for span in &mut ubatch_reads {
            if span.0 > span.1 {
                *span = (0, 0);
            }
        }
        let last = [
            reads.len().checked_sub(1).map(|i| reads.get(i).t),
            ubatch_time.last().map(|u| u.1),
            a.last_ts_ns.map(|t| t.saturating_sub(base)),
        ];
        let of_ubatch = |u: u32| {
            let (a, b) = ubatch_reads[u as usize];
            reads.iter(a as usize, b as usize).filter(move |r| r.ubatch == u)
        };
        let read_pyramid = Pyramid::build(ubatch_time.len(), |u, out| {
            out.extend(of_ubatch(u).map(|r| Entry { y0: r.y0, len: r.len, tag: tag(&r), count: 1 }));
        });
        let (mut matrix, mut row_starts, mut matrix_row) = (Vec::new(), vec![0u32], Vec::new());
        let mut rows: HashMap<Vec<(u32, u64)>, u32> = HashMap::new();
        for u in 0..ubatch_time.len() as u32 {
            let mut row: Vec<(u32, u64)> = of_ubatch(u).map(|r| (tag(&r), u64::from(r.len))).collect();
            row.sort_unstable_by_key(|c| c.0);
            row.dedup_by(|next, kept| {
                let same = next.0 == kept.0;
                if same {
                    kept.1 += next.1;
                }
                same
            });
            let next = rows.len() as u32;
            let id = *rows.entry(row).or_insert_with_key(|row| {
                matrix.extend(row.iter().map(|&(tag, bytes)| MatrixCell { tag, bytes }));
                row_starts.push(matrix.len() as u32);
                next
            });
            matrix_row.push(id);
        }
        let buffer = buffer.finish();
        let buffer_pyramid = Pyramid::build(ubatch_time.len(), |u, out| {
            for (_, s) in buffer.segments_of(u, u + 1) {
                let mut at = s.start;
                while at < s.end {
                    let len = (s.end - at).min(u64::from(u32::MAX));
                    out.push(Entry { y0: at, len: len as u32, tag: 0, count: s.count });
                    at += len;
                }
            }
        });
        let outside: Vec<u32> = reads
            .iter(0, reads.len())
            .enumerate()
            .filter(|(_, r)| r.ubatch == NO_UBATCH)
            .map(|(i, _)| i as u32)
            .collect();
        MemoryMap {
            outside: outside.into(),
            read_pyramid,
            buffer_pyramid,
            matrix_row: matrix_row.into(),
            row_starts: row_starts.into(),
            matrix: matrix.into(),
            reads,
            io,
            buffer,
            duration: last.into_iter().flatten().max().unwrap_or(0) + 1,
            ubatch_time,
            layer_of: tensors.rows.iter().map(|t| t.layer).collect(),
            phase_of: a.ubatches.iter().map(|u| super::phase_code(u.phase)).collect(),
            ubatch_reads,
            unused: OnceLock::new(),
        }
    }

    /// Ubatch `u`'s cells of the token × tensor matrix, by tag.
    fn matrix_cells(&self, u: usize) -> &[MatrixCell] {
        let r = self.matrix_row[u] as usize;
        &self.matrix[self.row_starts[r] as usize..self.row_starts[r + 1] as usize]
    }

    /// Per ubatch: its phase, as [`super::phase_code`].
    pub fn phase_of(&self) -> &[u8] {
        &self.phase_of
    }

    pub fn reads(&self) -> usize {
        self.reads.len()
    }

    /// Entries of the disk and buffer pyramids.
    pub fn pyramid_entries(&self) -> (usize, usize) {
        (self.read_pyramid.entries(), self.buffer_pyramid.entries())
    }

    /// The reads of op row `row`, which started at `start`.
    pub fn reads_of_op(&self, row: u32, start: u64) -> impl Iterator<Item = Read> + '_ {
        let first = self.reads.first_at(start);
        self.reads.iter(first, self.reads.len()).take_while(move |r| r.t == start).filter(move |r| r.row == row)
    }

    pub fn x_extent(&self, axis: XAxis) -> u64 {
        match axis {
            XAxis::Ubatch => self.ubatch_time.len() as u64,
            XAxis::Time => self.duration,
        }
    }

    pub fn y_extent(&self, track: Track, tensors: &Tensors) -> u64 {
        match track {
            Track::Disk => tensors.disk_size,
            Track::Buffer => self.buffer.size,
        }
    }

    /// The ubatches `[from, to)` whose x can fall in `x`: the buffer track
    /// places a ubatch's accesses at its start.
    fn ubatches_of(&self, x: XRange) -> (u32, u32) {
        match x.axis {
            XAxis::Ubatch => (x.from.min(u64::from(u32::MAX)) as u32, x.to.min(u64::from(u32::MAX)) as u32),
            XAxis::Time => {
                let a = self.ubatch_time.partition_point(|u| u.0 < x.from);
                let b = self.ubatch_time.partition_point(|u| u.0 < x.to);
                (a as u32, b as u32)
            }
        }
    }

    /// Reads whose x falls in `x`, with their x coordinate.
    fn reads_in(&self, x: XRange) -> impl Iterator<Item = (u64, Read)> + '_ {
        let (a, b) = match x.axis {
            XAxis::Time => (self.reads.first_at(x.from), self.reads.first_at(x.to)),
            XAxis::Ubatch => {
                let spans = &self.ubatch_reads
                    [(x.from as usize).min(self.ubatch_reads.len())..(x.to as usize).min(self.ubatch_reads.len())];
                let a = spans.iter().filter(|s| s.1 > s.0).map(|s| s.0).min().unwrap_or(0) as usize;
                let b = spans.iter().map(|s| s.1).max().unwrap_or(0) as usize;
                (a, b)
            }
        };
        self.reads.iter(a, b.max(a)).filter_map(move |r| match x.axis {
            XAxis::Time => Some((r.t, r)),
            XAxis::Ubatch => (r.ubatch != NO_UBATCH && (x.from..x.to).contains(&u64::from(r.ubatch)))
                .then_some((u64::from(r.ubatch), r)),
        })
    }

    fn events(&self, metric: Metric) -> &[IoEvent] {
        match metric {
            Metric::FaultMajor => &self.io.fault_major,
            Metric::FaultMinor => &self.io.fault_minor,
            Metric::CacheFill => &self.io.cache_fill,
            Metric::BlockRead => &self.io.block_read,
            Metric::Unused => self.unused.get_or_init(|| self.build_unused()),
            Metric::Read => &[],
        }
    }

    /// Events of `metric` whose x falls in `x`, with their x coordinate.
    fn events_in(&self, metric: Metric, x: XRange) -> impl Iterator<Item = (u64, &IoEvent)> + '_ {
        let events = self.events(metric);
        let (t0, t1) = match x.axis {
            XAxis::Time => (x.from, x.to),
            XAxis::Ubatch => {
                let from = self.ubatch_time.get(x.from as usize).map_or(u64::MAX, |u| u.0);
                let last = (x.to as usize).min(self.ubatch_time.len()).checked_sub(1);
                (from, last.and_then(|l| self.ubatch_time.get(l)).map_or(0, |u| u.1 + 1))
            }
        };
        let a = events.partition_point(|e| e.t < t0);
        let b = events.partition_point(|e| e.t < t1).max(a);
        events[a..b].iter().filter_map(move |e| match x.axis {
            XAxis::Time => Some((e.t, e)),
            XAxis::Ubatch => (e.ubatch != NO_UBATCH && (x.from..x.to).contains(&u64::from(e.ubatch)))
                .then_some((u64::from(e.ubatch), e)),
        })
    }

    /// Page-cache fills, cut to the bytes no op ever read.
    fn build_unused(&self) -> Column<IoEvent> {
        let mut used: Vec<(u64, u64)> = self.reads.spans().collect();
        used.sort_unstable();
        used.dedup();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in used {
            match merged.last_mut() {
                Some(m) if a <= m.1 => m.1 = m.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut out = Vec::new();
        for e in self.io.cache_fill.iter() {
            let (mut at, end) = (e.y0, e.y0 + e.len);
            let mut i = merged.partition_point(|m| m.1 <= at);
            while at < end {
                match merged.get(i) {
                    Some(&(a, b)) if a < end => {
                        if a > at {
                            out.push(IoEvent { y0: at, len: a - at, ..*e });
                        }
                        at = at.max(b);
                        i += 1;
                    }
                    _ => {
                        out.push(IoEvent { y0: at, len: end - at, ..*e });
                        at = end;
                    }
                }
            }
        }
        out.into()
    }
}
