//! Builds the eBPF object (tracer-ebpf, for bpfel-unknown-none on nightly) via
//! aya-build, as aya-template does; `src/live/load.rs` embeds it from OUT_DIR.
//! Only the `live` feature needs it: the offline build skips it. Both embed
//! `ttrace view`'s front end from `viewer/dist` when it has been built.

fn main() -> anyhow::Result<()> {
    embed_viewer()?;
    #[cfg(feature = "live")]
    build_ebpf()?;
    Ok(())
}

/// `ttrace view`'s front end: every file of `viewer/dist` (built by `cargo
/// xtask setup`) as `include_bytes!`, in OUT_DIR/viewer_assets.rs. Without
/// it the list is empty and `view` says how to build it.
fn embed_viewer() -> anyhow::Result<()> {
    use std::{fmt::Write as _, path::Path};

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
    use std::path::Path;

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
