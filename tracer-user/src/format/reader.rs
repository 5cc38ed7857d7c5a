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
    frames::{Descriptor, FORMAT_VERSION, FilePos, FrameKind, Header, Hooks, Lost, MAGIC, ModelTable, Trailer},
};

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
}

pub struct TraceReader<R: Read> {
    input: R,
    offset: u64,
    header: Header,
    strings: Vec<String>,
    threads: Vec<u32>,
    descriptors: Vec<Descriptor>,
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
    /// Ops of the last COMPUTE frame not returned yet.
    expanded: std::collections::VecDeque<Op>,
}

/// A node of a defined graph: its descriptor and `(slot, descriptor)` sources.
#[derive(Clone, Debug, PartialEq)]
struct GraphNode {
    dst: u32,
    srcs: Vec<(u32, u32)>,
}

/// Ops that only re-describe memory: the CPU backend's compute loop skips them.
const EMPTY_OPS: [&str; 5] = ["NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"];
/// `GGML_TENSOR_FLAG_COMPUTE`: the scheduler marks the nodes a backend runs.
const FLAG_COMPUTE: i32 = 16;

impl TraceReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|error| TraceError::Open { path: path.display().to_string(), error })?;
        Self::new(BufReader::with_capacity(1 << 20, file))
    }
}

impl<R: Read> TraceReader<R> {
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut magic = [0u8; 8];
        read_exact(&mut input, &mut magic, 0)?.then_some(()).ok_or(TraceError::Magic)?;
        if magic[..7] != MAGIC[..7] {
            return Err(TraceError::Magic);
        }
        if magic[7] != MAGIC[7] {
            return Err(TraceError::Version(u32::from(magic[7])));
        }
        let mut len = [0u8; 4];
        read_exact(&mut input, &mut len, 8)?.then_some(()).ok_or(TraceError::Magic)?;
        let len = u32::from_le_bytes(len) as usize;
        let mut json = Vec::new();
        let got = (&mut input)
            .take(len as u64)
            .read_to_end(&mut json)
            .map_err(|error| TraceError::Io { offset: 12, error })?;
        if got != len {
            return Err(TraceError::Frame {
                offset: 12,
                kind: 0,
                detail: format!("header of {len} bytes cut short at {got}"),
            });
        }
        let header: Header = serde_json::from_slice(&json).map_err(TraceError::Header)?;
        if !(1..=FORMAT_VERSION).contains(&header.format_version) {
            return Err(TraceError::Version(header.format_version));
        }
        Ok(Self {
            input,
            offset: 12 + len as u64,
            last_ts: header.start_monotonic_ns,
            header,
            strings: Vec::new(),
            threads: Vec::new(),
            descriptors: Vec::new(),
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
            expanded: std::collections::VecDeque::new(),
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
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
            if let Some(op) = self.expanded.pop_front() {
                return Ok(Some(Record::Op(op)));
            }
            if self.ended {
                return Ok(None);
            }
            let frame_offset = self.offset;
            let Some((kind, start, end)) = self.read_frame()? else {
                self.truncated = true;
                return Ok(None);
            };
            let buf = std::mem::take(&mut self.buf);
            let parsed = self.parse(kind, &buf[start..end]);
            self.buf = buf;
            match parsed {
                Ok(Some(record)) => return Ok(Some(record)),
                Ok(None) => continue,
                Err(detail) => return Err(TraceError::Frame { offset: frame_offset, kind, detail }),
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
                self.by_address.insert(d.tensor, self.descriptors.len() as u32);
                self.descriptors.push(d);
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
                let dst = c.u32().map_err(e)?;
                self.check_descriptor(dst)?;
                let srcs = self.sources(&mut c)?;
                let n_ids = c.u32().map_err(e)?;
                if n_ids as usize > tracer_common::MAX_TOKEN_IDS {
                    return Err(format!("{n_ids} token ids"));
                }
                let mut token_ids = Vec::with_capacity(n_ids as usize);
                for _ in 0..n_ids {
                    token_ids.push(c.i32().map_err(e)?);
                }
                Ok(Some(Record::Op(Op { ts_ns, tid, ith, nth, hook, dst, srcs, token_ids })))
            }
            FrameKind::Graph => {
                let id = c.u32().map_err(e)?;
                if id as usize != self.graphs.len() {
                    return Err(format!("graph {id} defined out of order"));
                }
                let n_nodes = c.u32().map_err(e)?;
                let mut nodes = Vec::with_capacity((n_nodes as usize).min(1 << 16));
                for _ in 0..n_nodes {
                    let dst = c.u32().map_err(e)?;
                    self.check_descriptor(dst)?;
                    let srcs = self.sources(&mut c)?;
                    nodes.push(GraphNode { dst, srcs });
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
                    let id = c.u32().map_err(e)?;
                    self.check_descriptor(id)?;
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
                let get_rows = self.header.op_id(tracer_common::ggml::OP_GET_ROWS);
                let mut ops = Vec::new();
                for node in self.graph_ops(graph)? {
                    let token_ids = if Some(self.descriptors[node.dst as usize].op) == get_rows {
                        node.srcs
                            .iter()
                            .find(|(slot, _)| *slot == 1)
                            .and_then(|&(_, id)| {
                                let tensor = self.descriptors[id as usize].tensor;
                                inputs.iter().find(|(t, _)| *t == tensor)
                            })
                            .map(|(_, ids)| ids.clone())
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    let hook = tracer_common::hooks::GRAPH;
                    ops.push(Op {
                        ts_ns,
                        tid,
                        ith: 0,
                        nth: 0,
                        hook,
                        dst: node.dst,
                        srcs: node.srcs.clone(),
                        token_ids,
                    });
                }
                self.expanded.extend(ops);
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
                Ok(Some(Record::Buffer(b)))
            }
            FrameKind::Value => {
                let ts_ns = self.ts(&mut c).map_err(e)?;
                let tid = self.tid(c.u32().map_err(e)?)?;
                let value = super::values::decode((ts_ns, tid), &mut c).map_err(e)?;
                for id in std::iter::once(value.dst).chain(value.fused) {
                    self.check_descriptor(id)?;
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
                        model: c.u32().map_err(e)?,
                        file: c.u32().map_err(e)?,
                        offset: c.u64().map_err(e)?,
                    }),
                };
                let memory = super::memory::decode(&mut c).map_err(e)??;
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
                let model = self.models.len() as u32;
                for (file, info) in table.file_info.iter().enumerate() {
                    self.files.insert((info.dev, info.ino), (model, file as u32));
                }
                self.models.push(table);
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
                Ok(Some(Record::Lost(lost)))
            }
            FrameKind::Hooks => {
                let hooks: Hooks = serde_json::from_slice(c.rest()).map_err(|e| e.to_string())?;
                self.header.libraries.extend(hooks.libraries);
                if self.header.build.is_none() {
                    if self.header.llama_commit.is_none() {
                        self.header.llama_commit = hooks.build.as_ref().and_then(|b| b.llama_commit.clone());
                    }
                    self.header.build = hooks.build;
                }
                if self.header.op_names.is_empty() {
                    self.header.op_names = hooks.op_names;
                    self.header.unary_op_names = hooks.unary_op_names;
                    self.header.glu_op_names = hooks.glu_op_names;
                }
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

    /// The nodes of graph `graph` that the CPU backend executes. ggml marks
    /// them with `FLAG_COMPUTE` since 2026; before, it ran every node (a
    /// graph with no node so marked comes from such a build).
    fn graph_ops(&self, graph: u32) -> Result<impl Iterator<Item = &GraphNode>, String> {
        let nodes = self.graphs.get(graph as usize).ok_or_else(|| format!("graph {graph} not defined"))?;
        let empty: Vec<i32> = EMPTY_OPS.iter().filter_map(|name| self.header.op_id(name)).collect();
        let flagged = nodes.iter().any(|node| self.descriptors[node.dst as usize].flags & FLAG_COMPUTE != 0);
        Ok(nodes.iter().filter(move |node| {
            let d = &self.descriptors[node.dst as usize];
            !empty.contains(&d.op) && (!flagged || d.flags & FLAG_COMPUTE != 0)
        }))
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
            let id = c.u32().map_err(e)?;
            self.check_descriptor(id)?;
            srcs.push((slot, id));
        }
        Ok(srcs)
    }

    fn check_descriptor(&self, id: u32) -> Result<(), String> {
        if (id as usize) < self.descriptors.len() { Ok(()) } else { Err(format!("tensor descriptor {id} not defined")) }
    }

    fn parse_descriptor(&self, c: &mut Cursor) -> Result<Result<Descriptor, String>, CodecError> {
        let tensor = c.u64()?;
        let name_id = c.u32()?;
        let Some(name) = self.strings.get(name_id as usize).cloned() else {
            return Ok(Err(format!("string {name_id} not defined")));
        };
        let (type_id, op, op_param0, flags) = (c.i32()?, c.i32()?, c.i32()?, c.i32()?);
        let ne = [c.i64()?, c.i64()?, c.i64()?, c.i64()?];
        let nb = [c.u64()?, c.u64()?, c.u64()?, c.u64()?];
        let (data, view_src, view_offs, has_extra) = (c.u64()?, c.u64()?, c.u64()?, c.u64()? != 0);
        let memory = match super::memory::decode(c)? {
            Ok(memory) => memory,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(Descriptor {
            tensor,
            name,
            type_id,
            op,
            op_param0,
            flags,
            ne,
            nb,
            data,
            view_src,
            view_offs,
            has_extra,
            memory,
        }))
    }
}

/// `read_exact` that reports a clean end of file as `false`.
fn read_exact(input: &mut impl Read, buf: &mut [u8], offset: u64) -> Result<bool, TraceError> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(error) => Err(TraceError::Io { offset, error }),
    }
}
