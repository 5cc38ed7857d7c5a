//! The web front end of `ttrace view` (viewer/): `npm ci` from the committed
//! lockfile, then `npm run build` (type check, esbuild) into viewer/dist,
//! which tracer-user/build.rs embeds into the binary. A stamp of the
//! lockfile and of the sources, kept in node_modules (per checkout, ignored
//! by git), skips both when nothing changed.

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cache, shell};

const STAMP: &str = "node_modules/.ttrace-viewer-stamp";

/// Builds viewer/dist when its sources or lockfile changed; says what it did.
pub fn ensure() -> Result<String> {
    let dir = cache::repo_root().join("viewer");
    let lock = hash_files(&dir, &[dir.join("package.json"), dir.join("package-lock.json")])?;
    let sources = hash_files(&dir, &source_files(&dir)?)?;
    let stamp = std::fs::read_to_string(dir.join(STAMP)).unwrap_or_default();
    let (old_lock, old_sources) = stamp.split_once(' ').unwrap_or(("", ""));
    let installed = dir.join("node_modules").is_dir() && old_lock == lock;
    if installed && old_sources == sources && dir.join("dist/index.html").is_file() {
        return Ok("ok (built)".into());
    }
    for tool in ["node", "npm"] {
        if !shell::succeeds(Command::new(tool).arg("--version")) {
            bail!(
                "`{tool}` is not installed; the viewer needs Node.js 20 or later with npm (Debian: `apt-get install nodejs npm`)"
            );
        }
    }
    if !installed {
        shell::run(npm(&dir).args(["ci", "--no-audit", "--no-fund"]))?;
    }
    shell::run(npm(&dir).args(["run", "build"]))?;
    std::fs::write(dir.join(STAMP), format!("{lock} {sources}")).context("writing the viewer build stamp")?;
    Ok(if installed { "built viewer/dist".into() } else { "installed its npm packages and built viewer/dist".into() })
}

fn npm(dir: &Path) -> Command {
    let mut cmd = Command::new("npm");
    // Its progress goes to stderr, so `cargo xtask paths > paths.json` stays JSON.
    cmd.current_dir(dir).env("npm_config_update_notifier", "false").stdout(std::io::stderr());
    cmd
}

/// Every file that shapes the build: all of viewer/ but node_modules and dist.
fn source_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if d == dir && (name == "node_modules" || name == "dist") {
                continue;
            }
            if path.is_dir() {
                todo.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// A hash of the files' paths (relative to `dir`) and contents. Only compared
/// with the previous run's on the same machine, so std's hasher suffices.
/// A stamp of `files` (their paths below `dir` and contents).
pub fn hash_files(dir: &Path, files: &[PathBuf]) -> Result<String> {
    let mut h = DefaultHasher::new();
    for f in files {
        f.strip_prefix(dir).unwrap_or(f).hash(&mut h);
        std::fs::read(f).with_context(|| format!("reading {}", f.display()))?.hash(&mut h);
    }
    Ok(format!("{:016x}", h.finish()))
}
