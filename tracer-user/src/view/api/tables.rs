//! `/api/v1/ops`, `/timeline/*`, `/graph` and `/moe/*`.

use axum::{
    Router,
    extract::{RawQuery, State},
    response::Response,
    routing::get,
};
use serde_json::json;

use super::{Shared, blocking, columns, json_value, memmap::PHASES, triples};
use crate::{
    analyze::Phase,
    view::{
        frame::{Column, Frame, NONE_U32},
        index::{
            graph, index_phase,
            lod::Bins,
            moe,
            ops::{Filter, SortKey, UbatchFacts},
            timeline::TrackId,
        },
        params::{ApiError, Params, bad},
    },
};

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/v1/ops", get(ops))
        .route("/api/v1/timeline/tracks", get(tracks))
        .route("/api/v1/timeline/slices", get(slices))
        .route("/api/v1/timeline/counter", get(counter))
        .route("/api/v1/graph", get(graph_of))
        .route("/api/v1/moe", get(moe_summary))
        .route("/api/v1/moe/grid", get(moe_grid))
        .route("/api/v1/moe/tokens", get(moe_tokens))
        .route("/api/v1/moe/coactivation", get(moe_coactivation))
}

const SORTS: [(&str, SortKey); 5] = [
    ("op_seq", SortKey::Seq),
    ("dur", SortKey::Dur),
    ("weight_bytes", SortKey::WeightBytes),
    ("layer", SortKey::Layer),
    ("ubatch", SortKey::Ubatch),
];
const MEMORY: [(&str, u8); 5] = [("model_file", 0), ("copy", 1), ("anon", 2), ("other_file", 3), ("unmapped", 4)];
pub const MAX_LIMIT: usize = 5000;

async fn ops(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(
            q.as_deref(),
            &[
                "layer",
                "op",
                "tensor",
                "name",
                "from_ubatch",
                "to_ubatch",
                "phase",
                "memory",
                "seq",
                "sort",
                "desc",
                "offset",
                "limit",
            ],
        )?;
        let n_ub = idx.analysis.ubatches.len() as u32;
        let ubatches = match (p.num::<u32>("from_ubatch")?, p.num::<u32>("to_ubatch")?) {
            (None, None) => None,
            (a, b) => {
                let (a, b) = (a.unwrap_or(0), b.unwrap_or(n_ub));
                if a >= b {
                    return Err(bad(format!("`from_ubatch={a}` is not below `to_ubatch={b}`")));
                }
                Some((a, b))
            }
        };
        let name = p
            .str("name")?
            .map(|re| regex_lite::Regex::new(re).map_err(|e| bad(format!("`name` is not a valid regex: {e}"))))
            .transpose()?;
        let filter = Filter {
            layers: p.list("layer")?,
            ops: p.list("op")?,
            tensors: p.list("tensor")?,
            name,
            ubatches,
            phases: p.choices("phase", &PHASES)?,
            memories: p.choices("memory", &MEMORY)?,
            seqs: p.list("seq")?,
        };
        let sort = p.choice("sort", &SORTS, Some(SortKey::Seq))?;
        let desc = p.choice("desc", &[("0", false), ("1", true)], Some(false))?;
        let offset: u64 = p.num("offset")?.unwrap_or(0);
        let limit: usize = p.num("limit")?.unwrap_or(200);
        if limit > MAX_LIMIT {
            return Err(bad(format!("`limit={limit}` is more than {MAX_LIMIT}")));
        }
        let per_ubatch = idx.per_ubatch();
        let facts = UbatchFacts { phase: idx.memmap.phase_of(), seqs: &per_ubatch.seqs };
        let page = idx.ops.query(&filter, &facts, sort, desc, offset, limit);
        let ops = &idx.ops;
        // Strings the page names, numbered for this page.
        let mut strings: Vec<&str> = Vec::new();
        let mut local = std::collections::HashMap::new();
        let mut string_id = |id: u32| -> u32 {
            *local.entry(id).or_insert_with(|| {
                strings.push(&ops.strings[id as usize]);
                strings.len() as u32 - 1
            })
        };
        let token_of = &per_ubatch.token_of;
        let rows = &page.rows;
        let sig = |i: &u32| ops.sig_of(*i as usize);
        let dst: Vec<u32> = rows.iter().map(|i| string_id(sig(i).dst)).collect();
        let srcs: Vec<u32> = rows.iter().map(|i| string_id(sig(i).srcs)).collect();
        let frame = Frame::new(json!({"total": page.total, "offset": offset, "strings": strings}))
            .column("op", Column::U64(rows.iter().map(|&i| ops.seq(i as usize)).collect()))
            .column("ubatch", Column::U32(rows.iter().map(|&i| ops.ubatch(i as usize).unwrap_or(NONE_U32)).collect()))
            .column("start_ns", Column::U64(rows.iter().map(|&i| ops.start(i as usize)).collect()))
            .column(
                "dur_ns",
                Column::U64(rows.iter().map(|&i| dur64(ops.dur(i as usize).unwrap_or(NONE_U32))).collect()),
            )
            .column("name", Column::U32(rows.iter().map(|i| sig(i).op).collect()))
            .column("layer", Column::U32(rows.iter().map(|i| sig(i).layer.unwrap_or(NONE_U32)).collect()))
            .column("dst", Column::U32(dst))
            .column("srcs", Column::U32(srcs))
            .column("memory", Column::U8(rows.iter().map(|i| sig(i).memory as u8).collect()))
            .column(
                "weight_tensor",
                Column::U32(rows.iter().map(|i| sig(i).weights.first().copied().unwrap_or(NONE_U32)).collect()),
            )
            .column("weight_bytes", Column::U64(rows.iter().map(|&i| ops.weight_bytes(i as usize)).collect()))
            .column(
                "gen",
                Column::U32(
                    rows.iter()
                        .map(|&i| {
                            let u = ops.ubatch(i as usize);
                            u.and_then(|u| token_of.get(u as usize).copied().flatten()).unwrap_or(NONE_U32)
                        })
                        .collect(),
                ),
            );
        Ok(columns(frame))
    })
    .await
}

fn dur64(d: u32) -> u64 {
    if d == NONE_U32 { u64::MAX } else { u64::from(d) }
}

async fn tracks(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        Params::parse(q.as_deref(), &[])?;
        let tracks: Vec<_> =
            idx.timeline.tracks().into_iter().map(|(id, n)| json!({"id": id.name(), "rows": n})).collect();
        Ok(json_value(json!(tracks)))
    })
    .await
}

fn track_param(p: &Params) -> Result<TrackId, ApiError> {
    let raw: String = p.required("track")?;
    TrackId::parse(&raw).ok_or_else(|| bad(format!("`track={raw}` is not a track id (see /api/v1/timeline/tracks)")))
}

async fn slices(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["track", "t_from", "t_to", "w"])?;
        let track = track_param(&p)?;
        let w = p.pixels("w")?;
        let (t0, t1) = p.range("t_from", "t_to", idx.memmap.duration)?;
        let bins = Bins::new(t0, t1, 2 * w, 1);
        let rows = idx
            .timeline
            .slices(track, bins.from, bins.to, bins.bin, &idx.ops)
            .ok_or_else(|| ApiError::NotFound(format!("no slice track `{}` in this trace", track.name())))?;
        let mut meta = serde_json::Map::new();
        meta.extend(bins.meta("t"));
        Ok(columns(
            Frame::new(meta.into())
                .column("start_ns", Column::U64(rows.iter().map(|s| s.start).collect()))
                .column("end_ns", Column::U64(rows.iter().map(|s| s.end).collect()))
                .column("id", Column::U64(rows.iter().map(|s| s.id).collect()))
                .column("name", Column::U32(rows.iter().map(|s| s.name).collect()))
                .column("count", Column::U32(rows.iter().map(|s| s.count).collect())),
        ))
    })
    .await
}

async fn counter(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["track", "t_from", "t_to", "w"])?;
        let TrackId::Counter(c) = track_param(&p)? else {
            return Err(bad("`track` must be a counter (counter:faults_major, ...)"));
        };
        let w = p.pixels("w")?;
        let (t0, t1) = p.range("t_from", "t_to", idx.memmap.duration)?;
        let bins = Bins::new(t0, t1, 2 * w, 1);
        let values = idx.timeline.counter(c, bins.from, bins.bin, bins.n);
        let mut meta = serde_json::Map::new();
        meta.extend(bins.meta("t"));
        Ok(columns(
            Frame::new(meta.into())
                .column("t_ns", Column::U64((0..bins.n as u64).map(|i| bins.from + i * bins.bin).collect()))
                .column("value", Column::U64(values)),
        ))
    })
    .await
}

async fn graph_of(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["ubatch"])?;
        let u: u32 = p.required("ubatch")?;
        if u as usize >= idx.analysis.ubatches.len() {
            return Err(ApiError::NotFound(format!("no ubatch {u} in this trace")));
        }
        Ok(json_value(
            graph::graph(&idx.ops, u)
                .unwrap_or_else(|| json!({"ubatch": u, "shape": "empty", "nodes": [], "edges": []})),
        ))
    })
    .await
}

async fn moe_summary(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        Params::parse(q.as_deref(), &[])?;
        let reported = idx.report().map_err(ApiError::Internal)?;
        Ok(json_value(json!(reported.stats.moe)))
    })
    .await
}

/// `[from_ubatch, to_ubatch)` and the phases asked for.
fn moe_range(p: &Params, n: usize) -> Result<(usize, usize, Vec<Phase>), ApiError> {
    let (a, b) = p.range("from_ubatch", "to_ubatch", n as u64)?;
    let phases: Vec<u8> = p.choices("phase", &PHASES)?;
    Ok((a as usize, (b as usize).min(n), phases.into_iter().map(index_phase).collect()))
}

async fn moe_grid(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["phase", "from_ubatch", "to_ubatch"])?;
        let (a, b, phases) = moe_range(&p, idx.analysis.ubatches.len())?;
        let cells = moe::grid(&idx.analysis, a, b, &phases);
        Ok(triples(json!({}), ["layer", "expert", "tokens"], &cells))
    })
    .await
}

async fn moe_coactivation(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["layer", "phase", "from_ubatch", "to_ubatch"])?;
        let layer: u32 = p.required("layer")?;
        let (a, b, phases) = moe_range(&p, idx.analysis.ubatches.len())?;
        let cells = moe::coactivation(&idx.analysis, layer, a, b, &phases);
        Ok(triples(json!({}), ["a", "b", "tokens"], &cells))
    })
    .await
}

async fn moe_tokens(State(idx): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    blocking(idx, move |idx| {
        let p = Params::parse(q.as_deref(), &["layer", "from_token", "to_token", "w"])?;
        let layer: u32 = p.required("layer")?;
        let w = p.pixels("w")?;
        let (t0, t1) = p.range("from_token", "to_token", idx.tokens.len() as u64)?;
        let x = Bins::new(t0, t1, w, 1);
        let cells = moe::over_tokens(&idx.analysis, &idx.tokens, layer, x);
        let mut meta = serde_json::Map::new();
        meta.extend(x.meta("x"));
        Ok(triples(meta.into(), ["ix", "expert", "tokens"], &cells))
    })
    .await
}
