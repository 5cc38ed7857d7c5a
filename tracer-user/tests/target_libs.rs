//! Finding the hook libraries of a program before it runs, and reading facts
//! out of them, on the real llama.cpp build and on small cc-built fixtures
//! whose library choice is checked against the real ld.so.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

mod target_support;

use std::{
    collections::HashSet,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use target_support::{cc, llama, scratch};
use ttrace::live::target::{
    HookSource, OpNames, build_id, classify, has_symbols, mapped_files, missing_hooks, op_names, program_image,
    resolve, resolve_needed,
};

fn canon(p: PathBuf) -> PathBuf {
    p.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn llama_completion_closure_holds_the_build_libs() {
    let llama = llama();
    let objects = resolve_needed(&llama.completion, None).unwrap();
    assert_eq!(objects[0], canon(llama.completion.clone()), "the program image comes first");
    for lib in ["libggml-cpu.so.0", "libggml-base.so.0", "libllama.so.0", "libllama-completion-impl.so"] {
        let want = canon(llama.lib_dir.join(lib));
        assert!(objects.contains(&want), "{} not in {objects:#?}", want.display());
    }
    assert!(objects.iter().any(|p| p.to_string_lossy().contains("libc.so")), "{objects:#?}");
    assert_eq!(objects.iter().collect::<HashSet<_>>().len(), objects.len(), "duplicates in {objects:#?}");
    assert!(resolve(&llama.completion, None).unwrap().missing.is_empty());

    let hooks = classify(&objects);
    assert_eq!(hooks.cpu, Some(canon(llama.lib_dir.join("libggml-cpu.so.0"))));
    assert_eq!(hooks.base, Some(canon(llama.lib_dir.join("libggml-base.so.0"))));
    assert_eq!(hooks.llama, Some(canon(llama.lib_dir.join("libllama.so.0"))));
    assert!(missing_hooks(&hooks).is_empty());
    for symbol in ["ggml_compute_forward_rms_norm_mul_fused", "ggml_graph_compute"] {
        assert_eq!(hooks.path_of(symbol), hooks.cpu.as_deref(), "{symbol}");
    }
    for symbol in ["llama_decode", "llama_process", "llama_perf_context_reset"] {
        assert_eq!(hooks.path_of(symbol), hooks.llama.as_deref(), "{symbol}");
    }
    hooks.require(HookSource::Program(&llama.completion)).unwrap();
}

/// ld.so agrees: the libraries `ldd` lists are the closure (minus the vdso
/// and the interpreter, which ld.so maps itself).
#[test]
fn closure_matches_ldd() {
    let llama = llama();
    let out = Command::new("ldd").arg(&llama.completion).output().expect("ldd runs");
    let mut from_ldd: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" => ")?.1.split(" (").next().map(|p| canon(PathBuf::from(p.trim()))))
        .collect();
    let mut ours = resolve_needed(&llama.completion, None).unwrap();
    ours.remove(0);
    ours.retain(|p| !p.to_string_lossy().contains("ld-linux"));
    from_ldd.retain(|p| !p.to_string_lossy().contains("ld-linux"));
    ours.sort();
    from_ldd.sort();
    assert_eq!(ours, from_ldd);
}

#[test]
fn stripped_pip_libs_classify() {
    let llama = llama();
    let explicit = llama.pip_lib_dir.join("libggml-cpu.so.0");
    let mut paths = vec![explicit.clone()];
    paths.extend(std::fs::read_dir(&llama.pip_lib_dir).unwrap().map(|e| e.unwrap().path()));
    let hooks = classify(&paths);
    assert_eq!(hooks.cpu.as_deref(), Some(explicit.as_path()), "an explicit --lib given first wins");
    assert!(hooks.base.as_ref().is_some_and(|p| p.to_string_lossy().contains("libggml-base.so")));
    assert!(hooks.llama.as_ref().is_some_and(|p| p.to_string_lossy().contains("libllama.so")));
    assert!(missing_hooks(&hooks).is_empty());

    // libggml-base imports ggml_cpu_* nothing, and libggml-cpu only imports
    // ggml_op_name: an undefined symbol must not count.
    let cpu = llama.pip_lib_dir.join("libggml-cpu.so");
    assert_eq!(has_symbols(&cpu, &["ggml_cpu_extra_compute_forward", "ggml_op_name"]).unwrap(), [true, false]);
    let base = llama.pip_lib_dir.join("libggml-base.so");
    let err = classify(std::slice::from_ref(&base)).require(HookSource::Libs(std::slice::from_ref(&base))).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} has no symbol ggml_cpu_extra_compute_forward: not a ggml CPU backend (libggml-cpu.so) \
             (pass the right library with --lib PATH)",
            base.display()
        )
    );
}

fn check_op_table(names: &OpNames) {
    assert_eq!(names.ops[..3], ["NONE", "DUP", "ADD"]);
    for op in ["MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "RMS_NORM", "SOFT_MAX", "ROPE", "MUL", "UNARY", "GLU"] {
        assert_eq!(names.ops.iter().filter(|n| *n == op).count(), 1, "{op} in {:?}", names.ops);
    }
    assert!(names.ops.len() > 80, "only {} ops", names.ops.len());
    assert!(names.unary.iter().any(|n| n == "GELU") && names.unary.iter().any(|n| n == "SILU"), "{:?}", names.unary);
    assert!(names.glu.iter().any(|n| n == "SWIGLU"), "{:?}", names.glu);
    // No table ran into its neighbour.
    for unary in &names.unary {
        assert!(!names.ops.contains(unary) && !names.glu.contains(unary), "{unary} in two tables");
    }
    let mul_mat = names.op_id("MUL_MAT").unwrap();
    assert_eq!(names.op(mul_mat), "MUL_MAT");
    assert_eq!(names.op(names.ops.len() as i32), format!("op#{}", names.ops.len()));
}

#[test]
fn op_names_agree_between_stripped_and_unstripped() {
    let llama = llama();
    let unstripped = op_names(&llama.lib_dir.join("libggml-base.so.0")).unwrap();
    let stripped = op_names(&llama.pip_lib_dir.join("libggml-base.so.0")).unwrap();
    check_op_table(&unstripped);
    assert_eq!(stripped, unstripped);
    let ids: Vec<_> = ["ADD", "MUL", "MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "RMS_NORM"]
        .iter()
        .map(|n| format!("{n}={}", unstripped.op_id(n).unwrap()))
        .collect();
    eprintln!(
        "ops {}, unary {}, glu {}; {}",
        unstripped.ops.len(),
        unstripped.unary.len(),
        unstripped.glu.len(),
        ids.join(" ")
    );
}

#[test]
fn build_ids() {
    let llama = llama();
    let id = build_id(&llama.lib_dir.join("libggml-cpu.so.0")).expect("the build has a build id");
    assert_eq!(id.len(), 40);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(build_id(Path::new("/etc/hostname")), None);
}

/// The Python client dlopens its libs at import: found through the maps.
#[test]
fn python_client_libs_found_in_maps() {
    let llama = llama();
    let python = &llama.venv_python;
    let mut child = Command::new(python)
        .args(["-c", "import sys, llama_cpp; print('ready', flush=True); sys.stdin.read()"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = child.id();
    let before = classify(&resolve_needed(python, None).unwrap());
    let files = mapped_files(pid).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();

    assert_eq!(before.cpu, None, "python itself links no ggml");
    let hooks = classify(&files);
    let cpu = hooks.cpu.as_ref().expect("libggml-cpu mapped after import");
    assert!(cpu.starts_with(&llama.pip_lib_dir), "{}", cpu.display());
    assert!(missing_hooks(&hooks).is_empty());
    let names = op_names(hooks.base.as_ref().unwrap()).unwrap();
    check_op_table(&names);
}

#[test]
fn scripts_resolve_to_their_interpreter() {
    let dir = scratch("scripts");
    let sh = dir.join("a.sh");
    std::fs::write(&sh, "#!/bin/sh\necho hi\n").unwrap();
    let env = dir.join("b.sh");
    std::fs::write(&env, "#!/usr/bin/env -S sh -e\necho hi\n").unwrap();
    let plain = dir.join("c");
    std::fs::write(&plain, "echo hi\n").unwrap();
    let bin_sh = canon("/bin/sh".into());
    for script in [&sh, &env, &plain] {
        assert_eq!(canon(program_image(script).unwrap()), bin_sh, "{}", script.display());
        assert_eq!(resolve_needed(script, None).unwrap()[0], bin_sh);
    }
    let looping = dir.join("d");
    std::fs::write(&looping, format!("#!{}\n", looping.display())).unwrap();
    assert!(program_image(&looping).unwrap_err().to_string().contains("nested `#!` interpreters"));
    let _ = std::fs::remove_dir_all(dir);
}

/// A library `libx.so` in two directories, which prints which one ld.so
/// picked; `resolve` must pick the same under each search rule.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = scratch("ldso");
        for sub in ["a", "b", "mid", "bin"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("x.c"), "int x(void) { return WHICH; }\n").unwrap();
        std::fs::write(dir.join("mid.c"), "int x(void); int mid(void) { return x(); }\n").unwrap();
        std::fs::write(
            dir.join("main.c"),
            "#include <stdio.h>\nint mid(void); int main(void) { printf(\"%d\\n\", mid()); return 0; }\n",
        )
        .unwrap();
        for (sub, which) in [("a", "1"), ("b", "2")] {
            let def = format!("-DWHICH={which}");
            let out = format!("{sub}/libx.so");
            cc(&["-shared", "-fPIC", &def, "-Wl,-soname,libx.so", "-o", &out, "x.c"], &dir);
        }
        Self { dir }
    }

    /// libmid.so needing libx.so (with `mid_flags` for its search path), and
    /// bin/main needing libmid.so (with `main_flags`).
    fn build(&self, mid_flags: &[&str], main_flags: &[&str]) -> PathBuf {
        let mut args = vec!["-shared", "-fPIC", "-o", "mid/libmid.so", "mid.c", "-La", "-lx"];
        args.extend(mid_flags);
        cc(&args, &self.dir);
        let mut args = vec!["-o", "bin/main", "main.c", "-Lmid", "-lmid"];
        args.extend(main_flags);
        cc(&args, &self.dir);
        self.dir.join("bin/main")
    }

    /// Which libx.so ld.so loads, by running the program, and which one
    /// `resolve` predicts.
    fn check(&self, exe: &Path, ld_library_path: Option<&str>) -> char {
        let mut run = Command::new(exe);
        run.env_remove("LD_LIBRARY_PATH");
        if let Some(v) = ld_library_path {
            run.env("LD_LIBRARY_PATH", v);
        }
        let out = run.output().unwrap();
        assert!(out.status.success(), "{}: {}", exe.display(), String::from_utf8_lossy(&out.stderr));
        let ldso = match String::from_utf8_lossy(&out.stdout).trim() {
            "1" => 'a',
            "2" => 'b',
            other => panic!("unexpected output {other:?}"),
        };
        let objects = resolve_needed(exe, ld_library_path.map(OsStr::new)).unwrap();
        let libx: Vec<_> = objects.iter().filter(|p| p.ends_with("libx.so")).collect();
        assert_eq!(libx.len(), 1, "{objects:#?}");
        assert_eq!(*libx[0], canon(self.dir.join(format!("{ldso}/libx.so"))), "ld.so loaded {ldso}/libx.so");
        ldso
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn search_order_matches_ld_so() {
    let f = Fixture::new();
    let old = "-Wl,--disable-new-dtags";
    let new = "-Wl,--enable-new-dtags";

    // DT_RPATH of the executable applies to its dependencies' lookups too,
    // when they have no RUNPATH, and beats LD_LIBRARY_PATH.
    let exe = f.build(&[], &[old, "-Wl,-rpath,$ORIGIN/../mid:$ORIGIN/../a"]);
    assert_eq!(f.check(&exe, None), 'a');
    assert_eq!(f.check(&exe, Some(&format!("{}/b", f.dir.display()))), 'a');

    // A RUNPATH in libmid disables all RPATHs for its lookups.
    let exe = f.build(&[new, "-Wl,-rpath,$ORIGIN/../b"], &[old, "-Wl,-rpath,$ORIGIN/../mid:$ORIGIN/../a"]);
    assert_eq!(f.check(&exe, None), 'b');
    // ... and LD_LIBRARY_PATH comes before RUNPATH.
    assert_eq!(f.check(&exe, Some(&format!("/nonexistent::{}/a", f.dir.display()))), 'a');

    // RUNPATH is not transitive: the executable's RUNPATH does not serve libmid.
    let exe = f.build(&[new, "-Wl,-rpath,${ORIGIN}/../b"], &[new, "-Wl,-rpath,$ORIGIN/../mid:$ORIGIN/../a"]);
    assert_eq!(f.check(&exe, None), 'b');

    // DT_RPATH of libmid itself (old-style tags).
    let exe = f.build(&[old, "-Wl,-rpath,$ORIGIN/../b"], &[new, "-Wl,-rpath,$ORIGIN/../mid"]);
    assert_eq!(f.check(&exe, None), 'b');

    // A library of another machine is passed over, as ld.so does.
    let mut foreign = std::fs::read(f.dir.join("a/libx.so")).unwrap();
    foreign[18..20].copy_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
    std::fs::write(f.dir.join("mid/libx.so"), foreign).unwrap();
    let exe = f.build(&[], &[old, "-Wl,-rpath,$ORIGIN/../mid:$ORIGIN/../b"]);
    assert_eq!(f.check(&exe, None), 'b');

    // Not found anywhere: reported, not fatal.
    std::fs::remove_file(f.dir.join("b/libx.so")).unwrap();
    let closure = resolve(&exe, None).unwrap();
    assert_eq!(closure.missing.len(), 1, "{:?}", closure.missing);
    assert_eq!(closure.missing[0].name, "libx.so");
    assert!(closure.missing[0].needed_by.ends_with("mid/libmid.so"));
}

const OP_TABLES_C: &str = r#"
#ifdef EXPORT
#define TABLE
#else
#define TABLE static
#endif
TABLE const char * GGML_GLU_OP_NAME[] = {"REGLU", "SWIGLU"};
TABLE const char * GGML_UNARY_OP_NAME[] = {"ABS", "GELU", "SILU"};
TABLE const char * GGML_OP_SYMBOL[] = {"none", "x", "x+y", "X*Y"};
TABLE const char * GGML_OP_NAME[] = {"NONE", "DUP", "ADD", "MUL_MAT"};
const char * ggml_op_name(int op) { return GGML_OP_NAME[op]; }
const char * ggml_op_symbol(int op) { return GGML_OP_SYMBOL[op]; }
const char * ggml_unary_op_name(int op) { return GGML_UNARY_OP_NAME[op]; }
const char * ggml_glu_op_name(int op) { return GGML_GLU_OP_NAME[op]; }
#ifdef MAIN
int main(void) { return 0; }
#endif
"#;

/// The table decoder on other code shapes: -O0, a table reached through the
/// GOT, a non-PIE executable with absolute addresses, each also stripped.
#[test]
fn op_tables_of_other_code_shapes() {
    let dir = scratch("optables");
    std::fs::write(dir.join("ops.c"), OP_TABLES_C).unwrap();
    let want = OpNames {
        ops: ["NONE", "DUP", "ADD", "MUL_MAT"].map(String::from).to_vec(),
        unary: ["ABS", "GELU", "SILU"].map(String::from).to_vec(),
        glu: ["REGLU", "SWIGLU"].map(String::from).to_vec(),
    };
    let variants: [(&str, &[&str]); 4] = [
        ("o2.so", &["-O2", "-shared", "-fPIC"]),
        ("o0.so", &["-O0", "-shared", "-fPIC"]),
        ("got.so", &["-O2", "-shared", "-fPIC", "-DEXPORT"]),
        ("nopie", &["-O2", "-fno-pic", "-no-pie", "-DMAIN"]),
    ];
    for (out, flags) in variants {
        let mut args = flags.to_vec();
        args.extend(["-o", out, "ops.c"]);
        cc(&args, &dir);
        let path = dir.join(out);
        assert_eq!(op_names(&path).unwrap(), want, "{out}");
        let stripped = dir.join(format!("{out}.stripped"));
        let status = Command::new("strip").arg("-o").arg(&stripped).arg(&path).status().expect("strip runs");
        assert!(status.success());
        if out == "nopie" {
            // A stripped non-PIE executable has no symbols left to start from.
            assert!(op_names(&stripped).unwrap_err().to_string().contains("ggml_op_name"));
        } else {
            assert_eq!(op_names(&stripped).unwrap(), want, "{out} stripped");
        }
    }
    let err = op_names(Path::new("/etc/hostname")).unwrap_err();
    assert_eq!(err.to_string(), "/etc/hostname is not an ELF file");
    let _ = std::fs::remove_dir_all(dir);
}
