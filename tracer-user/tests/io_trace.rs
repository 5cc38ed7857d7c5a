//! I/O correlation against the kernel's own block tracer and a synthetic
//! target (root): block bytes attributed to the model file agree with the
//! `blk` tracer's issue (`D`) records, faults land on the right file offsets
//! and are classified major once on a cold cache, llama.cpp's prefetch reads
//! in the load phase, and a memory limit makes every token read from disk.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use ttrace::{
    analyze::{self, Analysis, Phase},
    format::TraceReader,
    model::FileExtents,
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
    // lines are the blk tracer's D records in the model's extents, its C lines
    // the blk tracer's C records there.
    let text_path = trace.with_extension("blk");
    let export = Command::new(env!("CARGO_BIN_EXE_ttrace"))
        .args(["export", "--format", "blkparse", "-o"])
        .arg(&text_path)
        .arg(&trace)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let text = std::fs::read_to_string(&text_path).unwrap();
    let lines: Vec<BlkLine> = text.lines().map(parse_blkparse).collect();
    check_blkparse_lines(&lines, &a, &extents);

    let key = |r: &io_support::BlkRecord| (r.sector, r.nr_sectors, r.rwbs.clone());
    let mut ours: Vec<_> =
        lines.iter().filter(|l| l.action == 'D').map(|l| (l.sector, l.sectors, l.rwbs.clone())).collect();
    let mut theirs: Vec<_> = io_support::records_in_extents(&records, &extents, 'D').into_iter().map(key).collect();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs, "blkparse D lines vs the blk tracer's D records");
    let ours: Vec<_> = lines
        .iter()
        .filter(|l| l.action == 'C')
        .map(|l| (l.sector, l.sectors, l.rwbs.clone(), l.last.clone()))
        .collect();
    let theirs: Vec<_> = io_support::records_in_extents(&records, &extents, 'C')
        .into_iter()
        .map(|r| (r.sector, r.nr_sectors, r.rwbs.clone(), r.error.map_or_else(String::new, |e| e.to_string())))
        .collect();
    assert!(!ours.is_empty(), "completions of the model's reads");
    // Every C line is one of the blk tracer's. The kernel may not run
    // ttrace's completion program (it skips a tracepoint program while
    // another BPF program runs on that CPU): exactly the requests the report
    // counts as uncompleted, i.e. the D lines no C line follows.
    let mut missing = theirs.clone();
    for c in &ours {
        let i = missing.iter().position(|t| t == c).unwrap_or_else(|| panic!("C line {c:?} not in the blk tracer's"));
        missing.swap_remove(i);
    }
    let mut missing: Vec<(u64, u64)> = missing.into_iter().map(|(s, n, _, _)| (s, n)).collect();
    let mut open: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for l in &lines {
        if l.action == 'D' {
            open.insert(l.sector, l.sectors);
        } else {
            open.remove(&l.sector);
        }
    }
    let mut uncompleted: Vec<(u64, u64)> = open.into_iter().collect();
    missing.sort_unstable();
    uncompleted.sort_unstable();
    println!("C lines: {} of the blk tracer's {}; uncompleted {:?}", ours.len(), theirs.len(), uncompleted);
    assert_eq!(missing, uncompleted, "the blk tracer's completions ttrace lacks are its uncompleted reads");
    assert_eq!(a.io.disk.uncompleted, uncompleted.len() as u64, "report: uncompleted reads");
}

/// One line of `ttrace export --format blkparse`.
#[derive(Debug)]
struct BlkLine {
    dev: (u32, u32),
    ts_ns: u64,
    action: char,
    rwbs: String,
    sector: u64,
    sectors: u64,
    /// The bracket: the command of an issue, the error of a completion.
    last: String,
    /// ttrace's suffix: `key=value` pairs.
    suffix: std::collections::BTreeMap<String, String>,
    line: String,
}

/// blkparse's `%D %2c %8s %5T.%9t %5p %2a %3d %S + %n [%C]`, then the suffix.
fn parse_blkparse(line: &str) -> BlkLine {
    let (blk, suffix) = line.split_once("] ").unwrap_or((line, ""));
    let f: Vec<&str> = blk.split_whitespace().collect();
    assert!(f.len() == 11 && f[0].contains(',') && f[3].contains('.') && f[8] == "+", "not blkparse: {line}");
    let (major, minor) = f[0].split_once(',').unwrap();
    let (secs, nanos) = f[3].split_once('.').unwrap();
    assert_eq!(nanos.len(), 9, "nanosecond times: {line}");
    let action = f[5].chars().next().unwrap();
    assert_eq!(f[5].len(), 1, "{line}");
    let last = f[10].strip_prefix('[').unwrap_or_else(|| panic!("no [..] in {line}"));
    let last = last.strip_suffix(']').unwrap_or(last).to_string();
    let suffix = suffix
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("suffix `{kv}` is not key=value: {line}"));
            (k.to_string(), v.to_string())
        })
        .collect();
    BlkLine {
        dev: (major.parse().unwrap(), minor.parse().unwrap()),
        ts_ns: secs.parse::<u64>().unwrap() * 1_000_000_000 + nanos.parse::<u64>().unwrap(),
        action,
        rwbs: f[6].to_string(),
        sector: f[7].parse().unwrap(),
        sectors: f[9].parse().unwrap(),
        last,
        suffix,
        line: line.to_string(),
    }
}

/// What ttrace appends to each line, checked against the model's FIEMAP
/// extents and tensor table and the trace's ubatches: the first tensor the
/// request read, the file offset where it starts, its layer, the ubatch it
/// was issued (or completed) in; a completion carries the issue's tensor and
/// offset, its error in brackets, and follows its issue.
fn check_blkparse_lines(lines: &[BlkLine], a: &Analysis, extents: &FileExtents) {
    let table = &a.models[0];
    let base = extents.device.partition_start_sector * 512;
    let disk = (extents.device.disk_major.unwrap(), extents.device.disk_minor.unwrap());
    let start = a.header.start_monotonic_ns;
    // The request's file byte ranges, in disk order.
    let file_ranges = |sector: u64, sectors: u64| -> Vec<(u64, u64)> {
        let (from, to) = (sector * 512, (sector + sectors) * 512);
        let mut v: Vec<(u64, u64, u64)> = extents
            .extents
            .iter()
            .filter_map(|e| {
                let (s, end) = (base + e.physical, base + e.physical + e.length);
                (to.min(end) > from.max(s)).then(|| (s, e.logical + from.max(s) - s, e.logical + to.min(end) - s))
            })
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, f, t)| (f, t)).collect()
    };
    let mut by_offset: Vec<_> = table.tensors.iter().collect();
    by_offset.sort_by_key(|t| t.file_offset);
    let layer_of = |name: &str| {
        name.strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map_or_else(|| "-".to_string(), |(n, _)| n.to_string())
    };
    let mut issued: std::collections::HashMap<(u64, u64), &BlkLine> = std::collections::HashMap::new();
    let mut issues_by_when: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for l in lines {
        let line = &l.line;
        assert_eq!(l.dev, disk, "the model's disk: {line}");
        assert!(matches!(l.action, 'D' | 'C'), "{line}");
        assert!(l.rwbs.contains('R'), "model reads: {line}");
        let ranges = file_ranges(l.sector, l.sectors);
        assert!(!ranges.is_empty(), "only requests in the model's extents: {line}");
        assert_eq!(l.suffix["file_off"], ranges[0].0.to_string(), "{line}");
        let first = ranges
            .iter()
            .find_map(|&(f, t)| by_offset.iter().find(|x| x.file_offset < t && x.file_offset + x.size_bytes > f));
        let (name, layer) = first.map_or(("-".to_string(), "-".to_string()), |t| (t.name.clone(), layer_of(&t.name)));
        assert_eq!(l.suffix["tensor"], name, "{line}");
        assert_eq!(l.suffix["layer"], layer, "{line}");
        if let Some(t) = first {
            assert_eq!(t.layer.map_or_else(|| "-".to_string(), |n| n.to_string()), layer, "{line}");
        }
        // The ubatch: by time, against the trace's graphs.
        let ts = start + l.ts_ns;
        let when = &l.suffix["ubatch"];
        match when.as_str() {
            "load" => assert!(a.ubatches.first().is_none_or(|u| ts <= u.start_ns), "{line}"),
            "between" => {
                assert!(a.ubatches.first().is_some_and(|u| ts >= u.start_ns), "{line}");
                let inside = a.ubatches.iter().any(|u| u.start_ns < ts && u.end_ns.is_some_and(|e| ts < e));
                assert!(!inside, "between graphs, yet inside one: {line}");
            }
            k => {
                let u = &a.ubatches[k.parse::<usize>().unwrap_or_else(|_| panic!("ubatch={k}: {line}"))];
                assert!(u.start_ns <= ts && u.end_ns.is_none_or(|e| ts <= e), "{line} outside ubatch {k}");
            }
        }
        for k in l.suffix.keys() {
            assert!(["tensor", "file_off", "ubatch", "layer", "op", "tensors"].contains(&k.as_str()), "{line}");
        }
        if let Some(op) = l.suffix.get("op") {
            assert!(a.header.op_names.contains(op) && when.parse::<u32>().is_ok(), "{line}");
        }
        if l.action == 'D' {
            assert!(!l.last.is_empty(), "an issue names its command: {line}");
            let key = if when.parse::<u32>().is_ok() { format!("ubatch {when}") } else { when.clone() };
            *issues_by_when.entry(key).or_default() += 1;
            issued.insert((l.sector, l.sectors), l);
        } else {
            assert_eq!(l.last, "0", "a completion's error: {line}");
            assert!(!l.suffix.contains_key("op"), "op= only on issues: {line}");
            let d = issued.get(&(l.sector, l.sectors)).unwrap_or_else(|| panic!("a completion without issue: {line}"));
            assert!(d.ts_ns <= l.ts_ns, "{line}");
            for k in ["tensor", "file_off", "layer"] {
                assert_eq!(d.suffix[k], l.suffix[k], "{line} vs its issue {}", d.line);
            }
        }
    }
    // Per ubatch (and load, between), the issues are the ones the correlator counted.
    let counted: std::collections::BTreeMap<String, u64> =
        a.io.by_when.iter().filter(|(_, w)| w.disk.issues > 0).map(|(k, w)| (k.to_string(), w.disk.issues)).collect();
    assert_eq!(issues_by_when, counted, "D lines per ubatch vs report --json io.by_when");
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
    let model = target_support::model("bench");
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
