//! Which file provides which hook symbol, among a program's libraries or a
//! live process's mapped files.

use std::{
    collections::{BTreeMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{TargetError, elf::ElfIdent, elf::has_symbols};

pub const CPU_HOOKS: [&str; 5] = [
    "ggml_cpu_extra_compute_forward",
    "ggml_compute_forward_rms_norm_mul_fused",
    "ggml_graph_compute",
    "ggml_compute_forward_argsort",
    // MoE routing where argsort has no symbol (a local one, in .symtab).
    "ggml_compute_forward_mul_mat_id",
];
pub const BASE_HOOKS: [&str; 7] = [
    "ggml_backend_sched_graph_compute_async",
    "ggml_op_name",
    "ggml_unary_op_name",
    "ggml_glu_op_name",
    BUFFER_INIT,
    super::version::SET_USAGE,
    BUFFER_FREE,
];
/// Backend buffers: the only constructor, and the end of every buffer.
pub const BUFFER_INIT: &str = "ggml_backend_buffer_init";
pub const BUFFER_FREE: &str = "ggml_backend_buffer_free";
pub const LLAMA_HOOKS: [&str; 6] =
    ["llama_decode", "llama_process", "llama_perf_context_reset", PROCESS_UBATCH, OUTPUT_RESERVE, SEQ_RM_CHECK];
/// `common_context_can_seq_rm(llama_context *)`, in llama.cpp's common code
/// (libllama-common, or linked into the program): llama-server's start-up
/// check that decodes two tokens and clears them.
pub const SEQ_RM_CHECK: &str = "_Z25common_context_can_seq_rmP13llama_context";
/// The dynamic loader's function for debuggers, called around every change
/// to the loaded libraries: where `run` holds a target that may dlopen ggml.
pub const LOADER_HOOK: &str = "_dl_debug_state";
/// `llama_context::output_reserve(int)`: the buffer it creates holds the
/// logits (ggml leaves its usage ANY, like the KV cache's).
pub const OUTPUT_RESERVE: &str = "_ZN13llama_context14output_reserveEi";
/// `llama_context::process_ubatch(const llama_ubatch &, llm_graph_type,
/// llama_memory_context_i *, ggml_status &)`, exported from libllama: each
/// ubatch's sequence ids and positions (`tracer-ebpf/src/batch.rs`). Another
/// signature is another symbol; then tokens are counted without them.
pub const PROCESS_UBATCH: &str =
    "_ZN13llama_context14process_ubatchERK12llama_ubatch14llm_graph_typeP22llama_memory_context_iR11ggml_status";
/// whisper.cpp's encode and decode steps (static functions, so found in
/// .symtab of an unstripped libwhisper; the names hold whisper.cpp 1.8's
/// signatures): which of its graphs is the encoder's and which the decoder's.
pub const WHISPER_ENCODE: &str = "_ZL23whisper_encode_internalR15whisper_contextR13whisper_stateiiPFbPvES3_";
pub const WHISPER_DECODE: &str =
    "_ZL23whisper_decode_internalR15whisper_contextR13whisper_stateRK13whisper_batchibPFbPvES6_";
/// Exported: the model file whisper.cpp reads (`markers::WHISPER_INIT`).
pub const WHISPER_INIT: &str = "whisper_init_from_file_with_params_no_state";
pub const WHISPER_HOOKS: [&str; 3] = [WHISPER_ENCODE, WHISPER_DECODE, WHISPER_INIT];
/// What a build says about itself (`target::version`): ggml's version and
/// commit functions, and the build info llama.cpp's common code links in.
pub const VERSION_SYMBOLS: [&str; 4] = ["ggml_version", "ggml_commit", "LLAMA_COMMIT", "LLAMA_BUILD_NUMBER"];
/// Without these ttrace records nothing useful.
pub const REQUIRED_HOOKS: [&str; 3] =
    ["ggml_cpu_extra_compute_forward", "ggml_backend_sched_graph_compute_async", "ggml_op_name"];

/// The file each hook comes from. The first path given that defines a symbol
/// wins, so an explicit `--lib` goes first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookLibs {
    /// Defines ggml_cpu_extra_compute_forward (libggml-cpu).
    pub cpu: Option<PathBuf>,
    /// Defines ggml_backend_sched_graph_compute_async or ggml_op_name (libggml-base).
    pub base: Option<PathBuf>,
    /// Defines llama_decode or llama_process (libllama).
    pub llama: Option<PathBuf>,
    /// Defines whisper.cpp's encode and decode steps (libwhisper).
    pub whisper: Option<PathBuf>,
    /// Every known hook symbol found, with its file.
    pub symbols: BTreeMap<&'static str, PathBuf>,
}

impl HookLibs {
    pub fn path_of(&self, symbol: &str) -> Option<&Path> {
        self.symbols.get(symbol).map(PathBuf::as_path)
    }

    /// Turns missing hooks into the error that says where we looked and why
    /// it matters.
    pub fn require(&self, source: HookSource<'_>) -> Result<(), TargetError> {
        let missing = missing_hooks(self);
        let Some(&symbol) = missing.first() else { return Ok(()) };
        let role = role_of(symbol);
        if self.cpu.is_none() && self.base.is_none() {
            return Err(match source {
                HookSource::Pid(pid) => TargetError::NoGgmlInPid { pid },
                HookSource::Program(exe) => TargetError::NoGgmlInProgram { exe: exe.to_path_buf() },
                HookSource::Libs([lib]) => TargetError::NotHookLib { lib: lib.clone(), symbol, role },
                HookSource::Libs(libs) => TargetError::MissingHook { symbol, role, searched: list(libs) },
            });
        }
        Err(match source {
            HookSource::Libs([lib]) => TargetError::NotHookLib { lib: lib.clone(), symbol, role },
            HookSource::Libs(libs) => TargetError::MissingHook { symbol, role, searched: list(libs) },
            HookSource::Pid(pid) => {
                TargetError::MissingHook { symbol, role, searched: format!("pid {pid}'s mapped files") }
            }
            HookSource::Program(exe) => {
                TargetError::MissingHook { symbol, role, searched: format!("{} and its libraries", exe.display()) }
            }
        })
    }
}

/// Where the paths given to `classify` came from, for error messages.
#[derive(Debug, Clone, Copy)]
pub enum HookSource<'a> {
    Pid(u32),
    Program(&'a Path),
    /// Explicit `--lib` paths.
    Libs(&'a [PathBuf]),
}

fn role_of(symbol: &str) -> &'static str {
    if CPU_HOOKS.contains(&symbol) {
        "a ggml CPU backend (libggml-cpu.so)"
    } else if BASE_HOOKS.contains(&symbol) {
        "ggml's core library (libggml-base.so)"
    } else if WHISPER_HOOKS.contains(&symbol) {
        "whisper.cpp's library (libwhisper.so)"
    } else {
        "llama.cpp's library (libllama.so)"
    }
}

fn list(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The required hooks `libs` lacks.
pub fn missing_hooks(libs: &HookLibs) -> Vec<&'static str> {
    REQUIRED_HOOKS.into_iter().filter(|s| !libs.symbols.contains_key(s)).collect()
}

/// Reads each ELF file among `paths` once (by device and inode) and records
/// which hook symbols it defines. Unreadable and non-ELF files are skipped.
pub fn classify(paths: &[PathBuf]) -> HookLibs {
    // The layout tables' fingerprints too: one symbol pass per file.
    let mut all: Vec<&'static str> =
        CPU_HOOKS.into_iter().chain(BASE_HOOKS).chain(LLAMA_HOOKS).chain(WHISPER_HOOKS).collect();
    all.extend(VERSION_SYMBOLS.into_iter().chain(tracer_common::layout::known::fingerprint_symbols()));
    all.sort_unstable();
    all.dedup();
    let mut seen = HashSet::new();
    let mut libs = HookLibs::default();
    for path in paths {
        let Ok(meta) = std::fs::metadata(path) else {
            log::debug!("classify: cannot stat {}", path.display());
            continue;
        };
        if !meta.is_file() || !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        if !matches!(ElfIdent::read(path), Ok(Some(ident)) if ident.class64 && ident.little_endian) {
            continue;
        }
        let found = match has_symbols(path, &all) {
            Ok(found) => found,
            Err(e) => {
                log::debug!("classify: {e}");
                continue;
            }
        };
        for (&symbol, _) in all.iter().zip(found).filter(|(_, f)| *f) {
            libs.symbols.entry(symbol).or_insert_with(|| path.clone());
        }
    }
    let first = |names: &[&str]| names.iter().find_map(|n| libs.symbols.get(n).cloned());
    libs.cpu = first(&["ggml_cpu_extra_compute_forward"]);
    libs.base = first(&["ggml_backend_sched_graph_compute_async", "ggml_op_name"]);
    libs.llama = first(&["llama_decode", "llama_process"]);
    libs.whisper = first(&WHISPER_HOOKS);
    libs
}

/// Whether `pid` still runs: neither gone nor a zombie (whose maps and
/// probes are gone though its pid stays until it is reaped).
pub fn running(pid: u32) -> bool {
    !matches!(super::process_state(pid), None | Some('Z' | 'X' | 'x'))
}

/// Distinct file-backed paths mapped by `pid`, in address order. Deleted
/// files and pseudo files (`[heap]`, `/memfd:`) are skipped. When the process
/// lives in another mount namespace, paths are given through
/// `/proc/PID/root` so that they open the same files from here.
pub fn mapped_files(pid: u32) -> Result<Vec<PathBuf>, TargetError> {
    let maps = format!("/proc/{pid}/maps");
    let text = std::fs::read(&maps).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => TargetError::NoSuchPid { pid },
        std::io::ErrorKind::PermissionDenied => TargetError::PidAccess { pid, source },
        _ => TargetError::Io { path: maps.clone().into(), source },
    })?;
    // A process that exited between the open and the read shows an empty map.
    if text.is_empty() && !Path::new(&format!("/proc/{pid}/exe")).exists() {
        return Err(TargetError::NoSuchPid { pid });
    }
    let vmas = crate::model::maps::parse_maps(&text).map_err(|source| TargetError::Maps { pid, source })?;
    let root = other_mount_namespace(pid).then(|| PathBuf::from(format!("/proc/{pid}/root")));
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for vma in vmas {
        let path = vma.path.as_path();
        if vma.deleted || !vma.is_file() || !path.is_absolute() || path.starts_with("/memfd:") {
            continue;
        }
        if seen.insert(path.to_path_buf()) {
            out.push(match &root {
                Some(root) => through_root(root, &vma),
                None => path.to_path_buf(),
            });
        }
    }
    Ok(out)
}

/// A path of another mount namespace's file that opens it from here. The
/// kernel prints a mapping's path from that namespace's root, or, for a
/// process that is also chroot'ed (`unshare --mount chroot ROOT`), from
/// the top of its mounts, ROOT included: so the path through
/// `/proc/PID/root` is taken if it is the mapped file (its inode), else the
/// path as printed if that is, else `/proc/PID/map_files/START-END`, which
/// opens the mapped file itself.
fn through_root(root: &Path, vma: &crate::model::maps::Vma) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let path = vma.path.as_path();
    let is_mapped = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.ino() == vma.inode);
    let joined = root.join(path.strip_prefix("/").unwrap_or(path));
    if is_mapped(&joined) {
        return joined;
    }
    if is_mapped(path) {
        return path.to_path_buf();
    }
    let pid_dir = root.parent().unwrap_or(root);
    pid_dir.join(format!("map_files/{:x}-{:x}", vma.start, vma.end))
}

fn other_mount_namespace(pid: u32) -> bool {
    let ns = |p: String| std::fs::read_link(p).ok();
    match (ns("/proc/self/ns/mnt".into()), ns(format!("/proc/{pid}/ns/mnt"))) {
        (Some(mine), Some(theirs)) => mine != theirs,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_maps_hold_own_exe_and_libc() {
        let files = mapped_files(std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(files.contains(&exe), "{files:?}");
        assert!(files.iter().any(|p| p.to_string_lossy().contains("libc.so")), "{files:?}");
        let unique: HashSet<_> = files.iter().collect();
        assert_eq!(unique.len(), files.len());
    }

    #[test]
    fn no_such_pid() {
        let err = mapped_files(u32::MAX - 1).unwrap_err();
        assert!(matches!(err, TargetError::NoSuchPid { .. }), "{err}");
    }

    #[test]
    fn nothing_hookable_in_plain_files() {
        let libs = classify(&["/proc/self/exe".into(), "/etc/hostname".into(), "/nonexistent".into()]);
        assert_eq!(libs, HookLibs::default());
        assert_eq!(missing_hooks(&libs), REQUIRED_HOOKS);
        let err = libs.require(HookSource::Pid(42)).unwrap_err();
        assert!(err.to_string().starts_with("pid 42 has no ggml library loaded"), "{err}");
        let lib = [PathBuf::from("/usr/lib/libfoo.so")];
        let err = libs.require(HookSource::Libs(&lib)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/usr/lib/libfoo.so has no symbol ggml_cpu_extra_compute_forward: not a ggml CPU backend"),
            "{err}"
        );
    }
}
