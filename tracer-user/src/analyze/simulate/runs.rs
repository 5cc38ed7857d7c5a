//! Page LRU kept as runs of consecutive pages: the recency list of
//! [`super::lru::Lru`] over single pages, with every stretch of pages that
//! sit next to each other in the list *and* in the file, oldest first,
//! folded into one entry.
//!
//! The fault path touches and reads pages in file order (an op reads its
//! range front to back, a readahead window is read front to back), so
//! whole tensors and windows stay one entry each: moving a 170 MiB tensor
//! to the head is one step, not 43 000.

use super::bits::Bits;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Run {
    start: u64,
    end: u64,
    /// Towards the tail (older) and the head (newer).
    older: u32,
    newer: u32,
}

pub struct RunLru {
    runs: Vec<Run>,
    free: Vec<u32>,
    /// The first page of every run, and the run starting at each page:
    /// the run holding a page is found a bitmap word at a time.
    starts: Bits,
    run_at: Vec<u32>,
    /// Newest and oldest run.
    head: Option<u32>,
    tail: Option<u32>,
}

impl RunLru {
    /// An empty list of pages `0..pages`.
    pub fn new(pages: u64) -> RunLru {
        RunLru {
            runs: Vec::new(),
            free: Vec::new(),
            starts: Bits::new(pages),
            run_at: vec![NIL; pages as usize],
            head: None,
            tail: None,
        }
    }

    fn index(&mut self, start: u64, id: u32) {
        self.starts.set(start);
        self.run_at[start as usize] = id;
    }

    fn unindex(&mut self, start: u64) {
        self.starts.take(start);
        self.run_at[start as usize] = NIL;
    }

    fn alloc(&mut self, start: u64, end: u64) -> u32 {
        let run = Run { start, end, older: NIL, newer: NIL };
        let id = match self.free.pop() {
            Some(id) => {
                self.runs[id as usize] = run;
                id
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        self.index(start, id);
        id
    }

    fn unlink(&mut self, id: u32) {
        let Run { older, newer, .. } = self.runs[id as usize];
        match older {
            NIL => self.tail = (newer != NIL).then_some(newer),
            o => self.runs[o as usize].newer = newer,
        }
        match newer {
            NIL => self.head = (older != NIL).then_some(older),
            n => self.runs[n as usize].older = older,
        }
    }

    /// Links `id` right newer than `after`, or as the oldest when `None`.
    fn link_newer_than(&mut self, id: u32, after: Option<u32>) {
        let newer = match after {
            Some(a) => std::mem::replace(&mut self.runs[a as usize].newer, id),
            None => self.tail.replace(id).unwrap_or(NIL),
        };
        self.runs[id as usize].older = after.unwrap_or(NIL);
        self.runs[id as usize].newer = newer;
        match newer {
            NIL => self.head = Some(id),
            n => self.runs[n as usize].older = id,
        }
    }

    fn drop_run(&mut self, id: u32) {
        self.unlink(id);
        self.unindex(self.runs[id as usize].start);
        self.free.push(id);
    }

    fn restart(&mut self, id: u32, start: u64) {
        self.unindex(self.runs[id as usize].start);
        self.runs[id as usize].start = start;
        self.index(start, id);
    }

    /// Pages `[a, b)`, none of them listed, become the newest, `b - 1`
    /// newest of all.
    pub fn push(&mut self, a: u64, b: u64) {
        if a == b {
            return;
        }
        if let Some(h) = self.head
            && self.runs[h as usize].end == a
        {
            self.runs[h as usize].end = b;
            return;
        }
        let id = self.alloc(a, b);
        self.link_newer_than(id, self.head);
    }

    /// Pages `[a, b)`, all listed, are used in order: they move to the head.
    pub fn touch(&mut self, a: u64, b: u64) {
        if a == b {
            return;
        }
        // Already the newest pages, in this order.
        if let Some(h) = self.head
            && self.runs[h as usize].end == b
            && self.runs[h as usize].start <= a
        {
            return;
        }
        self.remove(a, b);
        self.push(a, b);
    }

    /// Takes `[a, b)` (all listed) out of the runs holding it.
    fn remove(&mut self, a: u64, b: u64) {
        if let Some(start) = self.starts.prev_one(0, a)
            && let id = self.run_at[start as usize]
            && self.runs[id as usize].end > a
        {
            let end = std::mem::replace(&mut self.runs[id as usize].end, a);
            if end > b {
                // Split: the part after `b` keeps its place in the list.
                let rest = self.alloc(b, end);
                self.link_newer_than(rest, Some(id));
                return;
            }
        }
        loop {
            let start = self.starts.next_one(a, b);
            if start == b {
                return;
            }
            let id = self.run_at[start as usize];
            if self.runs[id as usize].end > b {
                self.restart(id, b);
                return;
            }
            self.drop_run(id);
        }
    }

    /// Drops the `n` oldest pages (there must be as many), telling `gone`
    /// each run of them.
    pub fn evict(&mut self, mut n: u64, gone: &mut impl FnMut(u64, u64)) {
        while n > 0 {
            let Some(t) = self.tail else { return };
            let Run { start, end, .. } = self.runs[t as usize];
            let k = n.min(end - start);
            gone(start, start + k);
            if k == end - start {
                self.drop_run(t);
            } else {
                self.restart(t, start + k);
            }
            n -= k;
        }
    }

    /// The list oldest first, page by page (tests).
    #[cfg(test)]
    pub fn pages(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.tail;
        while let Some(id) = at {
            let r = self.runs[id as usize];
            out.extend(r.start..r.end);
            at = (r.newer != NIL).then_some(r.newer);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::RunLru;

    /// The same operations on a plain list of pages.
    fn touch(list: &mut Vec<u64>, a: u64, b: u64) {
        list.retain(|p| !(a..b).contains(p));
        list.extend(a..b);
    }

    #[test]
    fn runs_equal_a_page_list_under_random_operations() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let (mut runs, mut list) = (RunLru::new(64), Vec::new());
            let mut present = [false; 64];
            for _ in 0..60 {
                let a = rand(64);
                let b = (a + 1 + rand(12)).min(64);
                match rand(3) {
                    0 if (a..b).all(|p| !present[p as usize]) => {
                        runs.push(a, b);
                        list.extend(a..b);
                        present[a as usize..b as usize].fill(true);
                    }
                    1 if (a..b).all(|p| present[p as usize]) => {
                        runs.touch(a, b);
                        touch(&mut list, a, b);
                    }
                    2 if !list.is_empty() => {
                        let n = 1 + rand(list.len() as u64);
                        let mut gone = Vec::new();
                        runs.evict(n, &mut |s, e| gone.extend(s..e));
                        let expected: Vec<u64> = list.drain(..n as usize).collect();
                        assert_eq!(gone, expected);
                        for p in gone {
                            present[p as usize] = false;
                        }
                    }
                    _ => {}
                }
                assert_eq!(runs.pages(), list);
            }
        }
    }
}
