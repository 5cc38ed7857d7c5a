//! The memory class of a tensor's data (`Memory`) as descriptor and
//! source payloads carry it: a tag (< 128, so one varint byte), then the
//! class's fields.

use super::{
    codec::{CodecError, Cursor, put_u64},
    frames::Memory,
};

pub fn encode(f: &mut Vec<u8>, memory: Memory) {
    match memory {
        Memory::ModelFile { model, tensor, offset } => {
            f.push(0);
            put_u64(f, u64::from(model));
            put_u64(f, u64::from(tensor));
            put_u64(f, offset);
        }
        Memory::Copy { model, tensor } => {
            f.push(1);
            put_u64(f, u64::from(model));
            put_u64(f, u64::from(tensor));
        }
        Memory::Anon => f.push(2),
        Memory::OtherFile => f.push(3),
        Memory::Unmapped => f.push(4),
    }
}

/// The outer error is a short payload; the inner one an unknown tag.
pub fn decode(c: &mut Cursor) -> Result<Result<Memory, String>, CodecError> {
    Ok(Ok(match c.u64()? {
        0 => Memory::ModelFile { model: c.u32()?, tensor: c.u32()?, offset: c.u64()? },
        1 => Memory::Copy { model: c.u32()?, tensor: c.u32()? },
        2 => Memory::Anon,
        3 => Memory::OtherFile,
        4 => Memory::Unmapped,
        tag => return Ok(Err(format!("memory class tag {tag}"))),
    }))
}
