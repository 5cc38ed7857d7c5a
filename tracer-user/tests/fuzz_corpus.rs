//! Replays the fuzz seeds and every input a fuzz run ever crashed on
//! (fuzz/regressions/<target>/, where crash files are copied) through the
//! fuzz targets' own checks, so a fixed crash stays fixed without cargo-fuzz.

use std::path::{Path, PathBuf};

#[path = "../../fuzz/fuzz_targets/checks.rs"]
mod checks;

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = Vec::new();
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else { continue };
        files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.is_file() && !p.ends_with(".gitkeep")));
    }
    files.sort();
    files
}

#[test]
fn gguf_reader_corpus_replays() {
    let files = inputs("gguf_reader");
    assert!(files.len() >= 4, "the GGUF seeds are missing: {files:?}");
    for f in files {
        println!("{}", f.display());
        checks::gguf_reader(&std::fs::read(&f).unwrap());
    }
}

#[test]
fn maps_parser_corpus_replays() {
    let files = inputs("maps_parser");
    assert!(files.len() >= 2, "the maps seeds are missing: {files:?}");
    for f in files {
        println!("{}", f.display());
        checks::maps_parser(&std::fs::read(&f).unwrap());
    }
}
