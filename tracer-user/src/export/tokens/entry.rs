//! One op's entry in `traces/<stem>.json`, as bytes. The keys are in the
//! sorted order `serde_json`'s maps gave them when the entries were `Value`s.
//!
//! An entry's fields come from three places: the op's shape (destination and
//! sources: names, pointers, layers, weights), its ubatch (phase, token id,
//! routed experts) and the op itself (time, thread, position). The shape's
//! fields are encoded once per [`OpShapes`](crate::export::shape::OpShapes)
//! key and copied into every entry that repeats them; an op that reads MoE
//! expert tensors is encoded per run, as its bytes read depend on the
//! ubatch's routing.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    analyze::{
        tensor::{is_expert_tensor, memory_class, model_tensor, op_layer, view_bytes, weight_of},
        walk::{OpEvent, Tables, WeightRead},
    },
    export::json_bytes::{float, hex, ints, n, num, s, string},
    format::Descriptor,
};

/// The fields of an entry that its op's shape gives, in three runs of
/// bytes: `{"dst_name":…`; `,"expert_ids":…` (routed ops) to
/// `,"operation_type":…`; `,"sources":[…]`. The per-op and per-ubatch
/// fields go between them.
pub struct EntryShape {
    bytes: Box<[u8]>,
    /// Where the second and third runs start.
    cuts: [usize; 2],
}

/// Whether an [`EntryShape`] may be reused for every run of its op shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    PerShape,
    /// The op read MoE expert tensors: `bytes_read` and `expert_ids` are
    /// the ubatch's routed experts'.
    PerUbatch,
}

/// Per layer, the experts a ubatch's tokens were routed to.
pub type RoutedExperts = BTreeMap<u32, Vec<i32>>;

/// One op of a ubatch: its shape's bytes and the fields of its own.
pub struct Entry {
    pub shape: Arc<EntryShape>,
    pub ts_ns: u64,
    pub duration_ns: Option<u64>,
    pub tid: u32,
}

/// What every entry of one ubatch shares.
pub struct UbatchFields {
    pub phase: &'static str,
    pub token_id: i32,
    /// The first entry's time: `timestamp_relative_ms` counts from it.
    pub first_ns: u64,
}

pub fn shape(e: &OpEvent, t: &Tables, experts: &RoutedExperts) -> (EntryShape, Scope) {
    let dst = t.descriptor(e.op.dst);
    let slotted = t.slotted(&e.op);
    let srcs: Vec<&Descriptor> = slotted.iter().map(|&(_, d)| d).collect();
    let layer = op_layer(t.models, dst, &srcs);
    let op_name = t.op_name_ref(&e.op);
    let reads: Vec<Option<WeightRead>> =
        slotted.iter().map(|&source| t.weight_read(&op_name, e.ctx.ubatch, source, &slotted)).collect();
    // Whether a read is routed depends on the ubatch (its routing may be
    // missing): any expert tensor makes the shape the ubatch's.
    let experts_read = reads
        .iter()
        .flatten()
        .any(|r| r.routed || model_tensor(t.models, r.weight.model, r.weight.tensor).is_some_and(is_expert_tensor));
    let scope = if experts_read { Scope::PerUbatch } else { Scope::PerShape };
    // An MoE op reading routed experts: the experts of its layer.
    let expert_ids = reads
        .iter()
        .flatten()
        .find(|r| r.routed)
        .and_then(|r| model_tensor(t.models, r.weight.model, r.weight.tensor)?.layer)
        .and_then(|l| experts.get(&l));

    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"dst_name\":");
    string(&mut out, &dst.name);
    let dst_end = out.len();
    if let Some(ids) = expert_ids {
        out.extend_from_slice(b",\"expert_ids\":");
        ints(&mut out, ids);
    }
    out.extend_from_slice(b",\"layer_id\":");
    n(&mut out, layer);
    if let Some(ids) = expert_ids {
        out.extend_from_slice(b",\"num_experts\":");
        num(&mut out, ids.len());
    }
    out.extend_from_slice(b",\"num_sources\":");
    num(&mut out, slotted.len());
    out.extend_from_slice(b",\"operation_type\":");
    string(&mut out, &op_name);
    let layer_end = out.len();
    out.extend_from_slice(b",\"sources\":[");
    for (i, (&(_, d), read)) in slotted.iter().zip(&reads).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        source(&mut out, d, read.as_ref(), layer, t);
    }
    out.push(b']');
    (EntryShape { bytes: out.into(), cuts: [dst_end, layer_end] }, scope)
}

/// One source, keys sorted: `buffer` (what the backend buffer holding it
/// holds: `KV cache`, `compute`, `repacked weights`, …), `buffer_id` and
/// `buffer_name` (for `BUFFER` sources in a traced buffer), `bytes_read`
/// (model tensors only), `disk_offset`
/// (file-backed ones), `layer_id` (the tensor's, else the op's),
/// `memory_class`, `memory_source`, `model_tensor`, `name`, `size_bytes`,
/// `tensor_ptr`.
fn source(out: &mut Vec<u8>, d: &Descriptor, read: Option<&WeightRead>, op_layer: Option<u32>, t: &Tables) {
    let weight = weight_of(d);
    let mt = weight.and_then(|w| model_tensor(t.models, w.model, w.tensor));
    out.push(b'{');
    let file_backed = weight.filter(|w| !w.copy);
    if let Some(b) = t.analysis.buffers.at(d.data).filter(|_| file_backed.is_none()) {
        out.extend_from_slice(b"\"buffer\":");
        string(out, b.label());
        out.extend_from_slice(b",\"buffer_id\":");
        num(out, b.id);
        out.extend_from_slice(b",\"buffer_name\":");
        string(out, &b.name());
        out.push(b',');
    }
    if let Some(read) = read {
        out.extend_from_slice(b"\"bytes_read\":");
        num(out, read.bytes);
        out.push(b',');
    }
    if let (Some(w), Some(mt)) = (file_backed, mt) {
        out.extend_from_slice(b"\"disk_offset\":");
        num(out, mt.file_offset + w.offset);
        out.push(b',');
    }
    out.extend_from_slice(b"\"layer_id\":");
    n(out, mt.map_or(op_layer, |mt| mt.layer.or(op_layer)));
    out.extend_from_slice(b",\"memory_class\":");
    string(out, memory_class(&d.memory));
    out.extend_from_slice(if file_backed.is_some() {
        b",\"memory_source\":\"DISK\""
    } else {
        b",\"memory_source\":\"BUFFER\""
    });
    if let Some(mt) = mt {
        out.extend_from_slice(b",\"model_tensor\":");
        string(out, &mt.name);
    }
    out.extend_from_slice(b",\"name\":");
    string(out, &d.name);
    out.extend_from_slice(b",\"size_bytes\":");
    n(out, view_bytes(d));
    out.extend_from_slice(b",\"tensor_ptr\":");
    hex(out, d.data);
    out.push(b'}');
}

impl Entry {
    /// The entry, keys sorted: `dst_name`, `duration_ns`, `entry_id`,
    /// `expert_ids`, `layer_id`, `num_experts`, `num_sources`,
    /// `operation_type`, `phase`, `sources`, `thread_id`, `timestamp_ns`,
    /// `timestamp_relative_ms`, `token_id`.
    pub fn write(&self, id: usize, u: &UbatchFields, out: &mut Vec<u8>) {
        let b = &self.shape.bytes;
        let [dst, layer] = self.shape.cuts;
        out.extend_from_slice(&b[..dst]);
        out.extend_from_slice(b",\"duration_ns\":");
        n(out, self.duration_ns);
        out.extend_from_slice(b",\"entry_id\":");
        num(out, id);
        out.extend_from_slice(&b[dst..layer]);
        out.extend_from_slice(b",\"phase\":");
        s(out, Some(u.phase));
        out.extend_from_slice(&b[layer..]);
        out.extend_from_slice(b",\"thread_id\":");
        num(out, self.tid);
        out.extend_from_slice(b",\"timestamp_ns\":");
        num(out, self.ts_ns);
        out.extend_from_slice(b",\"timestamp_relative_ms\":");
        float(out, super::ms(self.ts_ns.saturating_sub(u.first_ns)));
        out.extend_from_slice(b",\"token_id\":");
        num(out, u.token_id);
        out.push(b'}');
    }
}
