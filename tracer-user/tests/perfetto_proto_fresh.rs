//! The Perfetto bindings, `proto/perfetto_subset.rs`, are generated from
//! `proto/perfetto_subset.proto` and committed, so that a build runs no code
//! generator. This test generates them again (prost-build on protox, a
//! protobuf compiler in Rust: no protoc) and fails while the committed file
//! differs; with `TTRACE_UPDATE_PROTO=1` it writes the file instead.

use std::{env, fs, path::Path};

const REFRESH: &str = "TTRACE_UPDATE_PROTO=1 cargo test -p tracer-user --test perfetto_proto_fresh";

/// What prost-build makes of the .proto now.
fn generate(root: &Path) -> String {
    let descriptors = protox::compile(["perfetto_subset.proto"], [root.join("proto")])
        .unwrap_or_else(|e| panic!("proto/perfetto_subset.proto does not compile: {e:?}"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("perfetto_proto_fresh");
    fs::create_dir_all(&out).unwrap();
    prost_build::Config::new().out_dir(&out).compile_fds(descriptors).expect("prost-build");
    // One file per protobuf package.
    fs::read_to_string(out.join("perfetto.protos.rs")).expect("prost-build writes perfetto.protos.rs")
}

#[test]
fn committed_perfetto_bindings_match_the_proto() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed_path = root.join("proto/perfetto_subset.rs");
    let fresh = generate(root);
    if env::var_os("TTRACE_UPDATE_PROTO").is_some_and(|v| v == "1") {
        fs::write(&committed_path, &fresh).unwrap();
        return;
    }
    let committed = fs::read_to_string(&committed_path).unwrap_or_default();
    if committed != fresh {
        let line = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is stale: it differs from what proto/perfetto_subset.proto generates (from line {}).\n\
             Refresh it with `{REFRESH}` and commit the result.",
            committed_path.display(),
            line + 1,
        );
    }
}
