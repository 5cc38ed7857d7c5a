//! Stopping: Ctrl-C and SIGTERM, the child's grace period, `--duration`.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use tokio::io::unix::AsyncFd;

use crate::{format::StopReason, live::target::RunningChild};

/// After Ctrl-C in `run`, how long the child may take to exit before SIGKILL.
pub(super) const CHILD_GRACE: Duration = Duration::from_secs(10);

/// First signal: `run` forwards it and waits for the child; `attach` detaches.
pub(super) fn on_signal(
    child: &mut Option<RunningChild>,
    sig: libc::c_int,
    interrupted_at: &mut Option<tokio::time::Instant>,
) -> Option<StopReason> {
    match child {
        Some(c) if interrupted_at.is_none() => {
            let _ = c.signal(sig);
            // Held at a library load: the signal acts once it runs.
            if crate::live::target::process_state(c.pid()) == Some('T') {
                let _ = c.signal(libc::SIGCONT);
            }
            *interrupted_at = Some(tokio::time::Instant::now());
            None
        }
        Some(c) => {
            let _ = c.kill();
            Some(StopReason::InterruptedTwice)
        }
        None => Some(StopReason::Detached),
    }
}

pub(super) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A pidfd, readable once `pid` has exited.
pub(super) fn pidfd(pid: u32) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    debug_assert!(owned.as_raw_fd() >= 0);
    crate::live::collect::register(owned)
}
