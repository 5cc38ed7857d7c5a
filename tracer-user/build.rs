//! Builds the eBPF object (tracer-ebpf, for bpfel-unknown-none on nightly) via
//! aya-build, as aya-template does; `src/live/load.rs` embeds it from OUT_DIR.
//! Only the `live` feature needs it: the offline build skips it. Both embed
//! `ttrace view`'s front end from `viewer/dist` when it has been built, and
//! set what `ttrace --version` says beyond the crate version: the git commit
//! (TTRACE_GIT_COMMIT) and the eBPF object's hash (TTRACE_EBPF_OBJECT), so a
//! release binary names the exact sources and kernel programs it carries.

use std::{path::Path, process::Command};

/// Inputs of the binary, relative to the workspace root, whose changes
/// recompile it anyway; rerunning this script for them too keeps the commit
/// label current at no extra cost (tracer-ebpf and viewer/dist are watched
/// by their own steps).
const SOURCES: &[&str] = &["Cargo.toml", "Cargo.lock", "tracer-user/src", "tracer-user/Cargo.toml", "tracer-common"];

fn main() -> anyhow::Result<()> {
    embed_viewer()?;
    println!("cargo:rustc-env=TTRACE_GIT_COMMIT={}", git_commit());
    #[cfg(feature = "live")]
    let ebpf = {
        build_ebpf()?;
        ebpf_hash()?
    };
    #[cfg(not(feature = "live"))]
    let ebpf = "absent (built without the `live` feature)";
    println!("cargo:rustc-env=TTRACE_EBPF_OBJECT={ebpf}");
    Ok(())
}

/// `abc1234`, or `abc1234-dirty` when the tree had uncommitted changes
/// (untracked files too: a new module not yet added is part of the build),
/// or `unknown` outside a git checkout (a source tarball), as of this
/// script's run. It does not watch git itself: a commit would then
/// recompile all of tracer-user even when no source changed. So a build
/// keeps the label of the sources it was compiled from until they change;
/// `cargo xtask dist` sets TTRACE_GIT_COMMIT, so a release's is never stale.
fn git_commit() -> String {
    println!("cargo:rerun-if-env-changed=TTRACE_GIT_COMMIT");
    if let Ok(commit) = std::env::var("TTRACE_GIT_COMMIT") {
        return commit;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for source in SOURCES {
        println!("cargo:rerun-if-changed={}", root.join(source).display());
    }
    let git = |args: &[&str]| -> Option<String> {
        // No optional locks: `status` would otherwise refresh the index,
        // racing the user's own git commands.
        let out = Command::new("git").arg("-C").arg(&root).arg("--no-optional-locks").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let Some(hash) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    if git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty()) { format!("{hash}-dirty") } else { hash }
}

/// `ttrace view`'s front end: every file of `viewer/dist` (built by `cargo
/// xtask setup`) as `include_bytes!`, in OUT_DIR/viewer_assets.rs. Without
/// it the list is empty and `view` says how to build it.
fn embed_viewer() -> anyhow::Result<()> {
    use std::fmt::Write as _;

    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../viewer/dist");
    // A directory is watched with everything in it; a missing one makes
    // Cargo rerun this script until it exists.
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.is_dir() {
        collect(&dist, &mut files)?;
    }
    files.sort();
    let mut out = String::from("pub static ASSETS: &[(&str, &[u8])] = &[\n");
    for file in &files {
        let name =
            file.strip_prefix(&dist)?.to_str().ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", file.display()))?;
        let abs = file.canonicalize()?;
        writeln!(out, "    ({name:?}, include_bytes!({:?})),", abs.to_str().unwrap_or_default())?;
    }
    out.push_str("];\n");
    std::fs::write(Path::new(&std::env::var("OUT_DIR")?).join("viewer_assets.rs"), out)?;
    Ok(())
}

fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(feature = "live")]
fn build_ebpf() -> anyhow::Result<()> {
    use anyhow::Context as _;
    use aya_build::{Package, Toolchain};

    let ebpf_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tracer-ebpf");
    let ebpf_dir =
        ebpf_dir.canonicalize().with_context(|| format!("tracer-ebpf not found at {}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir.to_str().context("tracer-ebpf path is not UTF-8")?;
    // aya-build only reruns on changes under root_dir; the layouts live in tracer-common.
    println!("cargo:rerun-if-changed={}", ebpf_dir.join("../tracer-common").display());
    aya_build::build_ebpf(
        [Package { name: "tracer-ebpf", root_dir, ..Default::default() }],
        Toolchain::default(),
    )
    .context("building the eBPF object failed; `cargo xtask setup` installs its toolchain (nightly rust-src, bpf-linker)")
}

/// `blake3 <first 16 hex digits>` of the object load.rs embeds (`b3sum` gives
/// the same for a copy of it); the full hash would only lengthen the line.
#[cfg(feature = "live")]
fn ebpf_hash() -> anyhow::Result<String> {
    use anyhow::Context as _;

    let object = Path::new(&std::env::var("OUT_DIR")?).join("tracer");
    let bytes = std::fs::read(&object).with_context(|| format!("reading the eBPF object {}", object.display()))?;
    Ok(format!("blake3 {}", &blake3::hash(&bytes).to_hex()[..16]))
}
