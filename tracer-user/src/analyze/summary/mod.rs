//! The summary a researcher reads first, as data: what was traced, how it
//! stopped, ubatches per phase, weights touched, the trace's size, and what
//! was lost. Rendered as text (`export::summary`), in `report --json` and in
//! the HTML report's table, all from these fields.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::{Analysis, Phase, WeightUse, correlate::Stage, weights::Weights};

mod recorded;

use crate::{
    format::{
        CopyMatches, Disabled, LateAttach, LayoutCheck, Lost, TargetBuild, Tracepoints, ValueThread, ValuesMissing,
        WriterStats,
    },
    units::human_bytes,
};
pub use recorded::Unread;

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Whose graphs these are: the summary speaks its words.
    pub program: Program,
    pub mode: String,
    pub pid: u32,
    /// The llama.cpp commit the build reports.
    pub commit: Option<String>,
    pub command: Vec<String>,
    /// From the first event to the last.
    pub duration_ns: u64,
    /// From the start of tracing to its end (an attach to an idle server
    /// traces for longer than its events span); the event span where the
    /// trace was cut short.
    pub traced_ns: u64,
    /// `None`: the trace was cut short (no end record).
    pub stopped: Option<Stopped>,
    /// A ring of files (`--max-size`): which were read, and whether the
    /// run's start is missing (every figure then covers the files read).
    pub ring: Option<crate::format::ring::RingRead>,
    pub prompt_ubatches: usize,
    pub prompt_tokens: u64,
    pub generate_ubatches: usize,
    pub warmup_ubatches: usize,
    pub other_graphs: usize,
    /// whisper.cpp's graphs by the step that computed them.
    pub encoder_graphs: usize,
    pub decoder_graphs: usize,
    /// Prompt and generated tokens per sequence, warm-up apart (traces
    /// with the ubatches' sequence ids).
    pub tokens: Option<super::sequences::TokenCounts>,
    pub ops: u64,
    pub ops_outside_graphs: u64,
    pub distinct_weights: usize,
    /// The model files recorded, and their tensors.
    pub model_files: Vec<String>,
    pub model_tensors: usize,
    /// Weight bytes read per generated token, as the report's per-token
    /// table counts them (the embedding lookup reads one row per token).
    pub weight_bytes_per_token: u64,
    pub file_backed_accesses: u64,
    pub copy_accesses: u64,
    pub trace: TraceFile,
    /// Events lost because the ring buffer was full, per kind.
    pub lost: Lost,
    /// Which tracepoint programs recorded faults, page-cache and block events.
    pub tracepoints: Option<Tracepoints>,
    /// Per program, runs the kernel skipped (`recursion_misses`), and their
    /// sum per event kind: events lost beside `lost`.
    pub recursion_misses: BTreeMap<String, u64>,
    pub skipped: Lost,
    /// Model-file reads issued without a recorded completion.
    pub uncompleted_reads: u64,
    /// Kernel records that did not decode (layout mismatch).
    pub decode_errors: u64,
    /// The llama.cpp build traced and the struct layouts read in it.
    pub build: Option<TargetBuild>,
    /// What the live check of those layouts passed on.
    pub layout_check: Option<LayoutCheck>,
    /// Features off for this build (e.g. sequences).
    pub disabled: Vec<Disabled>,
    /// ggml found after the target started (a library it loaded with dlopen).
    pub late_attach: Option<LateAttach>,
    /// `--values`: computed nodes left without an output record.
    pub values_missing: Option<ValuesMissing>,
    /// Weights in memory compared with the model file's tensors.
    pub copies: Option<CopyMatches>,
    /// `--values`: the team's per-thread node and barrier counts.
    pub value_threads: Vec<ValueThread>,
    /// Made at the end of a run from what the recorder knew (these counts),
    /// without reading the trace back: the per-phase, token and weight
    /// figures are then not known ([`Summary::recorded`]).
    #[serde(skip)]
    pub not_read_back: Option<(WriterStats, Unread)>,
}

/// The program traced, as far as the hooks it provided tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Program {
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// libwhisper's encode and decode steps were hooked.
    #[serde(rename = "whisper.cpp")]
    WhisperCpp,
}

impl Program {
    fn of(header: &crate::format::Header) -> Self {
        if header.libraries.iter().any(|l| l.role == "whisper") { Program::WhisperCpp } else { Program::LlamaCpp }
    }

    fn name(self) -> &'static str {
        match self {
            Program::LlamaCpp => "llama.cpp",
            Program::WhisperCpp => "whisper.cpp",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Stopped {
    pub reason: String,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
}

/// The trace file; sizes are known only right after recording it.
#[derive(Clone, Debug, Serialize)]
pub struct TraceFile {
    pub path: String,
    pub bytes: Option<u64>,
    pub bytes_per_op_frame: Option<f64>,
    pub bytes_per_op_with_descriptors: Option<f64>,
}

/// `ggml 0.25.3 (0c1e570), llama.cpp 0c1e570 build 1, known as Apr 2026 - Oct 2026 (...)`;
/// for another program, which llama.cpp's ggml its structs were laid out as.
fn build_row(b: &TargetBuild, commit: Option<&str>, program: Program) -> String {
    let mut parts = Vec::new();
    match (&b.ggml_version, &b.ggml_commit) {
        (Some(v), Some(c)) => parts.push(format!("ggml {v} ({c})")),
        (Some(v), None) => parts.push(format!("ggml {v}")),
        (None, _) => parts.push("no ggml_version()".to_string()),
    }
    match (commit, b.llama_build_number) {
        (Some(c), Some(n)) => parts.push(format!("commit {c} build {n}")),
        (Some(c), None) => parts.push(format!("commit {c}")),
        _ => {}
    }
    match program {
        _ if b.release == TargetBuild::DERIVED => format!("{}; {}", parts.join(", "), b.release_text),
        Program::LlamaCpp => format!("{}; known as {}", parts.join(", "), b.release_text),
        // The tables are named after llama.cpp's releases: their dates only.
        Program::WhisperCpp => {
            let dates = b.release_text.split(" (").next().unwrap_or_default();
            format!("{}; its structs laid out as ggml's of {dates}", parts.join(", "))
        }
    }
}

/// The tables used and what the live check passed.
fn layouts_row(b: &TargetBuild, check: Option<LayoutCheck>, program: Program) -> String {
    let by_name = match program {
        Program::LlamaCpp => "by their GGUF name",
        Program::WhisperCpp => "by the model file's names",
    };
    let tables: Vec<&str> = b.layouts.values().map(String::as_str).collect();
    let checked = match check {
        Some(c) if c.graphs > 0 => {
            format!(
                "checked on the target: {} tensors ({} weights {by_name}), {} graphs, {} ubatches",
                c.tensors, c.weights, c.graphs, c.ubatches
            )
        }
        Some(_) => "not checked: no graph ran".to_string(),
        None => "check not recorded".to_string(),
    };
    let patched = b.patched.as_ref().map(|p| format!("; PATCHED by hand: {p}")).unwrap_or_default();
    format!("{}; {checked}{patched}", tables.join(", "))
}

impl Summary {
    pub fn new(a: &Analysis, path: &str, stats: Option<&WriterStats>) -> Self {
        let h = &a.header;
        let count = |p: Phase| a.ubatches.iter().filter(|u| u.phase == p).count();
        // Ubatches share weight lists (`weights::Interner`): each list is
        // summed once. Per ubatch, the 48 M entries of a 100 M-op trace's
        // 176 k ubatches were a tenth of `report`.
        let mut lists: HashMap<usize, (Weights, [u64; 3])> = HashMap::new();
        let mut sums = |w: &Weights| {
            lists
                .entry(w.list_id())
                .or_insert_with(|| {
                    let sum = |f: fn(&WeightUse) -> u64| w.values().map(f).sum::<u64>();
                    (w.clone(), [sum(|w| w.bytes), sum(|w| u64::from(w.file_backed)), sum(|w| u64::from(w.copy))])
                })
                .1
        };
        let generate = a.ubatches.iter().filter(|u| u.phase == Phase::Generate).count();
        let per_token = if generate == 0 {
            0.0
        } else {
            let bytes: u64 =
                a.ubatches.iter().filter(|u| u.phase == Phase::Generate).map(|u| sums(&u.weights)[0]).sum();
            bytes as f64 / generate as f64
        };
        let (file, copy) = a.ubatches.iter().map(|u| sums(&u.weights)).fold((0, 0), |(f, c), s| (f + s[1], c + s[2]));
        let distinct: BTreeSet<(u32, u32)> = lists.values().flat_map(|(w, _)| w.keys().copied()).collect();
        let stage = |s: Stage| a.ubatches.iter().filter(|u| u.stage == Some(s)).count();
        Summary {
            duration_ns: a.duration_ns(),
            traced_ns: a
                .trailer
                .as_ref()
                .map_or(a.duration_ns(), |t| t.end_monotonic_ns.saturating_sub(h.start_monotonic_ns)),
            prompt_ubatches: count(Phase::Prompt),
            prompt_tokens: a.tokens.as_ref().map_or(a.prompt_tokens, |t| t.prompt),
            generate_ubatches: count(Phase::Generate),
            warmup_ubatches: count(Phase::Warmup),
            other_graphs: count(Phase::Aux),
            encoder_graphs: stage(Stage::Encoder),
            decoder_graphs: stage(Stage::Decoder),
            tokens: a.tokens.clone(),
            ops_outside_graphs: a.ops_outside_ubatches,
            distinct_weights: distinct.len(),
            model_files: a.models.iter().flat_map(|m| m.files.iter().cloned()).collect(),
            model_tensors: a.models.iter().map(|m| m.tensors.len()).sum(),
            weight_bytes_per_token: per_token as u64,
            file_backed_accesses: file,
            copy_accesses: copy,
            uncompleted_reads: a.io.disk.uncompleted,
            ..Self::of_record(h, a.trailer.as_ref(), a.lost, path, stats, Some(a.ops))
        }
    }

    /// whisper.cpp reads its model into memory: its weights are copies,
    /// matched to the file's tensors by their bytes (`live::copies`).
    fn whisper_weights(&self) -> String {
        let files = self.model_files.join(", ");
        match (self.distinct_weights, self.model_files.is_empty()) {
            // Rather than "0 tensors", which reads as "none touched".
            (0, true) => "not resolved: the model file whisper.cpp read was not seen (ttrace learns it when \
                          whisper.cpp loads it, before an `attach` to a running program)"
                .to_string(),
            (0, false) => format!(
                "not resolved: no weight in a WEIGHTS buffer made while traced holds the bytes of a tensor of {files}"
            ),
            (n, false) => format!(
                "{n} of the {} tensors of {files} touched: read into memory, matched to the file by their bytes{}",
                self.model_tensors,
                self.copies.map(unnamed_copies).unwrap_or_default()
            ),
            (n, true) => format!("{n} tensors touched"),
        }
    }

    pub fn title(&self) -> String {
        format!(
            "ttrace: {} of pid {} ({}), {:.3} s",
            self.mode,
            self.pid,
            self.command.join(" "),
            self.traced_ns as f64 / 1e9
        )
    }

    /// The rows only a read of the whole trace gives: graphs per phase,
    /// tokens and ops.
    fn graph_and_token_rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = Vec::new();
        rows.push(match self.program {
            Program::LlamaCpp => (
                "ubatches",
                format!(
                    "{} prompt ({} tokens), {} generate (each request samples one token more than it decodes), \
                     {} warm-up, {} other graphs",
                    self.prompt_ubatches,
                    self.prompt_tokens,
                    self.generate_ubatches,
                    self.warmup_ubatches,
                    self.other_graphs
                ),
            ),
            Program::WhisperCpp => (
                "graphs",
                format!(
                    "{} encoder (its encode step's conv, encoder and cross-attention graphs), {} decoder, {} other",
                    self.encoder_graphs,
                    self.decoder_graphs,
                    (self.prompt_ubatches + self.generate_ubatches + self.warmup_ubatches + self.other_graphs)
                        .saturating_sub(self.encoder_graphs + self.decoder_graphs)
                ),
            ),
        });
        if let Some(t) = &self.tokens {
            let mut apart = Vec::new();
            if t.warmup_tokens > 0 {
                apart.push(format!("{} warm-up tokens", t.warmup_tokens));
            }
            if t.prompt_only_requests > 0 {
                apart
                    .push(format!("{} prompt-only requests ({} tokens)", t.prompt_only_requests, t.prompt_only_tokens));
            }
            let warmup = if apart.is_empty() { String::new() } else { format!(" ({} apart)", apart.join(", ")) };
            rows.push((
                "tokens",
                format!(
                    "{} prompt, {} generated, {} sequences, {} requests{warmup}",
                    t.prompt, t.generated, t.sequences, t.requests
                ),
            ));
        }
        rows.push(("ops", format!("{} recorded ({} outside any graph)", self.ops, self.ops_outside_graphs)));
        rows
    }

    /// `(key, value)` rows: the text summary's lines and the HTML table's.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = Vec::new();
        rows.push((
            "stopped",
            match &self.stopped {
                Some(s) => {
                    let exit = match (s.exit_code, s.exit_signal) {
                        (Some(code), _) => format!(", exit status {code}"),
                        (None, Some(sig)) => format!(", killed by signal {sig}"),
                        _ => String::new(),
                    };
                    format!("{}{exit}", s.reason)
                }
                None => "trace cut short (no end record): read up to its last complete record".to_string(),
            },
        ));
        if let Some(ring) = &self.ring {
            rows.push(("files", ring.to_string()));
        }
        match &self.not_read_back {
            None => rows.extend(self.graph_and_token_rows()),
            Some((stats, unread)) => rows.push(("ops", recorded::ops_row(stats, *unread, &self.trace.path))),
        }
        if let Some(build) = &self.build {
            rows.push((self.program.name(), build_row(build, self.commit.as_deref(), self.program)));
            rows.push(("layouts", layouts_row(build, self.layout_check, self.program)));
        }
        for d in &self.disabled {
            rows.push(("WARNING", d.to_string()));
        }
        if let Some(late) = &self.late_attach {
            rows.push((if late.held { "ggml loaded" } else { "LATE START" }, late.to_string()));
        }
        if let Some(m) = self.values_missing {
            if m.filtered > 0 {
                rows.push((
                    "values filter",
                    format!(
                        "{} node outputs left out by --values-filter, {} of them not copied by the kernel",
                        m.filtered, m.filtered_uncopied
                    ),
                ));
            }
            rows.push(if m.nodes == 0 {
                ("values", format!("every computed node of {} graph runs read", m.runs_checked))
            } else {
                (
                    "VALUES MISSING",
                    format!(
                        "{} computed nodes in {} of {} graph runs have no output record: no barrier after them was \
                         read ({}){}",
                        m.nodes,
                        m.runs,
                        m.runs_checked,
                        unread_reasons(m),
                        team_counts(&self.value_threads)
                    ),
                )
            });
        }
        let accesses = self.file_backed_accesses + self.copy_accesses;
        let share = |n: u64| if accesses == 0 { 0.0 } else { 100.0 * n as f64 / accesses as f64 };
        // whisper.cpp generates tokens too, but its decoder reads no KV cache
        // of llama's kind, and tokens are not counted for it yet.
        let per_token = match self.program {
            Program::LlamaCpp => format!("{} per generated token; ", human_bytes(self.weight_bytes_per_token)),
            Program::WhisperCpp => String::new(),
        };
        rows.extend(self.not_read_back.is_none().then(|| {
            (
                "weights",
                if self.program == Program::WhisperCpp {
                    self.whisper_weights()
                } else {
                    format!(
                        "{} distinct tensors touched; {per_token}accesses {:.1}% file-backed, {:.1}% copies",
                        self.distinct_weights,
                        share(self.file_backed_accesses),
                        share(self.copy_accesses)
                    )
                },
            )
        }));
        let t = &self.trace;
        rows.push((
            "trace",
            match (t.bytes, t.bytes_per_op_frame, t.bytes_per_op_with_descriptors) {
                (Some(bytes), Some(frame), Some(with_descriptors)) => format!(
                    "{}: {}, {frame:.1} bytes per op frame ({with_descriptors:.1} with tensor descriptors)",
                    t.path,
                    human_bytes(bytes)
                ),
                _ => t.path.clone(),
            },
        ));
        let lost = self.lost;
        if lost.total() == 0 {
            rows.push(("lost events", "none".to_string()));
        } else {
            rows.push((
                "LOST EVENTS",
                format!(
                    "op {}, call {}, page_fault {}, page_cache {}, block {}: the ring buffer overflowed; raise --ring-mb",
                    lost.op, lost.call, lost.page_fault, lost.page_cache, lost.block
                ),
            ));
        }
        if let Some(tracepoints) = self.tracepoints {
            rows.push(("tracepoints", tracepoints.to_string()));
        }
        if !self.recursion_misses.is_empty() {
            let skipped = self.skipped;
            rows.push(if skipped.total() == 0 {
                ("recursion misses", format!("none in {} programs", self.recursion_misses.len()))
            } else {
                let missed: Vec<String> =
                    self.recursion_misses.iter().filter(|(_, n)| **n > 0).map(|(p, n)| format!("{p} {n}")).collect();
                (
                    "SKIPPED EVENTS",
                    format!(
                        "{}: the kernel skipped these programs while one was already running on the CPU \
                         (nested in it or, from Linux 7.0, whose tracepoint programs are preemptible, in a task that \
                         preempted it) (op {}, call {}, page_fault {}, page_cache {}, block {})",
                        missed.join(", "),
                        skipped.op,
                        skipped.call,
                        skipped.page_fault,
                        skipped.page_cache,
                        skipped.block
                    ),
                )
            });
        }
        if self.uncompleted_reads > 0 {
            let why = match self.tracepoints {
                Some(Tracepoints::Perf) => {
                    "the kernel skips a perf-event tracepoint program while another BPF program runs on that CPU \
                     (use --tracepoints btf where the kernel has BTF), or the read was still in flight when \
                     tracing stopped"
                }
                _ if self.skipped.block > 0 => {
                    "the kernel skipped ttrace's completion program (see the skipped events above), or the read \
                     was still in flight when tracing stopped"
                }
                _ => {
                    "the read was still in flight when tracing stopped, or the kernel ran no BPF program for its \
                     completion (some VMs hide their own agent process from BPF, and completions that interrupt \
                     it with it)"
                }
            };
            rows.push((
                "WARNING",
                format!(
                    "{} model-file reads issued without a completion recorded: {why}; their latencies and disk \
                     slices are missing",
                    self.uncompleted_reads
                ),
            ));
        }
        if self.decode_errors > 0 {
            rows.push(("WARNING", format!("{} kernel records did not decode (layout mismatch)", self.decode_errors)));
        }
        rows
    }
}

/// Why the kernel read no barrier, where it knew.
fn unread_reasons(m: ValuesMissing) -> String {
    let known = [
        (m.unread_params, "nodes whose thread's place in the team could not be read"),
        (m.unread_site, "barriers whose return address could not be read"),
        (m.unread_runs, "runs whose state could not be made"),
        (m.unread_busy, "reads skipped while their CPU was mid-way through another (a preempted probe)"),
    ];
    let said: Vec<String> = known.iter().filter(|(n, _)| *n > 0).map(|(n, why)| format!("{n} {why}")).collect();
    if said.is_empty() { "attached mid-run, or an arrival the probes did not see".to_string() } else { said.join("; ") }
}

/// The threads' node and barrier counts, when they differ (a probe run
/// missed in one of them).
fn team_counts(threads: &[ValueThread]) -> String {
    let counts = |t: &&ValueThread| (t.nodes, t.barriers);
    if threads.iter().map(|t| counts(&t)).collect::<BTreeSet<_>>().len() <= 1 {
        return String::new();
    }
    let each: Vec<String> =
        threads.iter().map(|t| format!("tid {} {} nodes, {} barriers", t.tid, t.nodes, t.barriers)).collect();
    format!("; the team's counts differ: {}", each.join("; "))
}

/// The copies left unnamed, and why; nothing when every one was named.
fn unnamed_copies(c: CopyMatches) -> String {
    let mut why = Vec::new();
    if c.ambiguous > 0 {
        why.push(format!("{} hold the bytes of several file tensors", c.ambiguous));
    }
    if c.unmatched > 0 {
        why.push(format!("{} hold none's (changed after loading, or evicted)", c.unmatched));
    }
    if why.is_empty() { String::new() } else { format!("; left unnamed: {}", why.join(", ")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analyze::Ubatch, format::frames::Library};

    /// A trace whose hooks came from `role`'s library, with graphs of these stages.
    fn analysis(role: &str, stages: &[Option<Stage>]) -> Analysis {
        let mut a = Analysis::default();
        a.header.libraries.push(Library { path: "/lib/x.so".into(), role: role.into(), build_id: None });
        a.ubatches = stages
            .iter()
            .enumerate()
            .map(|(i, &stage)| Ubatch { stage, ..Ubatch::started(i as u32, 0, None) })
            .collect();
        a
    }

    #[test]
    fn whisper_graphs_are_counted_by_stage_in_its_words() {
        let (e, d) = (Some(Stage::Encoder), Some(Stage::Decoder));
        let s = Summary::new(&analysis("whisper", &[e, e, e, d, d, None]), "t.data", None);
        assert_eq!((s.program, s.encoder_graphs, s.decoder_graphs), (Program::WhisperCpp, 3, 2));
        let rows: BTreeMap<_, _> = s.rows().into_iter().collect();
        assert!(
            rows["graphs"].starts_with("3 encoder ") && rows["graphs"].ends_with(", 2 decoder, 1 other"),
            "{rows:?}"
        );
        assert!(
            !rows.contains_key("ubatches") && rows["weights"].starts_with("not resolved: the model file"),
            "{rows:?}"
        );
        let llama = Summary::new(&analysis("base", &[None]), "t.data", None);
        assert_eq!(llama.program, Program::LlamaCpp);
        assert!(llama.rows().iter().any(|(k, _)| *k == "ubatches"));
    }

    #[test]
    fn weight_figures_count_each_ubatch_whether_its_list_is_shared_or_not() {
        let list = |tensors: &[(u32, u64)]| {
            let mut w = Weights::default();
            for &(t, bytes) in tensors {
                w.make_mut().insert((0, t), WeightUse { file_backed: 2, copy: 1, bytes, ..Default::default() });
            }
            w
        };
        let figures = |shared: bool| {
            let mut a = analysis("base", &[None; 4]);
            let common = list(&[(1, 10), (2, 20)]);
            for (i, u) in a.ubatches.iter_mut().enumerate() {
                u.phase = if i == 0 { Phase::Prompt } else { Phase::Generate };
                u.weights = match (i, shared) {
                    (0, _) => list(&[(3, 5)]),
                    (_, true) => common.clone(),
                    (_, false) => list(&[(1, 10), (2, 20)]),
                };
            }
            let s = Summary::new(&a, "t.data", None);
            (s.distinct_weights, s.weight_bytes_per_token, s.file_backed_accesses, s.copy_accesses)
        };
        assert_eq!(figures(true), (3, 30, 14, 7));
        assert_eq!(figures(false), figures(true));
    }
}
