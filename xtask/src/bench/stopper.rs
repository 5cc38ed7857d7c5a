//! A process a bench part started, stopped when the part ends however it
//! ends (a failed request, an error, a panic): nothing it started is left
//! running, burning the CPU the next part measures.

use std::{
    process::{Child, Command},
    thread::sleep,
    time::{Duration, Instant},
};

/// How long a stopped process gets to exit before it is killed: `ttrace
/// run` of a server writes its trace after the server stopped, which takes
/// seconds on a long run. The wait ends as soon as the process does.
const GRACE: Duration = Duration::from_secs(60);

pub struct StopOnDrop(Child, Duration);

/// SIGINT back to its default action, for this process and what it starts.
/// A bench run as a script's background job (`cargo xtask bench &`)
/// inherits SIGINT ignored, as does every process it starts: the stop's
/// SIGINT then did nothing, and a `ttrace simulate` ran out its grace.
pub fn default_sigint() {
    // SAFETY: plain syscall, no handler installed.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
}

impl StopOnDrop {
    pub fn new(child: Child) -> Self {
        Self(child, GRACE)
    }

    /// A process that must be gone sooner (`ttrace view`: within a second),
    /// so that one that hangs is killed and said so, not waited for.
    pub fn with_grace(child: Child, grace: Duration) -> Self {
        Self(child, grace)
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for StopOnDrop {
    /// SIGINT, as Ctrl-C stops it; SIGKILL if it is still there after its grace.
    fn drop(&mut self) {
        if self.0.try_wait().is_ok_and(|status| status.is_some()) {
            return;
        }
        let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
        let grace = self.1;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.0.try_wait().is_ok_and(|status| status.is_some()) {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        eprintln!("bench: pid {} ignored SIGINT for {grace:?}: killed", self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pid` ignores SIGINT (bit 1 of its `SigIgn` mask).
    fn ignores_sigint(pid: u32) -> bool {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).unwrap_or("0").trim().to_string();
        u64::from_str_radix(&mask, 16).is_ok_and(|m| m & 2 != 0)
    }

    #[test]
    fn a_process_is_stopped_when_its_guard_goes() {
        // As in a bench started as a background job: SIGINT ignored, and
        // in what it starts, until `default_sigint`.
        // SAFETY: plain syscall, no handler installed.
        unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        default_sigint();
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = child.id();
        // So the stop's SIGINT ends it, not the grace's SIGKILL.
        assert!(!ignores_sigint(pid), "pid {pid} ignores SIGINT");
        drop(StopOnDrop::new(child));
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still running");
    }

    #[test]
    fn one_that_ignores_sigint_is_killed_after_its_grace() {
        let child = Command::new("sh").args(["-c", "trap '' INT; exec sleep 600"]).spawn().unwrap();
        let pid = child.id();
        // Until SIGINT is ignored: before, its default action would end
        // it, which is not what this checks.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ignores_sigint(pid) && Instant::now() < deadline {
            sleep(Duration::from_millis(10));
        }
        drop(StopOnDrop::with_grace(child, Duration::from_millis(200)));
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still running");
    }
}
