//! `ttrace top --pid N` / `ttrace top -- CMD …`: the live view. The session
//! is `attach`'s or `run`'s; a tap on its recorder feeds the view, and the
//! trace goes to `-o FILE` or nowhere.

use std::{io::IsTerminal, os::fd::AsRawFd, path::PathBuf, sync::Arc};

use anyhow::{Result, bail};

use super::traced;
use crate::{
    cli::{TopArgs, TracepointChoice},
    live::{
        privileges::require_tracing_privileges,
        session::{self, SessionSpec, Target, trace_file::DISCARD},
        target::{LimitingCgroup, MemoryStats, SpawnOptions, UserSpec, process_state},
        top::{MemorySource, Output, TopTap, aggregate::MemoryUse, screen::Screen},
    },
};

pub async fn run(args: TopArgs) -> Result<()> {
    require_tracing_privileges()?;
    if args.pid.is_none() && args.command.is_empty() {
        bail!("give the process to watch (--pid N) or a command to start after `--`");
    }
    if let Some(pid) = args.pid {
        match process_state(pid) {
            None => bail!("no process with pid {pid} (check `ps -p {pid}`)"),
            Some('Z' | 'X') => bail!("pid {pid} has already exited (a zombie waiting for its parent)"),
            Some(_) => {}
        }
    }
    let json = args.json || args.once;
    if !json && !std::io::stdout().is_terminal() {
        bail!("stdout is not a terminal: use --json (one object per interval) or --once");
    }
    let user = UserSpec::for_run(args.user.as_deref())?;
    // Under the screen, the command's output goes nowhere; with --json, to stderr.
    let quiet = if json { None } else { Some(std::fs::File::options().write(true).open(DISCARD)?) };
    let (target, cgroup, models) = match args.pid {
        Some(pid) => (Target::Attach { pid }, None, Vec::new()),
        None => {
            // Its output must not mix with the JSON lines or the screen.
            let (stdout, stderr) = match &quiet {
                Some(null) => (Some(null.as_raw_fd()), Some(null.as_raw_fd())),
                None => (Some(libc::STDERR_FILENO), None),
            };
            let opts = SpawnOptions { user: user.clone(), env: Vec::new(), stdout, stderr };
            let (child, cgroup) = super::run::spawn_held(&args.command, opts, args.mem_limit, "top")?;
            let models = super::run::models_in_command(&args.command);
            (Target::Run { child, argv: args.command.clone() }, cgroup.map(Arc::new), models)
        }
    };
    let spec = SessionSpec {
        output: args.output.clone().unwrap_or_else(|| PathBuf::from(DISCARD)),
        models: args.model.iter().cloned().chain(models).collect(),
        io: true,
        drop_caches: false,
        mem_limit: cgroup.as_ref().map(|c| c.limit_bytes()),
        cgroup: cgroup.as_ref().map(|c| c.version().to_string()),
        cgroup_dir: cgroup.as_ref().map(|c| c.path().to_path_buf()),
        all_threads: false,
        op_timing: false,
        libs: args.lib.clone(),
        duration: None,
        ring_bytes: args.ring_bytes,
        tracepoints: TracepointChoice::Auto,
        owner: user.or(UserSpec::from_sudo_env()?),
        values: None,
        ring: None,
    };
    let use_of = |s: MemoryStats| MemoryUse { usage_bytes: s.usage_bytes, limit_bytes: s.limit_bytes };
    let memory: Option<MemorySource> = match (&cgroup, args.pid) {
        (Some(c), _) => {
            let c = c.clone();
            Some(Box::new(move || c.stats().ok().map(use_of)))
        }
        // An attached process shows the limit of whatever cgroup sets one.
        (None, Some(pid)) => LimitingCgroup::of_process(pid).map(|c| -> MemorySource {
            log::info!("top: memory against the limit of cgroup {}", c.path().display());
            Box::new(move || c.stats().ok().map(use_of))
        }),
        (None, None) => None,
    };
    let output = if json {
        Output::Json { once: args.once }
    } else {
        let title = match args.pid {
            Some(pid) => format!("pid {pid}"),
            None => args.command.join(" "),
        };
        Output::Screen(Box::new(Screen::open(title)?))
    };
    let tap = TopTap::new(output, args.interval, memory, args.drop_caches);
    // The screen is restored when the session ends (the tap goes with it),
    // before anything below prints.
    let outcome = session::trace_with_tap(target, &spec, Some(Box::new(tap))).await?;
    if let Some(path) = &args.output {
        traced::print_summary(path, &outcome)?;
    }
    if let Some(mut cgroup) = cgroup.and_then(|c| Arc::try_unwrap(c).ok()) {
        cgroup.remove()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    #[test]
    fn pid_and_command_exclude_each_other_and_mem_limit_needs_a_command() {
        let parse = |args: &[&str]| Cli::try_parse_from(["ttrace", "top"].iter().chain(args));
        assert!(parse(&["--pid", "1", "--", "x"]).is_err());
        assert!(parse(&["--pid", "1", "--mem-limit", "200M"]).is_err());
        let Ok(Cli { command: Command::Top(top), .. }) = parse(&["--json", "--interval", "0.5", "--", "llama-server"])
        else {
            panic!("top with a command parses")
        };
        assert_eq!(top.interval, std::time::Duration::from_millis(500));
        assert_eq!(top.command, ["llama-server"]);
    }
}
