//! The struct layouts the probes read, chosen from the target build and
//! checked on the live target (root, the real llama-completion): one offset
//! of the table made wrong (`TTRACE_LAYOUT_PATCH`, as a developer trying a
//! new version's offsets would) is refused in one line with nothing
//! recorded, in both capture modes; the right table records the build and
//! its tables, which the build's own `--version` confirms.
// Traces real processes: needs the default `live` feature.
#![cfg(feature = "live")]

use std::{path::Path, process::Output};

use ttrace::format::TraceReader;

mod common;
mod target_support;

use common::{require_root, stderr, ttrace};

fn traced(trace: &Path, patch: Option<&str>, extra: &[&str]) -> Output {
    let llama = target_support::llama();
    let mut cmd = ttrace();
    if let Some(patch) = patch {
        cmd.env("TTRACE_LAYOUT_PATCH", patch);
    }
    cmd.arg("run")
        .args(extra)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(&llama.completion)
        .arg("-m")
        .arg(target_support::model("tiny"))
        .args(["-p", "hello world", "-n", "4", "-no-cnv", "--ignore-eos", "-t", "2"])
        .output()
        .unwrap()
}

/// ttrace's own lines on stderr. The target writes there too, and a
/// target killed by the refusal may leave its last line cut short (seen:
/// llama's log prefix `0.00.016.360 ` with ttrace's error after it), so a
/// line of ttrace's is found where it starts, not only at a line's start.
fn own_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter_map(|l| if l.starts_with('[') { Some(l) } else { l.find("ttrace: ").map(|at| &l[at..]) })
        .map(str::to_string)
        .collect()
}

#[test]
fn one_wrong_offset_is_refused_in_one_line_and_nothing_is_recorded() {
    require_root();
    let dir = target_support::scratch("layout-wrong");
    // Each moves one field by one slot: the name and the shape are still
    // plausible on their own (text; counts >= 1), the graph's nodes not.
    let cases: [(&str, &str, &[&str]); 5] = [
        ("ggml_tensor.name=264", "ggml_tensor", &[]),
        ("ggml_tensor.name=264", "ggml_tensor", &["--op-timing"]),
        ("ggml_tensor.ne=24", "ggml_tensor", &[]),
        ("ggml_tensor.ne=24", "ggml_tensor", &["--op-timing"]),
        ("ggml_cgraph.nodes=24", "ggml_cgraph", &[]),
    ];
    for (patch, structure, extra) in cases {
        let trace = dir.join("t.data");
        std::fs::write(&trace, b"an earlier trace").unwrap();
        let out = traced(&trace, Some(patch), extra);
        let lines = own_lines(&out);
        assert!(!out.status.success(), "{patch} {extra:?}: ttrace accepted a wrong layout:\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{patch} {extra:?}");
        assert_eq!(lines.len(), 1, "{patch} {extra:?}: one line from ttrace, got {lines:#?} in:\n{}", stderr(&out));
        let line = &lines[0];
        assert!(line.starts_with(&format!("ttrace: error: {structure}: ")), "{patch}: names the struct: {line}");
        assert!(line.contains("ggml 0.") && line.contains("llama.cpp "), "{patch}: names the version: {line}");
        assert!(line.contains(&format!("patched by TTRACE_LAYOUT_PATCH={patch}")), "{line}");
        assert!(line.contains("supported: llama.cpp "), "{patch}: names the versions supported: {line}");
        assert!(!trace.exists(), "{patch} {extra:?}: a refused run leaves no trace");
    }
}

#[test]
fn the_header_names_the_build_and_the_tables_its_version_says() {
    require_root();
    let trace = target_support::scratch("layout-header").join("t.data");
    let out = traced(&trace, None, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The oracle: `llama-completion --version` prints `version: X (build N, commit abcdef0)`.
    let version = std::process::Command::new(target_support::llama().completion).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&version.stdout).into_owned() + &String::from_utf8_lossy(&version.stderr);
    let (build, commit) = text
        .split_once("(build ")
        .and_then(|(_, rest)| rest.split_once(", commit "))
        .and_then(|(n, rest)| Some((n.trim().parse::<i64>().ok()?, rest.split(')').next()?.to_string())))
        .unwrap_or_else(|| panic!("no `(build N, commit C)` in llama-completion --version: {text}"));

    let mut reader = TraceReader::open(&trace).unwrap();
    while reader.next_record().unwrap().is_some() {}
    let header = reader.header();
    let b = header.build.as_ref().expect("the header names the build");
    assert_eq!(header.llama_commit.as_deref(), Some(commit.as_str()));
    assert_eq!((b.llama_commit.as_deref(), b.llama_build_number), (Some(commit.as_str()), Some(build)));
    assert!(b.ggml_commit.as_deref().is_some_and(|c| c.starts_with(&commit)), "{b:?}");
    let release = tracer_common::layout::known::RELEASES.iter().find(|r| r.name == b.release).expect("a known release");
    assert!(release.supported, "{b:?}");
    for (structure, table) in [
        ("ggml_tensor", release.tensor.name),
        ("ggml_cgraph", release.cgraph.name),
        ("ggml_compute_params", release.params.name),
    ] {
        assert_eq!(b.layouts.get(structure).map(String::as_str), Some(table), "{b:?}");
    }
    assert_eq!(b.offsets["ggml_tensor.name"], 256);
    assert_eq!(b.patched, None);

    // The report prints them, and the trailer what the live check passed.
    let report = ttrace().arg("report").arg(&trace).output().unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    let row = |key: &str| text.lines().find(|l| l.trim_start().starts_with(key)).unwrap_or_default().to_string();
    assert!(row("llama.cpp").contains(&format!("commit {commit} build {build}")), "{text}");
    assert!(row("layouts").contains(release.tensor.name) && row("layouts").contains("checked on the target"), "{text}");
    let json = ttrace().arg("report").arg("--json").arg(&trace).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["summary"]["build"]["release"], b.release.as_str(), "report --json names it");
    let check = &json["summary"]["layout_check"];
    assert!(check["graphs"].as_u64() >= Some(1) && check["weights"].as_u64() >= Some(1), "{check}");
}

/// With the tables hidden, the layouts come from the build's code alone: a
/// copy of libggml-base whose `ggml_get_name` reads 8 bytes further on is
/// refused in one line (its name no longer follows `data`), with nothing
/// recorded, and the untouched build traces with the tables' offsets.
#[test]
fn layouts_read_from_a_patched_accessor_are_refused() {
    require_root();
    let llama = target_support::llama();
    let dir = target_support::scratch("layout-derive");
    let original = llama.lib_dir.join("libggml-base.so.0");
    let bytes = std::fs::read(&original).unwrap();
    let at = ttrace::live::target::symbol_file_offsets(&original, &["ggml_get_name"]).unwrap()[0].unwrap() as usize;
    // lea 0x100(%rdi),%rax → lea 0x108(%rdi),%rax
    let lea = [0x48, 0x8d, 0x87, 0x00, 0x01, 0x00, 0x00];
    assert_eq!(bytes[at..at + 7], lea, "ggml_get_name as llama.cpp 0c1e570 compiles it");
    let mut patched = bytes.clone();
    patched[at + 3] = 0x08;
    std::fs::write(dir.join("libggml-base.so.0"), patched).unwrap();

    let run = |lib_path: Option<&Path>| {
        let trace = dir.join("t.data");
        let _ = std::fs::remove_file(&trace);
        let mut cmd = ttrace();
        cmd.env("TTRACE_LAYOUT_TABLES", "off");
        if let Some(p) = lib_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        let out = cmd
            .args(["run", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&llama.completion)
            .arg("-m")
            .arg(target_support::model("tiny"))
            .args(["-p", "hello world", "-n", "4", "-no-cnv", "-t", "2"])
            .output()
            .unwrap();
        (out, trace)
    };
    let (out, trace) = run(Some(&dir));
    assert_eq!(out.status.code(), Some(1), "ttrace traced a build whose accessor moved:\n{}", stderr(&out));
    let lines: Vec<String> = own_lines(&out).into_iter().filter(|l| !l.contains("TTRACE_LAYOUT_TABLES=off")).collect();
    assert_eq!(lines.len(), 1, "one line from ttrace, got {lines:#?}");
    assert!(lines[0].contains("could not be read from its code (ggml_tensor.name"), "{}", lines[0]);
    assert!(!trace.exists(), "a refused run leaves no trace");

    let (out, trace) = run(None);
    assert!(out.status.success(), "{}", stderr(&out));
    let reader = TraceReader::open(&trace).unwrap();
    let b = reader.header().build.clone().expect("the header names the build");
    assert_eq!(b.release, ttrace::format::TargetBuild::DERIVED);
    assert_eq!((b.offsets["ggml_tensor.name"], b.offsets["ggml_tensor.data"]), (256, 248));
}
