//! `blkparse`: the trace's block events as blkparse's default text, each
//! line followed by what ttrace knows about it:
//!
//! ```text
//! 254,0    1        3     0.012345678  1148  D  RA 175328000 + 8192 [llama-completio] tensor=blk.0.attn_q.weight file_off=1048576 ubatch=load layer=0
//! ```
//!
//! Columns are blkparse's `%D %2c %8s %5T.%9t %5p %2a %3d %S + %n [%C]`
//! (device, cpu, sequence, seconds since trace start, pid, action, RWBS,
//! sector + sectors, command; a completion's brackets hold its error, as
//! blkparse prints them). Actions are `D` (issued to the driver) and `C`
//! (completed). Scripts that read blkparse output can ignore everything
//! after `]`. The suffix is space-separated `key=value` pairs with no space
//! in a value. It names the first tensor the request read (with
//! `tensors=N` when it spans several; `tensor=-` when it read only the
//! header or padding between tensors), the file offset where it starts, the
//! ubatch (`load` before the first graph, `between` outside graphs), the
//! tensor's layer and, when the issuing thread was running a ggml op in that
//! graph (a synchronous read from a fault), ` op=NAME`.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use tracer_common::{BlockKind, markers};

use super::{ExportError, Written};
use crate::{
    analyze::io::{IoCorrelator, TensorBytes},
    format::{Record, TraceError, TraceReader},
};

/// Write every block event of the trace at `trace` to `out`.
pub fn write(trace: &Path, out: &Path) -> Result<Written, ExportError> {
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut writer = BufWriter::new(file);
    let lines = write_lines(TraceReader::open(trace)?, &mut writer).map_err(|e| match e {
        LinesError::Trace(e) => ExportError::Trace(e),
        LinesError::Write(e) => ExportError::write(out)(e),
    })?;
    writer.flush().map_err(ExportError::write(out))?;
    Ok(Written { events: lines, items: lines })
}

#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// Write every block event of `reader`; returns the number of lines.
pub fn write_lines<R: std::io::Read>(mut reader: TraceReader<R>, out: &mut impl Write) -> Result<u64, LinesError> {
    let start = reader.header().start_monotonic_ns;
    let mut io = IoCorrelator::default();
    let (mut current, mut graphs) = (None::<u32>, 0u32);
    // The op each thread is running in the current graph.
    let mut running: HashMap<u32, String> = HashMap::new();
    let mut sequence: HashMap<u32, u64> = HashMap::new();
    let mut lines = 0;
    while let Some(record) = reader.next_record()? {
        match record {
            Record::Model(m) => io.on_model(m, &reader.models()[m as usize]),
            Record::Marker(m) if m.cookie == markers::SCHED_GRAPH_COMPUTE => {
                current = Some(graphs);
                graphs += 1;
            }
            Record::Marker(m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                current = None;
                running.clear();
            }
            Record::Op(op) if current.is_some() => {
                let name = crate::analyze::op_name(reader.header(), reader.descriptor(op.dst).op);
                running.insert(op.tid, name);
            }
            Record::Block(b) => {
                let seq = sequence.entry(b.dev).or_default();
                *seq += 1;
                let t = b.ts_ns.saturating_sub(start);
                let (action, last) =
                    if b.kind == BlockKind::Complete { ('C', b.error.to_string()) } else { ('D', b.comm.clone()) };
                write!(
                    out,
                    "{:>3},{:<3} {:>2} {:>8} {:>5}.{:09} {:>5} {:>2} {:>3} {} + {} [{}]",
                    b.dev >> 20,
                    b.dev & 0xfffff,
                    b.cpu,
                    seq,
                    t / 1_000_000_000,
                    t % 1_000_000_000,
                    b.tgid,
                    action,
                    b.rwbs,
                    b.sector,
                    b.nr_sector,
                    last
                )?;
                let hits: Vec<_> = io.tensors_of(b.dev, b.sector, b.nr_sector);
                if let Some((named, file_offset)) = TensorBytes::naming(&hits) {
                    let table = &reader.models()[named.model as usize];
                    let (name, layer) = match table.tensors.get(named.tensor as usize) {
                        Some(t) => (t.name.as_str(), t.layer.map_or_else(|| "-".to_string(), |l| l.to_string())),
                        None => ("-", "-".to_string()),
                    };
                    let ubatch = match current {
                        Some(u) => u.to_string(),
                        None if graphs == 0 => "load".to_string(),
                        None => "between".to_string(),
                    };
                    write!(out, " tensor={name} file_off={file_offset} ubatch={ubatch} layer={layer}")?;
                    if let Some(op) = running.get(&b.tid).filter(|_| b.kind == BlockKind::Issue) {
                        write!(out, " op={op}")?;
                    }
                    let tensors = hits.iter().filter(|h| h.tensor != u32::MAX).count();
                    if tensors > 1 {
                        write!(out, " tensors={tensors}")?;
                    }
                }
                writeln!(out)?;
                lines += 1;
            }
            _ => {}
        }
    }
    Ok(lines)
}
