//! Encoding row groups. Encoding is most of a Parquet export's work, more
//! than reading the trace, so it runs on two threads besides the walk: each
//! row group's columns are taken in turn by the writer thread and a helper,
//! each encoded into its own in-memory chunk (compressed, small), and the
//! writer splices the chunks into the file in schema order.

use std::{
    fs::File,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
        mpsc::{Receiver, SyncSender, sync_channel},
    },
};

use bytes::Bytes;
use parquet::{
    column::writer::{ColumnCloseResult, ColumnWriter, get_column_writer},
    data_type::ByteArray,
    errors::ParquetError,
    file::{
        properties::WriterPropertiesPtr,
        writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite},
    },
    schema::types::SchemaDescriptor,
};

/// String values are materialized and written this many at a time, so they
/// are still in cache when encoded.
const STR_SLICE: usize = 8192;

/// One column's values for a row group; definition levels only for
/// optional columns.
pub(super) enum Column {
    I64(Vec<i64>, Option<Vec<i16>>),
    I32(Vec<i32>, Option<Vec<i16>>),
    /// Ids into the encoder's string table.
    Str(Vec<u32>, Option<Vec<i16>>),
}

fn push<T>(values: &mut Vec<T>, defs: &mut Option<Vec<i16>>, x: Option<T>) {
    if let Some(d) = defs {
        d.push(i16::from(x.is_some()));
    }
    values.extend(x);
}

impl Column {
    pub(super) fn clear(&mut self) {
        let (Column::I64(_, d) | Column::I32(_, d) | Column::Str(_, d)) = self;
        d.iter_mut().for_each(Vec::clear);
        match self {
            Column::I64(v, _) => v.clear(),
            Column::I32(v, _) => v.clear(),
            Column::Str(v, _) => v.clear(),
        }
    }
    // Bit casts: the unsigned annotation tells readers how to read them back.
    pub(super) fn u64(&mut self, x: Option<u64>) {
        if let Column::I64(v, d) = self {
            push(v, d, x.map(|x| x as i64));
        }
    }
    pub(super) fn u32(&mut self, x: Option<u32>) {
        if let Column::I32(v, d) = self {
            push(v, d, x.map(|x| x as i32));
        }
    }
    pub(super) fn str(&mut self, x: Option<u32>) {
        if let Column::Str(v, d) = self {
            push(v, d, x);
        }
    }
    /// Strings cost the most to encode: they are handed out first.
    fn cost_rank(&self) -> u8 {
        match self {
            Column::Str(..) => 0,
            Column::I64(..) => 1,
            Column::I32(..) => 2,
        }
    }
}

/// A row group for the encoder, with the strings first seen in it.
pub(super) struct Batch {
    pub columns: Vec<Column>,
    pub strings: Vec<ByteArray>,
    /// Drop the string table before adding `strings`.
    pub reset: bool,
}

type Chunk = Result<(Bytes, ColumnCloseResult), ParquetError>;

/// A row group being encoded by both threads.
struct Job {
    columns: Vec<Column>,
    table: Arc<Vec<ByteArray>>,
    /// Columns in the order they are taken.
    order: Vec<usize>,
    next: AtomicUsize,
    chunks: Mutex<Vec<Option<Chunk>>>,
}

/// The writer thread: writes each batch as a row group, then closes the file.
pub(super) fn run(
    mut writer: SerializedFileWriter<File>,
    schema: Arc<SchemaDescriptor>,
    props: WriterPropertiesPtr,
    batches: Receiver<Batch>,
    spare: SyncSender<Vec<Column>>,
) -> Result<(), ParquetError> {
    let (jobs, jobs_rx) = sync_channel::<Arc<Job>>(0);
    let (done_tx, done) = sync_channel::<()>(0);
    let (helper_schema, helper_props) = (schema.clone(), props.clone());
    let helper = std::thread::spawn(move || {
        for job in jobs_rx {
            work(&job, &helper_schema, &helper_props);
            // Let go of the job before saying so: the writer takes it back.
            drop(job);
            if done_tx.send(()).is_err() {
                break;
            }
        }
    });
    let mut table = Arc::new(Vec::new());
    let result = (|| {
        for batch in batches {
            // The last job is gone, so this does not copy.
            let strings = Arc::make_mut(&mut table);
            if batch.reset {
                strings.clear();
            }
            strings.extend(batch.strings);
            let mut order: Vec<usize> = (0..batch.columns.len()).collect();
            order.sort_by_key(|&i| batch.columns[i].cost_rank());
            let job = Arc::new(Job {
                chunks: Mutex::new((0..batch.columns.len()).map(|_| None).collect()),
                columns: batch.columns,
                table: table.clone(),
                order,
                next: AtomicUsize::new(0),
            });
            let helped = jobs.send(job.clone()).is_ok();
            work(&job, &schema, &props);
            if helped && done.recv().is_err() {
                return Err(ParquetError::General("the Parquet encoder helper stopped".into()));
            }
            let job = Arc::try_unwrap(job)
                .map_err(|_| ParquetError::General("the Parquet encoder helper kept a row group".into()))?;
            let mut group = writer.next_row_group()?;
            let chunks = job.chunks.into_inner().unwrap_or_else(PoisonError::into_inner);
            for chunk in chunks {
                let (bytes, close) =
                    chunk.ok_or_else(|| ParquetError::General("a column was not encoded".into()))??;
                group.append_column(&bytes, close)?;
            }
            group.close()?;
            let mut columns = job.columns;
            columns.iter_mut().for_each(Column::clear);
            let _ = spare.try_send(columns);
        }
        writer.close().map(drop)
    })();
    drop(jobs);
    drop(done);
    let _ = helper.join();
    result
}

/// Encodes columns of `job` until none are left.
fn work(job: &Job, schema: &SchemaDescriptor, props: &WriterPropertiesPtr) {
    let mut values = Vec::new();
    while let Some(&i) = job.order.get(job.next.fetch_add(1, Ordering::Relaxed)) {
        let chunk = encode_column(&job.columns[i], schema, i, props, &job.table, &mut values);
        job.chunks.lock().unwrap_or_else(PoisonError::into_inner)[i] = Some(chunk);
    }
}

fn encode_column(
    column: &Column,
    schema: &SchemaDescriptor,
    i: usize,
    props: &WriterPropertiesPtr,
    table: &[ByteArray],
    values: &mut Vec<ByteArray>,
) -> Chunk {
    let mut out = TrackedWrite::new(Vec::new());
    let mut writer = get_column_writer(schema.column(i), props.clone(), Box::new(SerializedPageWriter::new(&mut out)));
    match (column, &mut writer) {
        (Column::I64(v, d), ColumnWriter::Int64ColumnWriter(w)) => {
            w.write_batch(v, d.as_deref(), None)?;
        }
        (Column::I32(v, d), ColumnWriter::Int32ColumnWriter(w)) => {
            w.write_batch(v, d.as_deref(), None)?;
        }
        (Column::Str(ids, d), ColumnWriter::ByteArrayColumnWriter(w)) => {
            let (mut at, mut next) = (0, 0);
            let levels = d.as_deref();
            let total = levels.map_or(ids.len(), <[i16]>::len);
            while at < total {
                let n = (total - at).min(STR_SLICE);
                let slice = levels.map(|l| &l[at..at + n]);
                let k = slice.map_or(n, |l| l.iter().filter(|&&x| x == 1).count());
                values.clear();
                values.extend(ids[next..next + k].iter().map(|&id| table[id as usize].clone()));
                w.write_batch(values, slice, None)?;
                (at, next) = (at + n, next + k);
            }
            values.clear();
        }
        _ => return Err(ParquetError::General(format!("column {i} does not match the schema"))),
    }
    let close = writer.close()?;
    Ok((Bytes::from(out.into_inner()?), close))
}
