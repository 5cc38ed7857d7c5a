use tracer_common::{
    EventHeader, EventKind, GraphEvent, NodeEvent, batch,
    ggml::{FLAG_INPUT, GgmlTensor, TYPE_I32},
    layout::known::TENSOR_2024_12,
};

use super::*;
use crate::events::InputRecord;

const GET_ROWS: i32 = 40;
const MUL: i32 = 7;

fn rules(ubatch: bool) -> Rules {
    Rules { tensor: TENSOR_2024_12.layout, n_ops: 97, get_rows: Some(GET_ROWS), ubatch }
}

fn tensor(name: &str, op: i32, type_: i32, ne0: i64, src: [u64; 2]) -> GgmlTensor {
    // SAFETY: GgmlTensor holds only integers and byte arrays.
    let mut t: GgmlTensor = unsafe { std::mem::zeroed() };
    t.name[..name.len()].copy_from_slice(name.as_bytes());
    t.op = op;
    t.type_ = type_;
    t.ne = [ne0, 1, 1, 1];
    t.nb = [4, 4 * ne0 as u64, 4 * ne0 as u64, 4 * ne0 as u64];
    t.src[..2].copy_from_slice(&src);
    t
}

fn raw(t: &GgmlTensor) -> [u8; 336] {
    // SAFETY: reading the bytes of a repr(C) POD value of that size.
    unsafe { std::mem::transmute_copy(t) }
}

fn header(kind: EventKind) -> EventHeader {
    EventHeader { kind: kind as u32, tid: 7, ..Default::default() }
}

fn graph_event(n_nodes: i32, size: i32, flags: u32) -> Event {
    Event::Graph(GraphEvent {
        header: header(EventKind::Graph),
        cgraph: 0x1000,
        uid: 5,
        n_nodes: n_nodes.max(0) as u32,
        flags,
        raw_n_nodes: n_nodes,
        size,
    })
}

fn node(index: u32, role: u16, address: u64, t: &GgmlTensor) -> Event {
    let tensor = raw(t);
    Event::Node(Box::new(NodeEvent { header: header(EventKind::Node), uid: 5, index, role, cache: 0, address, tensor }))
}

/// The token ids of [`token_graph`]'s runs: 100, 101, …
fn token_ids(n: u64) -> Vec<i32> {
    (0..n as i32).map(|i| 100 + i).collect()
}

fn bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A ubatch of `n_tokens` of sequence 0 from position 0, as its probe sends
/// it: its token, position and sequence arrays.
fn ubatch(n_tokens: u64) -> Vec<Event> {
    let pos: Vec<i32> = (0..n_tokens as i32).collect();
    let seq = vec![0; n_tokens as usize];
    [(batch::TOKEN, token_ids(n_tokens)), (batch::POS, pos), (batch::SEQ, seq)]
        .into_iter()
        .map(|(tensor, values)| {
            Event::Batch(InputRecord { header: header(EventKind::Batch), uid: n_tokens, tensor, data: bytes(&values) })
        })
        .collect()
}

/// A 2-node graph: the token GET_ROWS (reading `token_embd` with `tokens`
/// ids) and a MUL; its sources follow their node.
fn token_graph(tokens: i64) -> Vec<Event> {
    let mut ids = tensor("inp_tokens", 0, TYPE_I32, tokens, [0, 0]);
    ids.flags = FLAG_INPUT;
    let mut table = tensor("token_embd.weight", 0, 0, 64, [0, 0]);
    table.data = 0xd000;
    vec![
        graph_event(2, 0, 0),
        node(0, node_role::NODE, 0xa0, &tensor("inp_embd", GET_ROWS, 0, 64, [0xb0, 0xb8])),
        node(0, node_role::SOURCE, 0xb0, &table),
        node(0, node_role::SOURCE, 0xb8, &ids),
        node(1, node_role::NODE, 0xa8, &tensor("mul-0", MUL, 0, 64, [0xa0, 0xa0])),
        Event::Input(InputRecord {
            header: header(EventKind::Input),
            uid: 5,
            tensor: 0xb8,
            data: bytes(&token_ids(tokens as u64)),
        }),
        graph_event(2, 0, graph::DONE),
    ]
}

/// The model file of these tests: one tensor, `token_embd.weight`, mapped at 0xd000.
fn gguf_name(r: &TensorRecord) -> Option<GgufTensor> {
    (r.data == 0xd000).then(|| GgufTensor { name: "token_embd.weight".into(), type_id: 0, shape: vec![64] })
}

fn admit(gate: &mut Gate, event: Event) -> Result<Admitted, Violation> {
    gate.admit(event, &mut gguf_name)
}

fn feed(gate: &mut Gate, events: Vec<Event>) -> Result<Vec<Admitted>, Violation> {
    events.into_iter().map(|e| admit(gate, e)).collect()
}

#[test]
fn a_right_layout_passes_and_releases_everything_in_order() {
    let mut gate = Gate::open();
    gate.arm(rules(true));
    let mut events = ubatch(3);
    events.extend(token_graph(3));
    let out = feed(&mut gate, events).unwrap();
    let (last, held) = out.split_last().unwrap();
    assert!(held.iter().all(|a| a.record.is_empty()), "held until the verdict");
    assert_eq!(last.record.len(), 10, "released in order");
    assert!(matches!(last.record[0], Event::Batch(_)) && matches!(last.record[9], Event::Graph(_)));
    assert_eq!(last.sequences_off, None);
    assert_eq!(gate.passed, LayoutCheck { graphs: 1, tensors: 4, weights: 1, ubatches: 1 });
    assert!(!gate.checking());
    // Later events pass straight through.
    assert_eq!(admit(&mut gate, ubatch(1).remove(0)).unwrap().record.len(), 1);
}

#[test]
fn an_offset_moved_by_eight_is_caught() {
    let mut gate = Gate::open();
    let mut wrong = rules(false);
    wrong.tensor.name += 8;
    gate.arm(wrong);
    let err = feed(&mut gate, token_graph(3)).map(drop).unwrap_err();
    assert_eq!(err.structure, "ggml_tensor");
    // The name read 8 bytes on is still text: the model file's name tells.
    assert!(err.what.contains("named \"bd.weight\" at offset 264"), "{err:?}");
    assert!(err.what.contains("the model file has \"token_embd.weight\""), "{err:?}");

    // ne read 8 bytes on: every count still >= 1, but not the file's shape.
    let mut gate = Gate::open();
    let mut wrong = rules(false);
    wrong.tensor.ne += 8;
    gate.arm(wrong);
    let err = feed(&mut gate, token_graph(3)).map(drop).unwrap_err();
    assert!(err.what.contains("has ne [1, 1, 1, 4] at offset 24, not [64]"), "{err:?}");
}

#[test]
fn a_ubatch_that_does_not_match_its_graph_turns_sequences_off() {
    let mut gate = Gate::open();
    gate.arm(rules(true));
    let mut events = ubatch(9);
    events.extend(token_graph(3));
    let out = feed(&mut gate, events).unwrap();
    let last = out.last().unwrap();
    assert!(last.sequences_off.as_deref().unwrap().contains("n_tokens (9)"), "{:?}", last.sequences_off);
    assert!(!last.record.iter().any(|e| matches!(e, Event::Batch(_))), "ubatch records dropped");
    assert_eq!(last.record.len(), 7, "the graph is kept");
}

#[test]
fn a_ubatch_whose_token_ids_are_not_its_graphs_turns_sequences_off() {
    // A layout on trial whose `token` offset reads another array of the
    // same length: n_tokens matches, the ids do not.
    let mut gate = Gate::open();
    gate.arm(rules(true));
    let mut events = ubatch(3);
    let Event::Batch(token) = &mut events[0] else { unreachable!() };
    token.data = bytes(&[0, 1, 2]);
    events.extend(token_graph(3));
    let last = feed(&mut gate, events).unwrap().pop().unwrap();
    let why = last.sequences_off.expect("sequences off");
    assert!(why.contains("token ids [0, 1, 2] are not its graph's [100, 101, 102]"), "{why}");
    assert!(!last.record.iter().any(|e| matches!(e, Event::Batch(_))));
}

#[test]
fn no_ubatch_within_a_few_graphs_turns_sequences_off() {
    let mut gate = Gate::open();
    gate.arm(rules(true));
    let mut released = 0;
    for round in 0..=UBATCH_GRAPHS {
        for admitted in feed(&mut gate, token_graph(3)).unwrap() {
            released += admitted.record.len();
            if let Some(why) = admitted.sequences_off {
                assert_eq!(round, UBATCH_GRAPHS);
                assert!(why.contains("no ubatch matched"), "{why}");
            }
        }
    }
    assert_eq!(released, 7 * (UBATCH_GRAPHS as usize + 1));
}

#[test]
fn a_cgraph_read_wrong_is_refused() {
    let mut gate = Gate::open();
    gate.arm(rules(false));
    let err = admit(&mut gate, graph_event(900, 512, 0)).map(drop).unwrap_err();
    assert_eq!(err.structure, "ggml_cgraph");
    assert!(err.what.contains("n_nodes 900"), "{err:?}");
    // A view (size 0) holds any count; a node that is no op is refused.
    let mut gate = Gate::open();
    gate.arm(rules(false));
    admit(&mut gate, graph_event(1, 0, 0)).unwrap();
    let err = admit(&mut gate, node(0, node_role::NODE, 0xa0, &tensor("leaf", 0, 0, 4, [0, 0]))).map(drop).unwrap_err();
    assert!(err.what.contains("op NONE"), "{err:?}");
}

#[test]
fn a_node_start_outside_its_team_is_refused() {
    let start = |ith, nth| {
        Event::Op(tracer_common::OpEvent { header: header(EventKind::Op), node: 0xa0, ith, nth, ..Default::default() })
    };
    let mut gate = Gate::open();
    gate.arm(rules(false));
    admit(&mut gate, start(1, 2)).unwrap();
    for (ith, nth) in [(0, 0), (2, 2), (0, 1 << 20)] {
        let mut gate = Gate::open();
        gate.arm(rules(false));
        let err = admit(&mut gate, start(ith, nth)).map(drop).unwrap_err();
        assert_eq!(err.structure, "ggml_compute_params", "{ith} of {nth}");
    }
}

#[test]
fn tensor_invariants() {
    let r = rules(false);
    let ok = |t: &GgmlTensor| check_tensor(&TensorRecord::of(0x10, t, 0), &r);
    let good = tensor("blk.0.attn_q.weight", MUL, 0, 64, [0, 0]);
    assert_eq!(ok(&good), Ok(()));
    let mut t = good;
    t.name = [b'a'; 64];
    assert!(ok(&t).unwrap_err().what.contains("not NUL-terminated"));
    let mut t = good;
    t.name[2] = 0x90;
    assert!(ok(&t).unwrap_err().what.contains("byte 0x90"));
    let mut t = good;
    t.ne[3] = 0;
    assert_eq!(ok(&t), Ok(()), "an empty tensor");
    t.ne[3] = -1;
    assert!(ok(&t).unwrap_err().what.contains("ne[3]"));
    t.ne[3] = 1 << 41;
    assert!(ok(&t).unwrap_err().what.contains("not a count"));
    let mut t = good;
    t.nb[0] = 8;
    assert!(ok(&t).unwrap_err().what.contains("nb[0]"));
    t.view_src = 0x99;
    assert_eq!(ok(&t), Ok(()), "a view (a permute) may have any nb[0]");
    let mut t = good;
    t.op = 97;
    assert!(ok(&t).unwrap_err().what.contains("op table"));
    let mut t = good;
    t.type_ = 4;
    assert!(ok(&t).unwrap_err().what.contains("not a ggml type"));
}

#[test]
fn the_end_of_the_trace_drops_what_nothing_vouched_for() {
    let mut gate = Gate::open();
    gate.arm(rules(true));
    let fault =
        Event::PageFault(tracer_common::PageFaultEvent { header: header(EventKind::PageFault), ..Default::default() });
    // Before any record the layouts shape, the rest passes (an idle server).
    assert_eq!(admit(&mut gate, fault.clone()).unwrap().record.len(), 1);
    for e in ubatch(2).into_iter().chain([fault, graph_event(2, 0, 0)]) {
        assert!(admit(&mut gate, e).unwrap().record.is_empty());
    }
    let end = gate.finish();
    assert_eq!(end.record.len(), 1, "only the fault: no graph checked the rest");
    assert!(matches!(end.record[0], Event::PageFault(_)));
}

#[test]
fn graphs_that_never_read_whole_are_refused() {
    let mut gate = Gate::open();
    gate.arm(rules(false));
    for _ in 1..UNREAD_GRAPHS {
        feed(&mut gate, vec![graph_event(0, 0, 0), graph_event(0, 0, graph::DONE)]).unwrap();
    }
    let err = feed(&mut gate, vec![graph_event(0, 0, 0), graph_event(0, 0, graph::DONE)]).map(drop).unwrap_err();
    assert_eq!(err.structure, "ggml_cgraph");
    assert!(err.what.contains("none could be read whole"), "{err:?}");
}
