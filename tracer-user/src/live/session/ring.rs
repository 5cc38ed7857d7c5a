//! `--max-size SIZE [--max-files N]`: the session's trace as a ring of
//! files `OUTPUT.0000`, `OUTPUT.0001`, … (see `format::ring`).

use std::{
    collections::VecDeque,
    fs::File,
    io::{self, BufWriter},
    path::{Path, PathBuf},
};

use super::header::monotonic_ns;
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
    spec: RingSpec,
    /// The current file's ring header; the next ones' differ in index,
    /// lost counters and restated buffers.
    part: RingPart,
    /// The files written and not deleted, oldest first.
    kept: VecDeque<PathBuf>,
}

impl RingFiles {
    /// The ring header of file 0 of a run starting at `start` (unix and
    /// monotonic ns), after removing an earlier recording's files of the
    /// same name (as `-o` replaces a file): they would mix with this run's.
    pub fn start(base: &Path, spec: RingSpec, pid: u32, (unix_ns, monotonic_ns): (u64, u64)) -> io::Result<RingPart> {
        let stale = Members::find(base).map_err(io::Error::other)?;
        for (_, path) in stale.iter().flat_map(|m| &m.files) {
            std::fs::remove_file(path)?;
        }
        match std::fs::remove_file(base) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(RingPart {
            run: format!("{pid}-{unix_ns}"),
            index: 0,
            run_start_monotonic_ns: monotonic_ns,
            run_start_unix_ns: unix_ns,
            max_size: spec.max_size,
            max_files: spec.max_files,
            ..Default::default()
        })
    }

    /// The ring whose file 0 (`part`) is being written.
    pub fn new(base: &Path, owner: Option<UserSpec>, spec: RingSpec, part: RingPart) -> Self {
        let kept = VecDeque::from([member_path(base, 0)]);
        Self { base: base.to_path_buf(), owner, spec, part, kept }
    }
}

impl NextFile<BufWriter<File>> for RingFiles {
    fn max_size(&self) -> u64 {
        self.spec.max_size
    }

    fn open_next(
        &mut self,
        at_ns: u64,
        lost_before: Lost,
        carried_buffers: u32,
    ) -> io::Result<(BufWriter<File>, (u64, u64), RingPart)> {
        let index = self.part.index + 1;
        let path = member_path(&self.base, index);
        let file = File::create(&path)?;
        if let Some(owner) = &self.owner {
            std::os::unix::fs::chown(&path, Some(owner.uid), Some(owner.gid))?;
        }
        self.kept.push_back(path);
        self.part = RingPart { index, lost_before, carried_buffers, ..self.part.clone() };
        // The wall clock at `at_ns`: now, less the time since.
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            .saturating_sub(monotonic_ns().saturating_sub(at_ns));
        Ok((BufWriter::with_capacity(1 << 20, file), (unix_ns, at_ns), self.part.clone()))
    }

    /// Not synced here: an fsync of a whole file would stall the session
    /// (and fill the kernel's ring); the last file is synced at the end.
    fn closed(&mut self, file: BufWriter<File>) -> io::Result<()> {
        file.into_inner().map_err(|e| e.into_error())?;
        let keep = self.spec.max_files.map_or(usize::MAX, |n| n as usize);
        while self.kept.len() > keep {
            if let Some(oldest) = self.kept.pop_front() {
                std::fs::remove_file(&oldest)?;
            }
        }
        Ok(())
    }
}

type NextFiles = Box<dyn NextFile<BufWriter<File>>>;

/// Where the session's first file goes, with `header` given its ring
/// header: OUTPUT itself, or OUTPUT.0000 and the ring's files.
pub(super) fn first_file(
    output: &Path,
    spec: Option<RingSpec>,
    owner: Option<&UserSpec>,
    header: &mut crate::format::Header,
) -> io::Result<(PathBuf, Option<NextFiles>)> {
    let Some(spec) = spec else { return Ok((output.to_path_buf(), None)) };
    let part = RingFiles::start(output, spec, header.pid, (header.start_unix_ns, header.start_monotonic_ns))?;
    header.ring = Some(part.clone());
    let files = RingFiles::new(output, owner.cloned(), spec, part);
    Ok((member_path(output, 0), Some(Box::new(files))))
}
