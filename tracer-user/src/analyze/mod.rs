//! The offline path's middle stage: a recorded trace in, facts out. Two
//! passes: [`correlate::analyze`] (or the lighter [`phases::scan`]) settles
//! decodes, ubatches and phases; [`walk`] re-reads the trace with that
//! context for whoever needs every event ([`stats`], the exports). Nothing
//! here writes a file other tools open: that is `export`'s job.

pub mod buffers;
pub mod correlate;
pub mod diff;
pub mod io;
pub mod moe;
pub mod op_time;
pub mod phases;
pub mod report;
pub mod sequences;
pub mod simulate;
pub mod stats;
pub mod summary;
pub mod sweep;
pub mod tensor;
pub mod usage;
pub mod values;
pub mod values_diff;
pub mod walk;
pub mod weights;

pub use correlate::{Analysis, Decode, Phase, Ubatch, WeightUse, analyze, op_name, when};
pub(crate) use correlate::{Boundaries, assign_phases};
