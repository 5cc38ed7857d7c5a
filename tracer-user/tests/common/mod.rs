//! Shared by the root-only integration tests.

/// The eBPF tests load real programs: without root they fail with one line
/// saying why, never skip.
pub fn require_root() {
    // SAFETY: geteuid has no failure modes.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this eBPF test loads programs into the kernel and needs root: run `sudo -E cargo xtask test`");
    }
}
