//! A real kernel round trip: uprobe a function in this very binary and the
//! page-fault tracepoint, exercise both, and gather what the kernel sent.
//! `ttrace check` summarises it; the root integration tests assert on the raw
//! events it returns.

use std::{fs::OpenOptions, io, os::fd::AsRawFd, path::PathBuf, ptr::NonNull};

use tokio::sync::oneshot;
use tracer_common::{CallEvent, PageFaultEvent, programs};

use crate::{
    cli::TracepointChoice,
    events::Event,
    format::{Lost, Tracepoints},
    live::collect::{EventStream, spawn_logger},
    live::load::{LoadError, LoadOptions, Tracer},
};

/// The function `ttrace check` probes; its arguments are what it expects back.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn ttrace_selftest_probe(seq: u64, tag: u64) -> u64 {
    std::hint::black_box(seq ^ tag)
}

/// The function whose calls force a recursion miss (`ttrace check`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn ttrace_selftest_recursion(seq: u64) -> u64 {
    std::hint::black_box(seq)
}

/// What to exercise.
pub struct RoundTrip {
    /// Symbol of `function` in this executable.
    pub symbol: &'static str,
    pub function: extern "C" fn(u64, u64) -> u64,
    /// Calls made with args `(seq, seq ^ TAG)` for seq in 0..calls.
    pub calls: u64,
    /// Fresh pages of a file mapping written once each.
    pub pages: usize,
    pub ring_bytes: u32,
    /// false: nobody reads until the work is done (forces overflow on small rings).
    pub read_concurrently: bool,
    /// The page-fault tracepoint's flavour.
    pub tracepoints: TracepointChoice,
    /// Recursion misses to force (BTF tracepoints only).
    pub recursion_misses: u64,
}

/// Second argument of every call is `seq ^ TAG`, so arguments can be checked.
pub const TAG: u64 = 0x7474_7261_6365_0000;

/// What came back.
#[derive(Debug, Default)]
pub struct Observed {
    pub calls: Vec<CallEvent>,
    pub faults: Vec<PageFaultEvent>,
    pub lost: Lost,
    pub decode_errors: u64,
    /// The flavour that was loaded.
    pub tracepoints: Option<Tracepoints>,
    /// Recursion misses forced and as counted by the kernel (`None`:
    /// not forced, no BTF tracepoints).
    pub recursion_misses: Option<(u64, u64)>,
    /// Addresses written, one per page, in order.
    pub touched: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SelftestError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("self-test I/O")]
    Io(#[from] io::Error),
    #[error("self-test worker failed")]
    Join(#[from] tokio::task::JoinError),
}

pub async fn run(spec: RoundTrip) -> Result<Observed, SelftestError> {
    let exe = std::env::current_exe()?;
    let pid = std::process::id();
    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: spec.ring_bytes, tracepoints: Some(spec.tracepoints) })?;
    tracer.add_target(pid)?;
    tracer.attach_call_args(&exe, spec.symbol, Some(pid))?;
    // Only when pages are touched: the test harness runs other tests in this
    // process, whose faults would otherwise fill a small ring before the calls.
    if spec.pages > 0 {
        tracer.attach_page_faults()?;
    }
    let forced_misses = spec.recursion_misses;
    let forcing = forced_misses > 0 && tracer.attach_recursion_selftest(&exe, "ttrace_selftest_recursion", pid)?;
    let _log_task = tracer.take_logger().map(spawn_logger).transpose()?;
    let mut stream = EventStream::new(tracer.take_events()?)?;

    let mut observed = Observed::default();
    let mut sink = |event| match event {
        Event::Call(e) => observed.calls.push(e),
        Event::PageFault(e) => observed.faults.push(e),
        _ => {}
    };
    let concurrent = spec.read_concurrently;
    let work = tokio::task::spawn_blocking(move || exercise(&spec));
    let touched = if concurrent {
        let (done_tx, done_rx) = oneshot::channel();
        let worker = tokio::spawn(async move {
            let result = work.await;
            let _ = done_tx.send(());
            result
        });
        stream
            .collect_until(
                async {
                    let _ = done_rx.await;
                },
                &mut sink,
            )
            .await?;
        worker.await???
    } else {
        let touched = work.await??;
        stream.drain_now(&mut sink);
        touched
    };
    observed.touched = touched;
    observed.decode_errors = stream.decode_errors;
    observed.lost = tracer.lost()?;
    observed.tracepoints = tracer.tracepoints();
    if forcing {
        for seq in 0..forced_misses {
            ttrace_selftest_recursion(seq);
        }
        let counted = tracer.recursion_misses()?.per_program.get(programs::RECURSION_SELFTEST).copied().unwrap_or(0);
        observed.recursion_misses = Some((forced_misses, counted));
    }
    Ok(observed)
}

/// Make the calls, then write one byte into each fresh page of a shared file
/// mapping (write faults on MAP_SHARED are never served by fault-around, so
/// each page faults exactly once).
fn exercise(spec: &RoundTrip) -> io::Result<Vec<u64>> {
    for seq in 0..spec.calls {
        std::hint::black_box((spec.function)(seq, seq ^ TAG));
    }
    touch_pages(spec.pages)
}

fn touch_pages(pages: usize) -> io::Result<Vec<u64>> {
    if pages == 0 {
        return Ok(Vec::new());
    }
    let page = page_size();
    let path = scratch_path();
    let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
    let _cleanup = RemoveOnDrop(path);
    file.set_len((pages * page) as u64)?;
    let len = pages * page;
    // SAFETY: fresh shared mapping of a file we own, unmapped below.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = NonNull::new(base.cast::<u8>()).expect("mmap returned null");
    let mut touched = Vec::with_capacity(pages);
    for i in 0..pages {
        // A distinct in-page offset per page makes every fault address unique.
        let offset = i * page + (i * 8) % page;
        // SAFETY: offset < len, inside the mapping.
        unsafe { base.as_ptr().add(offset).write_volatile(i as u8) };
        touched.push(base.as_ptr() as u64 + offset as u64);
    }
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
    Ok(touched)
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn scratch_path() -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    std::env::temp_dir().join(format!("ttrace-selftest-{}-{nanos}", std::process::id()))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
