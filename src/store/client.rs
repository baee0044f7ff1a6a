//! Store clients: the async [`Client`] and the [`BlockingClient`] wrapper for the worker runtime.
//! They speak PyTorch 2.15.0's TCPStore protocol (`torch/csrc/distributed/c10d/TCPStore.cpp`) to
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::{timeout_at, Instant};

use super::protocol::{
    QueryType, Request, CHECK_READY, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};

/// PyTorch's default store timeout (`Store::kDefaultTimeout`, 300 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest reply string the client accepts (guards against a misbehaving server).
const MAX_REPLY_STR: u64 = 1 << 31;

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
    rng: u64,
}

impl Backoff {
    /// Starts at `initial`, multiplies by `factor` up to `max`.
    pub fn new(initial: Duration, factor: f64, max: Duration) -> Backoff {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Seed from time and pid so that many clients started together spread out.
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        Backoff {
            next: initial,
            factor,
            max,
            rng: seed | 1,
        }
    }

    /// The next delay: the current base scaled by a factor in [0.5, 1.5).
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64: enough for jitter, no dependency.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let d = self.next.mul_f64(0.5 + unit);
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
    stream: BufReader<TcpStream>,
    /// Set while a request is in flight; still set afterwards means the stream is out of step.
    broken: bool,
}

struct Shared {
    conn: Mutex<Conn>,
    timeout: StdMutex<Duration>,
    peer: SocketAddr,
}

/// Async TCPStore client. Cloning (or [`Client::with_prefix`]) shares the connection.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    prefix: String,
}

/// Reply layouts (see the spec's per-opcode sections).
enum Shape {
    Nothing,
    Byte,
    U32,
    I64,
    Str,
    Strs(usize),
    QueuePop,
    ListKeys,
}

enum Reply {
    Nothing,
    Byte(u8),
    U32(u32),
    I64(i64),
    Str(Vec<u8>),
    Strs(Vec<Vec<u8>>),
    Popped(Option<Vec<u8>>),
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
                Ok((stream, peer)) => {
                    return Ok(Client {
                        shared: Arc::new(Shared {
                            conn: Mutex::new(Conn {
                                stream: BufReader::new(stream),
                                broken: false,
                            }),
                            timeout: StdMutex::new(DEFAULT_TIMEOUT),
                            peer,
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

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.peer
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

    /// One request/reply exchange under the default timeout.
    async fn exchange(
        &self,
        op: &'static str,
        key: &str,
        bytes: &[u8],
        shape: Shape,
    ) -> Result<Reply, StoreError> {
        let deadline = Instant::now() + self.timeout();
        let fut = async {
            let mut conn = self.shared.conn.lock().await;
            if conn.broken {
                return Err(StoreError::lost(io::Error::other(
                    "an earlier request was abandoned mid-way",
                )));
            }
            conn.broken = true;
            conn.stream
                .get_mut()
                .write_all(bytes)
                .await
                .map_err(StoreError::lost)?;
            let reply = read_reply(&mut conn.stream, shape).await?;
            conn.broken = false;
            Ok(reply)
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
        bytes: &[u8],
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
            .get_mut()
            .write_all(bytes)
            .await
            .map_err(StoreError::lost)?;
        match timeout_at(deadline, conn.stream.read_u8()).await {
            Ok(Ok(STOP_WAITING)) => {
                conn.broken = false;
                return Ok(());
            }
            Ok(Ok(b)) => return Err(StoreError::Protocol(format!("{op} replied {b}"))),
            Ok(Err(e)) => return Err(StoreError::lost(e)),
            Err(_) => {}
        }
        // Timed out: cancel (`TCPStore::doWait`), bounded by the default timeout so that a dead
        // server cannot hang us.
        let cancel_deadline = Instant::now() + self.timeout();
        let cancel = async {
            conn.stream
                .get_mut()
                .write_all(&[QueryType::CancelWait as u8])
                .await?;
            let mut b = conn.stream.read_u8().await?;
            if b == STOP_WAITING {
                b = conn.stream.read_u8().await?;
            }
            io::Result::Ok(b)
        };
        match timeout_at(cancel_deadline, cancel).await {
            Ok(Ok(WAIT_CANCELED)) => {
                conn.broken = false;
                Err(timed_out())
            }
            Ok(Ok(b)) => Err(StoreError::Protocol(format!(
                "CANCEL_WAIT replied {b} instead of WAIT_CANCELED"
            ))),
            Ok(Err(e)) => Err(StoreError::lost(e)),
            Err(_) => Err(timed_out()),
        }
    }

    /// SET (no reply).
    pub async fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::Set {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("set", key, &req.to_bytes(), Shape::Nothing)
            .await
            .map(|_| ())
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
        match self
            .exchange("get", key, &req.to_bytes(), Shape::Str)
            .await?
        {
            Reply::Str(v) => Ok(v),
            _ => unreachable_reply(),
        }
    }

    /// CHECK then GET pipelined in one write: `None` if the key is missing.
    pub async fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let wk = self.wire_key(key);
        let mut bytes = Request::Check {
            keys: vec![wk.clone()],
        }
        .to_bytes();
        Request::Get { key: wk }.encode(&mut bytes);
        match self.exchange("get", key, &bytes, Shape::Strs(0)).await? {
            // Shape::Strs(0) is special-cased in read_reply as "byte then string".
            Reply::Strs(mut v) if v.len() == 2 => {
                let value = v.pop().unwrap_or_default();
                Ok((v[0] == [CHECK_READY]).then_some(value))
            }
            _ => unreachable_reply(),
        }
    }

    /// ADD: adds `delta` to the decimal counter and returns the new value.
    pub async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let req = Request::Add {
            key: self.wire_key(key),
            delta,
        };
        match self
            .exchange("add", key, &req.to_bytes(), Shape::I64)
            .await?
        {
            Reply::I64(v) => Ok(v),
            _ => unreachable_reply(),
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
        match self
            .exchange("compare_set", key, &req.to_bytes(), Shape::Str)
            .await?
        {
            Reply::Str(v) => Ok(v),
            _ => unreachable_reply(),
        }
    }

    /// CHECK: whether every key exists.
    pub async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let req = Request::Check {
            keys: self.wire_keys(keys),
        };
        match self
            .exchange("check", &keys.join(","), &req.to_bytes(), Shape::Byte)
            .await?
        {
            Reply::Byte(b) => Ok(b == CHECK_READY),
            _ => unreachable_reply(),
        }
    }

    /// WAIT until every key exists, or `timeout` (then CANCEL_WAIT and [`StoreError::Timeout`]).
    pub async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let req = Request::Wait {
            keys: self.wire_keys(keys),
        };
        self.deferred("wait", keys.join(","), &req.to_bytes(), timeout)
            .await
    }

    /// DELETE_KEY: whether the key existed.
    pub async fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let req = Request::DeleteKey {
            key: self.wire_key(key),
        };
        match self
            .exchange("delete_key", key, &req.to_bytes(), Shape::I64)
            .await?
        {
            Reply::I64(v) => Ok(v == 1),
            _ => unreachable_reply(),
        }
    }

    /// GETNUMKEYS: every key in the store (not prefixed; includes PyTorch's internal ones).
    pub async fn num_keys(&self) -> Result<i64, StoreError> {
        let req = Request::GetNumKeys;
        match self
            .exchange("num_keys", "", &req.to_bytes(), Shape::I64)
            .await?
        {
            Reply::I64(v) => Ok(v),
            _ => unreachable_reply(),
        }
    }

    /// APPEND (no reply): appends bytes, creating the key.
    pub async fn append(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::Append {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("append", key, &req.to_bytes(), Shape::Nothing)
            .await
            .map(|_| ())
    }

    /// WAIT for all keys (default timeout), then MULTI_GET: values in order.
    pub async fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.wait(keys, self.timeout()).await?;
        let req = Request::MultiGet {
            keys: self.wire_keys(keys),
        };
        match self
            .exchange(
                "multi_get",
                &keys.join(","),
                &req.to_bytes(),
                Shape::Strs(keys.len()),
            )
            .await?
        {
            Reply::Strs(v) => Ok(v),
            _ => unreachable_reply(),
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
        self.exchange("multi_set", "", &req.to_bytes(), Shape::Nothing)
            .await
            .map(|_| ())
    }

    /// QUEUE_PUSH (no reply).
    pub async fn queue_push(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let req = Request::QueuePush {
            key: self.wire_key(key),
            value: value.as_ref().to_vec(),
        };
        self.exchange("queue_push", key, &req.to_bytes(), Shape::Nothing)
            .await
            .map(|_| ())
    }

    /// Non-blocking QUEUE_POP: `None` when the queue is empty.
    pub async fn queue_pop(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let req = Request::QueuePop {
            key: self.wire_key(key),
        };
        match self
            .exchange("queue_pop", key, &req.to_bytes(), Shape::QueuePop)
            .await?
        {
            Reply::Popped(v) => Ok(v),
            _ => unreachable_reply(),
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
        match self
            .exchange("queue_len", key, &req.to_bytes(), Shape::I64)
            .await?
        {
            Reply::I64(v) => Ok(v),
            _ => unreachable_reply(),
        }
    }

    /// LIST_KEYS: the keys under this client's prefix, with the prefix stripped (like TCPStore +
    /// PrefixStore). Keys that are not UTF-8 are converted lossily.
    pub async fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let req = Request::ListKeys;
        match self
            .exchange("list_keys", "", &req.to_bytes(), Shape::ListKeys)
            .await?
        {
            Reply::Strs(keys) => Ok(keys
                .into_iter()
                .filter_map(|k| {
                    k.strip_prefix(self.prefix.as_bytes())
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                })
                .collect()),
            _ => unreachable_reply(),
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
        self.deferred("barrier", key.to_string(), &req.to_bytes(), timeout)
            .await
    }

    /// PING: round trip with a nonce the server must echo.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let nonce = std::process::id() ^ 0x5a5a_0000;
        let req = Request::Ping { nonce };
        match self
            .exchange("ping", "", &req.to_bytes(), Shape::U32)
            .await?
        {
            Reply::U32(v) if v == nonce => Ok(()),
            Reply::U32(v) => Err(StoreError::Protocol(format!(
                "ping echoed {v:#x} instead of {nonce:#x}"
            ))),
            _ => unreachable_reply(),
        }
    }
}

fn unreachable_reply<T>() -> Result<T, StoreError> {
    Err(StoreError::Protocol(
        "reply shape mismatch (client bug)".into(),
    ))
}

async fn read_str(r: &mut BufReader<TcpStream>) -> Result<Vec<u8>, StoreError> {
    let len = r.read_u64_le().await.map_err(StoreError::lost)?;
    if len > MAX_REPLY_STR {
        return Err(StoreError::Protocol(format!("reply string of {len} bytes")));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v).await.map_err(StoreError::lost)?;
    Ok(v)
}

async fn read_reply(r: &mut BufReader<TcpStream>, shape: Shape) -> Result<Reply, StoreError> {
    Ok(match shape {
        Shape::Nothing => Reply::Nothing,
        Shape::Byte => Reply::Byte(r.read_u8().await.map_err(StoreError::lost)?),
        Shape::U32 => Reply::U32(r.read_u32_le().await.map_err(StoreError::lost)?),
        Shape::I64 => Reply::I64(r.read_i64_le().await.map_err(StoreError::lost)?),
        Shape::Str => Reply::Str(read_str(r).await?),
        Shape::Strs(0) => {
            let b = r.read_u8().await.map_err(StoreError::lost)?;
            Reply::Strs(vec![vec![b], read_str(r).await?])
        }
        Shape::Strs(n) => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_str(r).await?);
            }
            Reply::Strs(v)
        }
        Shape::QueuePop => {
            let len = r.read_i64_le().await.map_err(StoreError::lost)?;
            Reply::Popped(if len > 0 {
                Some(read_str(r).await?)
            } else {
                None
            })
        }
        Shape::ListKeys => {
            let n = r.read_i64_le().await.map_err(StoreError::lost)?;
            if !(0..=1 << 28).contains(&n) {
                return Err(StoreError::Protocol(format!("LIST_KEYS count {n}")));
            }
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read_str(r).await?);
            }
            Reply::Strs(v)
        }
    })
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

    /// The async client underneath (usable only on this client's runtime, via `block_on`).
    pub fn inner(&self) -> &Client {
        &self.inner
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
