//! The op-duration rule, one place for `correlate` and `walk`: an op lasts
//! until the next op on the same thread, and the last op of a graph on each
//! thread until the graph returns. Chosen over a uretprobe, which could not
//! time ops here (the hook returns before the op runs unless an extra buffer
//! type computes it) and costs more: `benches/probe_cost.rs` measured 1.26 µs
//! per probed call for the uprobe alone and 7.75 µs with a uretprobe too
//! (median of 7 rounds, 2026-11-23, this 2-core VM).

use std::collections::BTreeMap;

/// The op running on each thread, with whatever the caller keeps for it.
pub struct OpClock<T> {
    running: BTreeMap<u32, (u64, T)>,
}

/// An op whose end is known (`None`: the trace ended while it ran).
pub struct Ended<T> {
    pub item: T,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
}

impl<T> Default for OpClock<T> {
    fn default() -> Self {
        Self { running: BTreeMap::new() }
    }
}

impl<T> OpClock<T> {
    /// An op started on `tid`: the one it replaces ended now.
    pub fn start(&mut self, tid: u32, start_ns: u64, item: T) -> Option<Ended<T>> {
        let (prev_start, prev) = self.running.insert(tid, (start_ns, item))?;
        Some(Ended { item: prev, start_ns: prev_start, end_ns: Some(start_ns) })
    }

    /// The graph returned: every running op ended now, in thread order.
    pub fn graph_returned(&mut self, ts_ns: u64) -> impl Iterator<Item = Ended<T>> + use<T> {
        std::mem::take(&mut self.running).into_values().map(move |(start_ns, item)| Ended {
            item,
            start_ns,
            end_ns: Some(ts_ns),
        })
    }

    /// The trace ended: running ops have no end.
    pub fn unfinished(&mut self) -> impl Iterator<Item = Ended<T>> + use<T> {
        std::mem::take(&mut self.running).into_values().map(|(start_ns, item)| Ended { item, start_ns, end_ns: None })
    }

    pub fn running_on(&self, tid: u32) -> Option<&T> {
        self.running.get(&tid).map(|(_, item)| item)
    }
}

impl<T> Ended<T> {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.map_or(0, |end| end.saturating_sub(self.start_ns))
    }
}
