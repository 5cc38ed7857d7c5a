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

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

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
    /// Processes whose loader is hooked: `run`'s child, and those it
    /// started that exec'd while the hold was on.
    hooked: BTreeSet<u32>,
    /// Processes the kernel stopped (a library load, an exec) since the
    /// last [`LibraryHold::take_stopped`].
    stopped: BTreeSet<u32>,
    /// Of those, the ones stopped at an exec: their loader is not hooked yet.
    exec_stopped: BTreeSet<u32>,
    /// The command's own program file: a child running it again is a
    /// helper of the program (node-llama-cpp tests its addon in a child
    /// node), not the one to trace, and is not held.
    command_image: Option<FileId>,
}

/// A file's (device, inode).
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl LibraryHold {
    /// Hook the loader `exe` runs with (its PT_INTERP; a script's
    /// interpreter's) and stop `pid` at each load. A program without a
    /// loader, or a loader without the hook, is left to the timed scan.
    /// The processes `pid` starts are followed to their exec (a container's
    /// program is a grandchild with a loader of its own).
    pub fn arm(tracer: &mut Tracer, exe: &Path, pid: u32) -> Self {
        let hooked = hook_loader(tracer, exe, pid).and_then(|hook| Ok((hook, tracer.hold_at_library_load(true)?)));
        match hooked {
            Ok(((loader, image), ())) => {
                log::info!("holding pid {pid} at each library load ({LOADER_HOOK} in {})", loader.display());
                if let Err(e) = tracer.follow_children() {
                    log::warn!("cannot follow the processes pid {pid} starts ({e}): if one of them {UNHELD}");
                }
                let command_image = file_id(&image);
                LibraryHold { armed: true, hooked: BTreeSet::from([pid]), command_image, ..Default::default() }
            }
            Err(e) => {
                log::warn!("cannot hold the target at library loads ({e:#}): if it {UNHELD}");
                LibraryHold::default()
            }
        }
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Whether the hold stops `pid` at its library loads.
    pub fn reaches(&self, pid: u32) -> bool {
        self.armed && self.hooked.contains(&pid)
    }

    pub fn on_event(&mut self, event: &Event) {
        let Event::Call(call) = event else { return };
        let pid = call.header.tgid;
        match call.cookie {
            markers::LIBRARY_LOADED => {
                self.stopped.insert(pid);
            }
            markers::PROCESS_EXEC => {
                self.stopped.insert(pid);
                self.exec_stopped.insert(pid);
            }
            _ => {}
        }
    }

    /// A stop whose marker the ring lost, or one not drained yet: a hooked
    /// process seen stopped, or one of `root`'s descendants (stopped at an
    /// exec: the kernel follows them from there).
    pub fn find_stops(&mut self, root: u32) {
        if !self.armed {
            return;
        }
        for &pid in &self.hooked {
            if target::process_state(pid) == Some('T') {
                self.stopped.insert(pid);
            }
        }
        for pid in target::descendants(root) {
            if !self.hooked.contains(&pid) && target::process_state(pid) == Some('T') {
                self.stopped.insert(pid);
                self.exec_stopped.insert(pid);
            }
        }
    }

    /// Whether the kernel holds `pid` at a library load now (not an exec).
    pub fn stopped_at_load(&self, pid: u32) -> bool {
        self.armed && self.hooked.contains(&pid) && self.stopped.contains(&pid)
    }

    /// Whether the kernel stopped a process since the last call.
    pub fn has_stops(&self) -> bool {
        !self.stopped.is_empty()
    }

    /// Hook the loader of each process stopped at an exec, for it alone.
    pub fn hook_exec_stopped(&mut self, tracer: &mut Tracer) {
        for pid in std::mem::take(&mut self.exec_stopped) {
            let exe = PathBuf::from(format!("/proc/{pid}/exe"));
            if self.command_image.is_some() && file_id(&exe) == self.command_image {
                log::debug!("pid {pid} runs the command's own program again (a helper of it): not held");
                continue;
            }
            match hook_loader(tracer, &exe, pid) {
                Ok((loader, _)) => {
                    log::info!("pid {pid} exec'd: holding it at each library load too ({})", loader.display());
                    self.hooked.insert(pid);
                }
                Err(e) => {
                    log::warn!(
                        "cannot hold pid {pid}, which the target started, at library loads ({e:#}): if it {UNHELD}"
                    )
                }
            }
        }
    }

    /// The processes stopped since the last call, to be continued.
    pub fn take_stopped(&mut self) -> BTreeSet<u32> {
        std::mem::take(&mut self.stopped)
    }

    /// Hold again the processes held before a disarm (none if the hold
    /// never took).
    pub fn rearm(&mut self, tracer: &mut Tracer) -> Result<()> {
        if !self.armed && !self.hooked.is_empty() {
            tracer.hold_at_library_load(true)?;
            self.armed = true;
        }
        Ok(())
    }

    /// ggml's probes are in: later loads and execs run freely.
    pub fn disarm(&mut self, tracer: &mut Tracer) -> Result<()> {
        if self.armed {
            tracer.hold_at_library_load(false)?;
            self.armed = false;
        }
        Ok(())
    }
}

/// What a process the hold does not reach risks.
const UNHELD: &str = "loads ggml with dlopen, its first graphs may run before ttrace finds the library";

/// Hook `_dl_debug_state` in the loader of `exe`, for `pid` alone; the
/// loader, and the program image `exe` runs. The loader's path is the
/// program's PT_INTERP as `pid` sees it: through `/proc/PID/root` (a
/// chroot, another mount namespace).
fn hook_loader(tracer: &mut Tracer, exe: &Path, pid: u32) -> Result<(PathBuf, PathBuf)> {
    let image = target::program_image(exe)?;
    // `ld.so PROGRAM`: the loader is the executable itself.
    let loader = match target::interpreter(&image)? {
        Some(loader) => seen_by(pid, &loader),
        None if target::has_symbols(&image, &[LOADER_HOOK])?[0] => image.clone(),
        None => anyhow::bail!("{} is statically linked (no PT_INTERP)", image.display()),
    };
    tracer.attach_uprobe(programs::CALL_ARGS, &loader, LOADER_HOOK, Some(pid), markers::LIBRARY_LOADED)?;
    Ok((loader, image))
}

/// `path` as process `pid` opens it, when its root or mounts are not ours.
fn seen_by(pid: u32, path: &Path) -> PathBuf {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let mounts = |p: String| std::fs::read_link(p).ok();
    let ours = file_id(&root).is_some_and(|r| Some(r) == file_id(Path::new("/")))
        && mounts(format!("/proc/{pid}/ns/mnt")) == mounts("/proc/self/ns/mnt".into());
    if ours { path.to_path_buf() } else { root.join(path.strip_prefix("/").unwrap_or(path)) }
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
