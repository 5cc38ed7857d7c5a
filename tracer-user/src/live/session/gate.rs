//! The session's side of the struct layouts: choose them when a CPU
//! backend library is found (refusing a build ttrace does not know), hand
//! them to the kernel, and put the recorder behind the live check
//! (`live::check`), whose verdict decides what the trace keeps.

use std::{fs::File, io::BufWriter};

use tracer_common::layout::GgmlLayout;

use crate::{
    events::Event,
    format::{Disabled, LayoutCheck, Memory},
    live::{
        check::{Gate, GgufTensor, Rules},
        layouts::{
            self, Choice, PATCH_ENV, Refusal, TABLES_ENV, Tables,
            derive::{self, Derived},
        },
        load::Tracer,
        recorder::Recorder,
        target::{BuildFacts, HookLibs, OpNames, PROCESS_UBATCH},
    },
};

/// Whether `libs` hold a ggml CPU backend (ttrace's or an older one's):
/// the moment to choose, before any ggml probe attaches. A build with only
/// its base library so far loads its CPU backend later (`GGML_BACKEND_DL`).
pub(super) fn has_cpu_backend(libs: &HookLibs) -> bool {
    libs.cpu.is_some() || libs.path_of("ggml_graph_compute").is_some()
}

/// The layouts for the build `libs` belong to.
pub(super) fn choose(libs: &HookLibs) -> Result<Choice, Refusal> {
    let facts = BuildFacts::read(libs);
    let patch = std::env::var(PATCH_ENV).ok().filter(|p| !p.trim().is_empty());
    let tables = Tables::from_env();
    if tables == Tables::Hidden {
        log::warn!("{TABLES_ENV}=off: ttrace's layout tables are ignored; layouts are read from the target's code");
    }
    let derived = layouts::needs_code(&facts, tables).then(|| derived(libs)).flatten();
    let ubatch_hook = libs.path_of(PROCESS_UBATCH).is_some();
    let mut choice = layouts::choose_from(&facts, ubatch_hook, patch.as_deref(), tables, derived.as_ref())?;
    // whisper.cpp has no llama_ubatch to read: nothing is off for it.
    if libs.llama.is_none() && libs.whisper.is_some() {
        choice.disabled.retain(|d| d.feature != "sequences");
    }
    log::info!("{}: llama.cpp {}, layouts {:?}", facts.describe(), choice.build.release_text, choice.build.layouts);
    Ok(choice)
}

/// The layouts in the code of the file that defines ggml's base functions.
fn derived(libs: &HookLibs) -> Option<Derived> {
    let base = libs.base.as_deref()?;
    let llama = libs.path_of(PROCESS_UBATCH);
    derive::derive(base, llama).inspect_err(|e| log::warn!("reading struct layouts from {}: {e}", base.display())).ok()
}

/// The layout state of a session, and the recorder's gate.
#[derive(Default)]
pub(super) struct Layouts {
    pub gate: Gate,
    pub choice: Option<Choice>,
    pub disabled: Vec<Disabled>,
    /// The ubatch check failed: the session turns the probe off.
    pub ubatch_off: bool,
    /// Why the trace is refused, once the live check failed.
    pub refused: Option<Refusal>,
}

impl Layouts {
    /// The ggml probes are about to attach with `choice`: the kernel gets
    /// its layout, and the recorder waits for the live check.
    pub fn arm(&mut self, tracer: &mut Tracer, choice: Choice, names: Option<&OpNames>) -> anyhow::Result<()> {
        tracer.set_ggml_layout(&choice.layout)?;
        let get_rows = names.and_then(|n| n.op_id(tracer_common::ggml::OP_GET_ROWS));
        self.gate.arm(Rules {
            tensor: choice.layout.tensor,
            n_ops: names.map_or(usize::MAX, |n| n.ops.len()),
            get_rows,
            ubatch: choice.layout.ubatch.known(),
        });
        choice.disabled.iter().for_each(|d| self.disable(d.clone()));
        self.choice = Some(choice);
        Ok(())
    }

    /// Turn a feature off, once: the probes may be armed again when the
    /// process that loaded ggml is not the one that runs graphs.
    pub fn disable(&mut self, off: Disabled) {
        if !self.disabled.contains(&off) {
            self.disabled.push(off);
        }
    }

    /// Whether the buffer probes should be attached.
    pub fn buffers(&self) -> bool {
        self.choice.as_ref().is_some_and(|c| c.layout.buffer.known())
    }

    /// Whether the ubatch probe should be attached.
    pub fn sequences(&self) -> bool {
        self.choice.as_ref().is_some_and(|c| c.layout.ubatch.known()) && !self.ubatch_off
    }

    /// The ubatch check failed: stop the probe (its records are dropped anyway).
    pub fn apply_ubatch_off(&mut self, tracer: &mut Tracer) -> anyhow::Result<()> {
        let Some(choice) = self.choice.as_mut().filter(|_| self.ubatch_off) else { return Ok(()) };
        if choice.layout.ubatch.known() {
            choice.layout.ubatch = GgmlLayout::UNSET.ubatch;
            choice.build.layouts.remove("llama_ubatch");
            tracer.set_ggml_layout(&choice.layout)?;
        }
        Ok(())
    }

    /// The trailer's account of the check: `None` when no ggml probe ran.
    pub fn check(&self) -> Option<LayoutCheck> {
        self.choice.as_ref().map(|_| self.gate.passed)
    }

    /// An event from the kernel: recorded now, held for the check, or the
    /// trace refused.
    pub fn take(
        &mut self,
        recorder: &mut Recorder<BufWriter<File>>,
        tap: &mut Option<Box<dyn super::Tap>>,
        event: Event,
    ) -> std::io::Result<()> {
        if self.refused.is_some() {
            return Ok(());
        }
        let resolver = &mut recorder.resolver;
        let mut gguf_name = |r: &tracer_common::TensorRecord| {
            resolver.prepare_records(std::iter::once(r));
            let Memory::ModelFile { model, tensor, offset: 0 } = resolver.memory_of(r) else { return None };
            let t = resolver.models().get(model as usize)?.tensors().get(tensor as usize)?;
            Some(GgufTensor { name: t.name.clone(), type_id: t.ggml_type.id, shape: t.shape.clone() })
        };
        let admitted = self.gate.admit(event, &mut gguf_name);
        match admitted {
            Ok(admitted) => {
                self.note_sequences_off(admitted.sequences_off);
                admitted.record.iter().try_for_each(|e| record_and_tap(recorder, tap, e))
            }
            Err(violation) => {
                let choice = self.choice.as_ref().expect("the gate checks only once a layout is chosen");
                self.refused = Some(Refusal::check_failed(violation.structure, choice, &violation.what));
                Ok(())
            }
        }
    }

    /// The end of the trace: what the check still held.
    pub fn finish(
        &mut self,
        recorder: &mut Recorder<BufWriter<File>>,
        tap: &mut Option<Box<dyn super::Tap>>,
    ) -> std::io::Result<()> {
        let admitted = self.gate.finish();
        self.note_sequences_off(admitted.sequences_off);
        admitted.record.iter().try_for_each(|e| record_and_tap(recorder, tap, e))
    }

    fn note_sequences_off(&mut self, reason: Option<String>) {
        if let Some(reason) = reason {
            log::warn!("sequences off: {reason}");
            self.disabled.push(layouts::sequences_off(&reason));
            self.ubatch_off = true;
        }
    }
}

fn record_and_tap(
    recorder: &mut Recorder<BufWriter<File>>,
    tap: &mut Option<Box<dyn super::Tap>>,
    event: &Event,
) -> std::io::Result<()> {
    recorder.record(event)?;
    if let Some(tap) = tap.as_mut() {
        tap.on_event(event, recorder);
    }
    Ok(())
}
