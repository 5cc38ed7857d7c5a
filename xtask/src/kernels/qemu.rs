//! One boot of a kernel in qemu: the host's `/` shared read-only over 9p
//! (the guest runs the host's binaries as they are), the job directory
//! shared read-write, a raw ext4 image as a virtio disk (block I/O, FIEMAP,
//! which 9p lacks), serial console to a log file.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Guest memory: llama.cpp, Python and ttrace together, on a 24 GiB host.
const MEMORY: &str = "6G";
const MEMORY_BYTES: u64 = 6 << 30;
/// Guest CPUs: ttrace's per-CPU maps and perf buffers see more than one.
const VCPUS: usize = 2;

/// How the guest's CPU is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation (real VT-x or SVM).
    Kvm,
    /// qemu's emulator: 5-7x slower, but boots any kernel anywhere.
    Tcg,
}

impl Accel {
    /// KVM where the host has Intel's or AMD's module; not through another
    /// kind of `/dev/kvm` (this project's VMs have PVM's, which cannot boot
    /// distribution kernels).
    pub fn detect() -> Self {
        let hardware = ["kvm_intel", "kvm_amd"].iter().any(|m| Path::new("/sys/module").join(m).exists());
        let usable = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
        if hardware && usable { Accel::Kvm } else { Accel::Tcg }
    }

    fn args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            // One host thread for all vCPUs. With a thread per vCPU
            // (qemu's default), a kernel that patches its own text (static
            // keys: perf_event_open turns on perf_sched_events) sometimes
            // runs a stale translation still holding the int3 of the patch:
            // "Oops: int3" in __schedule. Toggling sched_schedstats in a
            // loop under 7.2 crashes that way within 15 s; single-threaded,
            // 1228 toggles in 240 s did not.
            Accel::Tcg => ["-accel", "tcg,thread=single", "-cpu", "max"],
        }
    }

    /// Host threads one guest keeps busy.
    fn host_threads(self) -> usize {
        match self {
            Accel::Kvm => VCPUS,
            Accel::Tcg => 1,
        }
    }

    /// Guests that can run at once on this host: one per free core's worth
    /// of threads, and no more than its available memory holds.
    pub fn guests_at_once(self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let by_memory = available_memory().map_or(1, |bytes| (bytes / (MEMORY_BYTES + (1 << 30))) as usize);
        (cores / self.host_threads()).min(by_memory).max(1)
    }
}

/// The host's `MemAvailable`, in bytes.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

pub struct Boot<'a> {
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    pub job: &'a Path,
    pub disk: &'a Path,
    pub accel: Accel,
    /// The guest is killed after this long.
    pub limit: Duration,
}

/// Boots, waits for the guest to power off, and returns how long it ran.
pub fn boot(b: &Boot<'_>) -> Result<Duration> {
    let console = std::fs::File::create(b.job.join("console.log"))?;
    let started = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(b.accel.args())
        .args(["-smp", &VCPUS.to_string(), "-m", MEMORY, "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio"])
        .arg("-kernel")
        .arg(b.vmlinuz)
        .arg("-initrd")
        .arg(b.initramfs)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=job,security_model=none", b.job.display()))
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw,cache=none", b.disk.display()))
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("qemu exited with {status}; see {}", b.job.join("console.log").display());
            }
            return Ok(started.elapsed());
        }
        if started.elapsed() > b.limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the guest still ran after {:?}: killed; see {}", b.limit, b.job.join("console.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first line of a kernel crash in the guest's console, if it crashed.
pub fn crash(job: &Path) -> Option<String> {
    let console = std::fs::read(job.join("console.log")).ok()?;
    let console = String::from_utf8_lossy(&console);
    let line = console.lines().find(|l| ["Oops:", "Kernel panic", "BUG:"].iter().any(|m| l.contains(m)))?;
    Some(line.trim().to_string())
}
