//! Which struct layouts a target gets: its build's facts matched against
//! the known releases (`tracer_common::layout::known`, data), never assumed.
//! A build no release matches, or one ttrace cannot trace, is refused in
//! one line that names the struct, the version found and the versions
//! supported. A release whose `llama_ubatch` is unknown, or a build without
//! the function the ubatch probe needs, keeps everything but sequences.

use std::collections::BTreeMap;

use tracer_common::layout::{
    ABSENT, GgmlLayout,
    known::{GgmlVersion, GgmlVersions, RELEASES, Release},
};

use crate::{
    format::{Disabled, TargetBuild},
    live::target::BuildFacts,
};

pub mod derive;
mod ubatch;

use derive::Derived;

/// Changes offsets of the chosen layout by hand: `struct.field=N` (or
/// `=absent` for `ggml_cgraph.uid`), comma-separated. For tests that make a
/// layout wrong on purpose, and for trying a new version's offsets before
/// adding its table; the header records it, and the live check still runs.
pub const PATCH_ENV: &str = "TTRACE_LAYOUT_PATCH";

/// Set to `off`, ttrace ignores its tables and reads every layout from the
/// target's code (`derive`), as for a build newer than the tables: a test
/// switch, which the header records.
pub const TABLES_ENV: &str = "TTRACE_LAYOUT_TABLES";

/// Whether the tables are consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tables {
    Used,
    Hidden,
}

impl Tables {
    pub fn from_env() -> Self {
        match std::env::var(TABLES_ENV) {
            Ok(v) if v.trim() == "off" => Tables::Hidden,
            _ => Tables::Used,
        }
    }
}

/// The layout the probes get, and what the trace header says about it.
#[derive(Debug, Clone)]
pub struct Choice {
    pub release: &'static Release,
    pub layout: GgmlLayout,
    pub build: TargetBuild,
    /// Features off for this build (sequences), with why.
    pub disabled: Vec<Disabled>,
}

/// Why ttrace will not record this target: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{structure}: {found}: {why}; supported: {}; nothing was recorded", supported())]
pub struct Refusal {
    pub structure: &'static str,
    pub found: String,
    pub why: String,
}

impl Refusal {
    /// The live check found a field that does not hold what it must.
    pub fn check_failed(structure: &'static str, choice: &Choice, what: &str) -> Self {
        let table = choice.build.layouts.get(structure).map_or("?", String::as_str);
        Self {
            structure,
            found: found(&choice.build),
            why: format!("the {table} layout does not fit this build ({what})"),
        }
    }
}

fn found(build: &TargetBuild) -> String {
    let version =
        build.ggml_version.as_ref().map_or("a build without ggml_version()".to_string(), |v| format!("ggml {v}"));
    let patched = build.patched.as_ref().map(|p| format!(", offsets patched by {PATCH_ENV}={p}")).unwrap_or_default();
    format!("{version} (llama.cpp {}{patched})", build.release_text)
}

/// The versions ttrace traces, for messages: `llama.cpp Dec 2024 - Oct 2026
/// (llama-cpp-python 0.3.3 - 0.3.36; ggml_version() none, 0.0.0 - 0.25.3)`.
pub fn supported() -> String {
    let rows: Vec<&Release> = RELEASES.iter().filter(|r| r.supported).collect();
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return "nothing".into() };
    let none = rows.iter().any(|r| r.ggml == GgmlVersions::None).then_some("none");
    let range = match (rows.iter().find_map(|r| lo(r.ggml)), rows.iter().rev().find_map(|r| hi(r.ggml))) {
        (Some(lo), Some(hi)) => Some(format!("{lo} - {hi}")),
        _ => None,
    };
    let ggml: Vec<String> = none.map(str::to_string).into_iter().chain(range).collect();
    format!(
        "llama.cpp {} - {} (llama-cpp-python {} - {}; ggml_version() {})",
        first.dates.first,
        last.dates.last,
        first.pypi.first,
        last.pypi.last,
        ggml.join(", ")
    )
}

/// The README's "supported llama.cpp versions" table, from the tables.
pub fn versions_table() -> String {
    let mut out = String::from(
        "| llama.cpp | commits | llama-cpp-python | `ggml_version()` | `ggml_tensor` | `ggml_cgraph` | \
         `ggml_compute_params` | `llama_ubatch` (sequences) | traced by the tests | status |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in RELEASES {
        let status = match (r.supported, r.note) {
            (true, "") => "supported".to_string(),
            (true, note) => format!("supported; {note}"),
            (false, note) => format!("refused, nothing recorded: {note}"),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | `{}` | `{}` | `{}` | {} | {} | {status} |\n",
            r.dates,
            r.commits,
            r.pypi,
            r.ggml,
            r.tensor.name,
            r.cgraph.name,
            r.params.name,
            r.ubatch.map_or_else(|| "none (sequences off)".to_string(), |u| format!("`{}`", u.name)),
            r.tested.join(", "),
        ));
    }
    out
}

fn lo(v: GgmlVersions) -> Option<GgmlVersion> {
    match v {
        GgmlVersions::Range(lo, _) => Some(lo),
        GgmlVersions::None => None,
    }
}

fn hi(v: GgmlVersions) -> Option<GgmlVersion> {
    match v {
        GgmlVersions::Range(_, hi) => Some(hi),
        GgmlVersions::None => None,
    }
}

/// Whether a build's layouts come from its code: it is newer than every
/// table, or the tables are hidden.
pub fn needs_code(facts: &BuildFacts, tables: Tables) -> bool {
    tables == Tables::Hidden || newer_than_known(facts)
}

/// The layout for a build with these facts, from the tables alone.
/// `ubatch_hook`: whether the build has the function the ubatch probe attaches to.
pub fn choose(facts: &BuildFacts, ubatch_hook: bool, patch: Option<&str>) -> Result<Choice, Refusal> {
    choose_from(facts, ubatch_hook, patch, Tables::Used, None)
}

/// The layout for a build with these facts: its release's tables or, for a
/// build newer than all of them (or with the tables hidden), what `derived`
/// read from its code.
pub fn choose_from(
    facts: &BuildFacts,
    ubatch_hook: bool,
    patch: Option<&str>,
    tables: Tables,
    derived: Option<&Derived>,
) -> Result<Choice, Refusal> {
    if needs_code(facts, tables)
        && let Some(derived) = derived
    {
        let why = match tables {
            Tables::Hidden => format!("{TABLES_ENV}=off: layouts read from its code"),
            Tables::Used => "newer than ttrace's tables: layouts read from its code".to_string(),
        };
        return from_code(facts, derived, ubatch_hook, patch, why);
    }
    let version = facts.ggml_version.as_deref().map(|text| (text, GgmlVersion::parse(text)));
    let release = match version {
        Some((text, None)) => {
            return Err(Refusal {
                structure: "ggml_tensor",
                found: format!("ggml_version() returns {text:?}"),
                why: "not a version ttrace can place".into(),
            });
        }
        Some((_, Some(v))) => known_release(Some(v), facts),
        None => known_release(None, facts),
    };
    // A build newer than every table may be tried with hand-made offsets on
    // top of the newest tables (the header records the patch).
    let release = release.or_else(|| patch.filter(|_| newer_than_known(facts)).and_then(|_| newest()));
    let Some(release) = release else {
        return Err(Refusal { structure: "ggml_tensor", found: facts.describe(), why: unplaced(facts) });
    };
    if !release.supported {
        return Err(Refusal {
            structure: "ggml_tensor",
            found: facts.describe(),
            why: format!("that is llama.cpp {} (llama-cpp-python {}): {}", release.dates, release.pypi, release.note),
        });
    }
    let mut layout = release.layout();
    let mut disabled = Vec::new();
    let ubatch = match release.ubatch {
        Some(known) if ubatch_hook => Some(known),
        Some(_) => {
            disabled.push(sequences_off(
                "this build has no llama_context::process_ubatch(const llama_ubatch &, ...) to read it at \
                 (llama.cpp before Jul 2025)",
            ));
            None
        }
        None => {
            disabled.push(sequences_off(&format!("its layout in llama.cpp {} is not known", release.dates)));
            None
        }
    };
    if ubatch.is_none() {
        layout.ubatch = GgmlLayout::UNSET.ubatch;
    }
    if let Some(off) = buffers_off(release, facts) {
        layout.buffer = GgmlLayout::UNSET.buffer;
        disabled.push(off);
    }
    patched(&mut layout, patch)?;
    let mut layouts = BTreeMap::new();
    layouts.insert("ggml_tensor".to_string(), release.tensor.name.to_string());
    layouts.insert("ggml_cgraph".to_string(), release.cgraph.name.to_string());
    layouts.insert("ggml_compute_params".to_string(), release.params.name.to_string());
    if let Some(u) = ubatch.filter(|_| layout.ubatch.known()) {
        layouts.insert("llama_ubatch".to_string(), u.name.to_string());
    }
    if layout.buffer.known() {
        layouts.insert("ggml_backend_buffer".to_string(), release.buffer.name.to_string());
    }
    let release_text = format!("{} ({}; llama-cpp-python {})", release.dates, release.commits, release.pypi);
    let build = target_build(facts, &mut layout, layouts, release.name, release_text, patch);
    Ok(Choice { release, layout, build, disabled })
}

/// What the header records of a build and the layouts chosen for it.
fn target_build(
    facts: &BuildFacts,
    layout: &mut GgmlLayout,
    layouts: BTreeMap<String, String>,
    release: &str,
    release_text: String,
    patch: Option<&str>,
) -> TargetBuild {
    let ubatch_known = layout.ubatch.known();
    let buffer_known = layout.buffer.known();
    let offsets = fields(layout)
        .into_iter()
        .filter(|(name, v)| **v != ABSENT && (ubatch_known || !name.starts_with("llama_ubatch")))
        .filter(|(name, _)| buffer_known || !name.starts_with("ggml_backend_buffer"))
        .map(|(name, v)| (name.to_string(), *v))
        .collect();
    TargetBuild {
        ggml_version: facts.ggml_version.clone(),
        ggml_commit: facts.ggml_commit.clone(),
        llama_commit: facts.llama_commit.clone(),
        llama_build_number: facts.llama_build_number,
        release: release.to_string(),
        release_text,
        layouts,
        offsets,
        patched: patch.map(str::to_string),
    }
}

/// A build's layouts read from its own code. `ggml_tensor` and
/// `ggml_cgraph` or nothing (a gap refuses); a gap in `ggml_backend_buffer`
/// turns buffers off. `ggml_compute_params` comes from the table: its `int
/// ith, nth` have led the struct since 2023, and the code that reads them is
/// no accessor. `llama_ubatch` comes from libllama's graph inputs
/// (`ubatch`); a gap there turns sequences off.
fn from_code(
    facts: &BuildFacts,
    derived: &Derived,
    ubatch_hook: bool,
    patch: Option<&str>,
    why: String,
) -> Result<Choice, Refusal> {
    let refuse = |structure: &'static str, gap: &derive::Gap| Refusal {
        structure,
        found: facts.describe(),
        why: format!("its layout is not in ttrace's tables and could not be read from its code ({gap})"),
    };
    let tensor = derived.tensor.as_ref().map_err(|g| refuse("ggml_tensor", g))?;
    let cgraph = derived.cgraph.as_ref().map_err(|g| refuse("ggml_cgraph", g))?;
    // Hooks and features as in the newest release.
    let release = newest().ok_or_else(|| refuse("ggml_tensor", &derive::Gap { field: "", why: "no tables".into() }))?;
    let mut layout = GgmlLayout { tensor: *tensor, cgraph: *cgraph, ..release.layout() };
    layout.ubatch = GgmlLayout::UNSET.ubatch;
    layout.buffer = GgmlLayout::UNSET.buffer;
    let mut disabled = Vec::new();
    let derived_name = |structure: &str, from: usize| format!("{structure}/derived from {from} functions of its code");
    let mut layouts = BTreeMap::new();
    layouts.insert("ggml_tensor".to_string(), derived_name("ggml_tensor", derive::TENSOR_FROM.len()));
    layouts.insert("ggml_cgraph".to_string(), derived_name("ggml_cgraph", derive::CGRAPH_FROM.len()));
    layouts.insert("ggml_compute_params".to_string(), release.params.name.to_string());
    match &derived.ubatch {
        Ok(ubatch) if ubatch_hook => {
            layout.ubatch = *ubatch;
            layouts.insert("llama_ubatch".into(), derived_name("llama_ubatch", ubatch::UBATCH_FROM.len()));
        }
        Ok(_) => disabled.push(sequences_off(
            "this build has no llama_context::process_ubatch(const llama_ubatch &, ...) to read it at",
        )),
        Err(gap) => disabled.push(sequences_off(&format!("its layout could not be read from its code ({gap})"))),
    }
    let buffers_off =
        |reason: String| Disabled { feature: "buffers".into(), structure: "ggml_backend_buffer".into(), reason };
    match &derived.buffer {
        Ok(_) if !facts.defines(crate::live::target::SET_USAGE) => {
            disabled.push(buffers_off("this build has no ggml_backend_buffer_set_usage symbol".into()));
        }
        Ok(buffer) => {
            layout.buffer = *buffer;
            layouts
                .insert("ggml_backend_buffer".into(), derived_name("ggml_backend_buffer", derive::BUFFER_FROM.len()));
        }
        Err(gap) => disabled.push(buffers_off(format!("its layout could not be read from its code ({gap})"))),
    }
    patched(&mut layout, patch)?;
    let build = target_build(facts, &mut layout, layouts, TargetBuild::DERIVED, why, patch);
    Ok(Choice { release, layout, build, disabled })
}

fn known_release(version: Option<GgmlVersion>, facts: &BuildFacts) -> Option<&'static Release> {
    tracer_common::layout::known::release_of(version, &|symbol| facts.defines(symbol))
}

fn newest() -> Option<&'static Release> {
    RELEASES.iter().filter(|r| r.supported).max_by_key(|r| hi(r.ggml))
}

fn newer_than_known(facts: &BuildFacts) -> bool {
    let found = facts.ggml_version.as_deref().and_then(GgmlVersion::parse);
    matches!((found, newest().and_then(|r| hi(r.ggml))), (Some(v), Some(newest)) if v > newest)
}

/// Why no release matched, in the terms of the rules.
fn unplaced(facts: &BuildFacts) -> String {
    let newest = RELEASES.iter().filter_map(|r| hi(r.ggml)).max();
    match (facts.ggml_version.as_deref().and_then(GgmlVersion::parse), newest) {
        (Some(v), Some(newest)) if v > newest => format!(
            "newer than any llama.cpp ttrace knows (ggml {newest}): its layouts are not checked yet \
             (to try the newest tables on it, set {PATCH_ENV}, e.g. to ggml_tensor.name={})",
            newest_name_offset()
        ),
        _ if !facts.defines("ggml_op_name") => "not a ggml build ttrace recognises".into(),
        _ => "no llama.cpp release ttrace knows matches it".into(),
    }
}

/// MoE routing needs `ggml_compute_forward_argsort` or, where that has no
/// symbol, `ggml_compute_forward_mul_mat_id` (a local one: stripped builds lack it).
pub fn routing_off() -> Disabled {
    Disabled {
        feature: "MoE routing".into(),
        structure: "ggml_compute_forward_argsort".into(),
        reason: "this build has no symbol for ggml_compute_forward_argsort nor ggml_compute_forward_mul_mat_id \
                 (a stripped build from before 2025?)"
            .into(),
    }
}

fn newest_name_offset() -> u32 {
    newest().map_or(0, |r| r.tensor.layout.name)
}

/// Buffers are off where the build has no `ggml_backend_buffer_set_usage`
/// to probe, or where its code stores `usage` elsewhere than the table says
/// (a release range whose interface grew inside it). Code ttrace does not
/// decode leaves the table's word standing.
fn buffers_off(release: &Release, facts: &BuildFacts) -> Option<Disabled> {
    let table = release.buffer.layout.usage;
    let reason = match facts.buffer_usage {
        _ if !facts.defines(crate::live::target::SET_USAGE) => {
            "this build has no ggml_backend_buffer_set_usage symbol".to_string()
        }
        Some(found) if found != table => format!(
            "its ggml_backend_buffer_set_usage stores usage at offset {found}, the {} table at {table}",
            release.buffer.name
        ),
        _ => return None,
    };
    Some(Disabled { feature: "buffers".into(), structure: "ggml_backend_buffer".into(), reason })
}

pub fn sequences_off(reason: &str) -> Disabled {
    Disabled { feature: "sequences".into(), structure: "llama_ubatch".into(), reason: reason.into() }
}

/// Every offset of a layout by `struct.field`, as the header and
/// [`PATCH_ENV`] name them.
pub fn fields(l: &mut GgmlLayout) -> [(&'static str, &mut u32); 28] {
    let GgmlLayout { valid: _, tensor: t, cgraph: c, params: p, ubatch: u, buffer: b } = l;
    [
        ("ggml_tensor.size", &mut t.size),
        ("ggml_tensor.type", &mut t.type_),
        ("ggml_tensor.ne", &mut t.ne),
        ("ggml_tensor.nb", &mut t.nb),
        ("ggml_tensor.op", &mut t.op),
        ("ggml_tensor.op_params", &mut t.op_params),
        ("ggml_tensor.flags", &mut t.flags),
        ("ggml_tensor.src", &mut t.src),
        ("ggml_tensor.view_src", &mut t.view_src),
        ("ggml_tensor.view_offs", &mut t.view_offs),
        ("ggml_tensor.data", &mut t.data),
        ("ggml_tensor.name", &mut t.name),
        ("ggml_tensor.extra", &mut t.extra),
        ("ggml_cgraph.size", &mut c.size),
        ("ggml_cgraph.n_nodes", &mut c.n_nodes),
        ("ggml_cgraph.nodes", &mut c.nodes),
        ("ggml_cgraph.uid", &mut c.uid),
        ("ggml_compute_params.ith", &mut p.ith),
        ("ggml_compute_params.nth", &mut p.nth),
        ("llama_ubatch.n_tokens", &mut u.n_tokens),
        ("llama_ubatch.token", &mut u.token),
        ("llama_ubatch.pos", &mut u.pos),
        ("llama_ubatch.seq_id", &mut u.seq_id),
        ("llama_ubatch.output", &mut u.output),
        ("ggml_backend_buffer.buft", &mut b.buft),
        ("ggml_backend_buffer.context", &mut b.context),
        ("ggml_backend_buffer.size", &mut b.size),
        ("ggml_backend_buffer.usage", &mut b.usage),
    ]
}

/// `layout` with [`PATCH_ENV`]'s offsets, if set.
fn patched(layout: &mut GgmlLayout, patch: Option<&str>) -> Result<(), Refusal> {
    let Some(patch) = patch else { return Ok(()) };
    apply_patch(layout, patch).map_err(|why| Refusal {
        structure: "ggml_tensor",
        found: format!("{PATCH_ENV}={patch}"),
        why,
    })
}

/// Applies `struct.field=N,...`; the result must still be one the probes can use.
fn apply_patch(layout: &mut GgmlLayout, patch: &str) -> Result<(), String> {
    for item in patch.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or_else(|| format!("`{item}` is not struct.field=N"))?;
        let value = match value.trim() {
            "absent" => ABSENT,
            v => v.parse::<u32>().map_err(|_| format!("`{item}`: {v:?} is not a byte offset"))?,
        };
        let mut all = fields(layout);
        let slot = all
            .iter_mut()
            .find(|(n, _)| *n == name.trim())
            .ok_or_else(|| format!("`{}` is not a field ttrace reads", name.trim()))?;
        *slot.1 = value;
    }
    layout.check().map_err(|e| format!("the patched layout is unusable: {e}"))
}

#[cfg(test)]
mod tests;
