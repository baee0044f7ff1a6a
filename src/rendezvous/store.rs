//! The few store operations the rendezvous needs, as a trait, plus an in-memory implementation
//! for tests.
//!
//! The rendezvous logic (static and c10d-like) is written against [`RdzvStore`] so it can be
//! tested deterministically with several simulated nodes in one process (`MemStore`, with
//! per-node fault injection) and run for real over the TCPStore-compatible client
//! (`crate::store::client`). Semantics follow PyTorch's TCPStore (spec tcpstore-protocol §2):
//! `compare_set` on a missing key with an empty `expected` creates it and returns `desired`, on a
//! missing key with a non-empty `expected` returns `expected`, otherwise returns the value now
//! stored; `add` stores ASCII decimal and counts a missing key as 0.

#[cfg(test)]
use std::collections::HashMap;
use std::future::Future;
#[cfg(test)]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
#[cfg(test)]
use std::sync::Mutex;
use std::time::Duration;

/// A store operation that failed (connection lost, timeout, protocol error).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct StoreOpError(pub String);

/// Result of one store operation.
pub type StoreResult<T> = Result<T, StoreOpError>;

/// The store operations the rendezvous uses; every future is `Send` so the agent can spawn it.
pub trait RdzvStore: Send + Sync + 'static {
    /// Where the store is, for error messages (`host:port`).
    fn describe(&self) -> String {
        "the rendezvous store".into()
    }

    /// Atomic compare-and-set with TCPStore's semantics (see the module docs).
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> impl Future<Output = StoreResult<Vec<u8>>> + Send;

    /// Overwrites `key`.
    fn set(&self, key: &str, value: &[u8]) -> impl Future<Output = StoreResult<()>> + Send;

    /// Adds `delta` to the decimal counter at `key` (missing = 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> impl Future<Output = StoreResult<i64>> + Send;

    /// Appends `value` to `key` atomically (creates it if missing).
    fn append(&self, key: &str, value: &[u8]) -> impl Future<Output = StoreResult<()>> + Send;

    /// Values of keys that are known to exist (a missing key may block or fail).
    fn multi_get(&self, keys: &[String]) -> impl Future<Output = StoreResult<Vec<Vec<u8>>>> + Send;

    /// Waits until every key exists: `Ok(true)`, or `Ok(false)` when `timeout` passed first.
    fn wait(
        &self,
        keys: &[String],
        timeout: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Overwrites several keys (one request where the store has MULTI_SET; by default one SET
    /// each).
    fn multi_set(
        &self,
        pairs: &[(String, Vec<u8>)],
    ) -> impl Future<Output = StoreResult<()>> + Send {
        async move {
            for (k, v) in pairs {
                self.set(k, v).await?;
            }
            Ok(())
        }
    }

    /// A heartbeat (`add(hb_key, 1)`) and the values of `keys` (known to exist), in one round
    /// trip where the store allows (by default two requests).
    fn beat_and_read(
        &self,
        hb_key: &str,
        keys: &[String],
    ) -> impl Future<Output = StoreResult<Vec<Vec<u8>>>> + Send {
        async move {
            self.add(hb_key, 1).await?;
            self.multi_get(keys).await
        }
    }

    /// Removes `key` (a missing key is fine). By default nothing is removed: callers use it
    /// only to free memory, never for meaning.
    fn delete(&self, key: &str) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = key;
        async { Ok(()) }
    }
}

impl<S: RdzvStore> RdzvStore for Arc<S> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> impl Future<Output = StoreResult<Vec<u8>>> + Send {
        (**self).compare_set(key, expected, desired)
    }
    fn set(&self, key: &str, value: &[u8]) -> impl Future<Output = StoreResult<()>> + Send {
        (**self).set(key, value)
    }
    fn add(&self, key: &str, delta: i64) -> impl Future<Output = StoreResult<i64>> + Send {
        (**self).add(key, delta)
    }
    fn append(&self, key: &str, value: &[u8]) -> impl Future<Output = StoreResult<()>> + Send {
        (**self).append(key, value)
    }
    fn multi_get(&self, keys: &[String]) -> impl Future<Output = StoreResult<Vec<Vec<u8>>>> + Send {
        (**self).multi_get(keys)
    }
    fn wait(
        &self,
        keys: &[String],
        timeout: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send {
        (**self).wait(keys, timeout)
    }
    fn multi_set(
        &self,
        pairs: &[(String, Vec<u8>)],
    ) -> impl Future<Output = StoreResult<()>> + Send {
        (**self).multi_set(pairs)
    }
    fn delete(&self, key: &str) -> impl Future<Output = StoreResult<()>> + Send {
        (**self).delete(key)
    }
    fn beat_and_read(
        &self,
        hb_key: &str,
        keys: &[String],
    ) -> impl Future<Output = StoreResult<Vec<Vec<u8>>>> + Send {
        (**self).beat_and_read(hb_key, keys)
    }
}

/// Returned by a non-creating read of a missing key (see [`try_get`]).
const ABSENT: &[u8] = b"\0rdrun-absent\0";

/// Reads `key` without blocking and without creating it: `compare_set` with an expected value that
/// is never stored returns that value when the key is missing and the stored value otherwise.
pub async fn try_get<S: RdzvStore>(store: &S, key: &str) -> StoreResult<Option<Vec<u8>>> {
    let v = store.compare_set(key, ABSENT, ABSENT).await?;
    Ok((v != ABSENT).then_some(v))
}

#[cfg(test)]
#[derive(Default)]
struct MemInner {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: tokio::sync::Notify,
    /// Bytes of values returned by reads (compare_set, multi_get): what a test of the
    /// rendezvous' read load measures.
    read_bytes: std::sync::atomic::AtomicU64,
}

/// An in-memory store shared by several handles (one per simulated node).
///
/// Each handle can be cut off ([`MemStore::set_cut`]): its operations then fail as if its link
/// were down, while the other handles keep working. Waits poll in small steps, so they work under
/// tokio's paused clock.
#[cfg(test)]
#[derive(Clone, Default)]
pub struct MemStore {
    inner: Arc<MemInner>,
    cut: Arc<AtomicBool>,
}

#[cfg(test)]
impl MemStore {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Another handle on the same data with its own cut switch.
    pub fn handle(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            cut: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Cuts this handle off (operations fail) or restores it.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Bytes of values all handles have read so far (compare_set and multi_get replies).
    pub fn read_bytes(&self) -> u64 {
        self.inner.read_bytes.load(Ordering::SeqCst)
    }

    fn count_read(&self, n: usize) {
        self.inner.read_bytes.fetch_add(n as u64, Ordering::SeqCst);
    }

    /// Reads a key directly (for tests and debugging).
    pub fn peek(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().get(key).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A panic while holding this lock can only come from a bug in a test; keep going.
        self.inner.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_cut(&self) -> StoreResult<()> {
        if self.cut.load(Ordering::SeqCst) {
            Err(StoreOpError("connection to the store lost (cut)".into()))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
impl RdzvStore for MemStore {
    fn describe(&self) -> String {
        "(in memory)".into()
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> StoreResult<Vec<u8>> {
        self.check_cut()?;
        let out = {
            let mut map = self.lock();
            match map.get(key) {
                None if expected.is_empty() => {
                    map.insert(key.to_string(), desired.to_vec());
                    desired.to_vec()
                }
                None => expected.to_vec(),
                Some(cur) if cur.as_slice() == expected => {
                    map.insert(key.to_string(), desired.to_vec());
                    desired.to_vec()
                }
                Some(cur) => cur.clone(),
            }
        };
        self.inner.changed.notify_waiters();
        self.count_read(out.len());
        Ok(out)
    }

    async fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.check_cut()?;
        self.lock().insert(key.to_string(), value.to_vec());
        self.inner.changed.notify_waiters();
        Ok(())
    }

    async fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        self.check_cut()?;
        let new = {
            let mut map = self.lock();
            let cur = match map.get(key) {
                None => 0,
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
                    .ok_or_else(|| StoreOpError(format!("value of {key} is not a number")))?,
            };
            let new = cur + delta;
            map.insert(key.to_string(), new.to_string().into_bytes());
            new
        };
        self.inner.changed.notify_waiters();
        Ok(new)
    }

    async fn append(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.check_cut()?;
        self.lock()
            .entry(key.to_string())
            .or_default()
            .extend_from_slice(value);
        self.inner.changed.notify_waiters();
        Ok(())
    }

    async fn multi_get(&self, keys: &[String]) -> StoreResult<Vec<Vec<u8>>> {
        self.check_cut()?;
        let map = self.lock();
        let out: StoreResult<Vec<Vec<u8>>> = keys
            .iter()
            .map(|k| {
                map.get(k)
                    .cloned()
                    .ok_or_else(|| StoreOpError(format!("key {k} not found")))
            })
            .collect();
        drop(map);
        if let Ok(vs) = &out {
            self.count_read(vs.iter().map(Vec::len).sum());
        }
        out
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.check_cut()?;
        self.lock().remove(key);
        Ok(())
    }

    async fn wait(&self, keys: &[String], timeout: Duration) -> StoreResult<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.check_cut()?;
            let notified = self.inner.changed.notified();
            if keys.iter().all(|k| self.lock().contains_key(k)) {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            // Wake on any change, and poll at least every 50 ms to notice a cut.
            let step = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(step, notified).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn compare_set_follows_tcpstore_semantics() {
        let s = MemStore::new();
        assert_eq!(s.compare_set("k", b"x", b"y").await.unwrap(), b"x");
        assert_eq!(s.peek("k"), None);
        assert_eq!(s.compare_set("k", b"", b"a").await.unwrap(), b"a");
        assert_eq!(s.compare_set("k", b"", b"b").await.unwrap(), b"a");
        assert_eq!(s.compare_set("k", b"a", b"c").await.unwrap(), b"c");
        assert_eq!(s.peek("k").unwrap(), b"c");
    }

    #[tokio::test]
    async fn try_get_does_not_create_and_append_concatenates() {
        let s = MemStore::new();
        assert_eq!(try_get(&s, "k").await.unwrap(), None);
        assert_eq!(s.peek("k"), None);
        s.append("k", b"a\n").await.unwrap();
        s.append("k", b"b\n").await.unwrap();
        assert_eq!(try_get(&s, "k").await.unwrap(), Some(b"a\nb\n".to_vec()));
    }

    #[tokio::test]
    async fn add_counts_missing_as_zero_and_cut_fails() {
        let s = MemStore::new();
        assert_eq!(s.add("n", 0).await.unwrap(), 0);
        assert_eq!(s.add("n", 3).await.unwrap(), 3);
        let other = s.handle();
        other.set_cut(true);
        assert!(other.add("n", 1).await.is_err());
        assert_eq!(s.add("n", 1).await.unwrap(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_times_out_and_wakes() {
        let s = MemStore::new();
        let keys = vec!["w".to_string()];
        assert!(!s.wait(&keys, Duration::from_secs(1)).await.unwrap());
        let s2 = s.handle();
        let t =
            tokio::spawn(async move { s2.wait(&["w".to_string()], Duration::from_secs(60)).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        s.set("w", b"1").await.unwrap();
        assert!(t.await.unwrap().unwrap());
    }
}
