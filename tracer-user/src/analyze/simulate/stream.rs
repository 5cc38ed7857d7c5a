//! The input every policy replays: model-file pages in the order ops read
//! them, grouped into *atoms*.
//!
//! An atom is a run of pages that every recorded access covers whole or not
//! at all (the file is cut at every accessed range's page boundaries). Its pages are always read together and in
//! order, so under LRU they share one stack distance: an atom of `w` pages,
//! re-read after `d` distinct other pages, hits in a cache of `c` pages iff
//! `d + w <= c`, for every page of it. Replaying atoms instead of pages is
//! therefore exact for LRU and OPT, and a tensor read whole costs one step,
//! not one per page.

use crate::analyze::usage::Period;

/// What the policies replay.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    /// Pages of each atom. Atoms of one file are numbered in file order
    /// and tile it.
    pub atom_pages: Vec<u32>,
    /// The first page of each atom, numbering the files' pages one after
    /// the other (for the page-level replay of the kernel's fault path).
    pub atom_first: Vec<u64>,
    /// Per file, the span of those page numbers it covers.
    pub files: Vec<std::ops::Range<u64>>,
    /// Per file (as `files`): the id [`StreamBuilder::access`] was given
    /// and the file's own number of the span's first page.
    pub file_ids: Vec<(u32, u64)>,
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

    /// A stream for tests: atom sizes and the order, every access counted
    /// as generation; one file.
    #[cfg(test)]
    pub fn of(atom_pages: &[u32], accesses: &[u32]) -> Stream {
        let atom_first =
            atom_pages.iter().scan(0u64, |at, &w| Some(std::mem::replace(at, *at + u64::from(w)))).collect();
        let total = atom_pages.iter().map(|&w| u64::from(w)).sum();
        Stream {
            atom_pages: atom_pages.to_vec(),
            atom_first,
            files: std::iter::once(0..total).collect(),
            file_ids: vec![(0, 0)],
            accesses: accesses.to_vec(),
            periods: vec![(0, Period::Generate)],
        }
    }
}

/// Builds a [`Stream`] from page ranges: record every access first (as
/// interned ranges), then cut the files into atoms.
#[derive(Default)]
pub struct StreamBuilder {
    /// Distinct `(file, first page, end page)` ranges.
    ranges: Vec<(u32, u64, u64)>,
    /// Each file's whole extent, `(file, end page)`, so that readahead
    /// windows stop where the file does.
    extents: Vec<(u32, u64)>,
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

    /// File `file` has `pages` pages (read or not).
    pub fn extent(&mut self, file: u32, pages: u64) {
        self.extents.push((file, pages));
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Cuts the files into atoms and turns every access into its atoms.
    pub fn build(self) -> Stream {
        let mut cuts: std::collections::BTreeMap<u32, Vec<u64>> = Default::default();
        for &(file, from, to) in &self.ranges {
            cuts.entry(file).or_default().extend([from, to]);
        }
        for &(file, end) in &self.extents {
            cuts.entry(file).or_default().extend([0, end]);
        }
        let mut stream = Stream::default();
        // Per file: (cut points, id of the atom starting at each cut).
        let mut atoms_of: std::collections::HashMap<u32, (Vec<u64>, u32)> = Default::default();
        let mut numbered = 0u64;
        for (file, mut points) in cuts {
            points.sort_unstable();
            points.dedup();
            let first = stream.atom_pages.len() as u32;
            let base = numbered;
            for pair in points.windows(2) {
                stream.atom_first.push(base + pair[0] - points[0]);
                stream.atom_pages.push((pair[1] - pair[0]) as u32);
            }
            numbered += points.last().unwrap_or(&0) - points.first().unwrap_or(&0);
            stream.files.push(base..numbered);
            stream.file_ids.push((file, points.first().copied().unwrap_or(0)));
            atoms_of.insert(file, (points, first));
        }
        // Gaps between covered spans become atoms too (never read by an op,
        // only by readahead).
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
