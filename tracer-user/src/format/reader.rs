//! Reading a trace back, frame by frame, in bounded memory (only the
//! interning tables are kept). A file cut short ends at its last complete
//! frame with `truncated` set; anything malformed is an error naming the
//! byte offset.

use std::{
    fs::File,
    io::{self, BufReader, ErrorKind, Read},
    path::Path,
};

use tracer_common::{BlockKind, PageCacheKind};

pub use super::records::{
    Batch, BatchArray, Block, BufferAction, BufferRecord, Fault, Marker, Op, PageCache, Record, Routing,
};

use super::{
    codec::{CodecError, Cursor},
    frames::{Descriptor, FORMAT_VERSION, FilePos, FrameKind, Header, Hooks, Lost, ModelTable, Trailer},
    ring::RingError,
};

mod chain;
mod decode;
mod expand;
pub use chain::merge_hooks;
use decode::read_header;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {error}")]
    Open { path: String, error: io::Error },
    #[error("reading the trace at byte {offset}: {error}")]
    Io { offset: u64, error: io::Error },
    #[error("not a ttrace trace file (bad magic); expected one written by `ttrace run` or `ttrace attach`")]
    Magic,
    #[error(
        "trace format version {0} is not supported by this ttrace (which reads versions 1 to {FORMAT_VERSION}); \
         read it with the ttrace that wrote it"
    )]
    Version(u32),
    #[error("trace header is not valid JSON: {0}")]
    Header(serde_json::Error),
    #[error("malformed frame (kind {kind}) at byte {offset}: {detail}")]
    Frame { offset: u64, kind: u8, detail: String },
    #[error("{file}: {error}")]
    InFile { file: String, error: Box<TraceError> },
    #[error(transparent)]
    Ring(Box<RingError>),
}

impl From<RingError> for TraceError {
    fn from(error: RingError) -> Self {
        Self::Ring(Box::new(error))
    }
}

pub struct TraceReader<R: Read> {
    input: R,
    offset: u64,
    header: Header,
    op_ids: expand::OpIds,
    strings: Vec<String>,
    threads: Vec<u32>,
    descriptors: Vec<Descriptor>,
    /// The current file's descriptor and model ids → the reader's: a
    /// ring's files each count from 0 (see `chain`); one file's map to themselves.
    local_ids: Vec<u32>,
    local_models: Vec<u32>,
    /// Tensor address → its latest descriptor.
    by_address: std::collections::HashMap<u64, u32>,
    models: Vec<ModelTable>,
    files: std::collections::HashMap<(u32, u64), (u32, u32)>,
    last_ts: u64,
    /// Read ahead from `input`: `buf[pos..end]` is not parsed yet and starts
    /// at file byte `offset`. Frames are parsed in place, no copy per frame.
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// The file ended inside a frame, or without an END frame.
    pub truncated: bool,
    ended: bool,
    /// OP frames are stepped over (their timestamp kept) instead of returned.
    skip_ops: bool,
    skipped_ops: u64,
    /// GRAPH definitions, by id.
    graphs: Vec<Vec<GraphNode>>,
    /// The last COMPUTE frame's graph run, its ops not all returned yet.
    expanding: Option<expand::Expansion>,
    /// A ring's files after the first, and what reading one needs (see `chain`).
    chain: chain::Chain<R>,
}

/// A node of a defined graph: its descriptor and `(slot, descriptor)` sources.
#[derive(Clone, Debug, PartialEq)]
struct GraphNode {
    dst: u32,
    srcs: std::sync::Arc<[(u32, u32)]>,
}

impl TraceReader<BufReader<File>> {
    /// The trace at `path`; when no such file exists but a ring's files
    /// `path.NNNN` do (`--max-size`), those as one run.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        match open_file(path) {
            Err(TraceError::Open { error, .. }) if error.kind() == ErrorKind::NotFound => {
                match super::ring::Members::find(path)? {
                    Some(members) => Self::open_ring(members),
                    None => Err(TraceError::Open { path: path.display().to_string(), error }),
                }
            }
            opened => Self::new(opened?),
        }
    }
}

fn open_file(path: &Path) -> Result<BufReader<File>, TraceError> {
    let file = File::open(path).map_err(|error| TraceError::Open { path: path.display().to_string(), error })?;
    Ok(BufReader::with_capacity(1 << 20, file))
}

impl<R: Read> TraceReader<R> {
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let (mut header, offset) = read_header(&mut input)?;
        let chain = chain::Chain::starting(&mut header);
        Ok(Self {
            input,
            offset,
            last_ts: header.start_monotonic_ns,
            op_ids: expand::OpIds::of(&header),
            header,
            strings: Vec::new(),
            threads: Vec::new(),
            descriptors: Vec::new(),
            local_ids: Vec::new(),
            local_models: Vec::new(),
            by_address: std::collections::HashMap::new(),
            models: Vec::new(),
            files: std::collections::HashMap::new(),
            buf: Vec::new(),
            pos: 0,
            end: 0,
            truncated: false,
            ended: false,
            skip_ops: false,
            skipped_ops: 0,
            graphs: Vec::new(),
            expanding: None,
            chain,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The header's id of GET_ROWS.
    pub fn get_rows_op(&self) -> Option<i32> {
        self.op_ids.get_rows
    }

    pub fn descriptor(&self, id: u32) -> &Descriptor {
        &self.descriptors[id as usize]
    }

    pub fn descriptors(&self) -> &[Descriptor] {
        &self.descriptors
    }

    pub fn models(&self) -> &[ModelTable] {
        &self.models
    }

    /// Until turned off, step over OP frames without decoding or checking
    /// them: for a pass that needs only some ops (export's phase scan).
    pub fn skip_ops(&mut self, skip: bool) {
        self.skip_ops = skip;
    }

    /// OP frames stepped over so far.
    pub fn skipped_ops(&self) -> u64 {
        self.skipped_ops
    }

    /// The next event record, or `None` at the end (check `truncated`).
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            if let Some(op) = self.next_expanded() {
                return Ok(Some(Record::Op(op)));
            }
            if self.ended {
                if self.next_file()? {
                    continue;
                }
                return Ok(None);
            }
            let frame_offset = self.offset;
            let Some((kind, start, end)) = self.read_frame().map_err(|e| self.chain.in_file(e))? else {
                self.truncated = true;
                self.chain.check_last()?;
                return Ok(None);
            };
            let buf = std::mem::take(&mut self.buf);
            let parsed = self.parse(kind, &buf[start..end]);
            self.buf = buf;
            match parsed {
                // A ring's file ends; the run goes on in the next.
                Ok(Some(Record::End(_))) if self.chain.has_more() => continue,
                Ok(Some(record)) => return Ok(Some(record)),
                Ok(None) => continue,
                Err(detail) => {
                    return Err(self.chain.in_file(TraceError::Frame { offset: frame_offset, kind, detail }));
                }
            }
        }
    }

    /// Makes `n` unparsed bytes available in `buf`; `false` if the file ends first.
    fn fill(&mut self, n: usize) -> Result<bool, TraceError> {
        const CHUNK: usize = 1 << 18;
        while self.end - self.pos < n {
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                (self.end, self.pos) = (self.end - self.pos, 0);
            }
            if self.end == self.buf.len() {
                // Grow with what arrives: a corrupt length cannot allocate
                // much more than the file holds.
                let grown = (self.buf.len() * 2).clamp(CHUNK, n.max(CHUNK));
                self.buf.resize(grown, 0);
            }
            let got = loop {
                match self.input.read(&mut self.buf[self.end..]) {
                    Ok(got) => break got,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(error) => return Err(TraceError::Io { offset: self.offset + self.end as u64, error }),
                }
            };
            if got == 0 {
                return Ok(false);
            }
            self.end += got;
        }
        Ok(true)
    }

    /// The next `[kind][len][payload]`: its kind and the payload's range in
    /// `buf`; `None` on a clean or mid-frame end of file.
    fn read_frame(&mut self) -> Result<Option<(u8, usize, usize)>, TraceError> {
        // Kind and length take at most 11 bytes; fewer are fine near the end.
        self.fill(11)?;
        let head = &self.buf[self.pos..self.end];
        let Some(&kind) = head.first() else { return Ok(None) };
        let mut len = 0u64;
        let mut prefix = 1usize;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = head.get(prefix) else { return Ok(None) };
            prefix += 1;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        // No frame is anywhere near this big; a larger length is corruption.
        if len > 1 << 30 {
            return Err(TraceError::Frame { offset: self.offset, kind, detail: format!("length {len}") });
        }
        if !self.fill(prefix + len as usize)? {
            return Ok(None);
        }
        let start = self.pos + prefix;
        self.pos = start + len as usize;
        self.offset += prefix as u64 + len;
        Ok(Some((kind, start, self.pos)))
    }

    fn parse(&mut self, frame_kind: u8, payload: &[u8]) -> Result<Option<Record>, String> {
        // Unknown kinds are skipped: newer writers may add frames.
        let Ok(frame_kind) = FrameKind::try_from(frame_kind) else { return Ok(None) };
        let mut c = Cursor::new(payload);
        let e = |e: CodecError| e.to_string();
        match frame_kind {
            FrameKind::String => {
                let s = String::from_utf8_lossy(c.bytes().map_err(e)?).into_owned();
                self.strings.push(s);
                Ok(None)
            }
            FrameKind::Thread => {
                let tid = c.u32().map_err(e)?;
                self.threads.push(tid);
                Ok(None)
            }
            FrameKind::Tensor => {
                let d = self.parse_descriptor(&mut c).map_err(e)??;
                let id = self.chain.add_descriptor(&mut self.descriptors, d);
                self.by_address.insert(self.descriptors[id as usize].tensor, id);
                self.local_ids.push(id);
                Ok(None)
            }
            FrameKind::Op if self.skip_ops => {
                self.ts(&mut c).map_err(e)?;
                self.skipped_ops += 1;
                Ok(None)
            }
            FrameKind::Op => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let (ith, nth, hook) = (c.u32().map_err(e)?, c.u32().map_err(e)?, c.u32().map_err(e)?);
                let dst = self.global(c.u32().map_err(e)?)?;
                let srcs = self.sources(&mut c)?;
                let n_ids = c.u32().map_err(e)?;
                if n_ids as usize > tracer_common::MAX_TOKEN_IDS {
                    return Err(format!("{n_ids} token ids"));
                }
                let mut token_ids = Vec::with_capacity(n_ids as usize);
                for _ in 0..n_ids {
                    token_ids.push(c.i32().map_err(e)?);
                }
                Ok(Some(Record::Op(Op { ts_ns, tid, ith, nth, hook, dst, srcs: srcs.into(), token_ids })))
            }
            FrameKind::Graph => {
                let id = c.u32().map_err(e)?;
                if id as usize != self.graphs.len() {
                    return Err(format!("graph {id} defined out of order"));
                }
                let n_nodes = c.u32().map_err(e)?;
                let mut nodes = Vec::with_capacity((n_nodes as usize).min(1 << 16));
                for _ in 0..n_nodes {
                    let dst = self.global(c.u32().map_err(e)?)?;
                    let srcs = self.sources(&mut c)?;
                    nodes.push(GraphNode { dst, srcs: srcs.into() });
                }
                self.graphs.push(nodes);
                Ok(None)
            }
            FrameKind::Compute => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let graph = c.u32().map_err(e)?;
                let n_inputs = c.u32().map_err(e)?;
                let mut inputs = Vec::with_capacity((n_inputs as usize).min(16));
                for _ in 0..n_inputs {
                    let id = self.global(c.u32().map_err(e)?)?;
                    let ids: Vec<i32> = c
                        .bytes()
                        .map_err(e)?
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    inputs.push((self.descriptors[id as usize].tensor, ids));
                }
                if self.skip_ops {
                    let n = self.graph_ops(graph)?.count();
                    self.skipped_ops += n as u64;
                    return Ok(None);
                }
                self.expand(graph, ts_ns, tid, inputs)?;
                Ok(None)
            }
            FrameKind::Routing => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let node = self.by_address.get(&c.u64().map_err(e)?).copied();
                let row = c.u32().map_err(e)?;
                let n = c.u32().map_err(e)? as usize;
                if n > tracer_common::MAX_EXPERTS {
                    return Err(format!("{n} experts in a routing row"));
                }
                let experts = (0..n).map(|_| c.i64().map(|v| v as i32)).collect::<Result<_, _>>().map_err(e)?;
                Ok(Some(Record::Routing(Routing { ts_ns, tid, node, row, experts })))
            }
            FrameKind::Batch => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let array = match c.u64().map_err(e)? {
                    tracer_common::batch::TOKEN => BatchArray::Token,
                    tracer_common::batch::POS => BatchArray::Pos,
                    tracer_common::batch::SEQ => BatchArray::Seq,
                    tracer_common::batch::OUTPUT => BatchArray::Output,
                    other => return Err(format!("unknown batch array {other}")),
                };
                let n_tokens = c.u32().map_err(e)?;
                let n = c.u32().map_err(e)?;
                if n > tracer_common::batch::MAX_BATCH_TOKENS {
                    return Err(format!("{n} values in a batch array"));
                }
                let values = (0..n).map(|_| c.i64().map(|v| v as i32)).collect::<Result<_, _>>().map_err(e)?;
                Ok(Some(Record::Batch(Batch { ts_ns, tid, array, n_tokens, values })))
            }
            FrameKind::Buffer => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let b = super::buffers::decode((ts_ns, tid), &mut c).map_err(e)??;
                Ok((!self.chain.skip_carried_buffer()).then_some(Record::Buffer(b)))
            }
            FrameKind::Value => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let mut value = super::values::decode((ts_ns, tid), &mut c).map_err(e)?;
                value.dst = self.global(value.dst)?;
                value.fused = value.fused.map(|f| self.global(f)).transpose()?;
                if value.node_index.is_some() {
                    value.graph += self.chain.graph_base;
                }
                Ok(Some(Record::Value(Box::new(value))))
            }
            FrameKind::Marker => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let cookie = c.u64().map_err(e)?;
                let args = [c.u64().map_err(e)?, c.u64().map_err(e)?, c.u64().map_err(e)?];
                Ok(Some(Record::Marker(Marker { ts_ns, tid, cookie, args })))
            }
            FrameKind::Fault => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let (address, ip, error_code) = (c.u64().map_err(e)?, c.u64().map_err(e)?, c.u64().map_err(e)?);
                let file = match c.u64().map_err(e)? {
                    0 => None,
                    _ => Some(FilePos {
                        model: self.global_model(c.u32().map_err(e)?)?,
                        file: c.u32().map_err(e)?,
                        offset: c.u64().map_err(e)?,
                    }),
                };
                let memory = self.global_memory(super::memory::decode(&mut c).map_err(e)??)?;
                Ok(Some(Record::Fault(Fault { ts_ns, tid, address, ip, error_code, file, memory })))
            }
            FrameKind::PageCache => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let kind = c.u32().map_err(e)?;
                let kind = PageCacheKind::try_from(kind).map_err(|_| format!("page-cache kind {kind}"))?;
                let (dev, ino) = (c.u32().map_err(e)?, c.u64().map_err(e)?);
                let (index, order) = (c.u64().map_err(e)?, c.u32().map_err(e)?);
                let file = self.files.get(&(dev, ino)).copied();
                Ok(Some(Record::PageCache(PageCache { ts_ns, tid, kind, dev, ino, index, order, file })))
            }
            FrameKind::Block => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let (tgid, cpu, kind, dev) =
                    (c.u32().map_err(e)?, c.u32().map_err(e)?, c.u32().map_err(e)?, c.u32().map_err(e)?);
                let kind = BlockKind::try_from(kind).map_err(|_| format!("block kind {kind}"))?;
                let (sector, nr_sector, error) = (c.u64().map_err(e)?, c.u32().map_err(e)?, c.i32().map_err(e)?);
                let rwbs = self.string(c.u32().map_err(e)?)?;
                let comm = self.string(c.u32().map_err(e)?)?;
                Ok(Some(Record::Block(Block {
                    ts_ns,
                    tid,
                    tgid,
                    cpu,
                    kind,
                    dev,
                    sector,
                    nr_sector,
                    error,
                    rwbs,
                    comm,
                })))
            }
            FrameKind::Model => {
                let table: ModelTable = serde_json::from_slice(c.rest()).map_err(|e| e.to_string())?;
                // A ring's later file restates the models read before.
                if let Some(model) = self.chain.known_model(&self.models, &table) {
                    self.local_models.push(model);
                    return Ok(None);
                }
                let model = self.models.len() as u32;
                for (file, info) in table.file_info.iter().enumerate() {
                    self.files.insert((info.dev, info.ino), (model, file as u32));
                }
                self.models.push(table);
                self.local_models.push(model);
                Ok(Some(Record::Model(model)))
            }
            FrameKind::Lost => {
                let mut lost = Lost::default();
                for kind in Lost::COUNTED {
                    lost[kind] = c.u64().map_err(e)?;
                }
                if !c.at_end() {
                    lost.value = c.u64().map_err(e)?;
                }
                Ok(Some(Record::Lost(self.chain.lost_since_start(lost))))
            }
            FrameKind::Hooks => {
                let hooks: Hooks = serde_json::from_slice(c.rest()).map_err(|e| e.to_string())?;
                merge_hooks(&mut self.header, hooks);
                // Op names may come only now (a library loaded late).
                self.op_ids = expand::OpIds::of(&self.header);
                Ok(None)
            }
            FrameKind::Maps => {
                self.header.maps = String::from_utf8_lossy(c.rest()).into_owned();
                Ok(None)
            }
            FrameKind::End => {
                let trailer: Trailer = serde_json::from_slice(c.rest()).map_err(|e| e.to_string())?;
                self.ended = true;
                Ok(Some(Record::End(Box::new(trailer))))
            }
        }
    }

    fn ts(&mut self, c: &mut Cursor) -> Result<u64, CodecError> {
        self.last_ts = self.last_ts.wrapping_add(c.i64()? as u64);
        Ok(self.last_ts)
    }

    fn tid(&self, index: u32) -> Result<u32, String> {
        self.threads.get(index as usize).copied().ok_or_else(|| format!("thread index {index} not defined"))
    }

    fn string(&self, id: u32) -> Result<String, String> {
        self.strings.get(id as usize).cloned().ok_or_else(|| format!("string {id} not defined"))
    }

    /// A node's sources: a count, then `(slot, descriptor)` pairs.
    fn sources(&self, c: &mut Cursor) -> Result<Vec<(u32, u32)>, String> {
        let e = |e: CodecError| e.to_string();
        let n_src = c.u32().map_err(e)?;
        if n_src as usize > tracer_common::ggml::MAX_SRC {
            return Err(format!("{n_src} sources"));
        }
        let mut srcs = Vec::with_capacity(n_src as usize);
        for _ in 0..n_src {
            let slot = c.u32().map_err(e)?;
            let id = self.global(c.u32().map_err(e)?)?;
            srcs.push((slot, id));
        }
        Ok(srcs)
    }

    /// The reader's id of the current file's descriptor `id`.
    fn global(&self, id: u32) -> Result<u32, String> {
        self.local_ids.get(id as usize).copied().ok_or_else(|| format!("tensor descriptor {id} not defined"))
    }
}
