//! The guest's initramfs: a static busybox and the kernel modules a Debian
//! kernel needs to reach the host's root (virtio, 9p, overlay) and the test
//! disk (virtio-blk, ext4), with their dependencies, decompressed (busybox's
//! `insmod` reads plain ELF only). Its `/init` mounts the host's `/`
//! read-only under a tmpfs overlay and runs the job's script there.

use std::{
    collections::{BTreeMap, HashSet},
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// What the guest needs beyond what the kernel has built in. ext4 asks the
/// crypto API for crc32c at mount time, not through its module dependencies.
const WANTED: &[&str] =
    &["virtio_pci", "virtio_blk", "9pnet_virtio", "9p", "overlay", "crc32c_generic", "crc32c_intel", "ext4"];
/// Debian's `busybox-static` package.
pub const BUSYBOX: &str = "/bin/busybox";

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "initramfs: insmod $m failed"; done
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower || exec sh
mount -t tmpfs -o size=2g tmpfs /upper
mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || exec sh
mkdir -p /newroot/job
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 job /newroot/job || exec sh
exec switch_root /newroot /bin/bash /job/guest.sh
"#;

/// What an initramfs is made of: a change to it makes every kernel's anew.
pub fn recipe() -> String {
    format!("{}\n{INIT}", WANTED.join(","))
}

/// Writes the initramfs of the kernel unpacked in `root` to `out`.
pub fn build(root: &Path, out: &Path) -> Result<()> {
    let modules = modules_dir(root)?;
    let index = index(&modules)?;
    let staging = out.with_extension("staging");
    let _ = std::fs::remove_dir_all(&staging);
    for dir in ["bin", "modules", "proc", "sys", "dev"] {
        std::fs::create_dir_all(staging.join(dir))?;
    }
    std::fs::copy(BUSYBOX, staging.join("bin/busybox"))
        .with_context(|| format!("copying {BUSYBOX}: install Debian's busybox-static"))?;
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for name in WANTED {
        add(name, &index, &staging.join("modules"), &mut seen, &mut order)?;
    }
    std::fs::write(staging.join("modules/order"), order.join("\n") + "\n")?;
    write_executable(&staging.join("init"), INIT)?;
    pack(&staging, out)?;
    std::fs::remove_dir_all(&staging)?;
    Ok(())
}

/// `lib/modules/<release>` (or under `usr/`): the one with a `kernel/` tree.
fn modules_dir(root: &Path) -> Result<PathBuf> {
    for base in ["lib/modules", "usr/lib/modules"] {
        let Ok(entries) = std::fs::read_dir(root.join(base)) else { continue };
        for entry in entries.flatten() {
            if entry.path().join("kernel").is_dir() {
                return Ok(entry.path());
            }
        }
    }
    bail!("no lib/modules/<release>/kernel in {}", root.display())
}

/// Module name (with `_` for `-`) → its file.
fn index(modules: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![modules.join("kernel")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if let Some(stem) = [".ko", ".ko.xz", ".ko.zst"].iter().find_map(|ext| name.strip_suffix(ext)) {
                found.insert(stem.replace('-', "_"), path);
            }
        }
    }
    Ok(found)
}

/// Adds `name` after its dependencies; a module without a file is built in.
fn add(
    name: &str,
    index: &BTreeMap<String, PathBuf>,
    into: &Path,
    seen: &mut HashSet<String>,
    order: &mut Vec<String>,
) -> Result<()> {
    let name = name.replace('-', "_");
    if !seen.insert(name.clone()) {
        return Ok(());
    }
    let Some(file) = index.get(&name) else { return Ok(()) };
    let elf = decompress(file)?;
    for dep in depends(&elf) {
        add(&dep, index, into, seen, order)?;
    }
    std::fs::write(into.join(format!("{name}.ko")), &elf)?;
    order.push(name);
    Ok(())
}

fn decompress(file: &Path) -> Result<Vec<u8>> {
    let tool = match file.extension().and_then(|e| e.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        _ => return std::fs::read(file).with_context(|| format!("reading {}", file.display())),
    };
    let out = Command::new(tool)
        .args(["-dc"])
        .arg(file)
        .output()
        .with_context(|| format!("running {tool} (Debian package xz-utils or zstd)"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed", file.display());
    }
    Ok(out.stdout)
}

/// The `depends=` entry of a module's `.modinfo` strings.
fn depends(elf: &[u8]) -> Vec<String> {
    elf.split(|&b| b == 0)
        .find_map(|s| s.strip_prefix(b"depends="))
        .map(|list| String::from_utf8_lossy(list).split(',').filter(|d| !d.is_empty()).map(str::to_string).collect())
        .unwrap_or_default()
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A gzip'd newc cpio of `dir`, by busybox's `cpio` (no cpio package needed).
fn pack(dir: &Path, out: &Path) -> Result<()> {
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::from(".")];
    while let Some(rel) = dirs.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                dirs.push(rel.clone());
            }
            files.push(rel.display().to_string());
        }
    }
    let archive = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut gzip = Command::new("gzip").arg("-1").stdin(Stdio::piped()).stdout(archive).spawn()?;
    let mut cpio = Command::new(BUSYBOX)
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(gzip.stdin.take().context("gzip's stdin")?)
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running {BUSYBOX} cpio"))?;
    cpio.stdin.take().context("cpio's stdin")?.write_all((files.join("\n") + "\n").as_bytes())?;
    let (c, g) = (cpio.wait()?, gzip.wait()?);
    if !c.success() || !g.success() {
        bail!("packing {} failed (cpio {c}, gzip {g})", out.display());
    }
    Ok(())
}
