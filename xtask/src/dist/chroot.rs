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
use crate::{setup::Paths, shell};

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

/// `<cache>/dist-root`, made once. A stamp written last marks a finished
/// debootstrap: a directory without it (an interrupted one) is made anew.
fn ensure_root(cache: &Path) -> Result<PathBuf> {
    let root = cache.join("dist-root");
    let stamp = root.join(".ttrace-root");
    let wanted = format!("{SUITE} minbase {INCLUDE}\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(root);
    }
    if !shell::succeeds(Command::new("debootstrap").arg("--version")) {
        shell::run(Command::new("apt-get").args(["install", "-y", "-q", "--no-install-recommends", "debootstrap"]))?;
    }
    let _ = std::fs::remove_dir_all(&root);
    let mirror = debian_mirror()?;
    eprintln!("dist: debootstrap {SUITE} (minbase) into {} from {mirror}", root.display());
    let t = Instant::now();
    shell::run(
        Command::new("debootstrap")
            .args(["--variant=minbase", &format!("--include={INCLUDE}"), SUITE])
            .arg(&root)
            .arg(&mirror),
    )?;
    // The downloaded packages are not part of a clean system.
    in_root(&root, cache, &["apt-get", "clean"])?;
    std::fs::write(&stamp, wanted)?;
    eprintln!("dist: debootstrap took {:.0}s", t.elapsed().as_secs_f64());
    Ok(root)
}

/// The mirror this machine's apt uses for SUITE: deb822 `.sources` files
/// first, then one-line `sources.list` entries.
fn debian_mirror() -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.push(PathBuf::from("/etc/apt/sources.list"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let found = if file.extension().is_some_and(|e| e == "sources") { deb822_uri(&text) } else { list_uri(&text) };
        if let Some(uri) = found {
            return Ok(uri);
        }
    }
    bail!(
        "no `deb` source for {SUITE} in /etc/apt/sources.list or /etc/apt/sources.list.d: add one or install debootstrap's root by hand"
    )
}

/// The first URI of a stanza with `Types: deb` and SUITE among its suites.
fn deb822_uri(text: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).unwrap_or_default()
        };
        let fits = field("Types").split_whitespace().any(|t| t == "deb")
            && field("Suites").split_whitespace().any(|s| s == SUITE);
        fits.then(|| field("URIs").split_whitespace().next().map(str::to_string)).flatten()
    })
}

/// `deb [options] URI SUITE components…`
fn list_uri(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == "deb").then_some(())?;
        let mut words = words.skip_while(|w| w.starts_with('[')).skip_while(|w| !w.contains("://"));
        let uri = words.next()?;
        (words.next()? == SUITE).then(|| uri.to_string())
    })
}
