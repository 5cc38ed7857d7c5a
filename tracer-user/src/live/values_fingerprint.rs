//! A node output's fingerprint from its bytes as copied by the probe: the
//! span from its first to its last element, read through its strides. The
//! recorder runs on the cores llama computes on, and fingerprinting is most
//! of its work in `--values`: the elements are decoded a block at a time
//! and each element's sketch slot comes from a table, not a hash.

use std::sync::OnceLock;

use crate::format::values::{EDGE_VALUES, Fingerprint, PROJECTION_DIMS};

/// Element types a fingerprint reads (ggml's `GGML_TYPE_*`, stable values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    F32,
    F16,
    Bf16,
    I32,
}

impl Element {
    pub fn of(type_id: i32) -> Option<Element> {
        match type_id {
            0 => Some(Element::F32),
            1 => Some(Element::F16),
            30 => Some(Element::Bf16),
            26 => Some(Element::I32),
            _ => None,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Element::F32 | Element::I32 => 4,
            Element::F16 | Element::Bf16 => 2,
        }
    }

    fn value(self, b: &[u8]) -> f32 {
        match self {
            Element::F32 => f32_of(b),
            Element::I32 => i32_of(b),
            Element::F16 => f16_of(b),
            Element::Bf16 => bf16_of(b),
        }
    }

    /// `bytes`' elements appended to `out`: one match per block, and each
    /// arm's loop inlines its converter.
    fn decode(self, bytes: &[u8], out: &mut Vec<f32>) {
        match self {
            Element::F32 => out.extend(bytes.chunks_exact(4).map(f32_of)),
            Element::I32 => out.extend(bytes.chunks_exact(4).map(i32_of)),
            Element::F16 => out.extend(bytes.chunks_exact(2).map(f16_of)),
            Element::Bf16 => out.extend(bytes.chunks_exact(2).map(bf16_of)),
        }
    }
}

fn f32_of(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn i32_of(b: &[u8]) -> f32 {
    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32
}

fn f16_of(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn bf16_of(b: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
}

/// IEEE half to single, exactly (every half is a single).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let shift = m.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((m << shift) & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Same in every run and build, so projections compare across runs.
const SEED: u64 = 0x7474_7261_6365_7631;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Element `i`'s count-sketch slot: the dimension it adds to, and whether negated.
fn sketch_slot(i: u64) -> (usize, bool) {
    let h = splitmix64(SEED ^ i);
    ((h as usize) % PROJECTION_DIMS, h & (1 << 32) != 0)
}

/// Indices whose slots are tabled: a vocabulary's logits (Gemma's 262144)
/// and every smaller node; 1 MiB, made once.
const TABLED: usize = 1 << 20;
const NEGATED: u8 = 0x80;
// A slot's dimension is its low bits (a mask, not a bounds check, per element).
const _: () = assert!(PROJECTION_DIMS <= NEGATED as usize && PROJECTION_DIMS.is_power_of_two());

fn sketch_table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..TABLED as u64)
            .map(|i| {
                let (dim, negated) = sketch_slot(i);
                dim as u8 | if negated { NEGATED } else { 0 }
            })
            .collect()
    })
}

/// Elements decoded per block.
const BLOCK: usize = 4096;

/// The fingerprint of the tensor of shape `ne`, strides `nb`, whose span
/// (element 0 first) is `span`; `None` if the span is shorter than the
/// shape needs.
pub fn fingerprint(element: Element, ne: [i64; 4], nb: [u64; 4], span: &[u8]) -> Option<Fingerprint> {
    let size = element.bytes();
    let ne: Vec<usize> = ne.iter().map(|&n| usize::try_from(n).ok()).collect::<Option<_>>()?;
    let elements: usize = ne.iter().product();
    let contiguous =
        nb[0] as usize == size && (1..4).all(|i| nb[i] as usize == nb[i - 1] as usize * ne[i - 1] || ne[i] == 1);
    let mut hasher = blake3::Hasher::new();
    let mut acc = Accumulator::new(elements);
    let mut values = Vec::with_capacity(BLOCK.min(elements));
    if contiguous {
        let bytes = span.get(..elements * size)?;
        hasher.update(bytes);
        for block in bytes.chunks(BLOCK * size) {
            values.clear();
            element.decode(block, &mut values);
            acc.add_all(&values);
        }
    } else {
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let row = i3 * nb[3] as usize + i2 * nb[2] as usize + i1 * nb[1] as usize;
                    values.clear();
                    for i0 in 0..ne[0] {
                        let at = row + i0 * nb[0] as usize;
                        let b = span.get(at..at + size)?;
                        hasher.update(b);
                        values.push(element.value(b));
                    }
                    acc.add_all(&values);
                }
            }
        }
    }
    Some(acc.finish(*hasher.finalize().as_bytes()))
}

struct Accumulator {
    n: u64,
    total: u64,
    sum: f64,
    squares: f64,
    min: f64,
    max: f64,
    nan: u64,
    inf: u64,
    first: Vec<f32>,
    last: Vec<f32>,
    projection: [f64; PROJECTION_DIMS],
}

impl Accumulator {
    fn new(total: usize) -> Self {
        Self {
            n: 0,
            total: total as u64,
            sum: 0.0,
            squares: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            nan: 0,
            inf: 0,
            first: Vec::with_capacity(EDGE_VALUES),
            last: Vec::with_capacity(EDGE_VALUES),
            projection: [0.0; PROJECTION_DIMS],
        }
    }

    /// The next elements, in logical order. Sums and extremes are taken in
    /// that order (floating-point sums depend on it); each sketch dimension
    /// adds its elements in that order too.
    fn add_all(&mut self, values: &[f32]) {
        let start = self.n;
        let end = start + values.len() as u64;
        for i in start..end.min(EDGE_VALUES as u64) {
            self.first.push(values[(i - start) as usize]);
        }
        for i in self.total.saturating_sub(EDGE_VALUES as u64).max(start)..end {
            self.last.push(values[(i - start) as usize]);
        }
        let table = sketch_table();
        let (mut sum, mut squares, mut min, mut max) = (self.sum, self.squares, self.min, self.max);
        for (i, &v) in (start..).zip(values) {
            let x = f64::from(v);
            sum += x;
            squares += x * x;
            if !v.is_finite() {
                if v.is_nan() {
                    self.nan += 1;
                } else {
                    (min, max) = (min.min(x), max.max(x));
                    self.inf += 1;
                }
                continue;
            }
            (min, max) = (min.min(x), max.max(x));
            let (dim, negated) = match table.get(i as usize) {
                Some(&slot) => (slot as usize & (PROJECTION_DIMS - 1), slot & NEGATED != 0),
                None => sketch_slot(i),
            };
            self.projection[dim] += if negated { -x } else { x };
        }
        (self.sum, self.squares, self.min, self.max) = (sum, squares, min, max);
        self.n = end;
    }

    fn finish(self, blake3: [u8; 32]) -> Fingerprint {
        let n = self.n.max(1) as f64;
        let (min, max) = if self.min <= self.max { (self.min, self.max) } else { (f64::NAN, f64::NAN) };
        Fingerprint {
            elements: self.n,
            blake3,
            sum: self.sum,
            rms: (self.squares / n).sqrt(),
            min,
            max,
            nan: self.nan,
            inf: self.inf,
            first: self.first,
            last: self.last,
            projection: self.projection.map(|p| p as f32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn contiguous_f32_stats_and_hash() {
        let values = [1.0f32, -2.0, 3.0, f32::NAN, f32::INFINITY, 0.5];
        let bytes = f32_bytes(&values);
        let fp = fingerprint(Element::F32, [3, 2, 1, 1], [4, 12, 24, 24], &bytes).unwrap();
        assert_eq!(fp.elements, 6);
        assert_eq!(fp.blake3, *blake3::hash(&bytes).as_bytes());
        assert_eq!((fp.nan, fp.inf), (1, 1));
        assert_eq!((fp.min, fp.max), (-2.0, f64::INFINITY));
        assert_eq!(fp.first, vec![1.0, -2.0, 3.0]);
        assert_eq!(fp.last[2], 0.5);
        assert!(fp.sum.is_nan());
    }

    #[test]
    fn strided_reads_in_logical_order() {
        // A 2x2 transposed view of [[1, 2], [3, 4]]: logical order 1, 3, 2, 4.
        let bytes = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let fp = fingerprint(Element::F32, [2, 2, 1, 1], [8, 4, 16, 16], &bytes).unwrap();
        assert_eq!(fp.blake3, *blake3::hash(&f32_bytes(&[1.0, 3.0, 2.0, 4.0])).as_bytes());
        assert_eq!(fp.first, vec![1.0, 3.0, 2.0]);
        assert_eq!(fp.sum, 10.0);
        assert!((fp.rms - (30.0f64 / 4.0).sqrt()).abs() < 1e-12);
    }

    /// The per-element fingerprint this module computed before blocks and
    /// the table: the same figures, bit for bit.
    fn reference(values: &[f32]) -> Fingerprint {
        let mut acc = Accumulator::new(values.len());
        let (mut first, mut last) = (Vec::new(), Vec::new());
        for (i, &v) in values.iter().enumerate() {
            let (i, x) = (i as u64, f64::from(v));
            if i < EDGE_VALUES as u64 {
                first.push(v);
            }
            if i + EDGE_VALUES as u64 >= acc.total {
                last.push(v);
            }
            acc.sum += x;
            acc.squares += x * x;
            if v.is_nan() {
                acc.nan += 1;
                continue;
            }
            acc.min = acc.min.min(x);
            acc.max = acc.max.max(x);
            if v.is_infinite() {
                acc.inf += 1;
                continue;
            }
            let h = splitmix64(SEED ^ i);
            acc.projection[(h as usize) % PROJECTION_DIMS] += if h & (1 << 32) == 0 { x } else { -x };
        }
        acc.n = values.len() as u64;
        (acc.first, acc.last) = (first, last);
        acc.finish([0; 32])
    }

    #[test]
    fn blocks_and_the_table_give_the_per_element_figures() {
        // Past the table's end and across blocks; signed zeros, NaN and
        // infinities among them.
        let n = TABLED + BLOCK + 17;
        let mut state = 7u64;
        let values: Vec<f32> = (0..n)
            .map(|i| {
                state = splitmix64(state);
                // Past the first BLOCK + 1, whose sums stay finite.
                match i % 5003 {
                    4500 => f32::NAN,
                    4501 => f32::NEG_INFINITY,
                    4502 => -0.0,
                    4503 => 0.0,
                    _ => (state >> 40) as f32 / (1u64 << 20) as f32 - 8.0,
                }
            })
            .collect();
        for values in [&values[..], &values[..2], &values[..BLOCK + 1]] {
            let bytes = f32_bytes(values);
            let got =
                fingerprint(Element::F32, [values.len() as i64, 1, 1, 1], [4, 4 * values.len() as u64, 0, 0], &bytes)
                    .unwrap();
            let want = reference(values);
            let bits = |f: &Fingerprint| {
                let p: Vec<u32> = f.projection.iter().map(|v| v.to_bits()).collect();
                let e: Vec<u32> = f.first.iter().chain(&f.last).map(|v| v.to_bits()).collect();
                (f.elements, f.sum.to_bits(), f.rms.to_bits(), f.min.to_bits(), f.max.to_bits(), f.nan, f.inf, p, e)
            };
            assert_eq!(bits(&got), bits(&want), "{} values", values.len());
        }
    }

    #[test]
    fn halves_convert_exactly() {
        for (h, f) in [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x0001, 5.960_464_5e-8), (0x7c00, f32::INFINITY)] {
            assert_eq!(f16_to_f32(h), f);
        }
        assert!(fingerprint(Element::F16, [2, 1, 1, 1], [2, 4, 4, 4], &[0, 0x3c]).is_none(), "span too short");
    }
}
