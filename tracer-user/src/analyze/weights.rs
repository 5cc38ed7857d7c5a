//! A ubatch's weight reads, shared between ubatches that read the same:
//! every generated token of a dense model reads the same tensors the same
//! way, so a long run holds one list, not one per token (a list is ~20 KB
//! on a 270-tensor model: 3.7 GB over 175 k tokens otherwise).

use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasher, Hash},
    ops::Deref,
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use super::WeightUse;

/// `(model, tensor)` of each weight read → how.
pub type WeightMap = BTreeMap<(u32, u32), WeightUse>;

/// A ubatch's weight reads: read as a map; [`Weights::make_mut`] to change
/// them (a list shared with other ubatches is copied first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Weights(Arc<WeightMap>);

impl Deref for Weights {
    type Target = WeightMap;

    fn deref(&self) -> &WeightMap {
        &self.0
    }
}

impl Weights {
    pub fn make_mut(&mut self) -> &mut WeightMap {
        Arc::make_mut(&mut self.0)
    }

    /// Which list this is: equal for ubatches sharing one (see
    /// [`Interner`]), so a figure of a list is computed once per list.
    pub fn list_id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

/// A weight read as `report --json` lists it.
#[derive(Serialize, Deserialize)]
struct Entry {
    model: u32,
    tensor: u32,
    #[serde(flatten)]
    usage: WeightUse,
}

/// As a list of reads, each with its `model` and `tensor`.
impl Serialize for Weights {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|(&(model, tensor), &usage)| Entry { model, tensor, usage }))
    }
}

impl<'de> Deserialize<'de> for Weights {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Weights, D::Error> {
        let list = Vec::<Entry>::deserialize(d)?;
        Ok(Weights(Arc::new(list.into_iter().map(|e| ((e.model, e.tensor), e.usage)).collect())))
    }
}

/// The distinct lists seen so far.
#[derive(Default)]
pub struct Interner {
    /// Every ubatch's list is hashed: SipHash was a fortieth of `report`.
    hasher: foldhash::fast::RandomState,
    by_hash: HashMap<u64, Vec<Weights>>,
}

impl Interner {
    /// `weights`, or an equal list seen before in its place.
    pub fn intern(&mut self, weights: &mut Weights) {
        if weights.is_empty() {
            return;
        }
        let mut state = self.hasher.build_hasher();
        weights.0.hash(&mut state);
        let same = self.by_hash.entry(std::hash::Hasher::finish(&state)).or_default();
        match same.iter().find(|w| **w == *weights) {
            Some(seen) => *weights = seen.clone(),
            None => same.push(weights.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(bytes: u64) -> Weights {
        let mut w = Weights::default();
        w.make_mut().insert((0, 1), WeightUse { file_backed: 1, bytes, ..Default::default() });
        w
    }

    #[test]
    fn equal_lists_share_one_allocation_and_a_change_copies_it() {
        let mut interner = Interner::default();
        let (mut a, mut b, mut c) = (list(8), list(8), list(9));
        for w in [&mut a, &mut b, &mut c] {
            interner.intern(w);
        }
        assert!(Arc::ptr_eq(&a.0, &b.0) && !Arc::ptr_eq(&a.0, &c.0));
        b.make_mut().get_mut(&(0, 1)).unwrap().bytes = 7;
        assert_eq!((a[&(0, 1)].bytes, b[&(0, 1)].bytes), (8, 7));
    }
}
