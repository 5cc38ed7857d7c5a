//! Malformed GGUF input: every defect is an error naming what is wrong and
//! the byte offset, never a panic, and never an allocation larger than the file.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    path::{Path, PathBuf},
    process::Command,
};

use ttrace::model::{GgufError, GgufHeader, ModelMap, ParseError, ParseErrorKind};

/// Records the largest single allocation made by the current thread.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(layout.size())));
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(new_size)));
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

fn fixture() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-moe.gguf")).unwrap()
}

/// Parses `bytes`, expecting an error; checks that no single allocation
/// exceeded the input. A few KiB of slack: parsed records take more memory
/// than their smallest encoding, so a short cut input can legitimately need
/// more bytes than it has; what must never happen is an allocation sized by a
/// declared count or length.
fn parse_err(bytes: &[u8]) -> ParseError {
    LARGEST.with(|m| m.set(0));
    let result = GgufHeader::from_bytes(bytes);
    let largest = LARGEST.with(Cell::get);
    let err = result.expect_err("malformed input was accepted");
    assert!(largest <= bytes.len().max(4096), "allocated {largest} bytes for a {}-byte input: {err}", bytes.len());
    assert!(err.offset <= bytes.len() as u64, "offset {} beyond the input ({err})", err.offset);
    assert!(err.to_string().starts_with(&format!("at byte {}", err.offset)), "{err}");
    err
}

fn patch(bytes: &[u8], at: u64, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at as usize..at as usize + with.len()].copy_from_slice(with);
    b
}

/// Offsets of the fields of tensor info `i`: (n_dims, type, offset).
fn tensor_fields(h: &GgufHeader, i: usize) -> (u64, u64, u64) {
    let t = &h.tensors[i];
    let n_dims_at = t.info_offset + 8 + t.name.len() as u64;
    let type_at = n_dims_at + 4 + 8 * t.shape.len() as u64;
    (n_dims_at, type_at, type_at + 4)
}

#[test]
fn the_fixture_is_valid() {
    let h = GgufHeader::from_bytes(&fixture()).unwrap();
    assert_eq!(h.tensors.len(), 23);
    assert_eq!(h.version, 3);
}

#[test]
fn truncation_at_every_header_byte() {
    let bytes = fixture();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    // Every cut inside the header and infos, and inside the tensor data.
    let data_end = h.tensors.iter().map(|t| t.file_offset + t.size_bytes).max().unwrap() as usize;
    for len in (0..h.infos_end as usize).chain([h.data_offset as usize + 1, data_end - 1]) {
        let err = parse_err(&bytes[..len]);
        let ok_kind = matches!(
            err.kind,
            ParseErrorKind::Truncated { .. }
                | ParseErrorKind::CountTooLarge { .. }
                | ParseErrorKind::StringTooLong { .. }
                | ParseErrorKind::PastEof { .. }
        );
        assert!(ok_kind, "cut at {len}: {err}");
    }
}

#[test]
fn wrong_magic_and_version() {
    let bytes = fixture();
    let err = parse_err(&patch(&bytes, 0, b"GGML"));
    assert!(matches!(err.kind, ParseErrorKind::BadMagic(_)) && err.offset == 0, "{err}");
    for v in [0u32, 1, 4, 0x0102_0304] {
        let err = parse_err(&patch(&bytes, 4, &v.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::UnsupportedVersion(_)) && err.offset == 4, "{v}: {err}");
        assert!(err.to_string().contains("version"), "{err}");
    }
}

#[test]
fn counts_and_lengths_beyond_the_file() {
    let bytes = fixture();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    for big in [u64::MAX, 1 << 62, 1 << 40, bytes.len() as u64] {
        let err = parse_err(&patch(&bytes, 8, &big.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::CountTooLarge { what: "tensor", .. }) && err.offset == 8, "{err}");
        let err = parse_err(&patch(&bytes, 16, &big.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::CountTooLarge { what: "key/value", .. }), "{err}");
        // The first key's length.
        let err = parse_err(&patch(&bytes, 24, &big.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::StringTooLong { .. }) && err.offset == 24, "{err}");
        // The vocabulary's array length, and its first string's length.
        let kv = h.kv.iter().find(|kv| kv.key == "tokenizer.ggml.tokens").unwrap();
        let n_at = kv.offset + 8 + kv.key.len() as u64 + 4 + 4;
        let err = parse_err(&patch(&bytes, n_at, &big.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::CountTooLarge { what: "array element", .. }), "{err}");
        assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
        let err = parse_err(&patch(&bytes, n_at + 8, &big.to_le_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::StringTooLong { .. }) && err.offset == n_at + 8, "{err}");
        // A tensor's dimension.
        let (n_dims_at, _, _) = tensor_fields(&h, 3);
        let err = parse_err(&patch(&bytes, n_dims_at + 12, &big.to_le_bytes()));
        assert!(
            matches!(
                err.kind,
                ParseErrorKind::BadDim { .. } | ParseErrorKind::SizeOverflow { .. } | ParseErrorKind::PastEof { .. }
            ),
            "{err}"
        );
    }
}

#[test]
fn bad_tensor_infos() {
    let bytes = fixture();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    let (n_dims_at, type_at, offset_at) = tensor_fields(&h, 2);
    let name = &h.tensors[2].name;

    let err = parse_err(&patch(&bytes, type_at, &77u32.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::UnknownType { id: 77, .. }) && err.offset == type_at, "{err}");
    assert!(err.to_string().contains(name.as_str()) && err.to_string().contains("77"), "{err}");

    let err = parse_err(&patch(&bytes, n_dims_at, &9u32.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::TooManyDims { .. }), "{err}");

    let err = parse_err(&patch(&bytes, offset_at, &(h.tensors[2].rel_offset + 1).to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::Misaligned { .. }) && err.offset == h.tensors[2].info_offset, "{err}");

    let past = bytes.len() as u64 - h.data_offset;
    let err = parse_err(&patch(&bytes, offset_at, &past.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::PastEof { .. }), "{err}");
    let err = parse_err(&patch(&bytes, offset_at, &(u64::MAX - 31).to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::PastEof { .. }), "{err}");

    // Two tensors on the same bytes.
    let err = parse_err(&patch(&bytes, offset_at, &h.tensors[3].rel_offset.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::Overlap { .. }), "{err}");

    // ne0 not a whole number of Q4_0 blocks.
    let err = parse_err(&patch(&bytes, n_dims_at + 4, &33i64.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::PartialBlock { .. }), "{err}");

    // A negative dimension.
    let err = parse_err(&patch(&bytes, n_dims_at + 12, &(-32i64).to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::BadDim { value: -32, .. }), "{err}");

    // A tensor name repeated.
    let t0 = &h.tensors[0];
    let (t1, t1_at) = (&h.tensors[1], h.tensors[1].info_offset);
    if t0.name.len() == t1.name.len() {
        let err = parse_err(&patch(&bytes, t1_at + 8, t0.name.as_bytes()));
        assert!(matches!(err.kind, ParseErrorKind::DuplicateTensor(_)), "{err}");
    }
}

#[test]
fn bad_value_types_and_alignment() {
    let bytes = fixture();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    let kv = &h.kv[1];
    let type_at = kv.offset + 8 + kv.key.len() as u64;
    let err = parse_err(&patch(&bytes, type_at, &13u32.to_le_bytes()));
    assert!(matches!(err.kind, ParseErrorKind::UnknownValueType(13)) && err.offset == type_at, "{err}");
    assert!(err.to_string().contains(&kv.key), "{err}");
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ttrace-gguf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn file_errors_name_the_file_and_the_cli_exits_non_zero() {
    let dir = tmp_dir("malformed");
    let path = dir.join("bad model.gguf");
    let bytes = fixture();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    let (_, type_at, _) = tensor_fields(&h, 5);
    std::fs::write(&path, patch(&bytes, type_at, &99u32.to_le_bytes())).unwrap();

    let err = ModelMap::open(&path).unwrap_err();
    assert!(matches!(err, GgufError::Parse { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("bad model.gguf") && msg.contains(&format!("at byte {type_at}")) && msg.contains("99"),
        "{msg}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_ttrace")).arg("gguf").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("bad model.gguf") && stderr.contains(&format!("at byte {type_at}")), "{stderr}");
    assert_eq!(stderr.matches("at byte").count(), 1, "the cause is printed once: {stderr}");

    let missing = ModelMap::open(&dir.join("missing.gguf")).unwrap_err();
    assert!(missing.to_string().contains("missing.gguf"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
