//! [`BlockingClient`]: the async [`Client`] driven to completion on a private current-thread
//! runtime, for threads outside any tokio runtime (the worker runtime). Same operations, same
//! semantics, same errors.

use std::sync::Arc;
use std::time::Duration;

use super::client::{Client, StoreError};

/// Blocking client for threads outside any tokio runtime (the worker runtime). Owns a small
/// current-thread runtime; every call runs the async [`Client`] to completion on it. Do not call
/// or drop it from inside an async task (tokio forbids nested runtimes).
#[derive(Clone)]
pub struct BlockingClient {
    rt: Arc<tokio::runtime::Runtime>,
    inner: Client,
}

impl BlockingClient {
    /// See [`Client::connect`].
    pub fn connect(
        host: &str,
        port: u16,
        connect_timeout: Duration,
    ) -> Result<BlockingClient, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Connect {
                addr: format!("{host}:{port}"),
                source: e,
            })?;
        let inner = rt.block_on(Client::connect(host, port, connect_timeout))?;
        Ok(BlockingClient {
            rt: Arc::new(rt),
            inner,
        })
    }

    /// See [`Client::with_prefix`].
    pub fn with_prefix(&self, prefix: &str) -> BlockingClient {
        BlockingClient {
            rt: self.rt.clone(),
            inner: self.inner.with_prefix(prefix),
        }
    }

    /// See [`Client::raw_keys`].
    pub fn raw_keys(&self) -> BlockingClient {
        BlockingClient {
            rt: self.rt.clone(),
            inner: self.inner.raw_keys(),
        }
    }

    /// See [`Client::set_timeout`].
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }

    /// See [`Client::timeout`].
    pub fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    /// See [`Client::set`].
    pub fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.set(key, value))
    }
    /// See [`Client::get`].
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.rt.block_on(self.inner.get(key))
    }
    /// See [`Client::get_nowait`].
    pub fn get_nowait(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.rt.block_on(self.inner.get_nowait(key))
    }
    /// See [`Client::try_get`].
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.rt.block_on(self.inner.try_get(key))
    }
    /// See [`Client::add`].
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.rt.block_on(self.inner.add(key, delta))
    }
    /// See [`Client::compare_set`].
    pub fn compare_set(
        &self,
        key: &str,
        expected: impl AsRef<[u8]>,
        desired: impl AsRef<[u8]>,
    ) -> Result<Vec<u8>, StoreError> {
        self.rt
            .block_on(self.inner.compare_set(key, expected, desired))
    }
    /// See [`Client::check`].
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.rt.block_on(self.inner.check(keys))
    }
    /// See [`Client::wait`].
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.wait(keys, timeout))
    }
    /// See [`Client::delete_key`].
    pub fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        self.rt.block_on(self.inner.delete_key(key))
    }
    /// See [`Client::num_keys`].
    pub fn num_keys(&self) -> Result<i64, StoreError> {
        self.rt.block_on(self.inner.num_keys())
    }
    /// See [`Client::append`].
    pub fn append(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.append(key, value))
    }
    /// See [`Client::multi_get`].
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.rt.block_on(self.inner.multi_get(keys))
    }
    /// See [`Client::multi_set`].
    pub fn multi_set<V: AsRef<[u8]>>(&self, pairs: &[(&str, V)]) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.multi_set(pairs))
    }
    /// See [`Client::queue_push`].
    pub fn queue_push(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.queue_push(key, value))
    }
    /// See [`Client::queue_pop`].
    pub fn queue_pop(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.rt.block_on(self.inner.queue_pop(key))
    }
    /// See [`Client::queue_pop_wait`].
    pub fn queue_pop_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.rt.block_on(self.inner.queue_pop_wait(key, timeout))
    }
    /// See [`Client::queue_len`].
    pub fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        self.rt.block_on(self.inner.queue_len(key))
    }
    /// See [`Client::list_keys`].
    pub fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        self.rt.block_on(self.inner.list_keys())
    }
    /// See [`Client::barrier`].
    pub fn barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<(), StoreError> {
        self.rt
            .block_on(self.inner.barrier(key, world_size, timeout))
    }
    /// See [`Client::ping`].
    pub fn ping(&self) -> Result<(), StoreError> {
        self.rt.block_on(self.inner.ping())
    }
}
