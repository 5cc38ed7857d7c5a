//! The (budget, policy) rows: every replay they need, run on every core.
//!
//! A row is one replay, except 2q's, the median of a band of five
//! ([`TWO_LIST_BAND_BYTES`]); each band member is a job of its own, so
//! that eight budgets' forty two-list replays spread evenly over the cores
//! (as whole bands, the last one ran alone).

use std::sync::atomic::{AtomicUsize, Ordering};

use indicatif::ProgressBar;

use super::{
    Counting, Engine, LruCurve, Misses, Policy, Replay, Row, detail, faults, lru, lru_faults, opt,
    stream::Stream,
    twolist::{self, TwoList},
};

/// How far either side of a budget's capacity the two-list model is
/// replayed, and in how many steps a side. At one exact capacity it
/// resonates with the model's cyclic reads: `moe` at 22M read 3.3, 4.1,
/// 3.4, 3.9 MiB per token with the anonymous memory 0.2 MiB apart, where
/// the kernel's runs spread less. The kernel's own capacity for file pages
/// is not exact either: each CPU holds up to 64 pages charged ahead
/// (memcg's charge stock), and the kernel memory the cgroup charges moves.
pub const TWO_LIST_BAND_BYTES: u64 = 256 << 10;
const TWO_LIST_BAND_STEPS: u64 = 2;

/// One replay: a policy at a capacity in pages.
#[derive(Clone, Copy)]
struct Job {
    row: usize,
    policy: Policy,
    capacity: u64,
}

/// Every (budget, policy) row, in budget order, and at the `detail`
/// budget each policy's reads per page (see [`detail`]).
pub fn run(
    replay: &Replay,
    budgets: &[u64],
    policies: &[Policy],
    anon_bytes: u64,
    counting: Counting,
    detail: Option<u64>,
    progress: &ProgressBar,
) -> (Vec<Row>, Vec<(Policy, Vec<u32>)>) {
    let stream = &replay.stream;
    let page_bytes = replay.page_bytes;
    let window = replay.readahead.map(|r| faults::Window {
        pages: r.window_bytes / page_bytes,
        fault_around: (r.fault_around_bytes / page_bytes).max(1),
    });
    let replayers = Replayers {
        stream,
        window,
        engine: replay.engine,
        stack: (policies.contains(&Policy::Lru) && window.is_none()).then(|| LruCurve::new(stream)),
        next: policies.contains(&Policy::Opt).then(|| opt::next_uses(stream)),
    };
    let rows: Vec<(u64, Policy)> = budgets.iter().flat_map(|&b| policies.iter().map(move |&p| (b, p))).collect();
    let capacity = |budget: u64| budget.saturating_sub(anon_bytes) / page_bytes;
    // First the replays that count misses: a 2q row's whole band, and every
    // other row but those at the detail budget, which the second pass
    // replays recording its pages (the same misses).
    let mut counting_jobs = Vec::new();
    for (row, &(budget, policy)) in rows.iter().enumerate() {
        match policy {
            Policy::TwoList => {
                counting_jobs.extend(band(capacity(budget), page_bytes).map(|c| Job { row, policy, capacity: c }))
            }
            _ if detail == Some(budget) => {}
            _ => counting_jobs.push(Job { row, policy, capacity: capacity(budget) }),
        }
    }
    let recording = rows.iter().filter(|(b, _)| detail == Some(*b)).count();
    progress.set_length((counting_jobs.len() + recording) as u64);
    let counted = on_every_core(&counting_jobs, |job| {
        let misses = replayers.replay(job.policy, job.capacity, &mut ());
        progress.inc(1);
        misses
    });
    // Per row, its capacity and misses: 2q's, the band's median.
    let mut chosen: Vec<Option<(u64, Misses)>> = vec![None; rows.len()];
    let mut bands: Vec<Vec<(u64, u64, Misses)>> = vec![Vec::new(); rows.len()];
    for (job, misses) in counting_jobs.iter().zip(counted) {
        match job.policy {
            Policy::TwoList => bands[job.row].push((misses.counted(counting), job.capacity, misses)),
            _ => chosen[job.row] = Some((job.capacity, misses)),
        }
    }
    for (row, mut band) in bands.into_iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        band.sort_unstable_by_key(|&(counted, c, _)| (counted, c));
        let (_, c, misses) = band.swap_remove(band.len() / 2);
        chosen[row] = Some((c, misses));
    }
    let recording_jobs: Vec<Job> = (rows.iter().enumerate())
        .filter(|(_, (b, _))| detail == Some(*b))
        .map(|(row, &(budget, policy))| Job { row, policy, capacity: chosen[row].map_or(capacity(budget), |(c, _)| c) })
        .collect();
    let recorded = on_every_core(&recording_jobs, |job| {
        let mut reads = detail::PageReads::new(counting, replayers.pages());
        let misses = replayers.replay(job.policy, job.capacity, &mut reads);
        debug_assert_eq!(reads.total(), misses.counted(counting));
        progress.inc(1);
        (misses, reads.counts)
    });
    let mut detailed = Vec::new();
    for (job, (misses, reads)) in recording_jobs.iter().zip(recorded) {
        // 2q's band replay at this capacity counted the same misses.
        chosen[job.row] = Some((job.capacity, misses));
        detailed.push((job.policy, reads));
    }
    let tokens = replay.generated_tokens;
    let rows = (rows.iter().zip(chosen))
        .map(|(&(budget, policy), chosen)| {
            let (_, misses) = chosen.expect("every row is replayed");
            let missed = misses.counted(counting);
            let disk_bytes = missed * page_bytes;
            Row {
                budget_bytes: budget,
                cache_bytes: budget.saturating_sub(anon_bytes),
                policy,
                disk_bytes,
                disk_bytes_per_token: (tokens > 0).then(|| disk_bytes as f64 / tokens as f64),
                misses: missed,
            }
        })
        .collect();
    (rows, detailed)
}

/// The capacities of a two-list band around `capacity`, lowest first.
fn band(capacity: u64, page_bytes: u64) -> impl Iterator<Item = u64> {
    let step = (TWO_LIST_BAND_BYTES / TWO_LIST_BAND_STEPS / page_bytes).max(1);
    let low = capacity.saturating_sub(step * TWO_LIST_BAND_STEPS);
    (0..=2 * TWO_LIST_BAND_STEPS).map(move |i| low + i * step)
}

/// `f` of every job, in the jobs' order, the jobs taken in turn by a
/// thread per core (longest first would need their lengths).
fn on_every_core<T: Send>(jobs: &[Job], f: impl Fn(&Job) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break done };
                        done.push((i, f(job)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a simulate worker panicked")).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

/// What every row's replay shares.
struct Replayers<'a> {
    stream: &'a Stream,
    window: Option<faults::Window>,
    engine: Engine,
    /// LRU at every size, on demand paging.
    stack: Option<LruCurve>,
    /// OPT's next uses.
    next: Option<Vec<u32>>,
}

impl Replayers<'_> {
    fn pages(&self) -> u64 {
        self.stream.files.last().map_or(0, |f| f.end)
    }

    /// `policy` with a cache of `capacity` pages, telling `reads` the pages
    /// it reads.
    fn replay(&self, policy: Policy, capacity: u64, reads: &mut impl detail::Reads) -> Misses {
        let stream = self.stream;
        let pages = || vec![1u32; self.pages() as usize];
        // OPT stays a floor of demand reads: readahead only adds reads.
        match (policy, self.window) {
            (Policy::Opt, _) => {
                opt::opt_one_size_into(stream, self.next.as_deref().unwrap_or_default(), capacity, reads)
            }
            (Policy::Lru, None) => lru_at(stream, self.stack.as_ref(), capacity, reads),
            (Policy::TwoList, None) => twolist::two_list_one_size_into(stream, capacity, reads),
            (Policy::Lru, Some(w)) => match self.engine {
                Engine::Runs => lru_faults::replay_into(stream, w, capacity, reads),
                Engine::Pages => faults::replay_into(stream, w, &mut lru::Lru::new(pages()), capacity, reads),
            },
            (Policy::TwoList, Some(w)) => {
                faults::replay_into(stream, w, &mut TwoList::with_large_folios(pages().len()), capacity, reads)
            }
        }
    }
}

/// LRU on demand paging: read off the stack-distance curve, or, when the
/// pages read are wanted, replayed at this one size, which must agree.
fn lru_at<R: detail::Reads>(stream: &Stream, curve: Option<&LruCurve>, capacity: u64, reads: &mut R) -> Misses {
    let Some(curve) = curve.filter(|_| !R::RECORDS) else {
        let one = lru::lru_one_size_into(stream, capacity, reads);
        if let Some(curve) = curve {
            assert_eq!(one, curve.misses(capacity), "LRU at one size disagrees with its stack-distance curve");
        }
        return one;
    };
    curve.misses(capacity)
}
