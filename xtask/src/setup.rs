//! Idempotent set-up. Each step checks before it works, so a second run costs
//! seconds; a step that cannot be done stops with what is missing and how to
//! get it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cache, llama_versions, shell, targets, viewer};

/// Debian packages: bpftool (inspecting loaded programs and links in tests),
/// chromium (the viewer's browser tests and bench), Java 17 for pyspark (the
/// sweep test reads the dataset with Spark in local mode), mount (losetup,
/// mount) and e2fsprogs (mkfs.ext4) for the layout test's ext4 file system on
/// a loop device.
const APT_PACKAGES: &[&str] =
    &["bpftool", "chromium", "bpftrace", "time", "openjdk-17-jre-headless", "mount", "e2fsprogs"];
/// Node.js with npm builds the viewer. Only installed from Debian when no
/// `node`/`npm` is on the PATH: a NodeSource nodejs already bundles npm, and
/// Debian's npm package would conflict with it.
const NODE_PACKAGES: &[&str] = &["nodejs", "npm"];
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Everything set-up produced, for the other tasks.
pub struct Paths {
    pub cache: PathBuf,
    pub venv_python: PathBuf,
    pub llama: targets::Llama,
    /// The version matrix (the pinned build among them), for the per-version tests.
    pub llama_versions: llama_versions::Versions,
    pub models: targets::Models,
}

impl Paths {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "cache": self.cache,
            "venv_python": self.venv_python,
            "llama_completion": self.llama.completion,
            "llama_lib_dir": self.llama.lib_dir,
            "llama_commit": self.llama.commit,
            "llama_versions": self.llama_versions,
            "models": self.models,
        })
    }
}

pub fn run() -> Result<Paths> {
    setup(true)
}

pub fn run_quiet() -> Result<Paths> {
    setup(false)
}

fn setup(verbose: bool) -> Result<Paths> {
    let started = Instant::now();
    let cache = cache::dir()?;
    // Concurrent set-ups (a test run and `cargo xtask paths`, say) would build
    // llama.cpp into the same directory at once: one at a time.
    let lock = std::fs::File::create(cache.join(".setup.lock")).context("creating the set-up lock")?;
    if lock.try_lock().is_err() {
        eprintln!("setup: another set-up is running; waiting for it");
        lock.lock().context("waiting for the set-up lock")?;
    }
    let step = |name: &str, f: &mut dyn FnMut() -> Result<String>| -> Result<()> {
        let t = Instant::now();
        let what = f().with_context(|| format!("set-up step `{name}`"))?;
        if verbose {
            eprintln!("setup: {name:<12} {what} ({:.1}s)", t.elapsed().as_secs_f64());
        }
        Ok(())
    };
    step("apt", &mut apt_packages)?;
    step("rust-src", &mut nightly_rust_src)?;
    step("bpf-linker", &mut || bpf_linker(&cache))?;
    let mut venv_python = PathBuf::new();
    step("python venv", &mut || {
        python_venv(&cache).map(|(p, what)| {
            venv_python = p;
            what
        })
    })?;
    let mut llama = None;
    step("llama.cpp", &mut || {
        targets::ensure_llama(&cache, &venv_python).map(|(l, what)| {
            llama = Some(l);
            what
        })
    })?;
    let mut versions = None;
    step("llama matrix", &mut || {
        let llama = llama.as_ref().expect("set by step");
        llama_versions::ensure(&cache, &venv_python, llama).map(|(v, what)| {
            versions = Some(v);
            what
        })
    })?;
    // Before ttrace is built (by the task that called set-up), so it embeds the page.
    step("viewer", &mut viewer::ensure)?;
    let mut models = None;
    step("models", &mut || {
        targets::ensure_models(&cache, &venv_python).map(|(m, what)| {
            models = Some(m);
            what
        })
    })?;
    if verbose {
        eprintln!("setup: done in {:.1}s; cache {}", started.elapsed().as_secs_f64(), cache.display());
    }
    Ok(Paths {
        cache,
        venv_python,
        llama: llama.expect("set by step"),
        llama_versions: versions.expect("set by step"),
        models: models.expect("set by step"),
    })
}

/// Only what building ttrace itself needs (nightly rust-src, bpf-linker), not
/// the test targets: `cargo xtask dist` without `--verify`.
pub fn build_tools() -> Result<()> {
    let cache = cache::dir()?;
    for (name, what) in [("rust-src", nightly_rust_src()?), ("bpf-linker", bpf_linker(&cache)?)] {
        eprintln!("setup: {name:<12} {what}");
    }
    Ok(())
}

fn apt_packages() -> Result<String> {
    let mut missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|pkg| {
            !shell::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
                .is_ok_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if ["node", "npm"].iter().any(|tool| !shell::succeeds(Command::new(tool).arg("--version"))) {
        missing.extend(NODE_PACKAGES);
    }
    if missing.is_empty() {
        return Ok("ok (installed)".into());
    }
    if !shell::is_root() {
        bail!(
            "missing Debian packages {}; install them with `sudo apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    shell::run(Command::new("apt-get").arg("update").arg("-q"))?;
    shell::run(Command::new("apt-get").args(["install", "-y", "-q", "--no-install-recommends"]).args(&missing))?;
    Ok(format!("installed {}", missing.join(" ")))
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = shell::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("no nightly toolchain; install it with `rustup toolchain install nightly --component rust-src`")?;
    Ok(PathBuf::from(out.trim()))
}

fn nightly_rust_src() -> Result<String> {
    if !shell::succeeds(Command::new("rustc").args(["+nightly", "-V"])) {
        shell::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
        return Ok("installed nightly with rust-src".into());
    }
    if nightly_sysroot()?.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok("ok (installed)".into());
    }
    shell::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    Ok("installed rust-src".into())
}

/// bpf-linker built against nightly's own libLLVM (Debian has no LLVM of
/// the same major). The binary's RUNPATH is `<cache>/llvm/lib`, where we link
/// nightly's libLLVM under both its soname and `libLLVM.so`.
fn bpf_linker(cache: &Path) -> Result<String> {
    let version = shell::output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.trim() == format!("bpf-linker {BPF_LINKER_VERSION}") {
        return Ok(format!("ok ({})", version.trim()));
    }
    let sysroot = nightly_sysroot()?;
    let verbose = shell::output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let major = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` reports no LLVM version")?
        .to_string();
    let prefix = cache.join("llvm");
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib)?;
    let mut sonames = Vec::new();
    for entry in std::fs::read_dir(sysroot.join("lib"))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.starts_with("libLLVM") {
            replace_symlink(&path, &lib.join(&name))?;
            if name.starts_with("libLLVM.so.") {
                sonames.push(path);
            }
        }
    }
    let Some(soname) = sonames.first() else {
        bail!("no libLLVM.so.* in {}/lib; reinstall nightly (`rustup toolchain install nightly`)", sysroot.display());
    };
    replace_symlink(soname, &lib.join("libLLVM.so"))?;
    shell::run(
        Command::new("cargo")
            .args(["install", "--locked", "--force", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
            .args(["--no-default-features", "--features", &format!("llvm-{major}")])
            .env("LLVM_PREFIX", &prefix),
    )?;
    Ok(format!("built bpf-linker {BPF_LINKER_VERSION} against nightly's LLVM {major}"))
}

fn replace_symlink(target: &Path, link: &Path) -> Result<()> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

/// A venv in the cache with scripts/requirements.txt; a stamp of that file's
/// contents decides whether to reinstall.
fn python_venv(cache: &Path) -> Result<(PathBuf, String)> {
    let venv = cache.join("venv");
    let python = venv.join("bin/python");
    let requirements = cache::repo_root().join("scripts/requirements.txt");
    let wanted =
        std::fs::read_to_string(&requirements).with_context(|| format!("reading {}", requirements.display()))?;
    let stamp = venv.join(".ttrace-requirements");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok((python, "ok (cached)".into()));
    }
    if !python.exists() {
        shell::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .context("python3 with the venv module is needed (Debian: `apt-get install python3-venv`)")?;
    }
    shell::run(Command::new(&python).args(["-m", "pip", "install", "-q", "-r"]).arg(&requirements))?;
    std::fs::write(&stamp, wanted)?;
    Ok((python, "installed requirements".into()))
}
