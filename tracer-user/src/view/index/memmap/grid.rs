//! Grids of the memory map: from the pyramid where its groups fit the
//! buckets, from the reads (or segments, events) one by one elsewhere; and
//! the token × tensor matrix.

use super::{AddFn, COPY, Grid, MatrixCell, MemoryMap, Metric, ReadFilter, Track, XAxis, XRange};
use crate::view::index::{
    lod::Bins,
    pyramid::{Entry, Pyramid},
};

/// Grids of at least this many x buckets are computed in two halves.
const SPLIT_FROM: usize = 64;

impl MemoryMap {
    /// The grid of `metric` over `x` × `[y_from, y_to)`: its two halves
    /// of x buckets on two threads (a whole run's time × offset grid took
    /// 90-130 ms on one).
    pub fn grid(&self, track: Track, x: Bins, axis: XAxis, y: Bins, metric: Metric, filter: &ReadFilter) -> Grid {
        let values = if x.n >= SPLIT_FROM {
            let k = x.n / 2;
            let mid = x.from + k as u64 * x.bin;
            let left = Bins { to: mid, n: k, ..x };
            let right = Bins { from: mid, n: x.n - k, ..x };
            let (mut a, b) = std::thread::scope(|s| {
                let a = s.spawn(|| self.grid_values(track, &left, axis, &y, metric, filter));
                let b = self.grid_values(track, &right, axis, &y, metric, filter);
                (a.join().unwrap_or_else(|p| std::panic::resume_unwind(p)), b)
            });
            a.extend(b);
            a
        } else {
            self.grid_values(track, &x, axis, &y, metric, filter)
        };
        Grid { x, y, values }
    }

    /// The grid's values, bucket `ix` of `x` at `[ix * y.n, (ix + 1) * y.n)`.
    fn grid_values(
        &self,
        track: Track,
        x: &Bins,
        axis: XAxis,
        y: &Bins,
        metric: Metric,
        filter: &ReadFilter,
    ) -> Vec<f32> {
        let mut acc = vec![0f64; x.n * y.n];
        let xr = XRange { axis, from: x.from, to: x.to };
        let mut add = |xv: u64, y0: u64, len: u64, scale: f64| {
            let Some(ix) = x.index(xv) else { return };
            let row = &mut acc[ix * y.n..(ix + 1) * y.n];
            let (lo, hi) = (y0.max(y.from), (y0 + len).min(y.to));
            let mut at = lo;
            while at < hi {
                let iy = ((at - y.from) / y.bin) as usize;
                let next = (y.from + (iy as u64 + 1) * y.bin).min(hi);
                row[iy] += (next - at) as f64 * scale;
                at = next;
            }
        };
        match (track, metric) {
            (Track::Disk, Metric::Read) if filter.by_pyramid() => {
                let keep = |e: &Entry| filter.keeps_tag(e.tag);
                let raw = |from: u32, to: u32, add: &mut AddFn| {
                    for (xv, r) in self.reads_in(XRange { axis: XAxis::Ubatch, from: from.into(), to: to.into() }) {
                        if filter.keeps(&r, &self.layer_of, &self.phase_of) {
                            add(if axis == XAxis::Time { r.t } else { xv }, r.y0, u64::from(r.len), 1.0);
                        }
                    }
                };
                self.pyramid_grid(&self.read_pyramid, x, axis, &keep, &raw, &mut add);
                if axis == XAxis::Time {
                    for &i in &self.outside {
                        let r = &self.reads.get(i as usize);
                        if filter.keeps(r, &self.layer_of, &self.phase_of) {
                            add(r.t, r.y0, u64::from(r.len), 1.0);
                        }
                    }
                }
            }
            (Track::Disk, Metric::Read) => {
                for (xv, r) in self.reads_in(xr) {
                    if filter.keeps(&r, &self.layer_of, &self.phase_of) {
                        add(xv, r.y0, u64::from(r.len), 1.0);
                    }
                }
            }
            (Track::Disk, m) => {
                for (xv, e) in self.events_in(m, xr) {
                    add(xv, e.y0, e.len, 1.0);
                }
            }
            (Track::Buffer, _) => {
                let raw = |from: u32, to: u32, add: &mut AddFn| {
                    for (u, seg) in self.buffer.segments_of(from, to) {
                        let xv = match axis {
                            XAxis::Ubatch => u64::from(u),
                            XAxis::Time => self.ubatch_time[u as usize].0,
                        };
                        add(xv, seg.start, seg.end - seg.start, f64::from(seg.count));
                    }
                };
                self.pyramid_grid(&self.buffer_pyramid, x, axis, &|_| true, &raw, &mut add);
            }
        }
        acc.into_iter().map(|v| v as f32).collect()
    }

    /// Adds a pyramid's groups to the grid where a group falls in one x
    /// bucket, and `raw` (ubatches `[from, to)` one by one) elsewhere.
    fn pyramid_grid(
        &self,
        p: &Pyramid,
        x: &Bins,
        axis: XAxis,
        keep: &dyn Fn(&Entry) -> bool,
        raw: &dyn Fn(u32, u32, &mut AddFn),
        add: &mut AddFn,
    ) {
        let n = self.ubatch_time.len();
        let add_group = |entries: &[Entry], xv: u64, add: &mut AddFn| {
            for e in entries.iter().filter(|e| keep(e)) {
                add(xv, e.y0, u64::from(e.len), f64::from(e.count));
            }
        };
        match axis {
            XAxis::Ubatch => {
                let (from, to) = (x.from.min(n as u64) as usize, x.to.min(n as u64) as usize);
                match p.level_for(x.bin) {
                    // Buckets are aligned to the bucket size, a multiple of the group size.
                    Some(level) => {
                        for g in from >> level.shift..to.div_ceil(1 << level.shift) {
                            add_group(level.entries(g), (g as u64) << level.shift, add);
                        }
                    }
                    None => raw(from as u32, to as u32, add),
                }
            }
            XAxis::Time => {
                let levels = p.levels();
                let first = self.ubatch_time.partition_point(|u| u.1 < x.from);
                let last = self.ubatch_time.partition_point(|u| u.0 < x.to);
                let Some(top) = levels.len().checked_sub(1) else {
                    raw(first as u32, last as u32, add);
                    return;
                };
                let mut stack: Vec<(usize, usize)> =
                    (first >> levels[top].shift..last.div_ceil(1 << levels[top].shift)).map(|g| (top, g)).collect();
                while let Some((li, g)) = stack.pop() {
                    let shift = levels[li].shift;
                    let (u0, u1) = (g << shift, ((g + 1) << shift).min(n));
                    let (t0, t1) = (self.ubatch_time[u0].0, self.ubatch_time[u1 - 1].1);
                    if t1 < x.from || t0 >= x.to {
                        continue;
                    }
                    match (x.index(t0), x.index(t1)) {
                        (Some(a), Some(b)) if a == b => add_group(levels[li].entries(g), t0, add),
                        _ if li > 0 => {
                            let per = 1usize << (shift - levels[li - 1].shift);
                            stack.extend((g * per..((g + 1) * per).min(levels[li - 1].groups())).map(|c| (li - 1, c)));
                        }
                        _ => raw(u0 as u32, u1 as u32, add),
                    }
                }
            }
        }
    }

    /// Per x bucket and tensor: bytes read (the token × tensor matrix),
    /// from the per-ubatch matrix unless an op filter needs the reads.
    pub fn tensor_matrix(&self, x: Bins, axis: XAxis, filter: &ReadFilter) -> Vec<(u32, u32, u64)> {
        let n_tensors = self.layer_of.len();
        let mut dense = vec![0u64; x.n * n_tensors];
        let mut add = |ix: usize, tensor: u32, bytes: u64| {
            if let Some(c) = dense.get_mut(ix * n_tensors + tensor as usize) {
                *c += bytes;
            }
        };
        if axis == XAxis::Ubatch && filter.ops.is_empty() {
            let n = self.matrix_row.len() as u64;
            for u in x.from.min(n)..x.to.min(n) {
                let Some(ix) = x.index(u) else { continue };
                if !filter.phases.is_empty()
                    && !self.phase_of.get(u as usize).is_some_and(|p| filter.phases.contains(p))
                {
                    continue;
                }
                for &MatrixCell { tag, bytes } in self.matrix_cells(u as usize) {
                    let tensor = tag & !COPY;
                    let layer_ok = filter.layers.is_empty()
                        || self.layer_of[tensor as usize].is_some_and(|l| filter.layers.contains(&l));
                    if layer_ok && filter.keeps_tag(tag) {
                        add(ix, tensor, bytes);
                    }
                }
            }
        } else {
            for (xv, r) in self.reads_in(XRange { axis, from: x.from, to: x.to }) {
                if filter.keeps(&r, &self.layer_of, &self.phase_of)
                    && let Some(ix) = x.index(xv)
                {
                    add(ix, r.tensor(), u64::from(r.len));
                }
            }
        }
        dense
            .iter()
            .enumerate()
            .filter(|(_, b)| **b > 0)
            .map(|(i, &b)| ((i / n_tensors) as u32, (i % n_tensors) as u32, b))
            .collect()
    }
}
