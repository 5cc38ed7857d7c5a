//! Every export format on a synthetic trace (no root, no llama.cpp): a
//! warm-up, a prompt and two generate ubatches over a two-layer model. The
//! real-trace checks (Perfetto bindings, pyarrow, Chromium) are in
//! tests/python/test_exports.py.

use std::{fs, path::Path};

use prost::Message;
use tracer_common::{CallEvent, EventHeader, EventKind, SLOT_DST, TensorRecord, markers};
use ttrace::{
    analyze,
    events::OpRecord,
    export::{self, Format, perfetto::proto::TracePacket},
    format::{
        Header, Memory, Mode, ModelTable, ModelTensor, StopReason, TraceReader, TraceWriter, Trailer,
        frames::FORMAT_VERSION,
    },
};

const BASE: u64 = 0x7000_0000;

fn tensor(name: &str, data: u64, slot: u32, op: i32) -> TensorRecord {
    let mut bytes = [0u8; 64];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    TensorRecord {
        tensor: data ^ 0xfff,
        data,
        ne: [64, 64, 1, 1],
        nb: [4, 256, 16384, 16384],
        view_src: 0,
        view_offs: 0,
        extra: 0,
        type_: 0,
        op,
        op_param0: 0,
        flags: 0,
        slot,
        _pad: 0,
        name: bytes,
    }
}

fn model_tensor(name: &str, offset: u64, layer: Option<u32>, component: &str) -> ModelTensor {
    ModelTensor {
        name: name.into(),
        file: 0,
        file_offset: offset,
        size_bytes: 16384,
        type_name: "F32".into(),
        shape: vec![64, 64],
        layer,
        component: component.into(),
        expert_bytes: None,
    }
}

fn synthetic(path: &Path) {
    let header = Header {
        format_version: FORMAT_VERSION,
        mode: Mode::Run,
        pid: 42,
        command: vec!["/bin/llama-completion".into()],
        start_monotonic_ns: 1_000,
        op_names: vec!["NONE".into(), "GET_ROWS".into(), "MUL_MAT".into()],
        ..Default::default()
    };
    let mut w = TraceWriter::create(fs::File::create(path).unwrap(), &header).unwrap();
    let table = ModelTable {
        files: vec!["/m/model.gguf".into()],
        tensors: vec![
            model_tensor("token_embd.weight", 0x1000, None, "token_embd"),
            model_tensor("blk.0.attn_q.weight", 0x5000, Some(0), "attn_q"),
            model_tensor("blk.1.attn_q.weight", 0x9000, Some(1), "attn_q"),
        ],
        ..Default::default()
    };
    w.model(&table).unwrap();
    let memory = |r: &TensorRecord| {
        if r.data >= BASE {
            let off = r.data - BASE;
            let t = [0x1000u64, 0x5000, 0x9000].iter().rposition(|&o| o <= off).unwrap();
            Memory::ModelFile { model: 0, tensor: t as u32, offset: off - [0x1000u64, 0x5000, 0x9000][t] }
        } else {
            Memory::Anon
        }
    };
    let mut ts = 10_000;
    let marker = |w: &mut TraceWriter<fs::File>, ts: u64, cookie: u64| {
        let header = EventHeader { kind: EventKind::Call as u32, cpu: 0, ts_ns: ts, tgid: 42, tid: 7 };
        w.marker(&CallEvent { header, cookie, args: [0, 1, 0, 0, 0, 0] }).unwrap();
    };
    // Warm-up (2 tokens), reset, prompt (3 tokens), 2 generate tokens.
    for (i, n_tokens) in [2i64, 3, 1, 1].into_iter().enumerate() {
        if i == 1 {
            marker(&mut w, ts, markers::LLAMA_PERF_RESET);
            ts += 10;
        }
        marker(&mut w, ts, markers::LLAMA_DECODE);
        marker(&mut w, ts + 10, markers::SCHED_GRAPH_COMPUTE);
        let mut ids = tensor("inp_tokens", 0x100, 1, 0);
        ids.ne = [n_tokens, 1, 1, 1];
        ids.type_ = 26;
        ids.nb = [4, 4 * n_tokens as u64, 4 * n_tokens as u64, 4 * n_tokens as u64];
        let ops = [
            vec![tensor("inp_embd", 0x200, SLOT_DST, 1), tensor("token_embd.weight", BASE + 0x1000, 0, 0), ids],
            vec![tensor("Qcur-0", 0x300, SLOT_DST, 2), tensor("blk.0.attn_q.weight", BASE + 0x5000, 0, 0)],
            vec![tensor("Qcur-1", 0x400, SLOT_DST, 2), tensor("blk.1.attn_q.weight", BASE + 0x9000, 0, 0)],
        ];
        for (k, tensors) in ops.into_iter().enumerate() {
            let header =
                EventHeader { kind: EventKind::Op as u32, cpu: 0, ts_ns: ts + 20 + 10 * k as u64, tgid: 42, tid: 7 };
            let op = OpRecord { header, ith: 0, nth: 1, hook: 0, token_ids: (0..n_tokens as i32).collect(), tensors };
            w.op(&op, &mut |r| memory(r)).unwrap();
        }
        marker(&mut w, ts + 60, markers::SCHED_GRAPH_COMPUTE_RETURN);
        ts += 100;
    }
    w.finish(&Trailer {
        stop_reason: StopReason::TargetExited,
        exit_code: Some(0),
        end_monotonic_ns: ts,
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn every_format_from_one_synthetic_trace() {
    let dir = std::env::temp_dir().join(format!("ttrace-export-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.data");
    synthetic(&trace);
    let a = analyze::analyze(TraceReader::open(&trace).unwrap()).unwrap();
    assert_eq!((a.prompt_tokens, a.generate_runs, a.ops), (3, 2, 12));
    let opts = export::Options { ubatch: None };

    // CSV: one row per op and marker, ops carry their ubatch and bytes.
    let csv = dir.join("e.csv");
    export::export(&trace, &a, Format::Csv, &csv, &opts).unwrap();
    let text = fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0].split(',').count(), export::columns::COLUMNS.len());
    let ops: Vec<&&str> = lines.iter().filter(|l| l.split(',').nth(1) == Some("op")).collect();
    assert_eq!(ops.len(), 12);
    // GET_ROWS of 1 token reads one 256-byte row of the embedding.
    let get_rows = ops.iter().filter(|l| l.contains("GET_ROWS") && l.contains(",generate,")).count();
    assert_eq!(get_rows, 2);
    assert!(ops.iter().any(|l| l.contains(",GET_ROWS,") && l.contains(",1,0,256,")), "{ops:?}");

    // Perfetto: packets decode; one ubatch slice per ubatch.
    let pf = dir.join("t.pftrace");
    export::export(&trace, &a, Format::Perfetto, &pf, &opts).unwrap();
    let bytes = fs::read(&pf).unwrap();
    let mut rest = &bytes[..];
    let mut ubatch_begins = 0;
    while !rest.is_empty() {
        assert_eq!(rest[0], 0x0a, "Trace.packet field");
        rest = &rest[1..];
        let p = TracePacket::decode_length_delimited(&mut rest).unwrap();
        if let Some(e) = p.track_event
            && e.track_uuid == Some(export::perfetto::UBATCH_UUID)
            && e.r#type == Some(1)
        {
            ubatch_begins += 1;
        }
    }
    assert_eq!(ubatch_begins, 4);

    // tokens-json: the thesis UI's layout, two generated tokens and a prompt.
    let tokens = dir.join("tokens");
    export::export(&trace, &a, Format::TokensJson, &tokens, &opts).unwrap();
    let names = |sub: &str| {
        let mut v: Vec<String> =
            fs::read_dir(tokens.join(sub)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(names("."), ["graphs", "memory-map.json", "traces"]);
    for sub in ["traces", "graphs"] {
        assert_eq!(names(sub), ["prompt-00000.json", "token-00000.json", "token-00001.json"], "{sub}");
    }
    let read =
        |rel: &str| -> serde_json::Value { serde_json::from_slice(&fs::read(tokens.join(rel)).unwrap()).unwrap() };
    // The files are written as bytes: they must be what serde_json writes for
    // the same values (compact, keys sorted, its number forms).
    for sub in ["traces", "graphs"] {
        for name in names(sub) {
            let bytes = fs::read(tokens.join(sub).join(&name)).unwrap();
            let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(String::from_utf8(bytes).unwrap(), serde_json::to_string(&value).unwrap(), "{sub}/{name}");
        }
    }
    let doc = read("traces/token-00001.json");
    assert_eq!(doc["metadata"]["total_entries"], 3);
    assert!(doc["metadata"]["format_version"].is_string());
    let src = &doc["entries"][1]["sources"][0];
    assert_eq!((src["memory_source"].as_str(), src["disk_offset"].as_u64()), (Some("DISK"), Some(0x5000)));
    // The graph: three ops, each output fed by its weight (and the lookup by its ids).
    let graph = read("graphs/token-00001.json");
    let labels: Vec<&str> = graph["nodes"].as_array().unwrap().iter().map(|n| n["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "inp_embd",
            "token_embd.weight",
            "inp_tokens",
            "Qcur-0",
            "blk.0.attn_q.weight",
            "Qcur-1",
            "blk.1.attn_q.weight"
        ]
    );
    let edges: Vec<String> = graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}->{} {}", e["source"].as_str().unwrap(), e["target"].as_str().unwrap(), e["label"]))
        .collect();
    assert_eq!(
        edges,
        [
            "node_1->node_0 \"src 0\"",
            "node_2->node_0 \"src 1\"",
            "node_4->node_3 \"src 0\"",
            "node_6->node_5 \"src 0\""
        ]
    );
    let q1 = &graph["nodes"][5];
    assert_eq!(
        (q1["operation"].as_str(), q1["layer_id"].as_u64(), q1["category"].as_str()),
        (Some("MUL_MAT"), Some(1), Some("attention"))
    );
    assert_eq!((q1["dtype"].as_str(), &q1["shape"]), (Some("f32"), &serde_json::json!([64, 64])));
    assert_eq!(graph["nodes"][1]["category"], "input", "the embedding table feeds the input");
    assert_eq!((graph["metadata"]["total_nodes"].as_u64(), graph["metadata"]["layers"].as_u64()), (Some(7), Some(2)));
    let map = read("memory-map.json");
    assert_eq!((map["model_name"].as_str(), map["metadata"]["n_layers"].as_u64()), (Some("model"), Some(2)));

    // The rest write without error; dot names the graph.
    for (format, name) in [(Format::ChromeJson, "t.json"), (Format::Jsonl, "e.jsonl"), (Format::Parquet, "e.parquet")] {
        export::export(&trace, &a, format, &dir.join(name), &opts).unwrap();
    }
    let chrome: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("t.json")).unwrap()).unwrap();
    assert!(chrome["traceEvents"].as_array().unwrap().len() > 12);
    let dot = dir.join("g.dot");
    export::export(&trace, &a, Format::Dot, &dot, &opts).unwrap();
    assert!(fs::read_to_string(&dot).unwrap().starts_with("digraph ubatch_2 {"));
    assert!(export::export(&trace, &a, Format::Dot, &dot, &export::Options { ubatch: Some(9) }).is_err());
    fs::remove_dir_all(&dir).ok();
}

/// A random mix of decodes (some not decoding), graphs with and without a
/// token lookup, ops outside graphs and perf resets: the row formats' phase
/// scan must settle ubatches exactly as `analyze::analyze` does.
#[test]
fn phase_scan_agrees_with_analyze() {
    let dir = std::env::temp_dir().join(format!("ttrace-phase-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    for seed in 1..=20u64 {
        let trace = dir.join(format!("p{seed}.data"));
        random_trace(&trace, seed);
        let full = analyze::analyze(TraceReader::open(&trace).unwrap()).unwrap();
        let scan = analyze::phases::scan(TraceReader::open(&trace).unwrap()).unwrap();
        let key = |a: &analyze::Analysis| {
            let ubatches: Vec<_> = a
                .ubatches
                .iter()
                .map(|u| (u.index, u.start_ns, u.end_ns, u.decode, u.n_tokens, u.token_ids.clone(), u.phase))
                .collect();
            let decodes: Vec<_> = a
                .decodes
                .iter()
                .map(|d| (d.index, d.ts_ns, d.function, d.ubatches.clone(), d.n_tokens, d.phase))
                .collect();
            let counts = (a.ops, a.faults, a.prompt_tokens, a.generate_runs, a.warmup_decodes, a.truncated);
            (a.header.clone(), ubatches, decodes, counts, a.trailer.clone(), a.models.clone())
        };
        assert_eq!(key(&scan), key(&full), "seed {seed}");
        assert!(full.ubatches.len() > 5, "seed {seed}");
    }
    fs::remove_dir_all(&dir).ok();
}

fn random_trace(path: &Path, mut seed: u64) {
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let header = Header {
        format_version: FORMAT_VERSION,
        start_monotonic_ns: 1_000,
        op_names: vec!["NONE".into(), "GET_ROWS".into(), "MUL_MAT".into()],
        ..Default::default()
    };
    let mut w = TraceWriter::create(fs::File::create(path).unwrap(), &header).unwrap();
    let table = ModelTable {
        files: vec!["/m/model.gguf".into()],
        tensors: vec![model_tensor("token_embd.weight", 0x1000, None, "token_embd")],
        ..Default::default()
    };
    w.model(&table).unwrap();
    let memory = |r: &TensorRecord| match r.data {
        d if d >= BASE => Memory::ModelFile { model: 0, tensor: 0, offset: d - BASE - 0x1000 },
        0x5000 => Memory::Copy { model: 0, tensor: 0 },
        _ => Memory::Anon,
    };
    let mut ts = 10_000;
    for _ in 0..200 {
        ts += 10;
        let header = EventHeader { kind: EventKind::Call as u32, cpu: 0, ts_ns: ts, tgid: 42, tid: 7 };
        let (cookie, decoding) = match next(12) {
            0 => (markers::LLAMA_PERF_RESET, 0),
            1..=3 => (markers::LLAMA_DECODE, 0),
            4..=5 => (markers::LLAMA_PROCESS, next(3)),
            6..=8 => (markers::SCHED_GRAPH_COMPUTE, 0),
            9..=10 => (markers::SCHED_GRAPH_COMPUTE_RETURN, 0),
            _ => (99, 0),
        };
        w.marker(&CallEvent { header, cookie, args: [0, decoding, 0, 0, 0, 0] }).unwrap();
        for _ in 0..next(4) {
            ts += 10;
            let n_tokens = [1i64, 1, 3, 0, -1][next(5) as usize];
            let mut ids = tensor("inp_tokens", 0x100, if next(5) == 0 { 2 } else { 1 }, 0);
            ids.ne = [n_tokens, 1, 1, 1];
            let weight = [BASE + 0x1000, 0x5000, 0x200][next(3) as usize];
            let op = [1, 1, 2][next(3) as usize];
            let mut tensors = vec![tensor("inp_embd", 0x300, SLOT_DST, op), tensor("w", weight, next(2) as u32, 0)];
            if next(4) > 0 {
                tensors.push(ids);
            }
            let header =
                EventHeader { kind: EventKind::Op as u32, cpu: 0, ts_ns: ts, tgid: 42, tid: 7 + next(2) as u32 };
            let token_ids = (0..next(3) as i32).collect();
            let op = OpRecord { header, ith: 0, nth: 1, hook: 0, token_ids, tensors };
            w.op(&op, &mut |r| memory(r)).unwrap();
        }
    }
    if next(2) == 0 {
        w.finish(&Trailer { stop_reason: StopReason::TargetExited, end_monotonic_ns: ts, ..Default::default() })
            .unwrap();
    }
}

/// `ttrace report T | head -1`: a reader that went away is no error, for
/// every stdout writer (text, JSON, gguf tables).
#[test]
fn closed_stdout_is_a_quiet_success() {
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("ttrace-pipe-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.data");
    synthetic(&trace);
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-moe.gguf");
    let runs: [&[&std::ffi::OsStr]; 3] = [
        &["report".as_ref(), trace.as_os_str()],
        &["report".as_ref(), trace.as_os_str(), "--json".as_ref()],
        &["gguf".as_ref(), model.as_os_str(), "--format".as_ref(), "json".as_ref()],
    ];
    for args in runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ttrace"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before ttrace writes: its first write gets EPIPE.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}, stderr {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?} printed on stderr: {stderr}");
    }
}
