//! Facts read from the traced binaries: identity, dynamic section, symbols,
//! build id, and the target's own op-name tables.
//!
//! Files are read through `object::ReadCache`, so only the headers and tables
//! we look at are read: a mapped file list may contain multi-GB models.

use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap},
    fs::File,
    os::unix::fs::FileExt,
    path::Path,
};

use object::{
    Endianness, Object, ReadCache, ReadRef, elf,
    read::elf::{Dyn, ElfFile64, Rela, SectionHeader, Sym},
};

use super::TargetError;

type Elf64<'a> = ElfFile64<'a, Endianness, &'a ReadCache<File>>;

/// The ELF identification fields ld.so checks before loading a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfIdent {
    pub class64: bool,
    pub little_endian: bool,
    pub e_type: u16,
    pub machine: u16,
}

impl ElfIdent {
    /// `None` when the file is readable but not ELF.
    pub fn read(path: &Path) -> Result<Option<Self>, TargetError> {
        let file = File::open(path).map_err(TargetError::io(path))?;
        let mut head = [0u8; 20];
        let n = read_full_at(&file, &mut head, 0).map_err(TargetError::io(path))?;
        Ok(Self::parse(&head[..n]))
    }

    pub fn parse(head: &[u8]) -> Option<Self> {
        if head.len() < 20 || &head[..4] != b"\x7fELF" {
            return None;
        }
        let little_endian = head[5] == elf::ELFDATA2LSB;
        let u16_at = |i: usize| {
            let b = [head[i], head[i + 1]];
            if little_endian { u16::from_le_bytes(b) } else { u16::from_be_bytes(b) }
        };
        Some(Self { class64: head[4] == elf::ELFCLASS64, little_endian, e_type: u16_at(16), machine: u16_at(18) })
    }

    /// Could ld.so load a shared object with identity `lib` into a process
    /// whose executable has identity `self`?
    pub fn accepts_library(&self, lib: &ElfIdent) -> bool {
        lib.class64 == self.class64
            && lib.little_endian == self.little_endian
            && lib.machine == self.machine
            && lib.e_type == elf::ET_DYN
    }
}

fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Opens `path` as a 64-bit little-endian ELF file and runs `f` on it.
fn with_elf<T>(path: &Path, f: impl FnOnce(&Elf64<'_>) -> Result<T, TargetError>) -> Result<T, TargetError> {
    let ident = ElfIdent::read(path)?.ok_or_else(|| TargetError::NotElf { path: path.to_path_buf() })?;
    if !ident.class64 {
        return Err(TargetError::UnsupportedElf { path: path.to_path_buf(), what: "32-bit ELF" });
    }
    if !ident.little_endian {
        return Err(TargetError::UnsupportedElf { path: path.to_path_buf(), what: "big-endian ELF" });
    }
    let file = File::open(path).map_err(TargetError::io(path))?;
    let cache = ReadCache::new(file);
    let elf = Elf64::parse(&cache).map_err(|source| TargetError::Elf { path: path.to_path_buf(), source })?;
    f(&elf)
}

/// What ld.so reads from an object's dynamic section. RPATH is already
/// dropped when RUNPATH is present, as glibc does.
#[derive(Debug, Default, Clone)]
pub(crate) struct DynInfo {
    pub needed: Vec<Vec<u8>>,
    pub rpath: Option<Vec<u8>>,
    pub runpath: Option<Vec<u8>>,
    pub soname: Option<Vec<u8>>,
}

pub(crate) fn dyn_info(path: &Path) -> Result<DynInfo, TargetError> {
    with_elf(path, |file| {
        let bad = |source| TargetError::Elf { path: path.to_path_buf(), source };
        let (endian, data, sections) = (file.endian(), file.data(), file.elf_section_table());
        let mut info = DynInfo::default();
        let Some((dyns, link)) = sections.dynamic(endian, data).map_err(bad)? else { return Ok(info) };
        let strings = sections.strings(endian, data, link).map_err(bad)?;
        for d in dyns {
            let Some(tag) = d.tag32(endian) else { continue };
            if tag == elf::DT_NULL {
                break;
            }
            // A bad string offset reads as an absent entry.
            let value = || d.val32(endian).and_then(|v| strings.get(v).ok()).map(<[u8]>::to_vec);
            match tag {
                elf::DT_NEEDED => info.needed.extend(value()),
                elf::DT_RPATH => info.rpath = value(),
                elf::DT_RUNPATH => info.runpath = value(),
                elf::DT_SONAME => info.soname = value(),
                _ => {}
            }
        }
        if info.runpath.is_some() {
            info.rpath = None;
        }
        Ok(info)
    })
}

/// A defined symbol: value and size.
#[derive(Debug, Clone, Copy)]
struct SymInfo {
    addr: u64,
    size: u64,
}

/// Looks `names` up among the defined symbols of .dynsym, then .symtab.
fn find_symbols(file: &Elf64<'_>, names: &[&str]) -> Vec<Option<SymInfo>> {
    find_matching(file, names, |name, want| name == want.as_bytes())
}

/// The first defined symbol per `names` entry that `accept(name, entry)`.
fn find_matching(file: &Elf64<'_>, names: &[&str], accept: impl Fn(&[u8], &str) -> bool) -> Vec<Option<SymInfo>> {
    let endian = file.endian();
    let mut found = vec![None; names.len()];
    for table in [file.elf_dynamic_symbol_table(), file.elf_symbol_table()] {
        for sym in table.iter() {
            if sym.st_shndx(endian) == elf::SHN_UNDEF || sym.st_name(endian) == 0 {
                continue;
            }
            let Ok(name) = table.symbol_name(endian, sym) else { continue };
            for (slot, want) in found.iter_mut().zip(names) {
                if slot.is_none() && accept(name, want) {
                    *slot = Some(SymInfo { addr: sym.st_value(endian), size: sym.st_size(endian) });
                }
            }
        }
    }
    found
}

/// Which of `names` `path` defines (in .dynsym or .symtab).
pub fn has_symbols(path: &Path, names: &[&str]) -> Result<Vec<bool>, TargetError> {
    with_elf(path, |file| Ok(find_symbols(file, names).iter().map(Option::is_some).collect()))
}

/// File offsets of `names` (what uprobes attach to), from one parse of
/// `path`: the symbol's address mapped through its PT_LOAD segment.
pub fn symbol_file_offsets(path: &Path, names: &[&str]) -> Result<Vec<Option<u64>>, TargetError> {
    Ok(probe_sites(path, names, |_, _| 0)?.into_iter().map(|s| s.map(|s| s.file_offset)).collect())
}

/// Where a uprobe goes: its link-time address (what user space compares
/// return addresses with) and its file offset (what it attaches to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    pub vaddr: u64,
    pub file_offset: u64,
}

/// The sites of `names`, each moved `skip(name, code)` bytes past its
/// symbol, `code` being the whole function (a symbol of unknown size is
/// not moved: what could reach the site again cannot be checked).
pub(super) fn probe_sites(
    path: &Path,
    names: &[&str],
    skip: impl Fn(&str, &[u8]) -> u64,
) -> Result<Vec<Option<ProbeSite>>, TargetError> {
    use object::read::elf::ProgramHeader as _;
    with_elf(path, |file| {
        let endian = file.endian();
        let loads: Vec<(u64, u64, u64)> = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| (ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian)))
            .collect();
        Ok(find_symbols(file, names)
            .iter()
            .zip(names)
            .map(|(sym, name)| {
                let sym = sym.as_ref()?;
                let code = (sym.size > 0).then(|| section_bytes(file, sym.addr, sym.size)).flatten();
                let skip = code.map_or(0, |code| skip(name, code));
                let vaddr = sym.addr + if skip < sym.size { skip } else { 0 };
                let &(load, _, offset) = loads.iter().find(|&&(v, size, _)| vaddr >= v && vaddr - v < size)?;
                Some(ProbeSite { vaddr, file_offset: vaddr - load + offset })
            })
            .collect())
    })
}

/// The dynamic loader an executable names (its PT_INTERP), if it has one.
pub fn interpreter(path: &Path) -> Result<Option<std::path::PathBuf>, TargetError> {
    use object::read::elf::ProgramHeader as _;
    use std::os::unix::ffi::OsStrExt as _;
    with_elf(path, |file| {
        let endian = file.endian();
        let data = file.data();
        Ok(file.elf_program_headers().iter().find_map(|ph| {
            let bytes = ph.interpreter(endian, data).ok()??;
            Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
        }))
    })
}

/// The llama.cpp commit a build reports (`char const * LLAMA_COMMIT` in
/// libllama-common's build info), for the trace header.
pub fn llama_commit(path: &Path) -> Option<String> {
    with_elf(path, |file| {
        let image = Image::new(file);
        let commit = find_symbols(file, &["LLAMA_COMMIT"])[0]
            .and_then(|sym| image.pointer_at(sym.addr))
            .and_then(|p| image.c_string(p))
            .map(|b| String::from_utf8_lossy(b).into_owned());
        Ok(commit)
    })
    .ok()
    .flatten()
    .filter(|c| !c.is_empty())
}

/// The string a `const char * f(void)` of `path` returns (`ggml_version`,
/// `ggml_commit`): the constant its code loads. `None` when `path` does not
/// define `function` or its code is not that simple.
pub fn returned_string(path: &Path, function: &str) -> Option<String> {
    with_elf(path, |file| {
        let image = Image::new(file);
        let text = find_symbols(file, &[function])[0]
            .and_then(|f| image.decode_string_address(f.addr, f.size))
            .and_then(|p| image.c_string(p))
            .map(|b| String::from_utf8_lossy(b).into_owned());
        Ok(text)
    })
    .ok()
    .flatten()
}

/// The first `len` bytes of function `function`'s code in `path`.
pub fn function_head(path: &Path, function: &str, len: u64) -> Option<Vec<u8>> {
    with_elf(path, |file| {
        let image = Image::new(file);
        Ok(find_symbols(file, &[function])[0].and_then(|f| image.bytes(f.addr, len.min(f.size))).map(<[u8]>::to_vec))
    })
    .ok()
    .flatten()
}

/// The first `len` bytes of each function of `names` (fewer where the
/// function is shorter), from one read of `path`'s symbols.
pub fn function_heads(path: &Path, names: &[&str], len: u64) -> Result<Vec<Option<Vec<u8>>>, TargetError> {
    with_elf(path, |file| {
        let image = Image::new(file);
        let found = find_symbols(file, names);
        Ok(found
            .into_iter()
            .map(|f| f.and_then(|f| image.bytes(f.addr, len.min(f.size))).map(<[u8]>::to_vec))
            .collect())
    })
}

/// A function's code as it is mapped (its first `len` bytes, and the
/// address they start at), with the first `callee_len` bytes of each
/// function it calls directly: what an inlined-away symbol is found by.
pub struct Calls {
    pub ip: u64,
    pub code: Vec<u8>,
    pub callees: Vec<(u64, Vec<u8>)>,
}

pub fn function_calls(path: &Path, function: &str, len: u64, callee_len: u64) -> Result<Option<Calls>, TargetError> {
    with_elf(path, |file| {
        let image = Image::new(file);
        let Some(f) = find_symbols(file, &[function])[0] else { return Ok(None) };
        let Some(code) = image.bytes(f.addr, len.min(f.size)) else { return Ok(None) };
        let callees = super::code::call_targets(code, f.addr)
            .into_iter()
            .filter_map(|at| Some((at, image.bytes(at, callee_len)?.to_vec())))
            .collect();
        Ok(Some(Calls { ip: f.addr, code: code.to_vec(), callees }))
    })
}

/// The value of an initialised `int` variable of `path` (`LLAMA_BUILD_NUMBER`).
pub fn int_variable(path: &Path, name: &str) -> Option<i64> {
    with_elf(path, |file| {
        let image = Image::new(file);
        let value = find_symbols(file, &[name])[0]
            .filter(|s| s.size == 4)
            .and_then(|s| image.bytes(s.addr, 4))
            .and_then(|b| b.try_into().ok())
            .map(|b: [u8; 4]| i64::from(i32::from_le_bytes(b)));
        Ok(value)
    })
    .ok()
    .flatten()
}

/// Hex of the NT_GNU_BUILD_ID note, for the trace header.
pub fn build_id(path: &Path) -> Option<String> {
    let id = with_elf(path, |file| Ok(file.build_id().ok().flatten().map(<[u8]>::to_vec))).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// The target's own op-name tables (`GGML_OP_NAME` and friends), indexed by
/// the op enum values of that very build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpNames {
    pub ops: Vec<String>,
    pub unary: Vec<String>,
    pub glu: Vec<String>,
}

impl OpNames {
    pub fn op(&self, id: i32) -> Cow<'_, str> {
        name_or(&self.ops, id, "op")
    }

    pub fn unary(&self, id: i32) -> Cow<'_, str> {
        name_or(&self.unary, id, "unary")
    }

    pub fn glu(&self, id: i32) -> Cow<'_, str> {
        name_or(&self.glu, id, "glu")
    }

    pub fn op_id(&self, name: &str) -> Option<i32> {
        self.ops.iter().position(|n| n == name).and_then(|i| i32::try_from(i).ok())
    }
}

fn name_or<'a>(table: &'a [String], id: i32, kind: &str) -> Cow<'a, str> {
    match usize::try_from(id).ok().and_then(|i| table.get(i)) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("{kind}#{id}")),
    }
}

const OP_FUNCTIONS: [&str; 4] = ["ggml_op_name", "ggml_unary_op_name", "ggml_glu_op_name", "ggml_op_symbol"];
const OP_TABLE_SYMBOLS: [&str; 3] = ["GGML_OP_NAME", "GGML_UNARY_OP_NAME", "GGML_GLU_OP_NAME"];
/// More slots than any table could hold: a stop for corrupt files.
const MAX_TABLE: u64 = 4096;
/// Longest op name accepted (the longest today is 23 bytes).
const MAX_NAME: u64 = 64;

/// Reads the op-name tables of `libggml_base` (or whichever file defines
/// `ggml_op_name`). Works on stripped libraries: the table address comes from
/// decoding `ggml_op_name`'s code, its entries from the relocations (or stored
/// pointers) of its slots. Never a hard-coded enum: op ids move between ggml
/// versions.
pub fn op_names(libggml_base: &Path) -> Result<OpNames, TargetError> {
    with_elf(libggml_base, |file| {
        let image = Image::new(file);
        let funcs = find_symbols(file, &OP_FUNCTIONS);
        let locals = find_symbols(file, &OP_TABLE_SYMBOLS);
        let decoded: Vec<Option<u64>> =
            funcs.iter().map(|f| f.and_then(|f| image.decode_table_address(f.addr, f.size))).collect();
        // The tables sit next to each other in .data.rel.ro, and ggml_op_name does
        // no bounds check: a table ends where another one starts.
        let starts: BTreeSet<u64> =
            decoded.iter().flatten().copied().chain(locals.iter().flatten().map(|s| s.addr)).collect();
        let mut tables = Vec::new();
        for (i, function) in OP_FUNCTIONS[..3].iter().enumerate() {
            let start = decoded[i].or(locals[i].map(|s| s.addr));
            // GLU ops came in Jul 2025: older builds have no such table.
            if start.is_none() && i == 2 && funcs[i].is_none() && locals[i].is_none() {
                tables.push(Vec::new());
                continue;
            }
            let Some(start) = start else {
                let reason = if funcs[i].is_none() { "no such symbol" } else { "no table address in its code" };
                return Err(TargetError::NoOpTable { path: libggml_base.to_path_buf(), function, reason });
            };
            // An unstripped file states the exact table size.
            let limit =
                locals.iter().flatten().find(|s| s.addr == start && s.size > 0).map_or(MAX_TABLE, |s| s.size / 8);
            let end = starts.range(start + 1..).next().map_or(u64::MAX, |&next| next);
            let names = image.read_table(start, limit, end);
            if names.is_empty() {
                let reason = "the table holds no op names";
                return Err(TargetError::NoOpTable { path: libggml_base.to_path_buf(), function, reason });
            }
            tables.push(names);
        }
        let [ops, unary, glu] = <[Vec<String>; 3]>::try_from(tables).unwrap_or_default();
        if ops.first().map(String::as_str) != Some("NONE") {
            let reason = "the table does not start with NONE";
            return Err(TargetError::NoOpTable { path: libggml_base.to_path_buf(), function: "ggml_op_name", reason });
        }
        Ok(OpNames { ops, unary, glu })
    })
}

/// Bytes at virtual address `addr`, from a section with file contents.
fn section_bytes<'a>(file: &Elf64<'a>, addr: u64, len: u64) -> Option<&'a [u8]> {
    let endian = file.endian();
    let section = file.elf_section_table().iter().find(|s| {
        let (start, size) = (s.sh_addr(endian), s.sh_size(endian));
        s.sh_flags(endian) & u64::from(elf::SHF_ALLOC) != 0
            && s.sh_type(endian) != elf::SHT_NOBITS
            && addr >= start
            && addr - start < size
    })?;
    let in_section = addr - section.sh_addr(endian);
    let len = len.min(section.sh_size(endian) - in_section);
    file.data().read_bytes_at(section.sh_offset(endian).checked_add(in_section)?, len).ok()
}

/// Virtual addresses of a file image, resolved through its section headers,
/// plus the pointer values its dynamic relocations set.
struct Image<'a, 'f> {
    file: &'f Elf64<'a>,
    relative: HashMap<u64, u64>,
}

impl<'a, 'f> Image<'a, 'f> {
    fn new(file: &'f Elf64<'a>) -> Self {
        let endian = file.endian();
        let data = file.data();
        let mut relative = HashMap::new();
        for section in file.elf_section_table().iter() {
            if section.sh_type(endian) != elf::SHT_RELA || section.sh_flags(endian) & u64::from(elf::SHF_ALLOC) == 0 {
                continue;
            }
            let Ok(Some((relas, _))) = section.rela(endian, data) else { continue };
            let symbols = file.elf_dynamic_symbol_table();
            for r in relas {
                let addend = r.r_addend(endian) as u64;
                let target = match r.r_type(endian, false) {
                    elf::R_X86_64_RELATIVE => Some(addend),
                    // A GOT slot or pointer bound to a symbol this file defines
                    // (an exported table in -fPIC code).
                    elf::R_X86_64_GLOB_DAT | elf::R_X86_64_64 => r
                        .symbol(endian, false)
                        .and_then(|i| symbols.symbol(i).ok())
                        .filter(|s| s.st_shndx(endian) != elf::SHN_UNDEF)
                        .map(|s| s.st_value(endian).wrapping_add(addend)),
                    _ => None,
                };
                if let Some(target) = target {
                    relative.insert(r.r_offset(endian), target);
                }
            }
        }
        Self { file, relative }
    }

    fn bytes(&self, addr: u64, len: u64) -> Option<&'a [u8]> {
        section_bytes(self.file, addr, len)
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        let b: [u8; 8] = self.bytes(addr, 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(b))
    }

    /// The pointer the loader leaves in slot `addr`: from its relocation, else
    /// the stored value (RELR-packed, REL, or non-PIE files).
    fn pointer_at(&self, addr: u64) -> Option<u64> {
        self.relative.get(&addr).copied().or_else(|| self.u64_at(addr)).filter(|&p| p != 0)
    }

    fn c_string(&self, addr: u64) -> Option<&'a [u8]> {
        let bytes = self.bytes(addr, MAX_NAME + 1)?;
        let end = bytes.iter().position(|&b| b == 0)?;
        Some(&bytes[..end])
    }

    /// Finds the table `ggml_op_name`-like code indexes: `lea table(%rip)`,
    /// `mov got_slot(%rip)` (table address in the GOT), or, in non-PIC code,
    /// `mov table(,%rdi,8)`. The first candidate whose slot 0 points at a
    /// string wins, which also steps over false matches inside other
    /// instructions.
    fn decode_table_address(&self, func: u64, size: u64) -> Option<u64> {
        let window = if size == 0 { 64 } else { size.min(256) };
        let code = self.bytes(func, window)?;
        let disp = |i: usize| code.get(i..i + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64);
        let rip =
            |i: usize, insn_len: u64| Some(func.wrapping_add(i as u64 + insn_len).wrapping_add_signed(disp(i + 3)?));
        for i in 0..code.len() {
            let (Some(&rex), Some(&op), Some(&modrm)) = (code.get(i), code.get(i + 1), code.get(i + 2)) else { break };
            if rex & 0xf8 != 0x48 {
                continue;
            }
            let candidate = match (op, modrm & 0xc7) {
                (0x8d, 0x05) => rip(i, 7),
                (0x8b, 0x05) => rip(i, 7).and_then(|slot| self.pointer_at(slot)),
                (0x8b, 0x04) if code.get(i + 3).is_some_and(|sib| sib & 0xc7 == 0xc5) => disp(i + 4).map(|d| d as u64),
                _ => None,
            };
            if let Some(table) = candidate.filter(|&t| self.pointer_at(t).and_then(|p| self.c_string(p)).is_some()) {
                return Some(table);
            }
        }
        None
    }

    /// The string a function returns by loading its address (`lea
    /// str(%rip), %reg`), checked to hold a printable C string.
    fn decode_string_address(&self, func: u64, size: u64) -> Option<u64> {
        let window = if size == 0 { 32 } else { size.min(64) };
        let code = self.bytes(func, window)?;
        (0..code.len().saturating_sub(6)).find_map(|i| {
            let (rex, op, modrm) = (code[i], code[i + 1], code[i + 2]);
            if rex & 0xfb != 0x48 || op != 0x8d || modrm & 0xc7 != 0x05 {
                return None;
            }
            let disp = i32::from_le_bytes([code[i + 3], code[i + 4], code[i + 5], code[i + 6]]);
            let target = func.wrapping_add(i as u64 + 7).wrapping_add_signed(i64::from(disp));
            self.c_string(target).filter(|s| s.iter().all(|b| b.is_ascii_graphic())).map(|_| target)
        })
    }

    /// Names in slots `start, start+8, ...`: stops at `limit` slots, at
    /// address `end` (the next table), or at the first slot that does not
    /// point at an op-like name.
    fn read_table(&self, start: u64, limit: u64, end: u64) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..limit.min(MAX_TABLE) {
            let slot = start + 8 * i;
            if slot >= end {
                break;
            }
            let Some(name) = self.pointer_at(slot).and_then(|p| self.c_string(p)) else { break };
            if !is_op_name(name) {
                break;
            }
            names.push(String::from_utf8_lossy(name).into_owned());
        }
        names
    }
}

/// Op names are upper-case C identifiers (`MUL_MAT`, `CONV_TRANSPOSE_1D`).
fn is_op_name(name: &[u8]) -> bool {
    !name.is_empty()
        && !name[0].is_ascii_digit()
        && name.iter().all(|&b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Link-time address and size of the first defined symbol of each `names`
/// entry, where a compiler clone (`name.isra.0`, `name.constprop.0`) also
/// counts: `--values` needs the node loop, a static function.
pub fn symbol_ranges(path: &Path, names: &[&str]) -> Result<Vec<Option<(u64, u64)>>, TargetError> {
    let clone = |name: &[u8], want: &str| {
        name.strip_prefix(want.as_bytes()).is_some_and(|rest| rest.is_empty() || rest[0] == b'.')
    };
    with_elf(path, |file| {
        Ok(find_matching(file, names, clone).into_iter().map(|s| s.map(|s| (s.addr, s.size))).collect())
    })
}

#[cfg(test)]
#[path = "elf_tests.rs"]
mod tests;
