//! The shared objects a program will load, found the way ld.so would before
//! it runs: the DT_NEEDED closure with glibc's search order. Libraries the
//! program dlopens later (Python's `import llama_cpp`) are not in it; they
//! are found in the live process's maps (`hooks::mapped_files`).

use std::{
    collections::HashSet,
    ffi::{OsStr, OsString},
    os::unix::{
        ffi::{OsStrExt, OsStringExt},
        fs::{MetadataExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use super::{
    TargetError,
    elf::{DynInfo, ElfIdent, dyn_info},
    ldcache::LdCache,
};

/// ld.so's trusted directories on x86_64 (Debian multiarch first).
const DEFAULT_DIRS: [&str; 5] = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib", "/lib"];
/// Linux follows at most this many nested `#!` interpreters.
const MAX_INTERPRETERS: usize = 4;
/// glibc's search path when PATH is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The result of a closure walk.
#[derive(Debug, Clone, Default)]
pub struct Closure {
    /// Canonical paths: the program image first, then its libraries in
    /// ld.so's breadth-first load order, each file once.
    pub objects: Vec<PathBuf>,
    /// DT_NEEDED names no search found (ld.so would refuse to start).
    pub missing: Vec<NotFound>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    pub name: String,
    pub needed_by: PathBuf,
}

/// The program image, then the libraries it links. Missing libraries are
/// logged (the program will fail to start with ld.so's own message).
pub fn resolve_needed(exe: &Path, ld_library_path: Option<&OsStr>) -> Result<Vec<PathBuf>, TargetError> {
    let closure = resolve(exe, ld_library_path)?;
    for m in &closure.missing {
        log::warn!("{} needs {}, which ld.so will not find", m.needed_by.display(), m.name);
    }
    Ok(closure.objects)
}

/// One loaded object during the walk.
struct Obj {
    /// The path it was found at: `$ORIGIN` is its directory (not the symlink
    /// target, as in glibc).
    found_at: PathBuf,
    info: DynInfo,
    loader: Option<usize>,
    /// Names it answers to: the DT_NEEDED strings that found it, and its soname.
    names: Vec<Vec<u8>>,
}

/// The DT_NEEDED closure of `exe` (a `#!` script resolves to its interpreter).
pub fn resolve(exe: &Path, ld_library_path: Option<&OsStr>) -> Result<Closure, TargetError> {
    let image = program_image(exe)?;
    let ident = ElfIdent::read(&image)?.ok_or_else(|| TargetError::NotElf { path: image.clone() })?;
    let canonical = image.canonicalize().map_err(TargetError::io(&image))?;
    let info = dyn_info(&canonical)?;
    let mut seen = HashSet::new();
    seen.insert(file_key(&canonical).map_err(TargetError::io(&canonical))?);
    let mut objs = vec![Obj { found_at: canonical.clone(), names: Vec::new(), info, loader: None }];
    let mut closure = Closure { objects: vec![canonical], missing: Vec::new() };
    let exe_origin = origin_of(&objs[0].found_at);
    let env_dirs: Vec<PathBuf> =
        ld_library_path.map(|v| split_path(v.as_bytes(), |b| b == b':' || b == b';', &exe_origin)).unwrap_or_default();
    let mut cache = None;

    // Breadth first: objs grows while we walk it.
    let mut next = 0;
    while next < objs.len() {
        for name in objs[next].info.needed.clone() {
            if objs.iter().any(|o| o.names.contains(&name)) {
                continue;
            }
            let found = if name.contains(&b'/') {
                let path = PathBuf::from(OsString::from_vec(expand_origin(&name, &origin_of(&objs[next].found_at))));
                accepts(&ident, &path).then_some(path)
            } else {
                let cache = cache.get_or_insert_with(LdCache::system);
                find_library(&search_dirs(&objs, next, &env_dirs), cache, &name, &ident)
            };
            let Some(found_at) = found else {
                let needed_by = objs[next].found_at.clone();
                closure.missing.push(NotFound { name: String::from_utf8_lossy(&name).into_owned(), needed_by });
                continue;
            };
            let Ok(canonical) = found_at.canonicalize() else { continue };
            // ld.so recognises an already loaded file by device and inode.
            let Ok(key) = file_key(&canonical) else { continue };
            if !seen.insert(key) {
                if let Some(o) = objs.iter_mut().find(|o| file_key(&o.found_at).ok() == Some(key)) {
                    o.names.push(name);
                }
                continue;
            }
            let info = match dyn_info(&canonical) {
                Ok(info) => info,
                Err(e) => {
                    log::warn!("skipping {}: {e}", canonical.display());
                    continue;
                }
            };
            let mut names = vec![name];
            names.extend(info.soname.clone());
            objs.push(Obj { found_at, info, loader: Some(next), names });
            closure.objects.push(canonical);
        }
        next += 1;
    }
    Ok(closure)
}

/// A bare DT_NEEDED name: the search directories, the ld.so cache, then the
/// default directories. Files of another class or machine are passed over.
fn find_library(dirs: &[PathBuf], cache: &LdCache, name: &[u8], exe: &ElfIdent) -> Option<PathBuf> {
    let name = OsStr::from_bytes(name);
    let in_dirs = dirs.iter().map(|d| d.join(name));
    let in_cache = cache.lookup(name.as_bytes()).map(Path::to_path_buf);
    let in_defaults = DEFAULT_DIRS.iter().map(|d| Path::new(d).join(name));
    in_dirs.chain(in_cache).chain(in_defaults).find(|p| accepts(exe, p))
}

/// The directories searched for a bare name needed by `objs[at]`, before the
/// ld.so cache: DT_RPATH of the loader chain (only when the loader has no
/// DT_RUNPATH), LD_LIBRARY_PATH, then the loader's own DT_RUNPATH.
fn search_dirs(objs: &[Obj], at: usize, env_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let loader = &objs[at];
    let mut dirs = Vec::new();
    if loader.info.runpath.is_none() {
        // The chain ends at the executable, whose DT_RPATH glibc also tries.
        let mut l = Some(at);
        while let Some(i) = l {
            if let Some(rpath) = &objs[i].info.rpath {
                dirs.extend(split_path(rpath, |b| b == b':', &origin_of(&objs[i].found_at)));
            }
            l = objs[i].loader;
        }
    }
    dirs.extend(env_dirs.iter().cloned());
    if let Some(runpath) = &loader.info.runpath {
        dirs.extend(split_path(runpath, |b| b == b':', &origin_of(&loader.found_at)));
    }
    dirs
}

/// Splits a search path; an empty element means the current directory.
fn split_path(value: &[u8], sep: impl Fn(u8) -> bool, origin: &[u8]) -> Vec<PathBuf> {
    value
        .split(|&b| sep(b))
        .map(|dir| {
            if dir.is_empty() {
                PathBuf::from(".")
            } else {
                PathBuf::from(OsString::from_vec(expand_origin(dir, origin)))
            }
        })
        .collect()
}

/// Replaces `$ORIGIN` and `${ORIGIN}`. Other tokens (`$LIB`, `$PLATFORM`) are
/// left as they are, so such directories simply find nothing.
fn expand_origin(s: &[u8], origin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let token = if rest.starts_with(b"${ORIGIN}") {
            9
        } else if rest.starts_with(b"$ORIGIN") && !rest.get(7).is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_')
        {
            7
        } else {
            0
        };
        if token > 0 {
            out.extend_from_slice(origin);
            i += token;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

fn origin_of(path: &Path) -> Vec<u8> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = if dir.is_absolute() { dir.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(dir) };
    dir.into_os_string().into_vec()
}

/// Would ld.so load `path` into a process whose executable is `exe`?
fn accepts(exe: &ElfIdent, path: &Path) -> bool {
    path.is_file() && matches!(ElfIdent::read(path), Ok(Some(lib)) if exe.accepts_library(&lib))
}

fn file_key(path: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// The ELF file the kernel ends up running for `path`: `path` itself, or for a
/// `#!` script its interpreter (`#!/usr/bin/env NAME` resolves NAME in PATH).
/// A file that is neither is run by `execvp` through `/bin/sh`.
pub fn program_image(path: &Path) -> Result<PathBuf, TargetError> {
    let mut current = path.to_path_buf();
    for _ in 0..=MAX_INTERPRETERS {
        let head = read_head(&current)?;
        if ElfIdent::parse(&head).is_some() {
            return Ok(current);
        }
        current = match parse_shebang(&head) {
            Some((interp, arg)) => {
                let is_env = Path::new(OsStr::from_bytes(interp)).file_name() == Some(OsStr::new("env"));
                match arg.filter(|_| is_env) {
                    Some(arg) => which(&env_target(arg).ok_or_else(|| TargetError::NotElf { path: current.clone() })?)?,
                    None => PathBuf::from(OsStr::from_bytes(interp)),
                }
            }
            None => PathBuf::from("/bin/sh"),
        };
    }
    Err(TargetError::InterpreterLoop { path: path.to_path_buf(), max: MAX_INTERPRETERS })
}

fn read_head(path: &Path) -> Result<Vec<u8>, TargetError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(TargetError::io(path))?;
    let mut head = Vec::with_capacity(256);
    file.take(256).read_to_end(&mut head).map_err(TargetError::io(path))?;
    Ok(head)
}

/// `#!INTERP [ARG]`: the kernel passes everything after the interpreter,
/// trimmed, as one argument.
fn parse_shebang(head: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let line = line.trim_ascii();
    let (interp, arg) = match line.iter().position(|b| b.is_ascii_whitespace()) {
        Some(i) => (&line[..i], Some(line[i..].trim_ascii()).filter(|a| !a.is_empty())),
        None => (line, None),
    };
    (!interp.is_empty()).then_some((interp, arg))
}

/// The program `env ARG` runs: the first word that is not an option or
/// `NAME=VALUE` (covers `env -S python3 -u`).
fn env_target(arg: &[u8]) -> Option<OsString> {
    arg.split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .find(|w| !w.starts_with(b"-") && !w.contains(&b'='))
        .map(|w| OsStr::from_bytes(w).to_os_string())
}

/// `execvp`'s lookup of `program` in this process's PATH.
pub fn which(program: &OsStr) -> Result<PathBuf, TargetError> {
    which_in(program, std::env::var_os("PATH").as_deref())
}

/// `execvp`'s lookup: a name with a slash is used as is, otherwise the first
/// executable regular file in `path` (glibc's default when unset).
pub fn which_in(program: &OsStr, path: Option<&OsStr>) -> Result<PathBuf, TargetError> {
    let name = program.as_bytes();
    if name.contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    if !name.is_empty() {
        let path = path.map_or(DEFAULT_PATH.as_bytes(), OsStr::as_bytes);
        for dir in path.split(|&b| b == b':') {
            let dir = if dir.is_empty() { Path::new(".") } else { Path::new(OsStr::from_bytes(dir)) };
            let candidate = dir.join(program);
            if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
                return Ok(candidate);
            }
        }
    }
    Err(TargetError::NotInPath { program: program.to_string_lossy().into_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_expansion() {
        assert_eq!(expand_origin(b"$ORIGIN/../lib:${ORIGIN}", b"/a/b"), b"/a/b/../lib:/a/b");
        assert_eq!(expand_origin(b"$ORIGINAL", b"/x"), b"$ORIGINAL");
        assert_eq!(expand_origin(b"/usr/$LIB", b"/x"), b"/usr/$LIB");
    }

    #[test]
    fn search_path_split() {
        let dirs = split_path(b"/a::$ORIGIN/b", |b| b == b':', b"/o");
        assert_eq!(dirs, [PathBuf::from("/a"), PathBuf::from("."), PathBuf::from("/o/b")]);
    }

    #[test]
    fn shebangs() {
        assert_eq!(parse_shebang(b"#!/bin/sh\necho"), Some((&b"/bin/sh"[..], None)));
        assert_eq!(
            parse_shebang(b"#! /usr/bin/env  python3 -u \n"),
            Some((&b"/usr/bin/env"[..], Some(&b"python3 -u"[..])))
        );
        assert_eq!(parse_shebang(b"#!\n"), None);
        assert_eq!(parse_shebang(b"\x7fELF"), None);
        assert_eq!(env_target(b"-S A=1 python3 -u"), Some(OsString::from("python3")));
        assert_eq!(env_target(b"-i"), None);
    }

    #[test]
    fn which_finds_sh_and_reports_missing() {
        assert!(which_in(OsStr::new("sh"), Some(OsStr::new("/nonexistent:/bin:/usr/bin"))).is_ok());
        let err = which_in(OsStr::new("no-such-ttrace-cmd"), Some(OsStr::new("/bin"))).unwrap_err();
        assert_eq!(err.to_string(), "cannot find `no-such-ttrace-cmd` in PATH");
        assert_eq!(which_in(OsStr::new("./x"), None).unwrap(), PathBuf::from("./x"));
    }
}
