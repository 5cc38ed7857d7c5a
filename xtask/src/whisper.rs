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
    let mut did = Vec::new();
    let installed = crate::programs::ensure_wheel(venv_python, "whisper")?;
    if installed != "ok" {
        did.push(installed);
    }
    let script = dir.join("fetch.py");
    let out = shell::output(Command::new(venv_python).arg(&script).arg("--out").arg(cache.join("whisper")))?;
    let manifest: Manifest =
        serde_json::from_str(&out).with_context(|| format!("{} printed no manifest", script.display()))?;
    if manifest.fresh {
        did.push("converted whisper tiny.en and spoke the test sentence".into());
    }
    let what = if did.is_empty() { "ok".to_string() } else { did.join("; ") };
    Ok((manifest.whisper, what))
}
