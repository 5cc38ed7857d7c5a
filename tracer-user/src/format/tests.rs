use tracer_common::{CallEvent, EventHeader, EventKind, PageFaultEvent, SLOT_DST, TensorRecord};

use super::{frames::FrameKind, *};
use crate::events::OpRecord;

pub(super) fn header() -> Header {
    Header {
        format_version: frames::FORMAT_VERSION,
        ttrace_version: "test".into(),
        mode: super::Mode::Run,
        pid: 42,
        start_monotonic_ns: 1_000,
        op_names: vec!["NONE".into(), "MUL_MAT".into()],
        ..Default::default()
    }
}

pub(super) fn tensor(name: &str, data: u64, slot: u32) -> TensorRecord {
    let mut bytes = [0u8; 64];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    TensorRecord {
        tensor: data ^ 0xff,
        data,
        ne: [64, 64, 1, 1],
        nb: [2, 128, 8192, 8192],
        view_src: 0,
        view_offs: 0,
        extra: 0,
        type_: 1,
        op: if slot == SLOT_DST { 1 } else { 0 },
        op_param0: 0,
        flags: 0,
        slot,
        _pad: 0,
        name: bytes,
    }
}

pub(super) fn op(ts: u64, tid: u32, tensors: Vec<TensorRecord>) -> OpRecord {
    OpRecord {
        header: EventHeader { kind: EventKind::Op as u32, cpu: 0, ts_ns: ts, tgid: 42, tid },
        ith: 0,
        nth: 2,
        hook: 0,
        token_ids: vec![1, 290],
        tensors,
    }
}

pub(super) fn memory_of(r: &TensorRecord) -> Memory {
    if r.data >= 0x7000 { Memory::ModelFile { model: 0, tensor: 3, offset: r.data - 0x7000 } } else { Memory::Anon }
}

/// A small trace: a model, two ops sharing a weight, a marker, a fault.
fn sample() -> Vec<u8> {
    let mut w = TraceWriter::create(Vec::new(), &header()).unwrap();
    w.model(&ModelTable { files: vec!["m.gguf".into()], ..Default::default() }).unwrap();
    let weight = tensor("blk.0.attn_q.weight", 0x7040, 0);
    let call = CallEvent {
        header: EventHeader { kind: EventKind::Call as u32, cpu: 1, ts_ns: 1_500, tgid: 42, tid: 7 },
        cookie: 1,
        args: [0xaa, 0xbb, 0, 0, 0, 0],
    };
    w.marker(&call).unwrap();
    w.op(&op(2_000, 7, vec![tensor("Qcur-0", 0x100, SLOT_DST), weight, tensor("norm-0", 0x200, 1)]), &mut memory_of)
        .unwrap();
    // Slightly out-of-order timestamps across CPUs must survive.
    w.op(&op(1_900, 8, vec![tensor("Kcur-0", 0x300, SLOT_DST), weight]), &mut memory_of).unwrap();
    let fault = PageFaultEvent {
        header: EventHeader { kind: EventKind::PageFault as u32, cpu: 0, ts_ns: 2_100, tgid: 42, tid: 7 },
        address: 0x7040,
        ip: 0x1234,
        error_code: 4,
    };
    let pos = FilePos { model: 0, file: 0, offset: 0x40 };
    w.fault(&fault, Memory::ModelFile { model: 0, tensor: 3, offset: 0x40 }, Some(pos)).unwrap();
    w.lost(Lost { call: 0, page_fault: 1, op: 2, page_cache: 0, block: 0, value: 3 }).unwrap();
    assert_eq!(w.stats.ops, 2);
    assert_eq!(w.stats.descriptors, 4, "the shared weight is defined once");
    w.finish(&Trailer { stop_reason: super::StopReason::TargetExited, exit_code: Some(0), ..Default::default() })
        .unwrap()
}

fn read_all(bytes: &[u8]) -> Result<(TraceReader<&[u8]>, Vec<Record>), TraceError> {
    let mut r = TraceReader::new(bytes)?;
    let mut records = Vec::new();
    while let Some(rec) = r.next_record()? {
        records.push(rec);
    }
    Ok((r, records))
}

#[test]
fn round_trips_every_frame_kind() {
    let bytes = sample();
    let (r, records) = read_all(&bytes).unwrap();
    assert!(!r.truncated);
    assert_eq!(r.header(), &header());
    assert_eq!(records.len(), 7);
    assert!(matches!(&records[0], Record::Model(0)));
    let Record::Marker(m) = &records[1] else { panic!("{:?}", records[1]) };
    assert_eq!((m.ts_ns, m.tid, m.cookie, m.args), (1_500, 7, 1, [0xaa, 0xbb, 0]));
    let Record::Op(first) = &records[2] else { panic!() };
    assert_eq!((first.ts_ns, first.tid, first.token_ids.clone()), (2_000, 7, vec![1, 290]));
    assert_eq!(r.descriptor(first.dst).name, "Qcur-0");
    let (slot, weight) = first.srcs[0];
    assert_eq!(slot, 0);
    assert_eq!(r.descriptor(weight).name, "blk.0.attn_q.weight");
    assert_eq!(r.descriptor(weight).memory, Memory::ModelFile { model: 0, tensor: 3, offset: 0x40 });
    assert_eq!(r.descriptor(first.srcs[1].1).memory, Memory::Anon);
    let Record::Op(second) = &records[3] else { panic!() };
    assert_eq!((second.ts_ns, second.tid), (1_900, 8));
    assert_eq!(second.srcs[0].1, weight);
    assert!(matches!(&records[4], Record::Fault(f) if f.address == 0x7040 && f.ts_ns == 2_100
        && f.file == Some(FilePos { model: 0, file: 0, offset: 0x40 })
        && f.memory == Memory::ModelFile { model: 0, tensor: 3, offset: 0x40 }));
    assert!(matches!(&records[5], Record::Lost(l) if l.total() == 6 && l.value == 3));
    assert!(matches!(&records[6], Record::End(t) if t.exit_code == Some(0)));
}

#[test]
fn a_value_frame_round_trips_with_its_fingerprint() {
    use super::values::{Fingerprint, encode_tail};
    let mut w = TraceWriter::create(Vec::new(), &header()).unwrap();
    let fp = Fingerprint {
        elements: 4096,
        blake3: [7; 32],
        sum: -1.5,
        rms: 0.25,
        min: -3.0,
        max: f64::INFINITY,
        nan: 0,
        inf: 1,
        first: vec![1.0, 2.0, 3.0],
        last: vec![4.0, 5.0, f32::INFINITY],
        projection: std::array::from_fn(|i| i as f32),
    };
    let (mul, rms) = (tensor("norm-0", 0x100, SLOT_DST), tensor("attn_norm-0", 0x200, SLOT_DST));
    let mut tail = Vec::new();
    encode_tail(&mut tail, 0x1ad85, 2, 1, Some(&fp));
    w.value((3_000, 9), 0, Some(17), &mul, Some(&rms), &tail, &mut |_| Memory::Anon).unwrap();
    let mut tail = Vec::new();
    encode_tail(&mut tail, 0x1ad85, 8, 0, None);
    w.value((3_100, 9), 0, None, &rms, None, &tail, &mut |_| Memory::Anon).unwrap();
    let bytes = w.finish(&Trailer::default()).unwrap();
    let (r, records) = read_all(&bytes).unwrap();
    let Record::Value(v) = &records[0] else { panic!("{:?}", records[0]) };
    assert_eq!(
        (v.ts_ns, v.tid, v.graph, v.node_index, v.site, v.flags, v.superseded),
        (3_000, 9, 0, Some(17), 0x1ad85, 2, 1)
    );
    assert_eq!(r.descriptor(v.dst).name, "norm-0");
    assert_eq!(v.fused.map(|f| r.descriptor(f).name.clone()).as_deref(), Some("attn_norm-0"));
    assert_eq!(v.fingerprint.as_ref(), Some(&fp));
    let Record::Value(v) = &records[1] else { panic!("{:?}", records[1]) };
    assert_eq!((v.node_index, v.fused, v.flags, v.fingerprint.is_none()), (None, None, 8, true));
}

#[test]
fn a_trace_cut_at_any_byte_reads_up_to_its_last_complete_frame() {
    let bytes = sample();
    let (_, full) = read_all(&bytes).unwrap();
    let header_len = 12 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    for cut in header_len..bytes.len() {
        let (r, records) = read_all(&bytes[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert!(r.truncated, "cut at {cut}");
        assert_eq!(records, full[..records.len()], "cut at {cut}: a prefix of the full trace");
    }
    for cut in 0..header_len {
        assert!(read_all(&bytes[..cut]).is_err(), "cut inside the header at {cut} is an error");
    }
}

#[test]
fn rejects_foreign_files_and_dangling_references() {
    assert!(matches!(TraceReader::new(&b"PERFILE2........"[..]), Err(TraceError::Magic)));
    let mut newer = sample();
    newer[7] = 9;
    assert!(matches!(TraceReader::new(&newer[..]), Err(TraceError::Version(9))));

    // An op frame naming a descriptor that was never defined.
    let mut bytes = TraceWriter::create(Vec::new(), &header()).unwrap().finish(&Trailer::default()).unwrap();
    let end = bytes.split_off(bytes.len() - (bytes.len() - find_end(&bytes)));
    bytes.extend_from_slice(&[FrameKind::Thread as u8, 1, 7, FrameKind::Op as u8, 8, 0, 0, 0, 0, 0, 5, 0, 0]);
    bytes.extend_from_slice(&end);
    let err = read_all(&bytes).err().expect("dangling descriptor");
    assert!(err.to_string().contains("descriptor 5 not defined"), "{err}");
}

/// Offset of the END frame in a trace with no other frames.
fn find_end(bytes: &[u8]) -> usize {
    12 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize
}

#[test]
fn a_maps_frame_becomes_the_header_snapshot() {
    let maps = "7f0000000000-7f0000100000 r--p 00000000 fe:00 12 /models/m.gguf\n";
    let mut w = TraceWriter::create(Vec::new(), &header()).unwrap();
    w.maps(maps).unwrap();
    let bytes = w.finish(&Trailer::default()).unwrap();
    let (r, records) = read_all(&bytes).unwrap();
    assert_eq!(r.header().maps, maps);
    assert_eq!(records.len(), 1, "only the trailer is a record: {records:?}");
}

#[test]
fn version_1_traces_read_and_newer_ones_are_refused_by_name() {
    // Version 1 (per-node ops, no GRAPH/COMPUTE/ROUTING frames) is a subset of 2.
    for version in [1, frames::FORMAT_VERSION] {
        let mut w = TraceWriter::create(Vec::new(), &Header { format_version: version, ..header() }).unwrap();
        w.op(&op(2_000, 7, vec![tensor("Qcur-0", 0x100, SLOT_DST)]), &mut memory_of).unwrap();
        let bytes = w.finish(&Trailer::default()).unwrap();
        let (_, records) = read_all(&bytes).unwrap();
        assert!(records.iter().any(|r| matches!(r, Record::Op(_))), "version {version}");
    }
    let newer = frames::FORMAT_VERSION + 1;
    let w = TraceWriter::create(Vec::new(), &Header { format_version: newer, ..header() }).unwrap();
    let bytes = w.finish(&Trailer::default()).unwrap();
    let err = read_all(&bytes).err().expect("a newer format is refused").to_string();
    assert!(err.contains(&format!("version {newer}")) && err.contains("reads versions 1 to"), "{err}");
}

#[test]
fn routing_frames_round_trip_and_name_their_argsort_node() {
    let mut w = TraceWriter::create(Vec::new(), &header()).unwrap();
    let node = tensor("ffn_moe_argsort-3", 0x500, SLOT_DST);
    w.op(&op(2_000, 7, vec![node]), &mut memory_of).unwrap();
    let header = EventHeader { kind: EventKind::Routing as u32, cpu: 0, ts_ns: 2_050, tgid: 42, tid: 8 };
    let routing = crate::events::RoutingRecord { header, tensor: node.tensor, row: 2, experts: vec![5, 1, 7, 0] };
    w.routing(&routing).unwrap();
    let bytes = w.finish(&Trailer::default()).unwrap();
    let (r, records) = read_all(&bytes).unwrap();
    let got = records.iter().find_map(|rec| match rec {
        Record::Routing(x) => Some(x.clone()),
        _ => None,
    });
    let got = got.expect("a routing record");
    assert_eq!((got.ts_ns, got.tid, got.row, got.experts.as_slice()), (2_050, 8, 2, &[5, 1, 7, 0][..]));
    assert_eq!(r.descriptor(got.node.expect("the argsort node is defined")).name, "ffn_moe_argsort-3");
}

/// A graph node reading the weight (slot 0) and `x` (slot 1).
fn graph_node(name: &str, data: u64, x: TensorRecord) -> (TensorRecord, Vec<(u32, TensorRecord)>) {
    (tensor(name, data, SLOT_DST), vec![(0, tensor("blk.0.attn_q.weight", 0x7040, 0)), (1, x)])
}

/// An activation of `rows` tokens.
fn activation(rows: i64) -> TensorRecord {
    let mut x = tensor("x", 0x100, 1);
    x.ne[1] = rows;
    x
}

fn record_name(t: &TensorRecord) -> String {
    String::from_utf8_lossy(tracer_common::c_str(&t.name)).into_owned()
}

/// A definition from each node's record and its `(slot, record)` sources.
fn definition_of(id: u32, nodes: &[(TensorRecord, Vec<(u32, TensorRecord)>)]) -> GraphDefinition {
    let key = |r: &TensorRecord| TensorRecord { slot: 0, _pad: 0, ..*r };
    let mut records: Vec<TensorRecord> = nodes.iter().map(|(dst, _)| key(dst)).collect();
    let (mut sources, mut source_ends) = (Vec::new(), Vec::new());
    for (_, srcs) in nodes {
        for (slot, record) in srcs {
            let at = records.iter().position(|r| *r == key(record)).unwrap_or_else(|| {
                records.push(key(record));
                records.len() - 1
            });
            sources.push((*slot, at as u32));
        }
        source_ends.push(sources.len() as u32);
    }
    GraphDefinition { id, records, n_nodes: nodes.len(), sources, source_ends }
}

/// Graph definitions that repeat, change and drop the previous one's records
/// at the same positions read back as written (the writer reuses ids by position).
#[test]
fn graph_definitions_read_back_whatever_they_share_with_the_last_one() {
    let (one, four) = (activation(1), activation(4));
    let definitions = [
        vec![graph_node("Qcur-0", 0x200, one), graph_node("Kcur-0", 0x300, one)],
        // The token-sized source changes; a node is added.
        vec![graph_node("Qcur-0", 0x200, four), graph_node("Kcur-0", 0x300, four), graph_node("Vcur-0", 0x400, four)],
        // Shorter, in the first shape; then the shapes mixed.
        vec![graph_node("Qcur-0", 0x200, one)],
        vec![graph_node("Qcur-0", 0x200, four), graph_node("Kcur-0", 0x300, one), graph_node("Vcur-0", 0x400, four)],
    ];
    let mut w = TraceWriter::create(Vec::new(), &header()).unwrap();
    for (id, nodes) in definitions.iter().enumerate() {
        w.graph(&definition_of(id as u32, nodes), &mut memory_of).unwrap();
        w.compute(id as u32, 2_000 + id as u64, 7, &[], &mut memory_of).unwrap();
    }
    assert_eq!(w.stats.descriptors, 6, "Qcur, Kcur, Vcur, the weight and x in two shapes");
    let bytes = w.finish(&Trailer::default()).unwrap();
    let (r, records) = read_all(&bytes).unwrap();
    let ops: Vec<_> = records.iter().filter_map(|rec| if let Record::Op(op) = rec { Some(op) } else { None }).collect();
    let written: Vec<_> = definitions.iter().flatten().collect();
    assert_eq!(ops.len(), written.len());
    for (op, (dst, srcs)) in ops.iter().zip(written) {
        assert_eq!(r.descriptor(op.dst).name, record_name(dst));
        let read: Vec<_> =
            op.srcs.iter().map(|&(slot, id)| (slot, r.descriptor(id).name.clone(), r.descriptor(id).ne)).collect();
        let want: Vec<_> = srcs.iter().map(|(slot, s)| (*slot, record_name(s), s.ne)).collect();
        assert_eq!(read, want);
    }
}
