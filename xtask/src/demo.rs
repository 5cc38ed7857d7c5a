//! `cargo xtask demo`: set up, build ttrace, and run the main job.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{cache, setup, shell, targets};

pub fn run() -> Result<()> {
    let paths = setup::run()?;
    let ttrace = build_ttrace()?;
    eprintln!("demo: kernel round trip (`ttrace check`)");
    shell::run(Command::new(&ttrace).arg("check"))?;
    targets::print_paths(&paths)
}

/// Build the release `ttrace` (with its embedded eBPF object) and return its path.
pub fn build_ttrace() -> Result<PathBuf> {
    let root = cache::repo_root();
    shell::run(Command::new("cargo").current_dir(&root).args(["build", "--release", "--quiet", "-p", "tracer-user"]))?;
    Ok(root.join("target/release/ttrace"))
}

/// Write `cargo xtask paths` output to `<cache>/paths.json` for test processes.
pub fn write_paths_file(paths: &setup::Paths) -> Result<PathBuf> {
    let file = paths.cache.join("paths.json");
    let json = paths.to_json();
    std::fs::write(&file, serde_json::to_string_pretty(&json)?).with_context(|| format!("writing {}", file.display()))?;
    Ok(file)
}
