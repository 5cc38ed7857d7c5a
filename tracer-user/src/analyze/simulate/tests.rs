//! Textbook answers and naive page-by-page oracles.

use super::{
    Counting, Engine, Misses, Policy, Readahead, Replay,
    detail::PageReads,
    faults::{self, Window},
    lru::{Lru, LruCurve, demand_paging, lru_one_size, lru_one_size_into},
    lru_faults,
    opt::{next_uses, opt_one_size, opt_one_size_into},
    run,
    stream::{Stream, StreamBuilder},
    twolist::{TwoList, two_list_one_size, two_list_one_size_into},
};
use crate::analyze::usage::Period;

fn generated(m: Misses) -> u64 {
    m.pages[Period::Generate.index()]
}

/// One-page atoms, named by the reference string's page numbers.
fn pages(refs: &[u32]) -> Stream {
    let n = refs.iter().max().unwrap() + 1;
    Stream::of(&vec![1; n as usize], refs)
}

/// Silberschatz, Operating System Concepts, §10.4: the reference string
/// 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1 with 3 frames faults 15 times
/// under FIFO, 12 under LRU and 9 under OPT (8 when OPT may bypass).
const SILBERSCHATZ: [u32; 20] = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];

#[test]
fn textbook_lru_and_opt() {
    let s = pages(&SILBERSCHATZ);
    assert_eq!(generated(LruCurve::new(&s).misses(3)), 12);
    assert_eq!(generated(lru_one_size(&s, 3)), 12);
    assert_eq!(naive_opt(&SILBERSCHATZ, 3, false), 9);
    assert_eq!(fifo(&SILBERSCHATZ, 3), 15);
    // With bypass, one fault fewer (the page-by-page oracle).
    assert_eq!(naive_opt(&SILBERSCHATZ, 3, true), 8);
    assert_eq!(generated(opt_one_size(&s, &next_uses(&s), 3)), 8);
}

/// Belady, Nelson and Shedler (1969): FIFO faults more with more frames on
/// 1 2 3 4 1 2 5 1 2 3 4 5 (9 with 3 frames, 10 with 4); LRU and OPT, being
/// stack algorithms, never do.
#[test]
fn beladys_anomaly_is_fifo_only() {
    let refs = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5];
    assert_eq!((fifo(&refs, 3), fifo(&refs, 4)), (9, 10));
    let s = pages(&refs);
    let curve = LruCurve::new(&s);
    let next = next_uses(&s);
    assert_eq!((generated(curve.misses(3)), generated(curve.misses(4))), (10, 8));
    assert_eq!((generated(opt_one_size(&s, &next, 3)), generated(opt_one_size(&s, &next, 4))), (7, 6));
}

fn fifo(refs: &[u32], frames: usize) -> u64 {
    let mut queue = std::collections::VecDeque::new();
    let mut faults = 0;
    for &r in refs {
        if !queue.contains(&r) {
            faults += 1;
            if queue.len() == frames {
                queue.pop_front();
            }
            queue.push_back(r);
        }
    }
    faults
}

/// A small xorshift, so the random streams are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn random_stream(rng: &mut Rng, atoms: usize, accesses: usize) -> Stream {
    let sizes: Vec<u32> = (0..atoms).map(|_| 1 + rng.below(5) as u32).collect();
    // Skewed: low ids are hot, as a model's shared tensors are.
    let order: Vec<u32> = (0..accesses)
        .map(|_| {
            let hot = 1 + rng.below(atoms as u64);
            rng.below(hot) as u32
        })
        .collect();
    Stream::of(&sizes, &order)
}

/// The stream page by page: each atom's pages in order.
fn expand(s: &Stream) -> Vec<u32> {
    let mut first = Vec::new();
    let mut at = 0;
    for &w in &s.atom_pages {
        first.push(at);
        at += w;
    }
    s.accesses.iter().flat_map(|&a| first[a as usize]..first[a as usize] + s.atom_pages[a as usize]).collect()
}

fn naive_lru(pages: &[u32], capacity: usize) -> u64 {
    let mut stack: Vec<u32> = Vec::new();
    let mut misses = 0;
    for &p in pages {
        match stack.iter().position(|&q| q == p) {
            Some(i) => {
                stack.remove(i);
            }
            None => {
                misses += 1;
                if stack.len() == capacity {
                    stack.pop();
                }
            }
        }
        if capacity > 0 {
            stack.insert(0, p);
        }
    }
    misses
}

/// Page-by-page OPT; `bypass`: the page just read may be the one dropped.
fn naive_opt(pages: &[u32], capacity: usize, bypass: bool) -> u64 {
    let mut resident: Vec<u32> = Vec::new();
    let mut misses = 0;
    for (t, &p) in pages.iter().enumerate() {
        if resident.contains(&p) {
            continue;
        }
        misses += 1;
        resident.push(p);
        if resident.len() > capacity {
            let next = |q: u32| pages[t + 1..].iter().position(|&x| x == q).unwrap_or(usize::MAX);
            // Classic OPT keeps the page just read (the last entry).
            let candidates = if bypass { resident.len() } else { resident.len() - 1 };
            let victim = (0..candidates).max_by_key(|&i| next(resident[i])).unwrap();
            resident.swap_remove(victim);
        }
    }
    misses
}

/// Streams many times longer than the recency tree, which renumbers its
/// slots each time they run out.
#[test]
fn stack_distances_stay_exact_across_the_recency_trees_renumbering() {
    let mut rng = Rng(0x1e57);
    for atoms in [3, 12, 300] {
        let s = random_stream(&mut rng, atoms, 9000);
        let curve = LruCurve::new(&s);
        for c in 0..=s.total_pages() + 1 {
            assert_eq!(curve.misses(c), lru_one_size(&s, c), "{atoms} atoms, capacity {c}");
        }
    }
}

#[test]
fn stack_distance_lru_equals_naive_lru_on_random_streams() {
    let mut rng = Rng(0x5eed);
    for _ in 0..40 {
        let s = random_stream(&mut rng, 12, 60);
        let pages = expand(&s);
        let curve = LruCurve::new(&s);
        for c in 0..=s.total_pages() + 1 {
            let want = naive_lru(&pages, c as usize);
            assert_eq!(generated(curve.misses(c)), want, "stack distances, capacity {c}");
            assert_eq!(generated(lru_one_size(&s, c)), want, "one size, capacity {c}");
        }
    }
}

#[test]
fn atom_opt_equals_naive_page_opt_on_random_streams() {
    let mut rng = Rng(0xbe1ad);
    for _ in 0..40 {
        let s = random_stream(&mut rng, 10, 50);
        let pages = expand(&s);
        let next = next_uses(&s);
        for c in 1..=s.total_pages() {
            assert_eq!(generated(opt_one_size(&s, &next, c)), naive_opt(&pages, c as usize, true), "capacity {c}");
            assert!(naive_opt(&pages, c as usize, true) <= naive_opt(&pages, c as usize, false));
        }
    }
}

#[test]
fn no_policy_beats_opt_and_a_cache_of_everything_misses_only_first_reads() {
    let mut rng = Rng(42);
    for _ in 0..20 {
        let s = random_stream(&mut rng, 30, 300);
        let next = next_uses(&s);
        let curve = LruCurve::new(&s);
        let cold: u64 = {
            let mut seen = std::collections::HashSet::new();
            s.accesses.iter().filter(|&&a| seen.insert(a)).map(|&a| u64::from(s.atom_pages[a as usize])).sum()
        };
        for c in 1..=s.total_pages() {
            let opt = generated(opt_one_size(&s, &next, c));
            assert!(opt <= generated(curve.misses(c)), "LRU below OPT at {c}");
            assert!(opt <= generated(two_list_one_size(&s, c)), "two-list below OPT at {c}");
        }
        let all = s.total_pages();
        assert_eq!(generated(curve.misses(all)), cold);
        assert_eq!(generated(opt_one_size(&s, &next, all)), cold);
        assert_eq!(generated(two_list_one_size(&s, all)), cold);
    }
}

#[test]
fn two_list_protects_a_hot_set_from_a_scan_that_flushes_lru() {
    // Four hot pages read between pairs of new pages: once the cache is
    // full, reclaim finds them young a second time and activates them. A long one-time scan then flushes them
    // from LRU, while the two-list model keeps them on the active list.
    let mut refs = Vec::new();
    let mut fresh = 100;
    for _ in 0..20 {
        refs.extend(0..4);
        refs.extend([fresh, fresh + 1]);
        fresh += 2;
    }
    refs.extend(fresh..fresh + 50);
    let last = refs.len() as u32;
    refs.extend(0..4);
    let mut s = pages(&refs);
    // Count only the hot set's last reads.
    s.periods = vec![(0, Period::Load), (last, Period::Generate)];
    assert_eq!(generated(LruCurve::new(&s).misses(10)), 4);
    // Reclaiming one page at a time: SWAP_CLUSTER_MAX would empty this cache.
    let mut cache = TwoList::new(s.atom_pages.clone()).with_cluster(1);
    assert_eq!(generated(demand_paging(&s, &mut cache, 10, &mut ())), 0);
}

#[test]
fn atoms_cut_at_every_range_boundary_and_tile_the_file() {
    let mut b = StreamBuilder::default();
    b.period(Period::Generate);
    b.extent(0, 12);
    b.access(0, 0..10);
    b.access(0, 4..6);
    b.access(0, 0..10);
    let s = b.build();
    assert_eq!(s.atom_pages, vec![4, 2, 4, 2]);
    assert_eq!(s.atom_first, vec![0, 4, 6, 10]);
    assert_eq!(s.files.as_slice(), std::slice::from_ref(&(0..12)));
    assert_eq!(s.accesses, vec![0, 1, 2, 1, 0, 1, 2]);
}

fn readahead(pages: u64) -> Window {
    Window { pages, fault_around: 16 }
}

#[test]
fn read_around_reads_a_window_centred_on_the_fault_and_streams_on_at_the_mark() {
    // One 1000-page file read page 500 alone, then pages 500..900 in order.
    let mut s = Stream::of(&[1; 1000], &[500]);
    s.accesses.extend(500..900);
    let mut cache = Lru::new(vec![1; 1000]);
    let m = generated(faults::replay(&s, readahead(64), &mut cache, 10_000));
    // 468..532 first; the mark at 532 - 16 = 516 reads 532..596, whose
    // mark (its first page) reads 596..660, and so on: the last mark the
    // reader passes, 852, reads 916..980.
    assert_eq!(m, 980 - 468);
}

#[test]
fn read_around_under_a_tight_cache_rereads_what_it_evicted() {
    // A cyclic scan of 200 pages through a 100-page cache: LRU misses every
    // page on demand; readahead cannot do better, and a window never
    // evicts itself.
    let s = Stream::of(&[1; 200], &(0..200).chain(0..200).chain(0..200).collect::<Vec<_>>());
    let demand = generated(LruCurve::new(&s).misses(100));
    assert_eq!(demand, 600);
    for policy in 0..2 {
        let m = match policy {
            0 => generated(faults::replay(&s, readahead(32), &mut Lru::new(vec![1; 200]), 100)),
            _ => generated(faults::replay(&s, readahead(32), &mut TwoList::new(vec![1; 200]), 100)),
        };
        assert!((600..=1200).contains(&m), "policy {policy}: {m}");
    }
}

#[test]
fn a_cache_below_one_page_misses_every_access_under_readahead() {
    let s = Stream::of(&[1; 8], &[0, 1, 0, 1, 2]);
    assert_eq!(generated(faults::replay(&s, readahead(4), &mut Lru::new(vec![1; 8]), 0)), 5);
    assert_eq!(generated(faults::replay(&s, readahead(4), &mut TwoList::new(vec![1; 8]), 0)), 5);
}

/// Streams the fault path finds interesting: several files, atoms of 1 to
/// 40 pages, read mostly in sequential sweeps (so that readahead marks are
/// hit where the window expects them), with jumps and hot re-reads.
fn sweeping_stream(rng: &mut Rng) -> Stream {
    let atoms = 5 + rng.below(60) as usize;
    let atom_pages: Vec<u32> = (0..atoms)
        .map(|_| {
            let largest = if rng.below(3) == 0 { 40 } else { 6 };
            1 + rng.below(largest) as u32
        })
        .collect();
    let atom_first: Vec<u64> =
        atom_pages.iter().scan(0u64, |at, &w| Some(std::mem::replace(at, *at + u64::from(w)))).collect();
    let total: u64 = atom_pages.iter().map(|&w| u64::from(w)).sum();
    // Up to three files, cut at atom boundaries.
    let mut cuts: Vec<u64> = (0..rng.below(3)).map(|_| atom_first[rng.below(atoms as u64) as usize]).collect();
    cuts.extend([0, total]);
    cuts.sort_unstable();
    cuts.dedup();
    let files: Vec<_> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
    let mut accesses = Vec::new();
    let mut at = 0u32;
    for _ in 0..rng.below(400) + 20 {
        accesses.push(at);
        at = match rng.below(10) {
            0 => rng.below(atoms as u64) as u32,
            1 => rng.below(3) as u32,
            _ => (at + 1) % atoms as u32,
        };
    }
    let mid = accesses.len() as u32 / 3;
    let file_ids = (0..files.len() as u32).map(|f| (f, 0)).collect();
    Stream {
        atom_pages,
        atom_first,
        files,
        file_ids,
        accesses,
        periods: vec![(0, Period::Prompt), (mid, Period::Generate)],
    }
}

/// A read-around window of one of `pages`, with fault-around of 1 to 16 pages.
fn random_window(rng: &mut Rng, pages: &[u64]) -> Window {
    Window { pages: pages[rng.below(pages.len() as u64) as usize], fault_around: 1 << rng.below(5) }
}

/// `check(case, stream, its pages, window)` on `cases` sweeping streams
/// from `seed`, each with a window of one of `windows` pages.
fn each_sweep(seed: u64, cases: u64, windows: &[u64], mut check: impl FnMut(u64, &Stream, u64, Window)) {
    let mut rng = Rng(seed);
    for case in 0..cases {
        let s = sweeping_stream(&mut rng);
        let window = random_window(&mut rng, windows);
        check(case, &s, s.total_pages(), window);
    }
}

#[test]
fn the_run_replay_equals_the_page_replay_on_random_streams() {
    each_sweep(0xfa57, 400, &[0, 2, 4, 8, 16, 32, 64], |case, s, total, window| {
        for capacity in [0, 1, 2, 3, total / 4, total / 3, total / 2, total - 1, total, total + 5] {
            let pages = faults::replay(s, window, &mut Lru::new(vec![1; total as usize]), capacity);
            let runs = lru_faults::replay(s, window, capacity);
            assert_eq!(runs, pages, "case {case}, {window:?}, capacity {capacity}");
        }
    });
}

#[test]
fn the_run_replay_gives_the_hand_worked_readahead_answers() {
    let mut s = Stream::of(&[1; 1000], &[500]);
    s.accesses.extend(500..900);
    assert_eq!(generated(lru_faults::replay(&s, readahead(64), 10_000)), 980 - 468);
    // The same file as one atom per 100 pages: the same pages are read.
    let mut s = Stream::of(&[100; 10], &[5]);
    s.accesses.extend(5..9);
    assert_eq!(
        generated(lru_faults::replay(&s, readahead(64), 10_000)),
        generated(faults::replay(&s, readahead(64), &mut Lru::new(vec![1; 1000]), 10_000))
    );
    let s = Stream::of(&[1; 8], &[0, 1, 0, 1, 2]);
    assert_eq!(generated(lru_faults::replay(&s, readahead(4), 0)), 5);
}

#[test]
fn the_two_list_model_in_large_folios_reads_each_page_once_when_all_fits() {
    let mut rng = Rng(0xf011);
    for case in 0..300 {
        let s = sweeping_stream(&mut rng);
        let total = s.total_pages();
        let window = random_window(&mut rng, &[0, 4, 8, 16, 32, 64]);
        let all = |m: Misses| m.pages.iter().sum::<u64>();
        for capacity in [0, 1, 3, total / 4, total / 2, total - 1] {
            // Evicting whole folios must not wedge the replay at any size.
            faults::replay(&s, window, &mut TwoList::with_large_folios(total as usize), capacity);
        }
        // Nothing is evicted: a page is read at most once.
        let m = all(faults::replay(&s, window, &mut TwoList::with_large_folios(total as usize), total));
        assert!(m <= total, "case {case}, {window:?}: {m} pages read of {total}");
    }
}

/// Skipping the reclaims that can only rotate pages in flight reads the
/// same pages as running them, windows large and small against the cache.
#[test]
fn the_two_list_model_skips_only_futile_reclaims() {
    each_sweep(0x5c1f, 300, &[4, 8, 16, 32, 64], |case, s, total, window| {
        for capacity in [1, 2, 5, 9, total / 8, total / 4, total / 2, total - 1] {
            let replay = |cache: TwoList| {
                let mut reads = PageReads::new(Counting::All, total);
                let misses =
                    faults::replay_into(s, window, &mut cache.with_cluster(1 + case % 33), capacity, &mut reads);
                (misses, reads.counts)
            };
            let fast = replay(TwoList::with_large_folios(total as usize));
            let full = replay(TwoList::with_large_folios(total as usize).without_shortcut());
            assert_eq!(fast, full, "case {case}, {window:?}, capacity {capacity}");
        }
    });
}

/// Every replay, told to record the pages it reads, reads the same (the
/// recording changes nothing), and its pages read in the counted phase sum
/// to its misses there; the run replay reads the very pages the page
/// replay reads.
#[test]
fn pages_read_sum_to_the_misses_of_every_replay() {
    let mut rng = Rng(0xde7a);
    for case in 0..150 {
        let s = sweeping_stream(&mut rng);
        let total = s.total_pages();
        let window = random_window(&mut rng, &[0, 4, 16, 64]);
        let next = next_uses(&s);
        for counting in [Counting::Generate, Counting::All] {
            for capacity in [0, 1, total / 3, total - 1, total] {
                let recorded = |plain: Misses, replay: &dyn Fn(&mut PageReads) -> Misses| {
                    let mut reads = PageReads::new(counting, total);
                    let misses = replay(&mut reads);
                    assert_eq!(misses, plain, "case {case}, capacity {capacity}");
                    assert_eq!(reads.total(), misses.counted(counting), "case {case}, capacity {capacity}");
                    reads.counts
                };
                let runs = recorded(lru_faults::replay(&s, window, capacity), &|r| {
                    lru_faults::replay_into(&s, window, capacity, r)
                });
                let pages =
                    recorded(faults::replay(&s, window, &mut Lru::new(vec![1; total as usize]), capacity), &|r| {
                        faults::replay_into(&s, window, &mut Lru::new(vec![1; total as usize]), capacity, r)
                    });
                assert_eq!(runs, pages, "case {case}, {window:?}, capacity {capacity}");
                let folios = |r: &mut PageReads| {
                    let mut cache = TwoList::with_large_folios(total as usize);
                    faults::replay_into(&s, window, &mut cache, capacity, r)
                };
                recorded(folios(&mut PageReads::new(counting, total)), &folios);
                recorded(opt_one_size(&s, &next, capacity), &|r| opt_one_size_into(&s, &next, capacity, r));
                let lru = recorded(lru_one_size(&s, capacity), &|r| lru_one_size_into(&s, capacity, r));
                assert_eq!(lru_one_size(&s, capacity), LruCurve::new(&s).misses(capacity));
                assert!(lru.iter().all(|&c| c <= 1) || capacity < total, "case {case}: all fits, reads once");
                recorded(two_list_one_size(&s, capacity), &|r| two_list_one_size_into(&s, capacity, r));
            }
        }
    }
}

/// `run` with a detail budget: the same rows, and per policy the pages read
/// there summing to its row, on both engines, with and without readahead.
#[test]
fn the_detail_budget_changes_no_row_and_its_pages_sum_to_it() {
    let mut rng = Rng(0x5eed);
    let bar = indicatif::ProgressBar::hidden();
    let policies = [Policy::Lru, Policy::Opt, Policy::TwoList];
    for case in 0..40 {
        let stream = sweeping_stream(&mut rng);
        let total = stream.total_pages();
        let budgets = [total / 4 * 4096, total / 2 * 4096, total * 4096];
        for (readahead, engine) in [(None, Engine::Runs), (Some(16), Engine::Runs), (Some(16), Engine::Pages)] {
            let replay = Replay {
                stream: stream.clone(),
                page_bytes: 4096,
                generated_tokens: 3,
                cut: None,
                populate: false,
                readahead: readahead
                    .map(|pages| Readahead { window_bytes: pages * 4096, fault_around_bytes: 4 * 4096 }),
                engine,
                footprint_pages: 0,
                anon_bytes: 0,
            };
            let (plain, none) = run(&replay, &budgets, &policies, 0, Counting::Generate, None, &bar);
            assert!(none.is_empty());
            let (rows, reads) = run(&replay, &budgets, &policies, 0, Counting::Generate, Some(budgets[1]), &bar);
            assert_eq!(format!("{rows:?}"), format!("{plain:?}"), "case {case}");
            assert_eq!(reads.iter().map(|r| r.0).collect::<Vec<_>>(), policies);
            for (policy, counts) in reads {
                let row = rows.iter().find(|r| r.budget_bytes == budgets[1] && r.policy == policy).unwrap();
                let pages: u64 = counts.iter().map(|&c| u64::from(c)).sum();
                assert_eq!(pages, row.misses, "case {case}, {policy:?}, {readahead:?}");
            }
        }
    }
}

/// 2q's row is the median of the two-list replays across the band around
/// the budget's capacity (five capacities, [`TWO_LIST_BAND_BYTES`] either
/// side), and the detail budget records that same replay.
#[test]
fn two_list_rows_are_the_median_of_the_band() {
    let mut rng = Rng(0xba2d);
    let bar = indicatif::ProgressBar::hidden();
    // 16 KiB pages: the band's steps are 8 pages apart.
    let page = 16 << 10;
    let step = super::TWO_LIST_BAND_BYTES / 2 / page;
    let mut uneven = 0;
    for case in 0..60 {
        let stream = sweeping_stream(&mut rng);
        let total = stream.total_pages();
        let capacity = total / 3 + 2 * step;
        let replay = Replay {
            stream: stream.clone(),
            page_bytes: page,
            generated_tokens: 3,
            cut: None,
            populate: false,
            readahead: None,
            engine: Engine::Runs,
            footprint_pages: 0,
            anon_bytes: 0,
        };
        let mut band: Vec<u64> =
            (0..5).map(|i| generated(two_list_one_size(&stream, capacity - 2 * step + i * step))).collect();
        band.sort_unstable();
        uneven += usize::from(band[0] != band[4]);
        let budget = capacity * page;
        let (rows, reads) = run(&replay, &[budget], &[Policy::TwoList], 0, Counting::Generate, Some(budget), &bar);
        assert_eq!(rows[0].misses, band[2], "case {case}: band {band:?}");
        assert_eq!(reads[0].1.iter().map(|&c| u64::from(c)).sum::<u64>(), band[2], "case {case}");
    }
    assert!(uneven > 10, "only {uneven} bands of 60 differ within: the test tests nothing");
}
