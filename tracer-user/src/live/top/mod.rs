//! `ttrace top`: a session's events summed per interval ([`aggregate`],
//! plain data), fed by a tap on the recorder ([`tap`]), shown on a full
//! screen ([`screen`]) or as one JSON object per interval.

pub mod aggregate;
pub mod screen;
pub mod tap;

use std::{
    fs::File,
    io::{BufWriter, Write},
    time::{Duration, Instant},
};

use aggregate::{Interval, MemoryUse, SortKey};
use screen::{Action, Screen};
use tap::Collector;

use crate::{
    events::Event,
    live::{
        recorder::{Recorder, Resolver},
        session::Tap,
        target::evict,
    },
};

/// Tensors in a JSON line's `top_tensors`.
pub const JSON_TOP_TENSORS: usize = 10;

/// Where intervals go.
pub enum Output {
    Screen(Box<Screen>),
    /// One object per line on stdout; `once`: the first full interval only.
    Json {
        once: bool,
    },
}

/// The memory cgroup's usage now, when the target runs in one `top` made.
pub type MemorySource = Box<dyn FnMut() -> Option<MemoryUse>>;

pub struct TopTap {
    collector: Collector,
    output: Output,
    interval: Duration,
    started: Instant,
    next_close: Instant,
    memory: Option<MemorySource>,
    /// `--drop-caches`: evict the model files when the target starts.
    evict_models: bool,
    /// A failed write to stdout or the terminal: stop.
    failed: bool,
}

impl TopTap {
    pub fn new(output: Output, interval: Duration, memory: Option<MemorySource>, evict_models: bool) -> Self {
        let now = Instant::now();
        Self {
            collector: Collector::default(),
            output,
            interval,
            started: now,
            next_close: now + interval,
            memory,
            evict_models,
            failed: false,
        }
    }

    fn emit(&mut self, interval: Interval) -> std::io::Result<()> {
        match &mut self.output {
            Output::Screen(screen) => screen.show(interval),
            Output::Json { .. } => {
                let mut line = serde_json::to_value(&interval).map_err(std::io::Error::other)?;
                let top = serde_json::to_value(interval.top(SortKey::Disk, JSON_TOP_TENSORS))
                    .map_err(std::io::Error::other)?;
                line["top_tensors"] = top;
                let mut out = std::io::stdout().lock();
                writeln!(out, "{line}")?;
                out.flush()
            }
        }
    }

    fn close(&mut self) -> std::io::Result<()> {
        let now_s = self.started.elapsed().as_secs_f64();
        let memory = self.memory.as_mut().and_then(|m| m());
        let interval = self.collector.close(now_s, memory);
        self.emit(interval)
    }
}

impl Tap for TopTap {
    fn started(&mut self, resolver: &mut Resolver) {
        self.collector.sync_models(resolver);
        if self.evict_models {
            for model in resolver.models() {
                for f in model.files() {
                    if let Err(e) = evict(&f.path) {
                        eprintln!("ttrace: cannot evict {} from the page cache: {e}", f.path.display());
                    }
                }
            }
        }
        self.started = Instant::now();
        self.next_close = self.started + self.interval;
        // The state as `top` starts (after --drop-caches): residency, nothing counted.
        if !matches!(self.output, Output::Json { once: true }) {
            self.failed |= self.close().is_err();
        }
    }

    fn on_event(&mut self, event: &Event, recorder: &mut Recorder<BufWriter<File>>) {
        self.collector.on_event(event, recorder);
    }

    fn tick(&mut self, resolver: &mut Resolver) -> bool {
        self.collector.sync_models(resolver);
        let mut quit = self.failed;
        if let Output::Screen(screen) = &mut self.output {
            match screen.poll_keys() {
                Ok(Action::Quit) | Err(_) => quit = true,
                Ok(Action::Redraw) => self.failed |= screen.draw().is_err(),
                Ok(Action::None) => {}
            }
        }
        let now = Instant::now();
        if now >= self.next_close {
            // Late ticks do not pile up: the next interval starts now.
            self.next_close = (self.next_close + self.interval).max(now + self.interval / 2);
            self.failed |= self.close().is_err();
            quit |= matches!(self.output, Output::Json { once: true });
        }
        quit || self.failed
    }
}

impl Drop for TopTap {
    /// The last, partial interval: what came in after the last full one
    /// (the session's final drain), so the lines sum to the whole run.
    fn drop(&mut self) {
        if matches!(self.output, Output::Json { once: false }) && !self.failed {
            let _ = self.close();
        }
    }
}
