//! The offline path (`report`, `export`, `gguf`, `view`) builds without the
//! eBPF toolchain: without the `live` feature, nothing pulls in aya (tokio
//! it has, for `view`'s HTTP server).

use std::process::Command;

#[test]
fn offline_build_does_not_depend_on_aya() {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "-p", "tracer-user", "--no-default-features", "--prefix", "none", "-e", "normal,build"])
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().count() > 10, "cargo tree printed too little:\n{tree}");
    let live: Vec<&str> = tree.lines().filter(|l| l.starts_with("aya")).collect();
    assert!(live.is_empty(), "the offline build pulls in the live side: {live:?}");
    assert!(tree.lines().any(|l| l.starts_with("axum ")), "the offline build lacks `view`'s server:\n{tree}");
}
