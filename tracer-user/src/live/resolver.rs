//! Resolution at record time: every tensor descriptor is classified when it
//! is first written (model file + tensor + offset, copy by name, anonymous,
//! other file), against a snapshot of the target's maps that is refreshed
//! when a pointer is not covered, and model files are discovered as the
//! target maps them.

use std::{
    collections::HashSet,
    fs::File,
    io::Read,
    os::unix::ffi::OsStringExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracer_common::{FileKey, TensorRecord};

use super::{
    copies::CopyFinder,
    target::memory::{TargetMemory, path_seen_by},
};
use crate::{
    events::tensor_name,
    format::{FileExtent, FileInfo, FilePos, Memory, ModelTable, ModelTensor},
    model::{
        AddressSpace, FileExtents, ModelMap, Resolution,
        maps::{parse_maps, read_maps},
    },
};

/// A model file whose page-cache and block events are recorded.
#[derive(Clone, Debug)]
pub struct WatchedFile {
    pub key: FileKey,
    /// Whole disk holding it, kernel dev_t encoding.
    pub disk_dev: Option<u32>,
    /// Byte ranges on the whole disk: `(start, end)`, sorted.
    pub(super) disk_ranges: Vec<(u64, u64)>,
}

/// dev_t as the kernel's tracepoints print it (`MKDEV`: major << 20 | minor).
pub fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xfffff)
}

/// Maps are re-read at most this often (a refresh costs a /proc read).
const REFRESH_INTERVAL: Duration = Duration::from_millis(5);

pub struct Resolver {
    pid: u32,
    models: Vec<ModelMap>,
    space: AddressSpace,
    checked_files: HashSet<PathBuf>,
    last_refresh: Option<Instant>,
    /// Model tables found since the last call to `take_new_models`.
    new_models: Vec<ModelTable>,
    pub(super) watched: Vec<WatchedFile>,
    /// Watched files not yet handed to the kernel side.
    new_watched: Vec<WatchedFile>,
    pub maps_errors: u64,
    /// Block requests on watched devices outside every model file.
    pub blocks_elsewhere: u64,
    /// Page faults of traced processes other than the one followed (a
    /// container's `unshare`, a program the command started that has not
    /// loaded ggml): this one's maps cannot name their addresses.
    pub faults_elsewhere: u64,
    /// The last maps text read, and whether it is worth a MAPS frame: the
    /// first read, or the first to show a model file mapped.
    maps_text: String,
    maps_due: bool,
    mapped_models: HashSet<PathBuf>,
    /// Weights read into memory (whisper.cpp), matched to their model by content.
    pub copies: CopyFinder,
    /// Model files a loader was seen opening, read once its graphs start.
    named_models: Vec<PathBuf>,
}

impl Resolver {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            models: Vec::new(),
            space: AddressSpace::from_vmas(Vec::new(), &[]),
            checked_files: HashSet::new(),
            last_refresh: None,
            new_models: Vec::new(),
            watched: Vec::new(),
            new_watched: Vec::new(),
            maps_errors: 0,
            blocks_elsewhere: 0,
            faults_elsewhere: 0,
            maps_text: String::new(),
            maps_due: false,
            mapped_models: HashSet::new(),
            copies: CopyFinder::default(),
            named_models: Vec::new(),
        }
    }

    /// Start from a model known before the target maps it (`ttrace run`
    /// finds it on the command line), so its load-time reads are watched.
    pub fn add_model(&mut self, path: &Path) -> Result<(), crate::model::GgufError> {
        // The maps name it by its absolute path: a relative `-m model.gguf`
        // must be the same model, not a second copy of its table.
        let path = &path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if !self.covers(path) {
            let model = ModelMap::open(path)?;
            self.push_model(model);
        }
        Ok(())
    }

    /// The model file a program names to its loader (whisper.cpp's path
    /// argument, `path_at` in process `pid`'s memory), as the process opens
    /// it. The string is read while the loader runs; the file's table only
    /// at the first graph, when the loader has read the file into the page
    /// cache: reading a cold whisper file's table (a header before each
    /// tensor) would fill pages the loader's reads then find. A failure
    /// leaves the weights unnamed, with a warning.
    pub fn model_named_at(&mut self, pid: u32, path_at: u64) {
        match TargetMemory::open(pid).and_then(|m| m.c_string(path_at)) {
            Ok(bytes) => self.named_models.push(path_seen_by(pid, Path::new(&std::ffi::OsString::from_vec(bytes)))),
            Err(e) => {
                log::warn!("pid {pid} loads a model, but its path could not be read ({e}): its weights stay unnamed")
            }
        }
    }

    fn open_named_models(&mut self) {
        for path in std::mem::take(&mut self.named_models) {
            if let Err(e) = self.add_model(&path) {
                log::warn!("the target loads {}, which ttrace cannot read as a model: {e}", path.display());
            }
        }
    }

    fn push_model(&mut self, model: ModelMap) {
        let (table, watched) = model_table(&model);
        self.new_models.push(table);
        self.new_watched.extend(watched.iter().cloned());
        self.watched.extend(watched);
        // The address space picks the model up at the next refresh.
        self.models.push(model);
    }

    /// Files the kernel side should start watching.
    pub fn take_new_watched(&mut self) -> Vec<WatchedFile> {
        std::mem::take(&mut self.new_watched)
    }

    /// Whether a block request's sectors touch a model file.
    pub fn block_in_model(&self, dev: u32, sector: u64, nr_sector: u32) -> bool {
        // Flushes carry sector u64::MAX: saturate rather than wrap.
        let start = sector.saturating_mul(512);
        let end = sector.saturating_add(u64::from(nr_sector)).saturating_mul(512);
        self.watched.iter().filter(|w| w.disk_dev == Some(dev)).any(|w| {
            let i = w.disk_ranges.partition_point(|&(_, e)| e <= start);
            w.disk_ranges.get(i).is_some_and(|&(s, _)| s < end)
        })
    }

    /// What a faulting address maps: the model-file byte, and the tensor.
    pub fn resolve_fault(&mut self, address: u64) -> (Memory, Option<FilePos>) {
        if matches!(self.space.resolve(address), Resolution::Unmapped)
            && self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL)
        {
            self.refresh();
        }
        match self.space.resolve(address) {
            Resolution::ModelFile { model, file, file_offset, tensor } => {
                let memory = tensor.map_or(Memory::OtherFile, |t| Memory::ModelFile {
                    model,
                    tensor: t.tensor,
                    offset: t.offset_in_tensor,
                });
                (memory, Some(FilePos { model, file, offset: file_offset }))
            }
            Resolution::Anon { .. } => (Memory::Anon, None),
            Resolution::OtherFile { .. } => (Memory::OtherFile, None),
            Resolution::Unmapped => (Memory::Unmapped, None),
        }
    }

    pub fn models(&self) -> &[ModelMap] {
        &self.models
    }

    /// Re-read the target's maps, opening any GGUF file it maps for the first time.
    /// The process to read maps of: `run`'s child, or the process of its
    /// that loaded ggml.
    /// The process whose maps resolve addresses.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn follow(&mut self, pid: u32) {
        if pid != self.pid {
            self.pid = pid;
            self.refresh();
        }
    }

    pub fn refresh(&mut self) {
        self.last_refresh = Some(Instant::now());
        let vmas = match read_maps(self.pid).and_then(|text| parse_maps(&text).map(|vmas| (text, vmas))) {
            // An exited process (a zombie) has empty maps: keep the last snapshot.
            Ok((text, _)) if text.is_empty() => return,
            Ok((text, vmas)) => {
                self.maps_due |= self.maps_text.is_empty();
                self.maps_text = String::from_utf8_lossy(&text).into_owned();
                vmas
            }
            Err(e) => {
                // The target may be gone; keep the last snapshot.
                self.maps_errors += 1;
                log::debug!("re-reading maps of pid {}: {e}", self.pid);
                return;
            }
        };
        for vma in vmas.iter().filter(|v| v.is_file() && !v.deleted) {
            // A path printed from another mount namespace may name another
            // file here (a container's /models/m.gguf): only the mapped inode counts.
            if self.checked_files.insert(vma.path.clone())
                && same_inode(&vma.path, vma.inode)
                && is_gguf(&vma.path)
                && !self.covers(&vma.path)
            {
                match ModelMap::open(&vma.path) {
                    Ok(model) => self.push_model(model),
                    Err(e) => log::warn!("the target maps {}, but it does not read as GGUF: {e}", vma.path.display()),
                }
            }
        }
        // Maps name files by their resolved path, as `ModelMap` keeps them.
        for vma in vmas.iter().filter(|v| v.is_file() && !v.deleted) {
            if !self.mapped_models.contains(&vma.path)
                && self.models.iter().any(|m| m.files().iter().any(|f| f.path == vma.path))
            {
                self.mapped_models.insert(vma.path.clone());
                self.maps_due = true;
            }
        }
        let mut space = AddressSpace::from_vmas(vmas, &self.models);
        space.keep_unmapped_models(&self.space);
        self.space = space;
    }

    /// At a graph's start: re-read the maps until they show a model mapped
    /// (at most once a second for a target that never maps one).
    pub fn refresh_for_graph(&mut self) {
        self.open_named_models();
        if self.mapped_models.is_empty() && self.last_refresh.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.refresh();
        }
    }

    /// The maps as last read, for the header: no MAPS frame is due for them.
    pub fn header_maps(&mut self) -> String {
        self.maps_due = false;
        self.maps_text.clone()
    }

    /// The maps text, when it is worth a MAPS frame (see `maps_due`).
    pub fn take_maps_snapshot(&mut self) -> Option<String> {
        std::mem::take(&mut self.maps_due).then(|| self.maps_text.clone())
    }

    fn covers(&self, path: &Path) -> bool {
        let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        self.models.iter().any(|m| m.files().iter().any(|f| f.path == canon || f.path == path))
    }

    pub fn take_new_models(&mut self) -> Vec<ModelTable> {
        std::mem::take(&mut self.new_models)
    }

    /// Where `record`'s data lives. Weights are matched by address inside a
    /// model mapping, else by name (a copy: repacked, or loaded without mmap).
    pub fn memory_of(&mut self, record: &TensorRecord) -> Memory {
        if record.data == 0 {
            return Memory::Unmapped;
        }
        let name = tensor_name(record);
        if let Some(t) = self.space.tensor_for(record.data, name) {
            return match t.offset_in_tensor {
                Some(offset) if !t.copy => Memory::ModelFile { model: t.model, tensor: t.tensor, offset },
                _ => Memory::Copy { model: t.model, tensor: t.tensor },
            };
        }
        match self.space.resolve(record.data) {
            Resolution::Anon { .. } => match self.copies.find(self.pid, &self.models, record) {
                Some((model, tensor)) => Memory::Copy { model, tensor },
                None => Memory::Anon,
            },
            // Inside a model file but not in a tensor (its header): no tensor to name.
            Resolution::OtherFile { .. } | Resolution::ModelFile { .. } => Memory::OtherFile,
            Resolution::Unmapped => Memory::Unmapped,
        }
    }

    /// Refresh the maps (rate-limited) when some record's data is not
    /// covered by them: new mappings (the model, grown heaps) since the last read.
    pub fn prepare_records<'a>(&mut self, mut records: impl Iterator<Item = &'a TensorRecord>) {
        // Only whether it is mapped: no tensor lookup for every record of a graph.
        let stale = records.any(|t| t.data != 0 && self.space.region_of(t.data).is_none());
        if stale && self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL) {
            self.refresh();
        }
    }
}

fn same_inode(path: &Path, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same = std::fs::metadata(path).is_ok_and(|m| m.ino() == inode);
    if !same {
        log::debug!("{} here is not the file the target maps (inode {inode})", path.display());
    }
    same
}

/// Whether `path` starts with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// The trace's view of a model: its tensor table, and per file where it
/// lives on disk (FIEMAP needs root; without it the extents stay empty).
pub fn model_table(model: &ModelMap) -> (ModelTable, Vec<WatchedFile>) {
    let mut file_info = Vec::new();
    let mut watched = Vec::new();
    for f in model.files() {
        let key = FileKey { dev: kernel_dev(libc::major(f.dev), libc::minor(f.dev)), _pad: 0, ino: f.ino };
        let extents = FileExtents::read(&f.path)
            .inspect_err(|e| {
                log::warn!("no physical extents for {}: {e}; block reads cannot be attributed", f.path.display())
            })
            .ok();
        let device = extents.as_ref().map(|x| &x.device);
        let disk_dev = device.and_then(|d| Some(kernel_dev(d.disk_major?, d.disk_minor?)));
        let partition_start = device.map_or(0, |d| d.partition_start_sector);
        let list: Vec<FileExtent> = extents
            .iter()
            .flat_map(|x| &x.extents)
            .map(|e| FileExtent { logical: e.logical, physical: e.physical, length: e.length })
            .collect();
        let mut disk_ranges: Vec<(u64, u64)> = list
            .iter()
            .map(|e| (partition_start * 512 + e.physical, partition_start * 512 + e.physical + e.length))
            .collect();
        disk_ranges.sort_unstable();
        watched.push(WatchedFile { key, disk_dev, disk_ranges });
        file_info.push(FileInfo {
            dev: key.dev,
            ino: f.ino,
            size: f.size,
            disk_dev,
            disk_name: device.and_then(|d| d.disk.clone()),
            partition_start_sector: partition_start,
            extents: list,
            read_ahead_kb: crate::live::target::read_ahead_kb(
                (libc::major(f.dev), libc::minor(f.dev)),
                device.and_then(|d| Some((d.disk_major?, d.disk_minor?))),
            ),
        });
    }
    let table = ModelTable {
        files: model.files().iter().map(|f| f.path.display().to_string()).collect(),
        file_info,
        architecture: model.info().architecture,
        tensors: model
            .tensors()
            .iter()
            .map(|t| ModelTensor {
                name: t.name.clone(),
                file: t.file,
                file_offset: t.file_offset,
                size_bytes: t.size_bytes,
                type_name: t.ggml_type.name.to_string(),
                shape: t.shape.clone(),
                layer: t.layer,
                component: t.component.as_str().to_string(),
                expert_bytes: t.expert_bytes,
            })
            .collect(),
    };
    (table, watched)
}
