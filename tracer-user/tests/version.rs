//! `ttrace --version` names the commit and the embedded eBPF object; the
//! object's hash, computed by build.rs, is checked here against the very
//! bytes the loader loads.

use std::process::Command;

fn ttrace(arg: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ttrace")).arg(arg).output().expect("running ttrace");
    assert!(out.status.success(), "ttrace {arg} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8").trim().to_string()
}

/// `abc1234`, `abc1234-dirty` or `unknown` (no git checkout).
fn assert_commit(commit: &str) {
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        commit == "unknown" || (hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "not a commit: {commit:?}"
    );
}

#[test]
fn short_version_names_the_commit() {
    let line = ttrace("-V");
    let commit = line
        .strip_prefix(concat!("ttrace ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected -V: {line}"));
    assert_commit(commit);
}

#[test]
fn long_version_names_the_commit_and_the_ebpf_object() {
    let line = ttrace("--version");
    let rest = line
        .strip_prefix(concat!("ttrace ", env!("CARGO_PKG_VERSION"), " (commit "))
        .unwrap_or_else(|| panic!("unexpected --version: {line}"));
    let (commit, object) = rest.split_once(", eBPF object ").unwrap_or_else(|| panic!("no eBPF object in {line}"));
    assert_commit(commit);
    #[cfg(feature = "live")]
    {
        let hash = blake3::hash(ttrace::live::load::EBPF_OBJECT).to_hex();
        assert_eq!(object, format!("blake3 {})", &hash[..16]));
    }
    #[cfg(not(feature = "live"))]
    assert_eq!(object, "absent (built without the `live` feature))");
}
