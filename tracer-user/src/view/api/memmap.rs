//! `/api/v1/memmap/*`: the memory map's layout, grids, cells and the
//! token × tensor matrix.

use axum::{
    Router,
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::json;

use super::{Shared, blocking, json_value, triples};
use crate::view::{
    frame::{self, Column, Frame},
    index::{
        Index,
        lod::Bins,
        memmap::{MAX_CELLS, MemoryFilter, Metric, ReadFilter, Track, XAxis, XRange},
    },
    params::{ApiError, Params, bad},
};

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/v1/memmap/bands", get(bands))
        .route("/api/v1/memmap/grid", get(grid))
        .route("/api/v1/memmap/cell", get(cell))
        .route("/api/v1/memmap/tensors", get(tensors))
}

const TRACKS: [(&str, Track); 2] = [("disk", Track::Disk), ("buffer", Track::Buffer)];
const AXES: [(&str, XAxis); 2] = [("ubatch", XAxis::Ubatch), ("time", XAxis::Time)];
const METRICS: [(&str, Metric); 6] = [
    ("read", Metric::Read),
    ("fault_major", Metric::FaultMajor),
    ("fault_minor", Metric::FaultMinor),
    ("cache_fill", Metric::CacheFill),
    ("block_read", Metric::BlockRead),
    ("unused", Metric::Unused),
];
const MEMORY: [(&str, MemoryFilter); 3] =
    [("file", MemoryFilter::File), ("copy", MemoryFilter::Copy), ("all", MemoryFilter::All)];
pub const PHASES: [(&str, u8); 4] = [("warmup", 0), ("prompt", 1), ("generate", 2), ("aux", 3)];

const FILTERS: [&str; 4] = ["memory", "op", "layer", "phase"];

fn read_filter(p: &Params, idx: &Index) -> Result<ReadFilter, ApiError> {
    let ops: Vec<u16> = p.list("op")?;
    if let Some(bad_op) = ops.iter().find(|&&o| usize::from(o) >= idx.ops.op_names.len()) {
        return Err(bad(format!("`op={bad_op}` is no op-name id (meta.op_names has {})", idx.ops.op_names.len())));
    }
    Ok(ReadFilter {
        memory: p.choice("memory", &MEMORY, Some(MemoryFilter::All))?,
        ops,
        layers: p.list("layer")?,
        phases: p.choices("phase", &PHASES)?,
    })
}

/// The buffer track sums each ubatch's accesses: no per-op filters there.
fn check_buffer(p: &Params, track: Track, metric: Metric) -> Result<(), ApiError> {
    if track == Track::Buffer {
        if metric != Metric::Read {
            return Err(bad(
                "the buffer track has the `read` metric only (faults and disk reads are on the disk track)",
            ));
        }
        if let Some(f) = FILTERS.iter().find(|f| p.has(f)) {
            return Err(bad(format!("`{f}` filters the disk track only")));
        }
    }
    Ok(())
}

async fn bands(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["track"])?;
        let track = p.choice("track", &TRACKS, None)?;
        Ok(json_value(idx.memmap.bands(track, &idx.tensors)))
    })
    .await
}

async fn grid(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(
            q.as_deref(),
            &["track", "x", "x_from", "x_to", "y_from", "y_to", "w", "h", "metric", "memory", "op", "layer", "phase"],
        )?;
        let track = p.choice("track", &TRACKS, None)?;
        let axis = p.choice("x", &AXES, None)?;
        let metric = p.choice("metric", &METRICS, Some(Metric::Read))?;
        check_buffer(&p, track, metric)?;
        let (w, h) = (p.pixels("w")?, p.pixels("h")?);
        if w * h > MAX_CELLS {
            return Err(bad(format!("w×h = {} cells is more than the {MAX_CELLS} a grid answers", w * h)));
        }
        let (x0, x1) = p.range("x_from", "x_to", idx.memmap.x_extent(axis))?;
        let (y0, y1) = p.range("y_from", "y_to", idx.memmap.y_extent(track, &idx.tensors))?;
        let filter = read_filter(&p, idx)?;
        let x = Bins::new(x0, x1, w, 1);
        let y = Bins::new(y0, y1, h, 1);
        let key = format!("grid {track:?} {axis:?} {x:?} {y:?} {metric:?} {filter:?}");
        let body = idx.cache.get_or(key, || {
            let g = idx.memmap.grid(track, x, axis, y, metric, &filter);
            let max = g.values.iter().copied().fold(0f32, f32::max);
            let mut meta = serde_json::Map::new();
            meta.extend(x.meta("x"));
            meta.extend(y.meta("y"));
            meta.insert("max".into(), json!(max));
            Ok::<_, ApiError>(Frame::new(meta.into()).column("v", Column::F32(g.values)).encode())
        })?;
        Ok(([(header::CONTENT_TYPE, frame::CONTENT_TYPE)], body.as_ref().clone()).into_response())
    })
    .await
}

async fn cell(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(
            q.as_deref(),
            &["track", "x", "x_from", "x_to", "y_from", "y_to", "memory", "op", "layer", "phase"],
        )?;
        let track = p.choice("track", &TRACKS, None)?;
        let axis = p.choice("x", &AXES, None)?;
        check_buffer(&p, track, Metric::Read)?;
        let x_from: u64 = p.required("x_from")?;
        let y_from: u64 = p.required("y_from")?;
        let (x0, x1) = p.range("x_from", "x_to", x_from + 1)?;
        let (y0, y1) = p.range("y_from", "y_to", y_from + 1)?;
        let filter = read_filter(&p, idx)?;
        let x = XRange { axis, from: x0, to: x1 };
        Ok(json_value(match track {
            Track::Disk => {
                idx.memmap.disk_cell(&idx.analysis, &idx.tensors, x, (y0, y1), &filter, &|r| idx.ops.seq(r as usize))
            }
            Track::Buffer => idx.memmap.buffer_cell(x, (y0, y1)),
        }))
    })
    .await
}

async fn tensors(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["x", "x_from", "x_to", "w", "memory", "op", "layer", "phase"])?;
        let axis = p.choice("x", &AXES, None)?;
        let w = p.pixels("w")?;
        let (x0, x1) = p.range("x_from", "x_to", idx.memmap.x_extent(axis))?;
        let filter = read_filter(&p, idx)?;
        let x = Bins::new(x0, x1, 2 * w, 1);
        let n_cells = x.n as u64 * idx.tensors.rows.len() as u64;
        if n_cells > MAX_CELLS {
            return Err(bad(format!(
                "{} x buckets × {} tensors is more than {MAX_CELLS} cells",
                x.n,
                idx.tensors.rows.len()
            )));
        }
        let cells = idx.memmap.tensor_matrix(x, axis, &filter);
        let mut meta = serde_json::Map::new();
        meta.extend(x.meta("x"));
        Ok(triples(meta.into(), ["ix", "tensor", "bytes"], &cells))
    })
    .await
}
