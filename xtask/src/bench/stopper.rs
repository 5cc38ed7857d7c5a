//! A process a bench part started, stopped when the part ends however it
//! ends (a failed request, an error, a panic): nothing it started is left
//! running, burning the CPU the next part measures.

use std::{
    process::{Child, Command},
    thread::sleep,
    time::{Duration, Instant},
};

/// How long a stopped process gets to exit before it is killed.
const GRACE: Duration = Duration::from_secs(60);

pub struct StopOnDrop(Child);

impl StopOnDrop {
    pub fn new(child: Child) -> Self {
        Self(child)
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for StopOnDrop {
    /// SIGINT, as Ctrl-C stops it; SIGKILL if it is still there after [`GRACE`].
    fn drop(&mut self) {
        if self.0.try_wait().is_ok_and(|status| status.is_some()) {
            return;
        }
        let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline {
            if self.0.try_wait().is_ok_and(|status| status.is_some()) {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        eprintln!("bench: pid {} ignored SIGINT for {GRACE:?}: killed", self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_stopped_when_its_guard_goes() {
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = child.id();
        drop(StopOnDrop::new(child));
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still running");
    }
}
