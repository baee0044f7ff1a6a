//! The async store [`Client`] (the blocking wrapper for the worker runtime is
//! [`super::blocking::BlockingClient`], re-exported by the store module). It speaks PyTorch 2.15.0's TCPStore protocol (`torch/csrc/distributed/c10d/TCPStore.cpp`) to
//! rdrun's server or to PyTorch's own.
//!
//! Conventions copied from PyTorch so that keys written from Rust and Python agree:
//! - every key is sent as `"/" + key` (`TCPStore::keyPrefix_`), and [`Client::with_prefix`]
//!   nests like `PrefixStore`: `prefix + "/" + key`;
//! - `get` is WAIT then GET, `multi_get` WAIT then MULTI_GET;
//! - a WAIT or BARRIER that times out sends CANCEL_WAIT and reads `01`, or `00` then `01` when
//!   the wait finished in the race (`TCPStore::doWait`);
//! - connect = TCP connect, VALIDATE, PING with the pid, retried with exponential backoff and
//!   jitter until the deadline (`Backoff.hpp`: PyTorch starts at 500 ms; rdrun starts at 50 ms
//!   because its store is usually up already), resolving the host on every try.
//!
//! Methods take `&self`; one connection serves one request at a time (a tokio `Mutex`), like
//! PyTorch's `activeOpLock_`. A request abandoned halfway (its future dropped, or a reply timeout)
//! leaves the stream out of step, so the connection is then marked broken and every later call
//! fails with [`StoreError::ConnectionLost`].

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::{timeout_at, Instant};

use super::protocol::{
    Limits, Reply, ReplyDecoder, ReplyShape, Request, CHECK_READY, STOP_WAITING, VALIDATION_MAGIC,
    WAIT_CANCELED,
};

/// PyTorch's default store timeout (`Store::kDefaultTimeout`, 300 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A store operation that failed.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store {op} timed out (key {key:?})")]
    Timeout { op: &'static str, key: String },
    #[error("connection to the store lost")]
    ConnectionLost {
        #[source]
        source: io::Error,
    },
    #[error("store protocol violation: {0}")]
    Protocol(String),
    #[error("could not connect to the store at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    fn lost(e: io::Error) -> StoreError {
        StoreError::ConnectionLost { source: e }
    }
}

/// Exponential backoff with ±50 % jitter (shape of PyTorch's `ExponentialBackoffWithJitter`).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    factor: f64,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial`, multiplies by `factor` up to `max`.
    pub fn new(initial: Duration, factor: f64, max: Duration) -> Backoff {
        Backoff {
            next: initial,
            factor,
            max,
        }
    }

    /// The next delay: the current base scaled by a factor in [0.5, 1.5). The jitter comes from
    /// `fastrand`'s per-thread generator, seeded randomly, so clients started together spread out.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next.mul_f64(0.5 + fastrand::f64());
        self.next = self.next.mul_f64(self.factor).min(self.max);
        d
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(50), 1.5, Duration::from_secs(5))
    }
}

struct Conn {
    stream: TcpStream,
    /// Reply bytes read but not yet decoded.
    rbuf: Vec<u8>,
    /// Set while a request is in flight; still set afterwards means the stream is out of step.
    broken: bool,
}

struct Shared {
    conn: Mutex<Conn>,
    timeout: StdMutex<Duration>,
}

/// Async TCPStore client. Cloning (or [`Client::with_prefix`]) shares the connection.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    prefix: String,
}

impl Client {
    /// Connects, validates and pings, retrying with backoff until `connect_timeout` has passed.
    pub async fn connect(
        host: &str,
        port: u16,
        connect_timeout: Duration,
    ) -> Result<Client, StoreError> {
        let deadline = Instant::now() + connect_timeout;
        let mut backoff = Backoff::default();
        loop {
            let last = match try_connect(host, port, deadline).await {
                Ok((stream, _peer)) => {
                    return Ok(Client {
                        shared: Arc::new(Shared {
                            conn: Mutex::new(Conn {
                                stream,
                                rbuf: Vec::new(),
                                broken: false,
                            }),
                            timeout: StdMutex::new(DEFAULT_TIMEOUT),
                        }),
                        prefix: "/".into(),
                    })
                }
                Err(e) => {
                    tracing::debug!(host, port, error = %e, "store connect attempt failed");
                    e
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(connect_error(host, port, last));
            }
            tokio::time::sleep(backoff.next_delay().min(deadline - now)).await;
            // Report the last real failure (e.g. "connection refused"): another try now would
            // only find its deadline passed before the lookup started ("resolve timed out").
            if Instant::now() >= deadline {
                return Err(connect_error(host, port, last));
            }
        }
    }

    /// Sets the timeout of every later operation on this connection (all clones and prefixes),
    /// like `Store::set_timeout`. Default [`DEFAULT_TIMEOUT`].
    pub fn set_timeout(&self, timeout: Duration) {
        *self
            .shared
            .timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = timeout;
    }

    /// The current default timeout.
    pub fn timeout(&self) -> Duration {
        *self
            .shared
            .timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A client whose keys are `prefix + "/" + key` inside this client's key space, like
    /// `PrefixStore(prefix, store)`. Shares the connection.
    pub fn with_prefix(&self, prefix: &str) -> Client {
        Client {
            shared: self.shared.clone(),
            prefix: format!("{}{prefix}/", self.prefix),
        }
    }

    /// A client that sends keys exactly as given, without TCPStore's leading "/" (for PyTorch's
    /// internal keys such as `init/`). Shares the connection.
    pub fn raw_keys(&self) -> Client {
        Client {
            shared: self.shared.clone(),
            prefix: String::new(),
        }
    }

    /// The wire key for `key`.
    pub fn wire_key(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn wire_keys(&self, keys: &[&str]) -> Vec<Vec<u8>> {
        keys.iter().map(|k| self.wire_key(k)).collect()
    }

    /// One request and its reply (if it has one) under the default timeout.
    async fn exchange(
        &self,
        op: &'static str,
        key: &str,
        req: &Request,
    ) -> Result<Option<Reply>, StoreError> {
        let mut replies = self
            .exchange_all(op, key, std::slice::from_ref(req))
            .await?;
        Ok(replies.pop())
    }

    /// Requests pipelined in one write, then their replies in order, under the default timeout.
    async fn exchange_all(
        &self,
        op: &'static str,
        key: &str,
        reqs: &[Request],
    ) -> Result<Vec<Reply>, StoreError> {
        let deadline = Instant::now() + self.timeout();
        let mut bytes = Vec::new();
        for r in reqs {
            r.encode(&mut bytes);
        }
        let fut = async {
            let mut conn = self.shared.conn.lock().await;
            if conn.broken {
                return Err(StoreError::lost(io::Error::other(
                    "an earlier request was abandoned mid-way",
                )));
            }
            conn.broken = true;
            conn.stream
                .write_all(&bytes)
                .await
                .map_err(StoreError::lost)?;
            let mut replies = Vec::with_capacity(reqs.len());
            for shape in reqs.iter().filter_map(Request::reply_shape) {
                replies.push(conn.read_reply(shape).await?);
            }
            conn.broken = false;
            Ok(replies)
        };
        match timeout_at(deadline, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout {
                op,
                key: key.to_string(),
            }),
        }
    }

    /// WAIT or BARRIER: send, wait for STOP_WAITING until `timeout`, else CANCEL_WAIT exactly as
    /// PyTorch's client does and report a timeout.
    async fn deferred(
        &self,
        op: &'static str,
        key: String,
        req: &Request,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + timeout;
        let timed_out = || StoreError::Timeout {
            op,
            key: key.clone(),
        };
        let Ok(mut conn) = timeout_at(deadline, self.shared.conn.lock()).await else {
            return Err(timed_out());
        };
        if conn.broken {
            return Err(StoreError::lost(io::Error::other(
                "an earlier request was abandoned mid-way",
            )));
        }
        conn.broken = true;
        conn.stream
            .write_all(&req.to_bytes())
            .await
            .map_err(StoreError::lost)?;
        // A one-byte reply is never half-read, so abandoning this read on the deadline is safe.
        match timeout_at(deadline, conn.read_reply(ReplyShape::Byte)).await {
            Ok(Ok(Reply::Byte(STOP_WAITING))) => {
                conn.broken = false;
                return Ok(());
            }
            Ok(Ok(r)) => return Err(StoreError::Protocol(format!("{op} replied {r:?}"))),
            Ok(Err(e)) => return Err(e),
            Err(_) => {}
        }
        // Timed out: cancel (`TCPStore::doWait`), bounded by the default timeout so that a dead
        // server cannot hang us.
        let cancel_deadline = Instant::now() + self.timeout();
        let cancel = async {
            conn.stream
                .write_all(&Request::CancelWait.to_bytes())
                .await
                .map_err(StoreError::lost)?;
            let mut r = conn.read_reply(ReplyShape::Byte).await?;
            if r == Reply::Byte(STOP_WAITING) {
                r = conn.read_reply(ReplyShape::Byte).await?;
            }
            Ok::<_, StoreError>(r)
        };
        match timeout_at(cancel_deadline, cancel).await {
            Ok(Ok(Reply::Byte(WAIT_CANCELED))) => {
                conn.broken = false;
                Err(timed_out())
            }
            Ok(Ok(r)) => Err(StoreError::Protocol(format!(
                "CANCEL_WAIT replied {r:?} instead of WAIT_CANCELED"
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(timed_out()),
        }
    }

    /// SET (no reply).
    pub async fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::Set {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("set", key, &req).await.map(|_| ())
    }

    /// GET with PyTorch semantics: waits for the key up to the default timeout, then reads it.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], self.timeout()).await?;
        self.get_nowait(key).await
    }

    /// Plain GET: the value, or empty if the key is missing (the server's answer then).
    pub async fn get_nowait(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let req = Request::Get {
            key: self.wire_key(key),
        };
        match self.exchange("get", key, &req).await? {
            Some(Reply::Str(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// CHECK then GET pipelined in one write: `None` if the key is missing.
    pub async fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let wk = self.wire_key(key);
        let reqs = [
            Request::Check {
                keys: vec![wk.clone()],
            },
            Request::Get { key: wk },
        ];
        match self.exchange_all("get", key, &reqs).await?.as_mut_slice() {
            [Reply::Byte(ready), Reply::Str(value)] => {
                Ok((*ready == CHECK_READY).then(|| std::mem::take(value)))
            }
            _ => mismatch(None),
        }
    }

    /// ADD: adds `delta` to the decimal counter and returns the new value.
    pub async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let req = Request::Add {
            key: self.wire_key(key),
            delta,
        };
        match self.exchange("add", key, &req).await? {
            Some(Reply::I64(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// COMPARE_SET: returns the value after the operation (see the spec for missing keys).
    pub async fn compare_set(
        &self,
        key: &str,
        expected: impl AsRef<[u8]>,
        desired: impl AsRef<[u8]>,
    ) -> Result<Vec<u8>, StoreError> {
        let req = Request::CompareSet {
            key: self.wire_key(key),
            expected: expected.as_ref().to_vec(),
            desired: desired.as_ref().to_vec(),
        };
        match self.exchange("compare_set", key, &req).await? {
            Some(Reply::Str(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// CHECK: whether every key exists.
    pub async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let req = Request::Check {
            keys: self.wire_keys(keys),
        };
        match self.exchange("check", &keys.join(","), &req).await? {
            Some(Reply::Byte(b)) => Ok(b == CHECK_READY),
            r => mismatch(r),
        }
    }

    /// WAIT until every key exists, or `timeout` (then CANCEL_WAIT and [`StoreError::Timeout`]).
    pub async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let req = Request::Wait {
            keys: self.wire_keys(keys),
        };
        self.deferred("wait", keys.join(","), &req, timeout).await
    }

    /// DELETE_KEY: whether the key existed.
    pub async fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let req = Request::DeleteKey {
            key: self.wire_key(key),
        };
        match self.exchange("delete_key", key, &req).await? {
            Some(Reply::I64(v)) => Ok(v == 1),
            r => mismatch(r),
        }
    }

    /// GETNUMKEYS: every key in the store (not prefixed; includes PyTorch's internal ones).
    pub async fn num_keys(&self) -> Result<i64, StoreError> {
        let req = Request::GetNumKeys;
        match self.exchange("num_keys", "", &req).await? {
            Some(Reply::I64(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// APPEND (no reply): appends bytes, creating the key.
    pub async fn append(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::Append {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("append", key, &req).await.map(|_| ())
    }

    /// WAIT for all keys (default timeout), then MULTI_GET: values in order.
    pub async fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.wait(keys, self.timeout()).await?;
        let req = Request::MultiGet {
            keys: self.wire_keys(keys),
        };
        match self.exchange("multi_get", &keys.join(","), &req).await? {
            Some(Reply::Strs(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// ADD then MULTI_GET pipelined in one write (one round trip): a heartbeat and a poll of
    /// keys known to exist (no WAIT first, unlike [`Client::multi_get`]; rdrun's server answers
    /// a missing key with an empty value).
    pub async fn add_and_multi_get(
        &self,
        key: &str,
        delta: i64,
        keys: &[&str],
    ) -> Result<(i64, Vec<Vec<u8>>), StoreError> {
        let reqs = [
            Request::Add {
                key: self.wire_key(key),
                delta,
            },
            Request::MultiGet {
                keys: self.wire_keys(keys),
            },
        ];
        match self.exchange_all("add", key, &reqs).await?.as_mut_slice() {
            [Reply::I64(v), Reply::Strs(vals)] => Ok((*v, std::mem::take(vals))),
            _ => mismatch(None),
        }
    }

    /// MULTI_SET (no reply).
    pub async fn multi_set<V: AsRef<[u8]>>(&self, pairs: &[(&str, V)]) -> Result<(), StoreError> {
        let req = Request::MultiSet {
            pairs: pairs
                .iter()
                .map(|(k, v)| (self.wire_key(k), v.as_ref().to_vec()))
                .collect(),
        };
        self.exchange("multi_set", "", &req).await.map(|_| ())
    }

    /// QUEUE_PUSH (no reply).
    pub async fn queue_push(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::QueuePush {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("queue_push", key, &req).await.map(|_| ())
    }

    /// Non-blocking QUEUE_POP: `None` when the queue is empty.
    pub async fn queue_pop(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let req = Request::QueuePop {
            key: self.wire_key(key),
        };
        match self.exchange("queue_pop", key, &req).await? {
            Some(Reply::QueuePop { value, .. }) => Ok(value),
            r => mismatch(r),
        }
    }

    /// Blocking pop: WAIT on the queue then QUEUE_POP (PyTorch's `queue_pop(block=True)`),
    /// retried if another consumer won the item, until `timeout`.
    pub async fn queue_pop_wait(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            self.wait(&[key], left).await.map_err(|e| match e {
                StoreError::Timeout { key, .. } => StoreError::Timeout {
                    op: "queue_pop",
                    key,
                },
                e => e,
            })?;
            if let Some(v) = self.queue_pop(key).await? {
                return Ok(v);
            }
        }
    }

    /// QUEUE_LEN: 0 for an unknown queue.
    pub async fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        let req = Request::QueueLen {
            key: self.wire_key(key),
        };
        match self.exchange("queue_len", key, &req).await? {
            Some(Reply::I64(v)) => Ok(v),
            r => mismatch(r),
        }
    }

    /// LIST_KEYS: the keys under this client's prefix, with the prefix stripped (like TCPStore +
    /// PrefixStore). Keys that are not UTF-8 are converted lossily.
    pub async fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let req = Request::ListKeys;
        match self.exchange("list_keys", "", &req).await? {
            Some(Reply::ListKeys(keys)) => Ok(keys
                .into_iter()
                .filter_map(|k| {
                    k.strip_prefix(self.prefix.as_bytes())
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                })
                .collect()),
            r => mismatch(r),
        }
    }

    /// BARRIER: the server counts arrivals at `key` and answers everyone once `world_size` have
    /// arrived. Times out like WAIT (CANCEL_WAIT; the arrival is not taken back).
    pub async fn barrier(
        &self,
        key: &str,
        world_size: i64,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let req = Request::Barrier {
            key: self.wire_key(key),
            world_size,
        };
        self.deferred("barrier", key.to_string(), &req, timeout)
            .await
    }

    /// PING: round trip with a nonce the server must echo.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let nonce = std::process::id() ^ 0x5a5a_0000;
        let req = Request::Ping { nonce };
        match self.exchange("ping", "", &req).await? {
            Some(Reply::U32(v)) if v == nonce => Ok(()),
            Some(Reply::U32(v)) => Err(StoreError::Protocol(format!(
                "ping echoed {v:#x} instead of {nonce:#x}"
            ))),
            r => mismatch(r),
        }
    }
}

fn mismatch<T>(got: Option<Reply>) -> Result<T, StoreError> {
    Err(StoreError::Protocol(format!(
        "reply {got:?} does not fit the request (client bug)"
    )))
}

/// Read room for replies: most are a few bytes; a big value arrives in chunks of this size.
const REPLY_READ: usize = 64 * 1024;

impl Conn {
    /// Reads one reply of `shape` with the shared codec ([`ReplyDecoder`]); bytes read past its
    /// end stay buffered for the next reply.
    async fn read_reply(&mut self, shape: ReplyShape) -> Result<Reply, StoreError> {
        let mut decoder = ReplyDecoder::new(shape, Limits::REPLY);
        loop {
            let (n, reply) = decoder
                .decode(&self.rbuf)
                .map_err(|e| StoreError::Protocol(format!("bad reply: {e}")))?;
            self.rbuf.drain(..n);
            if let Some(reply) = reply {
                return Ok(reply);
            }
            self.rbuf
                .reserve(REPLY_READ.min(4096.max(self.rbuf.capacity())));
            let got = self
                .stream
                .read_buf(&mut self.rbuf)
                .await
                .map_err(StoreError::lost)?;
            if got == 0 {
                return Err(StoreError::lost(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the store closed the connection",
                )));
            }
        }
    }
}

/// One connect + VALIDATE + PING attempt over every resolved address.
/// The error of a connect that ran out of time, naming `host:port` (IPv6 in brackets).
fn connect_error(host: &str, port: u16, source: io::Error) -> StoreError {
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    StoreError::Connect { addr, source }
}

async fn try_connect(
    host: &str,
    port: u16,
    deadline: Instant,
) -> io::Result<(TcpStream, SocketAddr)> {
    let addrs: Vec<SocketAddr> =
        match timeout_at(deadline, tokio::net::lookup_host((host, port))).await {
            Ok(r) => r?.collect(),
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "resolve timed out")),
        };
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{host} resolved to nothing"),
    );
    for addr in addrs {
        match timeout_at(deadline, handshake(addr)).await {
            Ok(Ok(s)) => return Ok((s, addr)),
            Ok(Err(e)) => last = e,
            Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, format!("{addr}: timed out")),
        }
    }
    Err(last)
}

async fn handshake(addr: SocketAddr) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let nonce = std::process::id();
    let mut buf = Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .to_bytes();
    Request::Ping { nonce }.encode(&mut buf);
    s.write_all(&buf).await?;
    let echo = s.read_u32_le().await?;
    if echo != nonce {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ping echoed {echo:#x} instead of {nonce:#x}"),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), 2.0, Duration::from_millis(400));
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        let bases = [100u64, 200, 400, 400, 400, 400];
        for (d, base) in d.iter().zip(bases) {
            assert!(*d >= Duration::from_millis(base / 2), "{d:?} vs {base}");
            assert!(*d < Duration::from_millis(base * 3 / 2), "{d:?} vs {base}");
        }
    }
}
