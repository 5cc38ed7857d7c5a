//! JSON values written straight into byte buffers, with the bytes
//! `serde_json` writes for them: the row and token exports format millions
//! of values, where per-field serializer calls and `Value` trees would cost
//! more than the output itself.

use std::io::Write as _;

use serde_json::ser::{CompactFormatter, Formatter};

pub fn num(out: &mut Vec<u8>, v: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// A number or `null`.
pub fn n(out: &mut Vec<u8>, v: Option<impl itoa::Integer>) {
    match v {
        Some(v) => num(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// A float as `serde_json` writes one (shortest round-trip form, `0.0` for
/// zero); non-finite values, which JSON lacks, as `null` as it does.
pub fn float(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        // Writing into a Vec cannot fail.
        let _ = CompactFormatter.write_f64(out, v);
    } else {
        out.extend_from_slice(b"null");
    }
}

/// A string or `null`.
pub fn s(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => string(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// An array of integers.
pub fn ints<T: itoa::Integer + Copy>(out: &mut Vec<u8>, v: &[T]) {
    out.push(b'[');
    for (i, &x) in v.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        num(out, x);
    }
    out.push(b']');
}

/// `"0x…"`, as `format!("{:#x}")` writes it.
pub fn hex(out: &mut Vec<u8>, v: u64) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "\"{v:#x}\"");
}

/// A quoted, escaped string.
pub fn string(out: &mut Vec<u8>, v: &str) {
    out.push(b'"');
    json_escaped(out, v);
    out.push(b'"');
}

/// `serde_json`'s escaping: `"`, `\` and control characters, the usual short
/// forms and `\u00xx` (lowercase hex) for the rest; everything else verbatim.
pub fn json_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.extend_from_slice(&[b'\\', short]);
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escaping_is_serde_jsons() {
        for c in (0u32..0x300).filter_map(char::from_u32).chain(['\u{2028}', '\u{fffd}', '😀']) {
            let s = format!("a{c}b{c}");
            let mut out = Vec::new();
            json_escaped(&mut out, &s);
            let expected = serde_json::to_string(&s).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), expected[1..expected.len() - 1], "{c:?}");
        }
    }

    #[test]
    fn floats_are_serde_jsons() {
        for v in [0.0, 1.0, 0.1, 1e-7, 12.345678, 1e21, 123456789.0, f64::MIN_POSITIVE, -0.5, 5e-324] {
            let mut out = Vec::new();
            float(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&serde_json::json!(v)).unwrap());
        }
        let mut out = Vec::new();
        float(&mut out, f64::NAN);
        assert_eq!(out, b"null");
        assert_eq!(serde_json::to_string(&serde_json::json!(f64::NAN)).unwrap(), "null");
    }
}
