//! Writing decoded events to the trace as they arrive, each resolved by
//! the [`Resolver`] when first written.

use std::{
    collections::{BTreeMap, HashSet},
    io::{self, Write},
};

use tracer_common::{BlockKind, BufferEvent, CallEvent, buffer_action, markers};

use super::{
    graphs::{GraphAssembler, Ready},
    op_times::OpTimes,
};
use crate::{
    events::Event,
    format::{Lost, StopReason, TraceWriter, Trailer, ring::RingPart},
};

/// Where a ring of files (`--max-size`) goes on: the session's files.
pub trait NextFile<W> {
    /// `--max-size`: a file is closed at the first boundary after this many bytes.
    fn max_size(&self) -> u64;
    /// The ring's next file, beginning at `at_ns` (the event that starts
    /// it, on the trace's clock): the file, its start (unix and monotonic
    /// ns) and ring header, which says what it opens with.
    fn open_next(
        &mut self,
        at_ns: u64,
        lost_before: Lost,
        carried_buffers: u32,
    ) -> io::Result<(W, (u64, u64), RingPart)>;
    /// The file before it is complete (`--max-files`: the oldest beyond go).
    fn closed(&mut self, file: W) -> io::Result<()>;
}

pub use super::resolver::{Resolver, WatchedFile, is_gguf, kernel_dev, model_table};

/// Writes decoded events to the trace, resolving as it goes.
pub struct Recorder<W: Write> {
    pub writer: TraceWriter<W>,
    pub resolver: Resolver,
    pub graphs: GraphAssembler,
    /// Model-file requests issued and not yet completed, by (dev, sector).
    /// A set: a requeued request is issued twice and completed once.
    in_flight: HashSet<(u32, u64)>,
    /// `--values`: node outputs being put together.
    pub values: Option<super::values::ValueRecorder>,
    /// `--op-timing`: node starts written as ops of the graph running,
    /// in place of the graph's GRAPH and COMPUTE frames.
    pub op_times: Option<OpTimes>,
    /// `--max-size`: the files after the current one.
    pub ring: Option<Box<dyn NextFile<W>>>,
    /// The kernel's lost-event counters at the session's last tick: a
    /// ring's file records them when it closes and the next begins.
    pub lost: Lost,
    /// With a ring: per backend buffer alive, its CREATED event and last
    /// SET_USAGE, restated at each file's start.
    alive_buffers: BTreeMap<u64, Vec<BufferEvent>>,
    /// The target calls llama_decode: a ring's files change at decode calls only.
    saw_decode: bool,
}

impl<W: Write> Recorder<W> {
    pub fn new(writer: TraceWriter<W>, resolver: Resolver) -> Self {
        Self {
            writer,
            resolver,
            graphs: GraphAssembler::default(),
            in_flight: HashSet::new(),
            values: None,
            op_times: None,
            ring: None,
            lost: Lost::default(),
            alive_buffers: BTreeMap::new(),
            saw_decode: false,
        }
    }

    /// Whether a ring's file ends before `call`: it has reached
    /// `--max-size`, and `call` begins a decode call (or a graph, in a
    /// target with no decode calls), so that every file holds whole ones.
    fn file_ends_before(&mut self, call: &CallEvent) -> bool {
        let boundary = match call.cookie {
            markers::LLAMA_DECODE | markers::LLAMA_PROCESS => {
                self.saw_decode = true;
                true
            }
            markers::SCHED_GRAPH_COMPUTE => !self.saw_decode,
            _ => false,
        };
        boundary && self.ring.as_ref().is_some_and(|ring| self.writer.file_bytes() >= ring.max_size())
    }

    /// Close the current file of the ring and open the next, restating what
    /// a reader starting there needs: the writer restates the header and
    /// models; here the buffers alive and the graph definitions in use.
    fn next_file(&mut self, at_ns: u64) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else { return Ok(()) };
        let carried = self.alive_buffers.values().map(|events| events.len() as u32).sum();
        let (out, start, part) = ring.open_next(at_ns, self.lost, carried)?;
        let trailer = Trailer { stop_reason: StopReason::NextFile, end_monotonic_ns: start.1, ..Default::default() };
        let closed = self.writer.restart(out, start, part, self.lost, &trailer)?;
        ring.closed(closed)?;
        for event in self.alive_buffers.values().flatten() {
            self.writer.buffer(event)?;
        }
        match self.op_times.as_mut() {
            Some(times) => times.forget_ids(),
            None => {
                for definition in self.graphs.current_definitions() {
                    let resolver = &mut self.resolver;
                    self.writer.graph(&definition, &mut |r| resolver.memory_of(r))?;
                }
            }
        }
        Ok(())
    }

    fn track_buffer(&mut self, event: &BufferEvent) {
        match event.action {
            buffer_action::CREATED => {
                self.alive_buffers.insert(event.buffer, vec![*event]);
            }
            buffer_action::FREED => {
                self.alive_buffers.remove(&event.buffer);
            }
            _ => {
                if let Some(events) = self.alive_buffers.get_mut(&event.buffer) {
                    events.truncate(1);
                    events.push(*event);
                }
            }
        }
    }

    /// Model-file reads issued whose completion has not been recorded.
    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn track_request(&mut self, event: &tracer_common::BlockEvent) {
        let key = (event.dev, event.sector);
        if event.kind == BlockKind::Issue as u32 {
            self.in_flight.insert(key);
        } else {
            self.in_flight.remove(&key);
        }
    }

    pub fn record(&mut self, event: &Event) -> io::Result<()> {
        // A graph's records end with its DONE event, not at the next record
        // of another kind: other threads' records interleave with them.
        // A run's node outputs end before its graph returns or the next one starts.
        if matches!(event, Event::Graph(_) | Event::Call(_)) {
            self.flush_values()?;
        }
        match event {
            Event::Value(v) => match self.values.as_mut().and_then(|values| values.on_event(v)) {
                Some(done) => self.write_value(done),
                None => Ok(()),
            },
            Event::Graph(g) => {
                let ready = self.graphs.on_graph(g);
                self.write_graphs(ready)?;
                if g.flags & tracer_common::graph::DONE == 0
                    && let Some(times) = self.op_times.as_mut()
                {
                    times.graph_entered();
                }
                Ok(())
            }
            Event::Node(n) => {
                self.graphs.on_node(n);
                Ok(())
            }
            Event::Input(i) => {
                let ready = self.graphs.on_input(i);
                self.write_graphs(ready)
            }
            Event::Op(start) => {
                let Some(times) = self.op_times.as_mut() else { return Ok(()) };
                let (resolver, writer) = (&mut self.resolver, &mut self.writer);
                times.on_op(start, |op| {
                    if op.ids.is_empty() {
                        resolver.prepare_records(op.tensors.iter());
                        write_new_models(resolver, writer)?;
                        *op.ids = writer.op_tensors(op.tensors, &mut |r| resolver.memory_of(r))?;
                    }
                    writer.op_of(op.start, op.ids, op.token_ids)
                })
            }
            Event::Call(call) => {
                if self.ring.is_some() && self.file_ends_before(call) {
                    self.next_file(call.header.ts_ns)?;
                }
                // A graph starting means loading is done: until the maps show
                // a model mapped, re-read them now, while the target is alive,
                // so the graph's weights resolve to the file mapping rather
                // than by name. (Not per graph: a /proc read per token.)
                if call.cookie == markers::SCHED_GRAPH_COMPUTE {
                    self.resolver.refresh_for_graph();
                    self.flush_models()?;
                }
                if call.cookie == markers::WHISPER_INIT {
                    self.resolver.model_named_at(call.header.tgid, call.args[0]);
                }
                self.writer.marker(call)
            }
            Event::PageFault(fault) if fault.header.tgid != self.resolver.pid() => {
                self.resolver.faults_elsewhere += 1;
                Ok(())
            }
            Event::PageFault(fault) => {
                let (memory, file) = self.resolver.resolve_fault(fault.address);
                self.flush_models()?;
                self.writer.fault(fault, memory, file)
            }
            // Page-cache fills and block reads are mapped to the model by
            // its table, so the table goes first: a cold load's first records
            // are often reads (MAP_POPULATE faults in no user page), and the
            // report skipped reads written before their model's table.
            Event::PageCache(event) => {
                self.flush_models()?;
                self.writer.page_cache(event)
            }
            Event::Routing(routing) => self.writer.routing(routing),
            Event::Batch(batch) => self.writer.batch(batch),
            Event::Buffer(buffer) => {
                self.resolver.copies.on_buffer(buffer);
                if self.ring.is_some() {
                    self.track_buffer(buffer);
                }
                self.writer.buffer(buffer)
            }
            Event::Block(event) => {
                if self.resolver.block_in_model(event.dev, event.sector, event.nr_sector) {
                    self.track_request(event);
                    self.flush_models()?;
                    self.writer.block(event)
                } else {
                    self.resolver.blocks_elsewhere += 1;
                    Ok(())
                }
            }
        }
    }

    /// Write every node output still being put together.
    pub fn flush_values(&mut self) -> io::Result<()> {
        let done = self.values.as_mut().map(|v| v.flush()).unwrap_or_default();
        done.into_iter().try_for_each(|d| self.write_value(d))
    }

    /// The trace ends: write the last node outputs; what `--values` missed.
    pub fn close_values(&mut self) -> io::Result<Option<crate::format::ValuesMissing>> {
        self.flush_values()?;
        Ok(self.values.as_mut().map(|v| v.close()))
    }

    fn write_value(&mut self, d: super::values::Finished) -> io::Result<()> {
        let resolver = &mut self.resolver;
        let fused = d.fused.as_ref();
        self.writer.value(d.ts_tid, d.graph, d.node_index, &d.tensor, fused, &d.tail, &mut |r| resolver.memory_of(r))
    }

    /// Graph definitions and runs the assembler has completed.
    pub fn write_graphs(&mut self, ready: Ready) -> io::Result<()> {
        if let Some(values) = self.values.as_mut() {
            ready.definition.iter().for_each(|d| values.on_definition(d));
            ready.run.iter().for_each(|r| values.on_run(r.graph));
        }
        if let Some(definition) = ready.definition {
            self.resolver.prepare_records(definition.records.iter());
            self.flush_models()?;
            if let Some(times) = self.op_times.as_mut() {
                let graphs = &self.graphs;
                times.define(&definition, |id| graphs.is_current(id));
            } else {
                let resolver = &mut self.resolver;
                self.writer.graph(&definition, &mut |r| resolver.memory_of(r))?;
            }
        }
        if let Some(times) = self.op_times.as_mut() {
            ready.run.iter().for_each(|run| times.run(run));
        } else if let Some(run) = ready.run {
            let resolver = &mut self.resolver;
            self.writer.compute(run.graph, run.ts_ns, run.tid, &run.inputs, &mut |r| resolver.memory_of(r))?;
        }
        Ok(())
    }

    /// Write model tables found since the last frame (before any frame that
    /// refers to them), and the maps once a model shows up in them.
    pub fn flush_models(&mut self) -> io::Result<()> {
        write_new_models(&mut self.resolver, &mut self.writer)
    }
}

fn write_new_models<W: Write>(resolver: &mut Resolver, writer: &mut TraceWriter<W>) -> io::Result<()> {
    for table in resolver.take_new_models() {
        writer.model(&table)?;
    }
    if let Some(text) = resolver.take_maps_snapshot() {
        writer.maps(&text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tracer_common::{BlockEvent, BlockKind, EventHeader, EventKind};

    use super::*;
    use crate::{
        format::{Header, Record, TraceReader, Trailer},
        model::{GgmlType, gguf_write::GgufWriter},
    };

    /// A cold load's first record can be a read of the model (no op or
    /// fault before it): the model's table must precede it, or the report's
    /// disk figures leave the read out.
    #[test]
    fn a_read_before_any_op_or_fault_follows_its_models_table() {
        // On the repo's disk: the file needs extents (tmpfs has none).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/recorder-test");
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("one.gguf");
        let bytes = GgufWriter::new().tensor("w", GgmlType::from_name("f32").unwrap(), &[1024, 16]).to_bytes().unwrap();
        std::fs::write(&model, bytes).unwrap();
        std::fs::File::open(&model).unwrap().sync_all().unwrap();

        let mut resolver = Resolver::new(std::process::id());
        resolver.add_model(&model).unwrap();
        let watched = resolver.watched[0].clone();
        let (Some(dev), Some(&(start, _))) = (watched.disk_dev, watched.disk_ranges.first()) else {
            panic!("{} has no extents on a block device", model.display())
        };
        let header = Header { format_version: crate::format::frames::FORMAT_VERSION, ..Default::default() };
        let writer = TraceWriter::create(Vec::new(), &header).unwrap();
        let mut recorder = Recorder::new(writer, resolver);
        let mut rwbs = [0u8; 16];
        rwbs[0] = b'R';
        let read = BlockEvent {
            header: EventHeader { kind: EventKind::Block as u32, ts_ns: 1, tgid: 1, tid: 1, cpu: 0 },
            dev,
            nr_sector: 8,
            sector: start / 512,
            kind: BlockKind::Issue as u32,
            rwbs,
            ..Default::default()
        };
        recorder.record(&Event::Block(read)).unwrap();
        let trace = recorder.writer.finish(&Trailer::default()).unwrap();

        let mut reader = TraceReader::new(trace.as_slice()).unwrap();
        let mut kinds = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            kinds.push(match record {
                Record::Model(_) => "model",
                Record::Block(_) => "block",
                _ => continue,
            });
        }
        assert_eq!(kinds, ["model", "block"]);
        let a = crate::analyze::correlate::analyze(TraceReader::new(trace.as_slice()).unwrap()).unwrap();
        assert_eq!(a.io.disk.bytes, 4096, "the read is counted");
    }
}

#[cfg(test)]
mod ring_tests {
    use std::{cell::RefCell, rc::Rc};

    use tracer_common::{BufferEvent, CallEvent, EventHeader, EventKind, buffer_action, markers};

    use super::*;
    use crate::format::{
        Header, Record, TraceReader,
        ring::{member_path, scratch_dir},
    };

    /// A ring in memory: the closed files, in order.
    struct Files {
        closed: Rc<RefCell<Vec<Vec<u8>>>>,
        part: RingPart,
    }

    impl NextFile<Vec<u8>> for Files {
        fn max_size(&self) -> u64 {
            1
        }

        fn open_next(
            &mut self,
            at_ns: u64,
            lost_before: Lost,
            carried: u32,
        ) -> io::Result<(Vec<u8>, (u64, u64), RingPart)> {
            self.part =
                RingPart { index: self.part.index + 1, lost_before, carried_buffers: carried, ..self.part.clone() };
            Ok((Vec::new(), (0, at_ns), self.part.clone()))
        }

        fn closed(&mut self, file: Vec<u8>) -> io::Result<()> {
            self.closed.borrow_mut().push(file);
            Ok(())
        }
    }

    fn header(ts_ns: u64) -> EventHeader {
        EventHeader { kind: EventKind::Call as u32, ts_ns, tgid: 1, tid: 1, cpu: 0 }
    }

    fn buffer(ts_ns: u64, buffer: u64, action: u32) -> Event {
        Event::Buffer(BufferEvent { header: header(ts_ns), buffer, action, size: 64, ..Default::default() })
    }

    fn call(ts_ns: u64, cookie: u64) -> Event {
        Event::Call(CallEvent { header: header(ts_ns), cookie, args: [0; 6] })
    }

    #[test]
    fn a_full_file_ends_at_a_decode_call_and_the_next_restates_the_buffers_alive() {
        let part = RingPart { run: "r".into(), ..Default::default() };
        let first = Header {
            format_version: crate::format::frames::FORMAT_VERSION,
            ring: Some(part.clone()),
            ..Default::default()
        };
        let mut recorder = Recorder::new(TraceWriter::create(Vec::new(), &first).unwrap(), Resolver::new(1));
        let closed = Rc::new(RefCell::new(Vec::new()));
        recorder.ring = Some(Box::new(Files { closed: Rc::clone(&closed), part }));
        let events = [
            buffer(10, 0xb1, buffer_action::CREATED),
            buffer(11, 0xb2, buffer_action::CREATED),
            buffer(12, 0xb2, buffer_action::SET_USAGE),
            call(20, markers::LLAMA_DECODE),
            buffer(30, 0xb2, buffer_action::FREED),
            call(35, markers::LLAMA_PERF_RESET),
            call(40, markers::LLAMA_DECODE),
        ];
        for (i, event) in events.iter().enumerate() {
            recorder.lost.op = i as u64;
            recorder.record(event).unwrap();
        }
        let last = recorder.writer.finish(&Trailer::default()).unwrap();
        let mut files = closed.borrow().clone();
        files.push(last);
        assert_eq!(files.len(), 3, "a file per decode call; the reset is no boundary");

        let read = |bytes: &[u8]| {
            let mut reader = TraceReader::new(bytes).unwrap();
            let mut seen = Vec::new();
            while let Some(record) = reader.next_record().unwrap() {
                match record {
                    Record::Buffer(b) => seen.push((b.ts_ns, b.buffer)),
                    Record::Marker(m) => seen.push((m.ts_ns, m.cookie)),
                    _ => {}
                }
            }
            (reader.header().ring.clone().unwrap(), seen)
        };
        // Each file alone: the buffers alive first (0xb2 with its usage), then its own events.
        let (part, seen) = read(&files[1]);
        assert_eq!((part.index, part.carried_buffers, part.lost_before.op), (1, 3, 3));
        assert_eq!(
            seen,
            [
                (10, 0xb1),
                (11, 0xb2),
                (12, 0xb2),
                (20, markers::LLAMA_DECODE),
                (30, 0xb2),
                (35, markers::LLAMA_PERF_RESET)
            ]
        );
        let (part, seen) = read(&files[2]);
        assert_eq!((part.index, part.carried_buffers), (2, 1));
        assert_eq!(seen, [(10, 0xb1), (40, markers::LLAMA_DECODE)]);

        // As one run: every event once.
        let base = scratch_dir("recorder").join("t.data");
        for (i, bytes) in files.iter().enumerate() {
            std::fs::write(member_path(&base, i as u32), bytes).unwrap();
        }
        let mut reader = TraceReader::open(&base).unwrap();
        let mut count = 0;
        while let Some(record) = reader.next_record().unwrap() {
            count += usize::from(matches!(record, Record::Buffer(_) | Record::Marker(_)));
        }
        assert_eq!(count, events.len());
    }
}
