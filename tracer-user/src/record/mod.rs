//! Stage 5, record: the trace file format, its writer and its reader.
pub mod codec;
pub mod format;
pub mod reader;
pub mod recorder;
pub mod writer;

pub use format::{
    Descriptor, FileExtent, FileInfo, FilePos, Header, Hooks, Lost, Memory, ModelTable, ModelTensor, Trailer,
};
pub use reader::{Block, Fault, Op, PageCache, Record, TraceError, TraceReader};
pub use writer::{TraceWriter, WriterStats};

#[cfg(test)]
mod tests;
