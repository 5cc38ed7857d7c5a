//! The trace file: its frames, codec, writer and reader. Shared by both
//! paths: the live side writes it, the offline side reads it.
pub mod buffers;
pub mod codec;
pub mod executed;
pub mod frames;
mod memory;
pub mod reader;
pub mod records;
pub mod ring;
pub mod values;
pub mod writer;

pub use frames::{
    CgroupMemory, CopyMatches, Descriptor, Disabled, FileExtent, FileInfo, FilePos, Header, Hooks, LateAttach,
    LayoutCheck, Lost, Memory, Mode, ModelTable, ModelTensor, StopReason, TargetBuild, Tracepoints, Trailer,
    ValueThread, ValuesMissing,
};
pub use reader::{Block, Fault, Op, PageCache, Record, TraceError, TraceReader};
pub use writer::{GraphDefinition, OpStart, TraceWriter, WriterStats};

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod ring_tests;
#[cfg(test)]
mod tests;
