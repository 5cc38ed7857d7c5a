//! `ttrace run -- CMD ARGS…`: start CMD held before exec, attach, release.

use std::ffi::OsString;

use anyhow::{Result, bail};

use super::traced;
use crate::{
    cli::RunArgs,
    live::privileges::require_tracing_privileges,
    live::session::{self, SessionSpec, Target},
    live::target::{HeldChild, MemoryCgroup, SpawnOptions, UserSpec, spawn_limited},
};

pub async fn run(args: RunArgs) -> Result<()> {
    // Before anything runs: a clear error instead of a half-started child.
    require_tracing_privileges()?;
    let user = UserSpec::for_run(args.user.as_deref())?;
    let opts = SpawnOptions { user: user.clone(), ..Default::default() };
    let (child, mut cgroup) = spawn_held(&args.command, opts, args.mem_limit, "run")?;
    let mut spec = SessionSpec {
        drop_caches: args.drop_caches,
        mem_limit: cgroup.as_ref().map(MemoryCgroup::limit_bytes),
        cgroup: cgroup.as_ref().map(|c| c.version().to_string()),
        cgroup_dir: cgroup.as_ref().map(|c| c.path().to_path_buf()),
        ..super::session_spec(&args.common, user.or(UserSpec::from_sudo_env()?))
    };
    spec.models.extend(models_in_command(&args.command));
    let outcome = session::trace(Target::Run { child, argv: args.command.clone() }, &spec).await?;
    traced::print_summary(&spec.output, &outcome)?;
    if let Some(cgroup) = cgroup.as_mut() {
        if let Ok(stats) = cgroup.stats() {
            eprintln!(
                "  memory       cgroup {} limit {}, peak {}, limit hit {} times, {} OOM kills",
                cgroup.version(),
                crate::units::human_bytes(stats.limit_bytes),
                stats.peak_bytes.map_or_else(|| "unknown".to_string(), crate::units::human_bytes),
                stats.limit_hits,
                stats.oom_kills
            );
        }
        cgroup.remove()?;
    }
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

/// `command` held before exec, in a memory cgroup of `mem_limit` when given.
pub(super) fn spawn_held(
    command: &[String],
    opts: SpawnOptions,
    mem_limit: Option<u64>,
    hint: &str,
) -> Result<(HeldChild, Option<MemoryCgroup>)> {
    let argv: Vec<OsString> = command.iter().map(OsString::from).collect();
    Ok(spawn_limited(&argv, opts, mem_limit, hint)?)
}

/// GGUF files named by the command's `-m PATH`, `--model PATH` or
/// `--model=PATH` (llama.cpp's tools), so their load-time reads are watched.
pub(super) fn models_in_command(argv: &[String]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-m" | "--model" => args.next().cloned(),
            other => other.strip_prefix("--model=").map(str::to_string),
        };
        if let Some(path) = value.map(std::path::PathBuf::from)
            && crate::live::recorder::is_gguf(&path)
        {
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_models_in_llama_command_lines() {
        let dir = std::env::temp_dir().join(format!("ttrace-models-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gguf = dir.join("m.gguf");
        std::fs::write(&gguf, b"GGUF\x03\0\0\0").unwrap();
        let text = dir.join("prompt.txt");
        std::fs::write(&text, b"hello").unwrap();
        let g = gguf.display().to_string();
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(models_in_command(&argv(&["llama-completion", "-m", &g, "-p", "hi"])), vec![gguf.clone()]);
        assert_eq!(models_in_command(&argv(&["x", &format!("--model={g}")])), vec![gguf.clone()]);
        // Not a GGUF, a missing file, and `-m` as the program name are ignored.
        assert!(models_in_command(&argv(&["x", "-m", &text.display().to_string(), "--model", "/nope"])).is_empty());
        assert!(models_in_command(&argv(&["-m", &g])).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
