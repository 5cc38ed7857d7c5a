//! The trace file a session creates: given to the user behind sudo, and
//! removed again unless the session keeps it, so a failed start never
//! leaves a header-only file that would only mislead.

use std::{
    fs::File,
    io::BufWriter,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::{
    format::{Header, TraceWriter},
    live::target::UserSpec,
};

pub(super) struct TraceFile {
    path: PathBuf,
    keep: bool,
}

impl TraceFile {
    /// Create `path` (owned by `owner`) and write `header` into it.
    pub fn create(
        path: &Path,
        owner: Option<&UserSpec>,
        header: &Header,
    ) -> Result<(Self, TraceWriter<BufWriter<File>>)> {
        let file = create_owned(path, owner)?;
        let guard = Self { path: path.to_path_buf(), keep: false };
        let writer = TraceWriter::create(file, header)?;
        Ok((guard, writer))
    }

    /// Recording has begun: whatever happens next, the file is the user's.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Nothing was traced after all: the file goes when the guard does.
    pub fn discard(&mut self) {
        self.keep = false;
    }
}

/// `path` created for writing a trace, given to `owner` (the user behind
/// sudo), buffered as the writer wants it.
pub(super) fn create_owned(path: &Path, owner: Option<&UserSpec>) -> Result<BufWriter<File>> {
    let file = File::create(path).with_context(|| format!("creating trace file {}", path.display()))?;
    if let Some(owner) = owner.filter(|_| !is_discard(path)) {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))
            .with_context(|| format!("giving {} to user {}", path.display(), owner.name))?;
    }
    Ok(BufWriter::with_capacity(1 << 20, file))
}

/// `/dev/null`: `top` without `-o` records nowhere; never chowned or removed.
pub fn is_discard(path: &Path) -> bool {
    path == Path::new(DISCARD)
}

pub const DISCARD: &str = "/dev/null";

impl Drop for TraceFile {
    fn drop(&mut self) {
        if !self.keep && !is_discard(&self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
