//! A ring's files (`--max-size`) read as one run. Each file interns its
//! own strings, threads, descriptors, models and graphs from 0; the reader
//! turns a file's ids into its own, so a descriptor or model a later file
//! restates keeps the id it had, and yields events only: a later file's
//! restated models and buffers, and every END but the last, are not
//! records. A file read alone says where it sits in its run.

use std::{
    collections::{HashMap, VecDeque},
    io::Read,
    path::{Path, PathBuf},
};

use super::{
    super::{
        frames::{Descriptor, Header, Hooks, Lost, Memory, ModelTable},
        ring::{Members, RingError, RingRead},
    },
    TraceError, TraceReader, read_header,
};

type Opener<R> = Box<dyn FnMut(&Path) -> Result<R, TraceError>>;

pub(in crate::format) struct Chain<R> {
    /// The ring's base name, and its files after the current one.
    base: PathBuf,
    rest: VecDeque<PathBuf>,
    open: Option<Opener<R>>,
    /// The current file, when it is one of several.
    current: Option<PathBuf>,
    /// The run's id, from the first file's ring header.
    run: Option<String>,
    /// A file after the first is being read.
    later: bool,
    /// Graphs defined by the files before the current one.
    pub graph_base: u32,
    /// The lost-event counters when the first file read began.
    lost_base: Lost,
    /// The current file's BUFFER frames still to skip (restated, not new).
    carried_buffers: u32,
    /// Descriptors by value, once a later file is read.
    seen: HashMap<Descriptor, u32>,
}

impl<R> Chain<R> {
    /// The first (or only) file, whose header is `header`: a ring's file
    /// says which part of its run it holds.
    pub fn starting(header: &mut Header) -> Self {
        header.ring_read = header.ring.as_ref().map(|part| RingRead::starting(part, header.start_monotonic_ns));
        Self {
            base: PathBuf::new(),
            rest: VecDeque::new(),
            open: None,
            current: None,
            run: header.ring.as_ref().map(|part| part.run.clone()),
            later: false,
            graph_base: 0,
            lost_base: header.ring.as_ref().map(|part| part.lost_before).unwrap_or_default(),
            carried_buffers: 0,
            seen: HashMap::new(),
        }
    }

    pub fn has_more(&self) -> bool {
        !self.rest.is_empty()
    }

    /// `error`, naming the file it is in when there are several.
    pub fn in_file(&self, error: TraceError) -> TraceError {
        match &self.current {
            Some(path) => TraceError::InFile { file: path.display().to_string(), error: Box::new(error) },
            None => error,
        }
    }

    /// The current file ended without its END frame: only the last may.
    pub fn check_last(&self) -> Result<(), TraceError> {
        match (&self.current, self.rest.front()) {
            (Some(path), Some(next)) => {
                Err(RingError::CutShort { path: path.display().to_string(), next: next.display().to_string() }.into())
            }
            _ => Ok(()),
        }
    }

    /// The reader's id for descriptor `d`: a later file's restated one
    /// keeps its first id.
    pub fn add_descriptor(&mut self, descriptors: &mut Vec<Descriptor>, d: Descriptor) -> u32 {
        if self.later {
            if let Some(&id) = self.seen.get(&d) {
                return id;
            }
            self.seen.insert(d.clone(), descriptors.len() as u32);
        }
        descriptors.push(d);
        descriptors.len() as u32 - 1
    }

    /// A later file's model table that an earlier file defined: its id.
    pub fn known_model(&self, models: &[ModelTable], table: &ModelTable) -> Option<u32> {
        self.later.then(|| models.iter().position(|m| m == table).map(|i| i as u32)).flatten()
    }

    /// LOST frames count from the run's start: from the first file read's.
    pub fn lost_since_start(&self, lost: Lost) -> Lost {
        lost.saturating_sub(&self.lost_base)
    }

    /// Whether a BUFFER frame just read restates a buffer (skipped).
    pub fn skip_carried_buffer(&mut self) -> bool {
        let skip = self.carried_buffers > 0;
        self.carried_buffers = self.carried_buffers.saturating_sub(1);
        skip
    }
}

impl TraceReader<std::io::BufReader<std::fs::File>> {
    /// A ring's files present, as one run.
    pub(super) fn open_ring(members: Members) -> Result<Self, TraceError> {
        let mut paths: VecDeque<PathBuf> = members.files.iter().map(|(_, p)| p.clone()).collect();
        let first = paths.pop_front().expect("a ring has a file");
        let base = members.base.display().to_string();
        let mut reader = Self::new(super::open_file(&first)?)
            .map_err(|e| TraceError::InFile { file: first.display().to_string(), error: Box::new(e) })?;
        let Some(part) = &reader.header.ring else {
            return Err(RingError::NotMember { path: first.display().to_string(), base }.into());
        };
        if part.index != members.files[0].0 {
            let (found, expected) = (part.index, members.files[0].0);
            return Err(RingError::Renamed { path: first.display().to_string(), found, expected }.into());
        }
        let chain = &mut reader.chain;
        chain.base = members.base;
        chain.rest = paths;
        chain.open = Some(Box::new(|path: &Path| super::open_file(path)));
        chain.current = Some(first);
        Ok(reader)
    }
}

impl<R: Read> TraceReader<R> {
    /// Go on in the ring's next file; `false` after the last.
    pub(super) fn next_file(&mut self) -> Result<bool, TraceError> {
        let (Some(path), Some(open)) = (self.chain.rest.pop_front(), self.chain.open.as_mut()) else {
            return Ok(false);
        };
        let name = path.display().to_string();
        let in_file = |error| TraceError::InFile { file: name.clone(), error: Box::new(error) };
        let mut input = open(&path)?;
        let (header, offset) = read_header(&mut input).map_err(in_file)?;
        let base = self.chain.base.display().to_string();
        let Some(part) = header.ring.clone() else { return Err(RingError::NotMember { path: name, base }.into()) };
        let expected_run = self.chain.run.clone().unwrap_or_default();
        if part.run != expected_run {
            let first = self.header.ring_read.as_ref().map_or(0, |r| r.first_index);
            let first = crate::format::ring::member_path(&self.chain.base, first).display().to_string();
            return Err(
                RingError::MixedRuns { path: name, first, base, found: part.run, expected: expected_run }.into()
            );
        }
        let expected = self.header.ring_read.as_ref().map_or(0, |r| r.last_index) + 1;
        if part.index != expected {
            return Err(RingError::Renamed { path: name, found: part.index, expected }.into());
        }
        if !self.chain.later {
            self.chain.later = true;
            for (id, d) in self.descriptors.iter().enumerate() {
                self.chain.seen.entry(d.clone()).or_insert(id as u32);
            }
        }
        self.chain.graph_base += self.graphs.len() as u32;
        self.chain.carried_buffers = part.carried_buffers;
        self.chain.current = Some(path);
        (self.input, self.offset, self.last_ts) = (input, offset, header.start_monotonic_ns);
        (self.buf, self.pos, self.end) = (Vec::new(), 0, 0);
        (self.ended, self.truncated) = (false, false);
        self.strings.clear();
        self.threads.clear();
        self.local_ids.clear();
        self.local_models.clear();
        self.graphs.clear();
        self.header.maps = header.maps;
        let hooks = Hooks {
            libraries: header.libraries,
            op_names: header.op_names,
            unary_op_names: header.unary_op_names,
            glu_op_names: header.glu_op_names,
            build: header.build,
        };
        merge_hooks(&mut self.header, hooks);
        if let Some(read) = self.header.ring_read.as_mut() {
            read.last_index = part.index;
        }
        Ok(true)
    }

    /// The reader's id of the current file's model `model`. A lone file
    /// may name a model before its table (older writers): kept as is.
    pub(super) fn global_model(&self, model: u32) -> Result<u32, String> {
        match self.local_models.get(model as usize) {
            Some(&id) => Ok(id),
            None if !self.chain.later => Ok(model),
            None => Err(format!("model {model} not defined")),
        }
    }

    pub(super) fn global_memory(&self, memory: Memory) -> Result<Memory, String> {
        Ok(match memory {
            Memory::ModelFile { model, tensor, offset } => {
                Memory::ModelFile { model: self.global_model(model)?, tensor, offset }
            }
            Memory::Copy { model, tensor } => Memory::Copy { model: self.global_model(model)?, tensor },
            other => other,
        })
    }
}

/// Libraries probed after the header was written (a HOOKS frame, or a
/// ring's later file): new ones added; the build and op names if unknown.
pub fn merge_hooks(header: &mut Header, hooks: Hooks) {
    for library in hooks.libraries {
        if !header.libraries.contains(&library) {
            header.libraries.push(library);
        }
    }
    if header.build.is_none() {
        if header.llama_commit.is_none() {
            header.llama_commit = hooks.build.as_ref().and_then(|b| b.llama_commit.clone());
        }
        header.build = hooks.build;
    }
    if header.op_names.is_empty() {
        header.op_names = hooks.op_names;
        header.unary_op_names = hooks.unary_op_names;
        header.glu_op_names = hooks.glu_op_names;
    }
}
