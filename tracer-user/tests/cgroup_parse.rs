//! `--mem-limit` size parsing and error messages (no root needed).
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

use ttrace::live::target::{CgroupError, MemLimit};

#[test]
fn sizes() {
    assert_eq!(MemLimit::parse("512M").unwrap(), 512 << 20);
    assert_eq!(MemLimit::parse("1G").unwrap(), 1 << 30);
    assert_eq!(MemLimit::parse("1500000000").unwrap(), 1_500_000_000);
    assert_eq!(MemLimit::parse("65536KiB").unwrap(), 64 << 20);
    assert_eq!(MemLimit::parse(" 2gb ").unwrap(), 2 << 30);
    assert_eq!(MemLimit::parse("1.5G").unwrap(), 3 << 29);
    assert_eq!(MemLimit::parse("4 MiB").unwrap(), 4 << 20);
    assert_eq!(MemLimit::parse(".5G").unwrap(), 1 << 29);
}

#[test]
fn bad_sizes() {
    for bad in ["", "M", "12X", "1..5G", "1.2.3G", "-5M", "1e9", "99999999999999999999T", "1.0000000001G"] {
        let e = MemLimit::parse(bad).unwrap_err();
        assert!(matches!(e, CgroupError::BadSize { .. }), "{bad}: {e}");
        assert!(e.to_string().contains("examples"), "{e}");
    }
    for small in ["64KiB", "0", "4194303", "3.9M"] {
        let e = MemLimit::parse(small).unwrap_err();
        assert!(matches!(e, CgroupError::TooSmall { .. }), "{small}: {e}");
        assert!(e.to_string().contains("minimum of 4 MiB"), "{e}");
    }
}

#[test]
fn error_names_the_fix() {
    let e = CgroupError::DropCaches { error: std::io::Error::from_raw_os_error(libc::EACCES) };
    assert!(e.to_string().contains("needs root"), "{e}");
}

/// Bad sizes, ring sizes and durations are clap's own usage errors (exit 2,
/// naming the option) before anything starts.
#[test]
fn bad_values_are_usage_errors_naming_the_option() {
    for (args, option) in [
        (&["run", "--mem-limit", "12Q", "--", "true"][..], "--mem-limit"),
        (&["run", "--ring-mb", "3", "--", "true"][..], "--ring-mb"),
        (&["attach", "--pid", "1", "--duration", "5x"][..], "--duration"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ttrace")).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("invalid value") && stderr.contains(option), "{args:?}: {stderr}");
    }
}
