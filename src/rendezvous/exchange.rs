//! The small key-value exchange the agents of one run share beside their rounds (issue 28: the
//! network pre-check's addresses and results, every node's failure counts): the run's TCPStore
//! (static, c10d) or, on the etcd backend, etcd itself, under the run's etcd prefix
//! (`<prefix>/<run_id>/kv/<key>`), so that the same keys (`keys::round`) work on every backend.
//!
//! Only what those users need: set, a read that does not block or create, a bounded wait for
//! keys, a multi-get of keys known to exist, and an atomic add. On etcd a wait polls (every
//! [`ETCD_POLL`]): the keys are few and the waits short, and a poll needs no watch to clean up.
//! The etcd keys are under the run's prefix, which the etcd driver watches: each write wakes its
//! keeper once (a re-read of the state, nothing else), and they stay in etcd after the run, as
//! the run's closed state does.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "etcd")]
use super::store::StoreOpError;
use super::store::{try_get, RdzvStore, StoreResult};
use super::tcp::TcpRdzvStore;

/// How often a wait on etcd reads the keys it still misses.
#[cfg(feature = "etcd")]
const ETCD_POLL: Duration = Duration::from_millis(25);

/// The exchange of one run (cheap to clone).
#[derive(Clone)]
pub enum Exchange {
    /// The run's TCPStore (static, c10d).
    Tcp(Arc<TcpRdzvStore>),
    /// etcd, keys under the run's prefix (etcd backend); boxed: the client is large.
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdKv>),
}

/// etcd as an exchange: every key under `base` (`<prefix>/<run_id>/kv/`), none leased (a node's
/// failure counts must outlive its agent, for the others' reports).
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub struct EtcdKv {
    pub(crate) etcd: super::etcd::client::Etcd,
    pub(crate) base: String,
}

#[cfg(feature = "etcd")]
impl EtcdKv {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.base)
    }
}

impl Exchange {
    /// Where the exchange is, for messages (`host:port`, `etcd h1:2379`).
    pub fn describe(&self) -> String {
        match self {
            Exchange::Tcp(s) => s.describe(),
            #[cfg(feature = "etcd")]
            Exchange::Etcd(e) => format!("etcd {}", e.etcd.endpoints()),
        }
    }

    pub async fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        match self {
            Exchange::Tcp(s) => s.set(key, value).await,
            #[cfg(feature = "etcd")]
            Exchange::Etcd(e) => e.etcd.put(&e.key(key), value.to_vec(), None).await,
        }
    }

    /// `key`'s value, `None` when it is not set (never blocks, never creates it).
    pub async fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        match self {
            Exchange::Tcp(s) => try_get(&**s, key).await,
            #[cfg(feature = "etcd")]
            Exchange::Etcd(e) => Ok(e.etcd.get(&e.key(key)).await?.value),
        }
    }

    /// The values of `keys`, every one of which is set (after a [`Self::wait`] that said so).
    pub async fn multi_get(&self, keys: &[String]) -> StoreResult<Vec<Vec<u8>>> {
        match self {
            Exchange::Tcp(s) => s.multi_get(keys).await,
            #[cfg(feature = "etcd")]
            Exchange::Etcd(_) => {
                let mut out = Vec::with_capacity(keys.len());
                for k in keys {
                    let v = self.get(k).await?;
                    out.push(v.ok_or_else(|| StoreOpError(format!("{k}: not set")))?);
                }
                Ok(out)
            }
        }
    }

    /// Waits until every one of `keys` is set: `Ok(false)` when `timeout` passed first.
    pub async fn wait(&self, keys: &[String], timeout: Duration) -> StoreResult<bool> {
        match self {
            Exchange::Tcp(s) => s.wait(keys, timeout).await,
            #[cfg(feature = "etcd")]
            Exchange::Etcd(e) => {
                // A read that fails (a member slow to answer, a leader change) is read again
                // at the next poll, as a TCPStore's wait would go on; only the last one's error
                // is returned, at the deadline.
                let until = tokio::time::Instant::now() + timeout;
                let mut missing: Vec<&String> = keys.iter().collect();
                let mut failed = None;
                loop {
                    let mut still = Vec::with_capacity(missing.len());
                    for k in missing {
                        match e.etcd.get(&e.key(k)).await {
                            Ok(r) if r.value.is_some() => {}
                            Ok(_) => still.push(k),
                            Err(err) => {
                                failed = Some(err);
                                still.push(k);
                            }
                        }
                    }
                    if still.is_empty() {
                        return Ok(true);
                    }
                    if tokio::time::Instant::now() + ETCD_POLL > until {
                        return match failed {
                            Some(err) => Err(err),
                            None => Ok(false),
                        };
                    }
                    missing = still;
                    tokio::time::sleep(ETCD_POLL).await;
                }
            }
        }
    }

    /// Adds `delta` to the decimal number at `key` (missing: 0) and returns the sum, atomically
    /// (etcd: a compare-and-set on the key's revision, retried).
    pub async fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        match self {
            Exchange::Tcp(s) => s.add(key, delta).await,
            #[cfg(feature = "etcd")]
            Exchange::Etcd(e) => {
                let key = e.key(key);
                for _ in 0..100 {
                    let read = e.etcd.get(&key).await?;
                    let now: i64 = match &read.value {
                        Some(v) => String::from_utf8_lossy(v)
                            .trim()
                            .parse()
                            .map_err(|_| StoreOpError(format!("{key}: not a number")))?,
                        None => 0,
                    };
                    let sum = now + delta;
                    let text = sum.to_string().into_bytes();
                    if e.etcd
                        .compare_and_set(&key, read.mod_revision, text)
                        .await?
                    {
                        return Ok(sum);
                    }
                }
                Err(StoreOpError(format!("{key}: too many concurrent writers")))
            }
        }
    }
}
