//! The trace file (`ttrace.data`), format version 2.
//!
//! ```text
//! magic  "TTRACE\0\x01"
//! u32le  header length, then the header as JSON (run metadata)
//! frames [kind: u8][payload length: varint][payload] ...
//! ```
//! Frames are self-delimiting, so a file cut short (tracer SIGKILLed) reads
//! up to its last complete frame. Strings, threads and tensor descriptors are
//! interned: a frame defines each once and later frames refer to it by index
//! (the definition order is the index). Timestamps are varint deltas from the
//! previous timed frame, starting at `Header::start_monotonic_ns`.
//! `--max-size` writes a run as a ring of such files: see [`super::ring`].

use std::collections::BTreeMap;

pub use super::values::{ValueThread, ValuesMissing};

use num_enum::TryFromPrimitive;
use serde::{Deserialize, Serialize};
use tracer_common::EventKind;

pub const MAGIC: &[u8; 8] = b"TTRACE\0\x01";
/// 2: GRAPH and COMPUTE frames (graph capture). Version 1 traces are read too.
pub const FORMAT_VERSION: u32 = 2;

/// Frame kinds: the first byte of every frame. Readers skip kinds they do
/// not know, so newer writers may add frames.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive)]
pub enum FrameKind {
    /// Defines the next string index: utf-8 bytes.
    String = 1,
    /// Defines the next thread index: tid.
    Thread = 2,
    /// Defines the next tensor descriptor index.
    Tensor = 3,
    /// An executed ggml node.
    Op = 4,
    /// A boundary marker (cookie from `tracer_common::markers`).
    Marker = 5,
    Fault = 6,
    /// JSON [`super::ModelTable`]: a model file the target mapped.
    Model = 7,
    /// Lost-event counters so far, per kind.
    Lost = 8,
    /// JSON [`super::Trailer`]: the trace ended cleanly.
    End = 9,
    /// A page-cache event on a model file.
    PageCache = 10,
    /// A block request (issue or complete) overlapping a model file.
    Block = 11,
    /// JSON [`super::Hooks`]: libraries probed after the header was written
    /// (dlopen), with their op-name tables; readers merge it into the header.
    Hooks = 12,
    /// The target's /proc/PID/maps (utf-8), written when first read after
    /// the header (`run`: after exec) and when a model file first shows up
    /// mapped; readers put the last one in the header's `maps`.
    Maps = 13,
    /// A CPU graph as read at `ggml_graph_compute`: its id (in definition
    /// order), then per node its descriptor and `(slot, descriptor)` sources.
    Graph = 14,
    /// A run of a defined graph: time, thread, graph id and the contents of
    /// its integer inputs. Readers expand it into the graph's executed ops.
    Compute = 15,
    /// One token's expert ranking from an `ffn_moe_argsort-L` node: time,
    /// thread, the node's tensor address, its row (the token in the ubatch)
    /// and the expert ids, best first.
    Routing = 16,
    /// One array of a `llama_decode` batch: time, thread, which array
    /// (`tracer_common::batch`), the batch's token count, then the values
    /// (at most `MAX_BATCH_TOKENS`).
    Batch = 17,
    /// A node output's fingerprint (`--values`, [`super::values`]).
    Value = 18,
    /// A backend buffer event (`format::buffers`): time, thread, action,
    /// buffer address, buft, context, size, usage and its type's name.
    Buffer = 19,
}

/// Late-found hooks (see `FrameKind::Hooks`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Hooks {
    pub libraries: Vec<Library>,
    pub op_names: Vec<String>,
    pub unary_op_names: Vec<String>,
    pub glu_op_names: Vec<String>,
    /// The build those libraries belong to (absent in older traces).
    #[serde(default)]
    pub build: Option<TargetBuild>,
}

/// The llama.cpp build traced, as it describes itself, and the struct
/// layouts ttrace read it with (`tracer_common::layout::known`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TargetBuild {
    /// `ggml_version()` and `ggml_commit()`, where the build has them.
    pub ggml_version: Option<String>,
    pub ggml_commit: Option<String>,
    /// `LLAMA_COMMIT` and `LLAMA_BUILD_NUMBER` of its build info (the
    /// commit is also `Header::llama_commit`).
    #[serde(default)]
    pub llama_commit: Option<String>,
    pub llama_build_number: Option<i64>,
    /// The known release range it was recognised as (`known::Release::name`),
    /// and that range in words.
    pub release: String,
    pub release_text: String,
    /// Per struct, the layout table used (`ggml_tensor` → `ggml_tensor/2024-12`).
    /// A struct left out was not read (its feature is off).
    pub layouts: BTreeMap<String, String>,
    /// Every offset the probes used, `struct.field` → bytes.
    pub offsets: BTreeMap<String, u32>,
    /// Offsets changed by hand through `TTRACE_LAYOUT_PATCH` (tests, and
    /// trying a new version's offsets), as given.
    #[serde(default)]
    pub patched: Option<String>,
}

impl TargetBuild {
    /// `release` of a build whose layouts were read from its code.
    pub const DERIVED: &'static str = "derived";
}

/// What the live check of the layouts saw pass: every graph, tensor and
/// ubatch counted here met the invariants (a failure ends the trace
/// before anything is kept).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayoutCheck {
    pub graphs: u64,
    pub tensors: u64,
    /// Of the tensors, weights whose name was the model file's for their data.
    #[serde(default)]
    pub weights: u64,
    pub ubatches: u64,
}

/// A feature turned off because the struct it reads is unknown (or did
/// not check out) in the traced build; the rest of the trace is unaffected.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Disabled {
    /// `sequences`.
    pub feature: String,
    /// `llama_ubatch`.
    pub structure: String,
    pub reason: String,
}

impl std::fmt::Display for Disabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} off ({}): {}", self.feature, self.structure, self.reason)
    }
}

/// Run metadata, written before any event.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub format_version: u32,
    pub ttrace_version: String,
    pub mode: Mode,
    /// The traced command line (for `attach`, from /proc/PID/cmdline).
    pub command: Vec<String>,
    pub pid: u32,
    pub start_unix_ns: u64,
    /// CLOCK_MONOTONIC at start: event timestamps are on this clock.
    pub start_monotonic_ns: u64,
    pub kernel: String,
    pub cpus: usize,
    pub libraries: Vec<Library>,
    /// llama.cpp commit, when the target reports one.
    pub llama_commit: Option<String>,
    /// The build's version and the struct layouts used; `None` in traces
    /// from before ttrace recorded them, and until ggml is found (then a
    /// HOOKS frame brings it).
    #[serde(default)]
    pub build: Option<TargetBuild>,
    /// The target's own op-name tables, indexed by enum value.
    pub op_names: Vec<String>,
    pub unary_op_names: Vec<String>,
    pub glu_op_names: Vec<String>,
    pub options: Options,
    /// The target's /proc/PID/maps: as written, when tracing started
    /// (`attach`; empty for `run`, whose child had not exec'd yet); as read,
    /// the last MAPS frame's (see `FrameKind::Maps`).
    pub maps: String,
    /// One file of a ring (`--max-size`); `None` for a run in one file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<super::ring::RingPart>,
    /// As read: which files of the ring were read (set by the reader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_read: Option<super::ring::RingRead>,
}

impl Header {
    /// The target's enum value of the op named `name`, from its own table.
    pub fn op_id(&self, name: &str) -> Option<i32> {
        self.op_names.iter().position(|n| n == name).and_then(|i| i32::try_from(i).ok())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Library {
    pub path: String,
    /// Which hooks it provides: `cpu`, `base`, `llama`.
    pub role: String,
    pub build_id: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Options {
    pub all_threads: bool,
    /// Per-node probes timed every op; otherwise graphs were read whole at
    /// `ggml_graph_compute` and ops are timed only as part of their graph.
    #[serde(default)]
    pub op_timing: bool,
    pub ring_bytes: u32,
    /// Page faults, page-cache fills and block requests recorded.
    #[serde(default)]
    pub io: bool,
    /// The page cache was dropped before the run (cold cache).
    #[serde(default)]
    pub drop_caches: bool,
    /// Memory limit of the target's cgroup, bytes, and the cgroup version.
    #[serde(default)]
    pub mem_limit: Option<u64>,
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Node output fingerprints recorded (`--values`).
    #[serde(default)]
    pub values: bool,
}

/// Where a tensor's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum Memory {
    /// Inside the mapping of model `model` (index of MODEL frames), tensor
    /// `tensor` of its table, `offset` bytes into that tensor.
    ModelFile { model: u32, tensor: u32, offset: u64 },
    /// A copy of model tensor `tensor` in heap memory (repacked weights,
    /// non-mmap loads), matched by name.
    Copy { model: u32, tensor: u32 },
    /// Anonymous memory: KV cache, compute buffers.
    Anon,
    /// Another file's mapping.
    OtherFile,
    /// No mapping (or the pointer is null).
    Unmapped,
}

/// A tensor as a probe saw it. Identical sightings share one descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Descriptor {
    /// Address of the `ggml_tensor` struct.
    pub tensor: u64,
    pub name: String,
    pub type_id: i32,
    pub op: i32,
    pub op_param0: i32,
    pub flags: i32,
    pub ne: [i64; 4],
    pub nb: [u64; 4],
    pub data: u64,
    pub view_src: u64,
    pub view_offs: u64,
    pub has_extra: bool,
    pub memory: Memory,
}

/// One tensor of a model file, as recorded in a MODEL frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelTensor {
    pub name: String,
    /// Index into `ModelTable::files`.
    pub file: u32,
    pub file_offset: u64,
    pub size_bytes: u64,
    pub type_name: String,
    pub shape: Vec<u64>,
    pub layer: Option<u32>,
    pub component: String,
    /// Bytes per expert for MoE expert tensors.
    pub expert_bytes: Option<u64>,
}

/// Where a model file lives on disk, for turning block sectors into file
/// offsets and page-cache events into files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Superblock dev_t in kernel encoding (`major << 20 | minor`), as
    /// page-cache tracepoints report it.
    pub dev: u32,
    pub ino: u64,
    pub size: u64,
    /// The whole disk holding it, kernel encoding, as block tracepoints report it.
    pub disk_dev: Option<u32>,
    pub disk_name: Option<String>,
    /// Sector of the partition's start on the whole disk.
    pub partition_start_sector: u64,
    /// FIEMAP extents; empty when the filesystem has none (tmpfs).
    pub extents: Vec<FileExtent>,
    /// The readahead of the file's backing device (its bdi's
    /// `read_ahead_kb`) when traced: the size of the kernel's mmap
    /// read-around, which `simulate` replays. `None` in older traces.
    #[serde(default)]
    pub read_ahead_kb: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset in the partition.
    pub physical: u64,
    pub length: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelTable {
    /// The model's files (one, or every shard of a split model).
    pub files: Vec<String>,
    /// Per file, same order as `files`.
    #[serde(default)]
    pub file_info: Vec<FileInfo>,
    pub architecture: Option<String>,
    pub tensors: Vec<ModelTensor>,
}

/// Events the kernel side dropped because the ring buffer was full, per
/// [`EventKind`] (named fields, so the trace's JSON reads `{"op": 3, ...}`).
/// Graph-capture records (graph, node, input, routing) count as lost ops:
/// each one lost loses executed ops or what they read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    pub call: u64,
    pub page_fault: u64,
    pub op: u64,
    pub page_cache: u64,
    pub block: u64,
    /// `--values` heads and chunks (a node whose bytes did not all arrive).
    #[serde(default)]
    pub value: u64,
}

impl Lost {
    /// The kinds with a count of their own, in LOST-frame order.
    pub const COUNTED: [EventKind; 5] =
        [EventKind::Call, EventKind::PageFault, EventKind::Op, EventKind::PageCache, EventKind::Block];

    pub fn total(&self) -> u64 {
        self.call + self.page_fault + self.op + self.page_cache + self.block + self.value
    }

    /// Each count less `base`'s, floored at 0.
    pub fn saturating_sub(&self, base: &Lost) -> Lost {
        let mut out = *self;
        for kind in Self::COUNTED {
            out[kind] = self[kind].saturating_sub(base[kind]);
        }
        out.value = self.value.saturating_sub(base.value);
        out
    }
}

impl std::ops::Index<EventKind> for Lost {
    type Output = u64;

    fn index(&self, kind: EventKind) -> &u64 {
        match kind {
            EventKind::Call | EventKind::Batch | EventKind::Buffer => &self.call,
            EventKind::PageFault => &self.page_fault,
            EventKind::Op | EventKind::Graph | EventKind::Node | EventKind::Input | EventKind::Routing => &self.op,
            EventKind::PageCache => &self.page_cache,
            EventKind::Block => &self.block,
            EventKind::Value => &self.value,
        }
    }
}

impl std::ops::IndexMut<EventKind> for Lost {
    fn index_mut(&mut self, kind: EventKind) -> &mut u64 {
        match kind {
            EventKind::Call | EventKind::Batch | EventKind::Buffer => &mut self.call,
            EventKind::PageFault => &mut self.page_fault,
            EventKind::Op | EventKind::Graph | EventKind::Node | EventKind::Input | EventKind::Routing => &mut self.op,
            EventKind::PageCache => &mut self.page_cache,
            EventKind::Block => &mut self.block,
            EventKind::Value => &mut self.value,
        }
    }
}

/// A byte of a model file: model index, file index in it, offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FilePos {
    pub model: u32,
    pub file: u32,
    pub offset: u64,
}

/// How the target was traced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Started by ttrace, held before exec (`ttrace run`).
    #[default]
    Run,
    /// Already running (`ttrace attach`).
    Attach,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Run => "run",
            Mode::Attach => "attach",
        })
    }
}

/// Why tracing stopped. Serialised as the sentence the summary shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    #[default]
    #[serde(rename = "target exited")]
    TargetExited,
    /// Ctrl-C or SIGTERM; a `run` target was stopped by it and exited.
    #[serde(rename = "interrupted")]
    Interrupted,
    #[serde(rename = "interrupted (target killed after 10 s)")]
    TargetKilledAfterGrace,
    #[serde(rename = "interrupted twice (target killed)")]
    InterruptedTwice,
    /// `attach` only: ttrace let go, the target goes on.
    #[serde(rename = "interrupted (detached; the target keeps running)")]
    Detached,
    #[serde(rename = "duration elapsed")]
    DurationElapsed,
    /// A ring's file reached `--max-size`: the run goes on in the next one.
    #[serde(rename = "continued in the next file of the ring")]
    NextFile,
    /// A reason this ttrace does not know (a newer writer's).
    #[serde(other, rename = "unknown")]
    Unknown,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The serde names are the sentences.
        let text = serde_json::to_value(self).ok();
        f.write_str(text.as_ref().and_then(|v| v.as_str()).unwrap_or("unknown"))
    }
}

/// Which tracepoint programs carried the page-fault, page-cache and block
/// events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tracepoints {
    /// BTF tracepoints (`tp_btf`), reading kernel structs at offsets from
    /// the kernel's BTF. The kernel skips one only when that same program
    /// already runs on the CPU.
    Btf,
    /// Perf-event tracepoints, reading the formatted record. The kernel
    /// skips one whenever any other BPF program runs on the CPU (a uprobe
    /// interrupted by a block completion, say).
    Perf,
}

impl std::fmt::Display for Tracepoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tracepoints::Btf => "BTF (tp_btf)",
            Tracepoints::Perf => "perf-event (fallback: no BTF)",
        })
    }
}

/// A memory cgroup's charges, from its memory.stat: v1 `rss` and `cache`,
/// v2 `anon` and `file`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    pub anon_bytes: u64,
    pub file_bytes: u64,
}

/// Written last; its absence means the trace was cut short.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trailer {
    pub stop_reason: StopReason,
    /// The target's exit code (`run` only), or the signal that ended it.
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub end_monotonic_ns: u64,
    /// Records the kernel sent that did not decode (layout mismatch).
    pub decode_errors: u64,
    /// `None` in traces without I/O events, and in traces older than this field.
    #[serde(default)]
    pub tracepoints: Option<Tracepoints>,
    /// Per loaded program, the events the kernel skipped running it for
    /// (`bpf_prog_info.recursion_misses`), and their sum per kind: lost
    /// events beside the ring buffer's [`Lost`].
    #[serde(default)]
    pub recursion_misses: BTreeMap<String, u64>,
    #[serde(default)]
    pub skipped: Lost,
    /// The live check of the struct layouts; `None` when no ggml probe
    /// ran (and in older traces).
    #[serde(default)]
    pub layout_check: Option<LayoutCheck>,
    /// Features turned off for this build.
    #[serde(default)]
    pub disabled: Vec<Disabled>,
    /// The target's highest resident anonymous memory seen (`RssAnon`,
    /// sampled every 100 ms); `None` in older traces.
    #[serde(default)]
    pub peak_anon_bytes: Option<u64>,
    /// Under `--mem-limit`, the most anonymous memory and page cache the
    /// cgroup held (its memory.stat, read every tick); `None` without a
    /// limit and in older traces.
    #[serde(default)]
    pub cgroup_peak: Option<CgroupMemory>,
    /// The kernel's fault-around size (`fault_around_bytes` in debugfs, or
    /// its 64 KiB default when debugfs is not mounted); `None` in older traces.
    #[serde(default)]
    pub fault_around_bytes: Option<u64>,
    /// ggml found only after the target had started (a library it loaded
    /// with `dlopen`); `None` when its probes were in before it ran, and in
    /// older traces.
    #[serde(default)]
    pub late_attach: Option<LateAttach>,
    /// `--values`: computed nodes that no barrier read; `None` without
    /// `--values` and in older traces.
    #[serde(default)]
    pub values_missing: Option<ValuesMissing>,
    /// Weights read into memory (whisper.cpp), matched to the file's
    /// tensors by their bytes; `None` when none was compared.
    #[serde(default)]
    pub copies: Option<CopyMatches>,
    /// `--values`: per thread of the team, the nodes it started and the
    /// barriers it entered (equal in every member when no probe run was
    /// missed); empty without `--values` and in older traces.
    #[serde(default)]
    pub value_threads: Vec<ValueThread>,
}

/// Tensors of WEIGHTS buffers compared with the model file's: named (one
/// file tensor's bytes), left unnamed because several file tensors hold
/// the same bytes, or because none does (changed since loading, evicted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyMatches {
    pub matched: u64,
    pub ambiguous: u64,
    pub unmatched: u64,
}

/// How ggml's probes reached a library the target loaded while traced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LateAttach {
    /// The ggml CPU library found.
    pub library: String,
    /// The kernel held the target at each library load until the probes
    /// were in: nothing ran unprobed. Otherwise the maps were scanned on a
    /// timer, and graphs computed before the scan are missing.
    pub held: bool,
}

impl std::fmt::Display for LateAttach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.held {
            write!(
                f,
                "{} was loaded after the target started (dlopen, or a program run by ld.so); the target was held at \
                 the load until its probes were in",
                self.library
            )
        } else {
            write!(
                f,
                "{} was found in the target's maps after it was loaded, by a scan on a timer: graphs computed \
                 before the scan are not in the trace",
                self.library
            )
        }
    }
}
