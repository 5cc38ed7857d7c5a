//! Address resolution against a live process that maps GGUF files the way
//! llama.cpp does, and against maps text for split and multi-file models.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use ttrace::model::{
    AddressSpace, GgmlType, GgufHeader, MemoryClass, ModelMap, Resolution, TensorHit, Value,
    gguf::Array,
    gguf_write::{GgufWriter, fill_byte},
};

const HELPER_ENV: &str = "TTRACE_GGUF_LIVE_HELPER";

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap()
}

/// A model whose header spans a few pages, so that llama.cpp-style head
/// munmapping removes whole pages.
fn write_model(path: &Path, layers: u32) {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(layers))
        .kv("llama.expert_count", Value::U32(4))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.5; 3000])));
    w.tensor("token_embd.weight", ty("F32"), &[1024, 4]);
    for l in 0..layers {
        w.tensor(&format!("blk.{l}.attn_q.weight"), ty("Q8_0"), &[64, 64])
            .tensor(&format!("blk.{l}.ffn_up_exps.weight"), ty("Q4_K"), &[256, 16, 4])
            .tensor(&format!("blk.{l}.ffn_norm.weight"), ty("F32"), &[64]);
    }
    w.tensor("output.weight", ty("F16"), &[512, 8]);
    std::fs::write(path, w.to_bytes().unwrap()).unwrap();
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ttrace gguf {tag} {}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// Run as a child process (HELPER_ENV set): maps each listed file like
/// llama.cpp (whole file, PROT_READ, MAP_SHARED, then munmap of the head
/// pages before the first tensor), prints tensor addresses, and waits for
/// stdin to close. A no-op in a normal test run.
#[test]
fn live_helper() {
    let Ok(list) = std::env::var(HELPER_ENV) else { return };
    let page = page_size();
    let mut out = std::io::stdout().lock();
    for (f, path) in list.lines().enumerate() {
        let header = GgufHeader::from_bytes(&std::fs::read(path).unwrap()).unwrap();
        let file = std::fs::File::open(path).unwrap();
        let size = header.file_size as usize;
        // SAFETY: a fresh read-only shared mapping of a file we opened.
        let base = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as u64;
        let first = header.tensors.iter().map(|t| t.file_offset).min().unwrap();
        let head = first / page * page;
        assert!(head > 0, "the fixture's header should span a page");
        // SAFETY: unmapping the head pages of our own mapping, which nothing references.
        assert_eq!(unsafe { libc::munmap(base as *mut libc::c_void, head as usize) }, 0);
        writeln!(out, "MAP {f} {base:x} {head:x}").unwrap();
        for (i, t) in header.tensors.iter().enumerate() {
            let (start, last) = (base + t.file_offset, base + t.file_offset + t.size_bytes - 1);
            // SAFETY: both addresses are inside the still-mapped part of the file.
            let bytes = unsafe { [*(start as *const u8), *(last as *const u8)] };
            assert_eq!(bytes, [fill_byte(i); 2], "{}", t.name);
            writeln!(out, "T {f} {} {start:x} {last:x}", t.name).unwrap();
        }
    }
    // Large enough that malloc serves it from an anonymous mapping.
    let anon = vec![1u8; 4 << 20];
    writeln!(out, "ANON {:x}", anon.as_ptr() as u64).unwrap();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    drop(out);
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    assert_eq!(anon[0], 1);
}

#[test]
fn live_process_addresses_resolve_to_tensors() {
    let dir = tmp_dir("live");
    let (a, b) = (dir.join("model a.gguf"), dir.join("b.gguf"));
    write_model(&a, 2);
    write_model(&b, 1);
    let models = [ModelMap::open(&a).unwrap(), ModelMap::open(&b).unwrap()];

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["live_helper", "--exact", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, format!("{}\n{}", a.display(), b.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in stdout.by_ref() {
        let line = line.unwrap();
        if line == "READY" {
            break;
        }
        lines.push(line);
    }
    // The second model is deleted while mapped: maps shows "(deleted)".
    std::fs::remove_file(&b).unwrap();
    let space = AddressSpace::from_pid(child.id(), &models).unwrap();

    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    let (mut tensors_seen, mut anon_seen) = (0, false);
    for line in &lines {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "MAP" => {
                let (base, head) = (hex(f[2]), hex(f[3]));
                // The freed head may be reused by the allocator, but never as the model.
                for addr in [base, base + head - 1] {
                    assert_ne!(space.resolve(addr).class(), MemoryClass::ModelFile, "head of file {}", f[1]);
                }
                assert_eq!(space.resolve(base + head).class(), MemoryClass::ModelFile);
            }
            "T" => {
                let m: u32 = f[1].parse().unwrap();
                let (name, start, last) = (f[2], hex(f[3]), hex(f[4]));
                let (idx, t) = models[m as usize].by_name(name).unwrap();
                let expect = |offset_in_tensor: u64, expert| Resolution::ModelFile {
                    model: m,
                    file: 0,
                    file_offset: t.file_offset + offset_in_tensor,
                    tensor: Some(TensorHit { tensor: idx, offset_in_tensor, expert }),
                };
                let last_expert = t.n_experts.map(|n| n - 1);
                assert_eq!(space.resolve(start), expect(0, t.n_experts.map(|_| 0)), "{name}");
                assert_eq!(space.resolve(last), expect(t.size_bytes - 1, last_expert), "{name}");
                if let Some(eb) = t.expert_bytes {
                    assert_eq!(space.resolve(start + eb), expect(eb, Some(1)), "{name}");
                }
                let r = space.tensor_for(start + 1, "ignored").unwrap();
                assert!(!r.copy && r.tensor == idx && r.model == m && r.offset_in_tensor == Some(1));
                tensors_seen += 1;
            }
            "ANON" => {
                let addr = hex(f[1]);
                assert_eq!(space.resolve(addr).class(), MemoryClass::Anon);
                // A weight copied to the heap resolves by name, marked as a copy.
                let r = space.tensor_for(addr, "blk.0.attn_q.weight").unwrap();
                assert!(r.copy && r.model == 0 && r.offset_in_tensor.is_none());
                assert_eq!(space.tensor_for(addr, "no.such.tensor"), None);
                anon_seen = true;
            }
            _ => {}
        }
    }
    drop(child.stdin.take());
    stdout.for_each(drop);
    assert!(child.wait().unwrap().success());
    assert_eq!(tensors_seen, models[0].tensors().len() + models[1].tensors().len());
    assert!(anon_seen);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Three shards written like gguf-split: `split.*` keys and one file per tensor group.
fn write_split(dir: &Path) -> Vec<PathBuf> {
    let groups: [&[&str]; 3] =
        [&["token_embd.weight", "blk.0.attn_q.weight"], &["blk.1.attn_q.weight"], &["output.weight"]];
    groups
        .iter()
        .enumerate()
        .map(|(i, names)| {
            let mut w = GgufWriter::new();
            w.kv("general.architecture", Value::String("llama".into()))
                .kv("split.no", Value::U16(i as u16))
                .kv("split.count", Value::U16(3))
                .kv("split.tensors.count", Value::I32(4));
            for n in *names {
                w.tensor(n, ty("Q8_0"), &[64, 64]);
            }
            let p = dir.join(format!("m s-{:05}-of-00003.gguf", i + 1));
            std::fs::write(&p, w.to_bytes().unwrap()).unwrap();
            p
        })
        .collect()
}

#[test]
fn split_model_resolves_per_file() {
    let dir = tmp_dir("split");
    let paths = write_split(&dir);
    // Any shard opens all three.
    let model = ModelMap::open(&paths[1]).unwrap();
    assert_eq!(model.files().len(), 3);
    assert_eq!(model.tensors().len(), 4);
    let (i, t) = model.by_name("blk.1.attn_q.weight").unwrap();
    assert_eq!(t.file, 1);
    assert_eq!(model.tensor_at(1, t.file_offset + 5), Some((i, 5)));

    // Maps text, by path (with spaces): shard 0 lost its head page, shard 1 is
    // split into two VMAs, shard 2 is whole.
    let base = |f: u32| 0x7f00_0000_0000u64 + (u64::from(f) << 24);
    let mut maps = String::new();
    let mut line = |start: u64, end: u64, pgoff: u64, p: &Path| {
        maps += &format!("{start:x}-{end:x} r--s {pgoff:08x} 00:00 0    {}\n", p.display());
    };
    line(base(0) + 0x1000, base(0) + 0x10_0000, 0x1000, &paths[0]);
    line(base(1), base(1) + 0x1000, 0, &paths[1]);
    line(base(1) + 0x1000, base(1) + 0x10_0000, 0x1000, &paths[1]);
    line(base(2), base(2) + 0x10_0000, 0, &paths[2]);
    maps += "7ffff0000000-7ffff0100000 rw-p 00000000 00:00 0 [heap]\n";
    maps += "7ffff0200000-7ffff0300000 r--p 00000000 fe:00 99 /usr/lib/libc.so.6\n";
    let space = AddressSpace::from_maps_text(maps.as_bytes(), std::slice::from_ref(&model)).unwrap();
    for (idx, t) in model.tensors().iter().enumerate() {
        for off in [0, 7, 0x1000 - t.file_offset % 0x1000, t.size_bytes - 1] {
            let addr = base(t.file) + t.file_offset + off;
            if t.file == 0 && t.file_offset + off < 0x1000 {
                assert_eq!(space.resolve(addr), Resolution::Unmapped, "{} in the unmapped head", t.name);
                continue;
            }
            let want = TensorHit { tensor: idx as u32, offset_in_tensor: off, expert: None };
            match space.resolve(addr) {
                Resolution::ModelFile { model: 0, file, tensor: Some(hit), .. } if file == t.file => {
                    assert_eq!(hit, want)
                }
                other => panic!("{} + {off}: {other:?}", t.name),
            }
        }
    }
    // Shard 1's header, the heap and libc.
    assert!(matches!(space.resolve(base(1)), Resolution::ModelFile { file: 1, tensor: None, .. }));
    assert_eq!(space.resolve(0x7fff_f000_0010).class(), MemoryClass::Anon);
    match space.resolve(0x7fff_f020_0010) {
        Resolution::OtherFile { path, file_offset: 0x10 } => {
            assert_eq!(space.name(path), Some(Path::new("/usr/lib/libc.so.6")))
        }
        other => panic!("{other:?}"),
    }

    // The target unmaps shard 2 and the heap grows into part of shard 0's
    // range: events still in the ring resolve shard 2 where it was, while
    // the new heap wins where it is mapped.
    let t2 = model.tensors().iter().find(|t| t.file == 2).unwrap();
    let mut after = String::new();
    for l in maps.lines().filter(|l| !l.contains("00003-of")) {
        after += l;
        after += "\n";
    }
    after += &format!("{:x}-{:x} rw-p 00000000 00:00 0\n", base(0), base(0) + 0x20_0000);
    let mut later = AddressSpace::from_maps_text(after.as_bytes(), std::slice::from_ref(&model)).unwrap();
    assert_eq!(later.resolve(base(2) + t2.file_offset), Resolution::Unmapped);
    later.keep_unmapped_models(&space);
    assert!(matches!(
        later.resolve(base(2) + t2.file_offset),
        Resolution::ModelFile { file: 2, tensor: Some(TensorHit { offset_in_tensor: 0, .. }), .. }
    ));
    assert_eq!(later.resolve(base(0) + 0x1_0000).class(), MemoryClass::Anon);

    // A shard missing: a clear error naming it.
    std::fs::remove_file(&paths[2]).unwrap();
    let err = ModelMap::open(&paths[0]).unwrap_err().to_string();
    assert!(err.contains("m s-00003-of-00003.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_gguf_command_lists_the_fixture() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-moe.gguf");
    let run = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ttrace"))
            .args(["gguf", "--format", format])
            .arg(&fixture)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let csv = run("csv");
    let mut rows = csv.lines();
    assert_eq!(rows.next(), Some("tensor_name,file_offset,size_bytes,layer_id,component,type,shape"));
    assert_eq!(rows.next(), Some("token_embd.weight,2272,144,-1,token_embd,Q4_0,32x8"));
    assert_eq!(csv.lines().count(), 24);

    let json: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let t = &json["tensors"][10];
    assert_eq!(t["name"], "blk.0.ffn_down_exps.weight");
    assert_eq!(
        (t["component"].as_str(), t["n_experts"].as_u64(), t["layer"].as_u64()),
        (Some("ffn_down_exps"), Some(2), Some(0))
    );
    assert_eq!(json["summary"]["tensor_count"], 23);
    assert_eq!(json["summary"]["model"]["n_experts"], 2);

    let table = run("table");
    assert!(table.contains("blk.1.ffn_up_exps.weight") && table.contains("summary: 23 tensors"), "{table}");
}
