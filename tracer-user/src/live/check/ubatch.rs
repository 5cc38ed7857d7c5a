//! The `llama_ubatch` part of the live check. A build newer than the tables
//! gets the newest table's ubatch layout on trial, so this check must catch
//! a moved field, not only a wrong `n_tokens`: the ubatch's token array must
//! be, id for id, the ids its graph's token GET_ROWS reads; positions must
//! run on by one within each sequence; sequence ids must be small. A field
//! read at a wrong offset gives a null or foreign pointer (no array, or
//! other numbers), and a count that is not the token input's length.

use tracer_common::batch;

use crate::events::InputRecord;

/// `LLAMA_MAX_SEQ`: no sequence id reaches it.
const MAX_SEQ: i32 = 256;

/// The arrays of the ubatch about to be computed, as its probe sent them
/// (one event per array, all with the probe's timestamp).
#[derive(Debug, Default)]
pub struct UbatchSeen {
    ts_ns: u64,
    n_tokens: u32,
    token: Option<Vec<i32>>,
    pos: Option<Vec<i32>>,
    seq: Option<Vec<i32>>,
}

/// What a graph reads as its tokens: the length of the token GET_ROWS'
/// ids and, where they were sent, the ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInput {
    pub len: i64,
    pub ids: Option<Vec<i32>>,
}

impl UbatchSeen {
    pub fn on_batch(&mut self, b: &InputRecord) {
        if b.header.ts_ns != self.ts_ns || self.n_tokens == 0 {
            *self =
                Self { ts_ns: b.header.ts_ns, n_tokens: u32::try_from(b.uid).unwrap_or(u32::MAX), ..Self::default() };
        }
        let values = Some(b.i32s());
        match b.tensor {
            batch::TOKEN => self.token = values,
            batch::POS => self.pos = values,
            batch::SEQ => self.seq = values,
            _ => {}
        }
    }

    pub fn seen(&self) -> bool {
        self.n_tokens > 0
    }

    /// Whether this ubatch is the one the graph computed; why not, if not.
    pub fn check(&self, input: &TokenInput) -> Result<(), String> {
        let n = self.n_tokens;
        if i64::from(n) != input.len {
            return Err(format!("the ubatch's n_tokens ({n}) is not its graph's token input length ({})", input.len));
        }
        let Some(token) = &self.token else {
            return Err(format!("the ubatch of {n} tokens has no token array its graph reads token ids from"));
        };
        if let Some(ids) = &input.ids {
            let common = token.len().min(ids.len());
            if common == 0 || token[..common] != ids[..common] {
                return Err(format!("the ubatch's token ids {:?} are not its graph's {:?}", head(token), head(ids)));
            }
        }
        let Some(seq) = &self.seq else { return Err("the ubatch has no sequence ids".into()) };
        if let Some(bad) = seq.iter().find(|s| !(0..MAX_SEQ).contains(*s)) {
            return Err(format!("the ubatch holds sequence id {bad}, not one below {MAX_SEQ}"));
        }
        let Some(pos) = &self.pos else { return Err("the ubatch has no positions".into()) };
        if !consecutive_per_sequence(pos, seq) {
            return Err(format!("the ubatch's positions {:?} do not run on by one in each sequence", head(pos)));
        }
        Ok(())
    }
}

/// `pos[i]` is the previous position of `seq[i]`'s sequence plus one (the
/// first of each sequence: any position at or above 0).
fn consecutive_per_sequence(pos: &[i32], seq: &[i32]) -> bool {
    let mut last: std::collections::HashMap<i32, i32> = std::collections::HashMap::new();
    pos.iter().zip(seq).all(|(&p, &s)| {
        let fits = p >= 0 && last.get(&s).is_none_or(|&prev| prev.checked_add(1) == Some(p));
        last.insert(s, p);
        fits
    })
}

fn head(values: &[i32]) -> &[i32] {
    &values[..values.len().min(8)]
}

#[cfg(test)]
mod tests {
    use tracer_common::{EventHeader, EventKind};

    use super::*;

    fn array(ts_ns: u64, n: u64, kind: u64, values: &[i32]) -> InputRecord {
        let header = EventHeader { kind: EventKind::Batch as u32, ts_ns, ..Default::default() };
        InputRecord { header, uid: n, tensor: kind, data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
    }

    fn seen(token: &[i32], pos: &[i32], seq: &[i32]) -> UbatchSeen {
        let mut u = UbatchSeen::default();
        let n = token.len() as u64;
        for (kind, values) in [(batch::TOKEN, token), (batch::POS, pos), (batch::SEQ, seq)] {
            u.on_batch(&array(10, n, kind, values));
        }
        u
    }

    fn input(ids: &[i32]) -> TokenInput {
        TokenInput { len: ids.len() as i64, ids: Some(ids.to_vec()) }
    }

    #[test]
    fn the_right_ubatch_passes() {
        assert_eq!(seen(&[2, 818, 5279], &[0, 1, 2], &[0, 0, 0]).check(&input(&[2, 818, 5279])), Ok(()));
        // Two sequences interleaved, each running on from where it was.
        assert_eq!(seen(&[5, 6, 7, 8], &[7, 3, 8, 4], &[0, 1, 0, 1]).check(&input(&[5, 6, 7, 8])), Ok(()));
    }

    #[test]
    fn a_moved_field_is_caught() {
        // Token array read from `pos` (8 bytes on): right length, other numbers.
        let err = seen(&[0, 1, 2], &[0, 1, 2], &[0, 0, 0]).check(&input(&[2, 818, 5279])).unwrap_err();
        assert!(err.contains("token ids [0, 1, 2] are not its graph's [2, 818, 5279]"), "{err}");
        // Positions read from the token array.
        let err = seen(&[2, 818, 5279], &[2, 818, 5279], &[0, 0, 0]).check(&input(&[2, 818, 5279])).unwrap_err();
        assert!(err.contains("do not run on by one"), "{err}");
        // Sequence ids read from another array.
        let err = seen(&[2, 818], &[0, 1], &[818, 2]).check(&input(&[2, 818])).unwrap_err();
        assert!(err.contains("sequence id 818"), "{err}");
        // No token array at all (a null pointer there).
        let mut u = seen(&[2], &[0], &[0]);
        u.token = None;
        assert!(u.check(&input(&[2])).unwrap_err().contains("no token array"));
        assert!(seen(&[2, 3], &[0, 1], &[0, 0]).check(&input(&[2, 3, 4])).unwrap_err().contains("n_tokens (2)"));
    }

    #[test]
    fn arrays_of_a_later_probe_hit_start_a_new_ubatch() {
        let mut u = seen(&[1, 2], &[0, 1], &[0, 0]);
        u.on_batch(&array(20, 1, batch::TOKEN, &[9]));
        assert_eq!(u.n_tokens, 1);
        assert_eq!((u.token.as_deref(), u.pos.as_deref()), (Some(&[9][..]), None));
    }
}
