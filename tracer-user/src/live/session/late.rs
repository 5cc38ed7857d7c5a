//! Hooks found after the trace began: a program that loads ggml with
//! `dlopen` (the Python clients, Node addons) shows its libraries in its
//! maps only then.

use anyhow::Result;

use super::{Session, gate, op_options, plan, values};
use crate::{
    format::{Hooks, LateAttach},
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
            self.layouts.disabled.push(crate::live::layouts::routing_off());
        }
        self.attached.start_ops(tracer, op_options(self.spec, &self.layouts), libs, names)?;
        if self.spec.values.is_some() {
            values::start(tracer, libs, names, self.attached.pid)?;
        }
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

    /// dlopen'ed libraries (the Python client) appear in the maps later. The
    /// child is ours: hold it still while probing, so no decode runs
    /// half-instrumented. A build ttrace does not know is refused here.
    pub(super) fn find_late_hooks(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        let Ok(files) = target::mapped_files(self.attached.pid) else { return Ok(()) };
        let mut all = self.spec.libs.clone();
        all.extend(files);
        let libs = target::classify(&all);
        if !gate::has_cpu_backend(&libs) {
            return Ok(());
        }
        let choice = match gate::choose(&libs) {
            Ok(choice) if libs.cpu.is_some() => choice,
            Ok(_) => return Ok(()),
            Err(refusal) => {
                self.layouts.refused = Some(refusal);
                return Ok(());
            }
        };
        let names = match libs.path_of("ggml_op_name") {
            Some(base) => Some(target::op_names(base)?),
            None => None,
        };
        let held = child.is_some_and(|c| c.signal(libc::SIGSTOP).is_ok());
        let started = self.start_late_ops(tracer, &libs, names.as_ref(), choice);
        if started.is_ok() {
            let library = libs.cpu.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            self.late_attach = Some(LateAttach { library, held: self.hold.armed() });
            self.hold.disarm(tracer)?;
        }
        if held && let Some(c) = child {
            c.signal(libc::SIGCONT)?;
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

    /// The timed scan for ggml. While the target is held at library loads,
    /// its maps are read only when it is stopped: a loader still at work
    /// may have mapped a CPU backend but not yet the base library it needs
    /// (pywhispercpp's libggml-cpu comes before libggml-base), and layouts
    /// chosen then have neither base hooks nor ggml's version. A stop seen
    /// here is a load whose marker the ring lost, or one not drained yet.
    pub(super) fn scan_on_tick(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        if !self.hold.armed() {
            return self.find_late_hooks(tracer, child);
        }
        if target::process_state(self.attached.pid) == Some('T') {
            return self.on_library_load(tracer, child);
        }
        Ok(())
    }

    /// The kernel stopped the target at a library load: look for ggml
    /// while it is still, then let it go on.
    pub(super) fn on_library_load(&mut self, tracer: &mut Tracer, child: Option<&RunningChild>) -> Result<()> {
        if !self.attached.has_ops {
            self.find_late_hooks(tracer, child)?;
        }
        if let Some(c) = child {
            c.signal(libc::SIGCONT)?;
        }
        Ok(())
    }
}
