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
pub trait GroupStore: Send + Sync {
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

impl GroupStore for MemStore {
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

/// A store in a shared directory (like PyTorch's `FileStore`): one file per key, written to a
/// temp name and renamed so readers never see a partial value; `add` serializes through an
/// `flock`ed lock file. For launching workers without a TCP store (benchmarks, tests); select it
/// in [`super::ProcessGroup::init_from_env`] with `RDRUN_FILE_STORE=<dir>`.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: std::path::PathBuf,
}

impl FileStore {
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Result<Self, StoreFailure> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .map_err(|e| StoreFailure::Other(format!("create {}: {e}", dir.display())))?;
        Ok(FileStore { dir })
    }

    fn path(&self, key: &str) -> std::path::PathBuf {
        // Keys contain '/', so hex-encode them into one flat name.
        let name: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("k{name}"))
    }
}

impl GroupStore for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreFailure> {
        let p = self.path(key);
        let tmp = p.with_extension(format!(
            "tmp{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&tmp, value)
            .and_then(|_| std::fs::rename(&tmp, &p))
            .map_err(|e| StoreFailure::Other(format!("write {}: {e}", p.display())))
    }

    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreFailure> {
        let p = self.path(key);
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(200);
        loop {
            match std::fs::read(&p) {
                Ok(v) => return Ok(v),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreFailure::Other(format!("read {}: {e}", p.display()))),
            }
            if Instant::now() >= deadline {
                return Err(StoreFailure::Timeout(timeout, key.to_string()));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreFailure> {
        use std::os::fd::AsRawFd;
        let lock_path = self.dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreFailure::Other(format!("open {}: {e}", lock_path.display())))?;
        // SAFETY: flock on a valid open fd; the lock is released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(StoreFailure::Other(format!(
                "lock {}: {}",
                lock_path.display(),
                std::io::Error::last_os_error()
            )));
        }
        let cur: i64 = std::fs::read(self.path(key))
            .ok()
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
            .unwrap_or(0);
        let new = cur.wrapping_add(delta);
        self.set(key, new.to_string().as_bytes())?;
        drop(lock);
        Ok(new)
    }
}

/// The launcher's TCP store (PyTorch TCPStore protocol) as the group's rendezvous.
impl GroupStore for crate::store::BlockingClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreFailure> {
        crate::store::BlockingClient::set(self, key, value)
            .map_err(|e| StoreFailure::Other(e.to_string()))
    }

    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreFailure> {
        let conv = |e: crate::store::client::StoreError| match e {
            crate::store::client::StoreError::Timeout { .. } => {
                StoreFailure::Timeout(timeout, key.to_string())
            }
            other => StoreFailure::Other(other.to_string()),
        };
        self.wait(&[key], timeout).map_err(conv)?;
        self.get_nowait(key).map_err(conv)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreFailure> {
        crate::store::BlockingClient::add(self, key, delta)
            .map_err(|e| StoreFailure::Other(e.to_string()))
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

    #[test]
    fn file_store_semantics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let s = FileStore::new(&dir).unwrap();
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || (0..25).map(|_| s.add("a/b", 1).unwrap()).max())
            })
            .collect();
        let maxes: Vec<i64> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        assert_eq!(*maxes.iter().max().unwrap(), 100);
        s.set("x/y", b"1").unwrap();
        assert_eq!(s.get_wait("x/y", Duration::from_secs(1)).unwrap(), b"1");
        assert!(s.get_wait("nope", Duration::from_millis(20)).is_err());
    }
}
