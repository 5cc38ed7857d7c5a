//! The probe plan: which function gets which program, and the bookkeeping
//! of what is attached where. The libraries each symbol is looked for in are
//! `target::hooks`'s (a test keeps the two in step).

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Result;
use tracer_common::{buffer_action, hooks, markers, programs};

use crate::{
    format::frames::Library,
    live::{
        load::Tracer,
        target::{self, HookLibs, Reads},
    },
};

/// Hook symbol → program and cookie. Boundary markers come first, so a
/// process attached while running never has op probes without them. The
/// graph-compute hook gets both an entry and a return probe: its return
/// closes the ubatch.
pub(super) const HOOKS: [(&str, &str, u64); 23] = [
    // Backend buffers (a handful per run): before anything allocates one.
    (target::BUFFER_INIT, programs::BUFFER_CREATED, 0),
    (target::SET_USAGE, programs::BUFFER_CHANGED, buffer_action::SET_USAGE as u64),
    (target::BUFFER_FREE, programs::BUFFER_CHANGED, buffer_action::FREED as u64),
    (target::OUTPUT_RESERVE, programs::CALL_ARGS, markers::OUTPUT_RESERVE),
    (target::OUTPUT_RESERVE, programs::CALL_RETURN, markers::OUTPUT_RESERVE_RETURN),
    ("ggml_graph_compute", programs::GRAPH_COMPUTE, 0),
    ("ggml_graph_compute", programs::CALL_RETURN, markers::GRAPH_COMPUTE_RETURN),
    // MoE routing: a trap per MoE layer and thread, in both modes.
    ("ggml_compute_forward_argsort", programs::ARGSORT_ENTRY, 0),
    ("ggml_compute_forward_argsort", programs::ARGSORT_RETURN, 0),
    // Only where argsort has no symbol (`routing_hook`).
    (MUL_MAT_ID, programs::MUL_MAT_ID_ENTRY, 0),
    ("llama_perf_context_reset", programs::CALL_ARGS, markers::LLAMA_PERF_RESET),
    (target::SEQ_RM_CHECK, programs::CALL_ARGS, markers::SEQ_RM_CHECK),
    (target::SEQ_RM_CHECK, programs::CALL_RETURN, markers::SEQ_RM_CHECK_RETURN),
    ("llama_decode", programs::CALL_ARGS, markers::LLAMA_DECODE),
    // Each ubatch: its tokens' sequence ids, positions and output flags.
    (target::PROCESS_UBATCH, programs::UBATCH, 0),
    ("llama_process", programs::CALL_ARGS, markers::LLAMA_PROCESS),
    // whisper.cpp: whose graphs follow, the encoder's or the decoder's.
    (target::WHISPER_ENCODE, programs::CALL_ARGS, markers::WHISPER_ENCODE),
    (target::WHISPER_DECODE, programs::CALL_ARGS, markers::WHISPER_DECODE),
    // whisper.cpp: the model file it reads, for matching its weights.
    (target::WHISPER_INIT, programs::CALL_ARGS, markers::WHISPER_INIT),
    ("ggml_backend_sched_graph_compute_async", programs::CALL_ARGS, markers::SCHED_GRAPH_COMPUTE),
    ("ggml_backend_sched_graph_compute_async", programs::CALL_RETURN, markers::SCHED_GRAPH_COMPUTE_RETURN),
    ("ggml_cpu_extra_compute_forward", programs::GGML_OP, hooks::EXTRA as u64),
    // Records both fused nodes, in order (two probes on one address would
    // run in reverse attach order: MUL before RMS_NORM).
    ("ggml_compute_forward_rms_norm_mul_fused", programs::GGML_OP, hooks::FUSED_RMS_NORM as u64),
];

/// Every uprobe program a session can attach, in any mode (`ttrace check`
/// loads them all: a test holds it to this list).
#[cfg(test)]
pub(crate) fn uprobe_programs() -> Vec<&'static str> {
    HOOKS.iter().map(|h| h.1).chain(super::values::PROBES.iter().map(|p| p.1)).collect()
}

/// Every (program, cookie) a session attaches, the self-test's too.
#[cfg(test)]
pub(crate) fn hooks_with_cookies() -> Vec<(&'static str, u64)> {
    let values = super::values::PROBES.iter().map(|p| (p.1, u64::from(p.2)));
    HOOKS.iter().map(|h| (h.1, h.2)).chain(values).chain([(programs::CALL_ARGS, markers::SELFTEST)]).collect()
}

const ARGSORT: &str = "ggml_compute_forward_argsort";
const MUL_MAT_ID: &str = "ggml_compute_forward_mul_mat_id";

/// Where MoE routing is read in a build: `None` when it has neither hook
/// (a stripped build from before 2025), and routing is off.
pub(super) fn routing_hook(libs: &HookLibs) -> Option<&'static str> {
    [ARGSORT, MUL_MAT_ID].into_iter().find(|s| libs.path_of(s).is_some())
}

/// What the op probes record.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpOptions {
    pub all_threads: bool,
    pub op_timing: bool,
    /// The ubatch probe: the build's `llama_ubatch` layout is known.
    pub sequences: bool,
    /// The buffer probes: the build's `ggml_backend_buffer` layout is known.
    pub buffers: bool,
}

pub(super) struct Attached {
    pub pid: u32,
    probes: HashSet<(PathBuf, &'static str, u64)>,
    pub libraries: Vec<Library>,
    pub has_ops: bool,
}

impl Attached {
    /// Configure and attach the op probes (the ubatch probe only with
    /// `sequences`: the layout of its struct is known).
    pub fn start_ops(&mut self, tracer: &mut Tracer, options: OpOptions, libs: &HookLibs) -> Result<()> {
        tracer.configure(options.all_threads)?;
        self.attach(tracer, libs, options)?;
        Ok(())
    }

    /// Attach every hook `libs` provides that is not attached yet.
    fn attach(&mut self, tracer: &mut Tracer, libs: &HookLibs, options: OpOptions) -> Result<usize> {
        let OpOptions { op_timing, sequences, buffers, .. } = options;
        let mut added = 0;
        // One ELF parse per library for all its hook offsets.
        let mut offsets: Vec<(PathBuf, Vec<Option<u64>>)> = Vec::new();
        for (symbol, program, cookie) in HOOKS {
            // The per-node probes time the nodes the per-graph one defines.
            let per_node = program == programs::GGML_OP;
            let buffer_probe =
                [target::BUFFER_INIT, target::SET_USAGE, target::BUFFER_FREE, target::OUTPUT_RESERVE].contains(&symbol);
            if (per_node && !op_timing) || (program == programs::UBATCH && !sequences) || (buffer_probe && !buffers) {
                continue;
            }
            if program == programs::MUL_MAT_ID_ENTRY && libs.path_of(ARGSORT).is_some() {
                continue;
            }
            let Some(path) = libs.path_of(symbol) else { continue };
            if !self.probes.insert((path.to_path_buf(), program, cookie)) {
                continue;
            }
            let i = match offsets.iter().position(|(p, _)| p == path) {
                Some(i) => i,
                None => {
                    // Probe sites past a single-stepped first instruction
                    // where the registers stay as at the call; a return
                    // probe there still finds the return address at rsp.
                    // `ggml_op` reads only the call's argument registers: its
                    // probes may sit past a longer prologue.
                    let reads =
                        |program| if program == programs::GGML_OP { Reads::Arguments } else { Reads::Everything };
                    let symbols: Vec<(&str, Reads)> = HOOKS.iter().map(|h| (h.0, reads(h.1))).collect();
                    offsets.push((path.to_path_buf(), target::probe_file_offsets(path, &symbols)?));
                    offsets.len() - 1
                }
            };
            let offset = HOOKS.iter().position(|h| h.0 == symbol).and_then(|k| offsets[i].1[k]);
            let t = Instant::now();
            tracer.attach_uprobe_at(program, path, symbol, offset, Some(self.pid), cookie)?;
            log::debug!("uprobe {program} on {symbol} attached in {:?}", t.elapsed());
            added += 1;
            self.has_ops |= program == programs::GGML_OP || program == programs::GRAPH_COMPUTE;
            let role = [("cpu", &libs.cpu), ("base", &libs.base), ("llama", &libs.llama), ("whisper", &libs.whisper)]
                .into_iter()
                .find(|(_, p)| p.as_deref() == Some(path))
                .map_or("other", |(role, _)| role);
            if !self.libraries.iter().any(|l| Path::new(&l.path) == path) {
                self.libraries.push(Library {
                    path: path.display().to_string(),
                    role: role.to_string(),
                    build_id: target::build_id(path),
                });
            }
        }
        Ok(added)
    }
}

impl Attached {
    pub fn new(pid: u32) -> Self {
        Self { pid, probes: HashSet::new(), libraries: Vec::new(), has_ops: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::target::{BASE_HOOKS, CPU_HOOKS, LLAMA_HOOKS, WHISPER_HOOKS};

    #[test]
    fn every_probed_symbol_is_one_the_library_search_knows() {
        for (symbol, _, _) in HOOKS {
            let known =
                CPU_HOOKS.iter().chain(&BASE_HOOKS).chain(&LLAMA_HOOKS).chain(&WHISPER_HOOKS).any(|&s| s == symbol);
            assert!(known, "{symbol} is probed but target::hooks never looks for it");
        }
    }
}
