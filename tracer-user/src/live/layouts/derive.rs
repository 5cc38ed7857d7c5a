//! Struct layouts read from the target's own code, for builds newer than
//! ttrace's tables (or with them hidden, to test this). ggml exports
//! one-line accessors for most of what the probes read: `ggml_get_name` is
//! `lea 0x100(%rdi), %rax`. Fields without an accessor follow from their
//! neighbours in ggml's declaration (`src`, `view_src` and `view_offs` lie
//! between `flags` and `data`), and each such step must land on a field
//! read from code on its other side. What is not found, or does not fit, is
//! a [`Gap`], and the caller refuses or turns that feature off. The live
//! check still gates every trace.

use std::{collections::HashMap, path::Path};

use tracer_common::{
    ggml::{MAX_NAME, MAX_SRC},
    layout::{ABSENT, BufferLayout, CgraphLayout, TensorLayout, UbatchLayout},
};

use super::ubatch::UBATCH_FROM;
use crate::live::target::{
    TargetError,
    code::{Access, Use, accesses, accesses_of, counter_stores, is_counter_increment, returned_constant},
    elf,
};

/// Functions whose code gives `ggml_tensor`'s offsets.
pub const TENSOR_FROM: [&str; 10] = [
    "ggml_element_size",
    "ggml_nelements",
    "ggml_is_transposed",
    "ggml_op_desc",
    "ggml_get_unary_op",
    "ggml_set_input",
    "ggml_set_output",
    "ggml_get_data",
    "ggml_get_name",
    "ggml_tensor_overhead",
];
/// ... `ggml_cgraph`'s (`ggml_graph_next_uid` only by being there; it and
/// `ggml_graph_view` only for `uid`, or else `ggml_graph_cpy` and the
/// scheduler's [`SCHED_SPLIT`]).
pub const CGRAPH_FROM: [&str; 7] = [
    "ggml_graph_size",
    "ggml_graph_n_nodes",
    "ggml_graph_nodes",
    "ggml_graph_view",
    "ggml_graph_next_uid",
    GRAPH_CPY,
    SCHED_SPLIT,
];
/// Copies `order`, the member declared before `uid`.
const GRAPH_CPY: &str = "ggml_graph_cpy";
/// Gives each graph it splits a fresh uid (`graph->uid = ggml_graph_next_uid()`),
/// the counter inlined or called in the library: how a stripped build, which
/// exports neither `ggml_graph_view` nor `ggml_graph_next_uid`, shows `uid`.
const SCHED_SPLIT: &str = "ggml_backend_sched_split_graph";
/// Bytes of it read (Debian's ggml 0.27 sets the uid at +0xc2 of 8.3 KiB).
const SCHED_SPLIT_BYTES: u64 = 16 << 10;
/// Bytes read of each function it calls: the counter's increment is 19.
const CALLEE_BYTES: u64 = 32;
/// ... `ggml_backend_buffer`'s.
pub const BUFFER_FROM: [&str; 4] = [
    "ggml_backend_buffer_get_type",
    "ggml_backend_buffer_get_size",
    "ggml_backend_buffer_get_usage",
    "ggml_backend_buffer_set_usage",
];

/// Bytes of code read per function: every accessor is far shorter.
const CODE_BYTES: u64 = 256;
/// `sizeof(struct ggml_object)`, which `ggml_tensor_overhead()` adds to the
/// tensor's size (offs, size, next, type, 4 bytes of padding: unchanged since 2023).
const OBJECT_BYTES: u64 = 32;

/// Why a struct's layout could not be derived: the field, and what the code showed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Gap {
    pub field: &'static str,
    pub why: String,
}

/// What the code gave, struct by struct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub tensor: Result<TensorLayout, Gap>,
    pub cgraph: Result<CgraphLayout, Gap>,
    pub buffer: Result<BufferLayout, Gap>,
    pub ubatch: Result<UbatchLayout, Gap>,
}

/// Derives from `lib`, the file that defines ggml's base functions
/// (`libggml-base.so`, or a program or library with ggml linked in), and
/// `llama`, the one with `llama_context::process_ubatch`, if any.
pub fn derive(lib: &Path, llama: Option<&Path>) -> Result<Derived, TargetError> {
    let names: Vec<&str> = TENSOR_FROM.iter().chain(&CGRAPH_FROM).chain(&BUFFER_FROM).copied().collect();
    let heads = elf::function_heads(lib, &names, CODE_BYTES)?;
    let mut code: Code = names.into_iter().zip(heads).filter_map(|(n, c)| Some((n, c?))).collect();
    let uid_stores = uid_stores(lib)?;
    let Some(llama) = llama else {
        let no_hook = gap("llama_ubatch", "the build has no llama_context::process_ubatch to read it at".into());
        return Ok(Derived { ubatch: Err(no_hook), ..from_code(&code, &uid_stores) });
    };
    let heads = elf::function_heads(llama, &UBATCH_FROM, CODE_BYTES)?;
    code.extend(UBATCH_FROM.into_iter().zip(heads).filter_map(|(n, c)| Some((n, c?))));
    Ok(from_code(&code, &uid_stores))
}

/// Where [`SCHED_SPLIT`] stores the counter's values: a graph's `uid`
/// (and its splits', further into their struct). None where it is not
/// defined or calls no such counter.
fn uid_stores(lib: &Path) -> Result<Vec<u32>, TargetError> {
    let Some(calls) = elf::function_calls(lib, SCHED_SPLIT, SCHED_SPLIT_BYTES, CALLEE_BYTES)? else {
        return Ok(Vec::new());
    };
    let counters: Vec<u64> =
        calls.callees.iter().filter(|(_, head)| is_counter_increment(head)).map(|(at, _)| *at).collect();
    Ok(counter_stores(&calls.code, calls.ip, &counters))
}

/// Functions' code by name (the head of each, as far as an accessor goes).
pub type Code<'a> = HashMap<&'a str, Vec<u8>>;

/// Derives from the code of the functions in `code`, and the offsets the
/// scheduler stores fresh graph uids at.
pub fn from_code(code: &Code<'_>, uid_stores: &[u32]) -> Derived {
    let r = Reader { code, uid_stores };
    Derived { tensor: tensor(&r), cgraph: cgraph(&r), buffer: buffer(&r), ubatch: super::ubatch::from_code(code) }
}

struct Reader<'a> {
    code: &'a Code<'a>,
    uid_stores: &'a [u32],
}

impl Reader<'_> {
    fn code(&self, function: &str) -> Option<&[u8]> {
        self.code.get(function).map(Vec::as_slice)
    }

    fn uses(&self, field: &'static str, function: &str) -> Result<Vec<Access>, Gap> {
        let code = self.code(function).ok_or_else(|| gap(field, format!("the build has no {function}")))?;
        Ok(accesses(code))
    }

    /// The offset `pick` finds among `function`'s uses of its argument.
    fn field(&self, field: &'static str, function: &str, pick: impl Fn(&[Access]) -> Option<u32>) -> Result<u32, Gap> {
        let uses = self.uses(field, function)?;
        pick(&uses).ok_or_else(|| gap(field, format!("{function} does not read it as ggml's accessor does")))
    }
}

fn gap(field: &'static str, why: String) -> Gap {
    Gap { field, why }
}

/// The first use of this kind and width.
fn first(how: Use, width: u32) -> impl Fn(&[Access]) -> Option<u32> {
    move |uses| uses.iter().find(|a| a.how == how && (how == Use::Address || a.width == width)).map(|a| a.offset)
}

/// The start of `n` adjacent 8-byte reads, the only ones there are
/// (`ne[0..4]` in `ggml_nelements`, `nb[0..2]` in `ggml_is_transposed`).
fn array_of(n: u32) -> impl Fn(&[Access]) -> Option<u32> {
    move |uses| {
        let mut offsets: Vec<u32> =
            uses.iter().filter(|a| a.how == Use::Read && a.width == 8).map(|a| a.offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        let start = *offsets.first()?;
        (offsets.len() == n as usize && offsets.iter().zip(0..).all(|(&o, i)| o == start + 8 * i)).then_some(start)
    }
}

fn tensor(r: &Reader<'_>) -> Result<TensorLayout, Gap> {
    let type_ = r.field("ggml_tensor.type", "ggml_element_size", first(Use::Read, 4))?;
    let ne = r.field("ggml_tensor.ne", "ggml_nelements", array_of(4))?;
    let nb = r.field("ggml_tensor.nb", "ggml_is_transposed", array_of(2))?;
    let op = r.field("ggml_tensor.op", "ggml_op_desc", first(Use::Read, 4))?;
    let unary = r.uses("ggml_tensor.op_params", "ggml_get_unary_op")?;
    // `t->op == GGML_OP_UNARY`, then `op_params[0]`.
    let read_4: Vec<u32> = unary.iter().filter(|a| a.how == Use::Read && a.width == 4).map(|a| a.offset).collect();
    if read_4.first() != Some(&op) {
        return Err(gap("ggml_tensor.op", format!("ggml_op_desc reads it at {op}, ggml_get_unary_op at {read_4:?}")));
    }
    let op_params = read_4
        .iter()
        .copied()
        .find(|&o| o != op)
        .ok_or_else(|| gap("ggml_tensor.op_params", "ggml_get_unary_op reads no field besides op".to_string()))?;
    let flags = r.field("ggml_tensor.flags", "ggml_set_input", first(Use::Update, 4))?;
    let data = r.field("ggml_tensor.data", "ggml_get_data", first(Use::Read, 8))?;
    let name = r.field("ggml_tensor.name", "ggml_get_name", first(Use::Address, 0))?;
    let overhead = r
        .code("ggml_tensor_overhead")
        .and_then(returned_constant)
        .ok_or_else(|| gap("ggml_tensor.(size)", "ggml_tensor_overhead does not return a constant".into()))?;
    let size = u32::try_from(overhead.saturating_sub(OBJECT_BYTES)).unwrap_or(0);
    // ggml declares src[GGML_MAX_SRC], view_src and view_offs between flags and data.
    let src = (flags + 4).next_multiple_of(8);
    let view_src = src + 8 * MAX_SRC as u32;
    let view_offs = view_src + 8;
    if view_offs + 8 != data {
        return Err(gap(
            "ggml_tensor.src",
            format!(
                "flags at {flags} and data at {data} leave room for something else than src[{MAX_SRC}], view_src \
                 and view_offs"
            ),
        ));
    }
    // Builds from 2025 walk view_src in ggml_set_output: one more witness.
    if let Some(walked) = r.code("ggml_set_output").map(accesses).and_then(|u| first(Use::Read, 8)(&u))
        && walked != view_src
    {
        return Err(gap(
            "ggml_tensor.view_src",
            format!("at {view_src} by its neighbours, {walked} in ggml_set_output"),
        ));
    }
    let layout = TensorLayout {
        size,
        type_,
        ne,
        nb,
        op,
        op_params,
        flags,
        src,
        view_src,
        view_offs,
        data,
        name,
        extra: name + MAX_NAME as u32,
    };
    // Adjacent in the declaration: ne[4] nb[4] op op_params[16] flags, and data name.
    if ne <= type_ {
        return Err(gap("ggml_tensor.ne", format!("read at {ne} by its accessor, before type at {type_}")));
    }
    let order = [
        ("ggml_tensor.nb", nb, ne + 32, "after ne[4]"),
        ("ggml_tensor.op", op, nb + 32, "after nb[4]"),
        ("ggml_tensor.op_params", op_params, op + 4, "after op"),
        ("ggml_tensor.flags", flags, op_params + 64, "after op_params[16]"),
        ("ggml_tensor.name", name, data + 8, "after data"),
    ];
    if let Some((field, at, want, after)) = order.iter().find(|(_, at, want, _)| at != want) {
        return Err(gap(field, format!("read at {at} by its accessor, not at {want}, right {after}")));
    }
    layout.check().map_err(|e| gap("ggml_tensor.(size)", e.to_string()))?;
    Ok(layout)
}

fn cgraph(r: &Reader<'_>) -> Result<CgraphLayout, Gap> {
    let size = r.field("ggml_cgraph.size", "ggml_graph_size", first(Use::Read, 4))?;
    let n_nodes = r.field("ggml_cgraph.n_nodes", "ggml_graph_n_nodes", first(Use::Read, 4))?;
    let nodes = r.field("ggml_cgraph.nodes", "ggml_graph_nodes", first(Use::Read, 8))?;
    // ggml_graph_view returns a whole ggml_cgraph: its stores span the
    // struct, but for the padding after a last `int` (it holds pointers).
    // `uid` came with ggml_graph_next_uid() (ggml 0.10), as the last member.
    let spanned = r.code("ggml_graph_view").map(accesses).and_then(|uses| {
        uses.iter().filter(|a| a.how == Use::Write).map(|a| (a.offset + a.width).next_multiple_of(8)).max()
    });
    let (bytes, uid) = match spanned {
        Some(bytes) if r.code("ggml_graph_next_uid").is_some() => (bytes, bytes.saturating_sub(8)),
        Some(bytes) => (bytes, ABSENT),
        // A stripped build may export neither (Debian's ggml 0.27).
        None => match stored_uid(r, nodes) {
            Some(uid) => (uid + 8, uid),
            // No `uid` is read, and every graph is read whole at every run.
            None => (nodes + 8, ABSENT),
        },
    };
    let layout = CgraphLayout { bytes, size, n_nodes, nodes, uid };
    if !(size < n_nodes && n_nodes < nodes && (uid == ABSENT || nodes < uid)) {
        return Err(gap("ggml_cgraph.nodes", format!("out of ggml's declaration order in {layout:?}")));
    }
    layout.check().map_err(|e| gap("ggml_cgraph.(size)", e.to_string()))?;
    Ok(layout)
}

/// `uid` where two readings of the code agree: right after `order` (the
/// `int` ggml_graph_cpy copies past `nodes`), and where the scheduler
/// stores a fresh uid. A wrong `uid` would take a rebuilt graph for the
/// last one, so one reading alone is not enough.
fn stored_uid(r: &Reader<'_>, nodes: u32) -> Option<u32> {
    let copy = r.code(GRAPH_CPY)?;
    let read = accesses(copy);
    let written = accesses_of(copy, iced_x86::Register::RSI);
    let order = read.iter().find(|a| {
        a.offset > nodes
            && a.how == Use::Read
            && a.width == 4
            && written.iter().any(|w| w.offset == a.offset && w.how == Use::Write && w.width == 4)
    })?;
    let uid = (order.offset + 4).next_multiple_of(8);
    r.uid_stores.contains(&uid).then_some(uid)
}

fn buffer(r: &Reader<'_>) -> Result<BufferLayout, Gap> {
    let buft = r.field("ggml_backend_buffer.buft", "ggml_backend_buffer_get_type", first(Use::Read, 8))?;
    let size = r.field("ggml_backend_buffer.size", "ggml_backend_buffer_get_size", first(Use::Read, 8))?;
    let usage = r.field("ggml_backend_buffer.usage", "ggml_backend_buffer_get_usage", first(Use::Read, 4))?;
    let stored = r.field("ggml_backend_buffer.usage", "ggml_backend_buffer_set_usage", first(Use::Write, 4))?;
    if stored != usage {
        return Err(gap("ggml_backend_buffer.usage", format!("read at {usage}, written at {stored}")));
    }
    // iface, buft, context, size, usage: context lies between buft and size.
    let context = buft + 8;
    if size != context + 8 || usage != size + 8 {
        return Err(gap(
            "ggml_backend_buffer.context",
            format!("buft at {buft}, size at {size} and usage at {usage} are not ggml's buft, context, size, usage"),
        ));
    }
    let layout = BufferLayout { buft, context, size, usage };
    layout.check().map_err(|e| gap("ggml_backend_buffer.buft", e.to_string()))?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use tracer_common::layout::known::{BUFFER_2026, CGRAPH_2026, TENSOR_2024_12};

    use super::*;

    /// ggml 0.26's accessors, as xllamacpp's build compiles them (CET-free)
    /// and as Debian's does (each after an `endbr64`).
    fn accessors(endbr: bool) -> HashMap<&'static str, Vec<u8>> {
        let code: [(&str, &[u8]); 18] = [
            ("ggml_element_size", &[0x8b, 0x3f, 0xe9, 0, 0, 0, 0]),
            (
                "ggml_nelements",
                &[
                    0x48, 0x8b, 0x47, 0x10, 0x48, 0x0f, 0xaf, 0x47, 0x18, 0x48, 0x0f, 0xaf, 0x47, 0x20, 0x48, 0x0f,
                    0xaf, 0x47, 0x28, 0xc3,
                ],
            ),
            ("ggml_is_transposed", &[0x48, 0x8b, 0x47, 0x38, 0x48, 0x39, 0x47, 0x30, 0x0f, 0x97, 0xc0, 0xc3]),
            ("ggml_op_desc", &[0x48, 0x83, 0xec, 0x08, 0x44, 0x8b, 0x47, 0x50, 0x41, 0x83, 0xf8, 0x5b]),
            ("ggml_get_unary_op", &[0x83, 0x7f, 0x50, 0x5b, 0x75, 0x04, 0x8b, 0x47, 0x54, 0xc3]),
            (
                "ggml_set_input",
                &[0x8b, 0x57, 0x50, 0x85, 0xd2, 0x75, 0x08, 0x83, 0x8f, 0x94, 0x00, 0x00, 0x00, 0x01, 0xc3],
            ),
            ("ggml_set_output", &[0x83, 0x8f, 0x94, 0, 0, 0, 0x02, 0x48, 0x8b, 0xbf, 0xe8, 0, 0, 0, 0xc3]),
            ("ggml_get_data", &[0x48, 0x8b, 0x87, 0xf8, 0, 0, 0, 0xc3]),
            ("ggml_get_name", &[0x48, 0x8d, 0x87, 0x00, 0x01, 0, 0, 0xc3]),
            ("ggml_tensor_overhead", &[0xb8, 0x70, 0x01, 0, 0, 0xc3]),
            ("ggml_graph_size", &[0x8b, 0x07, 0xc3]),
            ("ggml_graph_n_nodes", &[0x8b, 0x47, 0x04, 0xc3]),
            ("ggml_graph_nodes", &[0x48, 0x8b, 0x47, 0x10, 0xc3]),
            // mov %rdi,%rax; movl $0,(%rax); movq $0,0x58(%rax); ret
            ("ggml_graph_view", &[0x48, 0x89, 0xf8, 0xc7, 0, 0, 0, 0, 0, 0x48, 0xc7, 0x40, 0x58, 0, 0, 0, 0, 0xc3]),
            ("ggml_graph_next_uid", &[0xc3]),
            ("ggml_backend_buffer_get_type", &[0x48, 0x85, 0xff, 0x74, 0x05, 0x48, 0x8b, 0x47, 0x58, 0xc3]),
            ("ggml_backend_buffer_get_size", &[0x48, 0x85, 0xff, 0x74, 0x05, 0x48, 0x8b, 0x47, 0x68, 0xc3]),
            ("ggml_backend_buffer_get_usage", &[0x48, 0x85, 0xff, 0x74, 0x04, 0x8b, 0x47, 0x70, 0xc3]),
        ];
        let mut map: HashMap<&str, Vec<u8>> = code
            .iter()
            .map(|(n, c)| (*n, if endbr { [&tracer_common::ENDBR64[..], c].concat() } else { c.to_vec() }))
            .collect();
        // push %r12; push %rbp; sub $8,%rsp; test %rdi,%rdi; je; mov %esi,0x70(%rdi)
        map.insert(
            "ggml_backend_buffer_set_usage",
            vec![0x41, 0x54, 0x55, 0x48, 0x83, 0xec, 0x08, 0x48, 0x85, 0xff, 0x74, 0x10, 0x89, 0x77, 0x70],
        );
        map
    }

    fn derived(code: &Code<'_>) -> Derived {
        from_code(code, &[])
    }

    #[test]
    fn ggml_accessors_give_the_tables_offsets_with_and_without_endbr64() {
        for endbr in [false, true] {
            let d = derived(&accessors(endbr));
            assert_eq!(d.tensor, Ok(TENSOR_2024_12.layout), "endbr64 {endbr}");
            assert_eq!(d.cgraph, Ok(CGRAPH_2026.layout));
            assert_eq!(d.buffer, Ok(BUFFER_2026.layout));
        }
    }

    #[test]
    fn a_moved_field_or_a_missing_accessor_is_a_gap() {
        let mut code = accessors(false);
        // ggml_get_name at 0x108: no longer 8 after data.
        code.insert("ggml_get_name", vec![0x48, 0x8d, 0x87, 0x08, 0x01, 0, 0, 0xc3]);
        assert_eq!(derived(&code).tensor.unwrap_err().field, "ggml_tensor.name");
        let mut code = accessors(false);
        code.remove("ggml_get_unary_op");
        let gap = derived(&code).tensor.unwrap_err();
        assert_eq!(gap.field, "ggml_tensor.op_params");
        assert!(gap.why.contains("no ggml_get_unary_op"), "{gap}");
        let mut code = accessors(false);
        // get_data at 0x100: something was inserted before data.
        code.insert("ggml_get_data", vec![0x48, 0x8b, 0x87, 0x00, 0x01, 0, 0, 0xc3]);
        assert_eq!(derived(&code).tensor.unwrap_err().field, "ggml_tensor.src");
        let mut code = accessors(false);
        code.remove("ggml_graph_next_uid");
        assert_eq!(derived(&code).cgraph.map(|c| c.uid), Ok(ABSENT));
        // Debian's stripped ggml 0.27 exports neither ggml_graph_view nor ggml_graph_next_uid.
        code.remove("ggml_graph_view");
        let cgraph = derived(&code).cgraph.unwrap();
        assert_eq!((cgraph.n_nodes, cgraph.nodes, cgraph.uid), (4, 16, ABSENT));
    }

    /// Its ggml_graph_cpy's first 0x5c bytes: `order` read at 0x50 through
    /// RDI (and RBP, a copy), written at 0x50 through RBX (RSI's copy).
    const DEBIAN_GRAPH_CPY: [u8; 0x5c] = [
        0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x68, 0x8b, 0x06, 0x8b, 0x4f, 0x08, 0x39, 0xc8, 0x0f, 0x8c, 0x72,
        0x04, 0x00, 0x00, 0x3b, 0x47, 0x04, 0x48, 0x8b, 0x57, 0x04, 0x48, 0x89, 0x6c, 0x24, 0x40, 0x48, 0x89, 0xfd,
        0x48, 0x89, 0x5c, 0x24, 0x38, 0x0f, 0x8c, 0x23, 0x04, 0x00, 0x00, 0x4c, 0x89, 0x7c, 0x24, 0x60, 0x48, 0x89,
        0xf3, 0x4c, 0x8b, 0x7f, 0x38, 0x48, 0x8b, 0x76, 0x38, 0x4c, 0x39, 0xfe, 0x0f, 0x82, 0xda, 0x03, 0x00, 0x00,
        0x4c, 0x89, 0x6c, 0x24, 0x50, 0x4c, 0x89, 0x74, 0x24, 0x58, 0x48, 0x89, 0x53, 0x04, 0x8b, 0x47, 0x50, 0x89,
        0x43, 0x50,
    ];

    #[test]
    fn a_stripped_build_shows_uid_where_graph_cpy_and_the_scheduler_agree() {
        let mut code = accessors(true);
        code.remove("ggml_graph_view");
        code.remove("ggml_graph_next_uid");
        code.insert(GRAPH_CPY, DEBIAN_GRAPH_CPY.to_vec());
        // The scheduler's stores of fresh uids: the graph's, then a split's.
        assert_eq!(from_code(&code, &[0x58, 0x160]).cgraph, Ok(CGRAPH_2026.layout));
        // The two readings disagree, or one is missing: no uid is read.
        assert_eq!(from_code(&code, &[0x60]).cgraph.map(|c| c.uid), Ok(ABSENT));
        assert_eq!(from_code(&code, &[]).cgraph.map(|c| c.uid), Ok(ABSENT));
        code.remove(GRAPH_CPY);
        assert_eq!(from_code(&code, &[0x58]).cgraph.map(|c| c.uid), Ok(ABSENT));
    }
}
