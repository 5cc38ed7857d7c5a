//! `cargo xtask lint`: rustfmt and clippy (warnings are errors) over the
//! host crates, and clippy over the eBPF crate on its own target, where it is
//! actually compiled (a host check would skip its `#[cfg(target_arch = "bpf")]`
//! code). tracer-user is also checked without its `live` feature.

use std::process::Command;

use anyhow::Result;

use crate::{cache, setup, shell};

pub fn run() -> Result<()> {
    // The bpf target needs the nightly rust-src and bpf-linker from set-up.
    setup::run()?;
    let root = cache::repo_root();
    shell::run(Command::new("cargo").current_dir(&root).args(["fmt", "--all", "--check"]))?;
    shell::run(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The offline build (report, export, gguf) without the eBPF toolchain.
    shell::run(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "-p",
        "tracer-user",
        "--no-default-features",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    shell::run(
        Command::new("cargo")
            .current_dir(&root)
            .args(["+nightly", "clippy", "-p", "tracer-ebpf", "--release", "--target", "bpfel-unknown-none"])
            .args(["-Z", "build-std=core", "--", "-D", "warnings"])
            .env("CARGO_TARGET_DIR", root.join("target/bpf-lint")),
    )?;
    eprintln!(
        "xtask: fmt and clippy clean (host crates, tracer-user without `live`, and tracer-ebpf on bpfel-unknown-none)"
    );
    Ok(())
}
