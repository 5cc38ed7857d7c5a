//! The [`super::rows`] schema as Parquet (Snappy, row groups of 128 Ki rows),
//! written through parquet's column writer rather than arrow to keep the
//! build light. Unsigned columns carry the unsigned INTEGER annotation, so
//! pyarrow/polars read them as uint32/uint64; `?` columns are optional.
//!
//! Rows are gathered into columns here and handed to [`encode`], a row group
//! at a time (at most three in memory). Strings travel as ids into a table of
//! distinct values, so a row costs no allocation and the encoder clones
//! shared buffers instead of copying bytes.

use std::{
    fs::File,
    path::Path,
    sync::{
        Arc,
        mpsc::{Receiver, SyncSender, sync_channel},
    },
};

use bytes::Bytes;
use indicatif::ProgressBar;
use parquet::{
    basic::{Compression, Encoding},
    data_type::ByteArray,
    file::{properties::WriterProperties, writer::SerializedFileWriter},
    schema::{
        parser::parse_message_type,
        types::{ColumnPath, SchemaDescriptor},
    },
};

mod encode;

use encode::{Batch, Column};

use super::{
    ExportError, Written,
    columns::{self, COLUMNS},
    rows::{Cells, ShapeScope, cells, op_context, op_shape},
    shape::{FxMap, OpShapes},
};
use crate::analyze::Analysis;
use crate::analyze::walk::{self, Event, Sink, Tables};

const ROW_GROUP: usize = 128 * 1024;

/// Nearly unique per row: a dictionary only costs a hash per value before
/// the writer falls back to plain; deltas of these are small.
const DELTA_COLUMNS: &[&str] = &["seq", "ts_ns", "rel_ns"];

/// Distinct strings kept before the table starts over (bounds memory on
/// traces with unbounded distinct names).
const STRINGS_LIMIT: usize = 1 << 18;

/// Distinct strings by id; entries new since the last row group go to the
/// encoder with it.
#[derive(Default)]
struct Strings {
    ids: FxMap<Box<[u8]>, u32>,
    /// Ids of `&'static str`s by address and length.
    statics: Vec<(usize, u32)>,
    fresh: Vec<ByteArray>,
    /// The next batch must tell the encoder to drop its table first.
    reset: bool,
}

impl Strings {
    fn id(&mut self, s: &[u8]) -> u32 {
        match self.ids.get(s) {
            Some(&id) => id,
            None => self.insert(s, ByteArray::from(s.to_vec())),
        }
    }

    /// [`Self::id`] without hashing: `kind`, `phase` and `dst_memory` are a
    /// handful of static strings, and static text never moves or changes.
    fn id_static(&mut self, s: &'static str) -> u32 {
        let key = s.as_ptr() as usize ^ (s.len() << 48);
        if let Some(&(_, id)) = self.statics.iter().find(|(k, _)| *k == key) {
            return id;
        }
        let id = match self.ids.get(s.as_bytes()) {
            Some(&id) => id,
            // A static buffer: the encoder's clone per row skips the reference count.
            None => self.insert(s.as_bytes(), ByteArray::from(Bytes::from_static(s.as_bytes()))),
        };
        self.statics.push((key, id));
        id
    }

    fn insert(&mut self, s: &[u8], value: ByteArray) -> u32 {
        let id = self.ids.len() as u32;
        self.ids.insert(s.into(), id);
        self.fresh.push(value);
        id
    }
}

/// The `name`..`weight_bytes` columns of one op shape, strings as ids.
#[derive(Clone, Copy)]
struct ShapeIds {
    name: u32,
    layer: Option<u32>,
    dst: Option<u32>,
    dst_memory: Option<u32>,
    srcs: Option<u32>,
    n_srcs: u32,
    weights_file: u32,
    weights_copy: u32,
    weight_bytes: u64,
}

struct ParquetSink {
    columns: Vec<Column>,
    /// Physical type and optionality per column.
    layout: Vec<(parquet::basic::Type, bool)>,
    /// Interned `name`..`weight_bytes` per op shape.
    ops: OpShapes<ShapeIds>,
    strings: Strings,
    /// `srcs` joined, reused.
    joined: Vec<u8>,
    rows: u64,
    batches: Option<SyncSender<Batch>>,
    /// Emptied columns back from the encoder.
    spare: Receiver<Vec<Column>>,
    /// A batch could not be sent: the encoder failed.
    stopped: bool,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    let schema = Arc::new(parse_message_type(&columns::parquet_schema())?);
    let fields = schema.get_fields();
    debug_assert_eq!(fields.len(), COLUMNS.len());
    let layout = fields.iter().map(|f| (f.get_physical_type(), f.is_optional())).collect();
    let mut props = WriterProperties::builder().set_compression(Compression::SNAPPY);
    for &name in DELTA_COLUMNS {
        let path = ColumnPath::from(name);
        props = props
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
    }
    let props = Arc::new(props.build());
    let file = File::create(out).map_err(ExportError::write(out))?;
    let writer = SerializedFileWriter::new(file, schema.clone(), props.clone())?;
    let descr = Arc::new(SchemaDescriptor::new(schema));
    let (batches, batches_rx) = sync_channel::<Batch>(0);
    let (spare_tx, spare) = sync_channel::<Vec<Column>>(1);
    let encoder = std::thread::spawn(move || encode::run(writer, descr, props, batches_rx, spare_tx));
    let mut sink = ParquetSink {
        columns: Vec::new(),
        layout,
        ops: OpShapes::default(),
        strings: Strings::default(),
        joined: Vec::new(),
        rows: 0,
        batches: Some(batches),
        spare,
        stopped: false,
    };
    sink.columns = sink.empty_columns();
    let walked = walk::walk(trace, a, progress, &mut sink).and_then(|()| sink.send());
    // Closing the channel lets the encoder finish the file.
    sink.batches = None;
    let encoded = match encoder.join() {
        Ok(result) => result.map_err(ExportError::from),
        Err(_) => Err(ExportError::Invalid("the Parquet encoder thread panicked".into())),
    };
    match (walked, encoded) {
        (Ok(()), Ok(())) => Ok(Written { events: sink.rows, items: sink.rows }),
        // A send fails because the encoder stopped: its error says why.
        (Err(_), Err(e)) if sink.stopped => Err(e),
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
    }
}

impl ParquetSink {
    /// `seq` to `token_index`.
    fn push_head(&mut self, r: &Cells) {
        let (c, strings) = (&mut self.columns, &mut self.strings);
        c[0].u64(Some(r.seq));
        c[1].str(Some(strings.id_static(r.kind)));
        c[2].u64(Some(r.ts_ns));
        c[3].u64(Some(r.rel_ns));
        c[4].u64(r.dur_ns);
        c[5].u32(Some(r.tid));
        c[6].u32(r.ubatch);
        c[7].str(r.phase.map(|p| strings.id_static(p)));
        c[8].u32(r.token_index);
    }

    /// `name` to `weight_bytes`.
    fn push_shape(&mut self, s: &ShapeIds) {
        let c = &mut self.columns;
        c[9].str(Some(s.name));
        c[10].u32(s.layer);
        c[11].str(s.dst);
        c[12].str(s.dst_memory);
        c[13].str(s.srcs);
        c[14].u32(Some(s.n_srcs));
        c[15].u32(Some(s.weights_file));
        c[16].u32(Some(s.weights_copy));
        c[17].u64(Some(s.weight_bytes));
    }

    /// `ith` to `rwbs`.
    fn push_rest(&mut self, r: &Cells) {
        let (c, strings) = (&mut self.columns, &mut self.strings);
        c[18].u32(r.ith);
        c[19].u32(r.nth);
        c[20].u64(r.address);
        c[21].u64(r.ip);
        c[22].u64(r.error_code);
        c[23].str(r.fault_tensor.map(|s| strings.id(s.as_bytes())));
        c[24].u64(r.file_offset);
        c[25].u64(r.op_seq);
        c[26].u32(r.dev);
        c[27].u64(r.sector);
        c[28].u64(r.io_bytes);
        c[29].str(r.rwbs.map(|s| strings.id(s.as_bytes())));
        c[30].str(r.seq_ids.map(|s| strings.id(s.as_bytes())));
        c[31].str(r.positions.map(|s| strings.id(s.as_bytes())));
    }

    fn shape_ids(&mut self, r: &Cells) -> ShapeIds {
        let strings = &mut self.strings;
        let srcs = r.srcs.map(|s| {
            self.joined.clear();
            for (i, name) in s.names().iter().enumerate() {
                if i > 0 {
                    self.joined.push(b';');
                }
                self.joined.extend_from_slice(name.as_bytes());
            }
            strings.id(&self.joined)
        });
        ShapeIds {
            name: strings.id(r.name.as_bytes()),
            layer: r.layer,
            dst: r.dst.map(|s| strings.id(s.as_bytes())),
            dst_memory: r.dst_memory.map(|s| strings.id_static(s)),
            srcs,
            n_srcs: r.n_srcs,
            weights_file: r.weights_file,
            weights_copy: r.weights_copy,
            weight_bytes: r.weight_bytes,
        }
    }

    fn empty_columns(&self) -> Vec<Column> {
        self.layout
            .iter()
            .map(|&(physical, optional)| {
                let defs = optional.then(|| Vec::with_capacity(ROW_GROUP));
                match physical {
                    parquet::basic::Type::INT64 => Column::I64(Vec::with_capacity(ROW_GROUP), defs),
                    parquet::basic::Type::INT32 => Column::I32(Vec::with_capacity(ROW_GROUP), defs),
                    _ => Column::Str(Vec::with_capacity(ROW_GROUP), defs),
                }
            })
            .collect()
    }

    /// Rows gathered since the last row group (`seq` is in every row).
    fn pending(&self) -> usize {
        match &self.columns[0] {
            Column::I64(v, _) => v.len(),
            _ => 0,
        }
    }

    /// Hands the gathered rows to the encoder as one row group.
    fn send(&mut self) -> Result<(), ExportError> {
        if self.pending() == 0 {
            return Ok(());
        }
        let next = self.spare.try_recv().unwrap_or_else(|_| self.empty_columns());
        let batch = Batch {
            columns: std::mem::replace(&mut self.columns, next),
            strings: std::mem::take(&mut self.strings.fresh),
            reset: std::mem::take(&mut self.strings.reset),
        };
        if self.strings.ids.len() >= STRINGS_LIMIT {
            self.strings.ids.clear();
            self.strings.statics.clear();
            self.strings.reset = true;
            self.ops.clear();
        }
        self.stopped = self.batches.as_ref().is_none_or(|b| b.send(batch).is_err());
        if self.stopped { Err(ExportError::Invalid("the Parquet encoder stopped".into())) } else { Ok(()) }
    }
}

impl Sink for ParquetSink {
    type Error = ExportError;

    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), ExportError> {
        if let Event::Op(e) = event {
            // Most rows are ops: their shape columns are interned once per shape.
            let c = op_context(e, tables);
            let ids = match self.ops.get(&e.op, tables.models.len()) {
                Some(&ids) => ids,
                None => {
                    let mut s = Cells::default();
                    let scope = op_shape(e, tables, &mut s);
                    let ids = self.shape_ids(&s);
                    match scope {
                        ShapeScope::PerShape => *self.ops.insert(&e.op, ids),
                        ShapeScope::PerUbatch => ids,
                    }
                }
            };
            self.push_head(&c);
            self.push_shape(&ids);
            self.push_rest(&c);
        } else {
            let Some(c) = cells(event, tables) else { return Ok(()) };
            let ids = self.shape_ids(&c);
            self.push_head(&c);
            self.push_shape(&ids);
            self.push_rest(&c);
        }
        self.rows += 1;
        if self.pending() >= ROW_GROUP { self.send() } else { Ok(()) }
    }
}
