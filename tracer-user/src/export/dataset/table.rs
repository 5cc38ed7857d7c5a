//! One table's rows for one run, held as columns and written as one Parquet
//! file (one row group, Snappy). Cells are set by column name and checked
//! against [`super::schema`]: a wrong name or type is a bug, caught by the
//! first run in the tests.

use std::{fs::File, path::Path, sync::Arc};

use parquet::{
    basic::Compression,
    column::writer::ColumnWriter,
    data_type::ByteArray,
    file::{properties::WriterProperties, writer::SerializedFileWriter},
    schema::parser::parse_message_type,
};

use super::schema::{Column, DType, Table};
use crate::export::ExportError;

/// One cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    I32(i32),
    I64(i64),
    F64(f64),
    Bool(bool),
    Text(String),
}

impl Value {
    fn dtype(&self) -> DType {
        match self {
            Value::I32(_) => DType::I32,
            Value::I64(_) => DType::I64,
            Value::F64(_) => DType::F64,
            Value::Bool(_) => DType::Bool,
            Value::Text(_) => DType::Text,
        }
    }
}

/// u64 figures as int64: traces never come near 2^63 bytes or nanoseconds.
pub fn i64_of(v: u64) -> Value {
    Value::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

pub fn i32_of(v: u32) -> Value {
    Value::I32(i32::try_from(v).unwrap_or(i32::MAX))
}

pub struct TableRows {
    pub table: Table,
    columns: &'static [Column],
    cells: Vec<Vec<Option<Value>>>,
}

impl TableRows {
    pub fn new(table: Table) -> TableRows {
        let columns = table.columns().expect("a table with its own columns");
        TableRows { table, columns, cells: vec![Vec::new(); columns.len()] }
    }

    fn len(&self) -> usize {
        self.cells.first().map_or(0, Vec::len)
    }

    /// A row: every column the closure does not set is null.
    pub fn push(&mut self, cells: &[(&str, Option<Value>)]) -> Result<(), ExportError> {
        let n = self.len();
        for (name, value) in cells {
            let i = self.columns.iter().position(|c| c.name == *name).ok_or_else(|| {
                ExportError::Invalid(format!("dataset: table {} has no column {name}", self.table.name()))
            })?;
            if let Some(v) = value
                && v.dtype() != self.columns[i].ty
            {
                return Err(ExportError::Invalid(format!(
                    "dataset: {}.{name} is {:?}, not {:?}",
                    self.table.name(),
                    self.columns[i].ty,
                    v.dtype()
                )));
            }
            self.cells[i].push(value.clone());
        }
        for (i, column) in self.cells.iter_mut().enumerate() {
            if column.len() == n {
                if !self.columns[i].optional {
                    return Err(ExportError::Invalid(format!(
                        "dataset: {}.{} is required",
                        self.table.name(),
                        self.columns[i].name
                    )));
                }
                column.push(None);
            } else if column.len() != n + 1 {
                return Err(ExportError::Invalid(format!(
                    "dataset: {}.{} set twice",
                    self.table.name(),
                    self.columns[i].name
                )));
            }
        }
        Ok(())
    }

    /// Writes the rows to `out` (an empty table still gets a file, so every
    /// run has every table and a reader's schema never depends on which).
    pub fn write(&self, out: &Path) -> Result<u64, ExportError> {
        let schema = Arc::new(parse_message_type(&self.table.parquet_schema())?);
        let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
        let file = File::create(out).map_err(ExportError::write(out))?;
        let mut writer = SerializedFileWriter::new(file, schema, props)?;
        let mut group = writer.next_row_group()?;
        for (i, cells) in self.cells.iter().enumerate() {
            let Some(mut col) = group.next_column()? else {
                return Err(ExportError::Invalid("dataset: fewer Parquet columns than the schema".into()));
            };
            let optional = self.columns[i].optional;
            let defs: Vec<i16> = cells.iter().map(|c| i16::from(c.is_some())).collect();
            let defs = optional.then_some(defs.as_slice());
            let present = cells.iter().flatten();
            match col.untyped() {
                ColumnWriter::Int32ColumnWriter(w) => {
                    let v: Vec<i32> =
                        present.filter_map(|v| if let Value::I32(x) = v { Some(*x) } else { None }).collect();
                    w.write_batch(&v, defs, None)?;
                }
                ColumnWriter::Int64ColumnWriter(w) => {
                    let v: Vec<i64> =
                        present.filter_map(|v| if let Value::I64(x) = v { Some(*x) } else { None }).collect();
                    w.write_batch(&v, defs, None)?;
                }
                ColumnWriter::DoubleColumnWriter(w) => {
                    let v: Vec<f64> =
                        present.filter_map(|v| if let Value::F64(x) = v { Some(*x) } else { None }).collect();
                    w.write_batch(&v, defs, None)?;
                }
                ColumnWriter::BoolColumnWriter(w) => {
                    let v: Vec<bool> =
                        present.filter_map(|v| if let Value::Bool(x) = v { Some(*x) } else { None }).collect();
                    w.write_batch(&v, defs, None)?;
                }
                ColumnWriter::ByteArrayColumnWriter(w) => {
                    let v: Vec<ByteArray> = present
                        .filter_map(|v| if let Value::Text(x) = v { Some(ByteArray::from(x.as_str())) } else { None })
                        .collect();
                    w.write_batch(&v, defs, None)?;
                }
                _ => return Err(ExportError::Invalid("dataset: a column type the schema does not use".into())),
            }
            col.close()?;
        }
        group.close()?;
        writer.close()?;
        Ok(self.len() as u64)
    }
}
