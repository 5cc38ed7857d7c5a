//! The index on disk (issue 42): what `view` builds from a trace, saved
//! beside it (`TRACE.ttidx`), or under `~/.cache/ttrace/index/` when the
//! trace's directory is not writable, and memory-mapped by the next open
//! instead of reading the trace again.
//!
//! Layout: a fixed [`Header`] in the first [`BODY`] bytes, then the column
//! area (each column 64-byte aligned, little-endian, see [`column`]), then
//! the postcard-encoded tree of everything else, whose [`column::Column`]s
//! point into the column area. The header ties the index to one state of
//! the trace (its size, mtime, and a hash of its first and last bytes, where
//! its header and trailer are) and carries a hash of the rest of the index,
//! checked at every open: an index that does not match is rebuilt, never
//! trusted.

pub mod column;

use std::{
    fs::File,
    io::{BufWriter, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::UNIX_EPOCH,
};

use bytemuck::{Pod, Zeroable};
use memmap2::Mmap;
use serde::{Serialize, de::DeserializeOwned};

/// Bumped whenever anything serialised into the index changes shape.
pub const VERSION: u32 = 1;
const MAGIC: [u8; 8] = *b"TTRACEIX";
/// The header's room: the column area starts here.
const BODY: u64 = 4096;
/// Bytes of the trace's start and end hashed into its identity.
const EDGE: u64 = 1 << 16;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Header {
    magic: [u8; 8],
    version: u32,
    /// 1: the values are little-endian (the only kind written).
    little_endian: u32,
    trace: Identity,
    tree_offset: u64,
    tree_len: u64,
    /// blake3 of the index from [`BODY`] on.
    body_hash: [u8; 32],
    /// blake3 of this header with this field zeroed.
    header_hash: [u8; 32],
}

/// One state of a trace file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Identity {
    pub size: u64,
    pub mtime_s: u64,
    pub mtime_ns: u64,
    /// blake3 of its first and last [`EDGE`] bytes.
    pub edges: [u8; 32],
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("cannot read {path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("it is no ttrace index")]
    NotAnIndex,
    #[error("it is of index version {found}, and this ttrace reads version {VERSION}")]
    Version { found: u32 },
    #[error("it was made for the trace as it was before (size, modification time or contents differ)")]
    OtherTrace,
    #[error("it is damaged ({0})")]
    Corrupt(String),
}

impl Identity {
    /// The state of `trace` now.
    pub fn of(trace: &Path) -> Result<Identity, IndexError> {
        let io = |error| IndexError::Io { path: trace.to_path_buf(), error };
        let mut f = File::open(trace).map_err(io)?;
        let meta = f.metadata().map_err(io)?;
        let mtime = meta.modified().map_err(io)?.duration_since(UNIX_EPOCH).unwrap_or_default();
        let size = meta.len();
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; EDGE.min(size) as usize];
        f.read_exact(&mut buf).map_err(io)?;
        h.update(&buf);
        let tail = size.saturating_sub(EDGE).max(buf.len() as u64);
        buf.resize((size - tail) as usize, 0);
        f.seek(SeekFrom::Start(tail)).map_err(io)?;
        f.read_exact(&mut buf).map_err(io)?;
        h.update(&buf);
        Ok(Identity { size, mtime_s: mtime.as_secs(), mtime_ns: u64::from(mtime.subsec_nanos()), edges: *h.finalize().as_bytes() })
    }
}

/// Where the index of `trace` is kept: beside it, and the cache's place for
/// a trace whose directory is not writable.
pub fn places(trace: &Path) -> [PathBuf; 2] {
    let mut beside = trace.as_os_str().to_owned();
    beside.push(".ttidx");
    let canonical = trace.canonicalize().unwrap_or_else(|_| trace.to_path_buf());
    let key = blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex();
    [PathBuf::from(beside), cache_dir().join(format!("{}.ttidx", &key[..32]))]
}

fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("ttrace").join("index")
}

/// The index at `path`, if it is one of `trace` as it is now.
pub fn open<T: DeserializeOwned>(path: &Path, trace: &Identity) -> Result<T, IndexError> {
    let io = |error| IndexError::Io { path: path.to_path_buf(), error };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the mapping is read-only; an index is replaced by renaming a
    // new file over it, never written in place, so it does not change under
    // us (an outside program truncating it would be caught as SIGBUS, not
    // as a wrong number).
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    let header: Header = map
        .get(..std::mem::size_of::<Header>())
        .map(bytemuck::pod_read_unaligned)
        .filter(|h: &Header| h.magic == MAGIC)
        .ok_or(IndexError::NotAnIndex)?;
    if header.version != VERSION || header.little_endian != 1 {
        return Err(IndexError::Version { found: header.version });
    }
    if header.header_hash != header_hash(&header) {
        return Err(IndexError::Corrupt("its header does not match its hash".into()));
    }
    if header.trace != *trace {
        return Err(IndexError::OtherTrace);
    }
    let body = map.get(BODY as usize..).ok_or_else(|| IndexError::Corrupt("it ends in its header".into()))?;
    if hash_body(body) != header.body_hash {
        return Err(IndexError::Corrupt("its contents do not match their hash".into()));
    }
    let tree = usize::try_from(header.tree_offset)
        .ok()
        .zip(usize::try_from(header.tree_len).ok())
        .and_then(|(a, n)| map.get(a..a.checked_add(n)?))
        .ok_or_else(|| IndexError::Corrupt("its table of contents is outside it".into()))?;
    column::with_source(&map, || postcard::from_bytes(tree)).map_err(|e| IndexError::Corrupt(e.to_string()))
}

/// Writes `value` as the index of `trace` (as it was when read) at `path`:
/// into a new file renamed over the old one, so that no reader ever sees a
/// half-written index.
pub fn write<T: Serialize>(path: &Path, trace: &Identity, value: &T) -> Result<(), IndexError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |error| IndexError::Io { path: path.to_path_buf(), error };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp = tempfile_in(dir, path).map_err(io)?;
    let written = write_to(&mut tmp.1, trace, value);
    let done = written.and_then(|()| tmp.1.sync_all().map_err(io)).and_then(|()| std::fs::rename(&tmp.0, path).map_err(io));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp.0);
    }
    done
}

fn tempfile_in(dir: &Path, path: &Path) -> std::io::Result<(PathBuf, File)> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    Ok((tmp.clone(), File::options().read(true).write(true).create(true).truncate(true).open(&tmp)?))
}

fn write_to<T: Serialize>(file: &mut File, trace: &Identity, value: &T) -> Result<(), IndexError> {
    let io = |error| IndexError::Io { path: PathBuf::from("the new index"), error };
    file.seek(SeekFrom::Start(BODY)).map_err(io)?;
    let out = BufWriter::with_capacity(1 << 20, file.try_clone().map_err(io)?);
    let (tree, sink) = column::with_sink(column::Sink { out: Box::new(out), pos: BODY }, || postcard::to_allocvec(value));
    let tree = tree.map_err(|e| IndexError::Corrupt(format!("cannot serialise: {e}")))?;
    let column::Sink { mut out, pos } = sink.ok_or_else(|| IndexError::Corrupt("the column sink went missing".into()))?;
    out.write_all(&tree).map_err(io)?;
    out.flush().map_err(io)?;
    drop(out);
    // SAFETY: our own new file, mapped read-only to hash it.
    let map = unsafe { Mmap::map(&*file) }.map_err(io)?;
    let mut header = Header {
        magic: MAGIC,
        version: VERSION,
        little_endian: u32::from(cfg!(target_endian = "little")),
        trace: *trace,
        tree_offset: pos,
        tree_len: tree.len() as u64,
        body_hash: hash_body(&map[BODY as usize..]),
        header_hash: [0; 32],
    };
    header.header_hash = header_hash(&header);
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(bytemuck::bytes_of(&header)).map_err(io)
}

fn header_hash(h: &Header) -> [u8; 32] {
    let mut h = *h;
    h.header_hash = [0; 32];
    *blake3::hash(bytemuck::bytes_of(&h)).as_bytes()
}

/// blake3 of the two halves on two threads, then of the two hashes: the
/// check costs half the time on the machines `view` runs on.
fn hash_body(body: &[u8]) -> [u8; 32] {
    let (a, b) = body.split_at(body.len() / 2);
    let (ha, hb) = std::thread::scope(|s| {
        let ha = s.spawn(|| blake3::hash(a));
        (ha.join(), blake3::hash(b))
    });
    let mut h = blake3::Hasher::new();
    h.update(ha.map(|h| *h.as_bytes()).unwrap_or_default().as_slice());
    h.update(hb.as_bytes());
    *h.finalize().as_bytes()
}
