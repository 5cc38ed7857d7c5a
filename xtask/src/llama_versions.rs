//! The llama.cpp version matrix: older llama.cpp builds that the per-version
//! tests trace (tests/python/test_llama_versions.py), each from a pinned PyPI
//! `llama-cpp-python` sdist, which vendors one llama.cpp commit.
//!
//! Only the programs those tests run are built, with cmake on the vendored
//! tree (pip would build every tool and the Python extension: an hour for
//! four versions instead of minutes). The flags policy is the pinned build's:
//! shared, unstripped libraries (ttrace attaches to libggml-cpu.so and reads
//! .symtab), GGML_NATIVE, AMX off. Each version is cached under
//! `<cache>/llama-versions/<pypi version>/` with a stamp of what was built;
//! the extracted sources are deleted after the build, except `ggml.c`, whose
//! `GGML_OP_NAME` table is the tests' oracle for that version's op names.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{shell, targets};

/// What ttrace must do with a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// Trace it: its layouts are ones ttrace knows.
    Trace,
    /// Refuse it before recording anything: its `ggml_tensor` still has the
    /// `grad` pointer that moved `src` and every later field by 8 bytes.
    Refuse,
}

/// The program that generates text, which changed name and flags over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generator {
    /// `llama-cli` of 2024 (examples/main): plain completion unless `-cnv`
    /// is given (it has no `-no-cnv`); prints its perf counters by default.
    LegacyCli,
    /// `llama-cli` of 2025 (tools/main): chat mode when the model has a chat
    /// template, so `-no-cnv`; perf counters by default (no `--perf` flag).
    Cli,
    /// `llama-completion` (tools/completion, 2026): `-no-cnv` and `--perf`.
    Completion,
}

impl Generator {
    pub fn target(self) -> &'static str {
        match self {
            Generator::LegacyCli | Generator::Cli => "llama-cli",
            Generator::Completion => "llama-completion",
        }
    }

    /// Flags for a non-interactive run that ends with llama.cpp's perf lines.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Generator::LegacyCli => &[],
            Generator::Cli => &["-no-cnv"],
            Generator::Completion => &["-no-cnv", "--perf"],
        }
    }
}

/// One pinned release of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct Release {
    pub pypi: &'static str,
    /// sha256 of `llama_cpp_python-<pypi>.tar.gz` as PyPI serves it.
    pub sha256: &'static str,
    /// The vendored llama.cpp commit, as `--version` reports it.
    pub commit: &'static str,
    /// That commit's date.
    pub date: &'static str,
    pub expect: Expect,
    pub generator: Generator,
    /// Its llama.cpp knows the `gemma3` architecture (Gemma 3 270M runs).
    pub gemma3: bool,
    /// Its llama.cpp knows the `qwen3moe` architecture.
    pub qwen3moe: bool,
}

/// The matrix, oldest first (the README lists it). What sets them apart,
/// read from each sdist's vendored source: 0.3.2 has `ggml_tensor.grad`;
/// 0.3.3 is the first release without it, and has neither
/// `ggml_glu_op_name` nor `llama_context::process_ubatch`; 0.3.16 has
/// `process_ubatch` but no `ggml_cgraph.uid`; 0.3.30 has both; 0.3.36 is the
/// pinned build of `targets.rs`.
pub const MATRIX: [Release; 5] = [
    Release {
        pypi: "0.3.2",
        sha256: "8fbf246a55a999f45015ed0d48f91b4ae04ae959827fac1cd6ac6ec65aed2e2f",
        commit: "74d73dc",
        date: "2024-11-15",
        expect: Expect::Refuse,
        generator: Generator::LegacyCli,
        gemma3: false,
        qwen3moe: false,
    },
    Release {
        pypi: "0.3.3",
        sha256: "508cb4bd8bf296d4b0daa98cb5322e534447658bc933a584367d6ea997dba855",
        commit: "ce8784b",
        date: "2024-12-08",
        expect: Expect::Trace,
        generator: Generator::LegacyCli,
        gemma3: false,
        qwen3moe: false,
    },
    Release {
        pypi: "0.3.16",
        sha256: "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6",
        commit: "4227c9b",
        date: "2025-08-14",
        expect: Expect::Trace,
        generator: Generator::Cli,
        gemma3: true,
        qwen3moe: true,
    },
    Release {
        pypi: "0.3.30",
        sha256: "798c9b42652d2e0bff5fe81e7e762089f425a99e67f66ffe5ae156957876e0d1",
        commit: "e3a74b2",
        date: "2026-06-16",
        expect: Expect::Trace,
        generator: Generator::Completion,
        gemma3: true,
        qwen3moe: true,
    },
    CURRENT,
];

/// The pinned build (`targets::ensure_llama`): set-up builds it through pip
/// already, so only its op table is taken from the sdist here.
pub const CURRENT: Release = Release {
    pypi: "0.3.36",
    sha256: "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    commit: "0c1e570",
    date: "2026-10-01",
    expect: Expect::Trace,
    generator: Generator::Completion,
    gemma3: true,
    qwen3moe: true,
};

/// The flags every matrix build gets (the targets are added per version).
/// Examples and tools are configured so that `llama-cli`/`llama-completion`
/// and `llama-tokenize` exist as targets in every version (they moved from
/// examples/ to tools/ in 2025); only the named targets are compiled.
fn cmake_args(build: &Path) -> Vec<String> {
    let bin = build.join("bin");
    let mut args: Vec<String> = [
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=OFF",
    ]
    .map(String::from)
    .into();
    // Libraries next to the programs, as in the pip build: one lib_dir.
    args.push(format!("-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={}", bin.display()));
    args.push(format!("-DCMAKE_C_FLAGS={}", targets::NO_AMX_FLAGS));
    args.push(format!("-DCMAKE_CXX_FLAGS={}", targets::NO_AMX_FLAGS));
    args
}

/// One built version, as `cargo xtask paths` prints it under `llama_versions`.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    pub commit: &'static str,
    pub date: &'static str,
    pub expect: Expect,
    /// The pinned build of `targets.rs` (the one the other tests trace).
    pub current: bool,
    pub bin_dir: PathBuf,
    /// Where its libggml-*.so and libllama.so are (the programs' RUNPATH).
    pub lib_dir: PathBuf,
    /// llama-cli or llama-completion.
    pub generate: PathBuf,
    /// Flags for a plain completion run that prints the perf counters.
    pub generate_flags: &'static [&'static str],
    /// llama-tokenize (absent for a version ttrace must refuse).
    pub tokenize: Option<PathBuf>,
    /// The version's ggml.c: its `GGML_OP_NAME` table.
    pub ggml_c: PathBuf,
    pub gemma3: bool,
    pub qwen3moe: bool,
}

pub type Versions = BTreeMap<&'static str, Version>;

/// Build (or find cached) every version of the matrix.
pub fn ensure(cache: &Path, python: &Path, current: &targets::Llama) -> Result<(Versions, String)> {
    let root = cache.join("llama-versions");
    let sdists = root.join("sdists");
    std::fs::create_dir_all(&sdists).with_context(|| format!("creating {}", sdists.display()))?;
    let mut versions = Versions::new();
    let mut done = Vec::new();
    for release in MATRIX {
        let t = Instant::now();
        let dir = root.join(release.pypi);
        let (version, built) = if release.pypi == CURRENT.pypi {
            current_version(&release, &dir, &sdists, python, current)?
        } else {
            build(&release, &dir, &sdists, python)?
        };
        done.push(if built {
            format!("{} built in {:.0}s", release.pypi, t.elapsed().as_secs_f64())
        } else {
            format!("{} cached", release.pypi)
        });
        versions.insert(release.pypi, version);
    }
    Ok((versions, done.join(", ")))
}

/// The version's files, whether built now or before.
fn layout(release: &Release, dir: &Path) -> Version {
    let bin = dir.join("build/bin");
    Version {
        commit: release.commit,
        date: release.date,
        expect: release.expect,
        current: false,
        generate: bin.join(release.generator.target()),
        generate_flags: release.generator.flags(),
        tokenize: (release.expect == Expect::Trace).then(|| bin.join("llama-tokenize")),
        ggml_c: dir.join("ggml.c"),
        lib_dir: bin.clone(),
        bin_dir: bin,
        gemma3: release.gemma3,
        qwen3moe: release.qwen3moe,
    }
}

fn build(release: &Release, dir: &Path, sdists: &Path, python: &Path) -> Result<(Version, bool)> {
    let version = layout(release, dir);
    let targets: Vec<&str> = std::iter::once(release.generator.target())
        .chain(version.tokenize.as_ref().map(|_| "llama-tokenize"))
        .collect();
    let outputs: Vec<&Path> = std::iter::once(version.generate.as_path())
        .chain(version.tokenize.as_deref())
        .chain([version.ggml_c.as_path()])
        .collect();
    let keep_ggml_c = |tree: &Path| {
        std::fs::copy(tree.join("ggml/src/ggml.c"), &version.ggml_c)
            .map(drop)
            .with_context(|| format!("keeping ggml.c of {}", release.pypi))
    };
    let built = cmake_build(release, dir, sdists, python, &targets, &[], &outputs, keep_ggml_c)?;
    Ok((version, built))
}

/// The pinned llama.cpp (its llama-completion and shared libraries) built
/// without host-only instructions: GGML_NATIVE off gives ggml's x86 baseline
/// (AVX2, no AVX-512), which qemu's emulated CPU runs. For the kernel
/// matrix's guests; its libllama also serves the `llama_cpp` client there
/// (LLAMA_CPP_LIB_PATH). Returns the directory of programs and libraries.
pub fn ensure_portable(cache: &Path, python: &Path) -> Result<(PathBuf, String)> {
    pinned_build(cache, python, "llama-portable", &["llama-completion", "llama"], &["-DGGML_NATIVE=OFF"])
}

/// The pinned release's llama-completion alone, with the full build's flags
/// (the demo's, before `cargo xtask test` has made the full build).
pub fn ensure_completion_only(cache: &Path, python: &Path) -> Result<(PathBuf, String)> {
    let (bin, what) = pinned_build(cache, python, "llama-completion", &["llama-completion"], &[])?;
    Ok((bin.join("llama-completion"), what))
}

/// `targets` of the pinned release (llama-completion first) in
/// `<cache>/<name>`; returns its directory of programs and libraries.
fn pinned_build(
    cache: &Path,
    python: &Path,
    name: &str,
    targets: &[&str],
    extra_args: &[&str],
) -> Result<(PathBuf, String)> {
    let dir = cache.join(name);
    let bin = dir.join("build/bin");
    let t = Instant::now();
    let completion = bin.join("llama-completion");
    let sdists = cache.join("llama-versions/sdists");
    let extra: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
    let built = cmake_build(&CURRENT, &dir, &sdists, python, targets, &extra, &[&completion], |_| Ok(()))?;
    let what = if built { format!("built in {:.0}s", t.elapsed().as_secs_f64()) } else { "ok (cached)".to_string() };
    Ok((bin, what))
}

/// Configure and build `targets` of `release`'s vendored tree into
/// `dir/build`, unless its stamp says the same was built and `outputs`
/// exist; `keep` takes what is needed from the tree before it is deleted.
/// True when it built.
#[allow(clippy::too_many_arguments)]
fn cmake_build(
    release: &Release,
    dir: &Path,
    sdists: &Path,
    python: &Path,
    targets: &[&str],
    extra_args: &[String],
    outputs: &[&Path],
    keep: impl FnOnce(&Path) -> Result<()>,
) -> Result<bool> {
    let build_dir = dir.join("build");
    let mut args = cmake_args(&build_dir);
    args.extend_from_slice(extra_args);
    let stamp = dir.join(".ttrace-build");
    let wanted = format!("{}\n{}\n{}\n{}\n", release.pypi, release.sha256, args.join(" "), targets.join(" "));
    if outputs.iter().all(|p| p.exists()) && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(false);
    }
    eprintln!(
        "setup: building llama.cpp {} from llama-cpp-python {} ({})",
        release.commit,
        release.pypi,
        targets.join(", ")
    );
    std::fs::create_dir_all(sdists)?;
    let sdist = sdist(release, sdists, python)?;
    let _ = std::fs::remove_dir_all(&build_dir);
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
    // The vendored tree and its git metadata (the build stamps the commit
    // into the programs from it: `--version`, LLAMA_COMMIT).
    let top = format!("llama_cpp_python-{}", release.pypi);
    shell::run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&sdist)
            .arg("-C")
            .arg(&src)
            .arg("--strip-components=1")
            .arg(format!("{top}/vendor/llama.cpp"))
            .arg(format!("{top}/.git/modules/vendor/llama.cpp")),
    )?;
    let tree = src.join("vendor/llama.cpp");
    let tools = python.parent().context("the venv python has no bin dir")?;
    let cmake = tools.join("cmake");
    let path = std::env::join_paths(
        std::iter::once(tools.to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )?;
    // Lowest priority: set-up shares the machine with whatever else runs.
    shell::run(
        Command::new("nice")
            .args(["-n", "19"])
            .arg(&cmake)
            // LLAMA_BUILD_TOOLS is unknown before 2025: no warning about it.
            .arg("--no-warn-unused-cli")
            .arg("-S")
            .arg(&tree)
            .arg("-B")
            .arg(&build_dir)
            .args(&args)
            .arg(format!("-DCMAKE_MAKE_PROGRAM={}", tools.join("ninja").display()))
            .env("PATH", &path)
            .stdout(std::process::Stdio::null()),
    )
    .with_context(|| format!("configuring llama.cpp {} (see {})", release.pypi, build_dir.display()))?;
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    shell::run(
        Command::new("nice")
            .args(["-n", "19"])
            .arg(&cmake)
            .arg("--build")
            .arg(&build_dir)
            .arg("-j")
            .arg(jobs.to_string())
            .arg("--target")
            .args(targets)
            .env("PATH", &path)
            .stdout(std::process::Stdio::null()),
    )
    .with_context(|| format!("building llama.cpp {}", release.pypi))?;
    check_commit(&build_dir.join("bin").join(targets[0]), release.commit)?;
    keep(&tree)?;
    std::fs::remove_dir_all(&src).with_context(|| format!("removing {}", src.display()))?;
    std::fs::write(&stamp, wanted)?;
    Ok(true)
}

/// The pinned build, which `targets::ensure_llama` made; its ggml.c from its sdist.
fn current_version(
    release: &Release,
    dir: &Path,
    sdists: &Path,
    python: &Path,
    current: &targets::Llama,
) -> Result<(Version, bool)> {
    if !targets::LLAMA_CPP_PYTHON.ends_with(&format!("=={}", release.pypi)) || current.commit != release.commit {
        bail!(
            "the pinned llama.cpp build is {} (commit {}) but the version matrix says {} for {}: update \
             llama_versions::CURRENT with targets::LLAMA_CPP_PYTHON",
            targets::LLAMA_CPP_PYTHON,
            current.commit,
            release.commit,
            release.pypi
        );
    }
    let bin = &current.lib_dir;
    let version = Version {
        current: true,
        bin_dir: bin.clone(),
        lib_dir: bin.clone(),
        generate: current.completion.clone(),
        tokenize: Some(bin.join("llama-tokenize")),
        ..layout(release, dir)
    };
    if version.ggml_c.exists() {
        return Ok((version, false));
    }
    let sdist = sdist(release, sdists, python)?;
    std::fs::create_dir_all(dir)?;
    let member = format!("llama_cpp_python-{}/vendor/llama.cpp/ggml/src/ggml.c", release.pypi);
    let text = shell::output(Command::new("tar").arg("-xzOf").arg(&sdist).arg(&member))?;
    std::fs::write(&version.ggml_c, text)?;
    Ok((version, true))
}

/// The release's sdist, downloaded once and checked against its pinned hash.
fn sdist(release: &Release, sdists: &Path, python: &Path) -> Result<PathBuf> {
    let file = sdists.join(format!("llama_cpp_python-{}.tar.gz", release.pypi));
    if !file.exists() {
        // Only this package as source: its build backend comes as wheels.
        shell::run(
            Command::new(python)
                .args(["-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python", "-d"])
                .arg(sdists)
                .arg(format!("llama-cpp-python=={}", release.pypi)),
        )
        .with_context(|| format!("downloading the llama-cpp-python {} sdist from PyPI", release.pypi))?;
    }
    let sum = shell::output(Command::new("sha256sum").arg(&file))?;
    if sum.split_whitespace().next() != Some(release.sha256) {
        let _ = std::fs::remove_file(&file);
        bail!(
            "{} does not have the pinned sha256 {} (got {}); deleted it, run set-up again to download it anew",
            file.display(),
            release.sha256,
            sum.trim()
        );
    }
    Ok(file)
}

/// `--version` prints `version: N (commit)` (2024-25) or `version: N (build N, commit X)`.
fn check_commit(program: &Path, commit: &str) -> Result<()> {
    let out =
        Command::new(program).arg("--version").output().with_context(|| format!("running {}", program.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !text.contains(commit) {
        bail!("{} was built but does not report commit {commit}: {}", program.display(), text.trim());
    }
    Ok(())
}
