//! Running commands with their output shown, and failing with their name.

use std::{
    ffi::OsStr,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// Run to completion, inheriting stdio; error names the command on failure.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot start {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Run and capture stdout; stderr is passed through.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stderr(Stdio::inherit()).output().with_context(|| format!("cannot start {}", describe(cmd)))?;
    if !out.status.success() {
        bail!("{} failed ({})", describe(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// True when the command runs and exits 0 (output discarded).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

pub fn describe(cmd: &Command) -> String {
    let args: Vec<_> = cmd.get_args().map(OsStr::to_string_lossy).collect();
    format!("`{} {}`", cmd.get_program().to_string_lossy(), args.join(" "))
}

pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
