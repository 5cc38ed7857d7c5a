//! JSONL and CSV encoding of [`super::rows`], written straight into byte
//! buffers: the same bytes `serde_json` and the former `format!`-based CSV
//! writer produced, at a fraction of the cost (no per-field serializer calls,
//! no per-row strings). Full buffers are written by a second thread, so the
//! kernel's copy of the output overlaps the encoding.

use std::{
    fs::File,
    io::{self, Write},
    path::Path,
    sync::mpsc::{Receiver, SyncSender, sync_channel},
    thread::JoinHandle,
};

use indicatif::ProgressBar;

use super::{
    ExportError, Written, columns,
    json_bytes::{json_escaped, n, num, s},
    rows::{Cells, ShapeScope, cells, op_context, op_shape},
    shape::OpShapes,
};
use crate::analyze::Analysis;
use crate::analyze::walk::{self, Event, Sink, Tables};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Text {
    Jsonl,
    Csv,
}

pub fn write(
    trace: &Path,
    a: &Analysis,
    out: &Path,
    format: Text,
    progress: &ProgressBar,
) -> Result<Written, ExportError> {
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut sink = TextSink { out: Background::new(file), format, rows: 0, shapes: OpShapes::default() };
    if format == Text::Csv {
        sink.out.buf.extend_from_slice(columns::names().collect::<Vec<_>>().join(",").as_bytes());
        sink.out.buf.push(b'\n');
    }
    let walked = walk::walk(trace, a, progress, &mut sink);
    let finished = sink.out.finish().map_err(ExportError::write(out));
    match (walked, finished) {
        (Ok(()), Ok(())) => Ok(Written { events: sink.rows, items: sink.rows }),
        // A failed write stops the walk with a closed channel; the writer's
        // own error says why.
        (Err(ExportError::Write { .. }), Err(e)) | (Ok(()), Err(e)) | (Err(e), _) => Err(e),
    }
}

struct TextSink {
    out: Background,
    format: Text,
    rows: u64,
    /// Encoded `name`..`weight_bytes` per op shape.
    shapes: OpShapes<Box<[u8]>>,
}

impl Sink for TextSink {
    type Error = ExportError;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), ExportError> {
        let out = &mut self.out.buf;
        let (head, shape, rest): (Encode, Encode, Encode) = match self.format {
            Text::Jsonl => (json_head, json_shape, json_rest),
            Text::Csv => (csv_head, csv_shape, csv_rest),
        };
        if let Event::Op(e) = event {
            // Most rows are ops: their shape columns are encoded once per shape.
            let c = op_context(e, tables);
            head(&c, out);
            match self.shapes.get(&e.op, tables.models.len()) {
                Some(bytes) => out.extend_from_slice(bytes),
                None => {
                    let mut s = Cells::default();
                    let scope = op_shape(e, tables, &mut s);
                    let mut bytes = Vec::new();
                    shape(&s, &mut bytes);
                    match scope {
                        ShapeScope::PerShape => out.extend_from_slice(self.shapes.insert(&e.op, bytes.into())),
                        ShapeScope::PerUbatch => out.extend_from_slice(&bytes),
                    }
                }
            }
            rest(&c, out);
        } else {
            let Some(c) = cells(event, tables) else { return Ok(()) };
            match self.format {
                Text::Jsonl => json_line(&c, out),
                Text::Csv => csv_line(&c, out),
            }
        }
        self.rows += 1;
        self.out.maybe_send().map_err(|source| ExportError::Write { path: String::new(), source })
    }
}

type Encode = fn(&Cells, &mut Vec<u8>);

const CHUNK: usize = 1 << 20;

/// Output written by a second thread, in chunks of about [`CHUNK`] bytes;
/// memory stays bounded by the channel depth.
struct Background {
    buf: Vec<u8>,
    full: Option<SyncSender<Vec<u8>>>,
    empty: Receiver<Vec<u8>>,
    writer: Option<JoinHandle<io::Result<()>>>,
}

impl Background {
    fn new(mut file: File) -> Self {
        let (full, full_rx) = sync_channel::<Vec<u8>>(2);
        let (empty_tx, empty) = sync_channel::<Vec<u8>>(4);
        let writer = std::thread::spawn(move || {
            for mut chunk in full_rx {
                file.write_all(&chunk)?;
                chunk.clear();
                // The encoder may have finished and dropped its end.
                let _ = empty_tx.try_send(chunk);
            }
            file.flush()
        });
        Self { buf: Vec::with_capacity(CHUNK + 4096), full: Some(full), empty, writer: Some(writer) }
    }

    fn maybe_send(&mut self) -> io::Result<()> {
        if self.buf.len() < CHUNK {
            return Ok(());
        }
        let next = self.empty.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK + 4096));
        let chunk = std::mem::replace(&mut self.buf, next);
        let sent = self.full.as_ref().is_some_and(|f| f.send(chunk).is_ok());
        if sent { Ok(()) } else { Err(io::Error::other("output writer stopped")) }
    }

    /// Writes what is left and waits for the writer.
    fn finish(&mut self) -> io::Result<()> {
        if let Some(full) = self.full.take()
            && !self.buf.is_empty()
        {
            let _ = full.send(std::mem::take(&mut self.buf));
        }
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("output writer panicked")),
            None => Ok(()),
        }
    }
}

/// `,"key":value` for each `n` (number) or `s` (string) field of `c`.
macro_rules! json_fields {
    ($out:expr, $c:expr; $($kind:ident $field:ident),+ $(,)?) => {
        $(
            $out.extend_from_slice(concat!(",\"", stringify!($field), "\":").as_bytes());
            $kind($out, $c.$field);
        )+
    };
}

/// One JSON object per line, keys in [`columns::COLUMNS`] order, `null` for absent
/// values: what `serde_json::to_writer` made of [`super::rows::Row`].
fn json_line(c: &Cells, out: &mut Vec<u8>) {
    json_head(c, out);
    json_shape(c, out);
    json_rest(c, out);
}

/// `seq` to `token_index`. `kind` and `phase` are this module's constants,
/// which need no escaping.
fn json_head(c: &Cells, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"seq\":");
    num(out, c.seq);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(c.kind.as_bytes());
    out.extend_from_slice(b"\",\"ts_ns\":");
    num(out, c.ts_ns);
    out.extend_from_slice(b",\"rel_ns\":");
    num(out, c.rel_ns);
    out.extend_from_slice(b",\"dur_ns\":");
    n(out, c.dur_ns);
    out.extend_from_slice(b",\"tid\":");
    num(out, c.tid);
    out.extend_from_slice(b",\"ubatch\":");
    n(out, c.ubatch);
    match c.phase {
        Some(phase) => {
            out.extend_from_slice(b",\"phase\":\"");
            out.extend_from_slice(phase.as_bytes());
            out.extend_from_slice(b"\",\"token_index\":");
        }
        None => out.extend_from_slice(b",\"phase\":null,\"token_index\":"),
    }
    n(out, c.token_index);
}

/// `name` to `weight_bytes`: an op's [`super::rows::op_shape`] columns.
fn json_shape(c: &Cells, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"name\":");
    s(out, Some(&c.name));
    out.extend_from_slice(b",\"layer\":");
    n(out, c.layer);
    out.extend_from_slice(b",\"dst\":");
    s(out, c.dst);
    out.extend_from_slice(b",\"dst_memory\":");
    s(out, c.dst_memory);
    out.extend_from_slice(b",\"srcs\":");
    match &c.srcs {
        Some(srcs) => {
            out.push(b'"');
            for (i, name) in srcs.names().iter().enumerate() {
                if i > 0 {
                    out.push(b';');
                }
                json_escaped(out, name);
            }
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"n_srcs\":");
    num(out, c.n_srcs);
    out.extend_from_slice(b",\"weights_file\":");
    num(out, c.weights_file);
    out.extend_from_slice(b",\"weights_copy\":");
    num(out, c.weights_copy);
    out.extend_from_slice(b",\"weight_bytes\":");
    num(out, c.weight_bytes);
}

/// `ith` to the end of the line.
fn json_rest(c: &Cells, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"ith\":");
    n(out, c.ith);
    out.extend_from_slice(b",\"nth\":");
    n(out, c.nth);
    // An op's I/O columns are nulls only: one copy.
    if c.io_columns_empty() {
        out.extend_from_slice(
            b",\"address\":null,\"ip\":null,\"error_code\":null,\"fault_tensor\":null,\"file_offset\":null,\
              \"op_seq\":null,\"dev\":null,\"sector\":null,\"io_bytes\":null,\"rwbs\":null",
        );
    } else {
        json_fields!(out, c; n address, n ip, n error_code, s fault_tensor, n file_offset, n op_seq, n dev, n sector,
            n io_bytes, s rwbs);
    }
    json_fields!(out, c; s seq_ids, s positions);
    out.extend_from_slice(b"}\n");
}

/// RFC 4180 quoting: tensor names may hold commas or quotes (`x (view)`).
fn needs_quotes(s: &str) -> bool {
    s.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
}

fn quoted(out: &mut Vec<u8>, s: &str) {
    for (i, part) in s.split('"').enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\"\"");
        }
        out.extend_from_slice(part.as_bytes());
    }
}

fn csv_field(out: &mut Vec<u8>, s: &str) {
    if needs_quotes(s) {
        out.push(b'"');
        quoted(out, s);
        out.push(b'"');
    } else {
        out.extend_from_slice(s.as_bytes());
    }
}

fn cn(out: &mut Vec<u8>, v: Option<impl itoa::Integer>) {
    if let Some(v) = v {
        num(out, v);
    }
    out.push(b',');
}

fn cs(out: &mut Vec<u8>, v: Option<&str>) {
    csv_field(out, v.unwrap_or(""));
    out.push(b',');
}

/// One CSV line in [`columns::COLUMNS`] order, empty for absent values.
fn csv_line(c: &Cells, out: &mut Vec<u8>) {
    csv_head(c, out);
    csv_shape(c, out);
    csv_rest(c, out);
}

/// `kind` and `phase` are this module's constants, which need no quotes.
fn csv_head(c: &Cells, out: &mut Vec<u8>) {
    cn(out, Some(c.seq));
    out.extend_from_slice(c.kind.as_bytes());
    out.push(b',');
    cn(out, Some(c.ts_ns));
    cn(out, Some(c.rel_ns));
    cn(out, c.dur_ns);
    cn(out, Some(c.tid));
    cn(out, c.ubatch);
    out.extend_from_slice(c.phase.unwrap_or("").as_bytes());
    out.push(b',');
    cn(out, c.token_index);
}

fn csv_shape(c: &Cells, out: &mut Vec<u8>) {
    cs(out, Some(&c.name));
    cn(out, c.layer);
    cs(out, c.dst);
    cs(out, c.dst_memory);
    if let Some(srcs) = &c.srcs {
        // The joined names are one field: quoted if any name needs it.
        let quote = srcs.names().iter().any(|x| needs_quotes(x));
        if quote {
            out.push(b'"');
        }
        for (i, name) in srcs.names().iter().enumerate() {
            if i > 0 {
                out.push(b';');
            }
            if quote { quoted(out, name) } else { out.extend_from_slice(name.as_bytes()) }
        }
        if quote {
            out.push(b'"');
        }
    }
    out.push(b',');
    cn(out, Some(c.n_srcs));
    cn(out, Some(c.weights_file));
    cn(out, Some(c.weights_copy));
    cn(out, Some(c.weight_bytes));
}

fn csv_rest(c: &Cells, out: &mut Vec<u8>) {
    cn(out, c.ith);
    cn(out, c.nth);
    if c.io_columns_empty() {
        out.extend_from_slice(b",,,,,,,,,,");
    } else {
        cn(out, c.address);
        cn(out, c.ip);
        cn(out, c.error_code);
        cs(out, c.fault_tensor);
        cn(out, c.file_offset);
        cn(out, c.op_seq);
        cn(out, c.dev);
        cn(out, c.sector);
        cn(out, c.io_bytes);
        cs(out, c.rwbs);
    }
    cs(out, c.seq_ids);
    csv_field(out, c.positions.unwrap_or(""));
    out.push(b'\n');
}

#[cfg(test)]
mod tests;
