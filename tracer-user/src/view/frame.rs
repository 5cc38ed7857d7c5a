//! The binary column answers of docs/VIEW_API.md ("TTC1"): a JSON header,
//! then each column as little-endian values, every column 8-byte aligned so
//! the browser can view it as a typed array without copying.

use serde::Serialize;
use serde_json::Value;

/// One column's values.
pub enum Column {
    U8(Vec<u8>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    F32(Vec<f32>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::U8(v) => v.len(),
            Column::U32(v) => v.len(),
            Column::I32(v) => v.len(),
            Column::U64(v) => v.len(),
            Column::F32(v) => v.len(),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Column::U8(_) => "u8",
            Column::U32(_) => "u32",
            Column::I32(_) => "i32",
            Column::U64(_) => "u64",
            Column::F32(_) => "f32",
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Column::U8(v) => out.extend_from_slice(v),
            Column::U32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Column::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Column::U64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Column::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
}

/// `NONE` of docs/VIEW_API.md in u32 and u64 columns.
pub const NONE_U32: u32 = u32::MAX;
pub const NONE_U64: u64 = u64::MAX;

pub const MAGIC: &[u8; 4] = b"TTC1";
pub const CONTENT_TYPE: &str = "application/vnd.ttrace.columns";

/// A column answer being assembled.
pub struct Frame {
    columns: Vec<(&'static str, Column)>,
    meta: Value,
}

#[derive(Serialize)]
struct Header<'a> {
    rows: usize,
    columns: Vec<ColumnHeader<'a>>,
    meta: &'a Value,
}

#[derive(Serialize)]
struct ColumnHeader<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
}

impl Frame {
    pub fn new(meta: Value) -> Frame {
        Frame { columns: Vec::new(), meta }
    }

    pub fn column(mut self, name: &'static str, values: Column) -> Frame {
        self.columns.push((name, values));
        self
    }

    /// The encoded answer. Every column must have the same length.
    pub fn encode(self) -> Vec<u8> {
        let rows = self.columns.first().map_or(0, |(_, c)| c.len());
        debug_assert!(self.columns.iter().all(|(_, c)| c.len() == rows), "columns of unequal length");
        let header = Header {
            rows,
            columns: self.columns.iter().map(|(name, c)| ColumnHeader { name, ty: c.type_name() }).collect(),
            meta: &self.meta,
        };
        let json = serde_json::to_vec(&header).expect("a header of strings and numbers serialises");
        let mut out = Vec::with_capacity(16 + json.len() + rows * 8 * self.columns.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        pad8(&mut out);
        for (_, c) in &self.columns {
            c.write(&mut out);
            pad8(&mut out);
        }
        out
    }
}

fn pad8(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(8), 0);
}

/// Reading a frame back: the tests' (and any Rust client's) decoder.
pub mod decode {
    use serde_json::Value;

    pub struct Decoded {
        pub rows: usize,
        pub meta: Value,
        columns: Vec<(String, String, Vec<u8>)>,
    }

    impl Decoded {
        fn raw(&self, name: &str, ty: &str) -> Option<&[u8]> {
            self.columns.iter().find(|(n, t, _)| n == name && t == ty).map(|(_, _, b)| b.as_slice())
        }

        pub fn u64s(&self, name: &str) -> Option<Vec<u64>> {
            Some(self.raw(name, "u64")?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
        }

        pub fn u32s(&self, name: &str) -> Option<Vec<u32>> {
            Some(self.raw(name, "u32")?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
        }

        pub fn i32s(&self, name: &str) -> Option<Vec<i32>> {
            Some(self.raw(name, "i32")?.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
        }

        pub fn f32s(&self, name: &str) -> Option<Vec<f32>> {
            Some(self.raw(name, "f32")?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        }

        pub fn u8s(&self, name: &str) -> Option<Vec<u8>> {
            self.raw(name, "u8").map(<[u8]>::to_vec)
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
        if bytes.get(..4) != Some(&super::MAGIC[..]) {
            return Err("not a TTC1 frame".into());
        }
        let len = u32::from_le_bytes(bytes.get(4..8).ok_or("short")?.try_into().unwrap()) as usize;
        let header: Value =
            serde_json::from_slice(bytes.get(8..8 + len).ok_or("short header")?).map_err(|e| format!("header: {e}"))?;
        let rows = header["rows"].as_u64().ok_or("no rows")? as usize;
        let mut at = (8 + len).next_multiple_of(8);
        let mut columns = Vec::new();
        for c in header["columns"].as_array().ok_or("no columns")? {
            let ty = c["type"].as_str().ok_or("no type")?.to_string();
            let size = match ty.as_str() {
                "u8" => 1,
                "u32" | "i32" | "f32" => 4,
                "u64" | "f64" => 8,
                other => return Err(format!("unknown type {other}")),
            };
            let data = bytes.get(at..at + rows * size).ok_or("column past the end")?.to_vec();
            at = (at + rows * size).next_multiple_of(8);
            columns.push((c["name"].as_str().ok_or("no name")?.to_string(), ty, data));
        }
        Ok(Decoded { rows, meta: header["meta"].clone(), columns })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_round_trip_aligned() {
        let bytes = Frame::new(serde_json::json!({"x_bin": 4}))
            .column("a", Column::U8(vec![1, 2, 3]))
            .column("b", Column::U64(vec![7, u64::MAX, 9]))
            .column("c", Column::F32(vec![0.5, 1.5, f32::NAN]))
            .encode();
        assert_eq!(&bytes[..4], MAGIC);
        assert_eq!(bytes.len() % 8, 0);
        let d = decode::decode(&bytes).unwrap();
        assert_eq!(d.rows, 3);
        assert_eq!(d.meta["x_bin"], 4);
        assert_eq!(d.u8s("a").unwrap(), vec![1, 2, 3]);
        assert_eq!(d.u64s("b").unwrap(), vec![7, u64::MAX, 9]);
        assert!(d.f32s("c").unwrap()[2].is_nan());
    }
}
