//! Ground truth for resolution: the GGUF model map (every tensor's file, byte
//! range, layer and component), its physical placement on disk, and the
//! mapping of a process's virtual addresses onto it. Needs no root.

pub mod classify;
pub mod extents;
pub mod ggml_types;
pub mod gguf;
pub mod gguf_value;
pub mod gguf_write;
pub mod map;
pub mod maps;
pub mod whisper_bin;

pub use classify::Component;
pub use extents::{BlockDevice, ExtentError, FileExtents, Fragment};
pub use ggml_types::GgmlType;
pub use gguf::{GgufHeader, ParseError, ParseErrorKind, Value};
pub use map::{GgufError, ModelFile, ModelInfo, ModelMap, Tensor};
pub use maps::{AddressSpace, MapsError, MemoryClass, Resolution, TensorHit, TensorRef};
