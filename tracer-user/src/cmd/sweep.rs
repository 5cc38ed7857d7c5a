//! `ttrace sweep PLAN.toml -o DIR` and `ttrace sweep report DIR`.

use anyhow::{Context, Result, bail};

use crate::{
    cli::{SweepArgs, SweepCommand, SweepReportArgs},
    export::sweep_html,
    sweep::{report, state::SweepDir},
};

pub fn run(args: SweepArgs) -> Result<()> {
    match args.command {
        Some(SweepCommand::Report(r)) => run_report(r),
        None => run_plan(args),
    }
}

#[cfg(feature = "live")]
fn run_plan(args: SweepArgs) -> Result<()> {
    use crate::{
        live::privileges::require_tracing_privileges,
        live::target::UserSpec,
        sweep::{plan::Plan, runner},
    };
    let (Some(plan_path), Some(dir)) = (args.plan, args.output) else {
        bail!("usage: ttrace sweep PLAN.toml -o DIR (or ttrace sweep report DIR)")
    };
    let plan = Plan::load(&plan_path)?;
    require_tracing_privileges()?;
    let owner = UserSpec::for_run(args.user.as_deref())?.or(UserSpec::from_sudo_env()?);
    let options = runner::Options { dir: dir.clone(), ops: args.ops, retry_failed: args.retry_failed, owner };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let done = runtime.block_on(runner::run(&plan, &options))?;
    eprintln!(
        "ttrace: sweep {}: {} runs done now, {} failed, {} done before (skipped), of {}",
        dir.display(),
        done.ok,
        done.failed,
        done.skipped,
        plan.runs.len()
    );
    if done.interrupted {
        bail!("interrupted; run the same command again to resume (finished runs are kept and skipped)");
    }
    // Like `make -k`: the other runs went on, but a script must see the failure.
    if done.failed > 0 {
        bail!(
            "{} run(s) failed: their errors are in {}/runs/*.json and the runs table; --retry-failed runs them again",
            done.failed,
            dir.display()
        );
    }
    Ok(())
}

#[cfg(not(feature = "live"))]
fn run_plan(_: SweepArgs) -> Result<()> {
    bail!("this ttrace was built without the live feature: it cannot trace; `ttrace sweep report DIR` works")
}

fn run_report(args: SweepReportArgs) -> Result<()> {
    let dir = SweepDir::new(&args.dir);
    let report = report::compare(&dir)?;
    let json = args.json.unwrap_or_else(|| args.dir.join("report.json"));
    let html = args.html.unwrap_or_else(|| args.dir.join("report.html"));
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(&json, text + "\n").with_context(|| format!("writing {}", json.display()))?;
    std::fs::write(&html, sweep_html::render(&report)).with_context(|| format!("writing {}", html.display()))?;
    eprintln!("ttrace: wrote {} and {}", json.display(), html.display());
    print!("{}", sweep_html::text(&report));
    Ok(())
}
