//! The offline path (`report`, `export`, `gguf`) builds without the eBPF
//! toolchain: without the `live` feature, nothing pulls in aya or tokio.

use std::process::Command;

#[test]
fn offline_build_depends_on_neither_aya_nor_tokio() {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "-p", "tracer-user", "--no-default-features", "--prefix", "none", "-e", "normal,build"])
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().count() > 10, "cargo tree printed too little:\n{tree}");
    let live: Vec<&str> = tree.lines().filter(|l| l.starts_with("aya") || l.starts_with("tokio ")).collect();
    assert!(live.is_empty(), "the offline build pulls in the live side: {live:?}");
}
