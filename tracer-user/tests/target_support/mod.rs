//! Shared by the `target_*` tests: where the real llama.cpp build lives, and
//! scratch directories.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The llama.cpp build and the Python client's stripped libs, from the JSON
/// file named by TTRACE_PATHS or `~/.cache/ttrace/paths.json`. Missing
/// prerequisites fail the test with the fix; they never skip it.
pub struct Llama {
    pub completion: PathBuf,
    pub lib_dir: PathBuf,
    /// The venv's python, which has llama-cpp-python installed.
    pub venv_python: PathBuf,
    /// site-packages/llama_cpp/lib of the venv.
    pub pip_lib_dir: PathBuf,
}

pub fn llama() -> Llama {
    let file = match std::env::var_os("TTRACE_PATHS") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
            home.join(".cache/ttrace/paths.json")
        }
    };
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}): this test needs the llama.cpp build; run `cargo xtask test`, \
             or `cargo xtask paths > ~/.cache/ttrace/paths.json` once, or set TTRACE_PATHS",
            file.display()
        )
    });
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display()));
    let path = |key: &str| -> PathBuf {
        let p = json[key].as_str().unwrap_or_else(|| panic!("{} has no string key `{key}`", file.display()));
        let p = PathBuf::from(p);
        assert!(p.exists(), "{} names {key} = {}, which does not exist", file.display(), p.display());
        p
    };
    let venv_python = path("venv_python");
    let pip_lib_dir = find_pip_libs(&venv_python).unwrap_or_else(|| {
        panic!(
            "no lib/python*/site-packages/llama_cpp/lib next to {}: is llama-cpp-python installed?",
            venv_python.display()
        )
    });
    Llama { completion: path("llama_completion"), lib_dir: path("llama_lib_dir"), venv_python, pip_lib_dir }
}

fn find_pip_libs(python: &Path) -> Option<PathBuf> {
    // venv/bin/python -> venv/lib/python3.X/site-packages/llama_cpp/lib
    let venv = python.parent()?.parent()?;
    std::fs::read_dir(venv.join("lib")).ok()?.flatten().find_map(|e| {
        let dir = e.path().join("site-packages/llama_cpp/lib");
        dir.is_dir().then_some(dir)
    })
}

/// A fresh empty directory under the system temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ttrace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `cc ARGS`, failing the test with its output.
pub fn cc(args: &[&str], cwd: &Path) {
    let out = std::process::Command::new("cc")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}): these tests build small ELF fixtures with a C compiler"));
    assert!(out.status.success(), "cc {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// Path of generated model `name` (from the same paths file).
pub fn model(name: &str) -> PathBuf {
    let file = match std::env::var_os("TTRACE_PATHS") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".cache/ttrace/paths.json"),
    };
    let json: serde_json::Value = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("cannot read {}: run `cargo xtask test`", file.display()));
    let p = json["models"][name].as_str().unwrap_or_else(|| panic!("{} lists no model `{name}`", file.display()));
    PathBuf::from(p)
}

/// A copy of model `name` of this test's own, for cold-cache runs:
/// `--drop-caches` cannot evict pages another process has mapped, so a run
/// of the shared file is not cold while anything else runs that model.
pub fn private_model(name: &str) -> PathBuf {
    // One directory per call: tests of one binary run in parallel in one
    // process, and two copies of one model in one directory would replace
    // each other's file (and extents) under a running test.
    static COPIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let shared = model(name);
    let copy = scratch(&format!("model-{name}-{n}")).join(shared.file_name().expect("a model file name"));
    std::fs::copy(&shared, &copy).unwrap_or_else(|e| panic!("copying {} to {}: {e}", shared.display(), copy.display()));
    std::fs::File::open(&copy).and_then(|f| f.sync_all()).unwrap();
    copy
}
