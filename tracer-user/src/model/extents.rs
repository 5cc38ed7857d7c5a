//! Where a file's bytes lie on its block device (FIEMAP), and which device
//! that is (sysfs), so that a block-I/O sector can be turned into a file
//! offset and hence a tensor.

use std::{
    fs::{self, File},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use serde::Serialize;

const SECTOR: u64 = 512;
/// _IOWR('f', 11, struct fiemap): linux/fs.h. ioctl's request is an
/// unsigned long in glibc and an int in musl (the static release build); the
/// kernel reads 32 bits either way, so the cast keeps the same bits.
const FS_IOC_FIEMAP: libc::Ioctl = 0xC020_660B_u32 as libc::Ioctl;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const EXTENTS_PER_CALL: usize = 256;

/// Extent flag bits (linux/fiemap.h) and their names.
const FLAG_NAMES: &[(u32, &str)] = &[
    (0x2, "unknown"),
    (0x4, "delalloc"),
    (0x8, "encoded"),
    (0x80, "encrypted"),
    (0x100, "not_aligned"),
    (0x200, "inline"),
    (0x400, "tail"),
    (0x800, "unwritten"),
    (0x1000, "merged"),
    (0x2000, "shared"),
];

// Causes are in the message, not `source`s, so anyhow prints them once.
#[derive(Debug, thiserror::Error)]
pub enum ExtentError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: the filesystem does not support FIEMAP ({error}), so physical extents are unknown", path.display())]
    Unsupported { path: PathBuf, error: std::io::Error },
}

/// The block device a file lives on, as block-layer tracepoints name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDevice {
    /// st_dev of the file: the filesystem's device (a partition or a whole disk).
    pub major: u32,
    pub minor: u32,
    /// sysfs name, e.g. `vda` or `nvme0n1p2`; None if st_dev is not a block device.
    pub name: Option<String>,
    /// The whole disk when the filesystem is on a partition.
    pub disk: Option<String>,
    pub disk_major: Option<u32>,
    pub disk_minor: Option<u32>,
    /// First sector of the partition on the disk (0 for a whole disk).
    pub partition_start_sector: u64,
}

impl BlockDevice {
    /// Looks up st_dev `dev` under /sys/dev/block.
    pub fn lookup(dev: u64) -> BlockDevice {
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let mut out = BlockDevice {
            major,
            minor,
            name: None,
            disk: None,
            disk_major: None,
            disk_minor: None,
            partition_start_sector: 0,
        };
        let Ok(dir) = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else { return out };
        out.name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let read = |p: PathBuf| fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        let parse_dev = |s: Option<String>| {
            let s = s?;
            let (a, b) = s.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        if dir.join("partition").exists() {
            out.partition_start_sector = read(dir.join("start")).and_then(|s| s.parse().ok()).unwrap_or(0);
            if let Some(parent) = dir.parent() {
                out.disk = parent.file_name().map(|n| n.to_string_lossy().into_owned());
                if let Some((a, b)) = parse_dev(read(parent.join("dev"))) {
                    (out.disk_major, out.disk_minor) = (Some(a), Some(b));
                }
            }
        } else if out.name.is_some() {
            (out.disk, out.disk_major, out.disk_minor) = (out.name.clone(), Some(major), Some(minor));
        }
        out
    }
}

/// One FIEMAP extent: `length` bytes at file offset `logical` are at byte
/// `physical` of the filesystem's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    #[serde(skip)]
    pub flags: u32,
}

impl Extent {
    pub fn flag_names(&self) -> Vec<&'static str> {
        FLAG_NAMES.iter().filter(|(bit, _)| self.flags & bit != 0).map(|(_, n)| *n).collect()
    }
}

/// Part of a byte range of the file, placed on the disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fragment {
    pub file_offset: u64,
    pub length: u64,
    /// Byte offset on the filesystem's device.
    pub physical: u64,
    /// 512-byte sector on the whole disk (partition start added): what the
    /// block tracepoints report.
    pub disk_sector: u64,
    pub flags: Vec<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileExtents {
    pub path: PathBuf,
    pub device: BlockDevice,
    /// Sorted by `logical`, non-overlapping.
    pub extents: Vec<Extent>,
    /// Indices into `extents`, sorted by `physical`, for sector lookups.
    #[serde(skip)]
    by_physical: Vec<u32>,
}

impl FileExtents {
    pub fn read(path: &Path) -> Result<FileExtents, ExtentError> {
        let io = |error| ExtentError::Io { path: path.to_owned(), error };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let extents = fiemap(&file).map_err(|e| match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => {
                ExtentError::Unsupported { path: path.to_owned(), error: e }
            }
            _ => io(e),
        })?;
        Ok(Self::new(path.to_owned(), BlockDevice::lookup(meta.dev()), extents))
    }

    pub fn new(path: PathBuf, device: BlockDevice, mut extents: Vec<Extent>) -> FileExtents {
        extents.sort_by_key(|e| e.logical);
        let mut by_physical: Vec<u32> = (0..extents.len() as u32).collect();
        by_physical.sort_by_key(|&i| extents[i as usize].physical);
        FileExtents { path, device, extents, by_physical }
    }

    /// The fragments holding `[offset, offset + len)`; holes have none.
    pub fn fragments(&self, offset: u64, len: u64) -> Vec<Fragment> {
        let end = offset.saturating_add(len);
        let first = self.extents.partition_point(|e| e.logical.saturating_add(e.length) <= offset);
        self.extents[first..]
            .iter()
            .take_while(|e| e.logical < end)
            .map(|e| {
                let from = offset.max(e.logical);
                let to = end.min(e.logical.saturating_add(e.length));
                let physical = e.physical + (from - e.logical);
                Fragment {
                    file_offset: from,
                    length: to - from,
                    physical,
                    disk_sector: self.device.partition_start_sector + physical / SECTOR,
                    flags: e.flag_names(),
                }
            })
            .collect()
    }

    /// The file offset stored at whole-disk sector `disk_sector`, if any.
    pub fn file_offset_of_sector(&self, disk_sector: u64) -> Option<u64> {
        let physical = disk_sector.checked_sub(self.device.partition_start_sector)?.checked_mul(SECTOR)?;
        let i = self.by_physical.partition_point(|&i| self.extents[i as usize].physical <= physical);
        let e = self.extents[*self.by_physical.get(i.checked_sub(1)?)? as usize];
        (physical < e.physical.saturating_add(e.length)).then(|| e.logical + (physical - e.physical))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

#[repr(C)]
struct Fiemap {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
    fm_extents: [RawExtent; EXTENTS_PER_CALL],
}

fn fiemap(file: &File) -> std::io::Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    let mut buf = Box::new(Fiemap {
        fm_start: 0,
        fm_length: 0,
        fm_flags: 0,
        fm_mapped_extents: 0,
        fm_extent_count: 0,
        fm_reserved: 0,
        fm_extents: [RawExtent::default(); EXTENTS_PER_CALL],
    });
    loop {
        buf.fm_start = start;
        buf.fm_length = u64::MAX - start;
        buf.fm_flags = FIEMAP_FLAG_SYNC;
        buf.fm_mapped_extents = 0;
        buf.fm_extent_count = EXTENTS_PER_CALL as u32;
        // SAFETY: `buf` is a properly laid out struct fiemap with room for
        // fm_extent_count extents, alive for the duration of the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut *buf as *mut Fiemap) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = (buf.fm_mapped_extents as usize).min(EXTENTS_PER_CALL);
        if n == 0 {
            break;
        }
        let got = &buf.fm_extents[..n];
        out.extend(got.iter().map(|e| Extent {
            logical: e.fe_logical,
            physical: e.fe_physical,
            length: e.fe_length,
            flags: e.fe_flags,
        }));
        let last = got[n - 1];
        let next = last.fe_logical.saturating_add(last.fe_length);
        if last.fe_flags & FIEMAP_EXTENT_LAST != 0 || next <= start {
            break;
        }
        start = next;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FileExtents {
        let dev = BlockDevice {
            major: 8,
            minor: 1,
            name: Some("sda1".into()),
            disk: Some("sda".into()),
            disk_major: Some(8),
            disk_minor: Some(0),
            partition_start_sector: 2048,
        };
        let e = |logical, physical, length| Extent { logical, physical, length, flags: 0 };
        FileExtents::new("/m".into(), dev, vec![e(8192, 4096, 8192), e(0, 1 << 20, 8192)])
    }

    #[test]
    fn fragments_split_at_extent_edges() {
        let f = sample();
        let frags = f.fragments(4096, 8192);
        assert_eq!(frags.len(), 2);
        assert_eq!((frags[0].file_offset, frags[0].length, frags[0].physical), (4096, 4096, (1 << 20) + 4096));
        assert_eq!(frags[0].disk_sector, 2048 + ((1 << 20) + 4096) / 512);
        assert_eq!((frags[1].file_offset, frags[1].length, frags[1].physical), (8192, 4096, 4096));
        assert!(f.fragments(1 << 30, 10).is_empty());
    }

    #[test]
    fn sectors_map_back_to_file_offsets() {
        let f = sample();
        assert_eq!(f.file_offset_of_sector(2048 + 4096 / 512 + 1), Some(8192 + 512));
        assert_eq!(f.file_offset_of_sector(2048 + (1 << 20) / 512), Some(0));
        assert_eq!(f.file_offset_of_sector(2048), None);
        assert_eq!(f.file_offset_of_sector(0), None);
    }

    #[test]
    fn fiemap_on_a_real_file() {
        let dir = std::env::temp_dir().join(format!("ttrace-fiemap-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        match FileExtents::read(&path) {
            Ok(f) => {
                let total: u64 = f.fragments(0, 3 * 4096).iter().map(|fr| fr.length).sum();
                assert_eq!(total, 3 * 4096);
            }
            Err(ExtentError::Unsupported { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
