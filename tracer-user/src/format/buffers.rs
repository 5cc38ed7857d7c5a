//! BUFFER frames: a ggml backend buffer created, given a usage or freed.
//! Payload after time and thread: action, buffer, buft, context, size,
//! usage, then the type's name.

use super::{
    codec::{CodecError, Cursor, put_bytes, put_u64},
    records::{BufferAction, BufferRecord},
};

pub fn encode(f: &mut Vec<u8>, b: &tracer_common::BufferEvent) {
    for v in [u64::from(b.action), b.buffer, b.buft, b.context, b.size, u64::from(b.usage)] {
        put_u64(f, v);
    }
    put_bytes(f, tracer_common::c_str(&b.type_name));
}

/// The outer error is a short payload; the inner one an unknown action.
pub fn decode((ts_ns, tid): (u64, u32), c: &mut Cursor) -> Result<Result<BufferRecord, String>, CodecError> {
    let action = match c.u32()? {
        tracer_common::buffer_action::CREATED => BufferAction::Created,
        tracer_common::buffer_action::SET_USAGE => BufferAction::SetUsage,
        tracer_common::buffer_action::FREED => BufferAction::Freed,
        other => return Ok(Err(format!("unknown buffer action {other}"))),
    };
    let (buffer, buft, context, size) = (c.u64()?, c.u64()?, c.u64()?, c.u64()?);
    let usage = c.u32()?;
    let type_name = String::from_utf8_lossy(c.bytes()?).into_owned();
    Ok(Ok(BufferRecord { ts_ns, tid, action, buffer, buft, context, size, usage, type_name }))
}
