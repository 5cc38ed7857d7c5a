//! Hooks found after the trace began: a program that loads ggml with
//! `dlopen` (the Python clients, Node addons) shows its libraries in its
//! maps only then.

use anyhow::Result;

use super::{Session, gate, op_options, plan, plan::Attached, values};
use crate::{
    format::{Hooks, LateAttach, TargetBuild},
    live::{
        layouts::Choice,
        load::Tracer,
        target::{self, HookLibs, OpNames, RunningChild},
    },
};

impl Session<'_> {
    /// Attach hooks found after the header was written, announced in a
    /// HOOKS frame with the build they belong to.
    fn start_late_ops(
        &mut self,
        tracer: &mut Tracer,
        libs: &HookLibs,
        names: Option<&OpNames>,
        choice: Choice,
    ) -> Result<()> {
        let before = self.attached.libraries.len();
        let build = choice.build.clone();
        self.recorder.graphs.set_layout(choice.layout.tensor);
        self.layouts.arm(tracer, choice, names)?;
        if plan::routing_hook(libs).is_none() {
            self.layouts.disable(crate::live::layouts::routing_off());
        }
        self.attached.start_ops(tracer, op_options(self.spec, &self.layouts), libs)?;
        self.recorder.op_times.iter_mut().for_each(|t| t.set_op_names(names));
        if let Some(spec) = &self.spec.values {
            values::start(tracer, libs, names, self.attached.pid, spec.filter.is_some())?;
            self.recorder.values.iter_mut().for_each(|v| v.set_op_names(names));
        }
        self.announce_hooks(before, names, build)
    }

    /// The HOOKS frame for the libraries attached since `before`.
    fn announce_hooks(&mut self, before: usize, names: Option<&OpNames>, build: TargetBuild) -> Result<()> {
        let hooks = Hooks {
            libraries: self.attached.libraries[before..].to_vec(),
            op_names: names.map(|n| n.ops.clone()).unwrap_or_default(),
            unary_op_names: names.map(|n| n.unary.clone()).unwrap_or_default(),
            glu_op_names: names.map(|n| n.glu.clone()).unwrap_or_default(),
            build: Some(build),
        };
        self.recorder.writer.hooks(&hooks)?;
        Ok(())
    }

    /// The hook libraries of a process mapping `files`, with `--lib`'s.
    fn libs_of(&self, files: Vec<std::path::PathBuf>) -> HookLibs {
        let mut all = self.spec.libs.clone();
        all.extend(files);
        target::classify(&all)
    }

    /// dlopen'ed libraries (the Python client) appear in the maps later. The
    /// child is ours: hold it still while probing, so no decode runs
    /// half-instrumented. A build ttrace does not know is refused here.
    pub(super) fn find_late_hooks(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        let Some((pid, libs)) = self.process_with_ggml() else { return Ok(()) };
        let choice = match gate::choose(&libs) {
            Ok(choice) if libs.cpu.is_some() => choice,
            Ok(_) => return Ok(()),
            Err(refusal) => {
                self.layouts.refused = Some(refusal);
                return Ok(());
            }
        };
        let names = op_names_of(&libs)?;
        // Found while the kernel held it at a library load: before it ran
        // anything of ggml's.
        let held_at_load = self.hold.stopped_at_load(pid);
        if pid != self.attached.pid {
            log::info!("pid {pid}, a child of pid {}, loaded ggml: tracing it", self.attached.pid);
            tracer.add_target(pid)?;
            self.attached.pid = pid;
            self.recorder.resolver.follow(pid);
        }
        let held = child.is_some() && target::signal(pid, libc::SIGSTOP).is_ok();
        let started = self.start_late_ops(tracer, &libs, names.as_ref(), choice);
        if started.is_ok() {
            let library = libs.cpu.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            self.late_attach = Some(LateAttach { library, held: held_at_load });
            // A process the target started may end without a graph, and the
            // next one must be held as this one was: until a graph runs.
            if pid == self.target_pid {
                self.hold.disarm(tracer)?;
            }
        }
        if held {
            target::signal(pid, libc::SIGCONT)?;
        }
        // Found in its maps, gone before its probes were in: the exit ends
        // the trace as any exit does, with this said.
        if let Err(e) = &started
            && !target::running(self.attached.pid)
        {
            log::debug!("the target exited while ttrace attached: {e:#}");
            self.exited_while_attaching = libs.cpu.clone();
            return Ok(());
        }
        started
    }

    /// A process the target started, traced since it loaded ggml, ended
    /// before running a graph (node-llama-cpp's test of its binary in a
    /// child; `sh -c 'llama-server --version; llama-server …'`): the graphs
    /// are yet to come, from another process. Look for ggml again from the
    /// target, held at library loads as before. Once a graph ran, the hold
    /// ends.
    pub(super) fn follow_the_graphs(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        let (pid, target) = (self.attached.pid, self.target_pid);
        if self.first_graph_started {
            return self.hold.disarm(tracer);
        }
        if pid == target || target::running(pid) {
            return Ok(());
        }
        log::info!("pid {pid} loaded ggml and ended before running a graph: looking for ggml again from pid {target}");
        self.attached = Attached::new(target);
        self.late_attach = None;
        self.hold.rearm(tracer)?;
        // The next one may have loaded ggml already, let go while the
        // ended one still had the probes: its loads will not stop again.
        self.find_late_hooks(tracer, child)
    }

    /// ggml's backend loader (`ggml_backend_load_best`, Debian's build)
    /// opens each CPU variant to score it and keeps only the best, so the
    /// one the timed scan found may be closed again. Until the first graph,
    /// a CPU backend that appears later gets the probes too.
    pub(super) fn follow_cpu_backend(&mut self, tracer: &mut Tracer) -> Result<()> {
        // Only a backend loaded at run time (found late) can be swapped.
        if self.first_graph_started || !self.attached.has_ops || self.late_attach.is_none() {
            return Ok(());
        }
        let Ok(files) = target::mapped_files(self.attached.pid) else { return Ok(()) };
        // A CPU backend probed and still mapped is the one in use (another
        // mapped beside it is one being scored).
        let probed = |path: &std::path::Path| {
            self.attached.libraries.iter().any(|l| l.role == "cpu" && l.path == path.display().to_string())
        };
        if files.iter().any(|f| probed(f)) {
            return Ok(());
        }
        let libs = self.libs_of(files);
        let (Some(cpu), Some(build)) = (libs.cpu.as_deref(), self.layouts.choice.as_ref().map(|c| c.build.clone()))
        else {
            return Ok(());
        };
        log::info!("ggml's CPU backend is now {}: attaching to it", cpu.display());
        let names = op_names_of(&libs)?;
        let before = self.attached.libraries.len();
        self.attached.start_ops(tracer, op_options(self.spec, &self.layouts), &libs)?;
        self.recorder.op_times.iter_mut().for_each(|t| t.set_op_names(names.as_ref()));
        self.announce_hooks(before, names.as_ref(), build)
    }

    /// At the first graph: of the CPU backends probed, the one still
    /// mapped is the one in use, which the summary names.
    pub(super) fn name_cpu_backend_in_use(&mut self) {
        let Some(late) = self.late_attach.as_mut() else { return };
        let Ok(files) = target::mapped_files(self.attached.pid) else { return };
        let in_use = self
            .attached
            .libraries
            .iter()
            .filter(|l| l.role == "cpu")
            .map(|l| &l.path)
            .find(|path| files.iter().any(|f| f.display().to_string() == **path));
        if let Some(path) = in_use {
            late.library = path.clone();
        }
    }

    /// The process that loaded a ggml CPU backend, and its libraries: the
    /// target, or a process it started (`unshare --fork chroot ROOT
    /// PROGRAM`, as a container runs a program; `sh -c`).
    fn process_with_ggml(&self) -> Option<(u32, target::HookLibs)> {
        let pid = self.attached.pid;
        std::iter::once(pid).chain(target::descendants(pid)).find_map(|pid| {
            let libs = self.libs_of(target::mapped_files(pid).ok()?);
            // A CPU backend mapped before the base library it needs is a
            // load still at work: its layouts would lack ggml's version.
            (gate::has_cpu_backend(&libs) && libs.path_of("ggml_op_name").is_some()).then_some((pid, libs))
        })
    }

    /// The timed scan for ggml. While the target is held at library loads,
    /// a process the hold reaches is read only when it is stopped: a loader
    /// still at work may have mapped a CPU backend but not yet the base
    /// library it needs (pywhispercpp's libggml-cpu comes before
    /// libggml-base), and layouts chosen then have neither base hooks nor
    /// ggml's version. A stop seen here is a load or exec whose marker the
    /// ring lost, or one not drained yet. Processes the hold does not reach
    /// (a child whose loader could not be hooked) are scanned all the same.
    pub(super) fn scan_on_tick(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        if !self.hold.armed() {
            return self.find_late_hooks(tracer, child);
        }
        self.hold.find_stops(self.attached.pid);
        if self.hold.has_stops() {
            return self.on_library_load(tracer, child);
        }
        if target::descendants(self.attached.pid).iter().any(|&pid| !self.hold.reaches(pid)) {
            return self.find_late_hooks(tracer, child);
        }
        Ok(())
    }

    /// The kernel stopped processes at a library load or an exec: hook the
    /// loaders of those that exec'd, look for ggml while they are still,
    /// then let them go on (also when attaching failed).
    pub(super) fn on_library_load(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        self.hold.hook_exec_stopped(tracer);
        // Before the has-ops test: the probes may belong to a process that
        // ended, and this stop may be its successor's load of ggml.
        self.follow_the_graphs(tracer, child)?;
        let found = if self.attached.has_ops { Ok(()) } else { self.find_late_hooks(tracer, child) };
        for pid in self.hold.take_stopped() {
            match child {
                Some(c) if c.pid() == pid => c.signal(libc::SIGCONT)?,
                _ => target::signal(pid, libc::SIGCONT)?,
            }
        }
        found
    }
}

/// ggml's op names, from the library that defines `ggml_op_name`.
fn op_names_of(libs: &HookLibs) -> Result<Option<OpNames>> {
    Ok(match libs.path_of("ggml_op_name") {
        Some(base) => Some(target::op_names(base)?),
        None => None,
    })
}
