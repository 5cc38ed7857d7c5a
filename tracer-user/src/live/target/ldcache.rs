//! `/etc/ld.so.cache`, read the way ld.so reads it, bounds-checked.
//!
//! Two layouts exist: the new one alone (glibc >= 2.32 default), starting with
//! `glibc-ld.so.cache1.1`, and the old `ld.so-1.7.0` table optionally followed
//! by the new one. Entries are `(flags, key, value)` string offsets: the
//! library name and its full path.

use std::path::{Path, PathBuf};

use std::os::unix::ffi::OsStrExt;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Old header: magic padded to 12 bytes, then u32 nlibs.
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
/// New header: magic 20, nlibs 4, len_strings 4, flags 1 + pad 3, extension_offset 4, unused 12.
const NEW_HEADER: usize = 48;
/// flags i32, key u32, value u32, osversion u32, hwcap u64.
const NEW_ENTRY: usize = 24;
/// Bit 62 of hwcap marks a glibc-hwcaps subdirectory entry (x86-64-v3...).
const HWCAP_GLIBC_HWCAPS: u64 = 1 << 62;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LdCache {
    /// `(library name, path)` in cache order.
    pub entries: Vec<(Vec<u8>, PathBuf)>,
}

impl LdCache {
    /// The system cache, or an empty one when it is missing or unreadable
    /// (ld.so then falls through to the default directories too).
    pub fn system() -> Self {
        match std::fs::read("/etc/ld.so.cache") {
            Ok(bytes) => Self::parse(&bytes).unwrap_or_else(|| {
                log::warn!("/etc/ld.so.cache has an unknown layout; searching default directories only");
                Self::default()
            }),
            Err(e) => {
                log::debug!("no ld.so cache: {e}");
                Self::default()
            }
        }
    }

    /// `None` for an unknown layout or a table running past the end of data.
    pub fn parse(data: &[u8]) -> Option<Self> {
        if data.starts_with(NEW_MAGIC) {
            return parse_new(data, 0);
        }
        if !data.starts_with(OLD_MAGIC) {
            return None;
        }
        let nlibs = u32_at(data, 12)? as usize;
        let strings = OLD_HEADER.checked_add(nlibs.checked_mul(OLD_ENTRY)?)?;
        // The new table follows, 8-aligned, in files written by glibc 2.x.
        let new_at = strings.checked_add(7)? & !7;
        if data.get(new_at..).is_some_and(|d| d.starts_with(NEW_MAGIC)) {
            return parse_new(data, new_at);
        }
        let mut entries = Vec::with_capacity(nlibs.min(data.len() / OLD_ENTRY));
        for i in 0..nlibs {
            let at = OLD_HEADER + i * OLD_ENTRY;
            let key = c_str(data, strings.checked_add(u32_at(data, at + 4)? as usize)?)?;
            let value = c_str(data, strings.checked_add(u32_at(data, at + 8)? as usize)?)?;
            entries.push((key.to_vec(), PathBuf::from(std::ffi::OsStr::from_bytes(value))));
        }
        Some(Self { entries })
    }

    /// Paths the cache gives for `name`, best first. The caller still checks
    /// each file's ELF class and machine, as ld.so's flag check would.
    pub fn lookup(&self, name: &[u8]) -> impl Iterator<Item = &Path> {
        self.entries.iter().filter(move |(key, _)| key == name).map(|(_, path)| path.as_path())
    }
}

fn parse_new(data: &[u8], base: usize) -> Option<LdCache> {
    let nlibs = u32_at(data, base + 20)? as usize;
    let table_end = base.checked_add(NEW_HEADER)?.checked_add(nlibs.checked_mul(NEW_ENTRY)?)?;
    if table_end > data.len() {
        return None;
    }
    let mut entries = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let at = base + NEW_HEADER + i * NEW_ENTRY;
        let hwcap = u64::from_le_bytes(data.get(at + 16..at + 24)?.try_into().ok()?);
        // Entries for glibc-hwcaps subdirectories need the CPU-level match
        // ld.so does; the plain entry for the same name follows them.
        if hwcap & HWCAP_GLIBC_HWCAPS != 0 {
            continue;
        }
        // String offsets count from the start of the new header.
        let key = c_str(data, base.checked_add(u32_at(data, at + 4)? as usize)?)?;
        let value = c_str(data, base.checked_add(u32_at(data, at + 8)? as usize)?)?;
        entries.push((key.to_vec(), PathBuf::from(std::ffi::OsStr::from_bytes(value))));
    }
    Some(LdCache { entries })
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn c_str(data: &[u8], at: usize) -> Option<&[u8]> {
    let rest = data.get(at..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_format(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let strings_at = NEW_HEADER + entries.len() * NEW_ENTRY;
        let mut table = Vec::new();
        for (key, value) in entries {
            let k = strings_at + strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let v = strings_at + strings.len();
            strings.extend_from_slice(value.as_bytes());
            strings.push(0);
            table.extend_from_slice(&0x0303i32.to_le_bytes());
            table.extend_from_slice(&(k as u32).to_le_bytes());
            table.extend_from_slice(&(v as u32).to_le_bytes());
            table.extend_from_slice(&[0; 12]);
        }
        let mut out = NEW_MAGIC.to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; NEW_HEADER - 28]);
        out.extend(table);
        out.extend(strings);
        out
    }

    #[test]
    fn parses_synthetic_cache() {
        let data = new_format(&[("libfoo.so.1", "/opt/lib/libfoo.so.1"), ("libbar.so", "/usr/lib/libbar.so")]);
        let cache = LdCache::parse(&data).unwrap();
        assert_eq!(cache.lookup(b"libfoo.so.1").collect::<Vec<_>>(), [Path::new("/opt/lib/libfoo.so.1")]);
        assert_eq!(cache.lookup(b"libnone.so").count(), 0);
    }

    #[test]
    fn truncated_or_garbage_is_rejected_without_panic() {
        let data = new_format(&[("libfoo.so.1", "/opt/lib/libfoo.so.1")]);
        for len in 0..data.len() {
            let _ = LdCache::parse(&data[..len]);
        }
        assert!(LdCache::parse(&data[..NEW_HEADER + 4]).is_none());
        assert!(LdCache::parse(b"not a cache").is_none());
        let mut huge = data.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(LdCache::parse(&huge).is_none());
        let mut old = OLD_MAGIC.to_vec();
        old.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(LdCache::parse(&old).is_none());
    }

    /// The system cache agrees with `ldconfig -p` (when both exist).
    #[test]
    fn system_cache_matches_ldconfig() {
        let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() else { return };
        let text = String::from_utf8_lossy(&out.stdout);
        let cache = LdCache::system();
        let mut checked = 0;
        for line in text.lines().skip(1) {
            let Some((left, path)) = line.split_once(" => ") else { continue };
            let name = left.trim().split(' ').next().unwrap_or_default();
            if line.contains("hwcap") {
                continue;
            }
            assert!(
                cache.lookup(name.as_bytes()).any(|p| p == Path::new(path)),
                "ldconfig -p lists {name} => {path}, the parser does not"
            );
            checked += 1;
        }
        assert_eq!(checked, cache.entries.len(), "entry counts differ");
    }
}
