//! Counters, disk lanes and the fault → disk request chains of the Perfetto sink.

use std::io::Write;

use super::*;

/// An issued block request waiting for its completion.
pub(super) struct OpenRequest {
    issued: u64,
    lane: usize,
    sector: u64,
    bytes: u64,
    rwbs: String,
}

impl<W: Write> PerfettoSink<W> {
    pub(super) fn count_fault(&mut self, ts: u64) -> Result<(), ExportError> {
        for (ts, n) in self.faults_per_bucket.add(ts, 1).into_iter().flatten() {
            self.counter(ts, n)?;
        }
        Ok(())
    }

    pub(super) fn add_disk(&mut self, ts: u64, bytes: i64) -> Result<(), ExportError> {
        self.disk_descriptors()?;
        for (ts, n) in self.disk_bytes_per_bucket.add(ts, bytes).into_iter().flatten() {
            self.counter_on(DISK_BYTES_UUID, ts, n)?;
        }
        Ok(())
    }

    /// The last bucket of each counter, and the zero after it.
    pub(super) fn close_counters(&mut self) -> Result<(), ExportError> {
        for (ts, n) in self.faults_per_bucket.finish().into_iter().flatten() {
            self.counter(ts, n)?;
        }
        for (ts, n) in self.disk_bytes_per_bucket.finish().into_iter().flatten() {
            self.counter_on(DISK_BYTES_UUID, ts, n)?;
        }
        Ok(())
    }

    /// The disk group and its counter, once the first block event shows up.
    pub(super) fn disk_descriptors(&mut self) -> Result<(), ExportError> {
        if self.disk_described {
            return Ok(());
        }
        self.disk_described = true;
        self.descriptor(TrackDescriptor {
            child_ordering: Some(CHILD_ORDERING_EXPLICIT),
            ..track(DISK_UUID, "disk", None)
        })?;
        self.descriptor(TrackDescriptor {
            counter: Some(CounterDescriptor { unit: Some(UNIT_SIZE_BYTES), unit_name: Some("bytes".into()) }),
            sibling_order_rank: Some(-1),
            ..track(DISK_BYTES_UUID, "disk bytes per 10 ms", Some(DISK_UUID))
        })?;
        self.descriptor(TrackDescriptor {
            counter: Some(CounterDescriptor { unit: Some(UNIT_SIZE_BYTES), unit_name: Some("bytes".into()) }),
            sibling_order_rank: Some(-2),
            ..track(DISK_CUMULATIVE_UUID, "model bytes read from disk (cumulative)", Some(DISK_UUID))
        })
    }

    /// A free lane for a new request (a new lane track when all are busy).
    pub(super) fn lane(&mut self) -> Result<usize, ExportError> {
        self.disk_descriptors()?;
        if let Some(i) = self.lanes.iter().position(|busy| !busy) {
            self.lanes[i] = true;
            return Ok(i);
        }
        self.lanes.push(true);
        let i = self.lanes.len() - 1;
        self.descriptor(TrackDescriptor {
            sibling_order_rank: Some(i as i32),
            ..track(LANE_UUID + i as u64, &format!("disk requests {i}"), Some(DISK_UUID))
        })?;
        Ok(i)
    }

    pub(super) fn counter(&mut self, ts: u64, value: i64) -> Result<(), ExportError> {
        self.counter_on(FAULT_COUNTER_UUID, ts, value)
    }

    pub(super) fn counter_on(&mut self, track: u64, ts: u64, value: i64) -> Result<(), ExportError> {
        let e = TrackEvent {
            r#type: Some(TYPE_COUNTER),
            track_uuid: Some(track),
            counter_value: Some(value),
            ..Default::default()
        };
        self.event(ts, e, InternedData::default())
    }

    /// Issue opens a request on a free lane; completion closes it as one
    /// slice (a completion without its issue is dropped).
    pub(super) fn block(&mut self, b: &crate::format::reader::Block) -> Result<(), ExportError> {
        let key = (b.dev, b.sector);
        if b.kind == tracer_common::BlockKind::Issue {
            // The same sector issued again before its completion was traced
            // (the kernel skips a tracepoint program while another BPF
            // program runs on that CPU): the earlier request ends here, with
            // the fault chain waiting for it.
            if let Some(old) = self.requests.remove(&key) {
                let flow = self.request_flows.remove(&key);
                self.request_slice(old, b.ts_ns, " (no completion traced)", flow)?;
            }
            let lane = self.lane()?;
            let open = OpenRequest {
                issued: b.ts_ns,
                lane,
                sector: b.sector,
                bytes: u64::from(b.nr_sector) * 512,
                rwbs: b.rwbs.clone(),
            };
            self.requests.insert(key, open);
            if b.rwbs.contains('R') {
                self.read_issued(b)?;
            }
            return Ok(());
        }
        self.reads.remove(&key);
        let flow = self.request_flows.remove(&key);
        let Some(open) = self.requests.remove(&key) else { return Ok(()) };
        // The completion's own size and flags: a request can complete partially.
        let bytes = u64::from(b.nr_sector) * 512;
        self.request_slice(OpenRequest { bytes, rwbs: b.rwbs.clone(), ..open }, b.ts_ns, "", flow)?;
        self.add_disk(b.ts_ns, bytes as i64)
    }

    /// One request's slice on its lane, from issue to `end`, carrying the
    /// fault chain that waits for it.
    fn request_slice(
        &mut self,
        r: OpenRequest,
        end: u64,
        note: &str,
        flow: Option<(u64, bool)>,
    ) -> Result<(), ExportError> {
        self.lanes[r.lane] = false;
        let track = LANE_UUID + r.lane as u64;
        let mut new = InternedData::default();
        let name = self.name_iid(&format!("{} {} KiB{note}", r.rwbs, r.bytes / 1024), &mut new);
        let rwbs = self.string_iid(&r.rwbs, &mut new);
        let mut e = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            name_iid: Some(name),
            debug_annotations: vec![uint(8, r.sector), uint(9, r.bytes), string(10, rwbs)],
            ..Default::default()
        };
        match flow {
            Some((flow, true)) => e.terminating_flow_ids.push(flow),
            Some((flow, false)) => e.flow_ids.push(flow),
            None => {}
        }
        self.event(r.issued, e, new)?;
        self.end(end.max(r.issued), track)
    }

    /// Requests whose completion was never traced (`io::DiskTotals::uncompleted`)
    /// end at the trace's end, so the fault chains waiting for them still arrive.
    pub(super) fn close_requests(&mut self, end: u64) -> Result<(), ExportError> {
        let mut open: Vec<_> = self.requests.drain().collect();
        open.sort_by_key(|(key, r)| (r.issued, *key));
        for (key, r) in open {
            let flow = self.request_flows.remove(&key);
            self.request_slice(r, end, " (no completion traced)", flow)?;
        }
        Ok(())
    }

    /// A read request: the cumulative counter, and the chain from the fault
    /// its thread is waiting in when the request covers the fault's page.
    pub(super) fn read_issued(&mut self, b: &crate::format::reader::Block) -> Result<(), ExportError> {
        let key = (b.dev, b.sector);
        let ranges = self.io.file_ranges(b.dev, b.sector, b.nr_sector);
        let bytes: u64 = ranges.iter().map(|&(_, _, from, to)| to - from).sum();
        // As `correlate::io`: a request counts once, however often it is issued.
        if bytes > 0 && self.reads.insert(key) {
            self.read_bytes += bytes;
            self.counter_on(DISK_CUMULATIVE_UUID, b.ts_ns, self.read_bytes as i64)?;
        }
        let Some(f) = self.faults.get(&b.tid) else { return Ok(()) };
        let (model, file, page) = f.page;
        let covers =
            ranges.iter().any(|&(m, fl, from, to)| (m, fl) == (model, file) && from < page + PAGE_SIZE && page < to);
        if !covers {
            return Ok(());
        }
        let Some(mut f) = self.faults.remove(&b.tid) else { return Ok(()) };
        f.event.flow_ids.push(f.flow);
        self.request_flows.insert(key, (f.flow, f.in_op));
        if !f.in_op {
            self.next_op_flows.entry(b.tid).or_default().push((f.seq, f.flow));
        }
        self.event(f.ts, f.event, InternedData::default())
    }

    /// A held fault whose thread read nothing for it: the plain op → fault flow.
    pub(super) fn close_fault(&mut self, tid: u32) -> Result<(), ExportError> {
        let Some(mut f) = self.faults.remove(&tid) else { return Ok(()) };
        if f.in_op {
            f.event.terminating_flow_ids.push(f.flow);
        }
        self.event(f.ts, f.event, InternedData::default())
    }
}
