//! `export --format values-jsonl`: one JSON object per node output
//! (`--values` traces), fused-away nodes included with `fused_into`.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use serde_json::{Value, json};

use super::{ExportError, Written};
use crate::analyze::{
    Analysis,
    values::{self, ValueRow},
    values_diff::hex,
};

pub fn write(trace: &Path, analysis: &Analysis, out: &Path) -> Result<Written, ExportError> {
    let rows = values::read(trace, analysis)?;
    if rows.is_empty() {
        return Err(ExportError::Invalid(format!(
            "{} holds no node values: record them with `ttrace run --values`",
            trace.display()
        )));
    }
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut w = BufWriter::new(file);
    for r in &rows {
        serde_json::to_writer(&mut w, &line(r)).map_err(|e| ExportError::write(out)(e.into()))?;
        w.write_all(b"\n").map_err(ExportError::write(out))?;
    }
    w.flush().map_err(ExportError::write(out))?;
    Ok(Written { events: rows.len() as u64, items: rows.len() as u64 })
}

/// Non-finite floats are not JSON numbers: they become strings.
fn number(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { json!(v.to_string()) }
}

fn line(r: &ValueRow) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
    let fp = r.fingerprint.as_ref();
    let floats = |f: &[f32]| f.iter().map(|&x| number(f64::from(x))).collect::<Vec<_>>();
    let fields = [
        ("blake3", fp.map(|f| json!(hex(&f.blake3)))),
        ("elements", fp.map(|f| json!(f.elements))),
        ("sum", fp.map(|f| number(f.sum))),
        ("rms", fp.map(|f| number(f.rms))),
        ("min", fp.map(|f| number(f.min))),
        ("max", fp.map(|f| number(f.max))),
        ("nan", fp.map(|f| json!(f.nan))),
        ("inf", fp.map(|f| json!(f.inf))),
        ("first", fp.map(|f| json!(floats(&f.first)))),
        ("last", fp.map(|f| json!(floats(&f.last)))),
        ("projection", fp.map(|f| json!(floats(&f.projection)))),
    ];
    if let Value::Object(map) = &mut v {
        for (key, value) in fields {
            map.insert(key.to_string(), value.unwrap_or(Value::Null));
        }
    }
    v
}
