//! A lean reader of a BTF blob: one pass records where each type starts and
//! its kind and name, and lookups then decode only the structs and enums
//! asked for. Resolving ttrace's ~30 kernel fields this way takes a few
//! milliseconds, where a full parse of vmlinux's ~150k types into objects
//! (btfparse) took half a second or more: most of `attach`'s start-up.
//!
//! Format: the kernel's `Documentation/bpf/btf.rst` (header, type section,
//! string section; each type a 12-byte `btf_type` plus kind-specific data).

use std::collections::{HashMap, HashSet};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("not BTF (magic {0:#06x})")]
    Magic(u16),
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown type kind {kind} (type id {id})")]
    Kind { kind: u32, id: u32 },
}

/// The BTF kinds this reader tells apart (`BTF_KIND_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
}

impl Kind {
    fn from_info(info: u32) -> Option<Self> {
        use Kind::*;
        Some(match (info >> 24) & 0x1f {
            1 => Int,
            2 => Ptr,
            3 => Array,
            4 => Struct,
            5 => Union,
            6 => Enum,
            7 => Fwd,
            8 => Typedef,
            9 => Volatile,
            10 => Const,
            11 => Restrict,
            12 => Func,
            13 => FuncProto,
            14 => Var,
            15 => Datasec,
            16 => Float,
            17 => DeclTag,
            18 => TypeTag,
            19 => Enum64,
            _ => return None,
        })
    }

    /// Bytes after the 12-byte `btf_type`, for `vlen` entries.
    fn trailer(self, vlen: usize) -> usize {
        use Kind::*;
        match self {
            Int | Var | DeclTag => 4,
            Array => 12,
            Struct | Union | Datasec | Enum64 => 12 * vlen,
            Enum | FuncProto => 8 * vlen,
            Ptr | Fwd | Typedef | Volatile | Const | Restrict | Func | Float | TypeTag => 0,
        }
    }
}

/// Where a type's record starts, and what it is.
#[derive(Clone, Copy)]
struct TypeEntry {
    at: usize,
    kind: Kind,
}

/// A struct or union member, as stored.
struct Member {
    name: u32,
    type_id: u32,
    bit_offset: u32,
}

/// One BTF blob, indexed by type id and by the names of its structs,
/// unions and enums (first definition of a name wins, as bpftool lists them).
pub struct BtfIndex<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    /// Type id - 1 → entry (id 0 is `void`).
    types: Vec<TypeEntry>,
    named: HashMap<&'a [u8], u32>,
    /// Names of the `btf_trace_<event>` typedefs: the tracepoints a
    /// `tp_btf` program can attach to.
    tracepoints: HashSet<&'a [u8]>,
}

/// The prefix of the typedef the kernel declares for each tracepoint.
const BTF_TRACE: &[u8] = b"btf_trace_";

fn u32_at(data: &[u8], at: usize) -> Result<u32, FormatError> {
    let bytes = data.get(at..at + 4).ok_or(FormatError::Truncated(at))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

impl<'a> BtfIndex<'a> {
    pub fn new(blob: &'a [u8]) -> Result<Self, FormatError> {
        let magic = u16::from_le_bytes([*blob.first().unwrap_or(&0), *blob.get(1).unwrap_or(&0)]);
        if magic != 0xeb9f {
            return Err(FormatError::Magic(magic));
        }
        let field = |i: usize| u32_at(blob, 4 + 4 * i).map(|v| v as usize);
        let (hdr_len, type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
        let section = |off: usize, len: usize| {
            let start = hdr_len + off;
            blob.get(start..start + len).ok_or(FormatError::Truncated(start + len))
        };
        let (data, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut index = Self {
            data,
            strings,
            types: Vec::with_capacity(type_len / 24),
            named: HashMap::new(),
            tracepoints: HashSet::new(),
        };
        let mut at = 0;
        while at < data.len() {
            let (name, info) = (u32_at(data, at)?, u32_at(data, at + 4)?);
            let id = index.types.len() as u32 + 1;
            let kind = Kind::from_info(info).ok_or(FormatError::Kind { kind: (info >> 24) & 0x1f, id })?;
            if matches!(kind, Kind::Struct | Kind::Union | Kind::Enum | Kind::Enum64) && name != 0 {
                index.named.entry(index.string(name)).or_insert(id);
            } else if kind == Kind::Typedef
                && let Some(event) = index.string(name).strip_prefix(BTF_TRACE)
            {
                index.tracepoints.insert(event);
            }
            index.types.push(TypeEntry { at, kind });
            at += 12 + kind.trailer((info & 0xffff) as usize);
        }
        Ok(index)
    }

    fn string(&self, offset: u32) -> &'a [u8] {
        let tail = self.strings.get(offset as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|&b| b == 0).unwrap_or(tail.len())]
    }

    fn entry(&self, id: u32) -> Option<TypeEntry> {
        self.types.get((id as usize).checked_sub(1)?).copied()
    }

    fn vlen(&self, entry: TypeEntry) -> usize {
        u32_at(self.data, entry.at + 4).map_or(0, |info| (info & 0xffff) as usize)
    }

    fn kind_flag(&self, entry: TypeEntry) -> bool {
        u32_at(self.data, entry.at + 4).is_ok_and(|info| info >> 31 == 1)
    }

    fn members(&self, entry: TypeEntry) -> impl Iterator<Item = Member> + '_ {
        let bitfields = self.kind_flag(entry);
        (0..self.vlen(entry)).filter_map(move |i| {
            let at = entry.at + 12 + 12 * i;
            let offset = u32_at(self.data, at + 8).ok()?;
            Some(Member {
                name: u32_at(self.data, at).ok()?,
                type_id: u32_at(self.data, at + 4).ok()?,
                // With kind_flag the top 8 bits are a bitfield's size.
                bit_offset: if bitfields { offset & 0x00ff_ffff } else { offset },
            })
        })
    }

    /// Follow typedefs and qualifiers to the type they name.
    fn strip(&self, mut id: u32) -> Option<TypeEntry> {
        for _ in 0..32 {
            let entry = self.entry(id)?;
            match entry.kind {
                Kind::Typedef | Kind::Volatile | Kind::Const | Kind::Restrict | Kind::TypeTag => {
                    id = u32_at(self.data, entry.at + 8).ok()?;
                }
                _ => return Some(entry),
            }
        }
        None
    }

    /// Byte offset of `member` in `struct`/`union` `ty`, looking through
    /// anonymous struct and union members (as `folio.index` needs).
    pub fn member_offset(&self, ty: &str, member: &str) -> Option<u32> {
        let entry = self.entry(*self.named.get(ty.as_bytes())?)?;
        matches!(entry.kind, Kind::Struct | Kind::Union).then_some(())?;
        self.find_member(entry, member.as_bytes(), 0).map(|bits| bits / 8)
    }

    fn find_member(&self, entry: TypeEntry, name: &[u8], base_bits: u32) -> Option<u32> {
        let mut anonymous = Vec::new();
        for m in self.members(entry) {
            if m.name == 0 {
                anonymous.push(m);
            } else if self.string(m.name) == name {
                return Some(base_bits + m.bit_offset);
            }
        }
        anonymous.into_iter().find_map(|m| {
            let inner = self.strip(m.type_id)?;
            matches!(inner.kind, Kind::Struct | Kind::Union).then_some(())?;
            self.find_member(inner, name, base_bits + m.bit_offset)
        })
    }

    /// Whether the kernel declares tracepoint `event` (`btf_trace_<event>`),
    /// which a `tp_btf` program needs.
    pub fn has_tracepoint(&self, event: &str) -> bool {
        self.tracepoints.contains(event.as_bytes())
    }

    /// Every tracepoint [`has_tracepoint`](Self::has_tracepoint) knows.
    pub fn tracepoints(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.tracepoints.iter().copied()
    }

    /// The type id of function `name` (a `BTF_KIND_FUNC`): what a kfunc
    /// call names. A scan: asked for a few names, once per load.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        let at = self.types.iter().position(|t| {
            t.kind == Kind::Func && u32_at(self.data, t.at).is_ok_and(|n| self.string(n) == name.as_bytes())
        })?;
        Some(at as u32 + 1)
    }

    /// Value of enumerator `name` of `enum ty` (low 32 bits for ENUM64).
    pub fn enum_value(&self, ty: &str, name: &str) -> Option<u32> {
        let entry = self.entry(*self.named.get(ty.as_bytes())?)?;
        let stride = match entry.kind {
            Kind::Enum => 8,
            Kind::Enum64 => 12,
            _ => return None,
        };
        (0..self.vlen(entry)).find_map(|i| {
            let at = entry.at + 12 + stride * i;
            (self.string(u32_at(self.data, at).ok()?) == name.as_bytes()).then(|| u32_at(self.data, at + 4).ok())?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-assembled blob: `struct s { int a; union { int b; struct { int c; }; }; }`,
    /// `enum e { X = 7 }`, `typedef int btf_trace_ev` and `void f(void)`.
    fn blob() -> Vec<u8> {
        let strings = b"\0s\0a\0b\0c\0e\0X\0int\0btf_trace_ev\0f\0";
        let (s, a, b, c, e, x, int, tp, f) = (1u32, 3, 5, 7, 9, 11, 13, 17, 30);
        let mut types = Vec::new();
        let mut put = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_le_bytes()));
        put(&[int, 1 << 24, 4, 32]); // 1: int
        put(&[0, (4 << 24) | 1, 4, c, 1, 0]); // 2: struct { int c; }
        put(&[0, (5 << 24) | 2, 4, b, 1, 0, 0, 2, 0]); // 3: union { int b; struct {..}; }
        put(&[s, (4 << 24) | 2, 8, a, 1, 0, 0, 3, 32]); // 4: struct s
        put(&[e, (6 << 24) | 1, 4, x, 7]); // 5: enum e
        put(&[tp, 8 << 24, 1]); // 6: typedef int btf_trace_ev
        put(&[0, 13 << 24, 0]); // 7: void (void)
        put(&[f, 12 << 24, 7]); // 8: void f(void)
        let mut out = Vec::new();
        let header = [0xeb9f_u32 | (1 << 16), 24, 0, types.len() as u32, types.len() as u32, strings.len() as u32];
        header.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        out.extend_from_slice(&types);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn resolves_members_through_anonymous_unions_and_structs() {
        let data = blob();
        let btf = BtfIndex::new(&data).unwrap();
        assert_eq!(btf.member_offset("s", "a"), Some(0));
        assert_eq!(btf.member_offset("s", "b"), Some(4));
        assert_eq!(btf.member_offset("s", "c"), Some(4));
        assert_eq!(btf.member_offset("s", "d"), None);
        assert_eq!(btf.member_offset("t", "a"), None);
        assert_eq!(btf.enum_value("e", "X"), Some(7));
        assert_eq!(btf.enum_value("s", "X"), None);
        assert!(btf.has_tracepoint("ev"));
        assert!(!btf.has_tracepoint("int"));
        assert_eq!(btf.func_id("f"), Some(8));
        assert_eq!(btf.func_id("s"), None, "a struct is not a function");
    }

    #[test]
    fn rejects_bad_and_truncated_blobs() {
        assert_eq!(BtfIndex::new(b"nope").err(), Some(FormatError::Magic(0x6f6e)));
        let data = blob();
        assert!(matches!(BtfIndex::new(&data[..40]), Err(FormatError::Truncated(_))));
    }
}
