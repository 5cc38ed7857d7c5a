//! The [`super::rows`] schema as Parquet (Snappy, row groups of 128 Ki rows),
//! written through parquet's column writer rather than arrow to keep the
//! build light. Unsigned columns carry the unsigned INTEGER annotation, so
//! pyarrow/polars read them as uint32/uint64; `?` columns are optional.

use std::{fs::File, path::Path, sync::Arc};

use indicatif::ProgressBar;
use parquet::{
    basic::Compression,
    data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type},
    file::{properties::WriterProperties, writer::SerializedFileWriter},
    schema::parser::parse_message_type,
};

use super::{
    ExportError, Written,
    rows::{COLUMNS, Row, row},
    walk::{self, Event, Sink, Tables},
};
use crate::correlate::Analysis;

const ROW_GROUP: usize = 128 * 1024;

const SCHEMA: &str = "message ttrace_event {
  required int64 seq (INTEGER(64,false));
  required binary kind (STRING);
  required int64 ts_ns (INTEGER(64,false));
  required int64 rel_ns (INTEGER(64,false));
  optional int64 dur_ns (INTEGER(64,false));
  required int32 tid (INTEGER(32,false));
  optional int32 ubatch (INTEGER(32,false));
  optional binary phase (STRING);
  optional int32 token_index (INTEGER(32,false));
  required binary name (STRING);
  optional int32 layer (INTEGER(32,false));
  optional binary dst (STRING);
  optional binary dst_memory (STRING);
  optional binary srcs (STRING);
  required int32 n_srcs (INTEGER(32,false));
  required int32 weights_file (INTEGER(32,false));
  required int32 weights_copy (INTEGER(32,false));
  required int64 weight_bytes (INTEGER(64,false));
  optional int32 ith (INTEGER(32,false));
  optional int32 nth (INTEGER(32,false));
  optional int64 address (INTEGER(64,false));
  optional int64 ip (INTEGER(64,false));
  optional int64 error_code (INTEGER(64,false));
  optional binary fault_tensor (STRING);
  optional int64 file_offset (INTEGER(64,false));
  optional int64 op_seq (INTEGER(64,false));
  optional int32 dev (INTEGER(32,false));
  optional int64 sector (INTEGER(64,false));
  optional int64 io_bytes (INTEGER(64,false));
  optional binary rwbs (STRING);
}";

/// One column's values for the current row group.
enum Column {
    I64(Vec<i64>, Vec<i16>),
    I32(Vec<i32>, Vec<i16>),
    Str(Vec<ByteArray>, Vec<i16>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::I64(_, d) | Column::I32(_, d) | Column::Str(_, d) => d.len(),
        }
    }
    fn clear(&mut self) {
        match self {
            Column::I64(v, d) => (v.clear(), d.clear()),
            Column::I32(v, d) => (v.clear(), d.clear()),
            Column::Str(v, d) => (v.clear(), d.clear()),
        };
    }
    // Bit casts: the unsigned annotation tells readers how to read them back.
    fn u64(&mut self, x: Option<u64>) {
        if let Column::I64(v, d) = self {
            d.push(i16::from(x.is_some()));
            v.extend(x.map(|x| x as i64));
        }
    }
    fn u32(&mut self, x: Option<u32>) {
        if let Column::I32(v, d) = self {
            d.push(i16::from(x.is_some()));
            v.extend(x.map(|x| x as i32));
        }
    }
    fn str(&mut self, x: Option<&str>) {
        if let Column::Str(v, d) = self {
            d.push(i16::from(x.is_some()));
            v.extend(x.map(|x| ByteArray::from(x.as_bytes().to_vec())));
        }
    }
}

struct ParquetSink {
    writer: SerializedFileWriter<File>,
    columns: Vec<Column>,
    optional: Vec<bool>,
    rows: u64,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    let schema = Arc::new(parse_message_type(SCHEMA)?);
    let fields = schema.get_fields();
    debug_assert_eq!(fields.len(), COLUMNS.len());
    let columns = fields
        .iter()
        .map(|f| match f.get_physical_type() {
            parquet::basic::Type::INT64 => Column::I64(Vec::new(), Vec::new()),
            parquet::basic::Type::INT32 => Column::I32(Vec::new(), Vec::new()),
            _ => Column::Str(Vec::new(), Vec::new()),
        })
        .collect();
    let optional = fields.iter().map(|f| f.is_optional()).collect();
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
    let file = File::create(out).map_err(ExportError::write(out))?;
    let writer = SerializedFileWriter::new(file, schema, props)?;
    let mut sink = ParquetSink { writer, columns, optional, rows: 0 };
    walk::walk(trace, a, progress, &mut sink)?;
    sink.flush()?;
    sink.writer.close()?;
    Ok(Written { events: sink.rows, items: sink.rows })
}

impl ParquetSink {
    fn push(&mut self, r: &Row) {
        let c = &mut self.columns;
        c[0].u64(Some(r.seq));
        c[1].str(Some(r.kind));
        c[2].u64(Some(r.ts_ns));
        c[3].u64(Some(r.rel_ns));
        c[4].u64(r.dur_ns);
        c[5].u32(Some(r.tid));
        c[6].u32(r.ubatch);
        c[7].str(r.phase);
        c[8].u32(r.token_index);
        c[9].str(Some(&r.name));
        c[10].u32(r.layer);
        c[11].str(r.dst.as_deref());
        c[12].str(r.dst_memory);
        c[13].str(r.srcs.as_deref());
        c[14].u32(Some(r.n_srcs));
        c[15].u32(Some(r.weights_file));
        c[16].u32(Some(r.weights_copy));
        c[17].u64(Some(r.weight_bytes));
        c[18].u32(r.ith);
        c[19].u32(r.nth);
        c[20].u64(r.address);
        c[21].u64(r.ip);
        c[22].u64(r.error_code);
        c[23].str(r.fault_tensor.as_deref());
        c[24].u64(r.file_offset);
        c[25].u64(r.op_seq);
        c[26].u32(r.dev);
        c[27].u64(r.sector);
        c[28].u64(r.io_bytes);
        c[29].str(r.rwbs.as_deref());
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.columns[0].len() == 0 {
            return Ok(());
        }
        let mut group = self.writer.next_row_group()?;
        let mut i = 0;
        while let Some(mut col) = group.next_column()? {
            let defs = |d: &Vec<i16>| if self.optional[i] { Some(d.clone()) } else { None };
            match &self.columns[i] {
                Column::I64(v, d) => col.typed::<Int64Type>().write_batch(v, defs(d).as_deref(), None)?,
                Column::I32(v, d) => col.typed::<Int32Type>().write_batch(v, defs(d).as_deref(), None)?,
                Column::Str(v, d) => col.typed::<ByteArrayType>().write_batch(v, defs(d).as_deref(), None)?,
            };
            col.close()?;
            i += 1;
        }
        group.close()?;
        self.columns.iter_mut().for_each(Column::clear);
        Ok(())
    }
}

impl Sink for ParquetSink {
    fn event(&mut self, event: &Event, tables: &Tables) -> Result<(), ExportError> {
        let Some(r) = row(event, tables) else { return Ok(()) };
        self.push(&r);
        self.rows += 1;
        if self.columns[0].len() >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }
}
