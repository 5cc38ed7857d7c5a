//! I/O correlation against the kernel's own block tracer and a synthetic
//! target (root): block bytes attributed to the model file agree with the
//! `blk` tracer's issue (`D`) records, faults land on the right file offsets
//! and are classified major once on a cold cache, llama.cpp's prefetch reads
//! in the load phase, and a memory limit makes every token read from disk.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use ttrace::{
    correlate::{self, Analysis, Phase},
    record::TraceReader,
    resolve::FileExtents,
};

mod common;
mod io_support;
mod target_support;

fn ttrace(args: &[&str], trace: &Path, command: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ttrace"))
        .args(args)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .args(command)
        .output()
        .expect("run ttrace");
    assert!(out.status.success(), "ttrace {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn analyze(trace: &Path) -> Analysis {
    correlate::analyze(TraceReader::open(trace).unwrap()).unwrap()
}

fn llama(model: &Path, n: &str) -> Vec<String> {
    let llama = target_support::llama();
    [llama.completion.display().to_string(), "-m".into(), model.display().to_string()]
        .into_iter()
        .chain(["-p", "hello world", "-n", n, "-no-cnv", "--ignore-eos", "-t", "2"].map(String::from))
        .collect()
}

fn scratch_trace(name: &str) -> PathBuf {
    target_support::scratch(name).join("trace.data")
}

#[test]
fn block_bytes_agree_with_the_kernel_blk_tracer() {
    common::require_root();
    let model = target_support::model("moe");
    let extents = FileExtents::read(&model).unwrap();
    let device = extents.device.disk.clone().expect("model on a block device");
    let trace = scratch_trace("blk-oracle");
    let blk = io_support::BlkTrace::start(&device);
    let argv = llama(&model, "4");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    ttrace(&["run", "--drop-caches"], &trace, &argv);
    let records = blk.stop();
    // Only what happened while ttrace traced: before that, ttrace itself read
    // the model's header (and then dropped the caches). Same clock: the blk
    // tracer runs with trace_clock=mono.
    let start = TraceReader::open(&trace).unwrap().header().start_monotonic_ns;
    let records: Vec<_> = records.into_iter().filter(|r| r.ts_ns >= start).collect();
    let (oracle_requests, oracle_bytes) = io_support::overlapping(&records, &extents);

    let a = analyze(&trace);
    let disk = &a.io.disk;
    println!(
        "blk tracer D records in the model's extents: {oracle_requests} requests, {oracle_bytes} bytes; \
         ttrace: {} issues, {} bytes ({} requests, {} bytes without re-issues)",
        disk.issues, disk.issue_bytes, disk.requests, disk.bytes
    );
    assert!(oracle_bytes > 0, "a cold run reads the model from disk");
    let ratio = |a: u64, b: u64| a.min(b) as f64 / a.max(b) as f64;
    assert!(ratio(disk.issue_bytes, oracle_bytes) >= 0.99, "bytes: ttrace {} vs blk {oracle_bytes}", disk.issue_bytes);
    assert!(ratio(disk.issues, oracle_requests) >= 0.99, "requests: ttrace {} vs blk {oracle_requests}", disk.issues);
    assert_eq!(a.lost.total(), 0);

    // The blkparse export: blkparse's columns, then what ttrace adds; its D
    // lines are the blk tracer's D records in the model's extents.
    let text_path = trace.with_extension("blk");
    let export = Command::new(env!("CARGO_BIN_EXE_ttrace"))
        .args(["export", "--format", "blkparse", "-o"])
        .arg(&text_path)
        .arg(&trace)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let text = std::fs::read_to_string(&text_path).unwrap();
    let mut ours: Vec<(u64, u64)> = Vec::new();
    for line in text.lines() {
        let (blk, suffix) = line.split_once("] ").map_or((line, ""), |(b, s)| (b, s));
        let f: Vec<&str> = blk.split_whitespace().collect();
        assert!(f.len() >= 11 && f[0].contains(',') && f[3].contains('.') && f[8] == "+", "not blkparse: {line}");
        if f[5] == "D" {
            assert!(suffix.contains("tensor=") && suffix.contains("file_off=") && suffix.contains("ubatch="), "{line}");
            ours.push((f[7].parse().unwrap(), f[9].parse().unwrap()));
        }
    }
    let mut theirs: Vec<(u64, u64)> = io_support::in_extents(&records, &extents);
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs, "blkparse D lines vs the blk tracer's D records");
}

#[test]
fn synthetic_faults_land_on_their_file_offsets_and_are_major_once() {
    common::require_root();
    let model = target_support::model("tiny");
    let size = std::fs::metadata(&model).unwrap().len();
    // Scattered pages, not in file order, none adjacent (MADV_RANDOM: no readahead).
    let offsets: Vec<u64> = (0..24u64).map(|i| ((i * 7919 + 13) % (size / 4096 - 1)) * 4096 + 8 * i).collect();
    let touch = io_support::build_touch();
    let trace = scratch_trace("touch");
    let mut argv = vec![touch.display().to_string(), model.display().to_string()];
    argv.extend(offsets.iter().map(u64::to_string));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let model_arg = model.display().to_string();
    ttrace(&["run", "--drop-caches", "--model", &model_arg], &trace, &argv);

    let a = analyze(&trace);
    let faulted: Vec<u64> = a.io.fault_pages.iter().map(|f| f.file_offset).collect();
    assert_eq!(faulted, offsets, "one fault per touched offset, at that very file offset, in order");
    assert!(a.io.fault_pages.iter().all(|f| f.major), "cold cache: every touched page read from disk");
    assert_eq!(
        (a.io.faults.model_file, a.io.faults.major, a.io.faults.minor),
        (offsets.len() as u64, offsets.len() as u64, 0)
    );
}

#[test]
fn prefetch_reads_in_the_load_phase_and_a_memory_limit_streams_every_token() {
    common::require_root();
    let model = target_support::model("bench");
    let size = std::fs::metadata(&model).unwrap().len();
    let argv = llama(&model, "4");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();

    let cold = scratch_trace("bench-cold");
    ttrace(&["run", "--drop-caches"], &cold, &argv);
    let a = analyze(&cold);
    let load = a.io.by_when.get("load").map_or(0, |w| w.disk.bytes);
    println!("cold bench run: {} of {} disk bytes in the load phase ({size} byte model)", load, a.io.disk.bytes);
    assert!(a.io.disk.bytes as f64 >= 0.9 * size as f64, "a cold run reads the model");
    assert!(load as f64 >= 0.95 * a.io.disk.bytes as f64, "prefetch: nearly all reads at load");

    // A small context and batch keep llama's own anonymous memory (KV cache,
    // compute buffers) well under the limit; the rest is page cache.
    let mut small = argv.clone();
    small.extend(["-c", "256", "-b", "64", "-ub", "64"]);
    let limited = scratch_trace("bench-limited");
    ttrace(&["run", "--drop-caches", "--mem-limit", "384M"], &limited, &small);
    let a = analyze(&limited);
    let generate: Vec<_> = a.ubatches.iter().filter(|u| u.phase == Phase::Generate).collect();
    assert_eq!(generate.len(), 3);
    for u in &generate {
        let layers = a.io.ubatch_layer_bytes.get(&u.index).cloned().unwrap_or_default();
        println!("generate ubatch {}: {} disk bytes; by layer {:?}", u.index, u.disk_bytes, layers);
        assert!(u.disk_bytes > 0, "ubatch {} read nothing from disk under the limit", u.index);
        assert!(layers.len() > 1, "per-layer bytes reported");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_ring_buffer_counts_lost_io_events_per_kind() {
    common::require_root();
    use std::os::unix::fs::MetadataExt;
    use ttrace::{
        collect::EventStream,
        events::Event,
        load::{LoadOptions, Tracer},
        record::recorder::kernel_dev,
    };
    let file = io_support::scratch("io-overflow").join("data.bin");
    io_support::write_file(&file, 32 << 20);
    io_support::evict(&file);
    let meta = std::fs::metadata(&file).unwrap();
    let key = tracer_common::FileKey {
        dev: kernel_dev(libc::major(meta.dev()), libc::minor(meta.dev())),
        _pad: 0,
        ino: meta.ino(),
    };

    // One page of ring and nobody reading while the file is read cold.
    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: 4096 }).unwrap();
    tracer.watch_file(key).unwrap();
    tracer.attach_io().unwrap();
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len(), 32 << 20);
    let lost = tracer.lost().unwrap();
    let mut stream = EventStream::new(tracer.take_events().unwrap()).unwrap();
    let mut delivered = 0;
    stream.drain_now(&mut |e| delivered += matches!(e, Event::PageCache(_)) as u64);
    println!("page-cache events: {delivered} delivered, {} lost; other kinds lost: {lost:?}", lost.page_cache);
    assert!(delivered > 0 && lost.page_cache > 0, "a one-page ring overflows on a 32 MiB cold read");
    // Counted per kind: nothing of the other kinds was attempted.
    assert_eq!((lost.call, lost.op, lost.page_fault), (0, 0, 0));
}
