//! What the fuzz targets assert, as plain functions, so tracer-user's
//! `fuzz_corpus` test replays the seeds and every past crash through exactly
//! the same checks.
#![allow(dead_code)]

use ttrace::model::{AddressSpace, GgufHeader, MemoryClass, ModelMap};

/// The GGUF reader on arbitrary bytes: Ok or Err, never a panic, and whatever
/// it accepts builds a model map that resolves consistently.
pub fn gguf_reader(data: &[u8]) {
    let Ok(header) = GgufHeader::from_bytes(data) else { return };
    for t in &header.tensors {
        assert!(t.file_offset + t.size_bytes <= data.len() as u64);
        assert_eq!(t.file_offset % header.alignment, header.data_offset % header.alignment);
    }
    let _ = serde_json::to_string(&header);
    let Ok(model) = ModelMap::from_headers(vec![("/fuzz/m.gguf".into(), header)]) else { return };
    for (i, t) in model.tensors().iter().enumerate() {
        assert_eq!(model.by_name(&t.name).map(|(j, _)| j as usize), Some(i));
        if t.size_bytes > 0 {
            let (j, off) = model.tensor_at(0, t.file_offset + t.size_bytes - 1).unwrap();
            assert!(off < model.tensors()[j as usize].size_bytes);
        }
    }
    // Map the whole file at a fixed address and resolve every tensor's first byte.
    let maps = format!("10000000-{:x} r--s 00000000 00:00 0 /fuzz/m.gguf\n", 0x1000_0000u64 + data.len() as u64 + 1);
    let space = AddressSpace::from_maps_text(maps.as_bytes(), std::slice::from_ref(&model)).unwrap();
    for t in model.tensors() {
        let r = space.resolve(0x1000_0000 + t.file_offset);
        assert_eq!(r.class(), MemoryClass::ModelFile);
        let _ = space.tensor_for(0x1000_0000 + t.file_offset, &t.name);
    }
}

/// The /proc/PID/maps parser and resolver on arbitrary text: never a panic.
pub fn maps_parser(data: &[u8]) {
    let Ok(space) = AddressSpace::from_maps_text(data, &[]) else { return };
    for r in space.regions() {
        assert!(r.start < r.end);
        for addr in [r.start, r.end - 1, r.end, r.start.wrapping_sub(1)] {
            let _ = space.resolve(addr);
        }
    }
}
