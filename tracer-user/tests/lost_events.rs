//! Lost events per kind (root): a full ring buffer is counted in the
//! program's own per-kind counters for block requests and page faults too
//! (page-cache fills: io_trace.rs), and `ttrace run`'s end-of-run summary
//! says so loudly when a target outruns the reader.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

use std::{
    fs::File,
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    process::Stdio,
    thread::sleep,
    time::{Duration, Instant},
};

use ttrace::{
    events::Event,
    format::{Lost, TraceReader},
    live::collect::EventStream,
    live::load::{LoadOptions, Tracer},
    live::recorder::kernel_dev,
    model::FileExtents,
};

mod common;
mod target_support;

use common::{alive, output_within, signal, stderr, ttrace};

/// One page of ring: a few dozen events fit, nobody reads them.
const TINY_RING: u32 = 4096;

/// A fresh directory on a real disk (the target dir), so files have blocks.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lost-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Fresh anonymous pages, no huge pages: one fault per page.
fn fault_pages(pages: usize) {
    let len = pages * 4096;
    // SAFETY: a private anonymous mapping, written inside its bounds and unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        for i in 0..pages {
            std::ptr::write_volatile(p.cast::<u8>().add(i * 4096), 1);
        }
        libc::munmap(p, len);
    }
}

fn drain(tracer: &mut Tracer, kind: fn(&Event) -> bool) -> u64 {
    let mut stream = EventStream::new(tracer.take_events().unwrap()).unwrap();
    let mut delivered = 0;
    stream.drain_now(&mut |e| delivered += kind(&e) as u64);
    delivered
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_ring_counts_lost_block_requests() {
    common::require_root();
    const CHUNK: usize = 64 << 10;
    const READS: usize = 256;
    let file = scratch("block").join("data.bin");
    std::fs::write(&file, vec![7u8; CHUNK * READS]).unwrap();
    File::open(&file).unwrap().sync_all().unwrap();
    let device = FileExtents::read(&file).unwrap().device;
    let disk = kernel_dev(device.disk_major.expect("a block device"), device.disk_minor.unwrap());

    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: TINY_RING, ..Default::default() }).unwrap();
    tracer.watch_block_device(disk).unwrap();
    tracer.attach_io().unwrap();
    // O_DIRECT: every read is at least one request of its own, issued and
    // completed (no page cache to serve it, no readahead to merge it).
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&file).unwrap();
    let layout = std::alloc::Layout::from_size_align(CHUNK, 4096).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let buf = unsafe { std::alloc::alloc(layout) };
    for _ in 0..READS {
        // SAFETY: `buf` holds CHUNK bytes.
        let n = f.read(unsafe { std::slice::from_raw_parts_mut(buf, CHUNK) }).unwrap();
        assert_eq!(n, CHUNK);
    }
    // SAFETY: allocated above with `layout`.
    unsafe { std::alloc::dealloc(buf, layout) };
    let lost = tracer.lost().unwrap();
    let delivered = drain(&mut tracer, |e| matches!(e, Event::Block(_)));
    // Other tests' programs run on the same CPUs: a block tracepoint that
    // fires while one runs is skipped by the kernel, not lost in the ring.
    let skipped = common::recursion_misses_of(std::process::id(), "block_rq");
    println!("block events: {delivered} delivered, {} lost, {skipped} skipped ({lost:?})", lost.block);
    assert!(delivered > 0 && lost.block > 0, "a one-page ring overflows on {READS} direct reads");
    assert!(delivered + lost.block + skipped >= 2 * READS as u64, "every request's issue and completion is counted");
    // Counted per kind: nothing of the other kinds was attempted.
    assert_eq!((lost.call, lost.op, lost.page_fault, lost.page_cache), (0, 0, 0, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_ring_counts_lost_page_faults() {
    common::require_root();
    const PAGES: usize = 4096;
    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: TINY_RING, ..Default::default() }).unwrap();
    tracer.add_target(std::process::id()).unwrap();
    tracer.attach_page_faults().unwrap();
    fault_pages(PAGES);
    let lost = tracer.lost().unwrap();
    let delivered = drain(&mut tracer, |e| matches!(e, Event::PageFault(_)));
    println!("page faults: {delivered} delivered, {} lost ({lost:?})", lost.page_fault);
    assert!(delivered > 0 && lost.page_fault > 0, "a one-page ring overflows on {PAGES} faults");
    // This process's other threads may fault too: at least ours are counted.
    assert!(delivered + lost.page_fault >= PAGES as u64);
    assert_eq!((lost.call, lost.op, lost.page_cache, lost.block), (0, 0, 0, 0));
}

/// SIGCONTs a SIGSTOPped process when dropped (also when the test fails).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Self {
        signal(pid, libc::SIGSTOP);
        let stopped = Self(pid);
        let start = Instant::now();
        while !all_threads_stopped(pid) {
            assert!(start.elapsed() < Duration::from_secs(10), "pid {pid} did not stop");
            sleep(Duration::from_millis(1));
        }
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('T')))
    })
}

fn wait_for_file(path: &Path, while_alive: u32) {
    let start = Instant::now();
    while !path.exists() {
        assert!(alive(while_alive), "ttrace exited before {} appeared", path.display());
        assert!(start.elapsed() < Duration::from_secs(60), "{} never appeared", path.display());
        sleep(Duration::from_millis(5));
    }
}

/// The counts on the summary's `LOST EVENTS  op A, call B, page_fault C,
/// page_cache D, block E: ...` line.
fn parse_lost_line(text: &str) -> Option<Lost> {
    let line = text.lines().find_map(|l| l.trim_start().strip_prefix("LOST EVENTS"))?;
    let counts = line.split(':').next()?;
    let mut lost = Lost::default();
    for part in counts.split(',') {
        let (kind, n) = part.trim().split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        match kind {
            "op" => lost.op = n,
            "call" => lost.call = n,
            "page_fault" => lost.page_fault = n,
            "page_cache" => lost.page_cache = n,
            "block" => lost.block = n,
            _ => return None,
        }
    }
    Some(lost)
}

/// Issue 5 item 10 / issue 6: lost events per kind in `ttrace run`'s own
/// summary. The smallest ring (1 MiB) and ttrace stopped (SIGSTOP) while
/// the target faults 32768 pages and reads a watched model cold: nobody
/// drains the ring, as when a real target outruns the reader.
#[test]
fn run_summary_reports_lost_events_per_kind_loudly() {
    common::require_root();
    let burst = common::build_helper("burst");
    let dir = scratch("run");
    let model = dir.join("model.gguf");
    std::fs::copy(target_support::model("tiny"), &model).unwrap();
    let [ready, go, done, trace] = ["ready", "go", "done", "trace.data"].map(|n| dir.join(n));
    let tracer = ttrace()
        .args(["run", "--ring-mb", "1", "--model"])
        .arg(&model)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .args([&burst, &ready, &go, &done, &model])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tracer_pid = tracer.id();
    wait_for_file(&ready, tracer_pid);
    {
        let _stopped = Stopped::new(tracer_pid);
        File::create(&go).unwrap();
        wait_for_file(&done, tracer_pid);
    }
    let out = output_within(tracer, Duration::from_secs(120), "ttrace run of the burst");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let shown = parse_lost_line(&err).unwrap_or_else(|| panic!("no LOST EVENTS line in the summary:\n{err}"));
    println!("summary: {shown:?}");
    assert!(err.contains("the ring buffer overflowed; raise --ring-mb"), "{err}");
    assert!(shown.page_fault > 0 && shown.page_cache > 0 && shown.block > 0, "{err}");
    assert_eq!((shown.op, shown.call), (0, 0), "no probe of those kinds was attached");
    // The same counts are in the trace, and `ttrace report` shows them.
    let analysis = ttrace::analyze::analyze(TraceReader::open(&trace).unwrap()).unwrap();
    assert_eq!(analysis.lost, shown);
    let report = ttrace().arg("report").arg(&trace).output().unwrap();
    assert!(report.status.success(), "{}", stderr(&report));
    assert_eq!(parse_lost_line(&String::from_utf8_lossy(&report.stdout)), Some(shown));
    let _ = std::fs::remove_dir_all(&dir);
}
