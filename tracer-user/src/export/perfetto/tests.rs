use super::*;
use crate::format::fixtures::{block, one_tensor_model};

fn sink() -> PerfettoSink<Vec<u8>> {
    let mut s = PerfettoSink::new(Vec::new(), 1);
    s.io.on_model(0, &one_tensor_model());
    s
}

fn fault(s: &mut PerfettoSink<Vec<u8>>, tid: u32, seq: u64, offset: u64, in_op: bool) {
    let e = TrackEvent { r#type: Some(TYPE_INSTANT), track_uuid: Some(THREAD_UUID), ..Default::default() };
    let pending = PendingFault { seq, ts: 100 + seq, event: e, flow: (1 << 63) | seq, in_op, page: (0, 0, offset) };
    s.faults.insert(tid, pending);
}

fn packets(out: &[u8]) -> Vec<TracePacket> {
    let mut buf = out;
    let mut v = Vec::new();
    while !buf.is_empty() {
        buf = &buf[1..];
        v.push(TracePacket::decode_length_delimited(&mut buf).unwrap());
    }
    v
}

#[test]
fn fault_read_by_its_thread_chains_to_the_disk_slice() {
    let mut s = sink();
    fault(&mut s, 5, 1, 8192, true);
    fault(&mut s, 6, 2, 0, false);
    s.block(&block(tracer_common::BlockKind::Issue, 5, 8192, 200)).unwrap();
    // Thread 6 reads another page: not its fault's.
    s.block(&block(tracer_common::BlockKind::Issue, 6, 65536, 210)).unwrap();
    s.close_fault(6).unwrap();
    s.block(&block(tracer_common::BlockKind::Complete, 0, 8192, 300)).unwrap();
    s.block(&block(tracer_common::BlockKind::Complete, 0, 65536, 310)).unwrap();
    let events: Vec<(u64, TrackEvent)> =
        packets(&s.out).into_iter().filter_map(|p| Some((p.timestamp?, p.track_event?))).collect();
    let at = |ts: u64| events.iter().find(|(t, e)| *t == ts && e.r#type != Some(TYPE_COUNTER)).unwrap().1.clone();
    let flow = (1 << 63) | 1;
    assert_eq!(at(101).flow_ids, vec![flow], "the fault continues to the request");
    assert_eq!(at(200).terminating_flow_ids, vec![flow], "the request slice ends the op → fault → disk flow");
    assert!(at(102).flow_ids.is_empty() && at(102).terminating_flow_ids.is_empty());
    assert!(at(210).flow_ids.is_empty() && at(210).terminating_flow_ids.is_empty());
    let cumulative: Vec<i64> = events
        .iter()
        .filter(|(_, e)| e.track_uuid == Some(DISK_CUMULATIVE_UUID))
        .filter_map(|(_, e)| e.counter_value)
        .collect();
    assert_eq!(cumulative, vec![4096, 8192]);
    assert_eq!(s.next_op_flows.get(&5), None);
}

#[test]
fn a_request_without_completion_still_ends_its_fault_chain() {
    let mut s = sink();
    fault(&mut s, 5, 1, 8192, true);
    s.block(&block(tracer_common::BlockKind::Issue, 5, 8192, 200)).unwrap();
    s.close_requests(900).unwrap();
    let events: Vec<(u64, TrackEvent)> =
        packets(&s.out).into_iter().filter_map(|p| Some((p.timestamp?, p.track_event?))).collect();
    let slice = events.iter().find(|(t, e)| *t == 200 && e.r#type == Some(TYPE_SLICE_BEGIN)).unwrap();
    assert_eq!(slice.1.terminating_flow_ids, vec![(1 << 63) | 1]);
    let end = events.iter().find(|(_, e)| e.r#type == Some(TYPE_SLICE_END)).unwrap();
    assert_eq!((end.0, end.1.track_uuid), (900, slice.1.track_uuid), "ends at the trace's end, on its lane");
    assert!(s.requests.is_empty() && s.request_flows.is_empty());
    assert_eq!(s.lanes, vec![false], "the lane is free again");
}
