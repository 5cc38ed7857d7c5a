//! What a llama.cpp build says about itself: ggml's `ggml_version()` and
//! `ggml_commit()` (from mid-2025), llama.cpp's build info (`LLAMA_COMMIT`,
//! `LLAMA_BUILD_NUMBER`, linked into programs that use its common code),
//! and which of the symbols the known releases are told apart by it
//! defines. Read from the files, not the running process: they are the
//! same bytes.

use std::collections::BTreeSet;

use super::{HookLibs, elf};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildFacts {
    /// `ggml_version()`'s text; `None` where the build has no such function.
    pub ggml_version: Option<String>,
    pub ggml_commit: Option<String>,
    pub llama_commit: Option<String>,
    pub llama_build_number: Option<i64>,
    /// The symbols of `tracer_common::layout::known`'s rules the build defines.
    pub symbols: BTreeSet<&'static str>,
}

impl BuildFacts {
    /// The facts of the build whose files `libs` classified.
    pub fn read(libs: &HookLibs) -> Self {
        let string = |function| libs.path_of(function).and_then(|path| elf::returned_string(path, function));
        Self {
            ggml_version: string("ggml_version"),
            ggml_commit: string("ggml_commit"),
            llama_commit: libs.path_of("LLAMA_COMMIT").and_then(elf::llama_commit),
            llama_build_number: libs
                .path_of("LLAMA_BUILD_NUMBER")
                .and_then(|path| elf::int_variable(path, "LLAMA_BUILD_NUMBER")),
            symbols: libs.symbols.keys().copied().collect(),
        }
    }

    pub fn defines(&self, symbol: &str) -> bool {
        self.symbols.contains(symbol)
    }

    /// The build in a few words, for messages: `ggml 0.25.3 (0c1e570),
    /// llama.cpp 0c1e570 build 1`, or what it lacks.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (&self.ggml_version, &self.ggml_commit) {
            (Some(v), Some(c)) => parts.push(format!("ggml {v} ({c})")),
            (Some(v), None) => parts.push(format!("ggml {v}")),
            (None, _) => parts.push("no ggml_version()".to_string()),
        }
        match (&self.llama_commit, self.llama_build_number) {
            (Some(c), Some(n)) => parts.push(format!("llama.cpp {c} build {n}")),
            (Some(c), None) => parts.push(format!("llama.cpp {c}")),
            _ => {}
        }
        parts.join(", ")
    }
}
