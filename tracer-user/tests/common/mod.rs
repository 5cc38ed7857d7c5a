//! Shared by the root-only integration tests: running `ttrace`, watching
//! processes and trace files, and what BPF objects a process holds.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    thread::sleep,
    time::{Duration, Instant},
};

use ttrace::format::{Record, TraceReader};

/// The eBPF tests load real programs: without root they fail with one line
/// saying why, never skip.
pub fn require_root() {
    // SAFETY: geteuid has no failure modes.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this eBPF test loads programs into the kernel and needs root: run `sudo -E cargo xtask test`");
    }
}

/// The release binary `cargo xtask test` built (TTRACE_BIN), else this build's.
/// It gets SIGTERM when the test that started it ends, as after Ctrl-C it
/// then stops its own `run` target too.
pub fn ttrace() -> Command {
    let mut cmd = Command::new(std::env::var_os("TTRACE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_ttrace").into()));
    dies_with_test(&mut cmd, libc::SIGTERM);
    cmd
}

/// The process gets `sig` when the test thread that spawned it ends, also
/// when the test panics before its own clean-up: a leaked 100000-token
/// generation would otherwise load the machine for every later test.
pub fn dies_with_test(cmd: &mut Command, sig: libc::c_int) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, sig) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last line on stderr must be ttrace's one-line error (after what a
/// target it stopped may have left of its own last line).
pub fn assert_fails_with(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "expected failure, got success:\n{err}");
    let last = err.lines().last().unwrap_or_default();
    let own = last.find("ttrace: error: ").map(|at| &last[at..]);
    assert!(own.is_some_and(|line| line.contains(needle)), "want `{needle}` in:\n{err}");
}

/// Waits for `child` (stdout/stderr piped or not) at most `limit`; a child
/// still running then is killed and the test fails: nothing may hang.
pub fn output_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("waitpid").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still running after {limit:?} (killed); stderr:\n{}", stderr(&out));
        }
        sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit_once(')').map(|(_, r)| r.trim_start().chars().next()), Some(Some('Z' | 'X'))))
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid as i32, sig) };
}

/// The one child process of `pid` (ttrace run's target).
pub fn child_of(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    children.split_whitespace().next().expect("ttrace has a child").parse().unwrap()
}

pub fn wait_for_mapping(pid: u32, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(needle) {
        assert!(Instant::now() < deadline, "pid {pid} never mapped {needle}");
        sleep(Duration::from_millis(20));
    }
}

/// Ops in a (possibly still growing or cut) trace.
pub fn count_ops(path: &Path) -> usize {
    let Ok(mut reader) = TraceReader::open(path) else { return 0 };
    let mut n = 0;
    while let Ok(Some(record)) = reader.next_record() {
        n += matches!(record, Record::Op(_)) as usize;
    }
    n
}

pub fn wait_for_ops(path: &Path, within: Duration) -> Duration {
    let start = Instant::now();
    while count_ops(path) == 0 {
        assert!(start.elapsed() < within, "no op recorded in {} within {within:?}", path.display());
        sleep(Duration::from_millis(25));
    }
    start.elapsed()
}

/// Ids of the BPF programs or links (`kind`) process `pid` holds open, from
/// its fdinfo (this bpftool does not report owning pids).
pub fn bpf_objects_of(kind: &str, pid: u32) -> Vec<u64> {
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

/// Ids of every BPF program or link in the kernel, from the kernel's id
/// walk (`BPF_{PROG,LINK}_GET_NEXT_ID`). Not `bpftool prog|link show`: it
/// opens each id, and a link another test is creating at that moment has
/// its id but is not settled yet (`bpf_link_prime`), so the open fails with
/// EAGAIN and bpftool exits 255 ("can't get link by id (N): Resource
/// temporarily unavailable"; 2 in 16k listings beside 25 traced runs).
pub fn bpf_ids(kind: &str) -> Vec<u64> {
    // Commands from include/uapi/linux/bpf.h; `libc` does not carry them.
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
    let cmd = match kind {
        "prog" => BPF_PROG_GET_NEXT_ID,
        "link" => BPF_LINK_GET_NEXT_ID,
        other => panic!("bpf_ids: no id walk for {other:?}"),
    };
    // The `start_id, next_id, open_flags` member of `union bpf_attr`.
    #[repr(C)]
    struct NextId {
        start_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut ids = Vec::new();
    let mut attr = NextId { start_id: 0, next_id: 0, open_flags: 0 };
    loop {
        // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size passed.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, &mut attr as *mut NextId, std::mem::size_of::<NextId>()) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            assert_eq!(
                err.raw_os_error(),
                Some(libc::ENOENT),
                "bpf({kind} get next id after {}): {err}",
                attr.start_id
            );
            return ids;
        }
        ids.push(u64::from(attr.next_id));
        attr.start_id = attr.next_id;
    }
}

/// Runs of `pid`'s programs named `prefix…` that the kernel skipped because
/// another BPF program was running on that CPU (`recursion_misses`; bpftool
/// omits it when 0). Their events are neither delivered nor counted lost.
pub fn recursion_misses_of(pid: u32, prefix: &str) -> u64 {
    bpf_objects_of("prog", pid)
        .iter()
        .flat_map(|id| bpftool_json(&["prog", "show", "id", &id.to_string()]))
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .filter_map(|p| p["recursion_misses"].as_u64())
        .sum()
}

fn bpftool_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new("bpftool").arg("-j").args(args).output().expect("bpftool (installed by set-up)");
    // With -j, bpftool writes its errors as JSON on stdout, not on stderr.
    assert!(
        out.status.success(),
        "bpftool {args:?} ({}): {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    // `show` lists an array; `show id N` prints the one object.
    match serde_json::from_slice(&out.stdout) {
        Ok(serde_json::Value::Array(all)) => all,
        Ok(one @ serde_json::Value::Object(_)) => vec![one],
        other => panic!("bpftool {args:?} printed no JSON list or object: {other:?}"),
    }
}

/// Fails if anything of a finished ttrace is still in the kernel: one of
/// the programs or links it held (aya attaches uprobes as perf-event links
/// and keeps no perf fd: a link gone is its uprobe gone), or a ggml uprobe
/// in uprobe_events. The kernel closes an exited process's files from a
/// work queue (delayed fput), and a BTF tracepoint link's release waits for
/// RCU grace periods, so they may outlive the reaped process briefly: wait
/// up to 5 s for them to go.
pub fn assert_nothing_left(progs: &[u64], links: &[u64]) {
    let remaining = || {
        let (progs_now, links_now) = (bpf_ids("prog"), bpf_ids("link"));
        let left = progs.iter().any(|id| progs_now.contains(id)) || links.iter().any(|id| links_now.contains(id));
        (left, progs_now, links_now)
    };
    let started = std::time::Instant::now();
    let mut waited = false;
    while remaining().0 && started.elapsed() < std::time::Duration::from_secs(5) {
        waited = true;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if waited {
        println!("the kernel released ttrace's programs and links {:?} after it exited", started.elapsed());
    }
    let (_, progs_now, links_now) = remaining();
    assert!(progs.iter().all(|id| !progs_now.contains(id)), "programs {progs:?} still loaded: {progs_now:?}");
    assert!(links.iter().all(|id| !links_now.contains(id)), "links {links:?} still attached: {links_now:?}");
    let uprobe_events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    assert!(!uprobe_events.contains("libggml"), "uprobes left behind:\n{uprobe_events}");
}

/// The hook functions ttrace probes (tracer-user's session HOOKS), by library.
pub const HOOK_SITES: [&str; 6] = [
    "ggml_graph_compute",
    "ggml_cpu_extra_compute_forward",
    "ggml_compute_forward_rms_norm_mul_fused",
    "ggml_backend_sched_graph_compute_async",
    "llama_decode",
    "llama_perf_context_reset",
];

/// The per-node hooks: probed only with `--op-timing` (graph capture reads
/// the nodes at `ggml_graph_compute` instead).
pub const PER_NODE_HOOKS: [&str; 2] = ["ggml_cpu_extra_compute_forward", "ggml_compute_forward_rms_norm_mul_fused"];

/// x86's breakpoint instruction, which a uprobe writes over the first byte
/// of the probed instruction in the target's copy of the code.
pub const INT3: u8 = 0xcc;

/// For each hook function in a ggml/llama library `pid` maps: its first
/// byte in the process's memory and in the library file.
pub fn hook_site_bytes(pid: u32) -> Vec<(String, u8, u8)> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // (start, end, pgoff, path) of executable file mappings.
    let code: Vec<(u64, u64, u64, PathBuf)> = maps
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (range, perms, pgoff, path) = (f.first()?, f.get(1)?, f.get(2)?, f.get(5)?);
            let (a, b) = range.split_once('-')?;
            let hex = |v: &str| u64::from_str_radix(v, 16).ok();
            perms.contains('x').then_some((hex(a)?, hex(b)?, hex(pgoff)?, PathBuf::from(path)))
        })
        .collect();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut libs: Vec<&PathBuf> = code.iter().map(|c| &c.3).collect();
    libs.dedup();
    let mut out = Vec::new();
    for lib in libs {
        let name = lib.file_name().unwrap().to_string_lossy();
        if !name.starts_with("libggml") && !name.starts_with("libllama") {
            continue;
        }
        let offsets = ttrace::live::target::symbol_file_offsets(lib, &HOOK_SITES).unwrap();
        let file = std::fs::File::open(lib).unwrap();
        for (symbol, off) in HOOK_SITES.iter().zip(offsets) {
            let Some(off) = off else { continue };
            let Some(&(start, _, pgoff, _)) =
                code.iter().find(|(s, e, pg, p)| p == lib && *pg <= off && off < pg + (e - s))
            else {
                continue;
            };
            let (mut in_mem, mut in_file) = ([0u8], [0u8]);
            mem.read_exact_at(&mut in_mem, start + off - pgoff).unwrap();
            file.read_exact_at(&mut in_file, off).unwrap();
            out.push((symbol.to_string(), in_mem[0], in_file[0]));
        }
    }
    out
}

/// Builds `tests/common/NAME.c` once per test process into the target dir
/// and returns the executable.
pub fn build_helper(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common").join(format!("{name}.c"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("common");
    std::fs::create_dir_all(&dir).unwrap();
    // Per process, renamed into place: test binaries build concurrently.
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(["-ldl"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}): these tests build small C helpers"));
    assert!(out.status.success(), "cc {} failed:\n{}", src.display(), stderr(&out));
    let exe = dir.join(name);
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}
