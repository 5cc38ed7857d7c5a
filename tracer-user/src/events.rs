//! Decoding ring-buffer records into typed events (no root needed).

use std::{mem::size_of, ptr};

use tracer_common::{
    BlockEvent, BufferEvent, CallEvent, EventHeader, EventKind, GraphEvent, INPUT_EVENT_FIXED, NodeEvent, OpEvent,
    PageCacheEvent, PageFaultEvent, RoutingEvent, TensorRecord,
};

/// One event from the kernel side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Call(CallEvent),
    PageFault(PageFaultEvent),
    /// `--op-timing`: a node started on a thread (its tensors are its graph's).
    Op(OpEvent),
    PageCache(PageCacheEvent),
    Block(BlockEvent),
    Graph(GraphEvent),
    Node(Box<NodeEvent>),
    Input(InputRecord),
    Routing(RoutingRecord),
    /// An array of a `llama_decode` batch (`uid`: its token count, `tensor`:
    /// which array).
    Batch(InputRecord),
    /// A backend buffer created, given a usage or freed.
    Buffer(BufferEvent),
    /// `--values`: a node output's head or one chunk of its bytes.
    Value(Box<ValueRecord>),
}

/// A [`tracer_common::values::ValueEvent`] with its variable part: the
/// node's record (head) or `len` bytes (chunk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueRecord {
    pub header: EventHeader,
    pub run: u64,
    pub node: u64,
    pub site: u64,
    pub fused: u64,
    /// Head: bytes that follow. Chunk: offset of `data`.
    pub offset: u64,
    pub flags: u32,
    /// Head: the node as read; `None` for a chunk.
    pub tensor: Option<TensorRecord>,
    pub data: Vec<u8>,
}

/// One token's expert ranking from an `ffn_moe_argsort-L` node (best first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingRecord {
    pub header: EventHeader,
    /// Address of the argsort node's `ggml_tensor`.
    pub tensor: u64,
    /// The token's index in its ubatch.
    pub row: u32,
    pub experts: Vec<i32>,
}

/// A graph run's integer input (token ids, positions), as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputRecord {
    pub header: EventHeader,
    pub uid: u64,
    pub tensor: u64,
    pub data: Vec<u8>,
}

impl InputRecord {
    /// `data` as the little-endian i32s it holds (token ids, positions, ...).
    pub fn i32s(&self) -> Vec<i32> {
        self.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

/// An executed ggml node as the trace records it: a per-node [`OpEvent`]
/// with its tensors from its graph's definition (`live::op_times`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    pub header: EventHeader,
    pub ith: u32,
    pub nth: u32,
    pub hook: u32,
    /// The token-embedding GET_ROWS's ids, at most `MAX_TOKEN_IDS`.
    pub token_ids: Vec<i32>,
    /// `tensors[0]` is the destination; the rest are the present sources in slot order.
    pub tensors: Vec<TensorRecord>,
}

/// A tensor record's name, up to its NUL ("" when not UTF-8).
pub fn tensor_name(record: &TensorRecord) -> &str {
    std::str::from_utf8(tracer_common::c_str(&record.name)).unwrap_or("")
}

impl Event {
    pub fn header(&self) -> &EventHeader {
        match self {
            Event::Call(e) => &e.header,
            Event::PageFault(e) => &e.header,
            Event::Op(e) => &e.header,
            Event::PageCache(e) => &e.header,
            Event::Block(e) => &e.header,
            Event::Graph(e) => &e.header,
            Event::Node(e) => &e.header,
            Event::Input(e) => &e.header,
            Event::Routing(e) => &e.header,
            Event::Batch(e) => &e.header,
            Event::Buffer(e) => &e.header,
            Event::Value(e) => &e.header,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event record of {len} bytes is shorter than its {}-byte header", size_of::<EventHeader>())]
    Short { len: usize },
    #[error("event record has unknown kind {0}")]
    UnknownKind(u32),
    #[error("{kind} event record is {len} bytes, expected {expected}")]
    Size { kind: &'static str, len: usize, expected: usize },
}

/// Decode one ring-buffer record. Records carry no alignment guarantee
/// beyond 8 bytes, so fields are read unaligned.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    if bytes.len() < size_of::<EventHeader>() {
        return Err(DecodeError::Short { len: bytes.len() });
    }
    // SAFETY: length checked above; EventHeader is plain old data.
    let header: EventHeader = unsafe { ptr::read_unaligned(bytes.as_ptr().cast()) };
    let kind = EventKind::try_from(header.kind).map_err(|_| DecodeError::UnknownKind(header.kind))?;
    match kind {
        EventKind::Call => read::<CallEvent>(kind, bytes).map(Event::Call),
        EventKind::PageFault => read::<PageFaultEvent>(kind, bytes).map(Event::PageFault),
        EventKind::Op => read::<OpEvent>(kind, bytes).map(Event::Op),
        EventKind::PageCache => read::<PageCacheEvent>(kind, bytes).map(Event::PageCache),
        EventKind::Block => read::<BlockEvent>(kind, bytes).map(Event::Block),
        EventKind::Graph => read::<GraphEvent>(kind, bytes).map(Event::Graph),
        EventKind::Node => read::<NodeEvent>(kind, bytes).map(|n| Event::Node(Box::new(n))),
        EventKind::Input => decode_input(bytes).map(Event::Input),
        EventKind::Routing => decode_routing(bytes).map(Event::Routing),
        EventKind::Batch => decode_input(bytes).map(Event::Batch),
        EventKind::Buffer => read::<BufferEvent>(kind, bytes).map(Event::Buffer),
        EventKind::Value => decode_value(bytes).map(|v| Event::Value(Box::new(v))),
    }
}

/// Value events are variable-length: the fixed part, then a head's tensor
/// record or a chunk's `len` bytes.
fn decode_value(bytes: &[u8]) -> Result<ValueRecord, DecodeError> {
    use tracer_common::values::{VALUE_CHUNK_BYTES, VALUE_EVENT_FIXED, VALUE_HEAD_BYTES, part};
    let short = |expected| DecodeError::Size { kind: "value", len: bytes.len(), expected };
    if bytes.len() < VALUE_EVENT_FIXED {
        return Err(short(VALUE_EVENT_FIXED));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    // SAFETY: length checked; EventHeader is plain old data.
    let header: EventHeader = unsafe { ptr::read_unaligned(bytes.as_ptr().cast()) };
    let (len, which, flags) = (u32_at(64) as usize, u32_at(68), u32_at(72));
    let (tensor, data) = if which == part::HEAD {
        if bytes.len() != VALUE_HEAD_BYTES {
            return Err(short(VALUE_HEAD_BYTES));
        }
        // SAFETY: exactly one TensorRecord (Pod) after the fixed part.
        let record = unsafe { ptr::read_unaligned(bytes[VALUE_EVENT_FIXED..].as_ptr().cast::<TensorRecord>()) };
        (Some(record), Vec::new())
    } else {
        if len > VALUE_CHUNK_BYTES || bytes.len() != VALUE_EVENT_FIXED + len {
            return Err(short(VALUE_EVENT_FIXED + len.min(VALUE_CHUNK_BYTES)));
        }
        (None, bytes[VALUE_EVENT_FIXED..].to_vec())
    };
    Ok(ValueRecord {
        header,
        run: u64_at(24),
        node: u64_at(32),
        site: u64_at(40),
        fused: u64_at(48),
        offset: u64_at(56),
        flags,
        tensor,
        data,
    })
}

/// Routing events hold `n_experts` valid ids.
fn decode_routing(bytes: &[u8]) -> Result<RoutingRecord, DecodeError> {
    let event: RoutingEvent = read(EventKind::Routing, bytes)?;
    let n = (event.n_experts as usize).min(event.ids.len());
    Ok(RoutingRecord { header: event.header, tensor: event.tensor, row: event.row, experts: event.ids[..n].to_vec() })
}

/// Input events are variable-length: the fixed part, then `len` bytes.
fn decode_input(bytes: &[u8]) -> Result<InputRecord, DecodeError> {
    if bytes.len() < INPUT_EVENT_FIXED {
        return Err(DecodeError::Size { kind: "input", len: bytes.len(), expected: INPUT_EVENT_FIXED });
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    // SAFETY: length checked; EventHeader is plain old data.
    let header: EventHeader = unsafe { ptr::read_unaligned(bytes.as_ptr().cast()) };
    let len = u32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes")) as usize;
    let data = bytes.get(INPUT_EVENT_FIXED..INPUT_EVENT_FIXED + len).ok_or(DecodeError::Size {
        kind: "input",
        len: bytes.len(),
        expected: INPUT_EVENT_FIXED + len,
    })?;
    Ok(InputRecord { header, uid: field(24), tensor: field(32), data: data.to_vec() })
}

/// `T` is one of tracer-common's `#[repr(C)]` integer-only event structs.
fn read<T: Copy>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() != size_of::<T>() {
        return Err(DecodeError::Size { kind: kind.name(), len: bytes.len(), expected: size_of::<T>() });
    }
    // SAFETY: exact length checked; T holds only integers (any bit pattern is valid).
    Ok(unsafe { ptr::read_unaligned(bytes.as_ptr().cast()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) POD value.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn decodes_each_kind() {
        let header = EventHeader { kind: EventKind::Call as u32, cpu: 1, ts_ns: 5, tgid: 7, tid: 8 };
        let call = CallEvent { header, cookie: 3, args: [1, 2, 3, 4, 5, 6] };
        assert_eq!(decode(&bytes_of(&call)), Ok(Event::Call(call)));
        let header = EventHeader { kind: EventKind::PageFault as u32, ..header };
        let fault = PageFaultEvent { header, address: 0x1000, ip: 0x2000, error_code: 6 };
        assert_eq!(decode(&bytes_of(&fault)), Ok(Event::PageFault(fault)));
    }

    #[test]
    fn rejects_malformed_records() {
        assert_eq!(decode(&[0; 3]), Err(DecodeError::Short { len: 3 }));
        let header = EventHeader { kind: 99, ..Default::default() };
        assert_eq!(decode(&bytes_of(&header)), Err(DecodeError::UnknownKind(99)));
        let header = EventHeader { kind: EventKind::Call as u32, ..Default::default() };
        assert!(matches!(decode(&bytes_of(&header)), Err(DecodeError::Size { kind: "call", .. })));
    }

    #[test]
    fn decodes_a_node_start() {
        let header = EventHeader { kind: EventKind::Op as u32, cpu: 0, ts_ns: 9, tgid: 1, tid: 2 };
        let op = OpEvent { header, node: 0x10, fused: 0x20, ith: 1, nth: 2, hook: 1, _pad: 0 };
        assert_eq!(decode(&bytes_of(&op)), Ok(Event::Op(op)));
        assert!(matches!(decode(&bytes_of(&op)[..40]), Err(DecodeError::Size { kind: "op", .. })));
    }
}
