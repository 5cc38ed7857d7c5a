//! Builds the eBPF object (tracer-ebpf, for bpfel-unknown-none on nightly) via
//! aya-build, as aya-template does; `src/live/load.rs` embeds it from OUT_DIR.
//! Only the `live` feature needs it: the offline build skips it.

fn main() -> anyhow::Result<()> {
    #[cfg(feature = "live")]
    build_ebpf()?;
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
