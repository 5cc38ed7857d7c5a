//! /proc/PID/maps parsing and address resolution: a virtual address becomes
//! `{file, file_offset}` (`addr - start + pgoff`), then `{tensor,
//! offset_in_tensor, expert}` inside a model file.
//!
//! Parsed by hand rather than with the procfs crate: procfs reads maps as
//! UTF-8 lines (one non-UTF-8 path anywhere fails the whole file), keeps
//! " (deleted)" inside the path, and can panic on malformed `/SYSV` names.

use std::{
    ffi::OsString,
    os::unix::ffi::OsStringExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Serialize;

use super::map::{Index, ModelMap, expert_of};

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    // The cause is in the message, not a `source`, so anyhow prints it once.
    #[error("cannot read /proc/{pid}/maps: {error}")]
    Read { pid: u32, error: std::io::Error },
    #[error("maps line {line}: {what}: {text:?}")]
    Parse { line: usize, what: &'static str, text: String },
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub perms: [u8; 4],
    /// File offset of `start`, in bytes.
    pub pgoff: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// Empty for anonymous memory; `[heap]`, `[stack]`, `[anon:NAME]`... for pseudo mappings.
    pub path: PathBuf,
    /// The path ended in " (deleted)" (which is stripped).
    pub deleted: bool,
}

impl Vma {
    pub fn is_file(&self) -> bool {
        let p = self.path.as_os_str().as_encoded_bytes();
        !p.is_empty() && p[0] != b'['
    }
}

/// Parses the text of a maps file.
pub fn parse_maps(text: &[u8]) -> Result<Vec<Vma>, MapsError> {
    let mut out = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.push(parse_line(line).map_err(|what| MapsError::Parse {
            line: i + 1,
            what,
            text: String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned(),
        })?);
    }
    Ok(out)
}

fn parse_line(line: &[u8]) -> Result<Vma, &'static str> {
    let mut fields = line.splitn(6, |&b| b == b' ');
    let mut next = |what| fields.next().filter(|f| !f.is_empty()).ok_or(what);
    let range = next("no address range")?;
    let perms = next("no permissions")?;
    let offset = next("no offset")?;
    let dev = next("no device")?;
    let inode = next("no inode")?;
    let rest = fields.next().unwrap_or_default();

    let hex = |s: &[u8], what| std::str::from_utf8(s).ok().and_then(|s| u64::from_str_radix(s, 16).ok()).ok_or(what);
    let (start, end) = split2(range, b'-').ok_or("bad address range")?;
    let (start, end) = (hex(start, "bad start address")?, hex(end, "bad end address")?);
    if end < start {
        return Err("end address before start");
    }
    let perms: [u8; 4] = perms.try_into().map_err(|_| "permissions are not 4 characters")?;
    let pgoff = hex(offset, "bad offset")?;
    let (major, minor) = split2(dev, b':').ok_or("bad device")?;
    let dev_major = u32::try_from(hex(major, "bad device major")?).map_err(|_| "bad device major")?;
    let dev_minor = u32::try_from(hex(minor, "bad device minor")?).map_err(|_| "bad device minor")?;
    let inode = std::str::from_utf8(inode).ok().and_then(|s| s.parse().ok()).ok_or("bad inode")?;

    let mut path = rest.trim_ascii_start();
    let deleted = path.ends_with(b" (deleted)");
    if deleted {
        path = &path[..path.len() - b" (deleted)".len()];
    }
    Ok(Vma {
        start,
        end,
        perms,
        pgoff,
        dev_major,
        dev_minor,
        inode,
        path: PathBuf::from(OsString::from_vec(unescape_newlines(path))),
        deleted,
    })
}

fn split2(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((&s[..i], &s[i + 1..]))
}

/// The kernel prints a newline in a path as `\012`.
fn unescape_newlines(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i..].starts_with(b"\\012") {
            out.push(b'\n');
            i += 4;
        } else {
            out.push(path[i]);
            i += 1;
        }
    }
    out
}

/// Reads /proc/PID/maps until two reads agree: the file is produced in chunks,
/// so a read that races with mmap/munmap can be torn.
pub fn read_maps(pid: u32) -> Result<Vec<u8>, MapsError> {
    let path = format!("/proc/{pid}/maps");
    let read = || std::fs::read(&path).map_err(|error| MapsError::Read { pid, error });
    let mut prev = read()?;
    for _ in 0..4 {
        let next = read()?;
        if next == prev {
            break;
        }
        prev = next;
    }
    Ok(prev)
}

/// Where a virtual address points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "class", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Inside a mapping of a GGUF file of `models[model]`.
    ModelFile {
        model: u32,
        file: u32,
        file_offset: u64,
        tensor: Option<TensorHit>,
    },
    /// Heap, stack or anonymous memory: KV cache, compute buffers, repacked or copied weights.
    Anon {
        region_start: u64,
    },
    /// Inside a mapping of another file (`AddressSpace::name(path)`).
    OtherFile {
        path: u32,
        file_offset: u64,
    },
    Unmapped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorHit {
    /// Index into the model's `tensors()`.
    pub tensor: u32,
    pub offset_in_tensor: u64,
    pub expert: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemoryClass {
    ModelFile,
    Anon,
    OtherFile,
    Unmapped,
}

impl Resolution {
    pub fn class(&self) -> MemoryClass {
        match self {
            Resolution::ModelFile { .. } => MemoryClass::ModelFile,
            Resolution::Anon { .. } => MemoryClass::Anon,
            Resolution::OtherFile { .. } => MemoryClass::OtherFile,
            Resolution::Unmapped => MemoryClass::Unmapped,
        }
    }
}

/// A tensor identified for a pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorRef {
    pub model: u32,
    pub tensor: u32,
    /// Known only when the pointer is inside the model's mapping.
    pub offset_in_tensor: Option<u64>,
    pub expert: Option<u32>,
    /// The data is a copy (repacked, or loaded without mmap), found by name.
    pub copy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    Model {
        model: u32,
        file: u32,
    },
    /// `name` indexes `AddressSpace::name` for labelled regions such as `[heap]`.
    Anon {
        name: Option<u32>,
    },
    File {
        name: u32,
        deleted: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    pub kind: RegionKind,
}

/// A snapshot of a process's mappings, ready for fast lookups (binary search,
/// no allocation per lookup). Take a new snapshot when the maps change.
#[derive(Debug, Clone)]
pub struct AddressSpace {
    regions: Vec<Region>,
    names: Vec<PathBuf>,
    models: Vec<Arc<Index>>,
}

/// How a model file is recognised in maps: by device and inode, or by path.
struct FileKey {
    model: u32,
    file: u32,
    dev: Option<(u32, u32)>,
    ino: u64,
    paths: Vec<PathBuf>,
}

impl AddressSpace {
    pub fn from_pid(pid: u32, models: &[ModelMap]) -> Result<AddressSpace, MapsError> {
        Self::from_maps_text(&read_maps(pid)?, models)
    }

    pub fn from_maps_text(text: &[u8], models: &[ModelMap]) -> Result<AddressSpace, MapsError> {
        Ok(Self::from_vmas(parse_maps(text)?, models))
    }

    pub fn from_vmas(mut vmas: Vec<Vma>, models: &[ModelMap]) -> AddressSpace {
        let keys: Vec<FileKey> = models
            .iter()
            .enumerate()
            .flat_map(|(m, model)| {
                model.files().iter().enumerate().map(move |(f, file)| {
                    let paths: Vec<PathBuf> =
                        [Some(&file.path), file.canonical.as_ref()].into_iter().flatten().cloned().collect();
                    let dev = (file.ino != 0).then(|| (libc::major(file.dev), libc::minor(file.dev)));
                    FileKey { model: m as u32, file: f as u32, dev, ino: file.ino, paths }
                })
            })
            .collect();

        vmas.sort_by_key(|v| (v.start, v.end));
        let mut regions: Vec<Region> = Vec::with_capacity(vmas.len());
        let mut names: Vec<PathBuf> = Vec::new();
        for v in vmas {
            // A torn read can repeat or overlap entries; keep the first.
            if v.start == v.end || regions.last().is_some_and(|r| v.start < r.end) {
                continue;
            }
            let kind = if v.is_file() {
                let hit = keys.iter().find(|k| {
                    k.dev.is_some_and(|d| d == (v.dev_major, v.dev_minor) && k.ino == v.inode)
                        || (k.dev.is_none() || v.inode == 0) && k.paths.contains(&v.path)
                });
                match hit {
                    Some(k) => RegionKind::Model { model: k.model, file: k.file },
                    None => RegionKind::File { name: intern(&mut names, v.path), deleted: v.deleted },
                }
            } else if v.path.as_os_str().is_empty() {
                RegionKind::Anon { name: None }
            } else {
                RegionKind::Anon { name: Some(intern(&mut names, v.path)) }
            };
            regions.push(Region { start: v.start, end: v.end, pgoff: v.pgoff, kind });
        }
        AddressSpace { regions, names, models: models.iter().map(|m| m.index.clone()).collect() }
    }

    /// Keep `previous`'s model mappings where this snapshot maps nothing.
    /// Events are resolved after they happen: a target that unmaps its model
    /// (exiting, or unloading) still has ops, faults and reads of it in the
    /// ring, which must resolve to the model, not to nothing (then, by name,
    /// to a copy). A new mapping at the same addresses wins.
    pub fn keep_unmapped_models(&mut self, previous: &AddressSpace) {
        let gone: Vec<Region> = previous
            .regions
            .iter()
            .filter(|r| matches!(r.kind, RegionKind::Model { .. }))
            .filter(|r| !self.regions.iter().any(|n| n.start < r.end && r.start < n.end))
            .copied()
            .collect();
        if !gone.is_empty() {
            self.regions.extend(gone);
            self.regions.sort_by_key(|r| r.start);
        }
    }

    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Path or label number `i` (from `Resolution::OtherFile` or `RegionKind`).
    pub fn name(&self, i: u32) -> Option<&Path> {
        self.names.get(i as usize).map(PathBuf::as_path)
    }

    pub fn region_of(&self, addr: u64) -> Option<&Region> {
        let i = self.regions.partition_point(|r| r.start <= addr).checked_sub(1)?;
        let r = &self.regions[i];
        (addr < r.end).then_some(r)
    }

    pub fn resolve(&self, addr: u64) -> Resolution {
        let Some(r) = self.region_of(addr) else { return Resolution::Unmapped };
        let file_offset = (addr - r.start).wrapping_add(r.pgoff);
        match r.kind {
            RegionKind::Model { model, file } => {
                let tensor = self.models[model as usize].at(file as usize, file_offset).map(|(span, off)| TensorHit {
                    tensor: span.tensor,
                    offset_in_tensor: off,
                    expert: expert_of(span.expert_bytes, off),
                });
                Resolution::ModelFile { model, file, file_offset, tensor }
            }
            RegionKind::Anon { .. } => Resolution::Anon { region_start: r.start },
            RegionKind::File { name, .. } => Resolution::OtherFile { path: name, file_offset },
        }
    }

    /// The tensor behind a ggml tensor's `data` pointer: by address when it
    /// points into a model mapping, else by `name` as a copy (repacked weights,
    /// `--load-mode none`), searching the models in order.
    pub fn tensor_for(&self, addr: u64, name: &str) -> Option<TensorRef> {
        if let Resolution::ModelFile { model, tensor: Some(hit), .. } = self.resolve(addr) {
            return Some(TensorRef {
                model,
                tensor: hit.tensor,
                offset_in_tensor: Some(hit.offset_in_tensor),
                expert: hit.expert,
                copy: false,
            });
        }
        self.models.iter().enumerate().find_map(|(m, index)| {
            let tensor = *index.by_name.get(name)?;
            Some(TensorRef { model: m as u32, tensor, offset_in_tensor: None, expert: None, copy: true })
        })
    }
}

fn intern(names: &mut Vec<PathBuf>, path: PathBuf) -> u32 {
    match names.iter().position(|n| *n == path) {
        Some(i) => i as u32,
        None => {
            names.push(path);
            (names.len() - 1) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spaces_deleted_and_anon() {
        let text = b"00400000-00452000 r-xp 00000000 fe:00 173521                     /usr/bin/a b\n\
7f0000000000-7f0000001000 r--s 00002000 fe:00 42   /tmp/m 1.gguf (deleted)\n\
7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n\
7f0000004000-7f0000005000 r--p 00000000 fe:00 7  /tmp/new\\012line\n";
        let v = parse_maps(text).unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(v[0].path, Path::new("/usr/bin/a b"));
        assert!(v[1].deleted && v[1].path == Path::new("/tmp/m 1.gguf") && v[1].pgoff == 0x2000);
        assert_eq!((v[1].dev_major, v[1].dev_minor, v[1].inode), (0xfe, 0, 42));
        assert!(!v[2].is_file() && v[2].path.as_os_str().is_empty());
        assert!(!v[3].is_file());
        assert_eq!(v[4].path, Path::new("/tmp/new\nline"));
    }

    #[test]
    fn bad_lines_are_errors() {
        for bad in [&b"zz-10 r--p 0 00:00 0"[..], b"10-20 r--p", b"20-10 r--p 0 00:00 0", b"10-20 r-p 0 00:00 0 x"] {
            assert!(parse_maps(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn classes_without_models() {
        let text = b"1000-3000 r--p 00001000 fe:00 5 /lib/x.so\n4000-5000 rw-p 00000000 00:00 0 [heap]\n\
4800-4900 rw-p 00000000 00:00 0\n";
        let s = AddressSpace::from_maps_text(text, &[]).unwrap();
        assert_eq!(s.resolve(0x1800), Resolution::OtherFile { path: 0, file_offset: 0x1800 });
        assert_eq!(s.resolve(0x4100), Resolution::Anon { region_start: 0x4000 });
        assert_eq!(s.resolve(0x3000), Resolution::Unmapped);
        assert_eq!(s.resolve(0), Resolution::Unmapped);
        assert_eq!(s.resolve(u64::MAX), Resolution::Unmapped);
        // The overlapping (torn) entry was dropped.
        assert_eq!(s.regions().len(), 2);
        assert_eq!(s.name(0), Some(Path::new("/lib/x.so")));
    }
}
