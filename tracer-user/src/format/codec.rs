//! Byte-level encoding of trace frames: LEB128 varints, zigzag for signed
//! values. Decoding is bounds-checked and never panics.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("frame payload ends early or holds an over-long varint at byte {at}")]
pub struct CodecError {
    pub at: usize,
}

pub fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A cursor over one frame's payload.
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64, CodecError> {
        // Most values (slots, ids, time deltas) take one or two bytes.
        match self.bytes.get(self.pos..self.pos + 2) {
            Some(&[b0, _]) if b0 < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b0))
            }
            Some(&[b0, b1]) if b1 < 0x80 => {
                self.pos += 2;
                Ok(u64::from(b0 & 0x7f) | u64::from(b1) << 7)
            }
            _ => self.u64_long(),
        }
    }

    #[inline(never)]
    fn u64_long(&mut self) -> Result<u64, CodecError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.pos).ok_or(CodecError { at: self.pos })?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(CodecError { at: self.pos })
    }

    #[inline(always)]
    pub fn u32(&mut self) -> Result<u32, CodecError> {
        let at = self.pos;
        u32::try_from(self.u64()?).map_err(|_| CodecError { at })
    }

    #[inline]
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        let v = self.u64()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    #[inline]
    pub fn i32(&mut self) -> Result<i32, CodecError> {
        let at = self.pos;
        i32::try_from(self.i64()?).map_err(|_| CodecError { at })
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u64()? as usize;
        let end = self.pos.checked_add(len).filter(|&e| e <= self.bytes.len()).ok_or(CodecError { at: self.pos })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.bytes[self.pos..];
        self.pos = self.bytes.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_edge_values() {
        let mut buf = Vec::new();
        let unsigned = [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX];
        let signed = [0, -1, 1, i64::MIN, i64::MAX, -300];
        unsigned.iter().for_each(|&v| put_u64(&mut buf, v));
        signed.iter().for_each(|&v| put_i64(&mut buf, v));
        put_bytes(&mut buf, b"blk.0.attn_q.weight");
        let mut c = Cursor::new(&buf);
        for v in unsigned {
            assert_eq!(c.u64(), Ok(v));
        }
        for v in signed {
            assert_eq!(c.i64(), Ok(v));
        }
        assert_eq!(c.bytes(), Ok(&b"blk.0.attn_q.weight"[..]));
        assert!(c.u64().is_err());
    }

    #[test]
    fn rejects_truncated_and_overlong_input() {
        assert!(Cursor::new(&[0x80]).u64().is_err());
        assert!(Cursor::new(&[0xff; 11]).u64().is_err());
        assert!(Cursor::new(&[5, b'a']).bytes().is_err());
        let mut buf = Vec::new();
        put_u64(&mut buf, u64::from(u32::MAX) + 1);
        assert!(Cursor::new(&buf).u32().is_err());
    }
}
