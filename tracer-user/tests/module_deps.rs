//! Data flows one way: `model`, `format` and `analyze` (and the shared
//! `events` and `units`) never reach into `export`, `live` or `cmd`; nor
//! does `view`. This
//! reads their sources and fails on any path into those modules, including
//! ones inside grouped `use crate::{…}` imports.

use std::path::{Path, PathBuf};

const LOWER: [&str; 5] = ["model", "format", "analyze", "events.rs", "units.rs"];
const UPPER: [&str; 4] = ["export", "live", "cmd", "sweep"];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// Every path that starts at the crate root: `crate::a::b` and each
/// top-level item of `crate::{a::b, c}`, as its first segment.
fn crate_paths(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let after = rest.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let (mut depth, mut item) = (1, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    if !item.trim().is_empty() {
                        found.push(first_segment(&item));
                    }
                    item.clear();
                    if depth == 0 {
                        break;
                    }
                } else {
                    item.push(c);
                }
            }
        } else {
            found.push(first_segment(after));
        }
    }
    found
}

fn first_segment(path: &str) -> String {
    path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Where the files under `modules` import `export`, `live` or `cmd` (and,
/// for modules that sit below the root, climb to it with `super::super`).
fn upward_imports(modules: &[&str], nested: bool) -> (usize, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for module in modules {
        rust_files(&src.join(module), &mut files);
    }
    let mut bad = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for path in crate_paths(&text) {
            if UPPER.contains(&path.as_str()) {
                bad.push(format!("{} uses crate::{path}", file.strip_prefix(&src).unwrap().display()));
            }
        }
        // `super::super::…` from a lower module could only climb to the root.
        if !nested && text.contains("super::super") {
            bad.push(format!("{} climbs to the crate root with super::super", file.display()));
        }
    }
    (files.len(), bad)
}

#[test]
fn lower_modules_do_not_import_export_live_or_cmd() {
    let (files, bad) = upward_imports(&LOWER, false);
    assert!(files > 20, "found only {files} files under {LOWER:?}: layout changed?");
    assert!(bad.is_empty(), "one-way data flow broken:\n{}", bad.join("\n"));
}

/// `view` is a sibling of `export` on the offline path: it reads through
/// `format` and computes through `analyze`, never through an export.
#[test]
fn view_does_not_import_export_live_or_cmd() {
    let (files, bad) = upward_imports(&["view"], true);
    assert!(files > 5, "found only {files} files under view/");
    assert!(bad.is_empty(), "view reaches past analyze:\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_grouped_imports() {
    let paths = crate_paths("use crate::{\n    analyze::{a, b},\n    export::rows,\n};\nfn f() { crate::live::x(); }");
    assert_eq!(paths, ["analyze", "export", "live"]);
}
