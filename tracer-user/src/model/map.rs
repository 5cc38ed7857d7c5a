//! A model as llama.cpp sees it: one GGUF file or all shards of a split
//! model, with every tensor classified and indexed by name and file offset;
//! or whisper.cpp's model, one file in its legacy ggml format.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufRead, BufReader},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Serialize;

use super::{
    classify::{Component, classify, expert_layout},
    ggml_types::GgmlType,
    gguf::{GgufHeader, KeyValue, ParseError, Value},
    whisper_bin::{self, WhisperBinError},
};

// The cause is part of the message (not a `source`), so that anyhow's `{:#}`
// prints it once.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: {error}", path.display())]
    Parse { path: PathBuf, error: ParseError },
    #[error("{}: whisper.cpp's ggml format: {error}", path.display())]
    Whisper { path: PathBuf, error: WhisperBinError },
    #[error("{}: split model: {what}", path.display())]
    Split { path: PathBuf, what: String },
}

/// One GGUF file of a model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelFile {
    pub path: PathBuf,
    pub size: u64,
    /// `st_dev` and `st_ino`, which identify the file in /proc/PID/maps even
    /// when it is reached by another path or has been deleted.
    pub dev: u64,
    pub ino: u64,
    /// `path` with symlinks resolved, for matching maps by path.
    #[serde(skip)]
    pub canonical: Option<PathBuf>,
    pub version: u32,
    pub big_endian: bool,
    pub alignment: u64,
    pub data_offset: u64,
    pub n_kv: usize,
    pub n_tensors: usize,
    /// This file's own metadata (shards repeat some keys).
    #[serde(skip)]
    pub metadata: Vec<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tensor {
    pub name: String,
    /// Index into `ModelMap::files()`.
    pub file: u32,
    #[serde(rename = "type")]
    pub ggml_type: GgmlType,
    pub shape: Vec<u64>,
    pub file_offset: u64,
    pub size_bytes: u64,
    pub layer: Option<u32>,
    pub component: Component,
    pub n_experts: Option<u32>,
    pub expert_bytes: Option<u64>,
}

impl Tensor {
    /// The expert whose slice holds `offset_in_tensor`, for expert tensors.
    pub fn expert_at(&self, offset_in_tensor: u64) -> Option<u32> {
        expert_of(self.expert_bytes.unwrap_or(0), offset_in_tensor)
    }
}

pub(crate) fn expert_of(expert_bytes: u64, offset_in_tensor: u64) -> Option<u32> {
    (expert_bytes != 0).then(|| (offset_in_tensor / expert_bytes) as u32)
}

/// A tensor's byte range in its file, for lookups by offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub start: u64,
    pub end: u64,
    pub tensor: u32,
    pub expert_bytes: u64,
}

/// What address resolution needs, shared cheaply with `AddressSpace`.
#[derive(Debug)]
pub(crate) struct Index {
    /// Per file, sorted by start; empty tensors left out.
    pub spans: Vec<Vec<Span>>,
    pub by_name: HashMap<Box<str>, u32>,
}

impl Index {
    /// The tensor covering `offset` of file `file`, and the offset inside it.
    pub fn at(&self, file: usize, offset: u64) -> Option<(Span, u64)> {
        let spans = self.spans.get(file)?;
        let i = spans.partition_point(|s| s.start <= offset).checked_sub(1)?;
        let s = spans[i];
        (offset < s.end).then_some((s, offset - s.start))
    }
}

#[derive(Debug, Clone)]
pub struct ModelMap {
    files: Vec<ModelFile>,
    tensors: Vec<Tensor>,
    pub(crate) index: Arc<Index>,
}

/// Headline facts for summaries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelInfo {
    pub name: Option<String>,
    pub architecture: Option<String>,
    pub n_layers: Option<u64>,
    pub n_experts: Option<u64>,
    pub n_experts_used: Option<u64>,
    pub n_embd: Option<u64>,
    pub n_ctx_train: Option<u64>,
    pub file_type: Option<u64>,
}

impl ModelMap {
    /// Opens a GGUF model; for a split model (`NAME-0000i-of-0000N.gguf`, or
    /// `split.count` > 1), any shard opens all N shards.
    pub fn open(path: &Path) -> Result<ModelMap, GgufError> {
        let first = read_file(path)?;
        let from_name = split_name(path);
        let declared = first.1.get("split.count").and_then(Value::as_u64);
        let count = declared.or(from_name.as_ref().map(|s| s.count)).unwrap_or(1);
        if count <= 1 {
            return Self::from_files(vec![first]);
        }
        let split_err = |what: String| GgufError::Split { path: path.to_owned(), what };
        let Some(name) = from_name else {
            return Err(split_err(format!(
                "split.count is {count} but the name does not end in -NNNNN-of-{count:05}.gguf, so the other shards cannot be found"
            )));
        };
        if name.count != count {
            return Err(split_err(format!("split.count is {count} but the name says {}", name.count)));
        }
        let mut files = Vec::with_capacity(count as usize);
        for i in 1..=count {
            let shard = name.shard(i);
            let (p, h, id) = if shard == path { first.clone() } else { read_file(&shard)? };
            let err = |what: String| GgufError::Split { path: shard.clone(), what };
            if let Some(no) = h.get("split.no").and_then(Value::as_u64)
                && no != i - 1
            {
                return Err(err(format!("split.no is {no}, expected {} for shard {i} of {count}", i - 1)));
            }
            if let Some(n) = h.get("split.count").and_then(Value::as_u64)
                && n != count
            {
                return Err(err(format!("split.count is {n}, the first shard says {count}")));
            }
            files.push((p, h, id));
        }
        let declared_tensors = files[0].1.get("split.tensors.count").and_then(Value::as_u64);
        let total: usize = files.iter().map(|f| f.1.tensors.len()).sum();
        if let Some(n) = declared_tensors
            && n != total as u64
        {
            return Err(split_err(format!("split.tensors.count is {n}, but the {count} shards hold {total} tensors")));
        }
        Self::from_files(files)
    }

    /// A model from already parsed headers (e.g. from bytes); `dev`/`ino` 0
    /// when there is no file behind them.
    pub fn from_headers(headers: Vec<(PathBuf, GgufHeader)>) -> Result<ModelMap, GgufError> {
        Self::from_files(headers.into_iter().map(|(p, h)| (p, h, (0, 0))).collect())
    }

    fn from_files(files: Vec<(PathBuf, GgufHeader, (u64, u64))>) -> Result<ModelMap, GgufError> {
        let mut out_files = Vec::with_capacity(files.len());
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        let mut spans = Vec::with_capacity(files.len());
        for (file_idx, (path, h, (dev, ino))) in files.into_iter().enumerate() {
            let mut file_spans = Vec::with_capacity(h.tensors.len());
            for t in h.tensors {
                let idx = tensors.len() as u32;
                if by_name.insert(t.name.clone().into_boxed_str(), idx).is_some() {
                    let what = format!("tensor {:?} appears in more than one shard", t.name);
                    return Err(GgufError::Split { path, what });
                }
                let c = classify(&t.name);
                let experts = expert_layout(c.component, &t.shape, t.size_bytes);
                if t.size_bytes > 0 {
                    let (start, end) = (t.file_offset, t.file_offset + t.size_bytes);
                    file_spans.push(Span { start, end, tensor: idx, expert_bytes: experts.map_or(0, |e| e.1) });
                }
                tensors.push(Tensor {
                    name: t.name,
                    file: file_idx as u32,
                    ggml_type: t.ggml_type,
                    shape: t.shape,
                    file_offset: t.file_offset,
                    size_bytes: t.size_bytes,
                    layer: c.layer,
                    component: c.component,
                    n_experts: experts.map(|e| e.0),
                    expert_bytes: experts.map(|e| e.1),
                });
            }
            file_spans.sort_by_key(|s| (s.start, s.end));
            spans.push(file_spans);
            let canonical = if ino == 0 { None } else { path.canonicalize().ok() };
            out_files.push(ModelFile {
                path,
                size: h.file_size,
                dev,
                ino,
                canonical,
                version: h.version,
                big_endian: h.big_endian,
                alignment: h.alignment,
                data_offset: h.data_offset,
                n_kv: h.kv.len(),
                n_tensors: tensors.iter().filter(|t| t.file == file_idx as u32).count(),
                metadata: h.kv,
            });
        }
        Ok(ModelMap { files: out_files, tensors, index: Arc::new(Index { spans, by_name }) })
    }

    pub fn files(&self) -> &[ModelFile] {
        &self.files
    }

    /// All tensors, shard by shard, each in its file's info order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    pub fn tensor(&self, index: u32) -> Option<&Tensor> {
        self.tensors.get(index as usize)
    }

    pub fn by_name(&self, name: &str) -> Option<(u32, &Tensor)> {
        let i = *self.index.by_name.get(name)?;
        Some((i, &self.tensors[i as usize]))
    }

    /// The tensor holding byte `offset` of file `file`, and the offset inside it.
    pub fn tensor_at(&self, file: usize, offset: u64) -> Option<(u32, u64)> {
        self.index.at(file, offset).map(|(s, off)| (s.tensor, off))
    }

    /// The model's metadata: the first file's key/values.
    pub fn metadata(&self) -> &[KeyValue] {
        &self.files[0].metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata().iter().find(|kv| kv.key == key).map(|kv| &kv.value)
    }

    pub fn info(&self) -> ModelInfo {
        let arch = self.get("general.architecture").and_then(Value::as_str).map(str::to_owned);
        let arch_u64 = |k: &str| arch.as_ref().and_then(|a| self.get(&format!("{a}.{k}"))).and_then(Value::as_u64);
        ModelInfo {
            name: self.get("general.name").and_then(Value::as_str).map(str::to_owned),
            n_layers: arch_u64("block_count"),
            n_experts: arch_u64("expert_count"),
            n_experts_used: arch_u64("expert_used_count"),
            n_embd: arch_u64("embedding_length"),
            n_ctx_train: arch_u64("context_length"),
            file_type: self.get("general.file_type").and_then(Value::as_u64),
            architecture: arch,
        }
    }
}

type OpenedFile = (PathBuf, GgufHeader, (u64, u64));

fn read_file(path: &Path) -> Result<OpenedFile, GgufError> {
    let io_err = |error| GgufError::Io { path: path.to_owned(), error };
    let file = File::open(path).map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(io_err(std::io::Error::other("not a regular file")));
    }
    let mut reader = BufReader::with_capacity(1 << 16, file);
    // whisper.cpp's files begin with ggml's old magic; everything else is read as GGUF.
    let header = if reader.fill_buf().map_err(io_err)?.starts_with(&whisper_bin::MAGIC) {
        whisper_bin::read(reader, meta.len()).map_err(|error| GgufError::Whisper { path: path.to_owned(), error })?
    } else {
        GgufHeader::read(reader, meta.len()).map_err(|error| GgufError::Parse { path: path.to_owned(), error })?
    };
    Ok((path.to_owned(), header, (meta.dev(), meta.ino())))
}

/// `PREFIX-0000i-of-0000N.gguf`, llama.cpp's split naming.
#[derive(Debug, PartialEq)]
struct SplitName {
    prefix: PathBuf,
    count: u64,
}

impl SplitName {
    fn shard(&self, i: u64) -> PathBuf {
        let mut s = self.prefix.clone().into_os_string();
        s.push(format!("-{i:05}-of-{:05}.gguf", self.count));
        s.into()
    }
}

fn split_name(path: &Path) -> Option<SplitName> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || prefix.is_empty() {
        return None;
    }
    let count: u64 = count.parse().ok()?;
    let no: u64 = no.parse().ok()?;
    if no == 0 || no > count {
        return None;
    }
    Some(SplitName { prefix: path.with_file_name(prefix), count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let s = split_name(Path::new("/m/my model-00002-of-00003.gguf")).unwrap();
        assert_eq!(s.count, 3);
        assert_eq!(s.shard(1), Path::new("/m/my model-00001-of-00003.gguf"));
        assert_eq!(split_name(Path::new("/m/model.gguf")), None);
        assert_eq!(split_name(Path::new("/m/model-00004-of-00003.gguf")), None);
        assert_eq!(split_name(Path::new("/m/model-1-of-3.gguf")), None);
    }
}
