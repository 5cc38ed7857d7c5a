//! VALUE frames (`--values`): one node output's fingerprint, computed while
//! recording. Fingerprints rather than raw bytes: Gemma 3 270M alone writes
//! about 2.2 MiB of activations per token, a fingerprint about 400 bytes per
//! node, and every use (export, `diff --values`, the oracle test) needs only
//! the fingerprint.
//!
//! Payload after the writer's common part (time, thread, graph, node index,
//! descriptors): site, flags, superseded reads, then if a fingerprint
//! follows (1) its fields.

use serde::{Deserialize, Serialize};

use super::codec::{CodecError, Cursor, put_bytes, put_u64};

/// Dimensions of [`Fingerprint::projection`].
pub const PROJECTION_DIMS: usize = 64;
/// How many leading and trailing values a fingerprint keeps.
pub const EDGE_VALUES: usize = 3;

/// Flags added by user space to the kernel's (`tracer_common::values::flags`).
pub mod user_flags {
    /// Some chunks never arrived (ring overflow): no fingerprint.
    pub const INCOMPLETE: u32 = 1 << 16;
}

/// What ttrace keeps of one node output.
#[derive(Clone, Debug, PartialEq)]
pub struct Fingerprint {
    pub elements: u64,
    /// Of the elements' bytes as stored, in logical (row-major) order.
    pub blake3: [u8; 32],
    /// Over all elements, as f64.
    pub sum: f64,
    pub rms: f64,
    /// Over the non-NaN elements.
    pub min: f64,
    pub max: f64,
    pub nan: u64,
    pub inf: u64,
    pub first: Vec<f32>,
    pub last: Vec<f32>,
    /// Count-sketch of the finite values (seeded, the same in every run):
    /// cosine similarity of two runs' projections estimates that of the
    /// outputs, whatever their precision.
    pub projection: [f32; PROJECTION_DIMS],
}

/// A VALUE frame as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub ts_ns: u64,
    pub tid: u32,
    /// The graph definition (GRAPH frame order) the node belongs to.
    pub graph: u32,
    /// Its index among the graph's nodes; `None` if the graph was not captured.
    pub node_index: Option<u32>,
    /// Descriptor of the node as read when it was done.
    pub dst: u32,
    /// Descriptor of the RMS_NORM node fused into this MUL (never written).
    pub fused: Option<u32>,
    /// Link-time address of the barrier call it was read at.
    pub site: u64,
    /// `tracer_common::values::flags` and [`user_flags`] bits.
    pub flags: u32,
    /// Earlier reads of the same node in the same run (barriers inside an
    /// op inlined into the node loop), replaced by this one.
    pub superseded: u32,
    pub fingerprint: Option<Fingerprint>,
}

/// The part of a VALUE frame after the writer's common fields.
pub fn encode_tail(out: &mut Vec<u8>, site: u64, flags: u32, superseded: u32, fp: Option<&Fingerprint>) {
    put_u64(out, site);
    put_u64(out, u64::from(flags));
    put_u64(out, u64::from(superseded));
    let Some(fp) = fp else {
        put_u64(out, 0);
        return;
    };
    put_u64(out, 1);
    put_u64(out, fp.elements);
    put_bytes(out, &fp.blake3);
    for v in [fp.sum, fp.rms, fp.min, fp.max] {
        put_u64(out, v.to_bits());
    }
    put_u64(out, fp.nan);
    put_u64(out, fp.inf);
    for edge in [&fp.first, &fp.last] {
        put_bytes(out, &edge.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    }
    put_bytes(out, &fp.projection.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
}

/// A VALUE frame after its time and thread (written by
/// `TraceWriter::value`): graph, node index + 1, descriptor, fused
/// descriptor + 1, then [`encode_tail`]'s part.
pub fn decode((ts_ns, tid): (u64, u32), c: &mut Cursor) -> Result<Value, CodecError> {
    let graph = c.u32()?;
    let node_index = c.u32()?.checked_sub(1);
    let dst = c.u32()?;
    let fused = c.u32()?.checked_sub(1);
    let (site, flags, superseded, fingerprint) = decode_tail(c)?;
    Ok(Value { ts_ns, tid, graph, node_index, dst, fused, site, flags, superseded, fingerprint })
}

/// The decoded tail: site, flags, superseded, fingerprint.
type Tail = (u64, u32, u32, Option<Fingerprint>);

fn decode_tail(c: &mut Cursor) -> Result<Tail, CodecError> {
    let site = c.u64()?;
    let flags = c.u32()?;
    let superseded = c.u32()?;
    if c.u64()? == 0 {
        return Ok((site, flags, superseded, None));
    }
    let elements = c.u64()?;
    let blake3 = fixed::<32>(c)?;
    let mut stats = [0f64; 4];
    for s in &mut stats {
        *s = f64::from_bits(c.u64()?);
    }
    let nan = c.u64()?;
    let inf = c.u64()?;
    let first = f32s(c.bytes()?);
    let last = f32s(c.bytes()?);
    let projection: [f32; PROJECTION_DIMS] = f32s(c.bytes()?).try_into().map_err(|_| CodecError { at: 0 })?;
    let [sum, rms, min, max] = stats;
    Ok((
        site,
        flags,
        superseded,
        Some(Fingerprint { elements, blake3, sum, rms, min, max, nan, inf, first, last, projection }),
    ))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// A length-prefixed field of exactly `N` bytes.
fn fixed<const N: usize>(c: &mut Cursor) -> Result<[u8; N], CodecError> {
    c.bytes()?.try_into().map_err(|_| CodecError { at: 0 })
}

/// A `--values` worker thread: the nodes and barriers its probes counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueThread {
    pub tid: u32,
    pub nodes: u64,
    pub barriers: u64,
}

/// Nodes of graph runs that `--values` left without an output record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValuesMissing {
    pub nodes: u64,
    /// Runs with at least one such node, and runs whose graph was known.
    pub runs: u64,
    pub runs_checked: u64,
    /// Why, where the kernel knew: a failed read of the thread's
    /// `ith, nth` (nodes), of a barrier's return address (nodes), a run
    /// whose state could not be made (runs).
    #[serde(default)]
    pub unread_params: u64,
    #[serde(default)]
    pub unread_site: u64,
    #[serde(default)]
    pub unread_runs: u64,
    /// Reads skipped because their CPU was mid-way through another (see
    /// `tracer_common::values::unread::BUSY`): the other read the node,
    /// unless a node is missing beside it.
    #[serde(default)]
    pub unread_busy: u64,
    /// Nodes `--values-filter` left out, and those of them the kernel did not copy.
    #[serde(default)]
    pub filtered: u64,
    #[serde(default)]
    pub filtered_uncopied: u64,
}
