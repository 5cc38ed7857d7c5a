//! Decoding a file's header and a tensor descriptor.

use std::io::{ErrorKind, Read};

use super::{
    super::{
        codec::{CodecError, Cursor},
        frames::{Descriptor, FORMAT_VERSION, Header, MAGIC},
    },
    TraceError, TraceReader,
};

/// Magic, version and header: the header and the offset of the first frame.
pub(super) fn read_header(input: &mut impl Read) -> Result<(Header, u64), TraceError> {
    let mut magic = [0u8; 8];
    read_exact(input, &mut magic, 0)?.then_some(()).ok_or(TraceError::Magic)?;
    if magic[..7] != MAGIC[..7] {
        return Err(TraceError::Magic);
    }
    if magic[7] != MAGIC[7] {
        return Err(TraceError::Version(u32::from(magic[7])));
    }
    let mut len = [0u8; 4];
    read_exact(input, &mut len, 8)?.then_some(()).ok_or(TraceError::Magic)?;
    let len = u32::from_le_bytes(len) as usize;
    let mut json = Vec::new();
    let got =
        input.by_ref().take(len as u64).read_to_end(&mut json).map_err(|error| TraceError::Io { offset: 12, error })?;
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
    Ok((header, 12 + len as u64))
}

/// `read_exact` that reports a clean end of file as `false`.
fn read_exact(input: &mut impl Read, buf: &mut [u8], offset: u64) -> Result<bool, TraceError> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(error) => Err(TraceError::Io { offset, error }),
    }
}

impl<R: Read> TraceReader<R> {
    pub(super) fn parse_descriptor(&self, c: &mut Cursor) -> Result<Result<Descriptor, String>, CodecError> {
        let tensor = c.u64()?;
        let name_id = c.u32()?;
        let Some(name) = self.strings.get(name_id as usize).cloned() else {
            return Ok(Err(format!("string {name_id} not defined")));
        };
        let (type_id, op, op_param0, flags) = (c.i32()?, c.i32()?, c.i32()?, c.i32()?);
        let ne = [c.i64()?, c.i64()?, c.i64()?, c.i64()?];
        let nb = [c.u64()?, c.u64()?, c.u64()?, c.u64()?];
        let (data, view_src, view_offs, has_extra) = (c.u64()?, c.u64()?, c.u64()?, c.u64()? != 0);
        let memory = match crate::format::memory::decode(c)?.and_then(|m| self.global_memory(m)) {
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
