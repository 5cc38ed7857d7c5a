//! A ring of trace files (`--max-size SIZE [--max-files N]`): one run
//! written as `BASE.0000`, `BASE.0001`, … Each member is a whole trace
//! (header, its own interned ids, trailer) readable alone; its header's
//! [`RingPart`] places it in its run. Readers given `BASE` open the members
//! present as one run ([`Members::find`]), and say when the oldest were
//! deleted ([`RingRead::missing`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::frames::Lost;

/// Where one file sits in its ring (`Header::ring`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingPart {
    /// Shared by every file of one run, and by no other run's.
    pub run: String,
    /// The file's place in the run, from 0 (its name's suffix).
    pub index: u32,
    /// When the run (its file 0) began; the file's own start is the header's.
    pub run_start_monotonic_ns: u64,
    pub run_start_unix_ns: u64,
    /// `--max-size` and `--max-files` of the recording.
    pub max_size: u64,
    pub max_files: Option<u32>,
    /// The kernel's lost-event counters when the file began (read at the
    /// session's last tick before it): LOST frames count from the run's
    /// start, so a reader starting here subtracts these.
    pub lost_before: Lost,
    /// The BUFFER frames that open the file restate the backend buffers
    /// alive when it began (so it reads alone); they are no new events, and
    /// a reader that has read the file before skips them.
    pub carried_buffers: u32,
}

/// What a reader of a ring read: filled in by the reader, never written.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingRead {
    /// The indices of the first and last file read.
    pub first_index: u32,
    pub last_index: u32,
    /// Files of the run deleted before the first read one (`--max-files`),
    /// or not opened (a member given alone): the run's start until then is
    /// not in what was read.
    pub missing: Option<Missing>,
}

/// The part of a run before the first file read.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Missing {
    pub files: u32,
    /// The run's start and the first read file's, on the trace's clock.
    pub from_ns: u64,
    pub to_ns: u64,
}

impl RingRead {
    /// The first file read, from its ring header.
    pub fn starting(part: &RingPart, file_start_ns: u64) -> Self {
        let missing = (part.index > 0).then_some(Missing {
            files: part.index,
            from_ns: part.run_start_monotonic_ns,
            to_ns: file_start_ns,
        });
        Self { first_index: part.index, last_index: part.index, missing }
    }
}

impl std::fmt::Display for RingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "files {:04} to {:04} of a ring", self.first_index, self.last_index)?;
        if let Some(m) = &self.missing {
            let seconds = m.to_ns.saturating_sub(m.from_ns) as f64 / 1e9;
            write!(
                f,
                "; PARTIAL: files {:04} to {:04} are not read (deleted by --max-files, or a member opened alone), \
                 so the run's first {seconds:.3} s are missing and every total covers the files read only",
                0,
                m.files - 1
            )?;
        }
        Ok(())
    }
}

/// Graph ids as the current file numbers them: the recorder numbers its
/// definitions once per run, a file's GRAPH frames count from 0. A file of
/// a ring opens with the definitions still in use restated ("carried"),
/// then the run's new ones follow in order. Holds only the carried ids.
#[derive(Debug, Default)]
pub struct GraphIds {
    carried: Vec<u32>,
    /// The run's next new definition, and how many new ones this file has.
    next_new: u32,
    new_in_file: u32,
    /// A file before this one: the ids are no longer the recorder's.
    restarted: bool,
}

impl GraphIds {
    /// The file's id for the run's definition `run`, written now.
    pub fn define(&mut self, run: u32) -> std::io::Result<u32> {
        let id = self.carried.len() as u32 + self.new_in_file;
        if run < self.next_new && self.new_in_file == 0 && !self.carried.contains(&run) {
            self.carried.push(run);
        } else if run == self.next_new {
            self.next_new += 1;
            self.new_in_file += 1;
        } else {
            return Err(std::io::Error::other(format!(
                "graph {run} defined out of order (the next new one is {})",
                self.next_new
            )));
        }
        Ok(id)
    }

    /// The file's id for the run's definition `run`; an error if it is not
    /// defined in this file (the first file's ids are the recorder's).
    pub fn file_id(&self, run: u32) -> std::io::Result<u32> {
        // Every COMPUTE and VALUE frame asks: the first file's ids are the run's.
        if !self.restarted {
            return Ok(run);
        }
        let first_new = self.next_new - self.new_in_file;
        match self.carried.iter().position(|&r| r == run) {
            Some(at) => Ok(at as u32),
            None if (first_new..self.next_new).contains(&run) => Ok(self.carried.len() as u32 + run - first_new),
            None if !self.restarted => Ok(run),
            None => Err(std::io::Error::other(format!("graph {run} is not defined in this file"))),
        }
    }

    /// A new file: nothing is defined in it yet.
    pub fn restart(&mut self) {
        self.carried.clear();
        self.new_in_file = 0;
        self.restarted = true;
    }
}

/// The name of file `index` of the ring written as `base`.
pub fn member_path(base: &Path, index: u32) -> PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".{index:04}"));
    PathBuf::from(name)
}

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("cannot list {dir} for the files of the ring {base}: {error}")]
    List { dir: String, base: String, error: std::io::Error },
    #[error(
        "the ring {base} misses {missing} between {before} and {after}: a file in the middle of a run cannot be \
         left out (restore it, or open the members after the gap alone)"
    )]
    Gap { base: String, missing: String, before: String, after: String },
    #[error(
        "{path} is not of the same run as {first} (run {found} vs {expected}): the ring {base} mixes files of two \
         recordings; move one recording's files away"
    )]
    MixedRuns { path: String, first: String, base: String, found: String, expected: String },
    #[error("{path} has no ring header (it was not written with --max-size), yet is named as a member of {base}")]
    NotMember { path: String, base: String },
    #[error("{path} says it is file {found} of its ring, but is named as file {expected}; was it renamed?")]
    Renamed { path: String, found: u32, expected: u32 },
    #[error(
        "{path} ends without its END frame (the recording was cut short there), yet {next} follows it: the files \
         are not one recording"
    )]
    CutShort { path: String, next: String },
}

/// The members of the ring written as `base` that exist, oldest first.
#[derive(Debug)]
pub struct Members {
    pub base: PathBuf,
    pub files: Vec<(u32, PathBuf)>,
}

impl Members {
    /// `None` when no file is named `base.NNNN`; an error when one in the
    /// middle is missing.
    pub fn find(base: &Path) -> Result<Option<Members>, RingError> {
        let dir = match base.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let Some(stem) = base.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
        let listing = match std::fs::read_dir(dir) {
            Ok(listing) => listing,
            // No directory, no ring: the caller's "no such file" says it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(RingError::List {
                    dir: dir.display().to_string(),
                    base: base.display().to_string(),
                    error,
                });
            }
        };
        let mut files: Vec<(u32, PathBuf)> = listing
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name();
                let suffix = name.to_str()?.strip_prefix(stem)?.strip_prefix('.')?;
                let digits = suffix.len() >= 4 && suffix.bytes().all(|b| b.is_ascii_digit());
                digits.then(|| suffix.parse().ok()).flatten().map(|i| (i, member_path(base, i)))
            })
            .collect();
        files.sort();
        if let Some(pair) = files.windows(2).find(|w| w[1].0 != w[0].0 + 1) {
            let (before, after) = (pair[0].0, pair[1].0);
            let missing = if after - before == 2 {
                member_path(base, before + 1).display().to_string()
            } else {
                format!("{} to {}", member_path(base, before + 1).display(), member_path(base, after - 1).display())
            };
            return Err(RingError::Gap {
                base: base.display().to_string(),
                missing,
                before: pair[0].1.display().to_string(),
                after: pair[1].1.display().to_string(),
            });
        }
        Ok((!files.is_empty()).then(|| Members { base: base.to_path_buf(), files }))
    }

    /// The members' bytes in all.
    pub fn total_bytes(&self) -> std::io::Result<u64> {
        self.files.iter().map(|(_, p)| std::fs::metadata(p).map(|m| m.len())).sum()
    }
}

/// A trace's size: the file's, or a ring's members' when only they exist.
pub fn trace_bytes(path: &Path) -> std::io::Result<u64> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match Members::find(path) {
            Ok(Some(members)) => members.total_bytes(),
            _ => Err(e),
        },
        other => other.map(|m| m.len()),
    }
}

/// An empty directory of its own for a test.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ttrace-ring-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_found_in_order_and_a_gap_is_refused() {
        let dir = scratch_dir("members");
        let base = dir.join("t.data");
        assert!(Members::find(&base).unwrap().is_none());
        for i in [3, 2, 4] {
            std::fs::write(member_path(&base, i), b"x").unwrap();
        }
        // Not members: another base, a suffix too short, not digits.
        for other in ["t.data2.0001", "t.data.01", "t.data.00a1", "t.datum.0001"] {
            std::fs::write(dir.join(other), b"x").unwrap();
        }
        let found = Members::find(&base).unwrap().unwrap();
        assert_eq!(found.files.iter().map(|f| f.0).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(found.files[0].1, dir.join("t.data.0002"));
        assert_eq!(trace_bytes(&base).unwrap(), 3);
        std::fs::remove_file(member_path(&base, 3)).unwrap();
        let err = Members::find(&base).unwrap_err().to_string();
        assert!(err.contains("t.data.0003 between") && err.contains("t.data.0004"), "{err}");
    }
}
