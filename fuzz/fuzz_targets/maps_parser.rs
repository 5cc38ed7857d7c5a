//! The /proc/PID/maps parser and resolver on arbitrary text: never panic.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../tracer-user/src/resolve/mod.rs"]
mod resolve;

use libfuzzer_sys::fuzz_target;
use resolve::AddressSpace;

fuzz_target!(|data: &[u8]| {
    let Ok(space) = AddressSpace::from_maps_text(data, &[]) else { return };
    for r in space.regions() {
        assert!(r.start < r.end);
        for addr in [r.start, r.end - 1, r.end, r.start.wrapping_sub(1)] {
            let _ = space.resolve(addr);
        }
    }
});
