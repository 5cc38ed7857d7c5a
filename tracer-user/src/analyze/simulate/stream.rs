//! The input every policy replays: model-file pages in the order ops read
//! them, grouped into *atoms*.
//!
//! An atom is a run of pages that every recorded access covers whole or not
//! at all (the file is cut at every accessed range's page boundaries, and at
//! readahead-window boundaries). Its pages are always read together and in
//! order, so under LRU they share one stack distance: an atom of `w` pages,
//! re-read after `d` distinct other pages, hits in a cache of `c` pages iff
//! `d + w <= c`, for every page of it. Replaying atoms instead of pages is
//! therefore exact for LRU and OPT, and a tensor read whole costs one step,
//! not one per page.

use crate::analyze::usage::Period;

/// What the policies replay.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    /// Pages of each atom. Atoms of one file are numbered in file order.
    pub atom_pages: Vec<u32>,
    /// The readahead window of each atom (an index into `window_atoms`),
    /// when the stream was cut for readahead.
    pub window_of: Vec<u32>,
    /// Per window, its first atom; one more entry closes the last window.
    pub window_atoms: Vec<u32>,
    /// Atom ids in access order.
    pub accesses: Vec<u32>,
    /// Which accesses count: `(first access, what it counts as)`, in order.
    pub periods: Vec<(u32, Period)>,
}

impl Stream {
    pub fn total_pages(&self) -> u64 {
        self.atom_pages.iter().map(|&p| u64::from(p)).sum()
    }

    /// Accesses with what each counts as.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Period)> + '_ {
        let mut next = 0usize;
        let mut period = Period::Load;
        self.accesses.iter().enumerate().map(move |(i, &atom)| {
            while next < self.periods.len() && self.periods[next].0 as usize <= i {
                period = self.periods[next].1;
                next += 1;
            }
            (atom, period)
        })
    }

    /// The atoms read together with `atom` on a miss: its whole window when
    /// the stream was cut for readahead, else itself.
    pub fn window(&self, atom: u32) -> std::ops::Range<u32> {
        match self.window_of.get(atom as usize) {
            Some(&w) => self.window_atoms[w as usize]..self.window_atoms[w as usize + 1],
            None => atom..atom + 1,
        }
    }

    /// A stream for tests: atom sizes and the order, every access counted
    /// as generation.
    #[cfg(test)]
    pub fn of(atom_pages: &[u32], accesses: &[u32]) -> Stream {
        Stream {
            atom_pages: atom_pages.to_vec(),
            accesses: accesses.to_vec(),
            periods: vec![(0, Period::Generate)],
            ..Default::default()
        }
    }
}

/// Builds a [`Stream`] from page ranges: record every access first (as
/// interned ranges), then cut the files into atoms.
#[derive(Default)]
pub struct StreamBuilder {
    /// Distinct `(file, first page, end page)` ranges.
    ranges: Vec<(u32, u64, u64)>,
    index: std::collections::HashMap<(u32, u64, u64), u32>,
    /// Range ids in access order.
    order: Vec<u32>,
    periods: Vec<(u32, Period)>,
}

impl StreamBuilder {
    /// Accesses from here on count as `period`.
    pub fn period(&mut self, period: Period) {
        let at = self.order.len() as u32;
        match self.periods.last_mut() {
            Some(last) if last.1 == period => {}
            Some(last) if last.0 == at => last.1 = period,
            _ => self.periods.push((at, period)),
        }
    }

    /// An access to pages `pages` of file `file` (any id the caller keeps
    /// distinct per file).
    pub fn access(&mut self, file: u32, pages: std::ops::Range<u64>) {
        if pages.is_empty() {
            return;
        }
        let key = (file, pages.start, pages.end);
        let next = self.ranges.len() as u32;
        let id = *self.index.entry(key).or_insert(next);
        if id == next {
            self.ranges.push(key);
        }
        // A range read twice in a row is a hit whatever the policy: keep one.
        if self.order.last() != Some(&id) || self.periods.last().is_some_and(|p| p.0 as usize == self.order.len()) {
            self.order.push(id);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Cuts the files into atoms (and `window`-page readahead windows, when
    /// given) and turns every access into its atoms.
    pub fn build(self, window: Option<u64>) -> Stream {
        // Cut points per file: every range boundary, plus window boundaries
        // inside the spans that windows around accessed ranges cover.
        let mut cuts: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
        for &(file, from, to) in &self.ranges {
            let c = cuts.entry(file).or_default();
            match window {
                Some(w) => {
                    let (lo, hi) = (from / w * w, to.div_ceil(w) * w);
                    c.extend((lo..=hi).step_by(w as usize));
                    c.extend([from, to]);
                }
                None => c.extend([from, to]),
            }
        }
        let mut stream = Stream::default();
        // Per file: (cut points, id of the atom starting at each cut).
        let mut atoms_of: std::collections::HashMap<u32, (Vec<u64>, u32)> = Default::default();
        for (file, mut points) in cuts {
            points.sort_unstable();
            points.dedup();
            let first = stream.atom_pages.len() as u32;
            for pair in points.windows(2) {
                stream.atom_pages.push((pair[1] - pair[0]) as u32);
                if let Some(w) = window {
                    // A new window starts at each multiple of `w`, and after
                    // any gap between covered spans.
                    let starts = pair[0] % w == 0 || stream.window_atoms.is_empty();
                    if starts {
                        stream.window_atoms.push(stream.atom_pages.len() as u32 - 1);
                    }
                    stream.window_of.push(stream.window_atoms.len() as u32 - 1);
                }
            }
            atoms_of.insert(file, (points, first));
        }
        if window.is_some() {
            stream.window_atoms.push(stream.atom_pages.len() as u32);
        }
        // Gaps between covered spans become atoms too (never read, so never
        // loaded): windows are whole, so a gap starts and ends a window.
        let atom_span = |id: u32| -> std::ops::Range<u32> {
            let (file, from, to) = self.ranges[id as usize];
            let (points, first) = &atoms_of[&file];
            let a = points.binary_search(&from).expect("cut at every range start") as u32;
            let b = points.binary_search(&to).expect("cut at every range end") as u32;
            first + a..first + b
        };
        let spans: Vec<std::ops::Range<u32>> = (0..self.ranges.len() as u32).map(atom_span).collect();
        let mut periods = self.periods.into_iter().peekable();
        for (i, id) in self.order.into_iter().enumerate() {
            while let Some(&(at, period)) = periods.peek() {
                if at as usize > i {
                    break;
                }
                stream.periods.push((stream.accesses.len() as u32, period));
                periods.next();
            }
            stream.accesses.extend(spans[id as usize].clone());
        }
        stream
    }
}
