//! The /proc/PID/maps parser on arbitrary text (checks::maps_parser).
#![no_main]

mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::maps_parser(data));
