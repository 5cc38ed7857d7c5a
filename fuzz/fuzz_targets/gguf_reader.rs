//! The GGUF reader on arbitrary bytes (checks::gguf_reader).
#![no_main]

mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::gguf_reader(data));
