//! The backend buffer table: every ggml buffer the target created, given
//! a usage and freed (`FrameKind::Buffer`), with what it holds. ggml marks
//! weights and compute buffers; the KV cache and the output buffer stay
//! "ANY", so they are told apart here: a buffer created inside
//! `llama_context::output_reserve` is the output buffer, one holding a
//! `cache_k_l*`/`cache_v_l*` tensor is the KV cache.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use tracer_common::markers;

use crate::format::{
    Descriptor,
    reader::{BufferAction, BufferRecord, Marker},
};

/// What a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Usage {
    /// Model weights (ggml usage WEIGHTS).
    Weights,
    /// The KV cache (usage ANY, holds the `cache_*` tensors).
    Kv,
    /// Graph intermediates (usage COMPUTE).
    Compute,
    /// Logits and embeddings (usage ANY, made by `output_reserve`).
    Output,
    /// Usage ANY, and none of the above.
    Other,
}

impl Usage {
    /// ggml's `enum ggml_backend_buffer_usage`.
    const GGML_WEIGHTS: u32 = 1;
    const GGML_COMPUTE: u32 = 2;

    pub const ALL: [Usage; 5] = [Usage::Weights, Usage::Kv, Usage::Compute, Usage::Output, Usage::Other];

    pub fn name(self) -> &'static str {
        match self {
            Usage::Weights => "weights",
            Usage::Kv => "KV cache",
            Usage::Compute => "compute",
            Usage::Output => "output",
            Usage::Other => "other",
        }
    }
}

/// ggml's name of a usage value (`WEIGHTS`, `COMPUTE`, `ANY`).
pub fn ggml_usage_name(usage: u32) -> &'static str {
    match usage {
        Usage::GGML_WEIGHTS => "WEIGHTS",
        Usage::GGML_COMPUTE => "COMPUTE",
        0 => "ANY",
        _ => "unknown",
    }
}

/// One backend buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// In creation order, from 0.
    pub id: u32,
    /// Address of the `ggml_backend_buffer`.
    pub address: u64,
    /// The buffer type's name as last read (CPU_REPACK replaces `CPU`);
    /// empty when never read.
    pub type_name: String,
    /// The first byte of its data (the CPU types' context, aligned as
    /// `ggml_backend_cpu_buffer_get_base` aligns it); `None` for other types.
    pub base: Option<u64>,
    pub size: u64,
    /// ggml's usage value as last set.
    pub ggml_usage: u32,
    pub usage: Usage,
    /// `None`: created before tracing started (`attach`).
    pub created_ns: Option<u64>,
    pub freed_ns: Option<u64>,
    /// The thread that created it.
    pub tid: Option<u32>,
    /// Op sources read from it that are not model-file bytes (the reads a
    /// trace without buffers calls `copy` or `anon`).
    pub source_reads: u64,
}

impl Buffer {
    /// What its bytes are to a reader of an op's sources: `KV cache`,
    /// `compute`, `repacked weights`, …
    pub fn label(&self) -> &'static str {
        match self.usage {
            Usage::Weights if self.type_name == "CPU_REPACK" => "repacked weights",
            usage => usage.name(),
        }
    }

    /// Its type and what it holds: `CPU_Mapped weights`, `CPU KV cache`.
    pub fn name(&self) -> String {
        let kind = if self.type_name.is_empty() { "?" } else { &self.type_name };
        format!("{kind} {}", self.label())
    }

    pub fn contains(&self, address: u64) -> bool {
        self.base.is_some_and(|b| (b..b.saturating_add(self.size)).contains(&address))
    }

    pub fn alive_at(&self, ts_ns: u64) -> bool {
        self.created_ns.is_none_or(|c| c <= ts_ns) && self.freed_ns.is_none_or(|f| f > ts_ns)
    }
}

/// `TENSOR_ALIGNMENT`: the CPU buffer types align their base to it.
const TENSOR_ALIGNMENT: u64 = 32;

/// Tensors of llama.cpp's KV cache (and of recurrent models' state).
const KV_PREFIXES: [&str; 4] = ["cache_k_l", "cache_v_l", "cache_r_l", "cache_s_l"];

/// Every buffer of a trace, built record by record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Buffers {
    pub list: Vec<Buffer>,
    /// 0-byte buffers created (and left out of `list`).
    pub empty: u64,
    /// Buffer address → index in `list`, while it lives.
    #[serde(skip)]
    live: HashMap<u64, usize>,
    /// Threads inside `output_reserve`.
    #[serde(skip)]
    in_output_reserve: HashSet<u32>,
}

impl Buffers {
    pub fn on_marker(&mut self, m: &Marker) {
        match m.cookie {
            markers::OUTPUT_RESERVE => {
                self.in_output_reserve.insert(m.tid);
            }
            markers::OUTPUT_RESERVE_RETURN => {
                self.in_output_reserve.remove(&m.tid);
            }
            _ => {}
        }
    }

    pub fn on_record(&mut self, r: &BufferRecord) {
        let index = match (r.action, self.live.get(&r.buffer)) {
            (BufferAction::Created, _) | (_, None) => {
                let created = r.action == BufferAction::Created;
                let output = created && self.in_output_reserve.contains(&r.tid);
                self.list.push(Buffer {
                    id: self.list.len() as u32,
                    address: r.buffer,
                    type_name: String::new(),
                    base: None,
                    size: r.size,
                    ggml_usage: r.usage,
                    usage: if output { Usage::Output } else { Usage::Other },
                    created_ns: created.then_some(r.ts_ns),
                    freed_ns: None,
                    tid: created.then_some(r.tid),
                    source_reads: 0,
                });
                self.live.insert(r.buffer, self.list.len() - 1);
                self.list.len() - 1
            }
            (_, Some(&i)) => i,
        };
        let b = &mut self.list[index];
        if !r.type_name.is_empty() {
            b.type_name.clone_from(&r.type_name);
        }
        if b.type_name.starts_with("CPU") && r.context != 0 {
            b.base = Some(r.context.next_multiple_of(TENSOR_ALIGNMENT));
        }
        b.size = r.size;
        b.ggml_usage = r.usage;
        b.usage = match r.usage {
            Usage::GGML_WEIGHTS => Usage::Weights,
            Usage::GGML_COMPUTE => Usage::Compute,
            _ => b.usage,
        };
        if r.action == BufferAction::Freed {
            b.freed_ns = Some(r.ts_ns);
            self.live.remove(&r.buffer);
        }
    }

    /// Drops the empty buffers (llama.cpp allocates hundreds of 0-byte ones
    /// while loading, to ask each buffer type which ops it supports) and
    /// names the ANY buffers that hold the KV cache, from the tensors the
    /// graphs read.
    pub fn finish(&mut self, descriptors: &[Descriptor]) {
        self.live.clear();
        let before = self.list.len();
        self.list.retain(|b| b.size > 0);
        self.empty = (before - self.list.len()) as u64;
        for (id, b) in self.list.iter_mut().enumerate() {
            b.id = id as u32;
        }
        for d in descriptors.iter().filter(|d| d.data != 0 && KV_PREFIXES.iter().any(|p| d.name.starts_with(p))) {
            if let Some(b) = self.list.iter_mut().rev().find(|b| b.usage == Usage::Other && b.contains(d.data)) {
                b.usage = Usage::Kv;
            }
        }
    }

    /// An op read a source at `address` outside the model file.
    pub fn note_read(&mut self, address: u64) {
        // Live buffers overlap only where a type wraps another's memory: the newest.
        if let Some(&i) = self.live.values().filter(|&&i| self.list[i].contains(address)).max() {
            self.list[i].source_reads += 1;
        }
    }

    /// The buffer holding `address`: the latest created one, when a freed
    /// buffer's memory was reused.
    pub fn at(&self, address: u64) -> Option<&Buffer> {
        self.list.iter().rev().find(|b| b.contains(address))
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Bytes per (usage label, type) of the buffers alive at `ts_ns`.
    pub fn sizes_at(&self, ts_ns: u64) -> Vec<((&'static str, String), u64)> {
        let mut sums: Vec<((&'static str, String), u64)> = Vec::new();
        for b in self.list.iter().filter(|b| b.alive_at(ts_ns)) {
            let key = (b.usage.name(), b.type_name.clone());
            match sums.iter_mut().find(|(k, _)| *k == key) {
                Some((_, sum)) => *sum += b.size,
                None => sums.push((key, b.size)),
            }
        }
        sums.sort();
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ts_ns: u64, action: BufferAction, buffer: u64, usage: u32, type_name: &str) -> BufferRecord {
        BufferRecord {
            ts_ns,
            tid: 7,
            action,
            buffer,
            buft: 0x10,
            context: 0x1001,
            size: 4096,
            usage,
            type_name: type_name.into(),
        }
    }

    fn descriptor(name: &str, data: u64) -> Descriptor {
        Descriptor {
            tensor: 0,
            name: name.into(),
            type_id: 0,
            op: 0,
            op_param0: 0,
            flags: 0,
            ne: [1; 4],
            nb: [4; 4],
            data,
            view_src: 0,
            view_offs: 0,
            has_extra: false,
            memory: crate::format::Memory::Anon,
        }
    }

    #[test]
    fn usages_follow_ggml_then_scopes_then_tensors() {
        let mut b = Buffers::default();
        // A repacked weights buffer: created as CPU, renamed at set_usage.
        b.on_record(&record(1, BufferAction::Created, 0xa, 0, "CPU"));
        b.on_record(&record(2, BufferAction::SetUsage, 0xa, 1, "CPU_REPACK"));
        let marker = |cookie| Marker { ts_ns: 3, tid: 7, cookie, args: [0; 3] };
        b.on_marker(&marker(markers::OUTPUT_RESERVE));
        b.on_record(&record(4, BufferAction::Created, 0xb, 0, "CPU"));
        b.on_marker(&marker(markers::OUTPUT_RESERVE_RETURN));
        b.on_record(&record(5, BufferAction::Created, 0xc, 0, "CPU"));
        b.note_read(0x1030);
        b.on_record(&record(6, BufferAction::Freed, 0xa, 1, "CPU_REPACK"));
        b.on_record(&BufferRecord { size: 0, ..record(6, BufferAction::Created, 0xd, 0, "CPU") });
        b.finish(&[descriptor("cache_k_l0 (view)", 0x1020 + 8)]);
        let labels: Vec<_> = b.list.iter().map(Buffer::label).collect();
        // All three share one context in this test: the newest wins.
        assert_eq!(labels, ["repacked weights", "output", "KV cache"]);
        assert_eq!(b.empty, 1);
        assert_eq!(b.list[2].source_reads, 1, "the newest live buffer holding it");
        assert_eq!(b.list[0].freed_ns, Some(6));
        assert_eq!(b.list[0].base, Some(0x1020));
        assert_eq!(b.at(0x1020).map(|b| b.id), Some(2));
        assert_eq!(b.sizes_at(5).len(), 3);
        assert_eq!(b.sizes_at(7).iter().map(|(_, s)| s).sum::<u64>(), 8192);
    }
}
