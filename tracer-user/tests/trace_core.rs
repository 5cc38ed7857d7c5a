//! `ttrace run` / `ttrace attach` against the real llama-completion (root):
//! MoE routing, attach and detach, and every fault case the issue names.
//! Token counts and weight tables are checked against llama's own counters
//! and the gguf reader in tests/python/test_trace_core.py.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use ttrace::record::{Memory, Record, TraceReader};

mod common;
mod target_support;

/// The release binary `cargo xtask test` built (TTRACE_BIN), else this build's.
fn ttrace() -> Command {
    Command::new(std::env::var_os("TTRACE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_ttrace").into()))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Kernel timestamp (CLOCK_MONOTONIC) of the first op in a trace.
fn first_op_ns(path: &Path) -> Option<u64> {
    let mut reader = TraceReader::open(path).ok()?;
    while let Ok(Some(record)) = reader.next_record() {
        if let Record::Op(op) = record {
            return Some(op.ts_ns);
        }
    }
    None
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last line on stderr must be ttrace's one-line error.
fn assert_fails_with(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "expected failure, got success:\n{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("ttrace: error: ") && last.contains(needle), "want `{needle}` in:\n{err}");
}

fn long_generation(model: &Path) -> Child {
    let llama = target_support::llama();
    Command::new(&llama.completion)
        .args(["-m"])
        .arg(model)
        .args(["-p", "hello world", "-n", "100000", "-no-cnv", "--ignore-eos", "--context-shift", "-t", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start llama-completion")
}

fn wait_for_mapping(pid: u32, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(needle) {
        assert!(Instant::now() < deadline, "pid {pid} never mapped {needle}");
        sleep(Duration::from_millis(20));
    }
}

/// Ops in a (possibly still growing or cut) trace.
fn count_ops(path: &Path) -> usize {
    let Ok(mut reader) = TraceReader::open(path) else { return 0 };
    let mut n = 0;
    while let Ok(Some(record)) = reader.next_record() {
        n += matches!(record, Record::Op(_)) as usize;
    }
    n
}

fn wait_for_ops(path: &Path, within: Duration) -> Duration {
    let start = Instant::now();
    while count_ops(path) == 0 {
        assert!(start.elapsed() < within, "no op recorded in {} within {within:?}", path.display());
        sleep(Duration::from_millis(25));
    }
    start.elapsed()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit_once(')').map(|(_, r)| r.trim_start().chars().next()), Some(Some('Z' | 'X'))))
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid as i32, sig) };
}

fn scratch_trace(name: &str) -> PathBuf {
    target_support::scratch(name).join("trace.data")
}

#[test]
fn moe_mul_mat_id_carries_expert_tensors_and_routing_ids() {
    common::require_root();
    let llama = target_support::llama();
    let out = scratch_trace("moe");
    let run = ttrace()
        .arg("run")
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&llama.completion)
        .arg("-m")
        .arg(target_support::model("moe"))
        .args(["-p", "hello world", "-n", "4", "-no-cnv", "--ignore-eos", "-t", "2"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));

    let mut reader = TraceReader::open(&out).unwrap();
    let mul_mat_id = reader.header().op_names.iter().position(|n| n == "MUL_MAT_ID").expect("op table") as i32;
    let (mut seen, mut experts_read) = (0, 0);
    while let Some(record) = reader.next_record().unwrap() {
        let Record::Op(op) = record else { continue };
        if reader.descriptor(op.dst).op != mul_mat_id {
            continue;
        }
        seen += 1;
        let src = |slot| op.srcs.iter().find(|(s, _)| *s == slot).map(|&(_, id)| reader.descriptor(id));
        let weights = src(0).expect("src[0]: the expert weights");
        assert!(weights.name.contains("_exps.weight"), "{}", weights.name);
        assert_eq!(weights.ne[2], 8, "8 experts stacked in dim 2");
        if let Memory::ModelFile { model, tensor, offset: 0 } = weights.memory {
            let table = &reader.models()[model as usize].tensors[tensor as usize];
            assert_eq!(table.name, weights.name);
            assert!(table.expert_bytes.is_some(), "expert slice size known for {}", table.name);
            experts_read += 1;
        }
        // src[2]: the routing ids, one row of expert_used_count ids per token.
        let ids = src(2).expect("src[2]: routing ids");
        assert_eq!(ids.type_id, tracer_common::ggml::TYPE_I32);
        assert_eq!(ids.ne[0], 2, "2 experts used per token");
        assert!(ids.data != 0 && ids.ne[1] >= 1);
    }
    // 4 layers × 3 expert matmuls × (warm-up + prompt + 3 generate).
    assert_eq!(seen, 4 * 3 * 5);
    assert_eq!(experts_read, seen);
}

#[test]
fn attach_records_within_a_second_and_detaches_leaving_target_running() {
    common::require_root();
    let mut target = long_generation(&target_support::model("tiny"));
    let pid = target.id();
    wait_for_mapping(pid, "libggml-cpu");
    let out = scratch_trace("attach");
    let spawned = monotonic_ns();
    let tracer =
        ttrace().args(["attach", "--pid", &pid.to_string(), "-o"]).arg(&out).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_ops(&out, Duration::from_secs(10));
    // When the kernel recorded the first op, counted from ttrace's start.
    let first_op = Duration::from_nanos(first_op_ns(&out).unwrap() - spawned);
    // Other tests run ttrace in parallel: follow this one's programs and links.
    let (progs, links) = (bpf_objects_of("prog", tracer.id()), bpf_objects_of("link", tracer.id()));
    sleep(Duration::from_millis(300));
    signal(tracer.id(), libc::SIGINT);
    let done = tracer.wait_with_output().unwrap();
    let still_running = alive(pid);
    let (progs_after, links_after) = (bpf_ids("prog"), bpf_ids("link"));
    let uprobe_events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    target.kill().unwrap();
    target.wait().unwrap();

    assert!(done.status.success(), "{}", stderr(&done));
    println!("first op recorded {first_op:?} after `ttrace attach` started");
    assert!(first_op < Duration::from_secs(1), "first op recorded {first_op:?} after ttrace started");
    assert!(still_running, "the target must survive the detach");
    assert!(stderr(&done).contains("detached; the target keeps running"), "{}", stderr(&done));
    assert!(progs.len() >= 3 && !links.is_empty(), "ttrace held programs {progs:?} and links {links:?}");
    assert!(progs.iter().all(|id| !progs_after.contains(id)), "programs {progs:?} still loaded: {progs_after:?}");
    assert!(links.iter().all(|id| !links_after.contains(id)), "links {links:?} still attached: {links_after:?}");
    assert!(!uprobe_events.contains("libggml"), "uprobes left behind:\n{uprobe_events}");
    assert!(count_ops(&out) > 0);
}

#[test]
fn attach_fails_clearly_for_missing_exited_and_non_ggml_pids() {
    common::require_root();
    assert_fails_with(&ttrace().args(["attach", "--pid", "4000000"]).output().unwrap(), "no process with pid 4000000");

    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = ttrace().args(["attach", "--pid", &sleeper.id().to_string()]).output().unwrap();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert_fails_with(&out, "has no ggml library loaded");

    // A target that is gone by the time ttrace looks at it: exited, not reaped.
    let mut quick = Command::new("true").spawn().unwrap();
    let pid = quick.id();
    while alive(pid) {
        sleep(Duration::from_millis(5));
    }
    let out = ttrace().args(["attach", "--pid", &pid.to_string()]).output().unwrap();
    quick.wait().unwrap();
    assert_fails_with(&out, "has already exited");
}

#[test]
fn a_library_without_the_hooks_is_refused() {
    common::require_root();
    let dir = target_support::scratch("fakeggml");
    std::fs::write(dir.join("fake.c"), "int ggml_something_else(void) { return 1; }\n").unwrap();
    target_support::cc(&["-shared", "-fPIC", "-o", "libggml-cpu.so", "fake.c"], &dir);
    let out = ttrace().arg("run").arg("--lib").arg(dir.join("libggml-cpu.so")).args(["--", "true"]).output().unwrap();
    assert_fails_with(&out, "has no symbol ggml_cpu_extra_compute_forward");
    // A program that never loads ggml at all.
    let out = ttrace().args(["run", "-o"]).arg(dir.join("t.data")).args(["--", "true"]).output().unwrap();
    assert_fails_with(&out, "never loaded a ggml CPU library");
}

#[test]
fn not_root_is_a_one_line_error() {
    common::require_root();
    for args in [&["run", "--", "true"][..], &["attach", "--pid", "1"], &["check"]] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
            .arg(ttrace().get_program())
            .args(args)
            .output()
            .unwrap();
        assert_fails_with(&out, "needs root");
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
}

#[test]
fn target_killed_mid_trace_keeps_the_trace_and_fails() {
    common::require_root();
    let out = scratch_trace("killed");
    let tracer = trace_long_generation(&out);
    let child = child_of(tracer.id());
    signal(child, libc::SIGKILL);
    let done = tracer.wait_with_output().unwrap();
    assert_fails_with(&done, "killed by signal 9");
    let analysis = ttrace::correlate::analyze(TraceReader::open(&out).unwrap()).unwrap();
    assert!(!analysis.truncated && analysis.ops > 0);
    assert_eq!(analysis.trailer.unwrap().exit_signal, Some(9));
}

#[test]
fn tracer_killed_leaves_a_readable_trace() {
    common::require_root();
    let out = scratch_trace("tracer-killed");
    let mut tracer = trace_long_generation(&out);
    let child = child_of(tracer.id());
    sleep(Duration::from_millis(300));
    tracer.kill().unwrap();
    tracer.wait().unwrap();
    signal(child, libc::SIGKILL);

    let report = ttrace().arg("report").arg(&out).output().unwrap();
    assert!(report.status.success(), "{}", stderr(&report));
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("trace cut short"), "{text}");
    let analysis = ttrace::correlate::analyze(TraceReader::open(&out).unwrap()).unwrap();
    assert!(analysis.truncated && analysis.ops > 0);
}

/// Ids of the BPF programs or links (`kind`) process `pid` holds open, from
/// its fdinfo (this bpftool does not report owning pids).
fn bpf_objects_of(kind: &str, pid: u32) -> Vec<u64> {
    let key = format!("{kind}_id:");
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    let mut ids: Vec<u64> = dir
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix(&key))
                .filter_map(|v| v.trim().parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn bpf_ids(kind: &str) -> Vec<u64> {
    bpftool_json(kind).into_iter().filter_map(|o| o["id"].as_u64()).collect()
}

fn bpftool_json(kind: &str) -> Vec<serde_json::Value> {
    let out = Command::new("bpftool").args(["-j", kind, "show"]).output().expect("bpftool (installed by set-up)");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// `ttrace run` of a long generation on `tiny`, once its first ops are in `out`.
fn trace_long_generation(out: &Path) -> Child {
    let llama = target_support::llama();
    let tracer = ttrace()
        .args(["run", "-o"])
        .arg(out)
        .arg("--")
        .arg(&llama.completion)
        .arg("-m")
        .arg(target_support::model("tiny"))
        .args(["-p", "hello world", "-n", "100000", "-no-cnv", "--ignore-eos", "--context-shift", "-t", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_ops(out, Duration::from_secs(30));
    tracer
}

/// The one child process of `pid` (ttrace run's target).
fn child_of(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    children.split_whitespace().next().expect("ttrace has a child").parse().unwrap()
}
