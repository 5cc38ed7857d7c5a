//! Values kept per op shape. An op's descriptor-derived columns (name,
//! layer, tensors, weight bytes) depend only on its destination and sources,
//! and a graph runs the same few hundred shapes every token: writers encode
//! them once per shape instead of once per row. Memory is bounded by the
//! descriptor table the reader holds anyway.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasherDefault, Hasher},
};

use crate::format::Op;

/// FxHash (rustc's): keys here are short, SipHash would cost more than the
/// lookup saves.
#[derive(Default)]
pub struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().unwrap_or_default()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
pub type FxSet<K> = HashSet<K, BuildHasherDefault<Fx>>;

/// A value per (destination, sources) of an op, kept per destination
/// descriptor: a node's destination nearly always comes with the same
/// sources, so one slot each and a slice compare beat hashing the key. Model
/// tables feed the weight columns, so the cache starts over when one is added.
pub struct OpShapes<V> {
    by_dst: Vec<Option<Slot<V>>>,
    models: usize,
}

/// An op's sources (slot, descriptor) and the value for them.
type Slot<V> = (Box<[(u32, u32)]>, V);

impl<V> Default for OpShapes<V> {
    fn default() -> Self {
        Self { by_dst: Vec::new(), models: 0 }
    }
}

impl<V> OpShapes<V> {
    pub fn get(&mut self, op: &Op, models: usize) -> Option<&V> {
        if models != self.models {
            self.clear();
            self.models = models;
        }
        match self.by_dst.get(op.dst as usize) {
            Some(Some((srcs, v))) if **srcs == *op.srcs => Some(v),
            _ => None,
        }
    }

    pub fn insert(&mut self, op: &Op, value: V) -> &V {
        let i = op.dst as usize;
        if self.by_dst.len() <= i {
            self.by_dst.resize_with(i + 1, || None);
        }
        &self.by_dst[i].insert((op.srcs[..].into(), value)).1
    }

    pub fn clear(&mut self) {
        self.by_dst.clear();
    }
}
