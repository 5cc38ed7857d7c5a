//! Events per fixed time bucket as counter points, shared by the Perfetto and
//! Chrome timelines so both draw the same step function: a bucket's total at
//! its start, and a zero where a run of empty buckets begins and after the
//! last bucket (never the same point twice).

/// Counters are drawn per 10 ms.
pub const BUCKET_NS: u64 = 10_000_000;

#[derive(Debug, Default)]
pub struct Buckets {
    open: Option<(u64, i64)>,
}

/// Up to two counter points (ts, value) to write, in order.
pub type Points = [Option<(u64, i64)>; 2];

impl Buckets {
    /// Adds `n` at `ts`; returns the points of the bucket this closes.
    pub fn add(&mut self, ts: u64, n: i64) -> Points {
        let bucket = ts / BUCKET_NS;
        match self.open {
            Some((b, ref mut total)) if b == bucket => {
                *total += n;
                [None, None]
            }
            Some((b, total)) => {
                self.open = Some((bucket, n));
                let gap = (bucket > b + 1).then_some(((b + 1) * BUCKET_NS, 0));
                [Some((b * BUCKET_NS, total)), gap]
            }
            None => {
                self.open = Some((bucket, n));
                [None, None]
            }
        }
    }

    /// The last bucket and the zero after it.
    pub fn finish(&mut self) -> Points {
        match self.open.take() {
            Some((b, total)) => [Some((b * BUCKET_NS, total)), Some(((b + 1) * BUCKET_NS, 0))],
            None => [None, None],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_buckets_step_and_gaps_drop_to_zero_once() {
        let mut b = Buckets::default();
        let mut points = Vec::new();
        for ts in [1, 2, BUCKET_NS + 5, 4 * BUCKET_NS] {
            points.extend(b.add(ts, 1).into_iter().flatten());
        }
        points.extend(b.finish().into_iter().flatten());
        let w = BUCKET_NS;
        assert_eq!(points, [(0, 2), (w, 1), (2 * w, 0), (4 * w, 1), (5 * w, 0)]);
        assert_eq!(b.finish(), [None, None]);
    }
}
