//! A live target's memory and paths, as the target sees them: the model path
//! whisper.cpp hands its loader, the bytes of weights it read into memory.

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

/// Longest path read from a target (PATH_MAX).
const MAX_PATH: usize = 4096;
/// A string is read in steps that stay inside one page, so one that ends
/// just before an unmapped page is still read.
const PAGE: u64 = 4096;

/// `/proc/PID/mem`, open for reading (root, or the target's own user under
/// the kernel's ptrace rules).
pub struct TargetMemory {
    file: File,
}

impl TargetMemory {
    pub fn open(pid: u32) -> io::Result<TargetMemory> {
        Ok(TargetMemory { file: File::open(format!("/proc/{pid}/mem"))? })
    }

    /// Fills `buf` from `address`; an unmapped byte is an error.
    pub fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, address)
    }

    /// The NUL-terminated string at `address`, without its NUL.
    pub fn c_string(&self, address: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = address;
        while out.len() < MAX_PATH {
            let step = (PAGE - at % PAGE).min((MAX_PATH - out.len()) as u64) as usize;
            let mut chunk = vec![0; step];
            self.read(at, &mut chunk)?;
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..end]);
                return Ok(out);
            }
            out.extend_from_slice(&chunk);
            at += step as u64;
        }
        Err(io::Error::new(io::ErrorKind::InvalidData, format!("no NUL in the {MAX_PATH} bytes at {address:#x}")))
    }
}

/// `path` as process `pid` opens it: an absolute path from its root (a
/// container's or a chroot's), a relative one from its working directory.
pub fn path_seen_by(pid: u32, path: &Path) -> PathBuf {
    match path.strip_prefix("/") {
        Ok(rest) => Path::new(&format!("/proc/{pid}/root")).join(rest),
        Err(_) => Path::new(&format!("/proc/{pid}/cwd")).join(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_strings_and_bytes() {
        let text = std::ffi::CString::new("/models/ggml-tiny.en.bin").unwrap();
        let memory = TargetMemory::open(std::process::id()).unwrap();
        assert_eq!(memory.c_string(text.as_ptr() as u64).unwrap(), b"/models/ggml-tiny.en.bin");
        let bytes = [7u8, 8, 9];
        let mut back = [0u8; 3];
        memory.read(bytes.as_ptr() as u64, &mut back).unwrap();
        assert_eq!(back, bytes);
        assert!(memory.read(8, &mut back).is_err(), "page 0 is never mapped");
    }

    #[test]
    fn paths_go_through_the_targets_root_and_cwd() {
        assert_eq!(path_seen_by(7, Path::new("/models/m.bin")), Path::new("/proc/7/root/models/m.bin"));
        assert_eq!(path_seen_by(7, Path::new("m.bin")), Path::new("/proc/7/cwd/m.bin"));
    }
}
