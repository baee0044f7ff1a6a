//! What the process group needs from a key-value store, and an in-memory store for tests.
//!
//! The group only needs three calls (set, blocking get with a timeout, atomic add). Keys passed
//! here are already namespaced by the group (`rdrun/<run_id>/<restart>/...`), so implementations
//! apply no prefix of their own.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A store error as text (the group wraps it into [`super::RuntimeError::Store`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreFailure {
    #[error("timed out after {0:?} waiting for key {1:?}")]
    Timeout(Duration, String),
    #[error("{0}")]
    Other(String),
}

/// The store calls the process group makes.
pub trait Rendezvous: Send + Sync {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreFailure>;
    /// Waits until `key` exists (up to `timeout`) and returns its value.
    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreFailure>;
    /// Adds `delta` to the integer stored at `key` (missing = 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreFailure>;
}

type Shared = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// An in-process store (threads of one test share it through an `Arc`).
#[derive(Default, Clone)]
pub struct MemStore {
    inner: Shared,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Rendezvous for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreFailure> {
        let (m, cv) = &*self.inner;
        m.lock()
            .map_err(|_| StoreFailure::Other("poisoned".into()))?
            .insert(key.to_string(), value.to_vec());
        cv.notify_all();
        Ok(())
    }

    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreFailure> {
        let (m, cv) = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut g = m
            .lock()
            .map_err(|_| StoreFailure::Other("poisoned".into()))?;
        loop {
            if let Some(v) = g.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreFailure::Timeout(timeout, key.to_string()));
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .map_err(|_| StoreFailure::Other("poisoned".into()))?
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreFailure> {
        let (m, cv) = &*self.inner;
        let mut g = m
            .lock()
            .map_err(|_| StoreFailure::Other("poisoned".into()))?;
        // Stored as decimal text, like PyTorch's TCPStore ADD.
        let cur: i64 = g
            .get(key)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        let new = cur.wrapping_add(delta);
        g.insert(key.to_string(), new.to_string().into_bytes());
        cv.notify_all();
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_add_and_timeout() {
        let s = MemStore::new();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.get_wait("k", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        s.set("k", b"v").unwrap();
        assert_eq!(t.join().unwrap().unwrap(), b"v");
        assert_eq!(s.add("c", 2).unwrap(), 2);
        assert_eq!(s.add("c", 3).unwrap(), 5);
        assert!(matches!(
            s.get_wait("missing", Duration::from_millis(30)),
            Err(StoreFailure::Timeout(..))
        ));
    }
}
