//! `ttrace attach --pid N`: trace a running process until it exits, Ctrl-C,
//! SIGTERM or `--duration`; detaching leaves it running.

use anyhow::Result;

use super::traced;
use crate::{
    cli::AttachArgs,
    live::privileges::require_tracing_privileges,
    live::session::{self, SessionSpec, Target},
    live::target::{UserSpec, process_state},
};

pub async fn run(args: AttachArgs) -> Result<()> {
    require_tracing_privileges()?;
    match process_state(args.pid) {
        None => anyhow::bail!("no process with pid {} (check `ps -p {}`)", args.pid, args.pid),
        Some('Z' | 'X') => anyhow::bail!("pid {} has already exited (a zombie waiting for its parent)", args.pid),
        Some(_) => {}
    }
    let spec = SessionSpec { duration: args.duration, ..super::session_spec(&args.common, UserSpec::from_sudo_env()?) };
    let outcome = session::trace(Target::Attach { pid: args.pid }, &spec).await?;
    traced::print_summary(&spec.output, &outcome)
}
