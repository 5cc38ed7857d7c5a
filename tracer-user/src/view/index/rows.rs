//! Row sets and orders of the op table: a counting sort for keys that
//! repeat graph after graph, and bit masks set a word at a time.

use super::disk::column::Column;

/// Rows `0..n` by `key` (then by row). Keys are few (a layer; an op's
/// weight bytes, which repeat graph after graph): a counting sort, two
/// passes over the rows (1-2 s on 101 M ops, where a comparison sort took
/// 10-20 s); a comparison sort when they are not.
pub fn sorted_rows(n: usize, key: impl Fn(usize) -> u64) -> Column<u32> {
    const FEW: usize = 1 << 16;
    let mut counts: foldhash::HashMap<u64, u32> = foldhash::HashMap::default();
    for i in 0..n {
        *counts.entry(key(i)).or_default() += 1;
        if counts.len() > FEW {
            // In place, ties by row: no copy of the keys.
            let mut rows: Vec<u32> = (0..n as u32).collect();
            rows.sort_unstable_by_key(|&i| (key(i as usize), i));
            return rows.into();
        }
    }
    let mut keys: Vec<(u64, u32)> = counts.into_iter().collect();
    keys.sort_unstable();
    // Each key's next place in the output.
    let mut next: foldhash::HashMap<u64, u32> = foldhash::HashMap::default();
    let mut at = 0u32;
    for (k, count) in keys {
        next.insert(k, at);
        at += count;
    }
    let mut rows = vec![0u32; n];
    for i in 0..n {
        let slot = next.get_mut(&key(i)).expect("every key was counted");
        rows[*slot as usize] = i as u32;
        *slot += 1;
    }
    rows.into()
}

/// Sets bits `[from, to)` of `mask`, a word at a time.
pub fn set_bits(mask: &mut [u64], from: usize, to: usize) {
    let (first, last) = (from / 64, (to - 1) / 64);
    let low = u64::MAX << (from % 64);
    let high = u64::MAX >> (63 - (to - 1) % 64);
    if first == last {
        mask[first] |= low & high;
        return;
    }
    mask[first] |= low;
    mask[first + 1..last].fill(u64::MAX);
    mask[last] |= high;
}
