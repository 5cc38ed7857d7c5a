//! Recent answers by their bucket-aligned parameters: a pan by less than a
//! bucket, or back, is answered without recomputing.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

/// Kept answers at most, and their bytes at most (a full-screen grid is
/// about 5 MB).
const CAPACITY: usize = 64;
const CAPACITY_BYTES: usize = 64 << 20;

#[derive(Default)]
pub struct Cache {
    recent: Mutex<VecDeque<(String, Arc<Vec<u8>>)>>,
}

impl Cache {
    /// The answer for `key`, computing it with `make` when not kept.
    pub fn get_or<E>(&self, key: String, make: impl FnOnce() -> Result<Vec<u8>, E>) -> Result<Arc<Vec<u8>>, E> {
        {
            let mut recent = self.lock();
            if let Some(entry) = recent.iter().position(|(k, _)| *k == key).and_then(|hit| recent.remove(hit)) {
                let value = entry.1.clone();
                recent.push_front(entry);
                return Ok(value);
            }
        }
        // Computed unlocked: other queries go on meanwhile.
        let value = Arc::new(make()?);
        let mut recent = self.lock();
        recent.push_front((key, value.clone()));
        recent.truncate(CAPACITY);
        let mut bytes = 0;
        let keep = recent.iter().take_while(|(_, v)| {
            bytes += v.len();
            bytes <= CAPACITY_BYTES
        });
        let keep = keep.count().max(1);
        recent.truncate(keep);
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Arc<Vec<u8>>)>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_is_answered_from_the_cache() {
        let cache = Cache::default();
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            Ok::<_, ()>(vec![1, 2])
        };
        assert_eq!(*cache.get_or("a".into(), make).unwrap(), vec![1, 2]);
        assert_eq!(*cache.get_or("a".into(), make).unwrap(), vec![1, 2]);
        assert_eq!(made.get(), 1);
        for i in 0..CAPACITY {
            cache.get_or(format!("k{i}"), make).unwrap();
        }
        cache.get_or("a".into(), make).unwrap();
        assert_eq!(made.get(), 2 + CAPACITY);
        // Large answers: fewer kept.
        let big = || Ok::<_, ()>(vec![0u8; CAPACITY_BYTES / 2 + 1]);
        cache.get_or("b1".into(), big).unwrap();
        cache.get_or("b2".into(), big).unwrap();
        assert_eq!(cache.lock().len(), 1);
    }
}
