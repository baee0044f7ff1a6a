//! The TCPStore-compatible server: the listener, one task per connection, and the handle the
//! launcher keeps for the life of the run ([`StoreServer`]).
//!
//! Behaviour (PyTorch 2.15.0, `TCPStoreLibUvBackend.cpp` / `TCPStoreBackend.cpp`, and the
//! differences chosen on purpose):
//! - The first request must be VALIDATE with the magic; anything else closes the connection (the
//!   legacy server's clean semantics; libuv's quirks are not reproduced).
//! - Requests are buffered and decoded incrementally; pipelined requests are answered in order.
//!   WAIT/BARRIER replies are deferred while later requests (CANCEL_WAIT above all) are served.
//! - Bad input (unknown opcode, limits, non-numeric ADD target) closes only that connection. The
//!   warnings are rate-limited: the first bad connection of an interval is logged at once, the
//!   rest as one summary line per interval ([`LogLimiter`]), so a flood cannot fill the job's
//!   stderr.
//! - No client can stall or end the job: a partial request is decoded where it stopped (O(n) per
//!   request, however it is split); a request is bounded by [`Limits`]; the partial requests of
//!   all connections together are bounded by [`ServerConfig::max_buffered_bytes`] (the connection
//!   that would exceed it is closed); a connection that does not complete VALIDATE within
//!   [`ServerConfig::validate_timeout`] is closed; and accept failures (EMFILE when descriptors run
//!   out, ENFILE, ENOBUFS, ...) only make the listener back off while existing connections keep
//!   being served: the server never stops because accept failed.
//! - Accepting runs on a thread of its own that drains the kernel's queue as connections arrive,
//!   whatever the runtime is busy with, and hands each new connection to a fresh stage on a
//!   second thread for its first requests: they are served there, newest connection first, as
//!   long as they need no wait, so a new client is answered ahead of the storm queued on the
//!   runtime (see [`AcceptLoop`]; issue 16). Idle connections hold no read or reply buffer (reads go
//!   into a per-thread buffer and are served in the same poll).
//! - No reverse DNS on accept (both PyTorch servers call `getnameinfo` per connection), listen
//!   backlog as large as the kernel allows, TCP_NODELAY on every accepted socket, dual-stack on a
//!   wildcard IPv6 address.
//! - Works on a current-thread or multi-thread tokio runtime: nothing on it blocks.
//!
//! Files: this one holds the settings, the handle and what its parts share (the limiter of
//! warnings, the buffer cap); `server/accept.rs` the accept thread and the fresh stage;
//! `server/conn.rs` one connection's task. The codec is apart (`protocol`), and so are the
//! state (`state`) and the counters (`stats`).

use std::future::Future;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::protocol::Limits;
use super::state::Store;

mod accept;
mod conn;

use accept::AcceptLoop;

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
    /// Most bytes of partial requests buffered across all connections together; the connection
    /// whose bytes would go beyond it is closed (the others keep working).
    pub max_buffered_bytes: u64,
    /// A connection that has not completed VALIDATE this long after accept is closed (PyTorch's
    /// client sends it right after connecting; port scanners and half-open probes never do).
    pub validate_timeout: Duration,
    /// At most one warning line per this interval for bad connections, and one for accept
    /// failures; what was held back is summarised with a count.
    pub log_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            limits: Limits::default(),
            max_pending_output: 256 * 1024,
            max_pending_waits: 1024,
            max_buffered_bytes: 512 << 20,
            validate_timeout: Duration::from_secs(10),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// Why the server's accept task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerExit {
    /// [`StoreServer::shutdown`] was called.
    Shutdown,
    /// The listening socket itself is unusable (EBADF, EINVAL, ENOTSOCK: never a resource
    /// shortage, which only backs off) or the accept task panicked.
    Failed(String),
}

/// The `global_queue_interval` for a tokio runtime that hosts a store server: look at the
/// global queue on every scheduler tick. The accept thread hands each new connection to the
/// runtime from outside, so its task lands in that queue, while the requests of connections
/// already open are woken into the local queue; with tokio's default (31) a new connection
/// was first polled after 31 ticks of the storm's requests per connection queued ahead of it,
/// so a fresh client waited behind the whole storm (issue 16). Set on the launcher's runtime.
pub const STORE_GLOBAL_QUEUE_INTERVAL: u32 = 1;

/// Base of the next server's connection ids (see `start_with_store`).
static NEXT_CONN_BASE: AtomicU64 = AtomicU64::new(0);

/// A running store server. Dropping it without [`StoreServer::shutdown`] stops accepting and
/// closes every connection in the background.
pub struct StoreServer {
    addr: SocketAddr,
    store: Arc<Store>,
    shared: Arc<Shared>,
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
/// exactly `addr` otherwise; SO_REUSEADDR; the largest backlog the kernel allows
/// ([`listen_backlog`]).
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
    socket.listen(listen_backlog())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The listen backlog: `net.core.somaxconn` as the kernel reports it (the most it accepts; a
/// start-up storm of thousands of clients must not find the queue full), else `i32::MAX`, which
/// Linux clamps to the same value.
pub fn listen_backlog() -> i32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(i32::MAX)
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
        // Inherited by accepted sockets on Linux (the accept thread checks).
        if let Err(e) = socket2::SockRef::from(&listener).set_tcp_nodelay(true) {
            debug!(error = %e, "set TCP_NODELAY on the listener failed");
        }
        let addr = listener.local_addr()?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (exit_tx, exit_rx) = watch::channel(None);
        let (conns_done_tx, conns_done_rx) = mpsc::channel(1);
        let mut stop_rx = shutdown_rx.clone();
        let shared = Arc::new(Shared {
            bad_conns: Mutex::new(LogLimiter::new(
                config.log_interval,
                "bad store connections closed",
            )),
            accept_failures: Mutex::new(LogLimiter::new(
                config.log_interval,
                "store accept failures",
            )),
            store: store.clone(),
            config,
            buffered: AtomicU64::new(0),
            shutdown_rx,
            // Connection ids are unique in the process: servers sharing one store (one per
            // listening address) must not mix up each other's connections' waits.
            next_id: AtomicU64::new(NEXT_CONN_BASE.fetch_add(1 << 40, Ordering::Relaxed) + 1),
        });
        let (wake_tx, wake_rx) = std::os::unix::net::UnixStream::pair()?;
        let accept = AcceptLoop {
            listener,
            wake: wake_rx,
            shared: shared.clone(),
            conns_done_tx,
            rt: tokio::runtime::Handle::current(),
        };
        let (thread_tx, mut thread_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("rdrun-store-accept".into())
            .spawn(move || {
                let exit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| accept.run()))
                    .unwrap_or_else(|_| ServerExit::Failed("store accept thread panicked".into()));
                let _ = thread_tx.send(exit);
            })?;
        let accept_task = tokio::spawn(async move {
            // Publish the exit reason even if this task is dropped (runtime shut down); dropping
            // `wake_tx` then ends the thread too (its wake-up socket reads EOF).
            let mut guard = ExitGuard {
                tx: exit_tx,
                exit: ServerExit::Failed("accept task panicked or was dropped".into()),
            };
            let vanished = || ServerExit::Failed("store accept thread vanished".into());
            guard.exit = tokio::select! {
                r = &mut thread_rx => r.unwrap_or_else(|_| vanished()),
                () = shutdown_requested(&mut stop_rx) => {
                    use std::io::Write;
                    let _ = (&wake_tx).write_all(&[1]);
                    thread_rx.await.unwrap_or_else(|_| vanished())
                }
            };
        });
        info!(%addr, "store server listening");
        Ok(StoreServer {
            addr,
            store,
            shared,
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

    /// Bytes of partial requests all connections hold right now (bounded by
    /// [`ServerConfig::max_buffered_bytes`]).
    pub fn buffered_bytes(&self) -> u64 {
        self.shared.buffered.load(Ordering::Relaxed)
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

/// Writes `out`: straight to the socket first (a reply almost always fits its send buffer),
/// then through tokio for what did not fit. A connection's first reply thus does not wait for
/// the reactor to report the socket writable, which on a busy runtime is a turn of the whole
/// queue away (issue 16).
async fn write_out(stream: &mut TcpStream, out: &[u8]) -> io::Result<()> {
    super::stats::STATS.wrote(out.len());
    let sent = loop {
        match socket2::SockRef::from(&*stream).send_with_flags(out, libc::MSG_NOSIGNAL) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 0,
            Err(e) => return Err(e),
        }
    };
    if sent < out.len() {
        stream.write_all(&out[sent..]).await?;
    }
    Ok(())
}

/// Resolves when `timer` is due; never while it is `None`.
async fn until_due(timer: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Resolves once shutdown was requested (or the server handle is gone).
async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
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

/// What the accept loop and every connection task share.
struct Shared {
    store: Arc<Store>,
    config: ServerConfig,
    /// Bytes of partial requests held by all connections together.
    buffered: AtomicU64,
    bad_conns: Mutex<LogLimiter>,
    accept_failures: Mutex<LogLimiter>,
    shutdown_rx: watch::Receiver<bool>,
    next_id: AtomicU64,
}

impl Shared {
    fn report_bad_conn(&self, what: String) {
        let line = lock(&self.bad_conns).event(Instant::now(), what);
        if let Some(line) = line {
            warn!("closing store connection: {line}");
        }
    }

    fn report_accept_failure(&self, e: &io::Error) {
        let what =
            format!("{e}; not accepting for a while (connections already open are still served)");
        let line = lock(&self.accept_failures).event(Instant::now(), what);
        if let Some(line) = line {
            warn!("store accept failed: {line}");
        }
    }

    /// Prints the summaries whose interval has passed (all of them when `force`, at shutdown).
    fn flush_logs(&self, force: bool) {
        let now = Instant::now();
        let flush = |l: &mut LogLimiter| if force { l.flush_all() } else { l.flush(now) };
        if let Some(line) = flush(&mut lock(&self.bad_conns)) {
            warn!("closing store connection: {line}");
        }
        if let Some(line) = flush(&mut lock(&self.accept_failures)) {
            warn!("store accept failed: {line}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rate limit for one kind of warning: the first event of a quiet period is printed at once; later
/// ones within `interval` of the last printed line are counted and printed as one summary line
/// (with the latest event) once the interval has passed, so at most one line per interval. Pure:
/// the caller passes the time and prints what it returns.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    noun: &'static str,
    last_line: Option<Instant>,
    held: u64,
    latest: String,
}

impl LogLimiter {
    /// A limiter for events described, in summaries, as `noun` ("bad store connections closed").
    pub fn new(interval: Duration, noun: &'static str) -> LogLimiter {
        LogLimiter {
            interval,
            noun,
            last_line: None,
            held: 0,
            latest: String::new(),
        }
    }

    fn quiet(&self, now: Instant) -> bool {
        match self.last_line {
            None => true,
            Some(t) => now.saturating_duration_since(t) >= self.interval,
        }
    }

    /// Records one event; returns the line to print now, if any.
    pub fn event(&mut self, now: Instant, what: String) -> Option<String> {
        if !self.quiet(now) {
            self.held += 1;
            self.latest = what;
            return None;
        }
        self.last_line = Some(now);
        if self.held == 0 {
            return Some(what);
        }
        self.held += 1;
        self.latest = what;
        Some(self.summary())
    }

    /// The summary of held-back events, once the interval since the last line has passed.
    pub fn flush(&mut self, now: Instant) -> Option<String> {
        if self.held == 0 || !self.quiet(now) {
            return None;
        }
        self.last_line = Some(now);
        Some(self.summary())
    }

    /// Whether events are held back for a summary.
    pub fn holding(&self) -> bool {
        self.held > 0
    }

    /// The summary of held-back events now, interval or not (nothing is lost at shutdown).
    pub fn flush_all(&mut self) -> Option<String> {
        (self.held > 0).then(|| self.summary())
    }

    fn summary(&mut self) -> String {
        let line = format!(
            "{} more {} in the last {}s (latest: {})",
            self.held,
            self.noun,
            self.interval.as_secs_f64().ceil() as u64,
            self.latest
        );
        self.held = 0;
        self.latest.clear();
        line
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
