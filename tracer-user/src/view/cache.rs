//! Recent answers by their bucket-aligned parameters: a pan by less than a
//! bucket, or back, is answered without recomputing.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

const CAPACITY: usize = 64;

#[derive(Default)]
pub struct Cache {
    recent: Mutex<VecDeque<(String, Arc<Vec<u8>>)>>,
}

impl Cache {
    /// The answer for `key`, computing it with `make` when not kept.
    pub fn get_or<E>(&self, key: String, make: impl FnOnce() -> Result<Vec<u8>, E>) -> Result<Arc<Vec<u8>>, E> {
        if let Some(hit) = self.lock().iter().position(|(k, _)| *k == key) {
            let mut recent = self.lock();
            if let Some(entry) = recent.remove(hit) {
                let value = entry.1.clone();
                recent.push_front(entry);
                return Ok(value);
            }
        }
        let value = Arc::new(make()?);
        let mut recent = self.lock();
        recent.push_front((key, value.clone()));
        recent.truncate(CAPACITY);
        Ok(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Arc<Vec<u8>>)>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }
}
