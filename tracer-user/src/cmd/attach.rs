//! `ttrace attach --pid N`: trace a running process until it exits, Ctrl-C,
//! SIGTERM or `--duration`; detaching leaves it running.

use std::time::Duration;

use anyhow::Result;

use super::{
    report,
    session::{self, SessionSpec, Target},
};
use crate::{cli::AttachArgs, privileges::require_tracing_privileges, target::UserSpec};

pub async fn run(args: AttachArgs) -> Result<()> {
    require_tracing_privileges()?;
    match process_state(args.pid) {
        None => anyhow::bail!("no process with pid {} (check `ps -p {}`)", args.pid, args.pid),
        Some('Z' | 'X') => anyhow::bail!("pid {} has already exited (a zombie waiting for its parent)", args.pid),
        Some(_) => {}
    }
    let spec = SessionSpec {
        output: args.common.output.clone(),
        models: args.common.model.clone(),
        io: !args.common.no_io,
        drop_caches: false,
        mem_limit: None,
        cgroup: None,
        all_threads: args.common.all_threads,
        libs: args.common.lib.clone(),
        duration: args.duration.map(Duration::from_secs_f64),
        ring_bytes: args.common.ring_bytes().map_err(anyhow::Error::msg)?,
        owner: UserSpec::from_sudo_env()?,
    };
    let outcome = session::trace(Target::Attach { pid: args.pid }, &spec).await?;
    report::print_summary(&spec.output, Some(&outcome.stats))
}

/// Whether `pid` exists and has not exited (a zombie has).
pub(super) fn is_running(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z' | 'X'))
}

/// The state letter of /proc/PID/stat (R, S, D, T, Z, ...), if the process exists.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
