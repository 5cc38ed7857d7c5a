//! A ubatch's graph (docs/VIEW_API.md "Graph of a ubatch"): its ops as
//! nodes in execution order, an edge from the op that wrote a tensor to
//! each op reading it (or a view of it), and a shape key under which the
//! front end caches the layout.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
};

use serde_json::{Value, json};

use super::ops::{MemoryClass, Ops};

/// `None` for a ubatch without ops.
pub fn graph(ops: &Ops, ubatch: u32) -> Option<Value> {
    let &(first, end) = ops.ubatch_ops.get(ubatch as usize)?;
    if first >= end {
        return None;
    }
    let rows: Vec<usize> = (first as usize..end as usize).filter(|&i| ops.ubatch(i) == Some(ubatch)).collect();
    let mut writer: HashMap<u64, usize> = HashMap::new();
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut shape = DefaultHasher::new();
    let mut nodes = Vec::with_capacity(rows.len());
    for (n, &i) in rows.iter().enumerate() {
        let combo = &ops.combos[ops.combo[i] as usize];
        let sig = &ops.sigs[combo.sig as usize];
        let mut from: Vec<usize> = combo
            .srcs
            .iter()
            .filter_map(|&(tensor, view_src)| writer.get(&tensor).or_else(|| writer.get(&view_src)).copied())
            .collect();
        from.sort_unstable();
        from.dedup();
        edges.extend(from.iter().map(|&f| (f, n)));
        writer.insert(combo.dst_tensor, n);
        combo.sig.hash(&mut shape);
        from.hash(&mut shape);
        nodes.push(json!({
            "op": ops.seq(i),
            "name": ops.op_names[sig.op as usize],
            "dst": ops.strings[sig.dst as usize],
            "layer": sig.layer,
            "memory": MemoryClass::NAMES[sig.memory as usize],
            "weights": sig.weights,
        }));
    }
    Some(json!({
        "ubatch": ubatch,
        "shape": format!("{:016x}", shape.finish()),
        "nodes": nodes,
        "edges": edges,
    }))
}
