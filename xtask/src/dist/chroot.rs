//! `cargo xtask dist --verify`: what a user without Rust sees. A clean
//! Debian root (debootstrap bookworm minbase, cached in the set-up cache)
//! gets the .deb through `dpkg -i`, then runs `ttrace check`, `ttrace run`
//! of llama-completion on the tiny model, and `ttrace report`. The package is
//! purged afterwards, so the cached root stays clean for the next run.
//!
//! Each command runs in its own mount namespace (`unshare --mount`) that
//! binds proc, sys, tracefs, bpffs, /dev and the set-up cache into the root:
//! the mounts end with the command, so an interrupted run leaves none behind
//! on the host. The cache is bound at its own path because the llama.cpp
//! build finds its libraries through an absolute RUNPATH.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use super::Artefacts;
use crate::{debian_root, setup::Paths, shell};

const SUITE: &str = "bookworm";
/// What the traced llama.cpp build links beyond minbase's libc, libstdc++
/// and libgcc: OpenMP (the CPU backend's threads) and OpenSSL (llama-common,
/// for HTTPS model downloads). ttrace itself needs nothing.
const INCLUDE: &str = "libgomp1,libssl3";
/// Binds every `in_root` command gets. `$1` is the root, `$2` the cache,
/// the rest the command.
const MOUNTS: &str = r#"r=$1; c=$2; shift 2
mount -t proc proc "$r/proc"
mount --bind /sys "$r/sys"
mount --bind /sys/kernel/tracing "$r/sys/kernel/tracing"
mount --bind /sys/fs/bpf "$r/sys/fs/bpf"
mount --bind /dev "$r/dev"
mkdir -p "$r$c"
mount --bind "$c" "$r$c"
exec chroot "$r" "$@""#;

pub fn verify(paths: &Paths, artefacts: &Artefacts) -> Result<()> {
    if !shell::is_root() {
        bail!("`--verify` needs root (debootstrap, chroot and eBPF): run `sudo -E cargo xtask dist --verify`");
    }
    let model = paths.models.get("tiny").context("set-up generated no `tiny` model")?;
    for needed in [&paths.llama.completion, model] {
        if !needed.starts_with(&paths.cache) {
            bail!(
                "{} is outside the set-up cache {}, which is all the root sees",
                needed.display(),
                paths.cache.display()
            );
        }
    }
    let root = ensure_root(&paths.cache)?;
    let run = |args: &[&str]| in_root(&root, &paths.cache, args);
    // A run that stopped half way may have left the package installed.
    run(&["dpkg", "--purge", "ttrace"])?;
    let toolchain = run(&["sh", "-c", "command -v cargo rustc gcc cc || true"])?;
    if !toolchain.trim().is_empty() {
        bail!("the clean root has a toolchain: {}", toolchain.trim());
    }

    let deb_name = artefacts.deb.file_name().context("the .deb has no name")?.to_string_lossy().into_owned();
    std::fs::copy(&artefacts.deb, root.join("tmp").join(&deb_name)).context("copying the .deb into the root")?;
    let installed = run(&["dpkg", "-i", &format!("/tmp/{deb_name}")])?;
    expect(&installed, &format!("Setting up ttrace ({})", artefacts.version), "dpkg -i")?;
    let version = run(&["ttrace", "--version"])?;
    expect(&version, &artefacts.long_version, "the installed ttrace --version")?;
    run(&["ttrace", "check"])?;

    let completion = paths.llama.completion.to_str().context("llama-completion's path is not UTF-8")?;
    let model = model.to_str().context("the model's path is not UTF-8")?;
    let mut traced = vec!["ttrace", "run", "-o", "/tmp/t.data", "--", completion, "-m", model];
    traced.extend(["-p", "hello", "-n", "8", "-no-cnv", "--perf", "-t", "2"]);
    run(&traced)?;
    let report = run(&["ttrace", "report", "/tmp/t.data"])?;
    expect(&report, "generated", "ttrace report")?;

    run(&["dpkg", "--purge", "ttrace"])?;
    for leftover in [PathBuf::from("tmp/t.data"), PathBuf::from("tmp").join(&deb_name)] {
        std::fs::remove_file(root.join(leftover)).context("cleaning the root's /tmp")?;
    }
    Ok(())
}

/// Runs `args` inside the root as a fresh login would (no host environment:
/// a SUDO_USER there would name a user the root does not have), shows its
/// output and returns it.
fn in_root(root: &Path, cache: &Path, args: &[&str]) -> Result<String> {
    eprintln!("dist: [root] $ {}", args.join(" "));
    let t = Instant::now();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-euc", MOUNTS, "sh"])
        .arg(root)
        .arg(cache)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .output()
        .context("running unshare (util-linux)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    for line in text.lines() {
        eprintln!("dist:   {line}");
    }
    eprintln!("dist:   ({:.1}s, {})", t.elapsed().as_secs_f64(), out.status);
    if !out.status.success() {
        bail!("`{}` failed in the clean root ({})", args.join(" "), out.status);
    }
    Ok(text)
}

fn expect(output: &str, wanted: &str, what: &str) -> Result<()> {
    if !output.contains(wanted) {
        bail!("{what} did not say `{wanted}`");
    }
    Ok(())
}

/// `<cache>/dist-root`, made once (`debian_root`).
fn ensure_root(cache: &Path) -> Result<PathBuf> {
    let root = debian_root::ensure(&cache.join("dist-root"), SUITE, INCLUDE)?;
    // The downloaded packages are not part of a clean system.
    in_root(&root, cache, &["apt-get", "clean"])?;
    Ok(root)
}
