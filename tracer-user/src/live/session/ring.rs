//! `--max-size SIZE [--max-files N]`: the session's trace as a ring of
//! files `OUTPUT.0000`, `OUTPUT.0001`, … (see `format::ring`).

use std::{
    fs::File,
    io::{self, BufWriter},
    path::{Path, PathBuf},
};

use super::{
    header::{monotonic_ns, unix_ns},
    trace_file::{DISCARD, create_owned, is_discard},
};
use crate::{
    format::{
        Lost,
        ring::{Members, RingPart, member_path},
    },
    live::{recorder::NextFile, target::UserSpec},
};

/// `--max-size` and `--max-files`.
#[derive(Clone, Copy, Debug)]
pub struct RingSpec {
    pub max_size: u64,
    pub max_files: Option<u32>,
}

pub(super) struct RingFiles {
    base: PathBuf,
    owner: Option<UserSpec>,
    /// The current file's ring header (with `--max-size` and
    /// `--max-files`); the next ones' differ in index, lost counters and
    /// restated buffers.
    part: RingPart,
}

impl NextFile<BufWriter<File>> for RingFiles {
    fn max_size(&self) -> u64 {
        self.part.max_size
    }

    fn open_next(
        &mut self,
        at_ns: u64,
        lost_before: Lost,
        carried_buffers: u32,
    ) -> io::Result<(BufWriter<File>, (u64, u64), RingPart)> {
        let index = self.part.index + 1;
        let file = create_owned(&member_path(&self.base, index), self.owner.as_ref()).map_err(io::Error::other)?;
        self.part = RingPart { index, lost_before, carried_buffers, ..self.part.clone() };
        // The wall clock at `at_ns`: now, less the time since.
        let unix_ns = unix_ns().saturating_sub(monotonic_ns().saturating_sub(at_ns));
        Ok((file, (unix_ns, at_ns), self.part.clone()))
    }

    /// Not synced here: an fsync of a whole file would stall the session
    /// (and fill the kernel's ring); the last file is synced at the end.
    /// With `--max-files N`, the file N before the current one goes: the
    /// ring keeps the newest N.
    fn closed(&mut self, file: BufWriter<File>) -> io::Result<()> {
        file.into_inner().map_err(|e| e.into_error())?;
        if let Some(n) = self.part.max_files
            && self.part.index >= n
        {
            std::fs::remove_file(member_path(&self.base, self.part.index - n))?;
        }
        Ok(())
    }
}

type NextFiles = Box<dyn NextFile<BufWriter<File>>>;

/// Where the session's first file goes, with `header` given its ring
/// header: OUTPUT itself, or OUTPUT.0000 and the ring's files. An earlier
/// recording's files of the same name are removed first (as `-o` replaces
/// a file): they would mix with this run's.
pub(super) fn first_file(
    output: &Path,
    spec: Option<RingSpec>,
    owner: Option<&UserSpec>,
    header: &mut crate::format::Header,
) -> io::Result<(PathBuf, Option<NextFiles>)> {
    let Some(spec) = spec else { return Ok((output.to_path_buf(), None)) };
    if is_discard(output) {
        return Err(io::Error::other(format!(
            "--max-size writes files named after -o, and {DISCARD} is none: give -o a file name"
        )));
    }
    let stale = Members::find(output).map_err(io::Error::other)?;
    for (_, path) in stale.iter().flat_map(|m| &m.files) {
        std::fs::remove_file(path)?;
    }
    match std::fs::remove_file(output) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let part = RingPart {
        run: format!("{}-{}", header.pid, header.start_unix_ns),
        index: 0,
        run_start_monotonic_ns: header.start_monotonic_ns,
        run_start_unix_ns: header.start_unix_ns,
        max_size: spec.max_size,
        max_files: spec.max_files,
        ..Default::default()
    };
    header.ring = Some(part.clone());
    let files = RingFiles { base: output.to_path_buf(), owner: owner.cloned(), part };
    Ok((member_path(output, 0), Some(Box::new(files))))
}
