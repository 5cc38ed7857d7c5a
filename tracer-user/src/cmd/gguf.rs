//! `ttrace gguf`: the model map every trace is resolved against, as a table,
//! CSV or JSON, optionally with each tensor's physical extents on disk.

use std::{
    collections::BTreeMap,
    io::{self, BufWriter, Write},
};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::{
    cli::{GgufArgs, GgufFormat},
    model::{
        Component, FileExtents, Fragment, ModelMap, Tensor, Value,
        gguf::{Array, KeyValue},
        whisper_bin,
    },
};

/// Arrays longer than this are summarised by length in JSON unless `--full`.
const ARRAY_SUMMARY_LEN: usize = 64;

pub fn run(args: GgufArgs) -> Result<()> {
    let model = ModelMap::open(&args.model)?;
    let extents = if args.extents {
        let files = model.files().iter().map(|f| FileExtents::read(&f.path)).collect::<Result<Vec<_>, _>>()?;
        Some(files)
    } else {
        None
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let written = match args.format {
        GgufFormat::Table => table(&mut out, &model, extents.as_deref()),
        GgufFormat::Csv => csv(&mut out, &model, extents.as_deref()),
        GgufFormat::Json => json(&mut out, &model, extents.as_deref(), args.full),
    }
    .and_then(|()| out.flush());
    // A closed pipe (`ttrace gguf M | head`) ends the program quietly in main.
    written.context("writing the output")?;
    if args.format == GgufFormat::Csv {
        summary_text(&mut io::stderr().lock(), &model)?;
    }
    Ok(())
}

fn fragments(extents: Option<&[FileExtents]>, t: &Tensor) -> Option<Vec<Fragment>> {
    Some(extents?.get(t.file as usize)?.fragments(t.file_offset, t.size_bytes))
}

fn shape(t: &Tensor) -> String {
    t.shape.iter().map(u64::to_string).collect::<Vec<_>>().join("x")
}

fn table(out: &mut impl Write, model: &ModelMap, extents: Option<&[FileExtents]>) -> io::Result<()> {
    for (i, f) in model.files().iter().enumerate() {
        let format = match f.version {
            whisper_bin::LEGACY_VERSION => "whisper.cpp's ggml format".to_string(),
            v => format!("GGUF v{v}"),
        };
        write!(
            out,
            "# file {i}: {} ({format}, {} bytes, {} tensors, data at {}, alignment {})",
            f.path.display(),
            f.size,
            f.n_tensors,
            f.data_offset,
            f.alignment
        )?;
        if let Some(e) = extents.and_then(|e| e.get(i)) {
            let d = &e.device;
            write!(
                out,
                "; device {}:{} {} (disk {}, partition start sector {}), {} extents",
                d.major,
                d.minor,
                d.name.as_deref().unwrap_or("?"),
                d.disk.as_deref().unwrap_or("?"),
                d.partition_start_sector,
                e.extents.len()
            )?;
        }
        writeln!(out)?;
    }
    let width = model.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(11);
    // Pad the shape only when more columns follow.
    let shape_w = if extents.is_some() { 20 } else { 0 };
    write!(
        out,
        "{:<width$}  {:>12}  {:>12}  {:>5}  {:<14}  {:<7}  {:<shape_w$}",
        "tensor_name", "file_offset", "size_bytes", "layer", "component", "type", "shape"
    )?;
    if extents.is_some() {
        write!(out, "  {:>5}  {:>12}", "frags", "disk_sector")?;
    }
    writeln!(out)?;
    for t in model.tensors() {
        let layer = t.layer.map_or("-".to_owned(), |l| l.to_string());
        let name = if model.files().len() > 1 { format!("{}@{}", t.name, t.file) } else { t.name.clone() };
        write!(
            out,
            "{name:<width$}  {:>12}  {:>12}  {layer:>5}  {:<14}  {:<7}  {:<shape_w$}",
            t.file_offset,
            t.size_bytes,
            t.component.as_str(),
            t.ggml_type.name,
            shape(t)
        )?;
        if let Some(frags) = fragments(extents, t) {
            let first = frags.first().map_or("-".to_owned(), |f| f.disk_sector.to_string());
            write!(out, "  {:>5}  {first:>12}", frags.len())?;
            if frags.len() > 1 {
                for f in &frags {
                    write!(
                        out,
                        "\n{:width$}    fragment: file_offset {} length {} disk_sector {}",
                        "", f.file_offset, f.length, f.disk_sector
                    )?;
                }
            }
        }
        writeln!(out)?;
    }
    writeln!(out)?;
    summary_text(out, model)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_owned() }
}

fn csv(out: &mut impl Write, model: &ModelMap, extents: Option<&[FileExtents]>) -> io::Result<()> {
    write!(out, "tensor_name,file_offset,size_bytes,layer_id,component,type,shape")?;
    if model.files().len() > 1 {
        write!(out, ",file")?;
    }
    if extents.is_some() {
        write!(out, ",fragments,disk_sectors")?;
    }
    writeln!(out)?;
    for t in model.tensors() {
        // -1: not in a layer (token_embd, output, ...).
        let layer = t.layer.map_or(-1, i64::from);
        write!(
            out,
            "{},{},{},{layer},{},{},{}",
            csv_field(&t.name),
            t.file_offset,
            t.size_bytes,
            t.component.as_str(),
            t.ggml_type.name,
            shape(t)
        )?;
        if model.files().len() > 1 {
            write!(out, ",{}", csv_field(&model.files()[t.file as usize].path.to_string_lossy()))?;
        }
        if let Some(frags) = fragments(extents, t) {
            // sector+512-byte-sectors per fragment, ';'-separated.
            let list: Vec<String> =
                frags.iter().map(|f| format!("{}+{}", f.disk_sector, f.length.div_ceil(512))).collect();
            write!(out, ",{},{}", frags.len(), list.join(";"))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

#[derive(Default, Serialize)]
struct Total {
    tensors: usize,
    bytes: u64,
}

fn totals<K: Ord>(model: &ModelMap, key: impl Fn(&Tensor) -> K) -> BTreeMap<K, Total> {
    let mut m = BTreeMap::new();
    for t in model.tensors() {
        let e: &mut Total = m.entry(key(t)).or_default();
        e.tensors += 1;
        e.bytes += t.size_bytes;
    }
    m
}

fn summary_text(out: &mut impl Write, model: &ModelMap) -> io::Result<()> {
    let info = model.info();
    let total: u64 = model.tensors().iter().map(|t| t.size_bytes).sum();
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    writeln!(
        out,
        "summary: {} tensors, {total} bytes in {} file(s); architecture {}, name {}, n_layers {}, n_experts {} (used {})",
        model.tensors().len(),
        model.files().len(),
        info.architecture.as_deref().unwrap_or("-"),
        info.name.as_deref().unwrap_or("-"),
        opt(info.n_layers),
        opt(info.n_experts),
        opt(info.n_experts_used),
    )?;
    for (c, t) in totals(model, |t| t.component) {
        writeln!(out, "  {:<14} {:>5} tensors {:>14} bytes", c.as_str(), t.tensors, t.bytes)?;
    }
    for (ty, t) in totals(model, |t| t.ggml_type.name) {
        writeln!(out, "  type {ty:<9} {:>5} tensors {:>14} bytes", t.tensors, t.bytes)?;
    }
    Ok(())
}

fn kv_json(kv: &KeyValue, full: bool) -> serde_json::Value {
    let mut o = json!({ "key": kv.key, "type": kv.value.value_type().name(), "offset": kv.offset });
    if let Value::Array(a) = &kv.value {
        o["element_type"] = a.element_type().name().into();
        o["len"] = a.len().into();
        if !full && a.len() > ARRAY_SUMMARY_LEN {
            o["summarized"] = true.into();
            return o;
        }
    }
    o["value"] = match &kv.value {
        // JSON has no NaN or infinity: write those as strings.
        Value::F32(v) if !v.is_finite() => v.to_string().into(),
        Value::F64(v) if !v.is_finite() => v.to_string().into(),
        Value::Array(Array::F32(v)) if v.iter().any(|x| !x.is_finite()) => {
            v.iter().map(|x| if x.is_finite() { json!(x) } else { json!(x.to_string()) }).collect()
        }
        other => serde_json::to_value(other).unwrap_or(serde_json::Value::Null),
    };
    o
}

fn json(out: &mut impl Write, model: &ModelMap, extents: Option<&[FileExtents]>, full: bool) -> io::Result<()> {
    let files: Vec<_> = model
        .files()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut o = serde_json::to_value(f).unwrap_or_default();
            o["metadata"] = f.metadata.iter().map(|kv| kv_json(kv, full)).collect();
            if let Some(e) = extents.and_then(|e| e.get(i)) {
                o["device"] = serde_json::to_value(&e.device).unwrap_or_default();
                o["n_extents"] = e.extents.len().into();
            }
            o
        })
        .collect();
    let tensors: Vec<_> = model
        .tensors()
        .iter()
        .map(|t| {
            let mut o = serde_json::to_value(t).unwrap_or_default();
            if let Some(frags) = fragments(extents, t) {
                o["fragments"] = frags.len().into();
                o["extents"] = serde_json::to_value(frags).unwrap_or_default();
            }
            o
        })
        .collect();
    let total: u64 = model.tensors().iter().map(|t| t.size_bytes).sum();
    let by_component: BTreeMap<&str, Total> =
        totals(model, |t| t.component).into_iter().map(|(c, t): (Component, _)| (c.as_str(), t)).collect();
    let doc = json!({
        "files": files,
        "tensors": tensors,
        "summary": {
            "tensor_count": model.tensors().len(),
            "total_bytes": total,
            "by_component": by_component,
            "by_type": totals(model, |t| t.ggml_type.name),
            "model": model.info(),
        },
    });
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)
}
