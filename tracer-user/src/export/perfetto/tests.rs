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

/// Each packet's time on the trace clock, as the proto's comments define
/// it: on `timestamp_clock_id`, else the sequence's default clock; a delta
/// from the previous time on a clock a snapshot marks incremental.
fn times(packets: &[TracePacket]) -> Vec<Option<u64>> {
    let (mut default, mut incremental) = (None, None);
    packets
        .iter()
        .map(|p| {
            let ts = p.timestamp.map(|ts| match p.timestamp_clock_id.or(default) {
                Some(clock::DELTA_CLOCK) => {
                    let at = incremental.expect("the delta clock is defined first") + ts;
                    incremental = Some(at);
                    at
                }
                Some(clock::TRACE_CLOCK) | None => ts,
                Some(other) => panic!("clock {other} is not defined"),
            });
            if let Some(d) = &p.trace_packet_defaults {
                default = d.timestamp_clock_id;
            }
            for c in p.clock_snapshot.iter().flat_map(|s| &s.clocks) {
                if c.is_incremental == Some(true) {
                    assert_eq!(c.clock_id, Some(clock::DELTA_CLOCK));
                    incremental = c.timestamp;
                }
            }
            ts
        })
        .collect()
}

#[test]
fn timestamps_are_deltas_in_time_order_and_absolute_before_it() {
    let mut s = sink();
    let mut first = TracePacket::default();
    s.clock.define(1_000, &mut first);
    s.packet(first).unwrap();
    let at = [1_000, 1_500, 1_500, 1_200, 1_700, 999, 1_700];
    for ts in at {
        s.end(ts, THREAD_UUID).unwrap();
    }
    let packets = packets(&s.out);
    assert_eq!(times(&packets), std::iter::once(1_000).chain(at).map(Some).collect::<Vec<_>>());
    let on_trace_clock = packets.iter().filter(|p| p.timestamp_clock_id == Some(clock::TRACE_CLOCK)).count();
    assert_eq!(on_trace_clock, 3, "the snapshot's packet and the two that go back in time");
    let deltas: Vec<u64> =
        packets.iter().filter(|p| p.timestamp_clock_id.is_none()).filter_map(|p| p.timestamp).collect();
    assert_eq!(deltas, [0, 500, 0, 200, 0]);
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
