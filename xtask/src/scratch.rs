//! One temporary directory per `cargo xtask test`: every test's scratch
//! files (private model copies, traces, pytest's `tmp_path`) go under it
//! through `TMPDIR`, so a run leaves nothing in /tmp when it passes. A
//! failed run keeps its directory to look at; the next run removes those
//! whose `cargo xtask test` has ended.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

const PREFIX: &str = "ttrace-xtask-test-";

pub struct TestTmp {
    dir: PathBuf,
}

impl TestTmp {
    /// Removes what ended runs left, then makes this run's directory.
    pub fn create() -> Result<TestTmp> {
        let parent = std::env::temp_dir();
        remove_ended_runs(&parent);
        let dir = parent.join(format!("{PREFIX}{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Like /tmp itself: some tests run ttrace or a target as `nobody`.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777))
            .with_context(|| format!("making {} writable by every user", dir.display()))?;
        Ok(TestTmp { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// After a passing run nothing is worth keeping.
    pub fn remove(self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("xtask: could not remove {}: {e}", self.dir.display());
        }
    }
}

/// Directories of `cargo xtask test` runs whose process is gone.
fn remove_ended_runs(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
