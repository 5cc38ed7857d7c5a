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
//! checked at the first open after each boot: an index that does not match
//! is rebuilt, never trusted. Within the boot that wrote it, the page cache
//! holds what was written (a killed writer loses no written page; only a
//! crash of the machine can, and that is a new boot), so the check, which
//! reads the whole index (8 s for 3 GB from this disk), is skipped.

pub mod analysis;
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
pub const VERSION: u32 = 5;
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
    /// The boot whose page cache held the body when it was last written
    /// or checked (`/proc/sys/kernel/random/boot_id`; zero: unknown).
    boot: [u8; 16],
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
    #[error("cannot write {path}: {error}")]
    Write { path: PathBuf, error: std::io::Error },
    #[error("cannot serialise the index: {0}")]
    Serialise(String),
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
    /// Of a trace file, or of a ring (`--max-size`) named by its base when
    /// only its members exist: their sizes summed, the newest mtime, and a
    /// hash of each member's own identity (so a member added, removed or
    /// changed is another state).
    pub fn of(trace: &Path) -> Result<Identity, IndexError> {
        if !trace.exists()
            && let Ok(Some(ring)) = crate::format::ring::Members::find(trace)
        {
            let mut whole = Identity::zeroed();
            let mut h = blake3::Hasher::new();
            for (index, path) in &ring.files {
                let member = Identity::of_file(path)?;
                whole.size += member.size;
                (whole.mtime_s, whole.mtime_ns) =
                    (whole.mtime_s, whole.mtime_ns).max((member.mtime_s, member.mtime_ns));
                h.update(&index.to_le_bytes());
                h.update(bytemuck::bytes_of(&member));
            }
            whole.edges = *h.finalize().as_bytes();
            return Ok(whole);
        }
        Identity::of_file(trace)
    }

    fn of_file(trace: &Path) -> Result<Identity, IndexError> {
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
        Ok(Identity {
            size,
            mtime_s: mtime.as_secs(),
            mtime_ns: u64::from(mtime.subsec_nanos()),
            edges: *h.finalize().as_bytes(),
        })
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
    open_in_boot(path, trace, boot_id())
}

fn open_in_boot<T: DeserializeOwned>(path: &Path, trace: &Identity, boot: [u8; 16]) -> Result<T, IndexError> {
    let io = |error| IndexError::Io { path: path.to_path_buf(), error };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the mapping is read-only; an index is replaced by renaming a
    // new file over it, never written in place, so it does not change under
    // us (an outside program truncating it would be caught as SIGBUS, not
    // as a wrong number). Only its header is rewritten in place
    // (`restamp`), and it is read once, here, before that.
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
    if (map.len() as u64) < BODY {
        return Err(IndexError::Corrupt("it ends in its header".into()));
    }
    if header.boot == [0; 16] || header.boot != boot {
        let hashing = std::time::Instant::now();
        if hash_body(&file, map.len() as u64).map_err(io)? != header.body_hash {
            return Err(IndexError::Corrupt("its contents do not match their hash".into()));
        }
        log::info!("index hash checked in {:.2?} ({} MiB)", hashing.elapsed(), map.len() >> 20);
        restamp(&file, path, header, boot);
    }
    let tree = usize::try_from(header.tree_offset)
        .ok()
        .zip(usize::try_from(header.tree_len).ok())
        .and_then(|(a, n)| map.get(a..a.checked_add(n)?))
        .ok_or_else(|| IndexError::Corrupt("its table of contents is outside it".into()))?;
    match column::with_source(&map, || postcard::from_bytes(tree)) {
        (Ok(value), _) => Ok(value),
        (Err(_), Some(column)) => Err(IndexError::Corrupt(column)),
        (Err(e), None) => Err(IndexError::Corrupt(format!("its table of contents does not decode: {e}"))),
    }
}

/// Writes `value` as the index of `trace` (as it was when read) at `path`:
/// into an unnamed file (`O_TMPFILE`: a view stopped while it writes
/// leaves nothing behind) that is then named and renamed over the old one,
/// so that no reader ever sees a half-written index.
pub fn write<T: Serialize>(path: &Path, trace: &Identity, value: &T) -> Result<(), IndexError> {
    use std::os::{fd::AsRawFd, unix::fs::OpenOptionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let io = |error| IndexError::Write { path: path.to_path_buf(), error };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut file =
        File::options().read(true).write(true).custom_flags(libc::O_TMPFILE).mode(0o644).open(dir).map_err(io)?;
    // Not synced: a crash that loses some of its pages leaves an index whose
    // body does not match its hash, which the next open rebuilds; and the
    // sync was a third of the save (5 GB at disk speed).
    write_to(&mut file, path, trace, value)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let named = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&named);
    let (from, to) = (c_path(&PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))), c_path(&named));
    // SAFETY: two NUL-terminated paths; AT_SYMLINK_FOLLOW links the file
    // the descriptor's /proc link names, not the link.
    let linked =
        unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if linked != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    std::fs::rename(&named, path).inspect_err(|_| drop(std::fs::remove_file(&named))).map_err(io)
}

fn c_path(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn write_to<T: Serialize>(file: &mut File, path: &Path, trace: &Identity, value: &T) -> Result<(), IndexError> {
    let io = |error| IndexError::Write { path: path.to_path_buf(), error };
    file.seek(SeekFrom::Start(BODY)).map_err(io)?;
    let out = BufWriter::with_capacity(1 << 20, file.try_clone().map_err(io)?);
    let (tree, sink) =
        column::with_sink(column::Sink { out: Box::new(out), pos: BODY }, || postcard::to_allocvec(value));
    let tree = tree.map_err(|e| IndexError::Serialise(e.to_string()))?;
    let column::Sink { mut out, pos } =
        sink.ok_or_else(|| IndexError::Serialise("the column sink went missing".into()))?;
    out.write_all(&tree).map_err(io)?;
    out.flush().map_err(io)?;
    drop(out);
    let len = file.metadata().map_err(io)?.len();
    let mut header = Header {
        magic: MAGIC,
        version: VERSION,
        little_endian: u32::from(cfg!(target_endian = "little")),
        trace: *trace,
        boot: boot_id(),
        tree_offset: pos,
        tree_len: tree.len() as u64,
        body_hash: hash_body(file, len).map_err(io)?,
        header_hash: [0; 32],
    };
    header.header_hash = header_hash(&header);
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(bytemuck::bytes_of(&header)).map_err(io)
}

/// Marks a checked index as checked in this boot, so that later opens in
/// it skip the check. Only the header is rewritten: a reader maps the rest
/// and never reads the header again. Written through the file that was
/// checked (`/proc/self/fd` opens the same inode for writing), never its
/// path: a new index renamed over it meanwhile must keep its own header.
/// An index it cannot write (a read-only place) is checked at each open.
fn restamp(checked: &File, path: &Path, mut header: Header, boot: [u8; 16]) {
    use std::os::{fd::AsRawFd, unix::fs::FileExt};
    header.boot = boot;
    header.header_hash = header_hash(&header);
    let same = format!("/proc/self/fd/{}", checked.as_raw_fd());
    let written = File::options().write(true).open(same).and_then(|f| f.write_all_at(bytemuck::bytes_of(&header), 0));
    if let Err(e) = written {
        log::info!("index checked, but not marked as checked ({}: {e})", path.display());
    }
}

/// This boot's id, zero when the kernel does not say.
fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text.bytes().filter_map(|c| (c as char).to_digit(16).map(|d| d as u8)).collect();
    let mut id = [0; 16];
    if hex.len() == 32 {
        for (byte, pair) in id.iter_mut().zip(hex.chunks(2)) {
            *byte = pair[0] << 4 | pair[1];
        }
    }
    id
}

fn header_hash(h: &Header) -> [u8; 32] {
    let mut h = *h;
    h.header_hash = [0; 32];
    *blake3::hash(bytemuck::bytes_of(&h)).as_bytes()
}

/// A hash of the file's bytes `[BODY, len)`: xxh3-128 of its two halves on
/// two threads, then blake3 of the two (the check costs half the time on the
/// machines `view` runs on). It catches damage, not forgery: the index is
/// the user's own file, and this check is part of the first reopen's wait
/// after a boot (blake3 took 0.98 s on a 6.7 GB index). Read, not through the mapping:
/// the pages read would count in the process's RSS.
fn hash_body(file: &File, len: u64) -> std::io::Result<[u8; 32]> {
    use std::os::unix::fs::FileExt;
    let half = BODY + (len.saturating_sub(BODY)) / 2;
    let hash = |from: u64, to: u64| -> std::io::Result<[u8; 32]> {
        let mut h = twox_hash::XxHash3_128::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = from;
        while at < to {
            let n = ((to - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            h.write(&buf[..n]);
            at += n as u64;
        }
        let mut out = [0; 32];
        out[..16].copy_from_slice(&h.finish_128().to_le_bytes());
        Ok(out)
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| hash(BODY, half));
        (a.join(), hash(half, len))
    });
    let a = a.unwrap_or_else(|_| Err(std::io::Error::other("the hashing thread failed")))?;
    let mut h = blake3::Hasher::new();
    h.update(&a);
    h.update(&b?);
    Ok(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::{column::Column, *};

    #[derive(Serialize, Deserialize)]
    struct Sample {
        wide: Column<u64>,
        name: String,
        narrow: Column<u8>,
        empty: Column<u32>,
    }

    fn sample() -> Sample {
        Sample {
            wide: (0..1000u64).map(|i| i * 0x1_0000_0001).collect::<Vec<_>>().into(),
            name: "x".into(),
            narrow: vec![1u8, 2, 3].into(),
            empty: Column::default(),
        }
    }

    fn setup() -> (tempdir::Dir, PathBuf, Identity) {
        let dir = tempdir::Dir::new();
        let trace = dir.0.join("t.data");
        std::fs::write(&trace, vec![7u8; 200_000]).unwrap();
        let id = Identity::of(&trace).unwrap();
        (dir, trace, id)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let d = std::env::temp_dir().join(format!(
                    "ttidx-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&d).unwrap();
                Dir(d)
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn columns_come_back_mapped_and_equal() {
        let (_dir, trace, id) = setup();
        let [beside, _] = places(&trace);
        write(&beside, &id, &sample()).unwrap();
        let back: Sample = open(&beside, &id).unwrap();
        let want = sample();
        assert_eq!((&*back.wide, &*back.narrow, &*back.empty), (&*want.wide, &*want.narrow, &*want.empty));
        assert_eq!(back.name, "x");
        assert_eq!(back.wide.as_ptr() as usize % 64, 0, "columns are aligned in the mapping");
    }

    #[test]
    fn a_changed_trace_or_a_damaged_index_is_refused() {
        let (_dir, trace, id) = setup();
        let [beside, _] = places(&trace);
        write(&beside, &id, &sample()).unwrap();
        let mut other = id;
        other.size += 1;
        assert!(matches!(open::<Sample>(&beside, &other), Err(IndexError::OtherTrace)));
        let mut bytes = std::fs::read(&beside).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 1;
        std::fs::write(&beside, &bytes).unwrap();
        // The body is checked in any boot but the one that wrote it.
        assert!(matches!(open_in_boot::<Sample>(&beside, &id, ANOTHER_BOOT), Err(IndexError::Corrupt(_))));
        bytes[n - 10] ^= 1;
        bytes[8] = bytes[8].wrapping_add(1);
        std::fs::write(&beside, &bytes).unwrap();
        assert!(matches!(open::<Sample>(&beside, &id), Err(IndexError::Version { .. })));
        std::fs::write(&beside, b"short").unwrap();
        assert!(matches!(open::<Sample>(&beside, &id), Err(IndexError::NotAnIndex)));
    }

    const ANOTHER_BOOT: [u8; 16] = [9; 16];

    fn boot_of(index: &Path) -> [u8; 16] {
        bytemuck::pod_read_unaligned::<Header>(&std::fs::read(index).unwrap()[..std::mem::size_of::<Header>()]).boot
    }

    #[test]
    fn the_body_is_checked_once_per_boot() {
        let (_dir, trace, id) = setup();
        let [beside, _] = places(&trace);
        write(&beside, &id, &sample()).unwrap();
        assert_eq!(boot_of(&beside), boot_id(), "written in this boot");
        assert_ne!(boot_id(), [0; 16], "Linux says its boot id");
        // Opened after a reboot: checked, then marked as checked in it.
        open_in_boot::<Sample>(&beside, &id, ANOTHER_BOOT).unwrap();
        assert_eq!(boot_of(&beside), ANOTHER_BOOT);
        let back: Sample = open_in_boot(&beside, &id, ANOTHER_BOOT).unwrap();
        assert_eq!(&*back.wide, &*sample().wide);
    }

    #[test]
    fn the_mark_goes_to_the_index_checked_not_one_renamed_over_it() {
        let (dir, trace, id) = setup();
        let [beside, _] = places(&trace);
        write(&beside, &id, &sample()).unwrap();
        let checked = File::open(&beside).unwrap();
        let header: Header = bytemuck::pod_read_unaligned(&std::fs::read(&beside).unwrap()[..size_of::<Header>()]);
        // Another view rebuilds it meanwhile, as `write` does: a new file renamed over it.
        let newer = dir.0.join("newer");
        write(&newer, &id, &sample()).unwrap();
        std::fs::rename(&newer, &beside).unwrap();
        restamp(&checked, &beside, header, ANOTHER_BOOT);
        assert_eq!(boot_of(&beside), boot_id(), "the new index keeps its header");
        let mut old = vec![0; size_of::<Header>()];
        std::os::unix::fs::FileExt::read_exact_at(&checked, &mut old, 0).unwrap();
        assert_eq!(bytemuck::pod_read_unaligned::<Header>(&old).boot, ANOTHER_BOOT);
    }

    #[test]
    fn a_column_outside_the_file_is_refused() {
        // A table of contents whose column reaches past the end.
        #[derive(Serialize)]
        struct Forged {
            offset: u64,
            len: u64,
            width: u32,
        }
        let (_dir, trace, id) = setup();
        let [beside, _] = places(&trace);
        write(&beside, &id, &(Forged { offset: BODY, len: 1 << 40, width: 8 },)).unwrap();
        let got = open::<(Column<u64>,)>(&beside, &id);
        assert!(matches!(got, Err(IndexError::Corrupt(ref e)) if e.contains("past the end")), "{:?}", got.err());
        write(&beside, &id, &(Forged { offset: BODY + 4, len: 1, width: 8 },)).unwrap();
        assert!(matches!(open::<(Column<u64>,)>(&beside, &id), Err(IndexError::Corrupt(_))));
    }
}
