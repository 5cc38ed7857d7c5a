//! A ring's files written through `TraceWriter::restart` and read back as
//! one run: the same records as the run written as one file.

use std::path::{Path, PathBuf};

use tracer_common::{BufferEvent, CallEvent, EventHeader, EventKind, PageFaultEvent, SLOT_DST, buffer_action};

use super::{
    ring::{RingError, RingPart, member_path, scratch_dir},
    tests::{header, memory_of, op, tensor},
    *,
};

/// Where a script's writer is: one file, or a ring about to begin file `next`.
enum Out {
    One(TraceWriter<Vec<u8>>),
    Ring { writer: TraceWriter<Vec<u8>>, closed: Vec<Vec<u8>>, run: String },
}

fn marker(ts_ns: u64) -> CallEvent {
    let header = EventHeader { kind: EventKind::Call as u32, ts_ns, tgid: 42, tid: 7, cpu: 0 };
    CallEvent { header, cookie: tracer_common::markers::LLAMA_DECODE, args: [0; 6] }
}

fn buffer(ts_ns: u64, buffer: u64, action: u32) -> BufferEvent {
    let header = EventHeader { kind: EventKind::Buffer as u32, ts_ns, tgid: 42, tid: 7, cpu: 0 };
    BufferEvent { header, buffer, action, size: 4096, ..Default::default() }
}

fn fault(ts_ns: u64) -> PageFaultEvent {
    let header = EventHeader { kind: EventKind::PageFault as u32, ts_ns, tgid: 42, tid: 8, cpu: 0 };
    PageFaultEvent { header, address: 0x7040, ip: 1, error_code: 4 }
}

fn w(out: &mut Out) -> &mut TraceWriter<Vec<u8>> {
    match out {
        Out::One(w) | Out::Ring { writer: w, .. } => w,
    }
}

/// A graph of one node (`dst` reads the weight), defined as `id`.
fn graph(id: u32, dst: &str, address: u64) -> GraphDefinition {
    let records = vec![tensor(dst, address, 0), tensor("blk.0.attn_q.weight", 0x7040, 0)];
    let records = records.into_iter().map(|r| tracer_common::TensorRecord { op: 1, ..r }).collect();
    GraphDefinition { id, records, n_nodes: 1, sources: vec![(0, 1)], source_ends: vec![1] }
}

/// One run: decode calls with graph runs, ops, faults and buffers; a ring
/// switches before the decode calls at 2000 and 3000, restating what the
/// recorder restates (the buffers alive, the graphs in use).
fn write(mut out: Out) -> Vec<Vec<u8>> {
    let model = ModelTable { files: vec!["m.gguf".into()], ..Default::default() };
    let (g0, g1) = (graph(0, "Qcur-0", 0x100), graph(1, "Kcur-0", 0x300));
    let weight = tensor("blk.0.attn_q.weight", 0x7040, 0);
    let pos = FilePos { model: 0, file: 0, offset: 0x40 };
    let switch = |out: &mut Out, index: u32, start: u64, lost: Lost, graphs: &[&GraphDefinition]| {
        let Out::Ring { writer, closed, run } = out else { return };
        let part = RingPart {
            run: run.clone(),
            index,
            run_start_monotonic_ns: 1_000,
            lost_before: lost,
            carried_buffers: 1,
            ..Default::default()
        };
        let trailer = Trailer { stop_reason: StopReason::NextFile, end_monotonic_ns: start, ..Default::default() };
        closed.push(writer.restart(Vec::new(), (start, start), part, lost, &trailer).unwrap());
        writer.buffer(&buffer(1_100, 0xb1, buffer_action::CREATED)).unwrap();
        for g in graphs {
            writer.graph(g, &mut memory_of).unwrap();
        }
    };
    w(&mut out).model(&model).unwrap();
    w(&mut out).buffer(&buffer(1_100, 0xb1, buffer_action::CREATED)).unwrap();
    w(&mut out).buffer(&buffer(1_150, 0xb2, buffer_action::CREATED)).unwrap();
    w(&mut out).buffer(&buffer(1_160, 0xb2, buffer_action::FREED)).unwrap();
    w(&mut out).marker(&marker(1_200)).unwrap();
    w(&mut out).graph(&g0, &mut memory_of).unwrap();
    w(&mut out).compute(0, 1_300, 7, &[], &mut memory_of).unwrap();
    w(&mut out).op(&op(1_400, 7, vec![tensor("out", 0x500, SLOT_DST), weight]), &mut memory_of).unwrap();
    w(&mut out).fault(&fault(1_450), memory_of(&weight), Some(pos)).unwrap();

    switch(&mut out, 1, 1_900, Lost { op: 1, ..Default::default() }, &[&g0]);
    w(&mut out).marker(&marker(2_000)).unwrap();
    w(&mut out).compute(0, 2_100, 7, &[], &mut memory_of).unwrap();
    w(&mut out).graph(&g1, &mut memory_of).unwrap();
    w(&mut out).compute(1, 2_200, 7, &[], &mut memory_of).unwrap();
    w(&mut out).op(&op(2_300, 8, vec![tensor("out", 0x500, SLOT_DST), weight]), &mut memory_of).unwrap();
    w(&mut out).fault(&fault(2_400), memory_of(&weight), Some(pos)).unwrap();

    switch(&mut out, 2, 2_900, Lost { op: 2, ..Default::default() }, &[&g0, &g1]);
    w(&mut out).marker(&marker(3_000)).unwrap();
    w(&mut out).compute(1, 3_100, 7, &[], &mut memory_of).unwrap();
    w(&mut out).buffer(&buffer(3_300, 0xb1, buffer_action::FREED)).unwrap();
    w(&mut out).lost(Lost { op: 3, ..Default::default() }).unwrap();
    let trailer = Trailer { stop_reason: StopReason::TargetExited, exit_code: Some(0), ..Default::default() };
    match out {
        Out::One(w) => vec![w.finish(&trailer).unwrap()],
        Out::Ring { writer, mut closed, .. } => {
            closed.push(writer.finish(&trailer).unwrap());
            closed
        }
    }
}

/// The ring's files, written as `base.NNNN` under a directory of its own.
fn ring_files(name: &str, run: &str) -> (PathBuf, Vec<PathBuf>) {
    let part = RingPart { run: run.into(), run_start_monotonic_ns: 1_000, ..Default::default() };
    let first = Header { ring: Some(part), ..header() };
    let writer = TraceWriter::create(Vec::new(), &first).unwrap();
    let files = write(Out::Ring { writer, closed: Vec::new(), run: run.into() });
    let base = scratch_dir(name).join("t.data");
    let paths = files.iter().enumerate().map(|(i, bytes)| {
        let path = member_path(&base, i as u32);
        std::fs::write(&path, bytes).unwrap();
        path
    });
    let paths = paths.collect();
    (base, paths)
}

/// Records with descriptor ids replaced by the descriptors. LOST frames
/// count from the start (a ring's file closes with one): the last is kept.
#[derive(Debug, PartialEq)]
enum Canonical {
    Op { ts_ns: u64, tid: u32, dst: Descriptor, srcs: Vec<(u32, Descriptor)> },
    Other(Record),
}

fn read(path: &Path) -> Result<(Header, Vec<Canonical>), TraceError> {
    let mut reader = TraceReader::open(path)?;
    let mut records = Vec::new();
    let mut lost = None;
    while let Some(record) = reader.next_record()? {
        records.push(match record {
            Record::Lost(l) => {
                lost = Some(l);
                continue;
            }
            Record::Op(op) => Canonical::Op {
                ts_ns: op.ts_ns,
                tid: op.tid,
                dst: reader.descriptor(op.dst).clone(),
                srcs: op.srcs.iter().map(|&(slot, id)| (slot, reader.descriptor(id).clone())).collect(),
            },
            other => Canonical::Other(other),
        });
    }
    assert!(!reader.truncated);
    records.extend(lost.map(|l| Canonical::Other(Record::Lost(l))));
    Ok((reader.header().clone(), records))
}

/// The run written as one file (in its own directory `dir`), read back.
fn one_file_records(dir: &str) -> Vec<Canonical> {
    let single = write(Out::One(TraceWriter::create(Vec::new(), &header()).unwrap())).remove(0);
    let one = scratch_dir(dir).join("one.data");
    std::fs::write(&one, single).unwrap();
    read(&one).unwrap().1
}

#[test]
fn a_ring_reads_as_the_same_run_written_as_one_file() {
    let expected = one_file_records("one");
    let (base, paths) = ring_files("whole", "r1");
    assert_eq!(paths.len(), 3);
    let (header, records) = read(&base).unwrap();
    assert_eq!(records, expected, "no record lost, duplicated or changed across the files");
    let ring = header.ring_read.expect("read as a ring");
    assert_eq!((ring.first_index, ring.last_index, ring.missing), (0, 2, None));

    // A file alone reads: its own models, buffers alive and graphs.
    let (alone, records) = read(&paths[1]).unwrap();
    assert!(
        matches!(&records[..2], [Canonical::Other(Record::Model(0)), Canonical::Other(Record::Buffer(b))] if b.buffer == 0xb1)
    );
    let ops = records.iter().filter(|r| matches!(r, Canonical::Op { .. })).count();
    assert_eq!(ops, 3, "two graph runs and an op");
    let end = records.iter().rev().find_map(|r| match r {
        Canonical::Other(Record::End(t)) => Some(t.stop_reason),
        _ => None,
    });
    assert_eq!(end, Some(StopReason::NextFile));
    assert_eq!(alone.ring_read.unwrap().missing.map(|m| m.files), Some(1));
}

#[test]
fn a_ring_missing_its_oldest_files_says_so_and_counts_from_there() {
    let whole = one_file_records("one-partial");
    let (base, paths) = ring_files("partial", "r1");
    std::fs::remove_file(&paths[0]).unwrap();
    let (header, records) = read(&base).unwrap();
    let missing = header.ring_read.unwrap().missing.expect("file 0 is missing");
    assert_eq!((missing.files, missing.from_ns, missing.to_ns), (1, 1_000, 1_900));
    // The model, the buffer alive at the start, then the run from there on.
    let from = whole.iter().position(|r| matches!(r, Canonical::Other(Record::Marker(m)) if m.ts_ns == 2_000)).unwrap();
    let mut expected = vec![Canonical::Other(Record::Model(0))];
    expected.push(Canonical::Other(Record::Buffer(match &whole[1] {
        Canonical::Other(Record::Buffer(b)) => b.clone(),
        other => panic!("{other:?}"),
    })));
    for record in whole.into_iter().skip(from) {
        expected.push(match record {
            // Lost events count from the first file read.
            Canonical::Other(Record::Lost(l)) => Canonical::Other(Record::Lost(Lost { op: l.op - 1, ..l })),
            other => other,
        });
    }
    assert_eq!(records, expected);
}

#[test]
fn a_gap_a_cut_file_or_another_runs_file_is_refused() {
    let (base, paths) = ring_files("gap", "r1");
    let middle = std::fs::read(&paths[1]).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    assert!(matches!(TraceReader::open(&base), Err(TraceError::Ring(e)) if matches!(*e, RingError::Gap { .. })));

    // The middle file without its END frame (cut short), followed by another.
    std::fs::write(&paths[1], &middle[..middle.len() - 40]).unwrap();
    let err = read(&base).unwrap_err().to_string();
    assert!(err.contains("ends without its END frame") && err.contains("t.data.0002"), "{err}");

    // File 2 of another recording.
    std::fs::write(&paths[1], &middle).unwrap();
    let (_, other) = ring_files("gap-other", "r2");
    std::fs::copy(&other[2], &paths[2]).unwrap();
    let err = read(&base).unwrap_err().to_string();
    assert!(err.contains("not of the same run") && err.contains("r2"), "{err}");
}

#[test]
fn graph_ids_restart_per_file_with_the_carried_ones_first() {
    let mut ids = super::ring::GraphIds::default();
    assert_eq!((ids.define(0).unwrap(), ids.define(1).unwrap()), (0, 1));
    ids.restart();
    assert!(ids.file_id(1).is_err(), "not defined in the new file");
    assert_eq!(ids.define(1).unwrap(), 0, "carried");
    assert_eq!(ids.define(2).unwrap(), 1, "new");
    assert!(ids.define(0).is_err(), "an old one after new ones");
    assert!(ids.define(4).is_err(), "out of order");
    assert_eq!((ids.file_id(1).unwrap(), ids.file_id(2).unwrap()), (0, 1));
    assert!(ids.file_id(0).is_err());
}
