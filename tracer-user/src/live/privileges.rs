//! Checking, before touching the kernel, that we may load and attach eBPF.

use std::fs;

/// Capability bits (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error(
        "ttrace needs root to load eBPF programs and read tracefs (effective capabilities \
         {caps:#x} lack CAP_SYS_ADMIN); run it with sudo, e.g. `sudo ttrace ...`"
    )]
    NotPrivileged { caps: u64 },
    #[error("cannot read /proc/self/status to check privileges: {0}")]
    Status(std::io::Error),
}

/// Effective capability set of this process.
pub fn effective_caps() -> Result<u64, PrivilegeError> {
    let status = fs::read_to_string("/proc/self/status").map_err(PrivilegeError::Status)?;
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:")).map(str::trim).unwrap_or("0");
    Ok(u64::from_str_radix(hex, 16).unwrap_or(0))
}

/// Tracing needs CAP_SYS_ADMIN: tracefs mounting and uprobe perf events on
/// other users' processes. CAP_BPF + CAP_PERFMON alone are not enough here.
pub fn require_tracing_privileges() -> Result<(), PrivilegeError> {
    let caps = effective_caps()?;
    if has(caps, CAP_SYS_ADMIN) || (has(caps, CAP_BPF) && has(caps, CAP_PERFMON) && is_root()) {
        Ok(())
    } else {
        Err(PrivilegeError::NotPrivileged { caps })
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1 << cap) != 0
}
