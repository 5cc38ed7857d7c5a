//! Following the processes a `run` command starts while it is held at
//! library loads (tracer-ebpf's `processes`): `unshare --fork chroot ROOT
//! PROGRAM` runs ggml in a grandchild with a loader of its own.

use aya::programs::TracePoint;
use tracer_common::{config, programs};

use super::{LoadError, Tracer, program_error};
use crate::live::tracefs;

/// The tracepoints, as `(group, event, program)`.
pub const PROCESS_TRACEPOINTS: [(&str, &str, &str); 2] =
    [("sched", "sched_process_fork", programs::PROCESS_FORK), ("sched", "sched_process_exec", programs::PROCESS_EXEC)];

impl Tracer {
    /// Trace the processes the target starts from their exec, each stopped
    /// there (`markers::PROCESS_EXEC`) while the library hold is on; the
    /// caller continues each.
    pub fn follow_children(&mut self) -> Result<(), LoadError> {
        // The record's layout differs between kernels (6.x made the comms
        // `__data_loc` strings, moving `child_pid` from 44 to 20).
        let (group, event, _) = PROCESS_TRACEPOINTS[0];
        let offset = tracefs::field_offset(group, event, "child_pid")?
            .ok_or(LoadError::Missing { what: "tracepoint field", name: "sched_process_fork.child_pid" })?;
        self.verify_process_tracepoints()?;
        for (group, event, program) in PROCESS_TRACEPOINTS {
            let tp: &mut TracePoint = self.program(program)?;
            tp.attach(group, event).map_err(|source| program_error(program, source))?;
        }
        self.set_config(config::FORK_CHILD_PID, offset as u64)
    }

    /// Load the process tracepoints without attaching them (`ttrace check`).
    pub fn verify_process_tracepoints(&mut self) -> Result<(), LoadError> {
        for (_, _, program) in PROCESS_TRACEPOINTS {
            self.program::<TracePoint>(program)?;
        }
        Ok(())
    }
}
