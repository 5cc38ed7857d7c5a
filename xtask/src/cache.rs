//! Where set-up keeps what it installs: outside the repo, so clean clones and
//! CI runs on the same machine reuse it.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// `$TTRACE_CACHE`, else `$XDG_CACHE_HOME/ttrace`, else `~/.cache/ttrace`.
pub fn dir() -> Result<PathBuf> {
    let dir = if let Some(dir) = std::env::var_os("TTRACE_CACHE") {
        PathBuf::from(dir)
    } else if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(xdg).join("ttrace")
    } else {
        let home = std::env::var_os("HOME").context("neither TTRACE_CACHE nor HOME is set")?;
        PathBuf::from(home).join(".cache/ttrace")
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating cache dir {}", dir.display()))?;
    Ok(dir)
}

/// The repository root (xtask lives one level below it).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent dir").to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` moves it.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}
