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
    /// Where `ggml_backend_buffer_set_usage` stores its argument: the
    /// `usage` offset of this build's `ggml_backend_buffer`, read from its
    /// code (`None`: no such function, or code ttrace does not decode).
    pub buffer_usage: Option<u32>,
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
            buffer_usage: libs
                .path_of(SET_USAGE)
                .and_then(|path| elf::function_head(path, SET_USAGE, 32))
                .and_then(|code| usage_store(&code)),
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

/// `void ggml_backend_buffer_set_usage(buffer, usage)` begins with
/// `buffer->usage = usage` once its assertion passed.
pub const SET_USAGE: &str = "ggml_backend_buffer_set_usage";

/// Where `code` first stores 4 bytes through its first argument (`mov
/// %esi, 0x70(%rdi)`), decoded, `endbr64` and prologue and all.
fn usage_store(code: &[u8]) -> Option<u32> {
    super::code::accesses(code).into_iter().find(|a| a.how == super::code::Use::Write && a.width == 4).map(|a| a.offset)
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_store_is_found_after_the_prologue() {
        // 0c1e570: push %rbp; push %rbx; ... test %rdi,%rdi; je; mov %esi,0x70(%rdi)
        let code = [0x55, 0x53, 0x48, 0x83, 0xec, 0x08, 0x48, 0x85, 0xff, 0x74, 0x30, 0x89, 0x77, 0x70, 0x48];
        assert_eq!(super::usage_store(&code), Some(0x70));
        assert_eq!(super::usage_store(&[0x55, 0xc3]), None);
    }
}
