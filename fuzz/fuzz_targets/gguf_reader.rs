//! The GGUF reader on arbitrary bytes (checks::gguf_reader).
#![no_main]

mod checks;
#[allow(dead_code, unused_imports)]
#[path = "../../tracer-user/src/resolve/mod.rs"]
mod resolve;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::gguf_reader(data));
