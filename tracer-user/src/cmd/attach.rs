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
    if !std::path::Path::new(&format!("/proc/{}", args.pid)).exists() {
        anyhow::bail!("no process with pid {} (check `ps -p {}`)", args.pid, args.pid);
    }
    let spec = SessionSpec {
        output: args.common.output.clone(),
        all_threads: args.common.all_threads,
        libs: args.common.lib.clone(),
        duration: args.duration.map(Duration::from_secs_f64),
        ring_bytes: args.common.ring_bytes().map_err(anyhow::Error::msg)?,
        owner: UserSpec::from_sudo_env()?,
    };
    let outcome = session::trace(Target::Attach { pid: args.pid }, &spec).await?;
    report::print_summary(&spec.output, Some(&outcome.stats))
}
