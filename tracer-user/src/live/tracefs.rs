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

/// Offset of `field` in a tracepoint's record, from its `format` file.
pub fn field_offset(group: &str, event: &str, field: &str) -> Result<Option<usize>, TracefsError> {
    let path = Path::new(TRACEFS).join("events").join(group).join(event).join("format");
    let text = fs::read_to_string(&path).map_err(|error| TracefsError::Format { path, error })?;
    Ok(parse_field_offset(&text, field))
}

/// Parse `field:unsigned long address;\toffset:8;...` lines of a format file.
pub fn parse_field_offset(format: &str, field: &str) -> Option<usize> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let name = decl.rsplit([' ', '*']).next()?.split('[').next()?;
        if name != field {
            return None;
        }
        rest.trim().strip_prefix("offset:")?.split(';').next()?.parse().ok()
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
        assert_eq!(parse_field_offset(text, "address"), Some(8));
        assert_eq!(parse_field_offset(text, "rwbs"), Some(34));
        assert_eq!(parse_field_offset(text, "missing"), None);
    }
}
