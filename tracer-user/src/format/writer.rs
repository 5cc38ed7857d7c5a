//! Writing a trace: interning names, threads and tensor descriptors so an op
//! frame holds only small indices (the ≤ 32 bytes per op target).

use std::io::{self, Write};

// Looked up for every tensor of every op and graph frame: a fast hasher.
use foldhash::HashMap;
use tracer_common::{BlockEvent, CallEvent, PageCacheEvent, PageFaultEvent, SLOT_DST, TensorRecord};

use super::{
    codec::{put_bytes, put_i64, put_u64},
    frames::{Descriptor, FilePos, FrameKind, Header, Hooks, Lost, MAGIC, Memory, ModelTable, Trailer},
    ring::GraphIds,
};
use crate::events::{InputRecord, OpRecord, RoutingRecord};

mod graphs;
mod switch;

pub use graphs::GraphDefinition;

/// Bytes and frames written, for the end-of-run summary and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriterStats {
    pub ops: u64,
    pub op_bytes: u64,
    pub descriptors: u64,
    pub descriptor_bytes: u64,
    /// Graph definitions and runs (graph capture), and their frames' bytes.
    pub graphs: u64,
    pub computes: u64,
    pub graph_bytes: u64,
    pub markers: u64,
    /// MoE routing rows (one per token and MoE layer).
    pub routing: u64,
    pub faults: u64,
    pub page_cache: u64,
    pub block: u64,
    /// I/O frames (faults, page cache, block) bytes, for the per-record figure.
    pub io_bytes: u64,
    pub total_bytes: u64,
    /// VALUE frames (`--values`) and their bytes.
    pub values: u64,
    pub value_bytes: u64,
    /// Ops the COMPUTE frames' runs executed (as the reader expands them),
    /// and the runs whose graph's count was no longer kept.
    pub graph_run_ops: u64,
    pub graph_runs_uncounted: u64,
}

impl WriterStats {
    /// Every executed op written (OP frames and graph runs'); `None` when
    /// some run's count was not kept.
    pub fn executed_ops(&self) -> Option<u64> {
        (self.graph_runs_uncounted == 0).then_some(self.ops + self.graph_run_ops)
    }
}

/// Who ran an op, and when: an OP frame's fixed fields.
#[derive(Clone, Copy)]
pub struct OpStart<'a> {
    pub header: &'a tracer_common::EventHeader,
    pub ith: u32,
    pub nth: u32,
    pub hook: u32,
}

/// A graph definition's node count and its first node's `ne`.
type GraphShape = (usize, [i64; 4]);

/// A record as descriptors are keyed: the same tensor whatever source slot
/// it was read through.
fn descriptor_key(record: &TensorRecord) -> TensorRecord {
    TensorRecord { slot: 0, _pad: 0, ..*record }
}

pub struct TraceWriter<W: Write> {
    out: W,
    frame: Vec<u8>,
    /// A frame's kind and length, and a graph's ids: reused, not allocated per frame.
    head: Vec<u8>,
    /// A graph frame's descriptor ids: reused, not allocated per frame.
    record_ids: Vec<u32>,
    /// Graph ids as this file numbers them (see [`GraphIds`]).
    graph_ids: GraphIds,
    /// The header written, with what HOOKS and MAPS frames added since,
    /// and the model tables: what the next file of a ring starts from.
    header: Header,
    models: Vec<ModelTable>,
    /// `stats.total_bytes` where the current file began.
    file_start: u64,
    /// Per graph shape (node count and the first node's `ne`, which holds
    /// the batch's token count), the last graph frame's records (slot
    /// cleared) in frame order, with their descriptor ids. A definition
    /// mostly repeats the last one of its shape at the same positions
    /// (llama.cpp rebuilds a few shapes as the batch changes): comparing in order costs
    /// less than a lookup that misses the cache on the stored key. Ids are
    /// never reassigned, so an equal record has the same id either way.
    last_graphs: HashMap<GraphShape, Vec<(TensorRecord, u32)>>,
    strings: HashMap<String, u32>,
    threads: HashMap<u32, u32>,
    descriptors: HashMap<TensorRecord, u32>,
    last_ts: u64,
    ops_per_graph: super::executed::OpsPerGraph,
    pub stats: WriterStats,
}

impl<W: Write> TraceWriter<W> {
    /// The header written, with what HOOKS and MAPS frames added since.
    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn create(mut out: W, header: &Header) -> io::Result<Self> {
        let total_bytes = write_header(&mut out, header)?;
        Ok(Self {
            out,
            frame: Vec::with_capacity(256),
            head: Vec::with_capacity(11),
            record_ids: Vec::new(),
            graph_ids: GraphIds::default(),
            header: header.clone(),
            models: Vec::new(),
            file_start: 0,
            last_graphs: HashMap::default(),
            strings: HashMap::default(),
            threads: HashMap::default(),
            descriptors: HashMap::default(),
            last_ts: header.start_monotonic_ns,
            ops_per_graph: Default::default(),
            stats: WriterStats { total_bytes, ..Default::default() },
        })
    }

    fn emit(&mut self, kind: FrameKind) -> io::Result<u64> {
        self.head.clear();
        self.head.push(kind as u8);
        put_u64(&mut self.head, self.frame.len() as u64);
        self.out.write_all(&self.head)?;
        self.out.write_all(&self.frame)?;
        let n = (self.head.len() + self.frame.len()) as u64;
        self.stats.total_bytes += n;
        self.frame.clear();
        Ok(n)
    }

    fn string(&mut self, s: &str) -> io::Result<u32> {
        if let Some(&id) = self.strings.get(s) {
            return Ok(id);
        }
        let id = self.strings.len() as u32;
        put_bytes(&mut self.frame, s.as_bytes());
        self.emit(FrameKind::String)?;
        self.strings.insert(s.to_string(), id);
        Ok(id)
    }

    fn thread(&mut self, tid: u32) -> io::Result<u32> {
        if let Some(&id) = self.threads.get(&tid) {
            return Ok(id);
        }
        let id = self.threads.len() as u32;
        put_u64(&mut self.frame, u64::from(tid));
        self.emit(FrameKind::Thread)?;
        self.threads.insert(tid, id);
        Ok(id)
    }

    /// Index of the descriptor for `record`, defining it on first sight
    /// (`resolve` is asked for its memory class only then).
    fn descriptor(
        &mut self,
        record: &TensorRecord,
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<u32> {
        let key = descriptor_key(record);
        if let Some(&id) = self.descriptors.get(&key) {
            return Ok(id);
        }
        let d = descriptor_of(record, resolve(record));
        let name = self.string(&d.name)?;
        let f = &mut self.frame;
        put_u64(f, d.tensor);
        put_u64(f, u64::from(name));
        for v in [d.type_id, d.op, d.op_param0, d.flags] {
            put_i64(f, i64::from(v));
        }
        d.ne.iter().for_each(|&v| put_i64(f, v));
        d.nb.iter().for_each(|&v| put_u64(f, v));
        for v in [d.data, d.view_src, d.view_offs, u64::from(d.has_extra)] {
            put_u64(f, v);
        }
        super::memory::encode(f, d.memory);
        self.stats.descriptor_bytes += self.emit(FrameKind::Tensor)?;
        self.stats.descriptors += 1;
        let id = self.descriptors.len() as u32;
        self.descriptors.insert(key, id);
        Ok(id)
    }

    fn timestamp(&mut self, ts: u64) {
        put_i64(&mut self.frame, ts.wrapping_sub(self.last_ts) as i64);
        self.last_ts = ts;
    }

    pub fn hooks(&mut self, hooks: &Hooks) -> io::Result<()> {
        self.frame = serde_json::to_vec(hooks).map_err(io::Error::other)?;
        super::reader::merge_hooks(&mut self.header, hooks.clone());
        self.emit(FrameKind::Hooks).map(drop)
    }

    /// The target's /proc/PID/maps (see `FrameKind::Maps`).
    pub fn maps(&mut self, text: &str) -> io::Result<()> {
        self.frame = text.as_bytes().to_vec();
        self.header.maps = text.to_string();
        self.emit(FrameKind::Maps).map(drop)
    }

    pub fn model(&mut self, table: &ModelTable) -> io::Result<()> {
        self.frame = serde_json::to_vec(table).map_err(io::Error::other)?;
        self.models.push(table.clone());
        self.emit(FrameKind::Model).map(drop)
    }

    pub fn op(&mut self, op: &OpRecord, resolve: &mut dyn FnMut(&TensorRecord) -> Memory) -> io::Result<()> {
        let tensors = self.op_tensors(&op.tensors, resolve)?;
        self.op_of(OpStart { header: &op.header, ith: op.ith, nth: op.nth, hook: op.hook }, &tensors, &op.token_ids)
    }

    /// An op's tensors as `(slot, descriptor)`, the destination first,
    /// defining descriptors not seen yet: what [`Self::op_of`] writes, for
    /// a caller that writes the same tensors many times (`--op-timing`).
    pub fn op_tensors(
        &mut self,
        tensors: &[TensorRecord],
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<Vec<(u32, u32)>> {
        tensors.iter().map(|record| Ok((record.slot, self.descriptor(record, resolve)?))).collect()
    }

    /// An op whose tensors' descriptors are defined (see [`Self::op_tensors`]).
    pub fn op_of(&mut self, op: OpStart<'_>, tensors: &[(u32, u32)], token_ids: &[i32]) -> io::Result<()> {
        let thread = self.thread(op.header.tid)?;
        self.timestamp(op.header.ts_ns);
        let f = &mut self.frame;
        let dst = tensors.first().map_or(0, |&(_, id)| id);
        for v in [thread, op.ith, op.nth, op.hook, dst, tensors.len().saturating_sub(1) as u32] {
            put_u64(f, u64::from(v));
        }
        for &(slot, id) in tensors.iter().skip(1) {
            put_u64(f, u64::from(if slot == SLOT_DST { 0 } else { slot }));
            put_u64(f, u64::from(id));
        }
        put_u64(f, token_ids.len() as u64);
        token_ids.iter().for_each(|&t| put_i64(f, i64::from(t)));
        self.stats.op_bytes += self.emit(FrameKind::Op)?;
        self.stats.ops += 1;
        Ok(())
    }

    /// One token's expert ranking (see `FrameKind::Routing`).
    pub fn routing(&mut self, r: &RoutingRecord) -> io::Result<()> {
        let thread = self.thread(r.header.tid)?;
        self.timestamp(r.header.ts_ns);
        let f = &mut self.frame;
        for v in [u64::from(thread), r.tensor, u64::from(r.row), r.experts.len() as u64] {
            put_u64(f, v);
        }
        r.experts.iter().for_each(|&e| put_i64(f, i64::from(e)));
        self.stats.routing += 1;
        self.emit(FrameKind::Routing).map(drop)
    }

    /// One array of a decode call's batch (see `FrameKind::Batch`): the
    /// record's bytes are little-endian i32s.
    pub fn batch(&mut self, b: &InputRecord) -> io::Result<()> {
        let thread = self.thread(b.header.tid)?;
        self.timestamp(b.header.ts_ns);
        let f = &mut self.frame;
        let values = b.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        for v in [u64::from(thread), b.tensor, b.uid, (b.data.len() / 4) as u64] {
            put_u64(f, v);
        }
        values.for_each(|v| put_i64(f, i64::from(v)));
        self.stats.markers += 1;
        self.emit(FrameKind::Batch).map(drop)
    }

    /// A backend buffer event (see `FrameKind::Buffer`).
    pub fn buffer(&mut self, b: &tracer_common::BufferEvent) -> io::Result<()> {
        let thread = self.thread(b.header.tid)?;
        self.timestamp(b.header.ts_ns);
        let f = &mut self.frame;
        put_u64(f, u64::from(thread));
        super::buffers::encode(f, b);
        self.stats.markers += 1;
        self.emit(FrameKind::Buffer).map(drop)
    }

    /// A node output's fingerprint (see `FrameKind::Value`): `tail` is
    /// `format::values::encode_tail`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn value(
        &mut self,
        (ts_ns, tid): (u64, u32),
        graph: u32,
        node_index: Option<u32>,
        dst: &TensorRecord,
        fused: Option<&TensorRecord>,
        tail: &[u8],
        resolve: &mut dyn FnMut(&TensorRecord) -> Memory,
    ) -> io::Result<()> {
        // A node of no captured graph names none (`u32::MAX`).
        let graph = if node_index.is_some() { self.graph_ids.file_id(graph)? } else { graph };
        let thread = self.thread(tid)?;
        let dst = self.descriptor(dst, resolve)?;
        let fused = fused.map(|f| self.descriptor(f, resolve)).transpose()?.map_or(0, |f| f + 1);
        self.timestamp(ts_ns);
        let f = &mut self.frame;
        for v in [thread, graph, node_index.map_or(0, |i| i + 1), dst, fused] {
            put_u64(f, u64::from(v));
        }
        f.extend_from_slice(tail);
        self.stats.values += 1;
        self.stats.value_bytes += self.emit(FrameKind::Value)?;
        Ok(())
    }

    pub fn marker(&mut self, call: &CallEvent) -> io::Result<()> {
        let thread = self.thread(call.header.tid)?;
        self.timestamp(call.header.ts_ns);
        let f = &mut self.frame;
        put_u64(f, u64::from(thread));
        put_u64(f, call.cookie);
        call.args[..3].iter().for_each(|&a| put_u64(f, a));
        self.stats.markers += 1;
        self.emit(FrameKind::Marker).map(drop)
    }

    /// A page fault with what its address resolved to.
    pub fn fault(&mut self, fault: &PageFaultEvent, memory: Memory, file: Option<FilePos>) -> io::Result<()> {
        let thread = self.thread(fault.header.tid)?;
        self.timestamp(fault.header.ts_ns);
        let f = &mut self.frame;
        for v in [u64::from(thread), fault.address, fault.ip, fault.error_code] {
            put_u64(f, v);
        }
        match file {
            Some(p) => {
                f.push(1);
                put_u64(f, u64::from(p.model));
                put_u64(f, u64::from(p.file));
                put_u64(f, p.offset);
            }
            None => f.push(0),
        }
        super::memory::encode(f, memory);
        self.stats.faults += 1;
        self.stats.io_bytes += self.emit(FrameKind::Fault)?;
        Ok(())
    }

    pub fn page_cache(&mut self, event: &PageCacheEvent) -> io::Result<()> {
        let thread = self.thread(event.header.tid)?;
        self.timestamp(event.header.ts_ns);
        let f = &mut self.frame;
        put_u64(f, u64::from(thread));
        put_u64(f, u64::from(event.kind));
        put_u64(f, u64::from(event.file.dev));
        put_u64(f, event.file.ino);
        put_u64(f, event.index);
        put_u64(f, u64::from(event.order));
        self.stats.page_cache += 1;
        self.stats.io_bytes += self.emit(FrameKind::PageCache)?;
        Ok(())
    }

    pub fn block(&mut self, event: &BlockEvent) -> io::Result<()> {
        let thread = self.thread(event.header.tid)?;
        let rwbs = self.string(c_str(&event.rwbs))?;
        let comm = self.string(c_str(&event.comm))?;
        self.timestamp(event.header.ts_ns);
        let f = &mut self.frame;
        put_u64(f, u64::from(thread));
        put_u64(f, u64::from(event.header.tgid));
        put_u64(f, u64::from(event.header.cpu));
        put_u64(f, u64::from(event.kind));
        put_u64(f, u64::from(event.dev));
        put_u64(f, event.sector);
        put_u64(f, u64::from(event.nr_sector));
        put_i64(f, i64::from(event.error));
        put_u64(f, u64::from(rwbs));
        put_u64(f, u64::from(comm));
        self.stats.block += 1;
        self.stats.io_bytes += self.emit(FrameKind::Block)?;
        Ok(())
    }

    pub fn lost(&mut self, lost: Lost) -> io::Result<()> {
        for kind in Lost::COUNTED {
            put_u64(&mut self.frame, lost[kind]);
        }
        // After the older kinds: readers that predate it stop before it.
        put_u64(&mut self.frame, lost.value);
        self.emit(FrameKind::Lost).map(drop)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn finish(self, trailer: &Trailer) -> io::Result<W> {
        self.finish_counted(trailer).map(|(out, _)| out)
    }

    /// [`Self::finish`], with the counts of everything written, END included.
    pub fn finish_counted(mut self, trailer: &Trailer) -> io::Result<(W, WriterStats)> {
        self.end(trailer)?;
        Ok((self.out, self.stats))
    }

    /// The END frame, flushed: the file is whole.
    fn end(&mut self, trailer: &Trailer) -> io::Result<()> {
        self.frame = serde_json::to_vec(trailer).map_err(io::Error::other)?;
        self.emit(FrameKind::End)?;
        self.out.flush()
    }
}

/// Magic, header length and header: the bytes written.
fn write_header(out: &mut impl Write, header: &Header) -> io::Result<u64> {
    let json = serde_json::to_vec(header).map_err(io::Error::other)?;
    out.write_all(MAGIC)?;
    out.write_all(&(json.len() as u32).to_le_bytes())?;
    out.write_all(&json)?;
    Ok((MAGIC.len() + 4 + json.len()) as u64)
}

fn descriptor_of(r: &TensorRecord, memory: Memory) -> Descriptor {
    Descriptor {
        tensor: r.tensor,
        name: String::from_utf8_lossy(tracer_common::c_str(&r.name)).into_owned(),
        type_id: r.type_,
        op: r.op,
        op_param0: r.op_param0,
        flags: r.flags,
        ne: r.ne,
        nb: r.nb,
        data: r.data,
        view_src: r.view_src,
        view_offs: r.view_offs,
        has_extra: r.extra != 0,
        memory,
    }
}

fn c_str(bytes: &[u8]) -> &str {
    std::str::from_utf8(tracer_common::c_str(bytes)).unwrap_or("?")
}
