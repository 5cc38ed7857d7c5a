//! The real programs tests and the demo trace: llama.cpp's llama-completion
//! and Python client built from the pinned PyPI sdist, plus generated GGUF
//! models. All cached under the set-up cache.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{cache, llama_versions, shell};

/// A macro, not a const, so `concat!` can splice it into LLAMA_CMAKE_ARGS,
/// whose text is the build stamp (changing it would rebuild every cache).
macro_rules! no_amx {
    () => {
        "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    };
}

/// The sdist that vendors llama.cpp (tools/completion included).
pub const LLAMA_CPP_PYTHON: &str = "llama-cpp-python==0.3.36";
/// llama-server is built too: it is the common deployment, and batched
/// serving (several sequences per ubatch) is traced through it. AMX is off:
/// with GGML_NATIVE on this CPU, ggml moves Q4_0/Q8_0 weights into its AMX
/// buffer, whose matmul crashes here on prompt-sized batches (SIGSEGV/SIGILL);
/// without it they take the CPU_REPACK path ttrace must handle anyway.
const LLAMA_CMAKE_ARGS: &str = concat!(
    "-DLLAMA_BUILD_TOOLS=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_SERVER=ON \
    -DCMAKE_C_FLAGS='",
    no_amx!(),
    "' \
    -DCMAKE_CXX_FLAGS='",
    no_amx!(),
    "'"
);
/// The compiler flags that keep ggml's AMX kernels out (see above); the
/// version matrix (`llama_versions`) builds with them too.
pub const NO_AMX_FLAGS: &str = no_amx!();

#[derive(Debug, Clone, Serialize)]
pub struct Llama {
    /// Unstripped build: `bin/llama-completion` and its `libggml-*.so`.
    pub build_dir: PathBuf,
    pub completion: PathBuf,
    pub lib_dir: PathBuf,
    /// llama.cpp commit the sdist vendors, as the build reports it.
    pub commit: String,
}

pub type Models = BTreeMap<String, PathBuf>;

/// Build llama.cpp once through pip (which also installs the `llama_cpp`
/// Python package into the venv); reuse the kept build dir afterwards.
pub fn ensure_llama(cache: &Path, python: &Path) -> Result<(Llama, String)> {
    let build_dir = cache.join("llama-build");
    let completion = build_dir.join("bin/llama-completion");
    let installed = shell::succeeds(Command::new(python).args(["-c", "import llama_cpp"]));
    let stamp = build_dir.join(".ttrace-build");
    let wanted = full_build_stamp();
    let what = if full_build_done(cache) && installed {
        "ok (cached)".to_string()
    } else {
        eprintln!("setup: building llama.cpp from {LLAMA_CPP_PYTHON} (about 7 minutes on 2 cores, once)");
        shell::run(
            Command::new(python)
                .args(["-m", "pip", "install", "-q", "--no-cache-dir", "--force-reinstall", "--no-deps"])
                .arg(format!("--config-settings=build-dir={}", build_dir.display()))
                .arg(LLAMA_CPP_PYTHON)
                .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS),
        )?;
        if !completion.exists() {
            bail!("the llama.cpp build finished but {} is missing", completion.display());
        }
        std::fs::write(&stamp, wanted)?;
        "built".to_string()
    };
    let commit = llama_commit(&completion)?;
    let lib_dir = build_dir.join("bin");
    Ok((Llama { build_dir, completion, lib_dir, commit: commit.clone() }, format!("{what}, commit {commit}")))
}

/// The stamp records what was built, so a change of flags rebuilds.
fn full_build_stamp() -> String {
    format!("{LLAMA_CPP_PYTHON}\n{LLAMA_CMAKE_ARGS}\n")
}

/// Whether `ensure_llama` built the current pin.
fn full_build_done(cache: &Path) -> bool {
    let build_dir = cache.join("llama-build");
    build_dir.join("bin/llama-completion").exists()
        && std::fs::read_to_string(build_dir.join(".ttrace-build")).is_ok_and(|s| s == full_build_stamp())
}

/// The demo's llama-completion: the full build's when `cargo xtask test`
/// made it, else the pinned release's llama-completion alone (a third of
/// the full build's time: no other tools, no Python client).
pub fn ensure_completion(cache: &Path, python: &Path) -> Result<(PathBuf, String)> {
    if full_build_done(cache) {
        return Ok((cache.join("llama-build/bin/llama-completion"), "ok (the full build)".into()));
    }
    llama_versions::ensure_completion_only(cache, python)
}

/// `llama-completion --version` prints `version: X (build N, commit abcdef0)`.
fn llama_commit(completion: &Path) -> Result<String> {
    let out = Command::new(completion)
        .arg("--version")
        .output()
        .with_context(|| format!("running {}", completion.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    text.split("commit ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .map(str::to_string)
        .with_context(|| format!("no commit in `llama-completion --version` output: {text}"))
}

/// The real model alone (the demo's), from PyPI.
pub fn ensure_gemma(cache: &Path, python: &Path) -> Result<(PathBuf, String)> {
    let models = manifest(python, "scripts/fetch_gemma.py", &cache.join("models"))?;
    let gemma = models.get("gemma").context("scripts/fetch_gemma.py listed no `gemma`")?.clone();
    Ok((gemma, "ok (gemma)".into()))
}

fn manifest(python: &Path, script: &str, out_dir: &Path) -> Result<Models> {
    let script = cache::repo_root().join(script);
    let manifest = shell::output(Command::new(python).arg(&script).arg("--out").arg(out_dir))?;
    serde_json::from_str(&manifest).with_context(|| format!("{} printed no manifest", script.display()))
}

/// Generate the test and benchmark models with `scripts/gen_models.py`
/// (the `gguf` package's writer); it skips models already generated with the
/// same parameters and prints a JSON manifest `{name: path}`.
pub fn ensure_models(cache: &Path, python: &Path) -> Result<(Models, String)> {
    let out_dir = cache.join("models");
    let mut models = Models::new();
    // The synthetic models, then the real ones from PyPI (Gemma 3 270M,
    // SmolLM2 135M).
    for script in ["scripts/gen_models.py", "scripts/fetch_gemma.py", "scripts/fetch_smollm2.py"] {
        models.extend(manifest(python, script, &out_dir)?);
    }
    let names: Vec<&str> = models.keys().map(String::as_str).collect();
    Ok((models.clone(), format!("ok ({})", names.join(", "))))
}
