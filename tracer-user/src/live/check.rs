//! The live check of the struct layouts. A version string only says which
//! layout a build should have; a fork, a patched build or a wrong table
//! would still read garbage. So from the moment the ggml probes attach,
//! every event is held back, and the first graphs are checked against
//! invariants that hold only when the offsets are right:
//!
//! - `ggml_tensor`: the name is NUL-terminated printable text, `ne[i] >= 1`
//!   (or 0, in an empty tensor, which ggml skips; servers' graphs have some),
//!   `nb[0]` is the type's size (tensors that are not views), `op` is in
//!   the target's own op table; most nodes are named; a weight whose data
//!   is the start of a tensor of the mapped model file has that tensor's
//!   GGUF name, type and shape (a name read 8 bytes off is still text, and
//!   `ne` read 8 bytes off still counts from 1, but neither is the file's);
//! - `ggml_cgraph`: `0 <= n_nodes <= size` (views have `size` 0), and every
//!   node is an op (leaves are kept apart);
//! - `llama_ubatch`: its `n_tokens` is the length of the next graph's token
//!   input (the GET_ROWS of `token_embd`), its token array those ids, its
//!   positions and sequence ids plausible (`ubatch`).
//!
//! When the first complete graph passes, the held events go to the trace
//! and later ones pass straight through. A tensor or cgraph check that
//! fails refuses the trace; a ubatch that does not match (or none within a
//! few graphs) turns sequences off and drops the ubatch records.

use std::collections::HashMap;

use tracer_common::{TensorRecord, c_str, ggml::TYPE_I32, graph, layout::TensorLayout, node_role};

use super::graphs::SourceCache;
use crate::{events::Event, format::LayoutCheck, model::GgmlType};

mod ubatch;

use ubatch::{TokenInput, UbatchSeen};

/// The model file's tensor a record's data starts, if any.
pub type GgufName<'a> = dyn FnMut(&TensorRecord) -> Option<GgufTensor> + 'a;

/// What the model file says of a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    pub type_id: u32,
    pub shape: Vec<u64>,
}

/// A field that does not hold what it must: the struct, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub structure: &'static str,
    pub what: String,
}

/// Graphs after the first good one within which a ubatch must match.
const UBATCH_GRAPHS: u32 = 4;
/// Graphs that ran without being read whole (no nodes, or not all of
/// them) before the cgraph layout is taken to be wrong: a ring that
/// overflows on the first graphs is far less likely than a wrong offset.
const UNREAD_GRAPHS: u32 = 4;
/// More elements than any dimension of a tensor in memory can have.
const MAX_NE: i64 = 1 << 40;
/// More threads than a ggml compute team has.
const MAX_TEAM: u32 = 1 << 12;

/// What the checks need to know about the target.
#[derive(Debug, Clone)]
pub struct Rules {
    pub tensor: TensorLayout,
    /// Length of the target's op table; `GET_ROWS`'s id in it.
    pub n_ops: usize,
    pub get_rows: Option<i32>,
    /// Whether the ubatch probe records (sequences on).
    pub ubatch: bool,
}

/// Outcome of an event for the session.
#[derive(Debug, Default)]
pub struct Admitted {
    /// Events to record now, in order.
    pub record: Vec<Event>,
    /// The ubatch did not check out: sequences off, with why.
    pub sequences_off: Option<String>,
}

pub struct Gate {
    checker: Option<Checker>,
    held: Vec<Event>,
    pub passed: LayoutCheck,
}

struct Checker {
    rules: Rules,
    graph: Option<GraphCheck>,
    core_ok: bool,
    /// The last ubatch sent, not yet matched to a graph.
    ubatch: UbatchSeen,
    ubatch_done: bool,
    graphs_after_core: u32,
    /// Graphs whose records did not add up, and the last one's counts.
    unread: u32,
    /// Sources a later graph's nodes name without sending them again.
    sources: SourceCache,
}

/// The graph being read: what its nodes' sources need to be resolved.
#[derive(Default)]
struct GraphCheck {
    uid: u64,
    n_nodes: u32,
    nodes: u32,
    named: u32,
    /// Address → type, `ne[0]` and name of every tensor read.
    tensors: HashMap<u64, (i32, i64, String)>,
    /// `(src[0], src[1])` of every GET_ROWS node.
    token_rows: Vec<(u64, u64)>,
    /// The integer inputs of this run, by tensor address.
    inputs: HashMap<u64, Vec<i32>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::open()
    }
}

impl Gate {
    /// Nothing to check (no ggml probe attached): events pass.
    pub fn open() -> Self {
        Self { checker: None, held: Vec::new(), passed: LayoutCheck::default() }
    }

    /// The ggml probes are about to attach: hold everything until they check out.
    pub fn arm(&mut self, rules: Rules) {
        self.checker = Some(Checker {
            rules,
            graph: None,
            core_ok: false,
            ubatch: UbatchSeen::default(),
            ubatch_done: false,
            graphs_after_core: 0,
            unread: 0,
            sources: SourceCache::default(),
        });
    }

    pub fn checking(&self) -> bool {
        self.checker.is_some()
    }

    /// `gguf_name`: the GGUF name of the model tensor a record's data
    /// pointer starts, when it points into a mapped model file.
    pub fn admit(&mut self, event: Event, gguf_name: &mut GgufName<'_>) -> Result<Admitted, Violation> {
        let Some(checker) = self.checker.as_mut() else {
            return Ok(Admitted { record: vec![event], sequences_off: None });
        };
        let verdict = checker.observe(&event, &mut self.passed, gguf_name)?;
        // Until a record the layouts shape arrives (an idle server may run
        // no graph for hours), the rest passes: nothing held to overtake.
        if self.held.is_empty() && !reads_ggml(&event) {
            return Ok(Admitted { record: vec![event], sequences_off: None });
        }
        self.held.push(event);
        match verdict {
            Verdict::Hold => Ok(Admitted::default()),
            Verdict::Pass { sequences_off } => {
                self.checker = None;
                Ok(self.release(sequences_off))
            }
        }
    }

    /// The end of the trace while still checking: what was checked stays,
    /// records that nothing vouched for are dropped.
    pub fn finish(&mut self) -> Admitted {
        let Some(checker) = self.checker.take() else { return Admitted::default() };
        let mut off = None;
        if !checker.core_ok {
            self.held.retain(|e| !reads_ggml(e));
        } else if checker.rules.ubatch && !checker.ubatch_done {
            off = Some("the trace ended before a ubatch could be checked against its graph".to_string());
        }
        self.release(off)
    }

    fn release(&mut self, sequences_off: Option<String>) -> Admitted {
        let mut record = std::mem::take(&mut self.held);
        if sequences_off.is_some() {
            record.retain(|e| !matches!(e, Event::Batch(_)));
        }
        Admitted { record, sequences_off }
    }
}

/// Records whose content depends on the ggml/llama layouts.
fn reads_ggml(event: &Event) -> bool {
    matches!(
        event,
        Event::Op(_)
            | Event::Graph(_)
            | Event::Node(_)
            | Event::Input(_)
            | Event::Routing(_)
            | Event::Batch(_)
            | Event::Buffer(_)
            | Event::Value(_)
    )
}

enum Verdict {
    Hold,
    Pass { sequences_off: Option<String> },
}

impl Checker {
    fn observe(
        &mut self,
        event: &Event,
        passed: &mut LayoutCheck,
        gguf_name: &mut GgufName<'_>,
    ) -> Result<Verdict, Violation> {
        match event {
            Event::Batch(b) => self.ubatch.on_batch(b),
            Event::Input(input) => {
                if let Some(graph) = self.graph.as_mut().filter(|g| g.uid == input.uid) {
                    graph.inputs.insert(input.tensor, input.i32s());
                }
            }
            Event::Graph(g) if g.flags & graph::DONE == 0 => {
                if g.raw_n_nodes < 0 || (g.size > 0 && g.raw_n_nodes > g.size) {
                    return Err(Violation {
                        structure: "ggml_cgraph",
                        what: format!("n_nodes {} is not within 0..=size {}", g.raw_n_nodes, g.size),
                    });
                }
                if g.flags & graph::REUSED == 0 {
                    self.graph = Some(GraphCheck { uid: g.uid, n_nodes: g.n_nodes, ..Default::default() });
                }
            }
            Event::Node(n) => {
                self.sources.on_node(n, &self.rules.tensor);
                let Some(graph) = self.graph.as_mut().filter(|g| g.uid == n.uid) else { return Ok(Verdict::Hold) };
                let Some(t) = self.rules.tensor.decode(&n.tensor) else { return Ok(Verdict::Hold) };
                // Sources sent in an earlier graph, checked then: known by name here.
                for record in self.sources.cached(n, &t.src) {
                    let name = String::from_utf8_lossy(c_str(&record.name)).into_owned();
                    graph.tensors.insert(record.tensor, (record.type_, record.ne[0], name));
                }
                let record = TensorRecord::of(n.address, &t, 0);
                check_tensor(&record, &self.rules)?;
                check_weight(&record, &self.rules, gguf_name, passed)?;
                passed.tensors += 1;
                let name = String::from_utf8_lossy(c_str(&record.name)).into_owned();
                if n.role == node_role::NODE {
                    graph.nodes += 1;
                    if record.op == 0 {
                        return Err(Violation {
                            structure: "ggml_cgraph",
                            what: format!(
                                "node {} ({name:?}) has op NONE: `nodes` does not hold the graph's ops",
                                n.index
                            ),
                        });
                    }
                    graph.named += u32::from(!name.is_empty());
                    if Some(record.op) == self.rules.get_rows {
                        graph.token_rows.push((t.src[0], t.src[1]));
                    }
                }
                graph.tensors.insert(n.address, (record.type_, record.ne[0], name));
            }
            Event::Graph(g) if g.flags & graph::DONE != 0 => {
                // A run of a graph read before, or one whose records did not
                // add up (lost to a full ring, or none): not evidence once, a
                // wrong `n_nodes` or `nodes` if no graph ever reads whole.
                let graph = self.graph.take().filter(|graph| graph.uid == g.uid);
                let Some(graph) = graph.filter(|graph| graph.nodes == graph.n_nodes && graph.n_nodes > 0) else {
                    self.unread += 1;
                    if !self.core_ok && self.unread >= UNREAD_GRAPHS {
                        return Err(Violation {
                            structure: "ggml_cgraph",
                            what: format!(
                                "{} graphs ran and none could be read whole (the last: n_nodes {})",
                                self.unread, g.raw_n_nodes
                            ),
                        });
                    }
                    return Ok(self.after_graph(None));
                };
                if graph.named * 2 < graph.nodes {
                    return Err(Violation {
                        structure: "ggml_tensor",
                        what: format!(
                            "only {} of {} graph nodes have a name at offset {}",
                            graph.named, graph.nodes, self.rules.tensor.name
                        ),
                    });
                }
                passed.graphs += 1;
                self.core_ok = true;
                let tokens = graph.token_input();
                return Ok(self.after_graph(tokens).counting(passed, self.ubatch_done));
            }
            // `--op-timing`: a thread's place in its team, read at the params
            // layout's offsets (the node's tensors are checked in its graph).
            Event::Op(op) if op.nth == 0 || op.nth > MAX_TEAM || op.ith >= op.nth => {
                return Err(Violation {
                    structure: "ggml_compute_params",
                    what: format!("thread {} of {} starting a node is not a place in a team", op.ith, op.nth),
                });
            }
            _ => {}
        }
        Ok(Verdict::Hold)
    }

    /// After a checked graph (with its token input length, if it has one):
    /// the verdict, once the ubatch check is settled too.
    fn after_graph(&mut self, token_input: Option<TokenInput>) -> Verdict {
        if !self.core_ok {
            return Verdict::Hold;
        }
        if !self.rules.ubatch || self.ubatch_done {
            return Verdict::Pass { sequences_off: None };
        }
        let ubatch = if token_input.is_some() { std::mem::take(&mut self.ubatch) } else { UbatchSeen::default() };
        match token_input.filter(|_| ubatch.seen()).map(|input| ubatch.check(&input)) {
            Some(Ok(())) => {
                self.ubatch_done = true;
                Verdict::Pass { sequences_off: None }
            }
            Some(Err(why)) => Verdict::Pass { sequences_off: Some(why) },
            None => {
                self.graphs_after_core += 1;
                if self.graphs_after_core > UBATCH_GRAPHS {
                    Verdict::Pass {
                        sequences_off: Some(format!(
                            "no ubatch matched a graph's token input in the first {UBATCH_GRAPHS} graphs"
                        )),
                    }
                } else {
                    Verdict::Hold
                }
            }
        }
    }
}

impl Verdict {
    fn counting(self, passed: &mut LayoutCheck, ubatch_done: bool) -> Self {
        if ubatch_done && matches!(self, Verdict::Pass { sequences_off: None }) {
            passed.ubatches += 1;
        }
        self
    }
}

impl GraphCheck {
    /// The token input: the index source of the GET_ROWS that reads
    /// `token_embd`, and its ids where the run sent them.
    fn token_input(&self) -> Option<TokenInput> {
        self.token_rows.iter().find_map(|(table, ids)| {
            let (_, _, name) = self.tensors.get(table)?;
            let &(type_, ne0, _) = self.tensors.get(ids)?;
            (name.starts_with("token_embd") && type_ == TYPE_I32)
                .then(|| TokenInput { len: ne0, ids: self.inputs.get(ids).cloned() })
        })
    }
}

/// A weight read at the start of a model tensor must be that tensor: its
/// GGUF name, type and shape.
fn check_weight(
    t: &TensorRecord,
    rules: &Rules,
    gguf: &mut GgufName<'_>,
    passed: &mut LayoutCheck,
) -> Result<(), Violation> {
    if t.view_src != 0 || t.data == 0 {
        return Ok(());
    }
    let Some(expected) = gguf(t) else { return Ok(()) };
    let name = String::from_utf8_lossy(c_str(&t.name)).into_owned();
    let l = &rules.tensor;
    let what = if name != expected.name {
        format!("is named {name:?} at offset {}", l.name)
    } else if u32::try_from(t.type_).ok() != Some(expected.type_id) {
        format!("has type {} at offset {}, not {}", t.type_, l.type_, expected.type_id)
    } else if !same_shape(&t.ne, &expected.shape) {
        format!("has ne {:?} at offset {}, not {:?}", t.ne, l.ne, expected.shape)
    } else {
        passed.weights += 1;
        return Ok(());
    };
    Err(Violation {
        structure: "ggml_tensor",
        what: format!("the weight at {:#x} {what}, but the model file has {:?} there", t.data, expected.name),
    })
}

fn same_shape(ne: &[i64; 4], shape: &[u64]) -> bool {
    shape.len() <= 4
        && ne.iter().enumerate().all(|(i, &n)| u64::try_from(n).ok() == Some(shape.get(i).copied().unwrap_or(1)))
}

/// A tensor as the layout decoded it must look like a tensor.
pub fn check_tensor(t: &TensorRecord, rules: &Rules) -> Result<(), Violation> {
    let fail = |what: String| Err(Violation { structure: "ggml_tensor", what });
    let at = |field: u32| format!("at offset {field}");
    let l = &rules.tensor;
    let Some(end) = t.name.iter().position(|&b| b == 0) else {
        return fail(format!("the name {} of tensor {:#x} is not NUL-terminated", at(l.name), t.tensor));
    };
    if let Some(&b) = t.name[..end].iter().find(|b| !(0x20..0x7f).contains(*b)) {
        return fail(format!("the name {} of tensor {:#x} holds byte {b:#04x}, not text", at(l.name), t.tensor));
    }
    let name = String::from_utf8_lossy(&t.name[..end]);
    // `ne[i] >= 1`, except in an empty tensor (llama-server's graphs have
    // some; ggml skips them), and no count beyond any memory.
    if let Some(d) = t.ne.iter().position(|&n| !(0..=MAX_NE).contains(&n)) {
        return fail(format!("{name:?}: ne[{d}] {} is {}, not a count of elements", at(l.ne), t.ne[d]));
    }
    let Some(ty) = u32::try_from(t.type_).ok().and_then(GgmlType::from_id) else {
        return fail(format!("{name:?}: type {} is {}, not a ggml type", at(l.type_), t.type_));
    };
    if t.view_src == 0 && t.nb[0] != u64::from(ty.block_bytes) {
        return fail(format!(
            "{name:?}: nb[0] {} is {}, not the size of its type {} ({})",
            at(l.nb),
            t.nb[0],
            ty.name,
            ty.block_bytes
        ));
    }
    if t.op < 0 || t.op as usize >= rules.n_ops {
        return fail(format!("{name:?}: op {} is {}, not below the op table's {}", at(l.op), t.op, rules.n_ops));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
