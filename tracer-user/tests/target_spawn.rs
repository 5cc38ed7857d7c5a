//! The held child of `ttrace run`: nothing of the program runs before
//! release, exec failures come back as errors, nothing is left behind.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

mod target_support;

use std::{
    ffi::OsString,
    os::unix::{fs::PermissionsExt, process::ExitStatusExt},
    path::Path,
    time::Duration,
};

use target_support::scratch;
use ttrace::live::target::{HeldChild, SpawnOptions, TargetError, UserSpec};

fn argv(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn sh(script: &str) -> Vec<OsString> {
    argv(&["sh", "-c", script])
}

/// The pid is a live process that has not exec'd yet: still our own image.
fn assert_held(pid: u32) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, std::fs::read_link("/proc/self/exe").unwrap(), "child exec'd before release");
}

#[test]
fn held_child_runs_only_after_release() {
    let dir = scratch("held");
    let file = dir.join("started");
    let held = HeldChild::spawn(&sh(&format!("echo started > {}", file.display())), SpawnOptions::default()).unwrap();
    assert!(held.exe().is_some_and(|p| p.ends_with("sh")), "{:?}", held.exe());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!file.exists(), "the program ran while held");
    assert_held(held.pid());
    let pid = held.pid();
    let mut running = held.release().unwrap();
    assert_eq!(running.pid(), pid);
    let status = running.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "started\n");
    // Waiting again returns the same status without touching the kernel.
    assert_eq!(running.wait().unwrap(), status);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn exec_failure_is_reported() {
    // A PATH of readable directories only: execvp reports EACCES when it met
    // an unreadable one (e.g. /root/.cargo/bin when not root).
    let opts =
        SpawnOptions { user: None, env: vec![("PATH".into(), Some("/usr/bin:/bin".into()))], ..Default::default() };
    let held = HeldChild::spawn(&argv(&["ttrace-no-such-cmd", "x"]), opts).unwrap();
    assert_eq!(held.exe(), None);
    let pid = held.pid();
    let err = held.release().unwrap_err();
    assert_eq!(err.to_string(), "cannot run `ttrace-no-such-cmd`: No such file or directory");
    assert!(matches!(err, TargetError::Exec { errno: libc::ENOENT, .. }));
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "failed child not reaped");

    let dir = scratch("noexec");
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = HeldChild::spawn(&[file.clone().into()], SpawnOptions::default()).unwrap().release().unwrap_err();
    assert_eq!(err.to_string(), format!("cannot run `{}`: Permission denied", file.display()));
    let _ = std::fs::remove_dir_all(dir);

    assert!(matches!(HeldChild::spawn(&[], SpawnOptions::default()), Err(TargetError::EmptyCommand)));
    assert!(matches!(HeldChild::spawn(&argv(&["a\0b"]), SpawnOptions::default()), Err(TargetError::NulByte(_))));
}

#[test]
fn dropping_a_held_child_leaves_nothing() {
    let dir = scratch("dropped");
    let file = dir.join("ran");
    let held = HeldChild::spawn(&sh(&format!("touch {}", file.display())), SpawnOptions::default()).unwrap();
    let pid = held.pid();
    assert_held(pid);
    drop(held);
    // Reaped: no /proc entry at all, so no zombie.
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still exists after drop");
    assert!(!file.exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn exit_status_try_wait_and_kill() {
    let mut running = HeldChild::spawn(&sh("exit 3"), SpawnOptions::default()).unwrap().release().unwrap();
    assert_eq!(running.wait().unwrap().code(), Some(3));
    running.kill().unwrap(); // reaped: a no-op, never a stray signal

    let mut running = HeldChild::spawn(&argv(&["sleep", "30"]), SpawnOptions::default()).unwrap().release().unwrap();
    assert_eq!(running.try_wait().unwrap(), None);
    running.kill().unwrap();
    assert_eq!(running.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(running.try_wait().unwrap().and_then(|s| s.signal()), Some(libc::SIGKILL));
}

#[test]
fn environment_changes_reach_the_program() {
    let dir = scratch("env");
    let file = dir.join("env");
    let opts = SpawnOptions {
        user: None,
        env: vec![
            ("TTRACE_TEST_SET".into(), Some("yes".into())),
            ("LD_LIBRARY_PATH".into(), Some("/opt/x".into())),
            ("HOME".into(), None),
        ],
        ..Default::default()
    };
    let script = format!("echo \"$TTRACE_TEST_SET ${{HOME-unset}} $LD_LIBRARY_PATH\" > {}", file.display());
    let held = HeldChild::spawn(&sh(&script), opts).unwrap();
    assert_eq!(held.ld_library_path(), Some("/opt/x".as_ref()));
    assert!(held.release().unwrap().wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "yes unset /opt/x\n");
    let _ = std::fs::remove_dir_all(dir);
}

/// `top` keeps its terminal: the command writes where it is told.
#[test]
fn output_goes_to_the_given_descriptors() {
    use std::os::fd::AsRawFd;
    let dir = scratch("output");
    let (out, err) = (dir.join("out"), dir.join("err"));
    let (out_file, err_file) = (std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap());
    let opts =
        SpawnOptions { stdout: Some(out_file.as_raw_fd()), stderr: Some(err_file.as_raw_fd()), ..Default::default() };
    let held = HeldChild::spawn(&sh("echo to-stdout; echo to-stderr >&2"), opts).unwrap();
    drop((out_file, err_file));
    assert!(held.release().unwrap().wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "to-stdout\n");
    assert_eq!(std::fs::read_to_string(&err).unwrap(), "to-stderr\n");
    let _ = std::fs::remove_dir_all(dir);
}

/// Needs root: `cargo xtask test` runs as root.
#[test]
fn runs_as_the_requested_user() {
    // SAFETY: geteuid has no failure modes.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test switches to user `nobody` and needs root: run `sudo -E cargo xtask test`");
    }
    let nobody = UserSpec::by_name("nobody").unwrap();
    let dir = scratch("user");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let file = dir.join("id");
    let script = format!("echo \"$(id -u) $(id -g) $(id -G) $USER $LOGNAME $HOME\" > {}", file.display());
    let opts = SpawnOptions { user: Some(nobody.clone()), env: vec![], ..Default::default() };
    let status = HeldChild::spawn(&sh(&script), opts).unwrap().release().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let groups: Vec<String> = nobody.groups.iter().map(u32::to_string).collect();
    let want = format!("{} {} {} nobody nobody {}\n", nobody.uid, nobody.gid, groups.join(" "), nobody.home.display());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), want);

    // A uid without a passwd entry (what sudo's SUDO_UID may give) still runs.
    let ghost = UserSpec { name: "ghost".into(), uid: 4000123, gid: 4000123, groups: vec![], home: "/".into() };
    let opts = SpawnOptions { user: Some(ghost), env: vec![], ..Default::default() };
    let status = HeldChild::spawn(&sh("exit 0"), opts).unwrap().release().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A failed user switch is an error naming the step, not a silent run as
/// the wrong user (EINVAL as root: too many groups; EPERM otherwise).
#[test]
fn failed_user_switch_is_reported() {
    let big =
        UserSpec { name: "big".into(), uid: 4000123, gid: 4000123, groups: vec![4000123; 70_000], home: "/".into() };
    let dir = scratch("switch");
    let file = dir.join("ran");
    let opts = SpawnOptions { user: Some(big), env: vec![], ..Default::default() };
    let held = HeldChild::spawn(&sh(&format!("touch {}", file.display())), opts).unwrap();
    let pid = held.pid();
    let err = held.release().unwrap_err();
    assert!(err.to_string().starts_with("cannot switch to user big (setgroups) before running `sh`: "), "{err}");
    assert!(!file.exists());
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "failed child not reaped");
    let _ = std::fs::remove_dir_all(dir);
}
