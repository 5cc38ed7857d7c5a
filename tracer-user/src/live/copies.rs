//! Weights a program read into memory instead of mapping its model file
//! (whisper.cpp reads each tensor into a backend buffer and leaves it
//! unnamed, `leaf_N`): a tensor in a WEIGHTS buffer is the model tensor of
//! its type (and, for a leaf, its shape) whose bytes it holds.
//!
//! The bytes decide, not the order or the shapes: same-shaped tensors are
//! many (whisper tiny.en has 48 of 384×384), and a tensor is named only
//! when exactly one candidate's bytes equal the target's: the whole tensor
//! up to 64 KiB, else its first 4 KiB and 15 more 4 KiB stretches spread to
//! its last byte. The file's bytes are read only where its pages are in the
//! page cache (the loader has just read them), through a descriptor without
//! readahead, so matching adds no page-cache fill or disk read to what the
//! trace measures. Two identical tensors, weights changed after loading
//! (repacked) or evicted before they could be compared stay unnamed and
//! are counted, never guessed.

use std::{
    collections::HashMap,
    fs::File,
    io,
    ops::Range,
    os::{fd::AsRawFd, unix::fs::FileExt},
    path::{Path, PathBuf},
};

use tracer_common::{BufferEvent, PAGE_SIZE as PAGE, TensorRecord, buffer_action};

use super::target::{Residency, memory::TargetMemory};
use crate::{
    format::CopyMatches,
    model::{ModelMap, Tensor},
};

/// ggml's `GGML_BACKEND_BUFFER_USAGE_WEIGHTS`.
const USAGE_WEIGHTS: u32 = 1;
/// ggml's `GGML_OP_NONE`: a leaf.
const OP_NONE: i32 = 0;
/// Bytes compared first, for every candidate.
const HEAD: u64 = 4096;
/// Then this many more stretches of HEAD bytes, spread over the tensor up
/// to its last byte (a small tensor is compared whole).
const SPREAD: u64 = 15;

/// A model tensor: (index of its model, index in that model's table).
pub type TensorId = (u32, u32);

#[derive(Default)]
pub struct CopyFinder {
    /// WEIGHTS buffers alive, by `ggml_backend_buffer` address.
    weights: HashMap<u64, Range<u64>>,
    /// Answers so far, by the address of the tensor's first byte.
    found: HashMap<u64, Option<TensorId>>,
    memory: Option<(u32, TargetMemory)>,
    files: HashMap<PathBuf, CachedFile>,
    /// What the byte matches came to, for the trailer.
    pub counts: CopyMatches,
}

impl CopyFinder {
    /// Follows the WEIGHTS buffers: ggml sets the usage after allocating,
    /// before the tensors are read in.
    pub fn on_buffer(&mut self, event: &BufferEvent) {
        match event.action {
            buffer_action::SET_USAGE if event.usage == USAGE_WEIGHTS && event.context != 0 => {
                self.weights.insert(event.buffer, event.context..event.context.saturating_add(event.size));
            }
            buffer_action::SET_USAGE | buffer_action::FREED => {
                if let Some(range) = self.weights.remove(&event.buffer) {
                    // Its addresses may hold other tensors later.
                    self.found.retain(|address, _| !range.contains(address));
                }
            }
            _ => {}
        }
    }

    /// The model tensor whose copy `record` is, or a view of: `None` for
    /// anything outside a WEIGHTS buffer or not matched exactly once.
    pub fn find(&mut self, pid: u32, models: &[ModelMap], record: &TensorRecord) -> Option<TensorId> {
        let (start, shape) = if record.view_src != 0 {
            (record.data.checked_sub(record.view_offs)?, None)
        } else if record.op == OP_NONE {
            (record.data, Some(record.ne))
        } else {
            return None;
        };
        let buffer = self.weights.values().find(|r| r.contains(&start))?.clone();
        if let Some(&answer) = self.found.get(&start) {
            return answer;
        }
        let answer = self.search(pid, models, record, start, shape, &buffer);
        self.found.insert(start, answer);
        answer
    }

    fn search(
        &mut self,
        pid: u32,
        models: &[ModelMap],
        record: &TensorRecord,
        start: u64,
        shape: Option<[i64; 4]>,
        buffer: &Range<u64>,
    ) -> Option<TensorId> {
        let candidates: Vec<(TensorId, &Tensor, &PathBuf)> =
            models
                .iter()
                .enumerate()
                .flat_map(|(m, model)| {
                    model.tensors().iter().enumerate().map(move |(t, tensor)| {
                        ((m as u32, t as u32), tensor, &model.files()[tensor.file as usize].path)
                    })
                })
                .filter(|(_, t, _)| i64::from(t.ggml_type.id) == i64::from(record.type_))
                .filter(|(_, t, _)| match shape {
                    Some(ne) => same_shape(&t.shape, &ne),
                    None => t.size_bytes > record.view_offs,
                })
                .filter(|(_, t, _)| start.checked_add(t.size_bytes).is_some_and(|end| end <= buffer.end))
                .collect();
        if candidates.is_empty() {
            return None;
        }
        let memory = self.memory_of(pid)?;
        let mut survivors = Vec::new();
        for (id, tensor, path) in candidates {
            if self.equal_at(&memory, start, tensor, path, &stretches(tensor.size_bytes)) {
                survivors.push(id);
            }
        }
        self.memory = Some((pid, memory));
        match survivors[..] {
            [one] => {
                self.counts.matched += 1;
                Some(one)
            }
            [] => {
                self.counts.unmatched += 1;
                None
            }
            _ => {
                self.counts.ambiguous += 1;
                log::debug!("the tensor at {start:#x} holds the bytes of {} model tensors", survivors.len());
                None
            }
        }
    }

    /// The target's memory, opened once per process.
    fn memory_of(&mut self, pid: u32) -> Option<TargetMemory> {
        match self.memory.take() {
            Some((p, memory)) if p == pid => Some(memory),
            _ => TargetMemory::open(pid).map_err(|e| log::debug!("reading pid {pid}'s memory: {e}")).ok(),
        }
    }

    /// Whether the target's bytes from `start` equal `tensor`'s in the file,
    /// at each of `at` (offsets into the tensor, with lengths).
    fn equal_at(
        &mut self,
        memory: &TargetMemory,
        start: u64,
        tensor: &Tensor,
        path: &PathBuf,
        at: &[Range<u64>],
    ) -> bool {
        let file = match self.files.get(path) {
            Some(f) => f,
            None => match CachedFile::open(path) {
                Ok(f) => self.files.entry(path.clone()).or_insert(f),
                Err(e) => {
                    log::debug!("opening {}: {e}", path.display());
                    return false;
                }
            },
        };
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        at.iter().all(|r| {
            let len = (r.end - r.start) as usize;
            ours.resize(len, 0);
            theirs.resize(len, 0);
            memory.read(start + r.start, &mut theirs).is_ok()
                && file.read_cached(tensor.file_offset + r.start, &mut ours)
                && ours == theirs
        })
    }
}

/// A model file read only from the page cache.
struct CachedFile {
    file: File,
    residency: Residency,
}

impl CachedFile {
    fn open(path: &Path) -> io::Result<CachedFile> {
        let file = File::open(path)?;
        // No readahead through this descriptor, not even on a page the
        // loader's readahead marked for the next window.
        // SAFETY: a valid fd; posix_fadvise only reads its arguments.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(CachedFile { file, residency: Residency::open(path)? })
    }

    /// Fills `buf` from `offset` if every page of it is cached.
    fn read_cached(&self, offset: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        let pages = (offset + len).div_ceil(PAGE) - offset / PAGE;
        let cached = self.residency.resident(offset, len).is_ok_and(|bytes| bytes == pages * PAGE);
        if !cached {
            log::debug!("bytes {offset}..{} of a model file are not cached: not compared", offset + len);
        }
        cached && self.file.read_exact_at(buf, offset).is_ok()
    }
}

/// A leaf's `ne` against a model tensor's shape (its dimensions past the
/// shape's are 1).
fn same_shape(shape: &[u64], ne: &[i64; 4]) -> bool {
    shape.len() <= 4
        && ne.iter().enumerate().all(|(i, &n)| u64::try_from(n).ok() == Some(shape.get(i).copied().unwrap_or(1)))
}

/// The stretches of a tensor of `size` bytes compared: its head first (most
/// candidates differ there), then SPREAD more up to its end.
fn stretches(size: u64) -> Vec<Range<u64>> {
    if size <= HEAD * (SPREAD + 1) {
        return std::iter::once(0..size.min(HEAD)).chain((size > HEAD).then_some(HEAD..size)).collect();
    }
    let step = (size - HEAD) / SPREAD;
    (0..=SPREAD).map(|i| if i == SPREAD { size - HEAD..size } else { i * step..i * step + HEAD }).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tracer_common::{EventHeader, ggml::MAX_NAME};

    use super::*;
    use crate::model::{GgmlType, gguf_write::GgufWriter};

    fn leaf(data: u64, ne: [i64; 4]) -> TensorRecord {
        TensorRecord {
            tensor: 0x1000,
            data,
            ne,
            nb: [4, 4 * ne[0] as u64, 0, 0],
            view_src: 0,
            view_offs: 0,
            extra: 0,
            type_: 0, // F32
            op: OP_NONE,
            op_param0: 0,
            flags: 0,
            slot: 0,
            _pad: 0,
            name: [0; MAX_NAME],
        }
    }

    fn weights_buffer(memory: &[u8]) -> BufferEvent {
        BufferEvent {
            header: EventHeader::default(),
            buffer: 0xb0f,
            buft: 0,
            context: memory.as_ptr() as u64,
            size: memory.len() as u64,
            usage: USAGE_WEIGHTS,
            action: buffer_action::SET_USAGE,
            type_name: [0; tracer_common::MAX_BUFFER_TYPE_NAME],
        }
    }

    /// Copies of a model's tensors in this process's own memory, matched
    /// through /proc/self/mem as a target's are.
    #[test]
    fn a_weight_in_memory_is_the_one_tensor_whose_bytes_it_holds() {
        // On the repo's disk: tmpfs pages cannot be evicted.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../target/copies-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        let f32 = GgmlType::from_name("f32").unwrap();
        let file = GgufWriter::new()
            .tensor("a", f32, &[64, 16])
            .tensor("b", f32, &[64, 16])
            .tensor("c", f32, &[64, 16])
            .tensor("big", f32, &[1024, 64])
            .to_bytes()
            .unwrap();
        std::fs::write(&path, &file).unwrap();
        let model = ModelMap::open(&path).unwrap();
        let bytes_of = |m: &ModelMap, name: &str| {
            let t = m.tensors().iter().find(|t| t.name == name).unwrap();
            std::fs::read(Path::new(&path)).unwrap()[t.file_offset as usize..(t.file_offset + t.size_bytes) as usize]
                .to_vec()
        };
        // In memory, as a loader lays them out: b, then big with a byte of
        // its head changed after loading (repacked weights differ all over),
        // then a whole copy of big.
        let mut memory = bytes_of(&model, "b");
        let big = bytes_of(&model, "big");
        let (changed, intact) = (memory.len(), memory.len() + big.len());
        memory.extend(&big);
        memory[changed + 100] ^= 1;
        memory.extend(&big);
        let at = |offset: usize| memory.as_ptr() as u64 + offset as u64;

        let mut finder = CopyFinder::default();
        let pid = std::process::id();
        let models = [model];
        assert_eq!(finder.find(pid, &models, &leaf(at(0), [64, 16, 1, 1])), None, "outside any WEIGHTS buffer");
        finder.on_buffer(&weights_buffer(&memory));
        assert_eq!(finder.find(pid, &models, &leaf(at(0), [64, 16, 1, 1])), Some((0, 1)), "b");
        assert_eq!(finder.find(pid, &models, &leaf(at(intact), [1024, 64, 1, 1])), Some((0, 3)), "big");
        assert_eq!(finder.find(pid, &models, &leaf(at(changed), [1024, 64, 1, 1])), None, "a changed byte");
        // A view of big, 4 rows into it, is big.
        let mut view = leaf(at(intact) + 4 * 4096, [1024, 2, 1, 1]);
        (view.op, view.view_src, view.view_offs) = (29, 0x2000, 4 * 4096);
        assert_eq!(finder.find(pid, &models, &view), Some((0, 3)));
        assert_eq!(finder.counts.matched, 2);

        // Two tensors of the file with the same bytes: neither is named.
        let c = models[0].tensors()[2].clone();
        let mut patched = file.clone();
        patched[c.file_offset as usize..(c.file_offset + c.size_bytes) as usize]
            .copy_from_slice(&memory[..c.size_bytes as usize]);
        std::fs::write(&path, &patched).unwrap();
        let mut finder = CopyFinder::default();
        finder.on_buffer(&weights_buffer(&memory));
        assert_eq!(finder.find(pid, &models, &leaf(at(0), [64, 16, 1, 1])), None, "b or c");
        assert_eq!(finder.counts.ambiguous, 1);
        // A freed buffer's answers go with it.
        finder.on_buffer(&BufferEvent { action: buffer_action::FREED, ..weights_buffer(&memory) });
        assert!(finder.found.is_empty() && finder.weights.is_empty());

        // Pages not in the page cache are not read, so matching fills none.
        std::fs::write(&path, &file).unwrap();
        File::open(&path).unwrap().sync_all().unwrap();
        crate::live::target::evict(&path).unwrap();
        let mut finder = CopyFinder::default();
        finder.on_buffer(&weights_buffer(&memory));
        assert_eq!(finder.find(pid, &models, &leaf(at(0), [64, 16, 1, 1])), None, "b, evicted");
        assert_eq!(crate::live::target::resident_bytes(&path).unwrap().0, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn small_tensors_are_compared_whole_and_large_ones_head_first_to_the_end() {
        assert_eq!(stretches(1536), vec![0..1536]);
        assert_eq!(stretches(10_000), vec![0..4096, 4096..10_000]);
        let big = stretches(288 * 1024 * 4);
        assert_eq!(big.len(), 16);
        assert_eq!(big[0], 0..4096);
        assert_eq!(big.last().unwrap().end, 288 * 1024 * 4);
        assert!(big.windows(2).all(|w| w[0].end <= w[1].start), "{big:?}");
    }

    #[test]
    fn shapes_compare_with_trailing_ones() {
        assert!(same_shape(&[384, 1536], &[384, 1536, 1, 1]));
        assert!(!same_shape(&[1536, 384], &[384, 1536, 1, 1]));
        assert!(!same_shape(&[384], &[384, 2, 1, 1]));
    }
}
