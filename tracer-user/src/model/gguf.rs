//! GGUF reader (versions 2 and 3, either byte order): the key/value metadata,
//! the tensor infos and where every tensor's bytes lie in the file.
//!
//! Reads the header sequentially from any `Read` whose total length is known,
//! so it works on a buffered file (never loading the data section) and on a
//! byte slice (the fuzz target). Every count and length is checked against the
//! bytes left in the file before anything is allocated for it, so a malformed
//! header yields an error with its byte offset, never a panic or a huge
//! allocation.

use std::{collections::HashSet, fmt, io::Read};

use serde::Serialize;

use super::ggml_types::GgmlType;
pub use super::gguf_value::{Array, Value, ValueType};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// Deeper array nesting is refused, so that hostile input cannot exhaust the stack.
pub const MAX_ARRAY_DEPTH: u32 = 16;

/// What went wrong, where (absolute byte offset in the file) and inside what.
#[derive(Debug, thiserror::Error)]
pub struct ParseError {
    pub offset: u64,
    pub within: Option<String>,
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}", self.offset)?;
        if let Some(within) = &self.within {
            write!(f, " ({within})")?;
        }
        write!(f, ": {}", self.kind)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ParseErrorKind {
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (versions 2 and 3 are supported)")]
    UnsupportedVersion(u32),
    #[error("file ends early: {need} bytes needed, {left} left")]
    Truncated { need: u64, left: u64 },
    #[error("{what} count {count} cannot fit in the {left} bytes left in the file")]
    CountTooLarge { what: &'static str, count: u64, left: u64 },
    #[error("string length {len} runs past the end of the file ({left} bytes left)")]
    StringTooLong { len: u64, left: u64 },
    #[error("unknown GGUF value type {0}")]
    UnknownValueType(u32),
    #[error("arrays nested deeper than {MAX_ARRAY_DEPTH} levels")]
    NestedTooDeep,
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    #[error("general.alignment must be a u32 power of two, found {0}")]
    BadAlignment(String),
    #[error("tensor {tensor:?} has {n_dims} dimensions, at most {MAX_DIMS} are allowed")]
    TooManyDims { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?} dimension {dim} is {value}, which is out of range")]
    BadDim { tensor: String, dim: usize, value: i64 },
    #[error("tensor {tensor:?} has unknown ggml type id {id}")]
    UnknownType { tensor: String, id: u32 },
    #[error("tensor {tensor:?}: first dimension {ne0} is not a whole number of {ty} blocks of {block}")]
    PartialBlock { tensor: String, ne0: u64, ty: &'static str, block: u32 },
    #[error("tensor {tensor:?}: byte size overflows 64 bits")]
    SizeOverflow { tensor: String },
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { tensor: String, offset: u64, alignment: u64 },
    #[error("tensor {tensor:?}: data [{start}, {end}) runs past the end of the file ({file_size} bytes)")]
    PastEof { tensor: String, start: u64, end: u64, file_size: u64 },
    #[error("tensor {tensor:?}: data [{start}, {end}) overlaps tensor {other:?}")]
    Overlap { tensor: String, start: u64, end: u64, other: String },
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

impl ParseError {
    fn new(offset: u64, kind: ParseErrorKind) -> Self {
        ParseError { offset, within: None, kind }
    }

    /// Adds what was being read, outermost first ("value of key \"k\", array element 3").
    fn within(mut self, what: impl FnOnce() -> String) -> Self {
        self.within = Some(match self.within.take() {
            Some(inner) => format!("{}, {inner}", what()),
            None => what(),
        });
        self
    }
}

type Result<T> = std::result::Result<T, ParseError>;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyValue {
    pub key: String,
    pub value: Value,
    /// Where the entry starts in the file.
    pub offset: u64,
}

/// One tensor info record, with its data range checked against the file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorRecord {
    pub name: String,
    #[serde(rename = "type")]
    pub ggml_type: GgmlType,
    /// ggml order: `shape[0]` is ne0, the contiguous dimension.
    pub shape: Vec<u64>,
    /// Offset relative to the data section, as stored.
    pub rel_offset: u64,
    /// Absolute offset of the first byte in the file.
    pub file_offset: u64,
    pub size_bytes: u64,
    /// Where the info record starts in the file.
    pub info_offset: u64,
}

/// Everything in a GGUF file except the tensor data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufHeader {
    pub version: u32,
    pub big_endian: bool,
    pub kv: Vec<KeyValue>,
    pub tensors: Vec<TensorRecord>,
    pub alignment: u64,
    /// First byte after the tensor infos.
    pub infos_end: u64,
    /// Start of the data section: `infos_end` rounded up to the alignment.
    pub data_offset: u64,
    pub file_size: u64,
}

impl GgufHeader {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|kv| kv.key == key).map(|kv| &kv.value)
    }

    /// Parses a GGUF header from `reader`, which holds a file of `file_size` bytes.
    pub fn read<R: Read>(reader: R, file_size: u64) -> Result<GgufHeader> {
        Parser { r: reader, pos: 0, size: file_size, big_endian: false }.header()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<GgufHeader> {
        Self::read(bytes, bytes.len() as u64)
    }
}

struct Parser<R> {
    r: R,
    pos: u64,
    size: u64,
    big_endian: bool,
}

macro_rules! read_num {
    ($name:ident, $ty:ty) => {
        fn $name(&mut self) -> Result<$ty> {
            let mut b = [0u8; size_of::<$ty>()];
            self.bytes(&mut b)?;
            Ok(if self.big_endian { <$ty>::from_be_bytes(b) } else { <$ty>::from_le_bytes(b) })
        }
    };
}

impl<R: Read> Parser<R> {
    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    fn err(&self, kind: ParseErrorKind) -> ParseError {
        ParseError::new(self.pos, kind)
    }

    fn need(&self, n: u64) -> Result<()> {
        if n > self.left() { Err(self.err(ParseErrorKind::Truncated { need: n, left: self.left() })) } else { Ok(()) }
    }

    fn bytes(&mut self, buf: &mut [u8]) -> Result<()> {
        self.need(buf.len() as u64)?;
        self.r.read_exact(buf).map_err(|e| self.err(e.into()))?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    read_num!(u8, u8);
    read_num!(i8, i8);
    read_num!(u16, u16);
    read_num!(i16, i16);
    read_num!(u32, u32);
    read_num!(i32, i32);
    read_num!(u64, u64);
    read_num!(i64, i64);
    read_num!(f32, f32);
    read_num!(f64, f64);

    /// Checks that `count` items of at least `min_bytes` each fit in the file,
    /// and returns a capacity that allocates no more than the bytes left.
    fn count(&self, what: &'static str, count: u64, min_bytes: u64, item_size: usize) -> Result<usize> {
        let left = self.left();
        if count.checked_mul(min_bytes).is_none_or(|n| n > left) {
            return Err(self.err(ParseErrorKind::CountTooLarge { what, count, left }));
        }
        let per_item = min_bytes.max(item_size as u64).max(1);
        Ok(count.min(left / per_item) as usize)
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        if len > self.left() {
            return Err(ParseError::new(self.pos - 8, ParseErrorKind::StringTooLong { len, left: self.left() }));
        }
        let mut buf = vec![0u8; len as usize];
        self.bytes(&mut buf)?;
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let at = self.pos;
        let id = self.u32()?;
        ValueType::from_id(id).ok_or_else(|| ParseError::new(at, ParseErrorKind::UnknownValueType(id)))
    }

    fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.i8()?),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.i16()?),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.i32()?),
            ValueType::F32 => Value::F32(self.f32()?),
            ValueType::Bool => Value::Bool(self.u8()? != 0),
            ValueType::String => Value::String(self.string()?),
            ValueType::Array => Value::Array(self.array(depth)?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.i64()?),
            ValueType::F64 => Value::F64(self.f64()?),
        })
    }

    fn array(&mut self, depth: u32) -> Result<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(ParseErrorKind::NestedTooDeep));
        }
        let ty = self.value_type()?;
        let n = self.u64()?;
        macro_rules! items {
            ($variant:ident, $ty:ty, $read:expr) => {{
                let cap = self.count("array element", n, ty.min_bytes(), size_of::<$ty>())?;
                let mut v: Vec<$ty> = Vec::with_capacity(cap);
                for i in 0..n {
                    let item = $read(&mut *self).map_err(|e: ParseError| e.within(|| format!("array element {i}")))?;
                    v.push(item);
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => items!(U8, u8, Self::u8),
            ValueType::I8 => items!(I8, i8, Self::i8),
            ValueType::U16 => items!(U16, u16, Self::u16),
            ValueType::I16 => items!(I16, i16, Self::i16),
            ValueType::U32 => items!(U32, u32, Self::u32),
            ValueType::I32 => items!(I32, i32, Self::i32),
            ValueType::F32 => items!(F32, f32, Self::f32),
            ValueType::Bool => items!(Bool, bool, |p: &mut Self| p.u8().map(|b| b != 0)),
            ValueType::String => items!(String, String, Self::string),
            ValueType::Array => items!(Array, Array, |p: &mut Self| p.array(depth + 1)),
            ValueType::U64 => items!(U64, u64, Self::u64),
            ValueType::I64 => items!(I64, i64, Self::i64),
            ValueType::F64 => items!(F64, f64, Self::f64),
        })
    }

    fn header(mut self) -> Result<GgufHeader> {
        let mut magic = [0u8; 4];
        self.bytes(&mut magic).map_err(|e| e.within(|| "magic".into()))?;
        if magic != GGUF_MAGIC {
            return Err(ParseError::new(0, ParseErrorKind::BadMagic(magic)));
        }
        let mut version = self.u32().map_err(|e| e.within(|| "version".into()))?;
        // A file written on the other byte order has its version in the high half.
        if version & 0xffff == 0 && version != 0 {
            self.big_endian = true;
            version = version.swap_bytes();
        }
        if !(2..=3).contains(&version) {
            return Err(ParseError::new(4, ParseErrorKind::UnsupportedVersion(version)));
        }
        let n_tensors = self.u64().map_err(|e| e.within(|| "tensor count".into()))?;
        let n_kv = self.u64().map_err(|e| e.within(|| "key/value count".into()))?;
        let at = self.pos;
        // Smallest KV: empty key (8) + type (4) + u8 (1). Smallest tensor info:
        // empty name (8) + n_dims (4) + type (4) + offset (8).
        let kv_cap =
            self.count("key/value", n_kv, 13, size_of::<KeyValue>()).map_err(|e| ParseError { offset: 16, ..e })?;
        let min_kv_bytes = n_kv * 13;
        let left_for_tensors = self.left() - min_kv_bytes;
        if n_tensors.checked_mul(24).is_none_or(|n| n > left_for_tensors) {
            let kind = ParseErrorKind::CountTooLarge { what: "tensor", count: n_tensors, left: left_for_tensors };
            return Err(ParseError::new(8, kind));
        }
        debug_assert_eq!(at, 24);

        let mut kv: Vec<KeyValue> = Vec::with_capacity(kv_cap);
        let mut keys = HashSet::with_capacity(kv_cap);
        let mut alignment = DEFAULT_ALIGNMENT;
        for i in 0..n_kv {
            let offset = self.pos;
            let key = self.string().map_err(|e| e.within(|| format!("key of metadata entry {i}")))?;
            let ty = self.value_type().map_err(|e| e.within(|| format!("type of key {key:?}")))?;
            let value = self.value(ty, 0).map_err(|e| e.within(|| format!("value of key {key:?}")))?;
            if key == "general.alignment" {
                alignment = match value {
                    Value::U32(a) if a.is_power_of_two() => a.into(),
                    ref other => {
                        let kind = ParseErrorKind::BadAlignment(format!("{} {other:?}", ty.name()));
                        return Err(ParseError::new(offset, kind));
                    }
                };
            }
            if !keys.insert(key.clone()) {
                return Err(ParseError::new(offset, ParseErrorKind::DuplicateKey(key)));
            }
            kv.push(KeyValue { key, value, offset });
        }
        drop(keys);

        let cap = self.count("tensor", n_tensors, 24, size_of::<TensorRecord>())?;
        let mut tensors = Vec::with_capacity(cap);
        for i in 0..n_tensors {
            let info_offset = self.pos;
            let t = self.tensor_info(info_offset).map_err(|e| e.within(|| format!("tensor info {i}")))?;
            tensors.push(t);
        }
        let infos_end = self.pos;
        let data_offset = infos_end.div_ceil(alignment) * alignment;

        let mut names = HashSet::with_capacity(tensors.len());
        for t in &mut tensors {
            let err = |kind| Err(ParseError::new(t.info_offset, kind));
            if !names.insert(t.name.as_str()) {
                return err(ParseErrorKind::DuplicateTensor(t.name.clone()));
            }
            if !t.rel_offset.is_multiple_of(alignment) {
                let kind = ParseErrorKind::Misaligned { tensor: t.name.clone(), offset: t.rel_offset, alignment };
                return err(kind);
            }
            let start = data_offset.checked_add(t.rel_offset);
            let end = start.and_then(|s| s.checked_add(t.size_bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= self.size => t.file_offset = start,
                _ => {
                    let start = data_offset.saturating_add(t.rel_offset);
                    let end = start.saturating_add(t.size_bytes);
                    let kind = ParseErrorKind::PastEof { tensor: t.name.clone(), start, end, file_size: self.size };
                    return err(kind);
                }
            }
        }
        // Overlapping tensors would make an address ambiguous (ggml itself
        // requires them back to back).
        let mut order: Vec<&TensorRecord> = tensors.iter().filter(|t| t.size_bytes > 0).collect();
        order.sort_by_key(|t| t.file_offset);
        if let Some(w) = order.windows(2).find(|w| w[1].file_offset < w[0].file_offset + w[0].size_bytes) {
            let (a, b) = (w[1], w[0]);
            let kind = ParseErrorKind::Overlap {
                tensor: a.name.clone(),
                start: a.file_offset,
                end: a.file_offset + a.size_bytes,
                other: b.name.clone(),
            };
            return Err(ParseError::new(a.info_offset, kind));
        }
        Ok(GgufHeader {
            version,
            big_endian: self.big_endian,
            kv,
            tensors,
            alignment,
            infos_end,
            data_offset,
            file_size: self.size,
        })
    }

    fn tensor_info(&mut self, info_offset: u64) -> Result<TensorRecord> {
        let name = self.string()?;
        let dims_at = self.pos;
        let n_dims = self.u32()?;
        if n_dims as usize > MAX_DIMS {
            return Err(ParseError::new(dims_at, ParseErrorKind::TooManyDims { tensor: name, n_dims }));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for dim in 0..n_dims as usize {
            let at = self.pos;
            let ne = self.i64()?;
            if ne < 0 {
                return Err(ParseError::new(at, ParseErrorKind::BadDim { tensor: name, dim, value: ne }));
            }
            shape.push(ne as u64);
        }
        let type_at = self.pos;
        let id = self.u32()?;
        let Some(ggml_type) = GgmlType::from_id(id) else {
            return Err(ParseError::new(type_at, ParseErrorKind::UnknownType { tensor: name, id }));
        };
        let rel_offset = self.u64()?;
        let ne0 = shape.first().copied().unwrap_or(1);
        let Some(row) = ggml_type.row_bytes(ne0) else {
            let block = ggml_type.block;
            let kind = if !ne0.is_multiple_of(u64::from(block)) {
                ParseErrorKind::PartialBlock { tensor: name, ne0, ty: ggml_type.name, block }
            } else {
                ParseErrorKind::SizeOverflow { tensor: name }
            };
            return Err(ParseError::new(dims_at, kind));
        };
        let size = shape.iter().skip(1).try_fold(row, |acc, &ne| acc.checked_mul(ne));
        let Some(size_bytes) = size else {
            return Err(ParseError::new(dims_at, ParseErrorKind::SizeOverflow { tensor: name }));
        };
        Ok(TensorRecord { name, ggml_type, shape, rel_offset, file_offset: 0, size_bytes, info_offset })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian GGUF builder for tests.
    #[derive(Default)]
    struct Builder {
        kv: Vec<u8>,
        n_kv: u64,
        infos: Vec<u8>,
        n_tensors: u64,
    }

    fn put_str(buf: &mut Vec<u8>, s: &str) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s.as_bytes());
    }

    impl Builder {
        fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
            put_str(&mut self.kv, key);
            self.kv.extend(4u32.to_le_bytes());
            self.kv.extend(v.to_le_bytes());
            self.n_kv += 1;
            self
        }
        fn kv_raw(&mut self, key: &str, ty: u32, raw: &[u8]) -> &mut Self {
            put_str(&mut self.kv, key);
            self.kv.extend(ty.to_le_bytes());
            self.kv.extend(raw);
            self.n_kv += 1;
            self
        }
        fn tensor(&mut self, name: &str, shape: &[i64], ty: u32, offset: u64) -> &mut Self {
            put_str(&mut self.infos, name);
            self.infos.extend((shape.len() as u32).to_le_bytes());
            for d in shape {
                self.infos.extend(d.to_le_bytes());
            }
            self.infos.extend(ty.to_le_bytes());
            self.infos.extend(offset.to_le_bytes());
            self.n_tensors += 1;
            self
        }
        fn build(&self, data_bytes: usize) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend(self.n_tensors.to_le_bytes());
            out.extend(self.n_kv.to_le_bytes());
            out.extend(&self.kv);
            out.extend(&self.infos);
            out.resize(out.len().div_ceil(32) * 32 + data_bytes, 0);
            out
        }
    }

    #[test]
    fn reads_types_offsets_and_nested_arrays() {
        let mut nested = Vec::new();
        nested.extend(9u32.to_le_bytes()); // array of arrays
        nested.extend(2u64.to_le_bytes());
        for n in [1u64, 2] {
            nested.extend(8u32.to_le_bytes());
            nested.extend(n.to_le_bytes());
            for _ in 0..n {
                put_str(&mut nested, "ab");
            }
        }
        let bytes = Builder::default()
            .kv_u32("general.alignment", 64)
            .kv_raw("x.nested", 9, &nested)
            .kv_raw("x.flag", 7, &[1])
            .tensor("a", &[64, 2], 8, 0)
            .tensor("b", &[3], 0, 192)
            .build(256);
        let h = GgufHeader::from_bytes(&bytes).unwrap();
        assert_eq!(h.alignment, 64);
        assert_eq!(h.data_offset % 64, 0);
        assert_eq!(h.tensors[0].size_bytes, 2 * 68);
        assert_eq!(h.tensors[1].file_offset, h.data_offset + 192);
        let Some(Value::Array(Array::Array(inner))) = h.get("x.nested") else { panic!() };
        assert_eq!(inner[1], Array::String(vec!["ab".into(), "ab".into()]));
        assert_eq!(h.get("x.flag"), Some(&Value::Bool(true)));
    }

    #[test]
    fn errors_name_the_problem_and_offset() {
        let e = GgufHeader::from_bytes(b"GGUX\x03\0\0\0").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::BadMagic(_)) && e.offset == 0);
        let bad_type = Builder::default().tensor("w", &[32], 99, 0).build(64);
        let e = GgufHeader::from_bytes(&bad_type).unwrap_err();
        assert_eq!(e.offset, 24 + 8 + 1 + 4 + 8);
        assert!(e.to_string().contains("unknown ggml type id 99") && e.to_string().contains("\"w\""), "{e}");
        let misaligned = Builder::default().tensor("w", &[4], 0, 4).build(64);
        let e = GgufHeader::from_bytes(&misaligned).unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::Misaligned { .. }), "{e}");
        let huge =
            Builder::default().kv_raw("k", 9, &[8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]).build(0);
        let e = GgufHeader::from_bytes(&huge).unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::CountTooLarge { .. }), "{e}");
    }

    #[test]
    fn version_2_reads_like_version_3() {
        let mut bytes = Builder::default().kv_u32("k", 1).tensor("w", &[32, 2], 8, 0).build(96);
        let v3 = GgufHeader::from_bytes(&bytes).unwrap();
        bytes[4] = 2;
        let v2 = GgufHeader::from_bytes(&bytes).unwrap();
        assert_eq!((v2.version, v2.tensors.clone(), v2.kv.clone()), (2, v3.tensors, v3.kv));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut raw = Vec::new();
        for _ in 0..100 {
            raw.extend(9u32.to_le_bytes());
            raw.extend(1u64.to_le_bytes());
        }
        let bytes = Builder::default().kv_raw("deep", 9, &raw).build(0);
        let e = GgufHeader::from_bytes(&bytes).unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::NestedTooDeep), "{e}");
    }
}
