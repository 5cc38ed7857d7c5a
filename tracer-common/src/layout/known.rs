//! The layouts ttrace knows, one table per layout, each derived from a
//! `#[repr(C)]` mirror of the struct as that llama.cpp version declares it
//! (x86_64) and pinned by const asserts; and the llama.cpp releases they
//! belong to, with what each release's build says about itself. Read from
//! the vendored sources of the PyPI llama-cpp-python sdists (the commits
//! are their `.git/modules/vendor/llama.cpp`).
//!
//! Adding a version: mirror what moved, add a table, add or extend a
//! [`Release`], and let the README's table follow (`tracer-user`'s
//! `supported_versions` test prints it).

use core::mem::{offset_of, size_of};

use super::{ABSENT, BufferLayout, CgraphLayout, GgmlLayout, ParamsLayout, TensorLayout, UbatchLayout};
use crate::ggml::{GgmlTensor, MAX_NAME, MAX_OP_PARAMS, MAX_SRC};

/// One struct's layout, named as the trace header and README name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known<T: 'static> {
    /// `struct/since`, e.g. `ggml_cgraph/2026-04`.
    pub name: &'static str,
    /// The llama.cpp versions that declare the struct so.
    pub covers: &'static str,
    pub layout: T,
}

// ---- ggml_tensor -------------------------------------------------------

/// `struct ggml_tensor` before Dec 2024: a `grad` pointer at 152 moves
/// `src` and everything after it by 8. Known so a refusal can say so.
#[repr(C)]
struct TensorWithGrad {
    type_: i32,
    backend: i32,
    buffer: u64,
    ne: [i64; 4],
    nb: [u64; 4],
    op: i32,
    op_params: [i32; MAX_OP_PARAMS],
    flags: i32,
    grad: u64,
    src: [u64; MAX_SRC],
    view_src: u64,
    view_offs: u64,
    data: u64,
    name: [u8; MAX_NAME],
    extra: u64,
}

macro_rules! tensor_layout {
    ($t:ty) => {
        TensorLayout {
            size: size_of::<$t>() as u32,
            type_: offset_of!($t, type_) as u32,
            ne: offset_of!($t, ne) as u32,
            nb: offset_of!($t, nb) as u32,
            op: offset_of!($t, op) as u32,
            op_params: offset_of!($t, op_params) as u32,
            flags: offset_of!($t, flags) as u32,
            src: offset_of!($t, src) as u32,
            view_src: offset_of!($t, view_src) as u32,
            view_offs: offset_of!($t, view_offs) as u32,
            data: offset_of!($t, data) as u32,
            name: offset_of!($t, name) as u32,
            extra: offset_of!($t, extra) as u32,
        }
    };
}

pub const TENSOR_WITH_GRAD: Known<TensorLayout> = Known {
    name: "ggml_tensor/2023",
    covers: "llama.cpp before Dec 2024 (llama-cpp-python <= 0.3.2): with `grad`",
    layout: tensor_layout!(TensorWithGrad),
};

/// Today's layout, mirrored by [`GgmlTensor`] (the form the rest of ttrace
/// decodes every layout into). 0.3.3 still had a deprecated `backend` enum
/// at 4, in what is padding since: no offset differs.
pub const TENSOR_2024_12: Known<TensorLayout> = Known {
    name: "ggml_tensor/2024-12",
    covers: "llama.cpp Dec 2024 (ce8784b) and later: `grad` removed",
    layout: tensor_layout!(GgmlTensor),
};

// ---- ggml_cgraph -------------------------------------------------------

#[repr(C)]
struct HashSet {
    size: u64,
    used: u64,
    keys: u64,
}

#[repr(C)]
struct Cgraph2023 {
    size: i32,
    n_nodes: i32,
    n_leafs: i32,
    nodes: u64,
    grads: u64,
    leafs: u64,
    visited_hash_set: HashSet,
    order: i32,
}

#[repr(C)]
struct Cgraph2024 {
    size: i32,
    n_nodes: i32,
    n_leafs: i32,
    nodes: u64,
    grads: u64,
    grad_accs: u64,
    leafs: u64,
    visited_hash_set: HashSet,
    order: i32,
}

#[repr(C)]
struct Cgraph2025 {
    size: i32,
    n_nodes: i32,
    n_leafs: i32,
    nodes: u64,
    grads: u64,
    grad_accs: u64,
    leafs: u64,
    use_counts: u64,
    visited_hash_set: HashSet,
    order: i32,
}

#[repr(C)]
struct Cgraph2026 {
    size: i32,
    n_nodes: i32,
    n_leafs: i32,
    nodes: u64,
    grads: u64,
    grad_accs: u64,
    leafs: u64,
    use_counts: u64,
    visited_hash_set: HashSet,
    order: i32,
    uid: u64,
}

macro_rules! cgraph_layout {
    ($t:ty, $uid:expr) => {
        CgraphLayout {
            bytes: size_of::<$t>() as u32,
            size: offset_of!($t, size) as u32,
            n_nodes: offset_of!($t, n_nodes) as u32,
            nodes: offset_of!($t, nodes) as u32,
            uid: $uid,
        }
    };
}

pub const CGRAPH_2023: Known<CgraphLayout> = Known {
    name: "ggml_cgraph/2023",
    covers: "llama.cpp before Dec 2024: no grad_accs, no uid",
    layout: cgraph_layout!(Cgraph2023, ABSENT),
};
pub const CGRAPH_2024: Known<CgraphLayout> = Known {
    name: "ggml_cgraph/2024-12",
    covers: "llama.cpp Dec 2024 - Jul 2025 (llama-cpp-python 0.3.3 - 0.3.11): grad_accs, no uid",
    layout: cgraph_layout!(Cgraph2024, ABSENT),
};
pub const CGRAPH_2025: Known<CgraphLayout> = Known {
    name: "ggml_cgraph/2025-07",
    covers: "llama.cpp Jul 2025 - Apr 2026 (llama-cpp-python 0.3.12 - 0.3.20, ggml < 0.10): use_counts, no uid",
    layout: cgraph_layout!(Cgraph2025, ABSENT),
};
pub const CGRAPH_2026: Known<CgraphLayout> = Known {
    name: "ggml_cgraph/2026-04",
    covers: "llama.cpp Apr 2026 and later (ggml 0.10+): `uid` at 88",
    layout: cgraph_layout!(Cgraph2026, offset_of!(Cgraph2026, uid) as u32),
};

// ---- ggml_compute_params -----------------------------------------------

/// Its head: `wsize`, `wdata` and `threadpool` follow, and `bool use_ref`
/// was appended in 2026; none of that moves `ith` and `nth`.
#[repr(C)]
struct ParamsHead {
    ith: i32,
    nth: i32,
    wsize: u64,
}

pub const PARAMS_2024: Known<ParamsLayout> = Known {
    name: "ggml_compute_params/2024",
    covers: "every version ttrace knows: `int ith, nth` first",
    layout: ParamsLayout { ith: offset_of!(ParamsHead, ith) as u32, nth: offset_of!(ParamsHead, nth) as u32 },
};

// ---- llama_ubatch ------------------------------------------------------

/// The head of `struct llama_ubatch` up to `output`, as
/// `llama_context::process_ubatch` receives it (that function exists since
/// Jul 2025). `equal_seqs` was a `bool`, then `uint32_t b_equal_seqs`;
/// `n_pos` (2026) took the padding after `n_seqs_unq`: no offset moved.
#[repr(C)]
struct Ubatch2025 {
    b_equal_seqs: u32,
    n_tokens: u32,
    n_seq_tokens: u32,
    n_seqs: u32,
    n_seqs_unq: u32,
    n_pos: u32,
    token: u64,
    embd: u64,
    pos: u64,
    n_seq_id: u64,
    seq_id: u64,
    seq_id_unq: u64,
    seq_idx: u64,
    output: u64,
}

pub const UBATCH_2025: Known<UbatchLayout> = Known {
    name: "llama_ubatch/2025-07",
    covers: "llama.cpp Jul 2025 and later (llama-cpp-python 0.3.10+): where process_ubatch exists",
    layout: UbatchLayout {
        size: size_of::<Ubatch2025>() as u32,
        n_tokens: offset_of!(Ubatch2025, n_tokens) as u32,
        token: offset_of!(Ubatch2025, token) as u32,
        pos: offset_of!(Ubatch2025, pos) as u32,
        seq_id: offset_of!(Ubatch2025, seq_id) as u32,
        output: offset_of!(Ubatch2025, output) as u32,
    },
};

// ---- ggml_backend_buffer -----------------------------------------------

/// `struct ggml_backend_buffer` with its `iface` of `n` function pointers.
#[repr(C)]
struct Buffer<const N: usize> {
    iface: [u64; N],
    buft: u64,
    context: u64,
    size: u64,
    usage: u32,
}

macro_rules! buffer_layout {
    ($t:ty) => {
        BufferLayout {
            buft: offset_of!($t, buft) as u32,
            context: offset_of!($t, context) as u32,
            size: offset_of!($t, size) as u32,
            usage: offset_of!($t, usage) as u32,
        }
    };
}

pub const BUFFER_2024: Known<BufferLayout> = Known {
    name: "ggml_backend_buffer/2024",
    covers: "llama.cpp up to Apr 2026 (llama-cpp-python 0.3.2 - 0.3.16 read): 9 interface functions",
    layout: buffer_layout!(Buffer<9>),
};
/// `set_tensor_2d` and `get_tensor_2d` joined the interface (tensor parallelism).
pub const BUFFER_2026: Known<BufferLayout> = Known {
    name: "ggml_backend_buffer/2026-04",
    covers: "llama.cpp from Apr 2026 (llama-cpp-python 0.3.30, 0.3.36 read): 11 interface functions",
    layout: buffer_layout!(Buffer<11>),
};

// ---- releases ----------------------------------------------------------

/// `ggml_version()`'s text, `major.minor.patch`. Builds of 2025 report
/// `0.0.<build number>`; from late 2025 ggml has versions of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GgmlVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GgmlVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }

    /// `0.25.3`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
        let version = Self::new(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(version)
    }
}

impl core::fmt::Display for GgmlVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What a release's builds return from `ggml_version()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlVersions {
    /// They have no `ggml_version` function.
    None,
    /// An inclusive range.
    Range(GgmlVersion, GgmlVersion),
}

impl GgmlVersions {
    pub fn matches(&self, found: Option<GgmlVersion>) -> bool {
        match (self, found) {
            (Self::None, None) => true,
            (Self::Range(lo, hi), Some(v)) => *lo <= v && v <= *hi,
            _ => false,
        }
    }
}

/// A range of versions, both ends inclusive; `first` empty: everything up to `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub first: &'static str,
    pub last: &'static str,
}

const fn span(first: &'static str, last: &'static str) -> Span {
    Span { first, last }
}

impl core::fmt::Display for Span {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match (self.first, self.last) {
            ("", last) => write!(f, "up to {last}"),
            (first, last) if first == last => f.write_str(first),
            (first, last) => write!(f, "{first} - {last}"),
        }
    }
}

impl core::fmt::Display for GgmlVersions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Range(lo, hi) => write!(f, "{lo} - {hi}"),
        }
    }
}

/// A range of llama.cpp versions whose structs ttrace reads the same way,
/// and how a build of it is recognised: its `ggml_version()`, and symbols
/// every build of the range defines or none does.
#[derive(Clone, Copy, Debug)]
pub struct Release {
    /// The range's id in the trace header.
    pub name: &'static str,
    /// llama.cpp by date, and the first and last commit of the range ttrace
    /// read the sources of.
    pub dates: Span,
    pub commits: Span,
    /// The llama-cpp-python releases that vendor it.
    pub pypi: Span,
    pub ggml: GgmlVersions,
    pub defines: &'static [&'static str],
    pub lacks: &'static [&'static str],
    pub tensor: &'static Known<TensorLayout>,
    pub cgraph: &'static Known<CgraphLayout>,
    pub params: &'static Known<ParamsLayout>,
    /// `None`: sequences are not read (no known ubatch, or no hook for it).
    pub ubatch: Option<&'static Known<UbatchLayout>>,
    /// Where the buffer probes read; user space checks it against the
    /// build's own `ggml_backend_buffer_set_usage` (`live::buffer_layout`).
    pub buffer: &'static Known<BufferLayout>,
    /// `false`: known only so the refusal can name it (ttrace's hooks do not exist there).
    pub supported: bool,
    /// llama-cpp-python versions of the range the tests trace.
    pub tested: &'static [&'static str],
    /// What else a user of the range should know (the README shows it).
    pub note: &'static str,
}

impl Release {
    /// The layout the probes get for a build of this release.
    pub const fn layout(&self) -> GgmlLayout {
        GgmlLayout {
            valid: 1,
            tensor: self.tensor.layout,
            cgraph: self.cgraph.layout,
            params: self.params.layout,
            ubatch: match self.ubatch {
                Some(u) => u.layout,
                None => GgmlLayout::UNSET.ubatch,
            },
            buffer: self.buffer.layout,
        }
    }
}

/// The CPU backend's per-node hook ttrace needs: it appeared with the
/// `grad` removal, and tells a Dec 2024+ build without `ggml_version()` from
/// an older one.
const EXTRA_HOOK: &str = "ggml_cpu_extra_compute_forward";

pub const RELEASES: &[Release] = &[
    Release {
        name: "before-2024-12",
        dates: span("", "Nov 2024"),
        commits: span("", "74d73dc"),
        pypi: span("", "0.3.2"),
        ggml: GgmlVersions::None,
        defines: &["ggml_op_name"],
        lacks: &[EXTRA_HOOK],
        tensor: &TENSOR_WITH_GRAD,
        cgraph: &CGRAPH_2023,
        params: &PARAMS_2024,
        ubatch: None,
        buffer: &BUFFER_2024,
        supported: false,
        tested: &["0.3.2"],
        note: "`ggml_tensor` still has `grad`, and the CPU backend no per-node hook",
    },
    Release {
        name: "2024-12",
        dates: span("Dec 2024", "Jul 2025"),
        commits: span("ce8784b", "8846aac"),
        pypi: span("0.3.3", "0.3.11"),
        ggml: GgmlVersions::None,
        defines: &[EXTRA_HOOK],
        lacks: &[],
        tensor: &TENSOR_2024_12,
        cgraph: &CGRAPH_2024,
        params: &PARAMS_2024,
        ubatch: Some(&UBATCH_2025),
        buffer: &BUFFER_2024,
        supported: true,
        tested: &["0.3.3"],
        note: "sequences from 0.3.10 on (before, llama.cpp has no `llama_context::process_ubatch`)",
    },
    Release {
        name: "2025-07",
        dates: span("Jul 2025", "Apr 2026"),
        commits: span("a0374a6", "f49e917"),
        pypi: span("0.3.12", "0.3.20"),
        ggml: GgmlVersions::Range(GgmlVersion::new(0, 0, 0), GgmlVersion::new(0, 9, 11)),
        defines: &[EXTRA_HOOK],
        lacks: &[],
        tensor: &TENSOR_2024_12,
        cgraph: &CGRAPH_2025,
        params: &PARAMS_2024,
        ubatch: Some(&UBATCH_2025),
        buffer: &BUFFER_2024,
        supported: true,
        tested: &["0.3.16"],
        note: "no `ggml_cgraph.uid`: every graph is read whole at every run",
    },
    Release {
        name: "2026-04",
        dates: span("Apr 2026", "Oct 2026"),
        commits: span("f535774", "0c1e570"),
        pypi: span("0.3.21", "0.3.36"),
        ggml: GgmlVersions::Range(GgmlVersion::new(0, 10, 0), GgmlVersion::new(0, 25, 3)),
        defines: &[EXTRA_HOOK],
        lacks: &[],
        tensor: &TENSOR_2024_12,
        cgraph: &CGRAPH_2026,
        params: &PARAMS_2024,
        ubatch: Some(&UBATCH_2025),
        buffer: &BUFFER_2026,
        supported: true,
        tested: &["0.3.30", "0.3.36"],
        note: "",
    },
];

/// Every symbol some release is recognised by.
pub fn fingerprint_symbols() -> impl Iterator<Item = &'static str> {
    RELEASES.iter().flat_map(|r| r.defines.iter().chain(r.lacks.iter()).copied())
}

/// The release a build belongs to: the one whose version range holds its
/// `ggml_version()` (`None`: it has none) and whose symbol rules it meets.
pub fn release_of(ggml_version: Option<GgmlVersion>, defines: &dyn Fn(&str) -> bool) -> Option<&'static Release> {
    let mut matching = RELEASES.iter().filter(|r| {
        r.ggml.matches(ggml_version) && r.defines.iter().all(|s| defines(s)) && !r.lacks.iter().any(|s| defines(s))
    });
    let first = matching.next()?;
    // Overlapping rules would make the choice arbitrary: no choice then.
    matching.next().is_none().then_some(first)
}

pub const fn max_tensor_size() -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < RELEASES.len() {
        let size = RELEASES[i].tensor.layout.size as usize;
        if size > max {
            max = size;
        }
        i += 1;
    }
    max
}

// The offsets as each version's source has them, so a mirror that drifts
// from its table (or a table from the source) fails the build.
const _: () = {
    let t = TENSOR_2024_12.layout;
    assert!(t.size == 336 && t.type_ == 0 && t.ne == 16 && t.nb == 48 && t.op == 80 && t.op_params == 84);
    assert!(t.flags == 148 && t.src == 152 && t.view_src == 232 && t.view_offs == 240 && t.data == 248);
    assert!(t.name == 256 && t.extra == 320);
    let g = TENSOR_WITH_GRAD.layout;
    assert!(g.size == 336 && g.flags == 148 && g.src == 160 && g.view_src == 240 && g.data == 256);
    assert!(g.name == 264 && g.extra == 328);
    assert!(CGRAPH_2023.layout.bytes == 72 && CGRAPH_2024.layout.bytes == 80 && CGRAPH_2025.layout.bytes == 88);
    let c = CGRAPH_2026.layout;
    assert!(c.bytes == 96 && c.size == 0 && c.n_nodes == 4 && c.nodes == 16 && c.uid == 88);
    assert!(PARAMS_2024.layout.ith == 0 && PARAMS_2024.layout.nth == 4);
    let u = UBATCH_2025.layout;
    assert!(u.size == 88 && u.n_tokens == 4 && u.token == 24 && u.pos == 40 && u.seq_id == 56 && u.output == 80);
    let (b, n) = (BUFFER_2024.layout, BUFFER_2026.layout);
    assert!(b.buft == 0x48 && b.context == 0x50 && b.size == 0x58 && b.usage == 0x60);
    assert!(n.buft == 0x58 && n.context == 0x60 && n.size == 0x68 && n.usage == 0x70);
    // Every table is usable by the probes as it is.
    let mut i = 0;
    while i < RELEASES.len() {
        assert!(RELEASES[i].layout().check().is_ok());
        i += 1;
    }
};
