//! Tests of the op table.

use super::{builder::ubatch_spans, *};
use crate::view::index::column::Stepped;

/// Ops whose rows ran in `ubatch` (`NONE_U32`: outside any), with the
/// column kept (`keep`) or the spans only.
fn ops_of(ubatch: &[u32], keep: bool) -> Ops {
    let n = ubatch.len();
    let (ubatch_ops, spans, _) = ubatch_spans(ubatch);
    Ops {
        seq: Packed::new(Stepped::new(&(0..n as u64).collect::<Vec<_>>()), 1),
        start: Packed::new(Stepped::new(&vec![0; n]), 0),
        dur: Column::default(),
        ubatch: if keep { ubatch.to_vec().into() } else { Column::default() },
        combo: vec![0; n].into(),
        weight_bytes: Narrow::default(),
        combos: Vec::new(),
        sigs: Vec::new(),
        strings: Vec::new(),
        op_names: Vec::new(),
        ubatch_ops,
        ubatch_spans_pure: !keep,
        spans: spans.into(),
        by_dur: OnceLock::new(),
        by_weight: OnceLock::new(),
        by_layer: OnceLock::new(),
    }
}

#[test]
fn rows_sort_by_key_then_row_with_few_keys_or_many() {
    for n_keys in [3u64, 100_000] {
        let key = |i: usize| (i as u64 * 7919) % n_keys;
        let n = 200_000;
        let mut want: Vec<u32> = (0..n as u32).collect();
        want.sort_by_key(|&i| (key(i as usize), i));
        assert_eq!(*sorted_rows(n, key), want, "{n_keys} keys");
    }
}

#[test]
fn spans_say_each_rows_ubatch_as_the_column_does() {
    const X: u32 = NONE_U32;
    let ubatch = [X, X, 0, 0, 0, X, 2, 2, 1, 1, 1, 1, X, 3];
    let (column, spans) = (ops_of(&ubatch, true), ops_of(&ubatch, false));
    for (i, &u) in ubatch.iter().enumerate() {
        let want = (u != X).then_some(u);
        assert_eq!((column.ubatch(i), spans.ubatch(i)), (want, want), "row {i}");
    }
    let runs = |ops: &Ops, lo, hi| {
        let mut out = Vec::new();
        ops.for_ubatch_runs(lo, hi, |rows, u| out.push((rows, u)));
        out
    };
    for lo in 0..ubatch.len() {
        for hi in lo..=ubatch.len() {
            let got = runs(&spans, lo, hi);
            assert_eq!(got, runs(&column, lo, hi), "[{lo}, {hi})");
            let rows: Vec<u32> = got.iter().flat_map(|(r, u)| r.clone().map(move |_| *u)).collect();
            assert_eq!(rows, ubatch[lo..hi], "[{lo}, {hi})");
        }
    }
}

#[test]
fn set_bits_sets_exactly_the_range() {
    for from in 0..200 {
        for to in from + 1..=200 {
            let mut mask = vec![0u64; 4];
            set_bits(&mut mask, from, to);
            let set: Vec<usize> = (0..256).filter(|&i| mask[i / 64] >> (i % 64) & 1 == 1).collect();
            assert_eq!(set, (from..to).collect::<Vec<_>>(), "[{from}, {to})");
        }
    }
}
