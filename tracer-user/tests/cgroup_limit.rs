//! Root tests of the `--mem-limit` cgroup and cold-cache support: the limit
//! really caps a child's page cache, cleanup leaves nothing behind even with
//! the child still running, stale cgroups are recognised, and drop_caches
//! empties the page cache.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

mod io_support;

use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
};

use ttrace::live::target::{CgroupVersion, MemoryCgroup, drop_caches};

const MIB: u64 = 1 << 20;

fn root() {
    io_support::require_root("memory cgroups");
}

/// The cgroup path of `pid` in the hierarchy the cgroup belongs to.
fn cgroup_of(pid: u32, version: CgroupVersion) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
            let hit = match version {
                CgroupVersion::V1 => ctrls.split(',').any(|c| c == "memory"),
                CgroupVersion::V2 => ctrls.is_empty(),
            };
            hit.then(|| path.to_string())
        })
        .unwrap()
}

#[test]
fn limit_caps_the_page_cache_of_a_child() {
    root();
    let dir = io_support::scratch("cgroup-limit");
    let file = dir.join("big.bin");
    let size = 256 * MIB;
    io_support::write_file(&file, size);
    io_support::evict(&file);
    assert!(io_support::resident_bytes(&file).0 < size / 10, "the file stayed cached after fadvise(DONTNEED)");

    let limit = 64 * MIB;
    let mut cg = MemoryCgroup::create("limit-test", limit).unwrap();
    eprintln!("cgroup {} ({}), why not v2: {:?}", cg.path().display(), cg.version(), cg.why_not_v2());
    assert_eq!(cg.limit_bytes(), limit);
    // The child waits for a line on stdin, so it is in the cgroup before it
    // reads anything: the stand-in for `ttrace run`'s held child.
    let mut child = Command::new("sh")
        .args(["-c", "read go && cat \"$1\" > /dev/null", "sh"])
        .arg(&file)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    cg.add_pid(child.id()).unwrap();
    assert_eq!(cg.pids().unwrap(), vec![child.id()]);
    assert!(cgroup_of(child.id(), cg.version()).ends_with(cg.path().file_name().unwrap().to_str().unwrap()));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());

    let stats = cg.stats().unwrap();
    let (resident, _) = io_support::resident_bytes(&file);
    eprintln!("{stats:?}, resident {} MiB of {}", resident / MIB, size / MIB);
    assert!(stats.usage_bytes <= limit, "{stats:?}");
    assert!(stats.peak_bytes.is_none_or(|p| p <= limit), "{stats:?}");
    assert!(stats.peak_bytes.is_none_or(|p| p >= limit / 2), "the child never filled the cgroup: {stats:?}");
    assert!(stats.limit_hits > 0, "reading 4x the limit never hit it: {stats:?}");
    assert_eq!(stats.oom_kills, 0, "page cache is reclaimable; nothing should be OOM-killed: {stats:?}");
    // Only what fit under the limit stays cached (plus a little readahead
    // slack that may be charged elsewhere).
    assert!(resident <= limit + 8 * MIB, "{} MiB of the file resident under a 64 MiB limit", resident / MIB);

    cg.remove().unwrap();
    assert!(!cg.path().exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn remove_moves_a_running_child_out_and_is_idempotent() {
    root();
    let mut cg = MemoryCgroup::create("", 32 * MIB).unwrap();
    let path = cg.path().to_path_buf();
    let parent = cgroup_of(std::process::id(), cg.version());
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    cg.add_pid(child.id()).unwrap();
    cg.remove().unwrap();
    assert!(!path.exists(), "{} left behind", path.display());
    assert_eq!(child.try_wait().unwrap(), None, "removing the cgroup must not kill the child");
    assert_eq!(cgroup_of(child.id(), cg.version()), parent, "the child is back in our own cgroup");
    cg.remove().unwrap();
    drop(cg);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn drop_removes_the_cgroup_even_with_an_unreaped_child() {
    root();
    let cg = MemoryCgroup::create("zombie", 32 * MIB).unwrap();
    let path = cg.path().to_path_buf();
    let mut child = Command::new("sh").args(["-c", "read x; exit 0"]).stdin(Stdio::piped()).spawn().unwrap();
    cg.add_pid(child.id()).unwrap();
    drop(child.stdin.take());
    // Exited but not yet reaped: a zombie still listed against the cgroup.
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(cg);
    assert!(!path.exists(), "{} left behind", path.display());
    assert!(child.wait().unwrap().success());
}

#[test]
fn add_pid_names_a_missing_process() {
    root();
    let cg = MemoryCgroup::create("", 32 * MIB).unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let e = cg.add_pid(pid).unwrap_err();
    assert!(e.to_string().contains(&format!("no process with pid {pid}")), "{e}");
}

#[test]
fn remove_stale_takes_only_empty_cgroups_of_dead_ttraces() {
    root();
    let live = MemoryCgroup::create("live", 32 * MIB).unwrap();
    let parent = live.path().parent().unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let stale = parent.join(format!("ttrace-{dead_pid}-0-crashed"));
    std::fs::create_dir(&stale).unwrap();
    let unrelated = parent.join(format!("ttrace-{dead_pid}-x"));
    std::fs::create_dir(&unrelated).unwrap();

    let removed = MemoryCgroup::remove_stale().unwrap();
    assert!(removed.contains(&stale), "{removed:?}");
    assert!(!stale.exists());
    assert!(live.path().exists(), "a live ttrace's cgroup was removed");
    assert!(unrelated.exists(), "a name not of the form ttrace-PID-N was removed");
    std::fs::remove_dir(&unrelated).unwrap();
    assert!(!removed.iter().any(|p| p == live.path() || p == &unrelated), "{removed:?}");
}

#[test]
fn drop_caches_evicts_a_read_file() {
    root();
    let dir = io_support::scratch("drop-caches");
    let file = dir.join("warm.bin");
    io_support::write_file(&file, 16 * MIB);
    std::fs::read(&file).unwrap();
    let (warm, size) = io_support::resident_bytes(&file);
    assert_eq!(warm, size, "a file just read should be fully resident");
    drop_caches().unwrap();
    let (cold, _) = io_support::resident_bytes(&file);
    assert!(cold < size / 100, "{cold} of {size} bytes still resident after drop_caches");
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
