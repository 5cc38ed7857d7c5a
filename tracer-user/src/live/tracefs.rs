//! Locating (and, as root, mounting) tracefs, which tracepoint attachment and
//! the kernel's own tracers need. A freshly booted machine may not have it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

pub const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted at {TRACEFS} and mounting it failed ({0}); mount it with `mount -t tracefs nodev {TRACEFS}`"
    )]
    Mount(String),
    #[error("cannot read tracepoint format {path}: {error}; does this kernel have that tracepoint?")]
    Format { path: PathBuf, error: std::io::Error },
}

/// Make sure tracefs is mounted at [`TRACEFS`], mounting it if needed.
pub fn ensure_mounted() -> Result<&'static Path, TracefsError> {
    let root = Path::new(TRACEFS);
    if root.join("events").is_dir() {
        return Ok(root);
    }
    let out = Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS])
        .output()
        .map_err(|e| TracefsError::Mount(e.to_string()))?;
    // A concurrent mount (another test, another ttrace) makes ours fail with
    // "already mounted": what matters is that tracefs is there now.
    if !root.join("events").is_dir() {
        return Err(TracefsError::Mount(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(root)
}

/// Where a field sits in a tracepoint's record: byte offset and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub offset: usize,
    pub size: usize,
}

/// Offset of `field` in a tracepoint's record, from its `format` file.
pub fn field_offset(group: &str, event: &str, field: &str) -> Result<Option<usize>, TracefsError> {
    Ok(format(group, event)?.and_then(|text| parse_field(&text, field)).map(|f| f.offset))
}

/// A tracepoint's `format` file; `None` when the kernel has no such tracepoint.
pub fn format(group: &str, event: &str) -> Result<Option<String>, TracefsError> {
    let path = Path::new(TRACEFS).join("events").join(group).join(event).join("format");
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(TracefsError::Format { path, error }),
    }
}

/// Parse `field:unsigned long address;\toffset:8;\tsize:8;...` lines of a format file.
pub fn parse_field(format: &str, field: &str) -> Option<Field> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let name = decl.rsplit([' ', '*']).next()?.split('[').next()?;
        if name != field {
            return None;
        }
        let value = |key: &str| rest.split(';').find_map(|part| part.trim().strip_prefix(key)?.parse().ok());
        Some(Field { offset: value("offset:")?, size: value("size:")? })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_offsets_from_a_format_file() {
        let text = "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
                    \tfield:unsigned long address;\toffset:8;\tsize:8;\tsigned:0;\n\
                    \tfield:char rwbs[10];\toffset:34;\tsize:10;\tsigned:0;\n";
        assert_eq!(parse_field(text, "address"), Some(Field { offset: 8, size: 8 }));
        assert_eq!(parse_field(text, "rwbs"), Some(Field { offset: 34, size: 10 }));
        assert_eq!(parse_field(text, "missing"), None);
    }
}
