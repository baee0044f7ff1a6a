//! Accepting, on threads of their own: the accept loop drains the kernel's queue as
//! connections arrive, and the fresh stage serves each new connection's first requests ahead
//! of the storm queued on the runtime (issue 16), with the small epoll wrapper both use.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::super::protocol::Decoder;
use super::conn::{Connection, Resume, Step, READ_CHUNK};
use super::{ServerExit, Shared};

/// Pause after a failed accept, doubling while failures go on.
pub(super) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
pub(super) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accept errors that mean the listening socket itself is unusable; everything else (EMFILE,
/// ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, EPERM, EPROTO, ...) is a shortage or a failed client
/// and passes: the pending connection stays in the backlog until descriptors free up.
pub(super) fn accept_error_is_fatal(e: &io::Error) -> bool {
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
pub(super) struct AcceptLoop {
    pub(super) listener: StdTcpListener,
    /// Readable when the server shuts down (a byte written, or the other end dropped).
    pub(super) wake: std::os::unix::net::UnixStream,
    pub(super) shared: Arc<Shared>,
    pub(super) conns_done_tx: mpsc::Sender<()>,
    pub(super) rt: tokio::runtime::Handle,
}

/// The accept loop's state between two wake-ups.
struct Accepting {
    /// The pause after the next failed accept (doubles up to the maximum).
    backoff: Duration,
    /// While set, accepting pauses until then (descriptors ran out); the listener is out of
    /// the epoll set meanwhile (it stays readable, so it would wake us at once).
    resume: Option<std::time::Instant>,
    next_token: u64,
    /// Whether accepted sockets inherit TCP_NODELAY from the listener (checked once).
    nodelay_inherited: bool,
}

impl AcceptLoop {
    pub(super) fn run(self) -> ServerExit {
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
    pub(super) fn accept_loop(
        &self,
        ep: &Epoll,
        stage_ep: &Epoll,
        tx: std::sync::mpsc::Sender<(u64, std::time::Instant, Box<Fresh>)>,
    ) -> ServerExit {
        let mut st = Accepting {
            backoff: ACCEPT_BACKOFF_MIN,
            resume: None,
            next_token: 0,
            nodelay_inherited: false,
        };
        let period = self
            .shared
            .config
            .log_interval
            .max(Duration::from_millis(1));
        let mut next_flush = std::time::Instant::now() + period;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 8];
        loop {
            let now = std::time::Instant::now();
            if now >= next_flush {
                self.shared.flush_logs(false);
                next_flush = now + period;
            }
            if st.resume.is_some_and(|r| now >= r) {
                st.resume = None;
                if let Err(e) = ep.add(self.listener.as_raw_fd(), LISTEN_TOKEN) {
                    return ServerExit::Failed(format!("store accept thread: epoll_ctl: {e}"));
                }
            }
            let until = st.resume.map_or(next_flush, |r| r.min(next_flush));
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
            if st.resume.is_some() || !events[..n].iter().any(|e| e.u64 == LISTEN_TOKEN) {
                continue;
            }
            if let Err(exit) = self.drain(ep, stage_ep, &tx, &mut st) {
                return exit;
            }
        }
    }

    /// Accepts everything the kernel has queued, without going back to epoll between (its
    /// queue is first in, first out: a fresh client waits behind every connection whose
    /// handshake completed before its own). A failed accept pauses accepting (backoff); a
    /// broken listener ends the loop.
    fn drain(
        &self,
        ep: &Epoll,
        stage_ep: &Epoll,
        tx: &std::sync::mpsc::Sender<(u64, std::time::Instant, Box<Fresh>)>,
        st: &mut Accepting,
    ) -> Result<(), ServerExit> {
        loop {
            match accept_nonblocking(&self.listener) {
                Ok((stream, peer)) => {
                    st.backoff = ACCEPT_BACKOFF_MIN;
                    let token = st.next_token;
                    st.next_token += 1;
                    // Linux copies TCP_NODELAY from the listener to the accepted socket (set
                    // in `start_with_store`): checked once, set per socket only where it is
                    // not inherited (one system call less per client).
                    if !st.nodelay_inherited {
                        st.nodelay_inherited = stream.nodelay().unwrap_or(false);
                        if !st.nodelay_inherited {
                            if let Err(e) = stream.set_nodelay(true) {
                                debug!(%peer, error = %e, "set TCP_NODELAY failed");
                            }
                        }
                    }
                    self.to_stage(stream, peer, token, stage_ep, tx);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if accept_error_is_fatal(&e) => {
                    return Err(ServerExit::Failed(format!(
                        "store listening socket failed: {e}"
                    )));
                }
                Err(e) => {
                    // Never fatal: back off and keep serving the others.
                    self.shared.report_accept_failure(&e);
                    ep.delete(self.listener.as_raw_fd());
                    st.resume = Some(std::time::Instant::now() + st.backoff);
                    st.backoff = (st.backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    return Ok(());
                }
            }
        }
    }

    /// A new connection to the fresh stage (sent, then added to the stage's epoll set); to the
    /// runtime at once when the stage is gone.
    fn to_stage(
        &self,
        stream: std::net::TcpStream,
        peer: SocketAddr,
        token: u64,
        stage_ep: &Epoll,
        tx: &std::sync::mpsc::Sender<(u64, std::time::Instant, Box<Fresh>)>,
    ) {
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

    /// The fresh stage, on a thread of its own: serves the new connections that spoke, newest
    /// first, until each is handed to the runtime. Ends at shutdown or when the accept loop
    /// ended (its sender is gone).
    pub(super) fn stage_loop(
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
    pub(super) fn stage_step(
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
        crate::store::stats::STATS.read(n);
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
            crate::store::stats::STATS.wrote(sent);
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
    pub(super) fn hand_over(&self, f: Fresh, input: Vec<u8>, out: Vec<u8>, bad: Option<String>) {
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
pub(super) struct Fresh {
    conn: Connection,
    stream: std::net::TcpStream,
    decoder: Decoder,
    validated: bool,
    /// Reads served by the stage so far.
    reads: u32,
}

/// The fresh stage's connections by token; those still there when the accept thread ends are
/// forgotten (their sockets close).
pub(super) struct Stage(HashMap<u64, Box<Fresh>>);

impl Drop for Stage {
    fn drop(&mut self) {
        for f in self.0.values() {
            f.conn.forget();
        }
    }
}

/// How long a new connection may stay in the accept thread's fresh stage before it is handed
/// to the runtime whatever it does (a silent one then meets the VALIDATE deadline in its task).
pub(super) const FIRST_BYTES_HOLD: Duration = Duration::from_millis(250);
/// Most reads the fresh stage serves per connection: enough for a client's first round trips
/// (PyTorch's client: VALIDATE + PING, then a SET and a GET, which is WAIT + GET), few enough
/// that the storm's later requests go to the runtime and the stage stays the fast lane.
pub(super) const FRESH_READS: u32 = 8;
pub(super) const WAKE_TOKEN: u64 = u64::MAX;
pub(super) const LISTEN_TOKEN: u64 = u64::MAX - 1;

/// Sends what fits now without blocking (the socket is non-blocking); returns how much went.
/// An error sends nothing: the connection's task meets it when it writes the rest.
pub(super) fn send_now(stream: &std::net::TcpStream, out: &[u8]) -> usize {
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
pub(super) struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    pub(super) fn new() -> io::Result<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the descriptor is checked and then owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        Ok(Epoll(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    pub(super) fn add(&self, fd: std::os::fd::RawFd, token: u64) -> io::Result<()> {
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
    pub(super) fn delete(&self, fd: std::os::fd::RawFd) {
        use std::os::fd::AsRawFd;
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: valid descriptors and a valid (ignored) event struct.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    pub(super) fn wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout_ms: i32,
    ) -> io::Result<usize> {
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
pub(super) fn accept_nonblocking(
    listener: &StdTcpListener,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
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
