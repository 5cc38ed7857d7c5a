//! `ttrace run -- CMD ARGS…`: start CMD held before exec, attach, release.

use std::ffi::OsString;

use anyhow::{Result, bail};

use super::{
    report,
    session::{self, SessionSpec, Target},
};
use crate::{
    cli::RunArgs,
    privileges::require_tracing_privileges,
    target::{HeldChild, SpawnOptions, UserSpec},
};

pub async fn run(args: RunArgs) -> Result<()> {
    // Before anything runs: a clear error instead of a half-started child.
    require_tracing_privileges()?;
    let user = UserSpec::for_run(args.user.as_deref())?;
    let argv: Vec<OsString> = args.command.iter().map(OsString::from).collect();
    let child = HeldChild::spawn(&argv, SpawnOptions { user: user.clone(), env: Vec::new() })?;
    let spec = SessionSpec {
        output: args.common.output.clone(),
        all_threads: args.common.all_threads,
        libs: args.common.lib.clone(),
        duration: None,
        ring_bytes: args.common.ring_bytes().map_err(anyhow::Error::msg)?,
        owner: user.or(UserSpec::from_sudo_env()?),
    };
    let outcome = session::trace(Target::Run { child, argv: args.command.clone() }, &spec).await?;
    report::print_summary(&spec.output, Some(&outcome.stats))?;
    match outcome.exit {
        Some(status) if !status.success() => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => bail!("the traced command exited with status {code} (trace kept)"),
                (_, Some(sig)) => bail!("the traced command was killed by signal {sig} (trace kept up to then)"),
                _ => bail!("the traced command failed (trace kept)"),
            }
        }
        _ => Ok(()),
    }
}
