//! The trace header: what was traced, how, and on which machine.

use super::SessionSpec;
use crate::{
    format::{
        Header, Mode,
        frames::{FORMAT_VERSION, Options},
    },
    live::target::OpNames,
};

pub(super) fn header(spec: &SessionSpec, pid: u32, mode: Mode, command: &[String], names: Option<&OpNames>) -> Header {
    Header {
        format_version: FORMAT_VERSION,
        ttrace_version: env!("CARGO_PKG_VERSION").to_string(),
        mode,
        command: command.to_vec(),
        pid,
        start_unix_ns: unix_ns(),
        start_monotonic_ns: monotonic_ns(),
        kernel: kernel_release(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        libraries: Vec::new(),
        llama_commit: None,
        build: None,
        op_names: names.map(|n| n.ops.clone()).unwrap_or_default(),
        unary_op_names: names.map(|n| n.unary.clone()).unwrap_or_default(),
        glu_op_names: names.map(|n| n.glu.clone()).unwrap_or_default(),
        options: Options {
            all_threads: spec.all_threads,
            op_timing: spec.op_timing,
            ring_bytes: spec.ring_bytes,
            io: spec.io,
            drop_caches: spec.drop_caches,
            mem_limit: spec.mem_limit,
            cgroup: spec.cgroup.clone(),
            values: spec.values.is_some(),
        },
        maps: String::new(),
        ring: None,
        ring_read: None,
    }
}

/// The wall clock, in ns since the Unix epoch.
pub(super) fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// CLOCK_MONOTONIC, the clock of the kernel's event timestamps.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

pub(super) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

pub(super) fn proc_cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default()
}
