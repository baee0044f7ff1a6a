//! The TCPStore-compatible server: the listener, one task per connection, and the handle the
//! launcher keeps for the life of the run ([`StoreServer`]).
//!
//! Behaviour (PyTorch 2.15.0, `TCPStoreLibUvBackend.cpp` / `TCPStoreBackend.cpp`, and the
//! differences chosen on purpose):
//! - The first request must be VALIDATE with the magic; anything else closes the connection (the
//!   legacy server's clean semantics; libuv's quirks are not reproduced).
//! - Requests are buffered and decoded incrementally; pipelined requests are answered in order.
//!   WAIT/BARRIER replies are deferred while later requests (CANCEL_WAIT above all) are served.
//! - Bad input (unknown opcode, limits, non-numeric ADD target) closes only that connection, with
//!   a `warn` log line saying why. The per-connection buffer is bounded by the limits.
//! - No reverse DNS on accept (both PyTorch servers call `getnameinfo` per connection), listen
//!   backlog as large as the kernel allows, TCP_NODELAY on every accepted socket, dual-stack on a
//!   wildcard IPv6 address.
//! - Works on a current-thread or multi-thread tokio runtime: nothing blocks.

use std::future::Future;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tracing::{debug, info, warn};

use super::protocol::{
    decode_request, put_i64, put_str, Decoded, Limits, Request, CHECK_NOT_READY, CHECK_READY,
    STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use super::state::{ConnId, Store, WaitOutcome};

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Size limits; exceeding one closes the offending connection.
    pub limits: Limits,
    /// Flush replies once this many bytes are queued, even mid-batch (bounds per-connection
    /// output memory when a client pipelines many reads without reading replies).
    pub max_pending_output: usize,
    /// Most WAIT/BARRIER requests one connection may have pending at once (PyTorch's client has
    /// at most one); more closes the connection, so pipelined waits cannot grow state unbounded.
    pub max_pending_waits: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            limits: Limits::default(),
            max_pending_output: 256 * 1024,
            max_pending_waits: 1024,
        }
    }
}

/// Why the server's accept task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerExit {
    /// [`StoreServer::shutdown`] was called.
    Shutdown,
    /// The accept loop failed for good (message of the last error) or its task panicked.
    Failed(String),
}

/// Base of the next server's connection ids (see `start_with_store`).
static NEXT_CONN_BASE: AtomicU64 = AtomicU64::new(0);

/// A running store server. Dropping it without [`StoreServer::shutdown`] stops accepting and
/// closes every connection in the background.
pub struct StoreServer {
    addr: SocketAddr,
    store: Arc<Store>,
    shutdown_tx: watch::Sender<bool>,
    exit_rx: watch::Receiver<Option<ServerExit>>,
    accept_task: Option<tokio::task::JoinHandle<()>>,
    conns_done_rx: mpsc::Receiver<()>,
}

/// Raises this process's open-file soft limit to its hard limit (each store connection is one
/// descriptor; PyTorch spec section 4: `ulimit -n` must exceed the world size). Returns the new
/// soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
        debug!(from = soft, to = hard, "raised open-file soft limit");
    }
    Ok(hard.max(soft))
}

/// Binds a listening socket for the store: dual-stack when `addr` is the IPv6 wildcard (`[::]`),
/// exactly `addr` otherwise; SO_REUSEADDR; the largest backlog the kernel allows (listen(-1) would
/// mean the same to Linux; `i32::MAX` is clamped to `net.core.somaxconn`).
pub fn bind_listener(addr: SocketAddr) -> io::Result<StdTcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if let SocketAddr::V6(v6) = addr {
        if *v6.ip() == Ipv6Addr::UNSPECIFIED {
            // Accept IPv4 clients too, like PyTorch binding `::` with IPV6_V6ONLY=0.
            socket.set_only_v6(false)?;
        }
    }
    socket.bind(&addr.into())?;
    socket.listen(i32::MAX)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

impl StoreServer {
    /// Serves on an already-bound listener (blocking or not; it is made non-blocking). Must be
    /// called inside a tokio runtime (either flavor); the server lives on that runtime.
    pub fn start(listener: StdTcpListener, config: ServerConfig) -> io::Result<StoreServer> {
        Self::start_with_store(listener, config, Arc::new(Store::new()))
    }

    /// Binds `addr` (dual-stack for `[::]`) and serves; see [`bind_listener`].
    pub fn bind(addr: SocketAddr, config: ServerConfig) -> io::Result<StoreServer> {
        Self::start(bind_listener(addr)?, config)
    }

    /// Serves `store` (shared with the caller for in-process access).
    pub fn start_with_store(
        listener: StdTcpListener,
        config: ServerConfig,
        store: Arc<Store>,
    ) -> io::Result<StoreServer> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "store server must be started inside a tokio runtime",
            ));
        }
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (exit_tx, exit_rx) = watch::channel(None);
        let (conns_done_tx, conns_done_rx) = mpsc::channel(1);
        let accept = AcceptLoop {
            listener,
            store: store.clone(),
            config: Arc::new(config),
            shutdown_rx,
            conns_done_tx,
            // Connection ids are unique in the process: servers sharing one store (one per
            // listening address) must not mix up each other's connections' waits.
            next_id: AtomicU64::new(NEXT_CONN_BASE.fetch_add(1 << 40, Ordering::Relaxed) + 1),
        };
        let accept_task = tokio::spawn(async move {
            // Publish the exit reason even if the loop panics.
            let mut guard = ExitGuard {
                tx: exit_tx,
                exit: ServerExit::Failed("accept task panicked or was dropped".into()),
            };
            guard.exit = accept.run().await;
        });
        info!(%addr, "store server listening");
        Ok(StoreServer {
            addr,
            store,
            shutdown_tx,
            exit_rx,
            accept_task: Some(accept_task),
            conns_done_rx,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The served state (in-process access without a socket).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Drops every key and queue (between restart attempts, so an attempt never sees the previous
    /// attempt's keys). Pending WAIT/BARRIER registrations are kept: they wait for absent keys,
    /// which stays true, and finish when such a key is next written, or on CANCEL_WAIT /
    /// disconnect as usual. Barrier counters restart from zero.
    pub fn clear(&self) {
        self.store.clear();
    }

    /// Resolves when the server stops serving: after [`StoreServer::shutdown`], or if the accept
    /// task failed or panicked (the launcher treats that as fatal). Can be awaited many times.
    pub fn closed(&self) -> impl Future<Output = ServerExit> + Send + 'static {
        let mut rx = self.exit_rx.clone();
        async move {
            loop {
                if let Some(exit) = rx.borrow_and_update().clone() {
                    return exit;
                }
                if rx.changed().await.is_err() {
                    return rx
                        .borrow()
                        .clone()
                        .unwrap_or_else(|| ServerExit::Failed("server task vanished".into()));
                }
            }
        }
    }

    /// Stops accepting, closes every connection and waits (up to 5 s) until their tasks ended.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        if let Some(task) = self.accept_task.take() {
            let _ = task.await;
        }
        // Every connection task holds a sender clone; recv() returns None once all are gone.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.conns_done_rx.recv()).await;
        info!(addr = %self.addr, "store server stopped");
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

struct ExitGuard {
    tx: watch::Sender<Option<ServerExit>>,
    exit: ServerExit,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(Some(self.exit.clone()));
    }
}

struct AcceptLoop {
    listener: TcpListener,
    store: Arc<Store>,
    config: Arc<ServerConfig>,
    shutdown_rx: watch::Receiver<bool>,
    conns_done_tx: mpsc::Sender<()>,
    next_id: AtomicU64,
}

impl AcceptLoop {
    async fn run(mut self) -> ServerExit {
        let mut consecutive_errors = 0u32;
        loop {
            let accepted = tokio::select! {
                biased;
                _ = self.shutdown_rx.changed() => return ServerExit::Shutdown,
                r = self.listener.accept() => r,
            };
            match accepted {
                Ok((stream, peer)) => {
                    consecutive_errors = 0;
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let conn = Connection {
                        id,
                        peer,
                        store: self.store.clone(),
                        config: self.config.clone(),
                        shutdown_rx: self.shutdown_rx.clone(),
                        _done: self.conns_done_tx.clone(),
                        notify: Arc::new(Notify::new()),
                    };
                    tokio::spawn(conn.run(stream));
                }
                Err(e) => {
                    // EMFILE/ENFILE/ENOBUFS/ECONNABORTED are transient: the pending connection
                    // stays in the backlog (or the client retries); back off briefly.
                    consecutive_errors += 1;
                    warn!(error = %e, "store accept failed");
                    if consecutive_errors > 10_000 {
                        return ServerExit::Failed(format!("accept keeps failing: {e}"));
                    }
                    tokio::select! {
                        _ = self.shutdown_rx.changed() => return ServerExit::Shutdown,
                        _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    }
                }
            }
        }
    }
}

struct Connection {
    id: ConnId,
    peer: SocketAddr,
    store: Arc<Store>,
    config: Arc<ServerConfig>,
    shutdown_rx: watch::Receiver<bool>,
    _done: mpsc::Sender<()>,
    notify: Arc<Notify>,
}

/// Why a connection is closed by the server.
enum Close {
    Eof,
    Shutdown,
    Io(io::Error),
    Bad(String),
}

/// Largest read-buffer growth step; buffers above this are freed once drained.
const READ_CHUNK: usize = 64 * 1024;
/// Read room kept while idle: TCPStore requests are small, so idle connections stay cheap.
const SMALL_READ: usize = 512;

impl Connection {
    async fn run(self, stream: TcpStream) {
        if let Err(e) = stream.set_nodelay(true) {
            debug!(peer = %self.peer, error = %e, "set TCP_NODELAY failed");
        }
        let close = self.serve(stream).await;
        self.store.disconnect(self.id);
        match close {
            Close::Eof | Close::Shutdown => {
                debug!(conn = self.id, peer = %self.peer, "store connection closed")
            }
            Close::Io(e) => {
                debug!(conn = self.id, peer = %self.peer, error = %e, "store connection error")
            }
            Close::Bad(why) => {
                warn!(conn = self.id, peer = %self.peer, "closing store connection: {why}")
            }
        }
    }

    async fn serve(&self, mut stream: TcpStream) -> Close {
        let mut inbuf: Vec<u8> = Vec::with_capacity(SMALL_READ);
        let mut out: Vec<u8> = Vec::new();
        let mut validated = false;
        let mut streaming = false;
        let mut shutdown_rx = self.shutdown_rx.clone();
        if *shutdown_rx.borrow_and_update() {
            return Close::Shutdown;
        }
        loop {
            // Serve every complete request buffered so far, in order.
            let mut pos = 0;
            let mut bad = None;
            while pos < inbuf.len() {
                if !validated && inbuf[pos] != 0 {
                    bad = Some(format!(
                        "first request is opcode {} instead of VALIDATE",
                        inbuf[pos]
                    ));
                    break;
                }
                match decode_request(&inbuf[pos..], &self.config.limits) {
                    Ok(Decoded::Incomplete) => break,
                    Ok(Decoded::Complete { request, consumed }) => {
                        pos += consumed;
                        if let Err(why) = self.handle(request, &mut validated, &mut out) {
                            bad = Some(why);
                            break;
                        }
                        if out.len() >= self.config.max_pending_output {
                            if let Err(e) = stream.write_all(&out).await {
                                return Close::Io(e);
                            }
                            out.clear();
                        }
                    }
                    Err(e) => {
                        bad = Some(e.to_string());
                        break;
                    }
                }
            }
            if pos == inbuf.len() {
                // Release big buffers once drained and the client is not streaming; idle
                // connections keep a small one.
                if inbuf.capacity() > 4 * SMALL_READ && !streaming {
                    inbuf = Vec::new();
                } else {
                    inbuf.clear();
                }
            } else if pos > 0 {
                inbuf.drain(..pos);
            }
            if !out.is_empty() {
                if let Err(e) = stream.write_all(&out).await {
                    return Close::Io(e);
                }
                out.clear();
                if out.capacity() > READ_CHUNK {
                    out = Vec::new();
                }
            }
            if let Some(why) = bad {
                return Close::Bad(why);
            }

            // Room for the next read: small while idle, growing with a partial large request.
            let want = if streaming {
                READ_CHUNK
            } else if inbuf.is_empty() {
                SMALL_READ
            } else {
                inbuf.len().clamp(SMALL_READ, READ_CHUNK)
            };
            if inbuf.capacity() - inbuf.len() < want {
                inbuf.reserve(want);
            }
            let room = inbuf.capacity() - inbuf.len();
            tokio::select! {
                biased;
                _ = shutdown_rx.changed() => return Close::Shutdown,
                _ = self.notify.notified() => {
                    let n = self.store.take_ready(self.id);
                    out.resize(out.len() + n as usize, STOP_WAITING);
                }
                // read_buf is cancel-safe, and tokio clears the readiness on a short read, which
                // saves the extra EAGAIN read per request that a readable()/try_read loop costs.
                r = stream.read_buf(&mut inbuf) => match r {
                    Ok(0) => return Close::Eof,
                    // A read that filled the room means more is queued (pipelined requests or a
                    // big value): read in big chunks until the client stops streaming.
                    Ok(n) => streaming = n >= room,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Close::Io(e),
                },
            }
        }
    }

    fn check_pending_waits(&self) -> Result<(), String> {
        let n = self.store.pending_waits(self.id);
        if n >= self.config.max_pending_waits {
            return Err(format!(
                "{n} WAIT/BARRIER requests pending on one connection (limit {})",
                self.config.max_pending_waits
            ));
        }
        Ok(())
    }

    /// Applies one request, appending its reply (if any) to `out`. `Err` closes the connection.
    fn handle(&self, req: Request, validated: &mut bool, out: &mut Vec<u8>) -> Result<(), String> {
        let store = &self.store;
        match req {
            Request::Validate { magic } => {
                if *validated {
                    return Err("second VALIDATE on one connection".into());
                }
                if magic != VALIDATION_MAGIC {
                    return Err(format!("wrong validation magic {magic:#010x}"));
                }
                *validated = true;
            }
            Request::Set { key, value } => store.set(key, value),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => put_str(out, &store.compare_set(&key, &expected, desired)),
            Request::Get { key } => put_str(out, &store.get(&key).unwrap_or_default()),
            Request::Add { key, delta } => {
                put_i64(out, store.add(&key, delta).map_err(|e| e.to_string())?)
            }
            Request::Check { keys } => out.push(if store.check(&keys) {
                CHECK_READY
            } else {
                CHECK_NOT_READY
            }),
            Request::Wait { keys } => {
                self.check_pending_waits()?;
                if store.wait(self.id, &self.notify, &keys) == WaitOutcome::Ready {
                    out.push(STOP_WAITING);
                }
            }
            Request::GetNumKeys => put_i64(out, store.num_keys()),
            Request::DeleteKey { key } => put_i64(out, i64::from(store.delete(&key))),
            Request::Append { key, value } => store.append(&key, &value),
            Request::MultiGet { keys } => {
                for v in store.multi_get(&keys) {
                    put_str(out, &v.unwrap_or_default());
                }
            }
            Request::MultiSet { pairs } => store.multi_set(pairs),
            Request::CancelWait => {
                let finished = store.cancel_waits(self.id);
                out.resize(out.len() + finished as usize, STOP_WAITING);
                out.push(WAIT_CANCELED);
            }
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::QueuePush { key, value } => store.queue_push(&key, value),
            Request::QueuePop { key } => {
                let (len, v) = store.queue_pop(&key);
                put_i64(out, len);
                if let Some(v) = v {
                    put_str(out, &v);
                }
            }
            Request::QueueLen { key } => put_i64(out, store.queue_len(&key)),
            Request::ListKeys => {
                let keys = store.list_keys();
                put_i64(out, keys.len() as i64);
                for k in keys {
                    put_str(out, &k);
                }
            }
            Request::Barrier { key, world_size } => {
                self.check_pending_waits()?;
                let outcome = store
                    .barrier(self.id, &self.notify, &key, world_size)
                    .map_err(|e| e.to_string())?;
                if outcome == WaitOutcome::Ready {
                    out.push(STOP_WAITING);
                }
            }
        }
        Ok(())
    }
}
