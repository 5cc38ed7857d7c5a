//! The writer's side of a ring of files (`--max-size`, see `format::ring`):
//! closing one file and going on in the next, which reads alone.

use std::io::{self, Write};

use super::{
    super::{
        frames::{Header, Lost, Trailer},
        ring::RingPart,
    },
    TraceWriter, write_header,
};

impl<W: Write> TraceWriter<W> {
    /// Bytes written to the current file so far.
    pub fn file_bytes(&self) -> u64 {
        self.stats.total_bytes - self.file_start
    }

    /// Close the current file (a LOST frame with `lost`, then `trailer`)
    /// and go on in `out`, a file that reads alone: a header (this one's,
    /// with the file's start and `part`), the model tables again, and ids
    /// interned afresh. The caller restates the rest (graph definitions,
    /// buffers alive). Returns the closed file's writer.
    pub fn restart(
        &mut self,
        out: W,
        (start_unix_ns, start_monotonic_ns): (u64, u64),
        part: RingPart,
        lost: Lost,
        trailer: &Trailer,
    ) -> io::Result<W> {
        self.lost(lost)?;
        self.end(trailer)?;
        let closed = std::mem::replace(&mut self.out, out);
        let header = Header { start_unix_ns, start_monotonic_ns, ring: Some(part), ..self.header.clone() };
        self.file_start = self.stats.total_bytes;
        self.stats.total_bytes += write_header(&mut self.out, &header)?;
        self.header = header;
        self.strings.clear();
        self.threads.clear();
        self.descriptors.clear();
        self.last_graphs.clear();
        self.graph_ids.restart();
        self.last_ts = start_monotonic_ns;
        for table in std::mem::take(&mut self.models) {
            self.model(&table)?;
        }
        Ok(closed)
    }
}
