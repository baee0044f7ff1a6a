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
//! Length: about 1,390 lines of code for one responsibility, serving the store: the accept thread
//! and the fresh-connection stage's (with their small epoll wrapper),
//! the per-connection task, and the hardening limits that only make sense together with them
//! (accept backoff at the fd limit, the VALIDATE deadline, the global buffer cap, rate-limited
//! warnings). The codec is apart (`protocol`), and so are the state (`state`) and the counters
//! (`stats`).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, TcpListener as StdTcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::protocol::{
    Decoder, Limits, QueryType, Reply, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING,
    VALIDATION_MAGIC, WAIT_CANCELED,
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

/// Pause after a failed accept, doubling while failures go on.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accept errors that mean the listening socket itself is unusable; everything else (EMFILE,
/// ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, EPERM, EPROTO, ...) is a shortage or a failed client
/// and passes: the pending connection stays in the backlog until descriptors free up.
fn accept_error_is_fatal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP | libc::EFAULT)
    )
}

/// The accept loop, on a thread of its own (issue 16).
///
/// Why a thread: when it was a task on the server's runtime, a start-up storm of N clients put N
/// connection tasks in the run queue ahead of it (tokio also makes a busy task yield after a
/// budget of I/O operations), so accept fell behind; once `somaxconn` connections waited
/// unaccepted the kernel dropped SYNs, and those clients retried after 1 s and then 3 s: 9,000
/// clients took 0.57 s, 18,000 took 4.9 s. The thread blocks in `poll` on the listener and a
/// wake-up socket, drains every pending connection with non-blocking `accept` until EAGAIN and
/// hands each to the runtime, so the accept queue empties as fast as SYNs arrive whatever the
/// runtime is doing.
///
/// The fresh stage, on a second thread ([`AcceptLoop::stage_loop`]): each accepted socket first
/// joins that thread's epoll set; what it sends is served there ([`AcceptLoop::stage_step`],
/// with the same code as the connection's task) for up to [`FRESH_READS`] reads within
/// [`FIRST_BYTES_HOLD`] of accepting, newest connection first, and the socket is handed to the
/// runtime with the decoder's state once a request waits or the stage is done with it. On the
/// runtime a connection's task is queued behind every connection of a storm that is woken
/// before it; in the stage a new client's requests are answered within one turn of its loop
/// (issue 16). The stage has its own thread because serving it on the accepting one let the
/// kernel's accept queue (first in, first out) grow to thousands during a storm.
struct AcceptLoop {
    listener: StdTcpListener,
    /// Readable when the server shuts down (a byte written, or the other end dropped).
    wake: std::os::unix::net::UnixStream,
    shared: Arc<Shared>,
    conns_done_tx: mpsc::Sender<()>,
    rt: tokio::runtime::Handle,
}

impl AcceptLoop {
    fn run(self) -> ServerExit {
        let (ep, stage_ep) = match (Epoll::new(), Epoll::new()) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                return ServerExit::Failed(format!("store accept thread: epoll: {e}"))
            }
        };
        if let Err(e) = ep
            .add(self.wake.as_raw_fd(), WAKE_TOKEN)
            .and_then(|()| ep.add(self.listener.as_raw_fd(), LISTEN_TOKEN))
            .and_then(|()| stage_ep.add(self.wake.as_raw_fd(), WAKE_TOKEN))
        {
            return ServerExit::Failed(format!("store accept thread: epoll_ctl: {e}"));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        // The stage thread is joined when the scope ends, so its connections are forgotten
        // before the exit is published.
        std::thread::scope(|scope| {
            let this = &self;
            let stage_ep = &stage_ep;
            let stage = std::thread::Builder::new()
                .name("rdrun-store-fresh".into())
                .spawn_scoped(scope, move || this.stage_loop(stage_ep, rx));
            if let Err(e) = stage {
                return ServerExit::Failed(format!("store fresh-stage thread: {e}"));
            }
            self.accept_loop(&ep, stage_ep, tx)
        })
    }

    /// Accepts until shutdown or a broken listener; each new connection goes to the stage
    /// thread (sent first, then added to its epoll set, so the stage has it by the time its
    /// socket is reported readable).
    fn accept_loop(
        &self,
        ep: &Epoll,
        stage_ep: &Epoll,
        tx: std::sync::mpsc::Sender<(u64, std::time::Instant, Box<Fresh>)>,
    ) -> ServerExit {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        // While set, accepting pauses until then (descriptors ran out); the listener is out
        // of the epoll set meanwhile (it stays readable, so it would wake us at once).
        let mut resume: Option<std::time::Instant> = None;
        let period = self
            .shared
            .config
            .log_interval
            .max(Duration::from_millis(1));
        let mut next_flush = std::time::Instant::now() + period;
        let mut next_token: u64 = 0;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 8];
        let mut nodelay_inherited = false;
        loop {
            let now = std::time::Instant::now();
            if now >= next_flush {
                self.shared.flush_logs(false);
                next_flush = now + period;
            }
            if resume.is_some_and(|r| now >= r) {
                resume = None;
                if let Err(e) = ep.add(self.listener.as_raw_fd(), LISTEN_TOKEN) {
                    return ServerExit::Failed(format!("store accept thread: epoll_ctl: {e}"));
                }
            }
            let until = resume.map_or(next_flush, |r| r.min(next_flush));
            let wait_ms = until
                .saturating_duration_since(now)
                .as_millis()
                .clamp(1, i32::MAX as u128) as i32;
            let n = match ep.wait(&mut events, wait_ms) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return ServerExit::Failed(format!("store accept thread: epoll_wait: {e}"))
                }
            };
            if *self.shared.shutdown_rx.borrow() || events[..n].iter().any(|e| e.u64 == WAKE_TOKEN)
            {
                self.shared.flush_logs(true);
                return ServerExit::Shutdown;
            }
            if resume.is_some() || !events[..n].iter().any(|e| e.u64 == LISTEN_TOKEN) {
                continue;
            }
            // Drain: everything the kernel has queued, without going back to epoll between
            // (its queue is first in, first out: a fresh client waits behind every connection
            // whose handshake completed before its own).
            loop {
                match accept_nonblocking(&self.listener) {
                    Ok((stream, peer)) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        let token = next_token;
                        next_token += 1;
                        // Linux copies TCP_NODELAY from the listener to the accepted socket
                        // (set in `start_with_store`): checked once, set per socket only where
                        // it is not inherited (one system call less per client).
                        if !nodelay_inherited {
                            nodelay_inherited = stream.nodelay().unwrap_or(false);
                            if !nodelay_inherited {
                                if let Err(e) = stream.set_nodelay(true) {
                                    debug!(%peer, error = %e, "set TCP_NODELAY failed");
                                }
                            }
                        }
                        let f = Box::new(Fresh {
                            conn: Connection::new(&self.shared, &self.conns_done_tx, peer),
                            stream,
                            decoder: Decoder::new(self.shared.config.limits),
                            validated: false,
                            reads: 0,
                        });
                        let fd = f.stream.as_raw_fd();
                        match tx.send((token, std::time::Instant::now(), f)) {
                            // Not in the stage's epoll set: its hold hands it over.
                            Ok(()) => {
                                let _ = stage_ep.add(fd, token);
                            }
                            Err(std::sync::mpsc::SendError((_, _, f))) => {
                                self.hand_over(*f, Vec::new(), Vec::new(), None)
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if accept_error_is_fatal(&e) => {
                        return ServerExit::Failed(format!("store listening socket failed: {e}"));
                    }
                    Err(e) => {
                        // Never fatal: back off and keep serving the others.
                        self.shared.report_accept_failure(&e);
                        ep.delete(self.listener.as_raw_fd());
                        resume = Some(std::time::Instant::now() + backoff);
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        break;
                    }
                }
            }
        }
    }

    /// The fresh stage, on a thread of its own: serves the new connections that spoke, newest
    /// first, until each is handed to the runtime. Ends at shutdown or when the accept loop
    /// ended (its sender is gone).
    fn stage_loop(
        &self,
        ep: &Epoll,
        rx: std::sync::mpsc::Receiver<(u64, std::time::Instant, Box<Fresh>)>,
    ) {
        let hold = FIRST_BYTES_HOLD.min(self.shared.config.validate_timeout);
        let mut fresh = Stage(HashMap::new());
        // When each connection's hold ends, in accept order (so the oldest is first).
        let mut holds: VecDeque<(std::time::Instant, u64)> = VecDeque::new();
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut buf = vec![0u8; READ_CHUNK];
        let mut spoke: Vec<u64> = Vec::new();
        let take_new = |fresh: &mut Stage, holds: &mut VecDeque<_>| loop {
            match rx.try_recv() {
                Ok((token, at, f)) => {
                    fresh.0.insert(token, f);
                    holds.push_back((at + hold, token));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return true,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return false,
            }
        };
        loop {
            if !take_new(&mut fresh, &mut holds) {
                return;
            }
            let now = std::time::Instant::now();
            while let Some(&(t, token)) = holds.front() {
                if t > now {
                    break;
                }
                holds.pop_front();
                if let Some(f) = fresh.0.remove(&token) {
                    ep.delete(f.stream.as_raw_fd());
                    self.hand_over(*f, Vec::new(), Vec::new(), None);
                }
            }
            // The stage's peak (a storm) is not kept: an empty map gives its memory back, and
            // every hold left then is for a connection already handed over.
            if fresh.0.is_empty() && fresh.0.capacity() > 64 {
                fresh.0 = HashMap::new();
                holds = VecDeque::new();
            }
            // New connections reach the map when their socket speaks (below) or within this.
            let mut until = now + Duration::from_millis(50);
            if let Some(&(t, _)) = holds.front() {
                until = until.min(t);
            }
            let wait_ms = until
                .saturating_duration_since(now)
                .as_millis()
                .clamp(1, i32::MAX as u128) as i32;
            // Room for every socket that can be ready: the stage serves the newest first, so it
            // must see them all (the kernel lists ready sockets oldest first).
            let room = (fresh.0.len() + 4096).min(1 << 16);
            if events.len() < room {
                events.resize(room, libc::epoll_event { events: 0, u64: 0 });
            }
            let n = match ep.wait(&mut events, wait_ms) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!("store fresh stage: epoll_wait: {e}; new connections go to the runtime at once");
                    return;
                }
            };
            if events[..n].iter().any(|e| e.u64 == WAKE_TOKEN) {
                return;
            }
            // Sent before their sockets joined the epoll set: every token reported is here now.
            if !take_new(&mut fresh, &mut holds) {
                return;
            }
            spoke.clear();
            spoke.extend(events[..n].iter().map(|e| e.u64));
            // Newest first: a new client is answered ahead of the storm that came before it
            // (issue 16); one left unserved here goes to the runtime when its hold ends.
            spoke.sort_unstable_by(|a, b| b.cmp(a));
            for &token in &spoke {
                let Some(f) = fresh.0.get_mut(&token) else {
                    continue;
                };
                if let Some((input, out, bad)) = self.stage_step(f, &mut buf) {
                    if let Some(f) = fresh.0.remove(&token) {
                        ep.delete(f.stream.as_raw_fd());
                        self.hand_over(*f, input, out, bad);
                    }
                }
            }
        }
    }

    /// Serves what a fresh connection just sent, on the stage thread: its requests are
    /// answered at once, ahead of everything queued on the runtime (issue 16). Returns `None`
    /// while the connection stays in the stage, or what its task starts from: bytes not served,
    /// replies not sent, and why to close it if it is bad. It leaves the stage once a request
    /// waits (WAIT/BARRIER on absent keys), a request is partial (a big value streams in), a
    /// reply does not fit the socket, after [`FRESH_READS`] reads, at EOF or on an error.
    #[allow(clippy::type_complexity)]
    fn stage_step(
        &self,
        f: &mut Fresh,
        buf: &mut [u8],
    ) -> Option<(Vec<u8>, Vec<u8>, Option<String>)> {
        use std::io::Read;
        let n = loop {
            match (&f.stream).read(buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                // The task meets the EOF or the error itself.
                Err(_) => break 0,
            }
        };
        if n == 0 {
            return Some((Vec::new(), Vec::new(), None));
        }
        super::stats::STATS.read(n);
        f.reads += 1;
        let mut out = Vec::new();
        let (input, bad) =
            match f
                .conn
                .process(&mut f.decoder, &mut f.validated, &buf[..n], &mut out)
            {
                Step::Done => (Vec::new(), None),
                Step::Flush(k) => (buf[k..n].to_vec(), None),
                Step::Bad(why) => (Vec::new(), Some(why)),
            };
        if !out.is_empty() {
            let sent = send_now(&f.stream, &out);
            super::stats::STATS.wrote(sent);
            out.drain(..sent);
        }
        let stays = bad.is_none()
            && input.is_empty()
            && out.is_empty()
            && f.decoder.at_boundary()
            && n < buf.len()
            && f.reads < FRESH_READS
            && !self.shared.store.has_waits(f.conn.id);
        (!stays).then_some((input, out, bad))
    }

    /// Hands a connection to the runtime: registers its socket with the runtime's reactor
    /// (`epoll_ctl`, here rather than on the runtime's thread; tokio's reactor accepts
    /// registrations from any thread inside the runtime's context) and spawns its task.
    fn hand_over(&self, f: Fresh, input: Vec<u8>, out: Vec<u8>, bad: Option<String>) {
        let Fresh {
            conn,
            stream,
            decoder,
            validated,
            ..
        } = f;
        let stream = {
            let _in_runtime = self.rt.enter();
            TcpStream::from_std(stream)
        };
        match stream {
            Ok(stream) => {
                // Boxed: an async fn keeps its arguments for its whole life, so a `Resume` by
                // value made every connection's task bigger (issue 16).
                let resume = Box::new(Resume {
                    decoder,
                    validated,
                    input,
                    out,
                    bad,
                });
                self.rt.spawn(conn.run(stream, resume));
            }
            Err(e) => {
                conn.forget();
                debug!(peer = %conn.peer, error = %e, "could not register connection");
            }
        }
    }
}

/// A connection in the accept thread's fresh stage: its socket is in the thread's epoll set,
/// and what it sends is served there.
struct Fresh {
    conn: Connection,
    stream: std::net::TcpStream,
    decoder: Decoder,
    validated: bool,
    /// Reads served by the stage so far.
    reads: u32,
}

/// The fresh stage's connections by token; those still there when the accept thread ends are
/// forgotten (their sockets close).
struct Stage(HashMap<u64, Box<Fresh>>);

impl Drop for Stage {
    fn drop(&mut self) {
        for f in self.0.values() {
            f.conn.forget();
        }
    }
}

/// How long a new connection may stay in the accept thread's fresh stage before it is handed
/// to the runtime whatever it does (a silent one then meets the VALIDATE deadline in its task).
const FIRST_BYTES_HOLD: Duration = Duration::from_millis(250);
/// Most reads the fresh stage serves per connection: enough for a client's first round trips
/// (PyTorch's client: VALIDATE + PING, then a SET and a GET, which is WAIT + GET), few enough
/// that the storm's later requests go to the runtime and the stage stays the fast lane.
const FRESH_READS: u32 = 8;
const WAKE_TOKEN: u64 = u64::MAX;
const LISTEN_TOKEN: u64 = u64::MAX - 1;

/// Sends what fits now without blocking (the socket is non-blocking); returns how much went.
/// An error sends nothing: the connection's task meets it when it writes the rest.
fn send_now(stream: &std::net::TcpStream, out: &[u8]) -> usize {
    loop {
        match socket2::SockRef::from(stream).send_with_flags(out, libc::MSG_NOSIGNAL) {
            Ok(n) => return n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return 0,
        }
    }
}

/// A level-triggered epoll set of the accept thread: the wake-up socket, the listener and the
/// fresh connections, each with a token.
struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new() -> io::Result<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the descriptor is checked and then owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        Ok(Epoll(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn add(&self, fd: std::os::fd::RawFd, token: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: token,
        };
        // SAFETY: valid descriptors and a valid event struct.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes `fd`; it can only fail if `fd` is not in the set, which leaves nothing to do.
    fn delete(&self, fd: std::os::fd::RawFd) {
        use std::os::fd::AsRawFd;
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: valid descriptors and a valid (ignored) event struct.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let max = events.len().min(i32::MAX as usize) as i32;
        // SAFETY: `events` has room for `max` entries.
        let n =
            unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`: the socket comes back non-blocking, which saves
/// the `ioctl(FIONBIO)` per connection that `std`'s accept + `set_nonblocking` costs.
fn accept_nonblocking(listener: &StdTcpListener) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let lfd = listener.as_raw_fd();
    // SAFETY: accept4 writes at most `*len` bytes of address into the zeroed storage socket2
    // provides and updates `*len`; the returned descriptor is checked.
    let (fd, addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let fd = libc::accept4(
                lfd,
                storage.cast(),
                len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            );
            if fd < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(fd)
            }
        })
    }?;
    // SAFETY: `fd` is a socket accept4 just created; nothing else owns it.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    let peer = addr
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted a socket with a non-IP peer address"))?;
    Ok((stream, peer))
}

struct Connection {
    id: ConnId,
    peer: SocketAddr,
    shared: Arc<Shared>,
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

/// The read size: every read goes into a per-thread buffer of this size ([`SCRATCH`]), so an
/// idle connection holds no read buffer at all (issue 16: the 512-byte buffer each connection
/// kept between requests was a sixth of its memory).
const READ_CHUNK: usize = 64 * 1024;

thread_local! {
    /// The read buffer of the runtime thread(s): a connection's task reads into it and serves
    /// what it read in the same poll; bytes it cannot serve then (a partial request is kept by
    /// the decoder; only a flush in mid-batch leaves bytes over) are copied out.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// Reads what the socket has into [`SCRATCH`]; the bytes are there until the calling task's
/// next await (it serves them within the same poll).
fn read_scratch(stream: &mut TcpStream) -> impl Future<Output = io::Result<usize>> + '_ {
    use tokio::io::AsyncRead;
    std::future::poll_fn(move |cx| {
        SCRATCH.with_borrow_mut(|buf| {
            let mut rb = tokio::io::ReadBuf::new(&mut buf[..]);
            // tokio clears the readiness on a short read, which saves the extra EAGAIN read per
            // request that a readable()/try_read loop costs.
            match std::pin::Pin::new(&mut *stream).poll_read(cx, &mut rb) {
                std::task::Poll::Ready(Ok(())) => std::task::Poll::Ready(Ok(rb.filled().len())),
                std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
                std::task::Poll::Pending => std::task::Poll::Pending,
            }
        })
    })
}

/// What serving a run of bytes came to.
enum Step {
    /// Every byte was served or is held by the decoder (a partial request).
    Done,
    /// The replies reached [`ServerConfig::max_pending_output`] after this many bytes: send
    /// them, then go on with the rest.
    Flush(usize),
    /// The connection must be closed.
    Bad(String),
}

/// Where a connection's task starts: what the accept thread's fresh stage left (see
/// [`AcceptLoop`]).
struct Resume {
    decoder: Decoder,
    validated: bool,
    /// Bytes read and not served yet.
    input: Vec<u8>,
    /// Replies not sent yet.
    out: Vec<u8>,
    /// The stage found the connection bad: close it (after sending `out`) for this reason.
    bad: Option<String>,
}

/// This connection's share of [`Shared::buffered`]; given back when dropped.
struct Held<'a> {
    total: &'a AtomicU64,
    mine: u64,
}

impl Held<'_> {
    /// Accounts `now` bytes for this connection; `Err` when all connections together would hold
    /// more than `cap`.
    fn set(&mut self, now: u64, cap: u64) -> Result<(), String> {
        if now > self.mine {
            let grow = now - self.mine;
            let before = self.total.fetch_add(grow, Ordering::Relaxed);
            self.mine = now;
            if before + grow > cap {
                return Err(format!(
                    "partial requests of all connections would hold more than {cap} bytes \
                     (this one: {now})"
                ));
            }
        } else {
            self.total.fetch_sub(self.mine - now, Ordering::Relaxed);
            self.mine = now;
        }
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.mine, Ordering::Relaxed);
    }
}

impl Connection {
    /// A new connection, counted open and its peer noted for hang capture (issue 13: who waits
    /// on what; forgotten at disconnect). Made on the accept thread.
    fn new(shared: &Arc<Shared>, done: &mpsc::Sender<()>, peer: SocketAddr) -> Connection {
        let conn = Connection {
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            shared: shared.clone(),
            _done: done.clone(),
            notify: Arc::new(Notify::new()),
        };
        super::stats::STATS.opened();
        conn.shared.store.note_peer(conn.id, peer);
        conn
    }

    /// Forgets a connection that ends without a task (at shutdown, or when it could not be
    /// registered with the runtime).
    fn forget(&self) {
        let unanswered = self.shared.store.pending_waits(self.id)
            + self.shared.store.take_ready(self.id) as usize;
        super::stats::STATS.waits_ended(unanswered);
        self.shared.store.disconnect(self.id);
        super::stats::STATS.closed();
    }

    /// Serves one connection from where the accept thread left it.
    async fn run(self, mut stream: TcpStream, resume: Box<Resume>) {
        let close = self.serve(&mut stream, resume).await;
        self.forget();
        match close {
            Close::Eof | Close::Shutdown => {
                debug!(conn = self.id, peer = %self.peer, "store connection closed")
            }
            Close::Io(e) => {
                debug!(conn = self.id, peer = %self.peer, error = %e, "store connection error")
            }
            Close::Bad(why) => self
                .shared
                .report_bad_conn(format!("{} (conn {}): {why}", self.peer, self.id)),
        }
        // Closed only now, so that a client seeing the close knows it was already reported.
        drop(stream);
    }

    /// Serves every complete request in `input`, in order, appending replies to `out`; the
    /// decoder keeps a partial request at the end (and resumes at its last byte next time).
    /// Synchronous: the accept thread's fresh stage and the connection's task both use it.
    fn process(
        &self,
        decoder: &mut Decoder,
        validated: &mut bool,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Step {
        let mut pos = 0;
        while pos < input.len() {
            if !*validated && decoder.at_boundary() && input[pos] != QueryType::Validate as u8 {
                return Step::Bad(format!(
                    "first request is opcode {} instead of VALIDATE",
                    input[pos]
                ));
            }
            match decoder.decode(&input[pos..]) {
                Ok((n, request)) => {
                    pos += n;
                    let Some(request) = request else { continue };
                    if let Err(why) = self.handle(request, validated, out) {
                        return Step::Bad(why);
                    }
                    if out.len() >= self.shared.config.max_pending_output && pos < input.len() {
                        return Step::Flush(pos);
                    }
                }
                Err(e) => return Step::Bad(e.to_string()),
            }
        }
        Step::Done
    }

    /// Serves the connection from `resume` on.
    async fn serve(&self, stream: &mut TcpStream, resume: Box<Resume>) -> Close {
        let cfg = &self.shared.config;
        let Resume {
            mut decoder,
            mut validated,
            input,
            mut out,
            mut bad,
        } = *resume;
        let mut held = Held {
            total: &self.shared.buffered,
            mine: 0,
        };
        // Bytes read but not served from the read buffer: the stage's, or the rest of a read
        // cut short by a flush.
        let mut spill = input;
        // The futures that outlive one request are made once per connection, not per loop turn
        // (issue 16: re-creating them registered and unregistered a waiter on the `Notify`,
        // and the timer looked up the runtime, for every request).
        let mut validate_timer =
            (!validated).then(|| Box::pin(tokio::time::sleep(cfg.validate_timeout)));
        let mut shutdown_rx = self.shared.shutdown_rx.clone();
        if *shutdown_rx.borrow_and_update() {
            return Close::Shutdown;
        }
        let shutdown = shutdown_rx.changed();
        tokio::pin!(shutdown);
        let notified = self.notify.notified();
        tokio::pin!(notified);
        loop {
            let mut pos = 0;
            while bad.is_none() && pos < spill.len() {
                if out.len() >= cfg.max_pending_output {
                    if let Err(e) = write_out(stream, &out).await {
                        return Close::Io(e);
                    }
                    out = Vec::new();
                }
                match self.process(&mut decoder, &mut validated, &spill[pos..], &mut out) {
                    Step::Done => pos = spill.len(),
                    Step::Flush(n) => pos += n,
                    Step::Bad(why) => bad = Some(why),
                }
            }
            if !spill.is_empty() {
                spill = Vec::new();
            }
            if bad.is_none() {
                if let Err(why) = held.set(decoder.buffered(), cfg.max_buffered_bytes) {
                    bad = Some(why);
                }
            }
            if !out.is_empty() {
                if let Err(e) = write_out(stream, &out).await {
                    return Close::Io(e);
                }
                // Not kept between requests: an idle connection holds no reply buffer.
                out = Vec::new();
            }
            if let Some(why) = bad {
                return Close::Bad(why);
            }
            if validated {
                validate_timer = None;
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => return Close::Shutdown,
                () = until_due(&mut validate_timer) => {
                    return Close::Bad(format!(
                        "no VALIDATE within {} s of connecting",
                        cfg.validate_timeout.as_secs_f64()
                    ));
                }
                () = &mut notified => {
                    notified.set(self.notify.notified());
                    let ready = self.shared.store.take_ready(self.id);
                    super::stats::STATS.waits_ended(ready as usize);
                    for _ in 0..ready {
                        Reply::Byte(STOP_WAITING).encode(&mut out);
                    }
                }
                r = read_scratch(stream) => match r {
                    Ok(0) => return Close::Eof,
                    Ok(n) => {
                        super::stats::STATS.read(n);
                        // Served from the read buffer within this poll (no await before).
                        SCRATCH.with_borrow(|buf| {
                            match self.process(&mut decoder, &mut validated, &buf[..n], &mut out) {
                                Step::Done => {}
                                Step::Flush(k) => spill = buf[k..n].to_vec(),
                                Step::Bad(why) => bad = Some(why),
                            }
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Close::Io(e),
                },
            }
        }
    }

    fn check_pending_waits(&self) -> Result<(), String> {
        let n = self.shared.store.pending_waits(self.id);
        let limit = self.shared.config.max_pending_waits;
        if n >= limit {
            return Err(format!(
                "{n} WAIT/BARRIER requests pending on one connection (limit {limit})"
            ));
        }
        Ok(())
    }

    /// Applies one request and appends its reply (if it has one now) to `out`. `Err` closes the
    /// connection.
    fn handle(&self, req: Request, validated: &mut bool, out: &mut Vec<u8>) -> Result<(), String> {
        let store = &self.shared.store;
        super::stats::STATS.op(&req);
        let reply = match req {
            Request::Validate { magic } => {
                if *validated {
                    return Err("second VALIDATE on one connection".into());
                }
                if magic != VALIDATION_MAGIC {
                    return Err(format!("wrong validation magic {magic:#010x}"));
                }
                *validated = true;
                return Ok(());
            }
            Request::Set { key, value } => {
                store.set(key, value);
                return Ok(());
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => Reply::Str(store.compare_set(&key, &expected, desired)),
            Request::Get { key } => Reply::Str(store.get(&key).unwrap_or_default()),
            Request::Add { key, delta } => {
                Reply::I64(store.add(&key, delta).map_err(|e| e.to_string())?)
            }
            Request::Check { keys } => Reply::Byte(if store.check(&keys) {
                CHECK_READY
            } else {
                CHECK_NOT_READY
            }),
            Request::Wait { keys } => {
                self.check_pending_waits()?;
                if store.wait(self.id, &self.notify, &keys) != WaitOutcome::Ready {
                    super::stats::STATS.wait_started();
                    return Ok(());
                }
                Reply::Byte(STOP_WAITING)
            }
            Request::GetNumKeys => Reply::I64(store.num_keys()),
            Request::DeleteKey { key } => Reply::I64(i64::from(store.delete(&key))),
            Request::Append { key, value } => {
                store.append(&key, &value);
                return Ok(());
            }
            Request::MultiGet { keys } => Reply::Strs(
                store
                    .multi_get(&keys)
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect(),
            ),
            Request::MultiSet { pairs } => {
                store.multi_set(pairs);
                return Ok(());
            }
            Request::CancelWait => {
                // Waits that finished before the cancel still get their STOP_WAITING first.
                let dropped = store.pending_waits(self.id);
                let ready = store.cancel_waits(self.id);
                super::stats::STATS.waits_ended(dropped + ready as usize);
                for _ in 0..ready {
                    Reply::Byte(STOP_WAITING).encode(out);
                }
                Reply::Byte(WAIT_CANCELED)
            }
            Request::Ping { nonce } => Reply::U32(nonce),
            Request::QueuePush { key, value } => {
                store.queue_push(&key, value);
                return Ok(());
            }
            Request::QueuePop { key } => {
                let (len_before, value) = store.queue_pop(&key);
                Reply::QueuePop { len_before, value }
            }
            Request::QueueLen { key } => Reply::I64(store.queue_len(&key)),
            Request::ListKeys => Reply::ListKeys(store.list_keys()),
            Request::Barrier { key, world_size } => {
                self.check_pending_waits()?;
                let outcome = store
                    .barrier(self.id, &self.notify, &key, world_size)
                    .map_err(|e| e.to_string())?;
                if outcome != WaitOutcome::Ready {
                    super::stats::STATS.wait_started();
                    return Ok(());
                }
                Reply::Byte(STOP_WAITING)
            }
        };
        reply.encode(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of bad connections: the first is printed, then at most one summary line per
    /// interval, and the counts add up to every event.
    #[test]
    fn log_limiter_prints_at_most_one_line_per_interval() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(10);
        let mut l = LogLimiter::new(interval, "bad store connections closed");
        let mut lines = Vec::new();
        // 60 s of events every 10 ms, flushed every second as the accept loop does.
        for ms in (0..60_000u64).step_by(10) {
            let now = t0 + Duration::from_millis(ms);
            lines.extend(l.event(now, format!("event at {ms} ms")));
            if ms % 1000 == 0 {
                lines.extend(l.flush(now));
            }
        }
        lines.extend(l.flush(t0 + Duration::from_secs(75)));
        assert_eq!(lines[0], "event at 0 ms");
        assert!(lines.len() <= 60 / 10 + 2, "{lines:#?}");
        let counted: u64 = lines[1..]
            .iter()
            .map(|l| {
                l.split(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("summary line {l:?}"))
            })
            .sum();
        assert_eq!(counted + 1, 6000);
        assert!(lines[1].contains("more bad store connections closed in the last 10s"));
        assert!(lines
            .last()
            .is_some_and(|l| l.contains("latest: event at 59990 ms")));
        // At shutdown everything held back is printed at once.
        assert_eq!(
            l.event(t0 + Duration::from_secs(90), "a".into()),
            Some("a".into())
        );
        assert_eq!(l.event(t0 + Duration::from_secs(91), "b".into()), None);
        assert_eq!(l.flush(t0 + Duration::from_secs(92)), None);
        assert_eq!(
            l.flush_all(),
            Some("1 more bad store connections closed in the last 10s (latest: b)".into())
        );
        // Nothing held back: nothing to flush; a quiet period prints the next event at once.
        assert_eq!(l.flush(t0 + Duration::from_secs(110)), None);
        assert_eq!(
            l.event(t0 + Duration::from_secs(110), "again".into()),
            Some("again".into())
        );
    }

    #[test]
    fn held_bytes_are_capped_globally_and_given_back() {
        let total = AtomicU64::new(0);
        let mut a = Held {
            total: &total,
            mine: 0,
        };
        let mut b = Held {
            total: &total,
            mine: 0,
        };
        assert!(a.set(600, 1000).is_ok());
        assert!(b.set(400, 1000).is_ok());
        assert!(b.set(401, 1000).is_err());
        drop(b);
        assert_eq!(total.load(Ordering::Relaxed), 600);
        assert!(a.set(100, 1000).is_ok());
        assert_eq!(total.load(Ordering::Relaxed), 100);
        drop(a);
        assert_eq!(total.load(Ordering::Relaxed), 0);
    }

    /// Connecting to `addr` is refused within 10 s (the listener was closed).
    fn refused_soon(addr: SocketAddr) -> bool {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < end {
            if std::net::TcpStream::connect(addr).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The accept thread ends (and closes the listener) on shutdown, and also when the runtime
    /// the server lives on goes away without a shutdown (its wake-up socket reads EOF).
    #[test]
    fn accept_thread_ends_on_shutdown_and_with_the_runtime() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let addr = rt.block_on(async {
            let s = StoreServer::bind(loopback, ServerConfig::default()).expect("bind");
            let addr = s.local_addr();
            let c = std::net::TcpStream::connect(addr).expect("served while running");
            drop(c);
            s.shutdown().await;
            addr
        });
        assert!(refused_soon(addr), "listener still open after shutdown");
        let addr = rt.block_on(async {
            let s = StoreServer::bind(loopback, ServerConfig::default()).expect("bind");
            let addr = s.local_addr();
            // No shutdown and no drop: only the runtime's end can stop it.
            std::mem::forget(s);
            addr
        });
        drop(rt);
        assert!(
            refused_soon(addr),
            "listener still open after the runtime ended"
        );
    }

    /// The accept thread's first-bytes stage hands every connection over: one that speaks at
    /// once (served from the bytes the accept thread read), one that stays silent past
    /// `FIRST_BYTES_HOLD` (handed over without bytes, then read by its task), while one that
    /// hung up before speaking is in the same stage.
    #[test]
    fn first_bytes_stage_hands_over_prompt_silent_and_closed_clients() {
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let server = rt.block_on(async { StoreServer::bind(loopback, ServerConfig::default()) });
        let server = server.expect("bind");
        let addr = server.local_addr();
        let hello = {
            let mut b = Request::Validate {
                magic: VALIDATION_MAGIC,
            }
            .to_bytes();
            Request::Ping { nonce: 42 }.encode(&mut b);
            b
        };
        let client = std::thread::spawn(move || {
            let pong = |s: &mut std::net::TcpStream| {
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                let mut b = [0u8; 4];
                s.read_exact(&mut b).expect("pong");
                u32::from_ne_bytes(b)
            };
            let closed = std::net::TcpStream::connect(addr).expect("connect");
            drop(closed);
            let mut silent = std::net::TcpStream::connect(addr).expect("connect");
            let mut prompt = std::net::TcpStream::connect(addr).expect("connect");
            prompt.write_all(&hello).expect("write");
            let prompt_pong = pong(&mut prompt);
            std::thread::sleep(FIRST_BYTES_HOLD + Duration::from_millis(300));
            silent.write_all(&hello).expect("write");
            (prompt_pong, pong(&mut silent))
        });
        let (prompt, silent) = rt.block_on(async {
            let r = tokio::task::spawn_blocking(move || client.join()).await;
            r.expect("join").expect("client thread")
        });
        assert_eq!((prompt, silent), (42, 42));
        rt.block_on(server.shutdown());
    }

    /// The fresh stage serves a client's first round trips itself and hands connections over in
    /// mid-conversation without losing or reordering anything: a WAIT on a present key
    /// (answered in the stage), a WAIT that must wait with a PING pipelined behind it (the PING
    /// answered first; the WAIT once another fresh client SETs the key), and a value bigger
    /// than one read sent right after VALIDATE (handed over with the decoder's partial state).
    #[test]
    fn fresh_stage_hands_over_waits_and_big_values_intact() {
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let server = rt.block_on(async { StoreServer::bind(loopback, ServerConfig::default()) });
        let server = server.expect("bind");
        let addr = server.local_addr();
        let client = std::thread::spawn(move || {
            let open = || {
                let s = std::net::TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                s
            };
            let validate = || {
                Request::Validate {
                    magic: VALIDATION_MAGIC,
                }
                .to_bytes()
            };
            let read_n = |s: &mut std::net::TcpStream, n: usize| {
                let mut b = vec![0u8; n];
                s.read_exact(&mut b).expect("reply");
                b
            };
            let get = |s: &mut std::net::TcpStream, key: &[u8]| {
                s.write_all(&Request::Get { key: key.to_vec() }.to_bytes())
                    .expect("write");
                let len = u64::from_ne_bytes(read_n(s, 8).try_into().expect("8 bytes"));
                read_n(s, len as usize)
            };
            let mut a = open();
            let mut hello = validate();
            Request::Ping { nonce: 1 }.encode(&mut hello);
            a.write_all(&hello).expect("write");
            assert_eq!(read_n(&mut a, 4), 1u32.to_ne_bytes());
            let mut b = Request::Set {
                key: b"k1".to_vec(),
                value: b"v1".to_vec(),
            }
            .to_bytes();
            Request::Wait {
                keys: vec![b"k1".to_vec()],
            }
            .encode(&mut b);
            a.write_all(&b).expect("write");
            assert_eq!(read_n(&mut a, 1), [STOP_WAITING]);
            let mut b = Request::Wait {
                keys: vec![b"k2".to_vec()],
            }
            .to_bytes();
            Request::Ping { nonce: 2 }.encode(&mut b);
            a.write_all(&b).expect("write");
            assert_eq!(read_n(&mut a, 4), 2u32.to_ne_bytes());
            let mut setter = open();
            let mut b = validate();
            Request::Set {
                key: b"k2".to_vec(),
                value: b"v2".to_vec(),
            }
            .encode(&mut b);
            setter.write_all(&b).expect("write");
            assert_eq!(read_n(&mut a, 1), [STOP_WAITING]);
            assert_eq!(get(&mut a, b"k2"), b"v2");
            let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            let mut c = open();
            let mut b = validate();
            Request::Set {
                key: b"big".to_vec(),
                value: big.clone(),
            }
            .encode(&mut b);
            c.write_all(&b).expect("write");
            assert_eq!(get(&mut c, b"big"), big);
            assert_eq!(get(&mut setter, b"k1"), b"v1");
        });
        rt.block_on(async {
            let r = tokio::task::spawn_blocking(move || client.join()).await;
            r.expect("join").expect("client thread");
        });
        rt.block_on(server.shutdown());
    }

    #[test]
    fn only_a_broken_listener_is_fatal() {
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::ECONNABORTED,
        ] {
            assert!(!accept_error_is_fatal(&io::Error::from_raw_os_error(errno)));
        }
        assert!(accept_error_is_fatal(&io::Error::from_raw_os_error(
            libc::EBADF
        )));
    }
}
