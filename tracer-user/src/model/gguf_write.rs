//! A minimal GGUF v3 writer (little-endian) for tests, fuzz seeds and
//! synthetic fixtures. Tensor data is filled with a per-tensor byte pattern so
//! that a byte read back identifies its tensor.

use super::{
    ggml_types::GgmlType,
    gguf::{Array, Value},
};

#[derive(Debug, Clone)]
pub struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, GgmlType, Vec<u64>)>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { kv: Vec::new(), n_kv: 0, tensors: Vec::new(), alignment: 32 }
    }
}

/// Byte that fills tensor `i`'s data.
pub fn fill_byte(i: usize) -> u8 {
    (i % 251) as u8 + 1
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend(x.to_le_bytes()),
        Value::U16(x) => buf.extend(x.to_le_bytes()),
        Value::I16(x) => buf.extend(x.to_le_bytes()),
        Value::U32(x) => buf.extend(x.to_le_bytes()),
        Value::I32(x) => buf.extend(x.to_le_bytes()),
        Value::F32(x) => buf.extend(x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::Array(a) => put_array(buf, a),
        Value::U64(x) => buf.extend(x.to_le_bytes()),
        Value::I64(x) => buf.extend(x.to_le_bytes()),
        Value::F64(x) => buf.extend(x.to_le_bytes()),
    }
}

fn put_array(buf: &mut Vec<u8>, a: &Array) {
    buf.extend((a.element_type() as u32).to_le_bytes());
    buf.extend((a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $wrap:expr) => {
            for x in $v {
                put_value(buf, &$wrap(x.clone()));
            }
        };
    }
    match a {
        Array::U8(v) => each!(v, Value::U8),
        Array::I8(v) => each!(v, Value::I8),
        Array::U16(v) => each!(v, Value::U16),
        Array::I16(v) => each!(v, Value::I16),
        Array::U32(v) => each!(v, Value::U32),
        Array::I32(v) => each!(v, Value::I32),
        Array::F32(v) => each!(v, Value::F32),
        Array::Bool(v) => each!(v, Value::Bool),
        Array::String(v) => each!(v, Value::String),
        Array::Array(v) => each!(v, Value::Array),
        Array::U64(v) => each!(v, Value::U64),
        Array::I64(v) => each!(v, Value::I64),
        Array::F64(v) => each!(v, Value::F64),
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        put_str(&mut self.kv, key);
        self.kv.extend((value.value_type() as u32).to_le_bytes());
        put_value(&mut self.kv, &value);
        self.n_kv += 1;
        self
    }

    /// Sets `general.alignment` (call at most once; must be a power of two).
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.alignment = alignment.into();
        self.kv("general.alignment", Value::U32(alignment))
    }

    pub fn tensor(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64]) -> &mut Self {
        self.tensors.push((name.to_owned(), ggml_type, shape.to_vec()));
        self
    }

    /// The file's bytes, or None if a tensor's shape is not whole blocks or overflows.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let align = |n: u64| n.div_ceil(self.alignment.max(1)) * self.alignment.max(1);
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut sizes = Vec::with_capacity(self.tensors.len());
        let mut offset = 0u64;
        for (name, ty, shape) in &self.tensors {
            let row = ty.row_bytes(shape.first().copied().unwrap_or(1))?;
            let size = shape.iter().skip(1).try_fold(row, |a, &n| a.checked_mul(n))?;
            put_str(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id.to_le_bytes());
            out.extend(offset.to_le_bytes());
            sizes.push((offset, size));
            offset = align(offset.checked_add(size)?);
        }
        let data_start = align(out.len() as u64);
        out.resize(usize::try_from(data_start.checked_add(offset)?).ok()?, 0);
        for (i, (off, size)) in sizes.into_iter().enumerate() {
            let start = (data_start + off) as usize;
            out[start..start + size as usize].fill(fill_byte(i));
        }
        Some(out)
    }
}
