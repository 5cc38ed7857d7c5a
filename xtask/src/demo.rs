//! `cargo xtask demo`: set up, build ttrace, and run the main job: trace a
//! real, cold-cache llama-completion run of the real model (Gemma 3 270M)
//! and write its report, a Perfetto timeline and an HTML page.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{cache, setup, shell};

pub fn run() -> Result<()> {
    let setup::Demo { completion, gemma: model } = setup::demo()?;
    let ttrace = build_ttrace()?;
    let out_dir = cache::repo_root().join("target/demo");
    std::fs::create_dir_all(&out_dir)?;
    eprintln!("demo: kernel round trip (`ttrace check`)");
    shell::run(Command::new(&ttrace).arg("check"))?;

    let trace = out_dir.join("ttrace.data");
    eprintln!("demo: tracing llama-completion on {}", model.display());
    shell::run(
        Command::new(&ttrace)
            .args(["run", "--drop-caches", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&completion)
            .arg("-m")
            .arg(&model)
            // Gemma's default context (32768) would size a KV cache far bigger than the model.
            .args(["-p", "The three primary colors are", "-n", "32", "-c", "512", "-no-cnv", "--perf", "-t", "2"]),
    )?;
    let report = shell::output(Command::new(&ttrace).arg("report").arg(&trace))?;
    let report_path = out_dir.join("report.txt");
    std::fs::write(&report_path, &report)?;
    let json = shell::output(Command::new(&ttrace).arg("report").arg("--json").arg(&trace))?;
    let json_path = out_dir.join("report.json");
    std::fs::write(&json_path, json)?;
    let timeline = out_dir.join("timeline.pftrace");
    shell::run(Command::new(&ttrace).args(["export", "--format", "perfetto", "-o"]).arg(&timeline).arg(&trace))?;
    let html = out_dir.join("report.html");
    shell::run(Command::new(&ttrace).arg("report").arg(&trace).arg("--html").arg(&html))?;
    println!("{report}");
    println!("demo: trace    {}", trace.display());
    println!("demo: report   {} (and {}, {})", report_path.display(), json_path.display(), html.display());
    println!("demo: timeline {} (open it at ui.perfetto.dev)", timeline.display());
    Ok(())
}

/// Build the release `ttrace` (with its embedded eBPF object) and return its path.
pub fn build_ttrace() -> Result<PathBuf> {
    let root = cache::repo_root();
    shell::run(Command::new("cargo").current_dir(&root).args(["build", "--release", "--quiet", "-p", "tracer-user"]))?;
    Ok(cache::target_dir().join("release/ttrace"))
}

/// Write `cargo xtask paths` output to `<cache>/paths.json` for test processes.
pub fn write_paths_file(paths: &setup::Paths) -> Result<PathBuf> {
    let file = paths.cache.join("paths.json");
    let json = paths.to_json();
    std::fs::write(&file, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(file)
}
