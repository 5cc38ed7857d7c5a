//! The kernel matrix: ttrace's kernel-dependent tests, run inside Debian's
//! own kernels booted in qemu, as aya's CI does. Set-up fetches each kernel
//! once (`fetch`) and makes its initramfs (`initramfs`); `matrix` runs the
//! tests in one boot per kernel (`qemu`, `guest.sh`) and prints one table.

mod fetch;
mod initramfs;
pub mod matrix;
mod qemu;
pub mod readme;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// A kernel series of the matrix and where Debian has it.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub series: &'static str,
    /// Who runs it (the README's table).
    pub used_by: &'static str,
    pub support: Support,
}

/// What ttrace does on a kernel, as the matrix checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Every feature traces with the programs as designed.
    Full,
    /// Every feature traces, some through stand-ins that `check` reports as
    /// fallbacks (the same cases pass, against the same oracles).
    StandIns,
}

/// Oldest first. Ubuntu 22.04's 5.15, RHEL 9's 5.14 and Ubuntu 24.04's 6.8
/// are not in Debian's archive: 5.10, 6.1 and 6.12 stand in for them.
pub const KERNELS: [Kernel; 5] = [
    // No bpf_get_attach_cookie (5.15), bpf_loop (5.17), folios or
    // mm_filemap_fault: per-cookie copies, per-node op probes, bounded
    // loops, perf tracepoints and an fentry stand-in.
    Kernel { series: "5.10", used_by: "Debian 11 (bullseye)", support: Support::StandIns },
    Kernel { series: "6.1", used_by: "Debian 12 (bookworm)", support: Support::Full },
    Kernel { series: "6.12", used_by: "Debian 13 (trixie)", support: Support::Full },
    Kernel { series: "6.18", used_by: "Debian 13 backports", support: Support::Full },
    Kernel { series: "7.2", used_by: "Debian sid", support: Support::Full },
];

/// The matrix's entry for a prepared kernel.
pub fn spec(series: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.series == series)
}

/// A kernel ready to boot, as cached.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Prepared {
    pub series: String,
    pub package: String,
    pub version: String,
    pub vmlinuz: PathBuf,
    pub initramfs: PathBuf,
    /// What the initramfs was made with (a change remakes it).
    recipe: String,
}

/// Set-up's step: every kernel of the matrix, fetched once and kept.
pub fn ensure(cache: &Path) -> Result<(Vec<Prepared>, String)> {
    let root = cache.join("kernels");
    let mut apt = None;
    let mut prepared = Vec::new();
    let mut fetched = Vec::new();
    for kernel in KERNELS {
        let dir = root.join(kernel.series);
        let stamp = dir.join("kernel.json");
        let cached: Option<Prepared> =
            std::fs::read_to_string(&stamp).ok().and_then(|text| serde_json::from_str(&text).ok());
        if let Some(p) =
            cached.as_ref().filter(|p| p.recipe == initramfs::recipe() && p.vmlinuz.exists() && p.initramfs.exists())
        {
            prepared.push(p.clone());
            continue;
        }
        // A kernel fetched before keeps its package; only a new recipe remakes its initramfs.
        let debs_dir = dir.join("debs");
        let (package, version, debs) = match cached.filter(|p| debs_of(&debs_dir, &p.package).is_some()) {
            Some(p) => {
                let debs = debs_of(&debs_dir, &p.package).expect("checked above");
                (p.package, p.version, debs)
            }
            None => {
                if apt.is_none() {
                    let a = fetch::Apt::new(&root.join("apt"))?;
                    a.update()?;
                    apt = Some(a);
                }
                let apt = apt.as_ref().expect("set above");
                let (package, version) = apt.resolve(&kernel)?;
                let _ = std::fs::remove_dir_all(&debs_dir);
                let debs = apt.download(&package, &debs_dir)?;
                (package, version, debs)
            }
        };
        let unpacked = dir.join("unpacked");
        let _ = std::fs::remove_dir_all(&unpacked);
        fetch::extract(&debs, &unpacked)?;
        let vmlinuz = dir.join("vmlinuz");
        std::fs::copy(find_vmlinuz(&unpacked)?, &vmlinuz)?;
        let initramfs = dir.join("initramfs.cpio.gz");
        initramfs::build(&unpacked, &initramfs).with_context(|| format!("the initramfs of {package}"))?;
        std::fs::remove_dir_all(&unpacked)?;
        let p = Prepared {
            series: kernel.series.into(),
            package,
            version,
            vmlinuz,
            initramfs,
            recipe: initramfs::recipe(),
        };
        std::fs::write(&stamp, serde_json::to_string_pretty(&p)?)?;
        fetched.push(format!("{} {}", p.package, p.version));
        prepared.push(p);
    }
    let what = if fetched.is_empty() {
        format!("ok ({} cached)", prepared.iter().map(|p| p.series.as_str()).collect::<Vec<_>>().join(", "))
    } else {
        format!("fetched {}", fetched.join(", "))
    };
    Ok((prepared, what))
}

/// The .debs downloaded for `package` (the image and its split parts).
fn debs_of(dir: &Path, package: &str) -> Option<Vec<PathBuf>> {
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    let has_image = debs
        .iter()
        .any(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{package}_"))));
    has_image.then_some(debs)
}

/// `boot/vmlinuz-*`, or from 6.19 on `usr/lib/modules/<release>/vmlinuz`.
fn find_vmlinuz(root: &Path) -> Result<PathBuf> {
    let boot = std::fs::read_dir(root.join("boot")).into_iter().flatten().flatten().map(|e| e.path());
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .flat_map(|base| std::fs::read_dir(root.join(base)).into_iter().flatten().flatten())
        .map(|e| e.path().join("vmlinuz"));
    boot.filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .chain(modules.filter(|p| p.exists()))
        .next()
        .with_context(|| format!("no vmlinuz in {}", root.display()))
}
