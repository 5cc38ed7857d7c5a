//! I/O correlation against the kernel's own block tracer and a synthetic
//! target (root): block bytes attributed to the model file agree with the
//! `blk` tracer's issue (`D`) records, faults land on the right file offsets
//! and are classified major once on a cold cache, llama.cpp's prefetch reads
//! in the load phase, and a memory limit makes every token read from disk.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

use std::{
    path::{Path, PathBuf},
    process::Output,
};

use ttrace::{
    analyze::{self, Analysis, Phase},
    format::TraceReader,
    live::kernel_btf::{Scope, VMLINUX_BTF},
    model::FileExtents,
};

mod common;
mod io_support;
mod target_support;

use io_support::blkparse::{BlkLine, check_blkparse_lines, parse_blkparse};

fn ttrace(args: &[&str], trace: &Path, command: &[&str]) -> Output {
    let out = common::ttrace().args(args).arg("-o").arg(trace).arg("--").args(command).output().expect("run ttrace");
    assert!(out.status.success(), "ttrace {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn analyze(trace: &Path) -> Analysis {
    analyze::analyze(TraceReader::open(trace).unwrap()).unwrap()
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
fn block_requests_and_completions_match_the_kernel_blk_tracer() {
    common::require_root();
    let argv = llama(&target_support::private_model("moe"), "4");
    let (a, missing) = blk_oracle_run("blk-oracle", &["run", "--drop-caches"], &argv);
    assert_eq!(a.io.disk.uncompleted, missing as u64, "report: uncompleted reads are the missing completions");
}

/// A cold run of `moe` streamed from its own disk under a memory limit (the
/// kernel matrix runs it in every kernel, on the guest's virtio disk).
#[test]
fn a_cold_memory_limited_run_on_its_own_disk_matches_the_blk_tracer() {
    common::require_root();
    let mut argv = llama(&target_support::private_model("moe"), "4");
    argv.extend(["-c", "512"].map(String::from));
    let (a, _) = blk_oracle_run("blk-moe-limit", &["run", "--drop-caches", "--mem-limit", "32M"], &argv);
    assert!(a.io.disk.issues > 0, "a cold run under a limit reads the model");
}

/// The real model streamed from disk under a memory limit, five times:
/// thousands of reads per run, issued and completed while uprobe programs
/// run on the same CPUs (which made perf-event tracepoint programs miss
/// about 0.3 % of them).
#[test]
fn five_cold_memory_limited_runs_of_the_real_model_match_the_blk_tracer() {
    common::require_root();
    let mut argv = llama(&target_support::private_model("gemma"), "8");
    argv.extend(["-c", "512"].map(String::from));
    let mut totals = Vec::new();
    for run in 0..5 {
        let (a, missing) =
            blk_oracle_run(&format!("blk-gemma-{run}"), &["run", "--drop-caches", "--mem-limit", "160M"], &argv);
        totals.push((a.io.disk.issues, a.io.disk.issue_bytes, missing));
    }
    println!("five runs: (requests, bytes, completions missing) {totals:?}");
    assert!(totals.iter().all(|&(n, _, _)| n > 1000), "a memory-limited run streams the model: {totals:?}");
}

/// Trace `argv` cold with the kernel's blk tracer alongside; ttrace's block
/// events in the model's extents are the blk tracer's: every issue (D) one
/// for one, every completion (C) it recorded, and no program run skipped by
/// the kernel. Completions may still be absent: this project's VM runs no
/// BPF program while its agent (PID 1, `process_api`) is current, so a
/// completion interrupting it reaches the blk tracer (ftrace) but no BPF
/// program, uncounted. The report counts those reads as uncompleted.
fn blk_oracle_run(name: &str, ttrace_args: &[&str], argv: &[String]) -> (Analysis, usize) {
    let model = PathBuf::from(&argv[2]);
    let extents = FileExtents::read(&model).unwrap();
    let device = extents.device.disk.clone().expect("model on a block device");
    let trace = scratch_trace(name);
    let blk = io_support::BlkTrace::start(&device);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = ttrace(ttrace_args, &trace, &argv);
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
        "{name}: blk tracer D records in the model's extents: {oracle_requests} requests, {oracle_bytes} bytes; \
         ttrace: {} issues, {} bytes ({} requests, {} bytes without re-issues)",
        disk.issues, disk.issue_bytes, disk.requests, disk.bytes
    );
    assert!(oracle_bytes > 0, "a cold run reads the model from disk");
    assert_eq!(a.lost.total(), 0);
    let trailer = a.trailer.as_ref().expect("a complete trace");
    // Issues the kernel skipped ttrace's program for (only where tracepoint
    // programs are preemptible): the blk tracer has them, ttrace counts them.
    let issue_misses: u64 =
        trailer.recursion_misses.iter().filter(|(p, _)| p.starts_with("block_rq_issue")).map(|(_, n)| n).sum();
    if issue_misses == 0 {
        assert_eq!((disk.issues, disk.issue_bytes), (oracle_requests, oracle_bytes), "requests and bytes");
    } else {
        assert!(disk.issues < oracle_requests && oracle_requests - disk.issues <= issue_misses);
    }
    // BTF tracepoints by default, where the kernel's BTF has the structs they
    // read (5.10's has no folios): perf-event ones otherwise.
    let btf = ttrace::live::kernel_btf::resolve(Path::new(VMLINUX_BTF), Scope::Tracepoints).is_ok();
    let flavour = if btf { ttrace::format::Tracepoints::Btf } else { ttrace::format::Tracepoints::Perf };
    assert_eq!(trailer.tracepoints, Some(flavour), "the default tracepoints");
    if !preemptible_tracepoint_programs() {
        assert_eq!(trailer.skipped.total(), 0, "recursion misses: {:?}", trailer.recursion_misses);
    }
    let summary = String::from_utf8_lossy(&out.stderr);
    let misses_row = if trailer.skipped.total() == 0 { "recursion misses" } else { "SKIPPED EVENTS" };
    assert!(!btf || summary.contains("BTF (tp_btf)") && summary.contains(misses_row), "{summary}");

    // The blkparse export: blkparse's columns, then what ttrace adds; its D
    // lines are the blk tracer's D records in the model's extents, its C lines
    // the blk tracer's C records there.
    let text_path = trace.with_extension("blk");
    let export =
        common::ttrace().args(["export", "--format", "blkparse", "-o"]).arg(&text_path).arg(&trace).output().unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let text = std::fs::read_to_string(&text_path).unwrap();
    let lines: Vec<BlkLine> = text.lines().map(parse_blkparse).collect();
    let completions_without_issue = check_blkparse_lines(&lines, &a, &extents);

    let key = |l: &BlkLine| (l.sector, l.sectors, l.rwbs.clone(), l.last.clone());
    let oracle = |action: char| -> Vec<(u64, u64, String, String)> {
        io_support::records_in_extents(&records, &extents, action)
            .into_iter()
            .map(|r| {
                let last =
                    if action == 'C' { r.error.map_or_else(String::new, |e| e.to_string()) } else { String::new() };
                (r.sector, r.nr_sectors, r.rwbs.clone(), last)
            })
            .collect()
    };
    // Every issue, one for one.
    let mut ours: Vec<_> = lines
        .iter()
        .filter(|l| l.action == 'D')
        .map(|l| (l.sector, l.sectors, l.rwbs.clone(), String::new()))
        .collect();
    let mut theirs = oracle('D');
    ours.sort_unstable();
    theirs.sort_unstable();
    let (only_ours, only_theirs) = multiset_difference(&ours, &theirs);
    assert!(
        only_ours.is_empty() && only_theirs.len() as u64 <= issue_misses,
        "D lines vs the blk tracer's: only ttrace's {only_ours:?}; only the blk tracer's {only_theirs:?}"
    );
    // A completion without its D line must be one of a request whose issue
    // the kernel skipped ttrace's program for (7.0 on, see
    // preemptible_tracepoint_programs); 7.2 gave one in 45 matrix runs.
    for (sector, sectors) in &completions_without_issue {
        assert!(
            only_theirs.iter().any(|d| (d.0, d.1) == (*sector, *sectors)),
            "a completion without issue ({sector} + {sectors}), not one of the issues the kernel skipped: \
             {only_theirs:?}"
        );
    }
    // Every completion ttrace recorded is one of the blk tracer's; those it
    // lacks are exactly the reads the report counts as uncompleted.
    let mut ours: Vec<_> = lines.iter().filter(|l| l.action == 'C').map(key).collect();
    let mut theirs = oracle('C');
    ours.sort_unstable();
    theirs.sort_unstable();
    assert!(!ours.is_empty(), "completions of the model's reads");
    let (only_ours, missing) = multiset_difference(&ours, &theirs);
    assert!(only_ours.is_empty(), "C lines the blk tracer lacks: {only_ours:?}");
    println!("{name}: C lines {} of the blk tracer's {}; missing {missing:?}", ours.len(), theirs.len());
    (a, missing.len())
}

/// Linux 7.0 runs tracepoint callbacks, BPF programs included, under
/// SRCU-fast instead of with preemption off (commit a46023d5616e,
/// "tracing: Guard __DECLARE_TRACE() use of __DO_TRACE_CALL() with
/// SRCU-fast"): a task preempted inside a program makes the same program
/// miss on that CPU until it resumes. The kernel counts each miss, and ttrace
/// reports the count; before 7.0 a miss here is a bug.
fn preemptible_tracepoint_programs() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    release.split('.').next().and_then(|major| major.parse::<u32>().ok()).is_some_and(|major| major >= 7)
}

/// What each sorted list has that the other lacks, counting repeats.
fn multiset_difference<T: Ord + Clone>(a: &[T], b: &[T]) -> (Vec<T>, Vec<T>) {
    let (mut i, mut j, mut only_a, mut only_b) = (0, 0, Vec::new(), Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => (i, j) = (i + 1, j + 1),
            (Some(x), Some(y)) if x < y => (only_a.push(x.clone()), i += 1).1,
            (Some(x), None) => (only_a.push(x.clone()), i += 1).1,
            (_, Some(y)) => (only_b.push(y.clone()), j += 1).1,
            (None, None) => unreachable!(),
        }
    }
    (only_a, only_b)
}

#[test]
fn synthetic_faults_land_on_their_file_offsets_and_are_major_once() {
    common::require_root();
    // A private copy: the cache drop cannot evict pages another process maps,
    // and other tests (or users) may be running llama.cpp on `tiny` right now.
    let trace = scratch_trace("touch");
    let model = trace.with_file_name("touch-model.gguf");
    std::fs::copy(target_support::model("tiny"), &model).unwrap();
    std::fs::File::open(&model).unwrap().sync_all().unwrap();
    let size = std::fs::metadata(&model).unwrap().len();
    // Scattered pages, not in file order, none adjacent (MADV_RANDOM: no readahead).
    let offsets: Vec<u64> = (0..24u64).map(|i| ((i * 7919 + 13) % (size / 4096 - 1)) * 4096 + 8 * i).collect();
    let touch = io_support::build_touch();
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
    let model = target_support::private_model("bench");
    let size = std::fs::metadata(&model).unwrap().len();
    let argv = llama(&model, "4");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();

    let cold = scratch_trace("bench-cold");
    ttrace(&["run", "--drop-caches"], &cold, &argv);
    let a = analyze(&cold);
    let load = a.io.by_when.get(&ttrace::analyze::io::When::Load).map_or(0, |w| w.disk.bytes);
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
    // Per layer from the per-(ubatch, tensor) bytes, each tensor's layer read
    // off its GGUF name.
    let table = &a.models[0];
    let mut by_tensor: std::collections::BTreeMap<u32, std::collections::BTreeMap<String, u64>> = Default::default();
    for e in &a.io.ubatch_tensor_bytes {
        let layer = e
            .tensor
            .and_then(|t| table.tensors[t as usize].name.strip_prefix("blk."))
            .and_then(|r| r.split_once('.'))
            .map_or_else(|| "none".to_string(), |(n, _)| n.to_string());
        *by_tensor.entry(e.ubatch).or_default().entry(layer).or_default() += e.bytes;
    }
    assert!(!a.io.ubatch_tensor_bytes_truncated);
    for u in &generate {
        let layers = a.io.ubatch_layer_bytes.get(&u.index).cloned().unwrap_or_default();
        println!("generate ubatch {}: {} disk bytes; by layer {:?}", u.index, u.disk_bytes, layers);
        assert!(u.disk_bytes > 0, "ubatch {} read nothing from disk under the limit", u.index);
        assert_eq!(layers.values().sum::<u64>(), u.disk_bytes, "ubatch {}: layers add up to the ubatch", u.index);
        assert_eq!(Some(&layers), by_tensor.get(&u.index), "ubatch {}: per-layer bytes by tensor", u.index);
        let read = layers.iter().filter(|(k, b)| k.as_str() != "none" && **b > 0).count();
        assert!(read > 1, "ubatch {}: several layers read from disk", u.index);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_ring_buffer_counts_lost_io_events_per_kind() {
    common::require_root();
    use std::os::unix::fs::MetadataExt;
    use ttrace::{
        events::Event,
        live::collect::EventStream,
        live::load::{LoadOptions, Tracer},
        live::recorder::kernel_dev,
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
    let mut tracer = Tracer::load(&LoadOptions { ring_bytes: 4096, ..Default::default() }).unwrap();
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
