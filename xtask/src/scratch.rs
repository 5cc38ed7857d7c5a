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

use anyhow::{Context, Result, bail};

const PREFIX: &str = "ttrace-xtask-test-";
/// Free space a whole run needs on the filesystem of its temporary files
/// and build: a clean clone's run took 18 GB at its peak (release and test
/// builds, model copies, loop images, the kernel matrix's disks). A full
/// disk shows up late and far from its cause: a loop-mounted ext4 test
/// image goes read-only mid-test.
const NEEDED_BYTES: u64 = 20 << 30;

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

/// Before a run builds anything: fails, naming what is short, when the
/// temporary files' or the build's filesystem has less free space than a
/// run needs.
pub fn check_free_space() -> Result<()> {
    remove_ended_runs(&std::env::temp_dir());
    check_free_space_in(&std::env::temp_dir())?;
    check_free_space_in(&crate::cache::repo_root())
}

fn check_free_space_in(dir: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid C string and a buffer of the right type.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", dir.display()));
    }
    // SAFETY: statvfs filled it.
    let stat = unsafe { stat.assume_init() };
    let free = stat.f_bavail * stat.f_frsize;
    if free < NEEDED_BYTES {
        bail!(
            "only {:.1} GB free on the filesystem of {}; the test suite needs {} GiB there (builds, model copies, \
             disk images). Free some space (old `ttrace-xtask-test-*` directories in {} are safe to remove) and \
             run again",
            free as f64 / 1e9,
            dir.display(),
            NEEDED_BYTES >> 30,
            std::env::temp_dir().display()
        );
    }
    Ok(())
}
