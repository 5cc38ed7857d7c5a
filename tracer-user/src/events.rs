//! Decoding ring-buffer records into typed events (no root needed).

use std::{mem::size_of, ptr};

use tracer_common::{CallEvent, EventHeader, EventKind, PageFaultEvent};

/// One event from the kernel side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Call(CallEvent),
    PageFault(PageFaultEvent),
}

impl Event {
    pub fn header(&self) -> &EventHeader {
        match self {
            Event::Call(e) => &e.header,
            Event::PageFault(e) => &e.header,
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
    let kind = EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    match kind {
        EventKind::Call => read::<CallEvent>(kind, bytes).map(Event::Call),
        EventKind::PageFault => read::<PageFaultEvent>(kind, bytes).map(Event::PageFault),
    }
}

fn read<T: aya::Pod>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() != size_of::<T>() {
        return Err(DecodeError::Size { kind: kind.name(), len: bytes.len(), expected: size_of::<T>() });
    }
    // SAFETY: exact length checked; T is Pod (any bit pattern is valid).
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
        let call = CallEvent { header, args: [1, 2, 3, 4, 5, 6] };
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
}
