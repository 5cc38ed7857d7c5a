//! The per-tensor, layer and component tables against the per-ubatch
//! figures, on a synthetic MoE trace: an embedding lookup, a plain matrix, a
//! view of half a matrix, an expert tensor with recorded routing and one
//! without.

use std::{fs, path::Path};

use indicatif::ProgressBar;
use tracer_common::{CallEvent, EventHeader, EventKind, SLOT_DST, TensorRecord, markers};

use super::*;
use crate::{
    analyze::{analyze, summary::Summary},
    events::{OpRecord, RoutingRecord},
    format::{Header, Memory, ModelTable, ModelTensor, TraceReader, TraceWriter, Trailer, frames::FORMAT_VERSION},
};

const BASE: u64 = 0x7000_0000;
/// Op names, by the ids below.
const OPS: [&str; 5] = ["NONE", "GET_ROWS", "MUL_MAT", "MUL_MAT_ID", "ARGSORT"];
const GET_ROWS: i32 = 1;
const MUL_MAT: i32 = 2;
const MUL_MAT_ID: i32 = 3;
const ARGSORT: i32 = 4;
const F32: i32 = 0;
const I32: i32 = 26;
/// 16 rows of 64 F32: 256 bytes a row.
const ROW: u64 = 256;
/// An expert's slice of `ffn_up_exps`: 8 rows of 64 F32.
const SLICE: u64 = 2048;
const EXPERTS: u64 = 4;
const K: i64 = 2;

/// (name, file offset, ne, layer, component); F32, contiguous.
type Spec = (&'static str, u64, [i64; 4], Option<u32>, &'static str);
const TENSORS: [Spec; 5] = [
    ("token_embd.weight", 0, [64, 16, 1, 1], None, "token_embd"),
    ("blk.0.attn_q.weight", 0x1000, [64, 64, 1, 1], Some(0), "attn_q"),
    ("blk.0.ffn_up_exps.weight", 0x5000, [64, 8, 4, 1], Some(0), "ffn_up_exps"),
    ("blk.1.attn_q.weight", 0x7000, [64, 64, 1, 1], Some(1), "attn_q"),
    ("blk.1.ffn_up_exps.weight", 0xb000, [64, 8, 4, 1], Some(1), "ffn_up_exps"),
];

fn record(name: &str, data: u64, slot: u32, op: i32, type_: i32, ne: [i64; 4]) -> TensorRecord {
    let mut bytes = [0u8; 64];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    let mut nb = [4u64; 4];
    for i in 1..4 {
        nb[i] = nb[i - 1] * ne[i - 1] as u64;
    }
    TensorRecord {
        tensor: data ^ 0xfff,
        data,
        ne,
        nb,
        view_src: 0,
        view_offs: 0,
        extra: 0,
        type_,
        op,
        op_param0: 0,
        flags: 0,
        slot,
        _pad: 0,
        name: bytes,
    }
}

/// Source `slot` reading model tensor `i` through a view of shape `ne`.
fn weight(i: usize, slot: u32, ne: [i64; 4]) -> TensorRecord {
    let (name, offset, ..) = TENSORS[i];
    record(name, BASE + offset, slot, 0, F32, ne)
}

fn table() -> ModelTable {
    let tensors = TENSORS
        .iter()
        .map(|&(name, file_offset, ne, layer, component)| {
            let size_bytes = 4 * ne.iter().product::<i64>() as u64;
            ModelTensor {
                name: name.into(),
                file: 0,
                file_offset,
                size_bytes,
                type_name: "F32".into(),
                shape: ne.iter().map(|&n| n as u64).filter(|&n| n > 1).collect(),
                layer,
                component: component.into(),
                expert_bytes: component.ends_with("_exps").then_some(size_bytes / EXPERTS),
            }
        })
        .collect();
    ModelTable { files: vec!["/m/moe.gguf".into()], tensors, ..Default::default() }
}

fn memory(r: &TensorRecord) -> Memory {
    let Some(off) = r.data.checked_sub(BASE) else { return Memory::Anon };
    let i = TENSORS.iter().rposition(|t| t.1 <= off).unwrap_or(0);
    Memory::ModelFile { model: 0, tensor: i as u32, offset: off - TENSORS[i].1 }
}

/// A prompt of 3 tokens and two generated ones. Layer 0's routing is
/// recorded (one ranking per token), layer 1's is not.
pub(crate) fn synthetic(path: &Path, rankings: &[Vec<Vec<i32>>]) {
    let header = Header {
        format_version: FORMAT_VERSION,
        pid: 42,
        command: vec!["llama-completion".into()],
        op_names: OPS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let mut w = TraceWriter::create(fs::File::create(path).unwrap(), &header).unwrap();
    w.model(&table()).unwrap();
    let at = |ts: u64, kind: EventKind| EventHeader { kind: kind as u32, cpu: 0, ts_ns: ts, tgid: 42, tid: 7 };
    let mut ts = 10_000;
    for (u, tokens) in rankings.iter().enumerate() {
        let n = tokens.len() as i64;
        let ids: Vec<i32> = (0..n as i32).map(|i| (3 * i + u as i32) % 16).collect();
        for cookie in [markers::LLAMA_DECODE, markers::SCHED_GRAPH_COMPUTE] {
            w.marker(&CallEvent { header: at(ts, EventKind::Call), cookie, args: [0, 1, 0, 0, 0, 0] }).unwrap();
            ts += 10;
        }
        let x = |name: &str, data: u64, slot: u32| record(name, data, slot, 0, F32, [64, n, 1, 1]);
        let experts = record("ffn_moe_topk-0", 0x600, 2, 0, I32, [K, n, 1, 1]);
        let argsort = record("ffn_moe_argsort-0", 0x500, SLOT_DST, ARGSORT, I32, [EXPERTS as i64, n, 1, 1]);
        let ops = [
            vec![
                record("inp_embd", 0x200, SLOT_DST, GET_ROWS, F32, [64, n, 1, 1]),
                weight(0, 0, [64, 16, 1, 1]),
                record("inp_tokens", 0x100, 1, 0, I32, [n, 1, 1, 1]),
            ],
            vec![record("Qcur-0", 0x300, SLOT_DST, MUL_MAT, F32, [64, n, 1, 1]), weight(1, 0, [64, 64, 1, 1])],
            vec![argsort, x("logits-0", 0x400, 0)],
            vec![
                record("ffn_moe_up-0", 0x700, SLOT_DST, MUL_MAT_ID, F32, [8, K, n, 1]),
                weight(2, 0, [64, 8, 4, 1]),
                x("x-0", 0x800, 1),
                experts,
            ],
            // Half of blk.1.attn_q, through a view.
            vec![record("Qcur-1", 0x900, SLOT_DST, MUL_MAT, F32, [32, n, 1, 1]), weight(3, 0, [64, 32, 1, 1])],
            vec![
                record("ffn_moe_up-1", 0xa00, SLOT_DST, MUL_MAT_ID, F32, [8, K, n, 1]),
                weight(4, 0, [64, 8, 4, 1]),
                x("x-1", 0xb00, 1),
                record("ffn_moe_topk-1", 0xc00, 2, 0, I32, [K, n, 1, 1]),
            ],
        ];
        for tensors in ops {
            let is_argsort = tensors[0].tensor == argsort.tensor;
            let op =
                OpRecord { header: at(ts, EventKind::Op), ith: 0, nth: 1, hook: 0, token_ids: ids.clone(), tensors };
            w.op(&op, &mut memory).unwrap();
            ts += 10;
            if is_argsort {
                for (row, ranking) in tokens.iter().enumerate() {
                    let header = at(ts, EventKind::Routing);
                    let r = RoutingRecord { header, tensor: argsort.tensor, row: row as u32, experts: ranking.clone() };
                    w.routing(&r).unwrap();
                }
            }
        }
        let call =
            CallEvent { header: at(ts, EventKind::Call), cookie: markers::SCHED_GRAPH_COMPUTE_RETURN, args: [0; 6] };
        w.marker(&call).unwrap();
        ts += 100;
    }
    w.finish(&Trailer { end_monotonic_ns: ts, ..Default::default() }).unwrap();
}

#[test]
fn tables_charge_what_the_ubatches_charge() {
    let dir = std::env::temp_dir().join(format!("ttrace-stats-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("moe.data");
    let prompt = vec![vec![0, 1, 2, 3], vec![1, 0, 3, 2], vec![2, 1, 0, 3]];
    let generated = [vec![vec![3, 1, 0, 2]], vec![vec![0, 2, 1, 3]]];
    synthetic(&trace, &[prompt, generated[0].clone(), generated[1].clone()]);
    let a = analyze(TraceReader::open(&trace).unwrap()).unwrap();
    let s = collect(&trace, &a, &ProgressBar::hidden()).unwrap();
    fs::remove_dir_all(&dir).unwrap();

    let phases: Vec<_> = s.ubatches.iter().map(|u| u.phase).collect();
    assert_eq!(phases, [Some(Phase::Prompt), Some(Phase::Generate), Some(Phase::Generate)]);
    let tensor = |name: &str| s.tensors.iter().find(|t| t.name == name).unwrap();
    let component = |key: &str| s.components.iter().find(|g| g.key == key).unwrap();
    // One row per generated token, not the 4 KiB table.
    assert_eq!(tensor("token_embd.weight").generate_weight_bytes, 2 * ROW);
    assert_eq!((component("token_embd").bytes_per_token, component("token_embd").upper_bound), (ROW as f64, false));
    // Two experts of four per token, routed; the view reads half the matrix.
    assert_eq!(tensor("blk.0.ffn_up_exps.weight").generate_weight_bytes, 2 * 2 * SLICE);
    assert!(!tensor("blk.0.ffn_up_exps.weight").upper_bound);
    assert_eq!(tensor("blk.1.attn_q.weight").bytes_per_token, (64 * 32 * 4) as f64);
    // Routing lost: whole, and marked an upper bound up to the component.
    assert_eq!(tensor("blk.1.ffn_up_exps.weight").generate_weight_bytes, 2 * EXPERTS * SLICE);
    assert!(tensor("blk.1.ffn_up_exps.weight").upper_bound && component("ffn_up_exps").upper_bound);
    assert!(s.ubatches.iter().all(|u| u.upper_bound));
    assert!(s.notes.iter().any(|n| n.contains("upper bound")));
    // The prompt's three tokens: three embedding rows, three distinct experts.
    let prompt_bytes = 3 * ROW + 64 * 64 * 4 + 3 * SLICE + 64 * 32 * 4 + EXPERTS * SLICE;
    assert_eq!(s.ubatches[0].weight_bytes, prompt_bytes);

    // Every table sums to the generate ubatches, to the byte.
    let ubatches: u64 = s.ubatches.iter().filter(|u| u.phase == Some(Phase::Generate)).map(|u| u.weight_bytes).sum();
    let per_token = ROW + 64 * 64 * 4 + 2 * SLICE + 64 * 32 * 4 + EXPERTS * SLICE;
    assert_eq!(ubatches, 2 * per_token);
    for sum in [
        s.tensors.iter().map(|t| t.generate_weight_bytes).sum::<u64>(),
        s.layers.iter().map(|g| g.generate_weight_bytes).sum(),
        s.components.iter().map(|g| g.generate_weight_bytes).sum(),
    ] {
        assert_eq!(sum, ubatches);
    }
    let mean: f64 = s.components.iter().map(|g| g.bytes_per_token).sum();
    assert_eq!(mean, per_token as f64);
    assert_eq!(Summary::new(&a, "moe.data", None).weight_bytes_per_token, per_token);
}
