//! The child of `ttrace run -- CMD ARGS...`: forked, then held before exec
//! so its pid is known (and probes can be scoped to it) before any of its
//! code runs.
//!
//! Two CLOEXEC pipes: the child blocks reading "release" until the parent
//! writes a byte (EOF means the parent gave up: the child exits); a failed
//! user switch or exec writes `[step, errno]` into "status", while a
//! successful exec closes it. Between fork and exec the child only makes
//! async-signal-safe calls; everything it needs is prepared before fork.

use std::{
    ffi::{CString, OsStr, OsString},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, process::ExitStatusExt},
    },
    path::{Path, PathBuf},
    process::ExitStatus,
};

use super::{TargetError, UserSpec, errno_text, libs::which_in};

unsafe extern "C" {
    static mut environ: *const *const libc::c_char;
}

#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Run as this user (needs root). `None` keeps the current user.
    pub user: Option<UserSpec>,
    /// Environment changes applied after the user's HOME/USER/LOGNAME:
    /// `Some` sets, `None` removes.
    pub env: Vec<(OsString, Option<OsString>)>,
    /// The command's stdout and stderr, when not ttrace's own: descriptors
    /// the caller keeps open until `spawn` returns (`top` keeps its screen
    /// and its JSON lines to itself).
    pub stdout: Option<std::os::fd::RawFd>,
    pub stderr: Option<std::os::fd::RawFd>,
}

/// Why [`spawn_limited`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnLimitedError {
    #[error(transparent)]
    Spawn(#[from] TargetError),
    #[error(transparent)]
    Cgroup(#[from] super::CgroupError),
}

/// Start `argv` held before exec, in a memory cgroup of `mem_limit` when
/// given (`run`, `top` and `sweep` alike). The held child joins the cgroup
/// before it runs any code; dropping the cgroup (also on errors and Ctrl-C
/// paths) moves it out and removes it.
pub fn spawn_limited(
    argv: &[OsString],
    opts: SpawnOptions,
    mem_limit: Option<u64>,
    hint: &str,
) -> Result<(HeldChild, Option<super::MemoryCgroup>), SpawnLimitedError> {
    let child = HeldChild::spawn(argv, opts)?;
    let cgroup = match mem_limit {
        Some(limit) => {
            let cgroup = super::MemoryCgroup::create(hint, limit)?;
            cgroup.add_pid(child.pid())?;
            Some(cgroup)
        }
        None => None,
    };
    Ok((child, cgroup))
}

/// Steps that can fail in the child, as sent through the status pipe.
const STEP_SETGROUPS: u8 = 1;
const STEP_SETGID: u8 = 2;
const STEP_SETUID: u8 = 3;
const STEP_EXEC: u8 = 4;

/// A forked child waiting before exec. Dropping it kills and reaps it.
#[derive(Debug)]
pub struct HeldChild {
    pid: libc::pid_t,
    release: Option<OwnedFd>,
    status: Option<OwnedFd>,
    program: String,
    user: Option<String>,
    exe: Option<PathBuf>,
    ld_library_path: Option<OsString>,
}

/// A child that has exec'd the program.
#[derive(Debug)]
pub struct RunningChild {
    pid: libc::pid_t,
    exit: Option<ExitStatus>,
}

impl HeldChild {
    pub fn spawn(argv: &[OsString], opts: SpawnOptions) -> Result<Self, TargetError> {
        let program_os = argv.first().ok_or(TargetError::EmptyCommand)?;
        let program = program_os.to_string_lossy().into_owned();
        let env = child_env(&opts);
        let path_var = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_os_str());
        let exe = which_in(program_os, path_var).ok();
        let ld_library_path = env.iter().find(|(k, _)| k == "LD_LIBRARY_PATH").map(|(_, v)| v.clone());

        let c_argv = argv.iter().map(|a| c_string(a.as_bytes())).collect::<Result<Vec<_>, _>>()?;
        let c_env = env
            .iter()
            .map(|(k, v)| c_string(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<Result<Vec<_>, _>>()?;
        let argv_ptrs: Vec<*const libc::c_char> =
            c_argv.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let env_ptrs: Vec<*const libc::c_char> =
            c_env.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let ids = opts.user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone()));

        let fail = |step, source| TargetError::Fork { program: program.clone(), step, source };
        let (release_r, release_w) = pipe().map_err(|e| fail("pipe", e))?;
        let (status_r, status_w) = pipe().map_err(|e| fail("pipe", e))?;

        // SAFETY: the child only calls async-signal-safe functions (see `child`).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(fail("fork", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            drop(release_w);
            drop(status_r);
            let output = [(opts.stdout, libc::STDOUT_FILENO), (opts.stderr, libc::STDERR_FILENO)];
            // SAFETY: pointers and fds were all prepared before fork and stay alive.
            unsafe { child(release_r.as_raw_fd(), status_w.as_raw_fd(), ids.as_ref(), &argv_ptrs, &env_ptrs, output) }
        }
        drop(release_r);
        drop(status_w);
        Ok(Self {
            pid,
            release: Some(release_w),
            status: Some(status_r),
            program,
            user: opts.user.map(|u| u.name),
            exe,
            ld_library_path,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The file `execvp` will run, when the PATH lookup finds it now.
    pub fn exe(&self) -> Option<&Path> {
        self.exe.as_deref()
    }

    /// LD_LIBRARY_PATH of the child's environment, for `resolve_needed`.
    pub fn ld_library_path(&self) -> Option<&OsStr> {
        self.ld_library_path.as_deref()
    }

    /// Lets the child switch user and exec. Returns once the exec happened,
    /// or the reason it did not (the child is then reaped).
    pub fn release(mut self) -> Result<RunningChild, TargetError> {
        let (Some(release), Some(status)) = (self.release.take(), self.status.take()) else {
            return Err(TargetError::Exec { program: self.program.clone(), reason: "released twice".into(), errno: 0 });
        };
        // A dead child makes this fail with EPIPE; its status pipe then tells why.
        let _ = write_all(release.as_raw_fd(), &[1]);
        drop(release);
        let mut report = [0u8; 5];
        let n = read_full(status.as_raw_fd(), &mut report);
        let pid = std::mem::replace(&mut self.pid, 0);
        let mut running = RunningChild { pid, exit: None };
        if n != report.len() {
            if n == 0 {
                return Ok(running);
            }
            // Partial report: treat as an exec failure of unknown cause.
            let _ = running.wait();
            return Err(TargetError::Exec { program: self.program.clone(), reason: "unknown error".into(), errno: 0 });
        }
        let _ = running.wait();
        let errno = i32::from_le_bytes([report[1], report[2], report[3], report[4]]);
        let reason = errno_text(errno);
        let program = self.program.clone();
        let user = self.user.clone().unwrap_or_default();
        Err(match report[0] {
            STEP_SETGROUPS => TargetError::SwitchUser { user, program, step: "setgroups", reason },
            STEP_SETGID => TargetError::SwitchUser { user, program, step: "setgid", reason },
            STEP_SETUID => TargetError::SwitchUser { user, program, step: "setuid", reason },
            _ => TargetError::Exec { program, reason, errno },
        })
    }
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        if self.pid <= 0 {
            return;
        }
        // Closing the release pipe alone makes the child exit; SIGKILL makes
        // sure, even if it is stopped.
        self.release = None;
        // SAFETY: our own unreaped child, so the pid cannot have been reused.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let mut running = RunningChild { pid: self.pid, exit: None };
        let _ = running.wait();
    }
}

impl RunningChild {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Blocks until the child exits and reaps it.
    pub fn wait(&mut self) -> Result<ExitStatus, TargetError> {
        self.wait_flags(0).map(|s| s.unwrap_or_else(|| ExitStatus::from_raw(0)))
    }

    /// Reaps the child if it has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, TargetError> {
        self.wait_flags(libc::WNOHANG)
    }

    fn wait_flags(&mut self, flags: libc::c_int) -> Result<Option<ExitStatus>, TargetError> {
        if let Some(exit) = self.exit {
            return Ok(Some(exit));
        }
        loop {
            let mut status = 0;
            // SAFETY: plain syscall on our own child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, flags) };
            if rc == self.pid {
                self.exit = Some(ExitStatus::from_raw(status));
                return Ok(self.exit);
            }
            if rc == 0 {
                return Ok(None);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(TargetError::Wait { pid: self.pid(), source: err });
            }
        }
    }

    /// SIGKILL, unless it was already reaped (its pid may be reused then).
    pub fn kill(&self) -> Result<(), TargetError> {
        self.signal(libc::SIGKILL)
    }

    /// Sends `signal` (e.g. forwarding SIGINT), unless the child was reaped.
    pub fn signal(&self, signal: libc::c_int) -> Result<(), TargetError> {
        if self.exit.is_some() {
            return Ok(());
        }
        // SAFETY: plain syscall on our own, unreaped child.
        if unsafe { libc::kill(self.pid, signal) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(TargetError::Wait { pid: self.pid(), source: err });
            }
        }
        Ok(())
    }
}

/// The environment the program gets: ours, with the target user's identity
/// variables, then the caller's changes.
fn child_env(opts: &SpawnOptions) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let mut set = |key: &str, value: Option<OsString>| {
        env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            env.push((key.into(), v));
        }
    };
    if let Some(user) = &opts.user {
        set("HOME", Some(user.home.clone().into_os_string()));
        set("USER", Some(user.name.clone().into()));
        set("LOGNAME", Some(user.name.clone().into()));
    }
    for (key, value) in &opts.env {
        set(&key.to_string_lossy(), value.clone());
    }
    env
}

fn c_string(bytes: &[u8]) -> Result<CString, TargetError> {
    CString::new(bytes).map_err(|_| TargetError::NulByte(String::from_utf8_lossy(bytes).into_owned()))
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads until `buf` is full or EOF; returns the bytes read.
fn read_full(fd: libc::c_int, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: the range n.. lies inside buf.
        let rc = unsafe { libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n) };
        if rc > 0 {
            n += rc as usize;
        } else if rc == 0 || errno() != libc::EINTR {
            break;
        }
    }
    n
}

fn write_all(fd: libc::c_int, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: buf is valid for reads of its length.
        let rc = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if rc > 0 {
            buf = &buf[rc as usize..];
        } else if rc == 0 || errno() != libc::EINTR {
            return false;
        }
    }
    true
}

fn errno() -> libc::c_int {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

/// The child between fork and exec: async-signal-safe calls only (read,
/// write, sigprocmask, signal, setgroups, setgid, setuid, execvp, _exit), no
/// allocation, no locks.
unsafe fn child(
    release: libc::c_int,
    status: libc::c_int,
    ids: Option<&(u32, u32, Vec<u32>)>,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    output: [(Option<libc::c_int>, libc::c_int); 2],
) -> ! {
    let report = |step: u8| -> ! {
        let e = errno().to_le_bytes();
        write_all(status, &[step, e[0], e[1], e[2], e[3]]);
        // SAFETY: _exit skips atexit handlers and stdio flushing of the parent's state.
        unsafe { libc::_exit(127) }
    };
    let mut byte = [0u8; 1];
    if read_full(release, &mut byte) != 1 {
        // The parent dropped us unreleased (or died).
        // SAFETY: as above.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: all arguments are valid; these calls are async-signal-safe.
    unsafe {
        // Rust ignores SIGPIPE and the tokio runtime may block signals: undo
        // both so the program starts like from a shell.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        for (from, to) in output {
            if let Some(from) = from {
                libc::dup2(from, to);
            }
        }
        if let Some((uid, gid, groups)) = ids {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                report(STEP_SETGROUPS);
            }
            if libc::setgid(*gid) != 0 {
                report(STEP_SETGID);
            }
            if libc::setuid(*uid) != 0 {
                report(STEP_SETUID);
            }
        }
        // execvp searches the PATH of `environ`, so it sees the child's PATH.
        environ = envp.as_ptr();
        libc::execvp(argv[0], argv.as_ptr());
    }
    report(STEP_EXEC)
}
