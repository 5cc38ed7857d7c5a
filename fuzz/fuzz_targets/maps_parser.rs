//! The /proc/PID/maps parser on arbitrary text (checks::maps_parser).
#![no_main]

mod checks;
#[allow(dead_code, unused_imports)]
#[path = "../../tracer-user/src/resolve/mod.rs"]
mod resolve;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::maps_parser(data));
