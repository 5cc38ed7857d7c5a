//! Where a `run` target is held still while ttrace reads it: at its first
//! ubatch graph (its maps, with the model surely mapped), and at each
//! library load until ggml is found.
//!
//! At library loads: a program that loads ggml with `dlopen` and computes
//! at once (a Node addon, a Python client) would otherwise run its first
//! graphs before the timed scan of its maps finds the library.
//!
//! The hook is the dynamic loader's `_dl_debug_state()`, the function it
//! calls for debuggers around every change to the loaded libraries (glibc
//! and musl alike): after a `dlopen`'s libraries are mapped and before their
//! constructors run. The kernel stops the target there (SIGSTOP) and wakes
//! ttrace, which looks for ggml, attaches, and continues it.

use std::path::{Path, PathBuf};

use anyhow::Result;

use tracer_common::{markers, programs};

use super::Session;
use crate::{
    events::Event,
    live::{
        load::Tracer,
        target::{self, LOADER_HOOK, RunningChild},
    },
};

#[derive(Default)]
pub(super) struct LibraryHold {
    /// The kernel stops the target at library loads.
    armed: bool,
    /// A library load was seen since the last [`LibraryHold::take_load`].
    loaded: bool,
}

impl LibraryHold {
    /// Hook the loader `exe` runs with (its PT_INTERP; a script's
    /// interpreter's) and stop `pid` at each load. A program without a
    /// loader, or a loader without the hook, is left to the timed scan.
    pub fn arm(tracer: &mut Tracer, exe: &Path, pid: u32) -> Self {
        match hook_loader(tracer, exe, pid) {
            Ok(loader) => {
                log::info!("holding pid {pid} at each library load ({LOADER_HOOK} in {})", loader.display());
                LibraryHold { armed: true, loaded: false }
            }
            Err(e) => {
                log::warn!(
                    "cannot hold the target at library loads ({e:#}): if it loads ggml with dlopen, its first \
                     graphs may run before ttrace finds the library"
                );
                LibraryHold::default()
            }
        }
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    pub fn on_event(&mut self, event: &Event) {
        if let Event::Call(call) = event
            && call.cookie == markers::LIBRARY_LOADED
        {
            self.loaded = true;
        }
    }

    /// Whether a library load stopped the target since the last call.
    pub fn take_load(&mut self) -> bool {
        std::mem::take(&mut self.loaded) && self.armed
    }

    /// ggml's probes are in: later loads run freely.
    pub fn disarm(&mut self, tracer: &mut Tracer) -> Result<()> {
        if self.armed {
            tracer.hold_at_library_load(false)?;
            self.armed = false;
        }
        Ok(())
    }
}

fn hook_loader(tracer: &mut Tracer, exe: &Path, pid: u32) -> Result<PathBuf> {
    let image = target::program_image(exe)?;
    // `ld.so PROGRAM`: the loader is the executable itself.
    let loader = match target::interpreter(&image)? {
        Some(loader) => loader,
        None if target::has_symbols(&image, &[LOADER_HOOK])?[0] => image,
        None => anyhow::bail!("{} is statically linked (no PT_INTERP)", image.display()),
    };
    tracer.attach_uprobe(programs::CALL_ARGS, &loader, LOADER_HOOK, Some(pid), markers::LIBRARY_LOADED)?;
    tracer.hold_at_library_load(true)?;
    Ok(loader)
}

impl Session<'_> {
    /// The kernel stopped a `run` target at its first graph: read its maps
    /// now that the model is surely mapped, then let it go on.
    pub(super) fn continue_after_first_graph(
        &mut self,
        child: Option<&RunningChild>,
        memory: &mut target::MemorySamples,
    ) -> Result<()> {
        let Some(child) = child.filter(|_| self.held_at_first_graph) else { return Ok(()) };
        // Its graph's marker says so; a stop at a library load is not this
        // one. Without the marker (a full ring), a stop once no load holds it.
        let stopped =
            self.first_graph_started || (!self.hold.armed() && target::process_state(self.attached.pid) == Some('T'));
        if !stopped {
            return Ok(());
        }
        self.held_at_first_graph = false;
        // Its KV cache and compute buffers are allocated by now; the run may
        // end before the next tick.
        memory.sample();
        self.recorder.resolver.refresh();
        self.recorder.flush_models()?;
        // `run`'s child, or the process of its that loaded ggml.
        if child.pid() == self.attached.pid {
            child.signal(libc::SIGCONT)?;
        } else {
            target::signal(self.attached.pid, libc::SIGCONT)?;
        }
        Ok(())
    }
}
