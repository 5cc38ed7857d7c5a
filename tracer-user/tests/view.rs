//! `ttrace view` on real traces (recorded here, as root, from llama-completion
//! on the tiny and MoE models): its answers against independent figures —
//! `ttrace report --json`, `ttrace export --format jsonl`, the GGUF tensor
//! table — and its refusals (bad parameters, no token, corrupt traces).
// Records real processes: needs the default `live` feature.
#![cfg(feature = "live")]

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;
use ttrace::view::frame::decode::decode;

mod common;
mod target_support;
mod view_support;

use common::{stderr, ttrace};
use view_support::Server;

/// One trace per model, recorded once for all tests of this file.
fn trace(model: &str) -> PathBuf {
    static TINY: OnceLock<PathBuf> = OnceLock::new();
    static MOE: OnceLock<PathBuf> = OnceLock::new();
    let cell = if model == "tiny" { &TINY } else { &MOE };
    cell.get_or_init(|| {
        common::require_root();
        let llama = target_support::llama();
        let out = target_support::scratch(&format!("view-{model}")).join("trace.data");
        let run = ttrace()
            .args(["run", "--drop-caches", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&llama.completion)
            .arg("-m")
            .arg(target_support::private_model(model))
            .args(["-p", "hello world, this is a prompt", "-n", "8", "-no-cnv", "--ignore-eos", "-t", "2"])
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", stderr(&run));
        out
    })
    .clone()
}

fn report(trace: &Path) -> Value {
    let out = ttrace().arg("report").arg(trace).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn columns(reply: &view_support::Reply) -> ttrace::view::frame::decode::Decoded {
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    decode(&reply.body).unwrap()
}

#[test]
fn summary_is_the_report() {
    let t = trace("tiny");
    let server = Server::start(&t, &[]);
    let summary = server.get("/api/v1/summary");
    assert_eq!(summary.status, 200);
    assert_eq!(summary.json(), report(&t));
    assert!(summary.header("server-timing").is_some_and(|v| v.starts_with("app;dur=")));
    server.stop();
}

/// Rows of `ttrace export --format jsonl` that are ops naming `name` as
/// output or source.
fn jsonl_ops_naming(trace: &Path, name: &str) -> u64 {
    let dir = target_support::scratch("view-jsonl");
    let out = dir.join("rows.jsonl");
    let run = ttrace().arg("export").arg(trace).args(["--format", "jsonl", "-o"]).arg(&out).output().unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "op")
        .filter(|r| r["dst"] == name || r["srcs"].as_str().is_some_and(|s| s.split(';').any(|x| x == name)))
        .count() as u64
}

#[test]
fn op_table_counts_match_the_jsonl_export() {
    let t = trace("tiny");
    let server = Server::start(&t, &[]);
    for name in ["blk.0.attn_q.weight", "token_embd.weight", "blk.1.ffn_down.weight"] {
        let re = format!("^{}$", name.replace('.', "%5C."));
        let page = columns(&server.get(&format!("/api/v1/ops?name={re}&limit=5000")));
        let total = page.meta["total"].as_u64().unwrap();
        assert_eq!(total, jsonl_ops_naming(&t, name), "{name}");
        assert!(total > 0, "{name}");
        assert_eq!(page.rows as u64, total.min(5000));
        // Sorted by duration, the same ops.
        let by_dur = columns(&server.get(&format!("/api/v1/ops?name={re}&sort=dur&desc=1&limit=5000")));
        let (mut a, mut b) = (page.u64s("op").unwrap(), by_dur.u64s("op").unwrap());
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }
    server.stop();
}

/// The GGUF tensor table as `ttrace gguf --format json` reads it.
fn gguf_tensor(model: &Path, name: &str) -> Value {
    let out = ttrace().arg("gguf").arg(model).args(["--format", "json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let table: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tensors = table["tensors"].as_array().or_else(|| table.as_array()).expect("a tensor list");
    tensors.iter().find(|t| t["name"] == name).cloned().unwrap_or_else(|| panic!("no {name} in the table"))
}

#[test]
fn token_embd_cells_of_a_generated_token_are_its_row() {
    let t = trace("tiny");
    let rep = report(&t);
    let server = Server::start(&t, &[]);
    let meta = server.get("/api/v1/meta").json();
    let te = meta["tensors"].as_array().unwrap().iter().find(|x| x["name"] == "token_embd.weight").unwrap().clone();
    let (y0, size) = (te["y0"].as_u64().unwrap(), te["size"].as_u64().unwrap());
    let gg = gguf_tensor(&target_support::model("tiny"), "token_embd.weight");
    let rows = gg["shape"][1].as_u64().expect("2-D token_embd");
    assert_eq!(gg["size_bytes"].as_u64().or(gg["size"].as_u64()), Some(size));
    let row_bytes = size / rows;
    let get_rows = meta["op_names"].as_array().unwrap().iter().position(|n| n == "GET_ROWS").unwrap();
    let ubatches = rep["ubatches"].as_array().unwrap();
    let mut checked = 0;
    for u in ubatches.iter().filter(|u| u["phase"] == "generate").take(3) {
        let (ub, token) = (u["index"].as_u64().unwrap(), u["token_ids"][0].as_u64().unwrap());
        let grid = columns(&server.get(&format!(
            "/api/v1/memmap/grid?track=disk&x=ubatch&x_from={ub}&x_to={}&y_from={y0}&y_to={}&w=1&h=8192&op={get_rows}",
            ub + 1,
            y0 + size
        )));
        let (bin, from) = (grid.meta["y_bin"].as_u64().unwrap(), grid.meta["y_from"].as_u64().unwrap());
        assert!(row_bytes.is_multiple_of(bin), "bins of {bin} bytes do not tile rows of {row_bytes}");
        let v = grid.f32s("v").unwrap();
        let lit: Vec<u64> = (0..v.len() as u64).filter(|&i| v[i as usize] > 0.0).collect();
        let row = y0 + token * row_bytes;
        let want: Vec<u64> = ((row - from) / bin..(row + row_bytes - from) / bin).collect();
        assert_eq!(lit, want, "ubatch {ub} token {token}");
        assert!(lit.iter().all(|&i| v[i as usize] == bin as f32));
        // Hovering the row: the tensor, its bytes, the report's bytes for it.
        let cell = server
            .get(&format!(
                "/api/v1/memmap/cell?track=disk&x=ubatch&x_from={ub}&x_to={}&y_from={row}&y_to={}&op={get_rows}",
                ub + 1,
                row + row_bytes
            ))
            .json();
        let hit = &cell["tensors"][0];
        assert_eq!(hit["name"], "token_embd.weight");
        assert_eq!(hit["read_bytes"].as_u64(), Some(row_bytes));
        assert_eq!(hit["tokens"][0].as_u64(), Some(token));
        // The op that read it, looked up by its id, read that row.
        let op = server.get(&format!("/api/v1/op/{}", hit["ops"][0])).json();
        assert_eq!(op["name"], "GET_ROWS");
        assert_eq!(op["ubatch"].as_u64(), Some(ub));
        let reads = op["reads"].as_array().unwrap();
        assert!(reads.iter().any(|r| r["y0"].as_u64() == Some(row) && r["y1"].as_u64() == Some(row + row_bytes)));
        checked += 1;
    }
    assert_eq!(checked, 3);
    server.stop();
}

#[test]
fn hovered_cell_equals_the_reports_weight_bytes() {
    let t = trace("tiny");
    let rep = report(&t);
    let server = Server::start(&t, &[]);
    let meta = server.get("/api/v1/meta").json();
    let u = rep["ubatches"].as_array().unwrap().iter().find(|u| u["phase"] == "generate").unwrap();
    let ub = u["index"].as_u64().unwrap();
    for w in u["weights"].as_array().unwrap().iter().take(8) {
        let (m, i) = (w["model"].as_u64().unwrap(), w["tensor"].as_u64().unwrap());
        let row = meta["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["model"].as_u64() == Some(m) && t["id"].as_u64() == Some(i))
            .unwrap();
        let (y0, size) = (row["y0"].as_u64().unwrap(), row["size"].as_u64().unwrap());
        let cell = server
            .get(&format!(
                "/api/v1/memmap/cell?track=disk&x=ubatch&x_from={ub}&x_to={}&y_from={y0}&y_to={}",
                ub + 1,
                y0 + size
            ))
            .json();
        let hit = cell["tensors"].as_array().unwrap().iter().find(|x| x["name"] == row["name"]).unwrap();
        assert_eq!(hit["report_bytes"], w["bytes"], "{}", row["name"]);
    }
    server.stop();
}

#[test]
fn graph_has_the_reports_node_count_and_timeline_every_ubatch() {
    let t = trace("tiny");
    let rep = report(&t);
    let server = Server::start(&t, &[]);
    for u in rep["ubatches"].as_array().unwrap() {
        let g = server.get(&format!("/api/v1/graph?ubatch={}", u["index"])).json();
        assert_eq!(g["nodes"].as_array().unwrap().len() as u64, u["ops"].as_u64().unwrap());
    }
    let meta = server.get("/api/v1/meta").json();
    let slices = columns(
        &server.get(&format!("/api/v1/timeline/slices?track=ubatch&w=8192&t_to={}", meta["trace"]["duration_ns"])),
    );
    let n = rep["ubatches"].as_array().unwrap().len();
    let counts = slices.u32s("count").unwrap();
    assert_eq!(counts.iter().map(|&c| c as usize).sum::<usize>(), n);
    let ubatches = columns(&server.get("/api/v1/ubatches"));
    assert_eq!(ubatches.rows, n);
    assert_eq!(
        ubatches.u64s("ops").unwrap(),
        rep["ubatches"].as_array().unwrap().iter().map(|u| u["ops"].as_u64().unwrap()).collect::<Vec<_>>()
    );
    server.stop();
}

#[test]
fn expert_grid_is_the_reports_routing() {
    let t = trace("moe");
    let rep = report(&t);
    let server = Server::start(&t, &[]);
    let layers = rep["stats"]["moe"]["layers"].as_array().expect("an MoE report");
    for phase in ["prompt", "generate"] {
        let grid = columns(&server.get(&format!("/api/v1/moe/grid?phase={phase}")));
        let (l, e, n) = (grid.u32s("layer").unwrap(), grid.u32s("expert").unwrap(), grid.u64s("tokens").unwrap());
        let mut checked = 0;
        for layer in layers {
            let Some(p) = layer["phases"].as_array().unwrap().iter().find(|p| p["phase"] == phase) else { continue };
            for (expert, want) in p["activations"].as_array().unwrap().iter().enumerate() {
                let i = (0..grid.rows)
                    .find(|&i| u64::from(l[i]) == layer["layer"].as_u64().unwrap() && e[i] as usize == expert)
                    .unwrap();
                assert_eq!(Some(n[i]), want.as_u64());
                checked += 1;
            }
        }
        assert!(checked > 0, "no {phase} routing");
    }
    server.stop();
}

#[test]
fn bad_parameters_are_400_with_a_json_error() {
    let t = trace("tiny");
    let server = Server::start(&t, &[]);
    for path in [
        "/api/v1/memmap/grid?track=disk&x=ubatch&w=10",
        "/api/v1/memmap/grid?track=disk&x=ubatch&w=10&h=0",
        "/api/v1/memmap/grid?track=disk&x=ubatch&w=10&h=10&typo=1",
        "/api/v1/memmap/grid?track=tape&x=ubatch&w=10&h=10",
        "/api/v1/memmap/grid?track=disk&x=ubatch&w=10&h=10&x_from=5&x_to=5",
        "/api/v1/memmap/grid?track=buffer&x=ubatch&w=10&h=10&metric=fault_major",
        "/api/v1/ops?name=(",
        "/api/v1/ops?limit=99999",
        "/api/v1/ops?layer=abc",
        "/api/v1/ops?phase=lunch",
        "/api/v1/timeline/slices?track=nonsense&w=5",
        "/api/v1/op/abc",
        "/api/v1/meta?x=1",
        "/api/v1/simulate?budgets=1M",
    ] {
        let r = server.get(path);
        assert_eq!(r.status, 400, "{path}: {}", String::from_utf8_lossy(&r.body));
        assert!(r.json()["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}");
    }
    for path in ["/api/v1/op/999999999", "/api/v1/nope", "/api/v1/ubatch/100000"] {
        let r = server.get(path);
        assert_eq!(r.status, 404, "{path}");
        assert!(r.json()["error"].is_string());
    }
    assert_eq!(server.get("/../../etc/passwd").status, 404);
    assert_eq!(server.get("/").status, 200);
    server.stop();
}

#[test]
fn a_network_address_needs_the_token() {
    let t = trace("tiny");
    let server = Server::start(&t, &["--host", "0.0.0.0"]);
    let token = server.token.clone().expect("the printed URL carries a token");
    assert_eq!(token.len(), 32);
    let denied = server.get("/api/v1/meta");
    assert_eq!(denied.status, 403);
    assert!(denied.json()["error"].is_string());
    assert_eq!(server.get("/").status, 403);
    assert_eq!(server.get("/api/v1/meta?token=0123").status, 403);
    assert_eq!(server.get_auth("/api/v1/meta").status, 200);
    // The page sets a cookie that then stands for the token.
    let page = server.get_auth("/");
    assert_eq!(page.status, 200);
    let cookie = page.header("set-cookie").expect("a cookie").split(';').next().unwrap().to_string();
    let r = view_support::get(&server.addr, "/api/v1/meta", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 200);
    server.stop();
}

#[test]
fn loopback_needs_no_token() {
    let t = trace("tiny");
    let server = Server::start(&t, &[]);
    assert!(server.token.is_none());
    assert!(server.url.starts_with("http://127.0.0.1:"), "{}", server.url);
    assert_eq!(server.get("/api/v1/meta").status, 200);
    server.stop();
}

#[test]
fn a_cut_trace_opens_to_its_last_frame_and_a_corrupt_one_is_one_error() {
    let t = trace("tiny");
    let dir = target_support::scratch("view-cut");
    let bytes = std::fs::read(&t).unwrap();
    let cut = dir.join("cut.data");
    // Loading the model fills most of the file: cut inside the graphs.
    let ops = [97, 95, 90, 99]
        .into_iter()
        .map(|pct| {
            std::fs::write(&cut, &bytes[..bytes.len() * pct / 100]).unwrap();
            common::count_ops(&cut)
        })
        .find(|&n| n > 0)
        .expect("some cut keeps ops");
    assert!(ops < common::count_ops(&t));
    let server = Server::start(&cut, &[]);
    let meta = server.get("/api/v1/meta").json();
    assert_eq!(meta["trace"]["truncated"], true);
    assert_eq!(meta["counts"]["ops"].as_u64(), Some(ops as u64));
    server.stop();

    let bad = dir.join("bad.data");
    let mut garbled = bytes.clone();
    garbled[..4].copy_from_slice(b"NOPE");
    std::fs::write(&bad, &garbled).unwrap();
    for path in [bad.as_path(), Path::new("/nonexistent/trace.data")] {
        let out = ttrace().arg("view").arg(path).args(["--port", "0", "--no-open"]).output().unwrap();
        common::assert_fails_with(&out, "");
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
}

/// Grids from the merged groups of ubatches equal those from the reads one
/// by one (a phase filter that keeps every phase takes that path), and a
/// coarse grid holds the bytes of the fine one.
#[test]
fn pyramid_grids_equal_raw_reads() {
    let t = trace("tiny");
    let server = Server::start(&t, &[]);
    let all = "phase=warmup&phase=prompt&phase=generate&phase=aux";
    let grid = |q: &str| columns(&server.get(&format!("/api/v1/memmap/grid?{q}"))).f32s("v").unwrap();
    let close = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1.0))
    };
    for x in ["ubatch", "time"] {
        let merged = grid(&format!("track=disk&x={x}&w=2&h=64"));
        let raw = grid(&format!("track=disk&x={x}&w=2&h=64&{all}"));
        assert!(merged.iter().any(|&v| v > 0.0));
        assert!(close(&merged, &raw), "x={x}");
        let fine: f64 = grid(&format!("track=buffer&x={x}&w=4096&h=64")).iter().map(|&v| f64::from(v)).sum();
        let coarse: f64 = grid(&format!("track=buffer&x={x}&w=1&h=64")).iter().map(|&v| f64::from(v)).sum();
        assert!(fine > 0.0 && (fine - coarse).abs() <= 1e-5 * fine, "buffer x={x}: {fine} vs {coarse}");
    }
    server.stop();
}

/// Per tensor, the memory map's loaded-but-never-used bytes and disk reads
/// over the whole run are the report's own (`stats.loaded_vs_used`, `io`).
#[test]
fn unused_and_disk_cells_equal_the_reports_tensor_figures() {
    let t = trace("tiny");
    let rep = report(&t);
    let server = Server::start(&t, &[]);
    let meta = server.get("/api/v1/meta").json();
    let end = meta["trace"]["duration_ns"].as_u64().unwrap();
    let usage = rep["stats"]["loaded_vs_used"]["tensors"].as_array().expect("loaded vs used per tensor");
    let io = rep["io"]["tensors"].as_array().unwrap();
    let (mut unused_seen, mut disk_seen) = (0, 0);
    for tensor in meta["tensors"].as_array().unwrap() {
        let (y0, size) = (tensor["y0"].as_u64().unwrap(), tensor["size"].as_u64().unwrap());
        let name = tensor["name"].as_str().unwrap();
        let cell = server
            .get(&format!("/api/v1/memmap/cell?track=disk&x=time&x_from=0&x_to={end}&y_from={y0}&y_to={}", y0 + size))
            .json();
        let hit = cell["tensors"].as_array().unwrap().iter().find(|x| x["name"] == name).unwrap().clone();
        let u = usage.iter().find(|u| u["name"] == name).unwrap();
        assert_eq!(hit["unused_bytes"], u["loaded_unused"], "{name} loaded, never used");
        unused_seen += usize::from(u["loaded_unused"].as_u64() > Some(0));
        let read = io
            .iter()
            .find(|x| x["model"] == tensor["model"] && x["tensor"] == tensor["id"])
            .map_or(0, |x| x["bytes_read"].as_u64().unwrap());
        assert_eq!(hit["disk_bytes"].as_u64(), Some(read), "{name} read from disk");
        disk_seen += usize::from(read > 0);
    }
    // A cold run: tensors were read from disk, and the page cache brought in
    // bytes no op read.
    assert!(disk_seen > 0 && unused_seen > 0, "disk {disk_seen}, unused {unused_seen}");
    server.stop();
}
