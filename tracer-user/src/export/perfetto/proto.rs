//! Perfetto's trace messages: the subset in `tracer-user/proto/perfetto_subset.proto`.
//!
//! The structs are generated from that file by prost-build (on protox: no
//! protoc) into `tracer-user/proto/perfetto_subset.rs`, which is committed, so
//! building runs no code generator. `tests/perfetto_proto_fresh.rs` fails while
//! the committed file is stale; after editing the .proto, refresh it with
//! `TTRACE_UPDATE_PROTO=1 cargo test -p tracer-user --test perfetto_proto_fresh`.

include!("../../../proto/perfetto_subset.rs");

// The schema's enum fields are `Option<i32>` in prost; these name the values
// the exporter writes, taken from the generated enums.
pub const TYPE_SLICE_BEGIN: i32 = track_event::Type::SliceBegin as i32;
pub const TYPE_SLICE_END: i32 = track_event::Type::SliceEnd as i32;
pub const TYPE_INSTANT: i32 = track_event::Type::Instant as i32;
pub const TYPE_COUNTER: i32 = track_event::Type::Counter as i32;
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32;
pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32;
pub const UNIT_COUNT: i32 = counter_descriptor::Unit::Count as i32;
pub const UNIT_SIZE_BYTES: i32 = counter_descriptor::Unit::SizeBytes as i32;
pub const CHILD_ORDERING_EXPLICIT: i32 = track_descriptor::ChildTracksOrdering::Explicit as i32;
