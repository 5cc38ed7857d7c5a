use std::path::Path;

use tracer_common::layout::known::{CGRAPH_2026, RELEASES, release_of};

use super::*;

/// Symbols every build from Dec 2024 on has in its ggml libraries.
const CPU: &[&str] = &["ggml_op_name", "ggml_graph_compute", "ggml_cpu_extra_compute_forward"];
/// llama-cpp-python 0.3.2's: no per-node hook in its CPU backend.
const OLD_CPU: &[&str] = &["ggml_op_name", "ggml_graph_compute"];

fn facts(version: Option<&str>, symbols: &[&'static str]) -> BuildFacts {
    BuildFacts {
        ggml_version: version.map(str::to_string),
        symbols: symbols.iter().copied().chain([crate::live::target::SET_USAGE]).collect(),
        ..Default::default()
    }
}

fn choose_ok(version: Option<&str>) -> Choice {
    choose(&facts(version, CPU), true, None).unwrap_or_else(|e| panic!("{version:?}: {e}"))
}

#[test]
fn each_known_build_gets_its_release() {
    // What the builds of the test matrix (and the versions around each
    // change) return from ggml_version(): 0.3.3 has none, 0.3.12-0.3.16
    // report `0.0.<build number>`, 0.3.20 is 0.9.11, 0.3.21 0.10.0.
    let cases = [
        (None, "2024-12"),
        (Some("0.0.1"), "2025-07"),
        (Some("0.0.6123"), "2025-07"),
        (Some("0.9.11"), "2025-07"),
        (Some("0.10.0"), "2026-04"),
        (Some("0.15.1"), "2026-04"),
        (Some("0.25.3"), "2026-04"),
    ];
    for (version, release) in cases {
        let choice = choose_ok(version);
        assert_eq!(choice.release.name, release, "{version:?}");
        assert_eq!(choice.layout.valid, 1);
        assert_eq!(choice.build.release, release);
        assert_eq!(choice.build.ggml_version.as_deref(), version);
        assert!(choice.disabled.is_empty(), "{version:?}: {:?}", choice.disabled);
    }
}

#[test]
fn the_cgraph_uid_is_read_only_from_ggml_0_10_on() {
    for (version, uid) in [(None, false), (Some("0.0.1"), false), (Some("0.9.11"), false), (Some("0.10.0"), true)] {
        let choice = choose_ok(version);
        assert_eq!(choice.layout.cgraph.has_uid(), uid, "{version:?}");
        assert_eq!(choice.build.offsets.contains_key("ggml_cgraph.uid"), uid, "{version:?}");
    }
    assert_eq!(choose_ok(Some("0.25.3")).layout.cgraph, CGRAPH_2026.layout);
    assert_eq!(choose_ok(Some("0.25.3")).build.offsets["ggml_cgraph.uid"], 88);
}

#[test]
fn a_build_older_than_the_layout_change_is_refused_in_one_line() {
    let mut old = facts(None, OLD_CPU);
    old.llama_commit = Some("74d73dc".into());
    old.llama_build_number = Some(1);
    let refusal = choose(&old, false, None).unwrap_err();
    let line = refusal.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(line.starts_with("ggml_tensor: "), "names the struct: {line}");
    assert!(line.contains("llama.cpp 74d73dc build 1"), "names the version found: {line}");
    assert!(line.contains("llama-cpp-python up to 0.3.2"), "places it: {line}");
    assert!(line.contains("still has `grad`"), "says what differs: {line}");
    assert!(
        line.contains("supported: llama.cpp Dec 2024 - Oct 2026 (llama-cpp-python 0.3.3 - 0.3.36; ggml_version() none, 0.0.0 - 0.25.3)"),
        "names what is supported: {line}"
    );
    assert!(line.ends_with("nothing was recorded"), "{line}");
}

#[test]
fn versions_ttrace_cannot_place_are_refused() {
    let newer = choose(&facts(Some("0.26.0"), CPU), true, None).unwrap_err();
    assert_eq!(newer.structure, "ggml_tensor");
    assert!(newer.to_string().contains("ggml 0.26.0") && newer.why.contains("newer than any"), "{newer}");
    // A developer may try the newest tables on it, patched by hand.
    let tried = choose(&facts(Some("0.26.0"), CPU), true, Some("ggml_tensor.name=256")).unwrap();
    assert_eq!((tried.release.name, tried.build.patched.as_deref()), ("2026-04", Some("ggml_tensor.name=256")));
    let garbled = choose(&facts(Some("master"), CPU), true, None).unwrap_err();
    assert!(garbled.to_string().contains("ggml_version() returns \"master\""), "{garbled}");
    // A ggml_version() but no CPU hook: no release has that.
    let odd = choose(&facts(Some("0.25.3"), OLD_CPU), true, None).unwrap_err();
    assert!(odd.why.contains("no llama.cpp release"), "{odd}");
    let not_ggml = choose(&facts(None, &[]), true, None).unwrap_err();
    assert!(not_ggml.why.contains("not a ggml build"), "{not_ggml}");
}

#[test]
fn without_the_ubatch_hook_only_sequences_turn_off() {
    let choice = choose(&facts(None, CPU), false, None).unwrap();
    assert_eq!(choice.release.name, "2024-12");
    assert!(!choice.layout.ubatch.known(), "the probe reads nothing");
    assert!(choice.layout.tensor.size > 0 && choice.layout.cgraph.n_nodes == 4);
    let [off] = &choice.disabled[..] else { panic!("{:?}", choice.disabled) };
    assert_eq!((off.feature.as_str(), off.structure.as_str()), ("sequences", "llama_ubatch"));
    assert!(off.reason.contains("process_ubatch"), "{off}");
    assert!(!choice.build.layouts.contains_key("llama_ubatch"));
    assert!(!choice.build.offsets.keys().any(|k| k.starts_with("llama_ubatch")));
}

#[test]
fn buffers_turn_off_where_set_usage_disagrees_with_the_table() {
    let mut f = facts(Some("0.25.3"), CPU);
    f.buffer_usage = Some(0x70);
    let choice = choose(&f, true, None).unwrap();
    assert!(choice.layout.buffer.known() && choice.disabled.is_empty(), "{:?}", choice.disabled);
    assert_eq!(choice.build.layouts["ggml_backend_buffer"], "ggml_backend_buffer/2026-04");
    assert_eq!(choice.build.offsets["ggml_backend_buffer.buft"], 0x58);
    // A 0.3.16 build (ggml 0.0.x) stores it at 0x60, as the 2024 table says.
    f = facts(Some("0.0.6123"), CPU);
    f.buffer_usage = Some(0x60);
    assert_eq!(choose(&f, true, None).unwrap().layout.buffer.usage, 0x60);
    f.buffer_usage = Some(0x70);
    let off = choose(&f, true, None).unwrap();
    assert!(!off.layout.buffer.known() && !off.build.layouts.contains_key("ggml_backend_buffer"));
    let [d] = &off.disabled[..] else { panic!("{:?}", off.disabled) };
    assert_eq!(d.feature, "buffers");
    assert!(d.reason.contains("offset 112, the ggml_backend_buffer/2024 table at 96"), "{d}");
    let mut none = facts(Some("0.25.3"), CPU);
    none.symbols.remove(crate::live::target::SET_USAGE);
    assert!(choose(&none, true, None).unwrap().disabled[0].reason.contains("no ggml_backend_buffer_set_usage"));
}

#[test]
fn a_patch_moves_one_offset_and_is_recorded() {
    let choice = choose(&facts(Some("0.25.3"), CPU), true, Some("ggml_tensor.name=264")).unwrap();
    assert_eq!(choice.layout.tensor.name, 264);
    assert_eq!(choice.build.offsets["ggml_tensor.name"], 264);
    assert_eq!(choice.build.patched.as_deref(), Some("ggml_tensor.name=264"));
    let unpatched = choose_ok(Some("0.25.3"));
    assert_eq!(unpatched.layout.tensor.name, 256);
    let absent = choose(&facts(Some("0.25.3"), CPU), true, Some("ggml_cgraph.uid=absent")).unwrap();
    assert!(!absent.layout.cgraph.has_uid());
    for (bad, why) in [
        ("ggml_tensor.name=3", "not aligned"),
        ("ggml_tensor.nope=8", "not a field"),
        ("ggml_tensor.name", "struct.field=N"),
        ("ggml_tensor.name=x", "not a byte offset"),
        ("ggml_tensor.src=320", "past the end"),
    ] {
        let refusal = choose(&facts(Some("0.25.3"), CPU), true, Some(bad)).unwrap_err();
        assert!(refusal.to_string().contains(why), "{bad}: {refusal}");
    }
}

/// The rules pick exactly one release for any build within a release's
/// version range that has its symbols, and none outside every range.
#[test]
fn releases_do_not_overlap() {
    use tracer_common::layout::known::GgmlVersions;
    for release in RELEASES {
        let defines = |s: &str| release.defines.contains(&s) || (s == "ggml_op_name" && release.lacks.is_empty());
        let versions = match release.ggml {
            GgmlVersions::None => vec![None],
            GgmlVersions::Range(lo, hi) => vec![Some(lo), Some(hi)],
        };
        for version in versions {
            let found = release_of(version, &defines).map(|r| r.name);
            assert_eq!(found, Some(release.name), "{version:?}");
        }
    }
}

const START: &str = "<!-- supported-versions: generated by `cargo test -p tracer-user readme_versions_table`; \
                     TTRACE_BLESS=1 rewrites it -->\n";
const END: &str = "<!-- end supported-versions -->";

/// The README's "supported llama.cpp versions" table is the tables'.
#[test]
fn readme_versions_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(START).map(|i| i + START.len()).expect("the README has the table's start marker");
    let end = readme[start..].find(END).map(|i| start + i).expect("and its end marker");
    let table = versions_table();
    if std::env::var_os("TTRACE_BLESS").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &readme[..start], &readme[end..])).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..end],
        table,
        "README.md's supported-versions table differs from tracer-common's tables; \
         rerun with TTRACE_BLESS=1 to rewrite it"
    );
}
