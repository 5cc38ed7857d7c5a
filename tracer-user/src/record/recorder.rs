//! Resolution at record time: every tensor descriptor is classified when it
//! is first written (model file + tensor + offset, copy by name, anonymous,
//! other file), against a snapshot of the target's maps that is refreshed
//! when a pointer is not covered, and model files are discovered as the
//! target maps them.

use std::{
    collections::HashSet,
    fs::File,
    io::{self, Read, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracer_common::TensorRecord;

use super::{
    format::{Memory, ModelTable, ModelTensor},
    writer::TraceWriter,
};
use crate::{
    events::Event,
    resolve::{
        AddressSpace, ModelMap, Resolution,
        maps::{parse_maps, read_maps},
    },
};

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
    pub maps_errors: u64,
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
            maps_errors: 0,
        }
    }

    pub fn models(&self) -> &[ModelMap] {
        &self.models
    }

    /// Re-read the target's maps, opening any GGUF file it maps for the first time.
    pub fn refresh(&mut self) {
        self.last_refresh = Some(Instant::now());
        let vmas = match read_maps(self.pid).and_then(|text| parse_maps(&text)) {
            Ok(vmas) => vmas,
            Err(e) => {
                // The target may be gone; keep the last snapshot.
                self.maps_errors += 1;
                log::debug!("re-reading maps of pid {}: {e}", self.pid);
                return;
            }
        };
        for vma in vmas.iter().filter(|v| v.is_file() && !v.deleted) {
            if self.checked_files.insert(vma.path.clone()) && is_gguf(&vma.path) && !self.covers(&vma.path) {
                match ModelMap::open(&vma.path) {
                    Ok(model) => {
                        self.new_models.push(model_table(&model));
                        self.models.push(model);
                    }
                    Err(e) => log::warn!("the target maps {}, but it does not read as GGUF: {e}", vma.path.display()),
                }
            }
        }
        self.space = AddressSpace::from_vmas(vmas, &self.models);
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
            Resolution::Anon { .. } => Memory::Anon,
            // Inside a model file but not in a tensor (its header): no tensor to name.
            Resolution::OtherFile { .. } | Resolution::ModelFile { .. } => Memory::OtherFile,
            Resolution::Unmapped => Memory::Unmapped,
        }
    }

    /// Refresh the snapshot (rate-limited) when a pointer of `op` is not
    /// covered by it: new mappings (the model, grown heaps) since the last read.
    pub fn prepare(&mut self, op: &crate::events::OpRecord) {
        let stale =
            op.tensors.iter().any(|t| t.data != 0 && matches!(self.space.resolve(t.data), Resolution::Unmapped));
        if stale && self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL) {
            self.refresh();
        }
    }
}

/// Writes decoded events to the trace, resolving as it goes.
pub struct Recorder<W: Write> {
    pub writer: TraceWriter<W>,
    pub resolver: Resolver,
}

impl<W: Write> Recorder<W> {
    pub fn record(&mut self, event: &Event) -> io::Result<()> {
        match event {
            Event::Op(op) => {
                self.resolver.prepare(op);
                // Models are defined before the first frame that refers to them.
                for table in self.resolver.take_new_models() {
                    self.writer.model(&table)?;
                }
                let resolver = &mut self.resolver;
                self.writer.op(op, &mut |r| resolver.memory_of(r))
            }
            Event::Call(call) => self.writer.marker(call),
            Event::PageFault(fault) => self.writer.fault(fault),
        }
    }
}

pub fn tensor_name(record: &TensorRecord) -> &str {
    let end = record.name.iter().position(|&b| b == 0).unwrap_or(record.name.len());
    std::str::from_utf8(&record.name[..end]).unwrap_or("")
}

fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

pub fn model_table(model: &ModelMap) -> ModelTable {
    ModelTable {
        files: model.files().iter().map(|f| f.path.display().to_string()).collect(),
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
    }
}
