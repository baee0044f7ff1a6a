//! One store connection's task: reads decoded where they stopped, requests applied to the
//! state in order, WAIT/BARRIER replies deferred while later requests are served, and the
//! hardening limits (the VALIDATE deadline, the global buffer cap) that close only this
//! connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};
use tracing::debug;

use super::super::protocol::{
    Decoder, QueryType, Reply, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING,
    VALIDATION_MAGIC, WAIT_CANCELED,
};
use super::super::state::{ConnId, WaitOutcome};
use super::{until_due, write_out, Shared};

pub(super) struct Connection {
    pub(super) id: ConnId,
    pub(super) peer: SocketAddr,
    shared: Arc<Shared>,
    _done: mpsc::Sender<()>,
    notify: Arc<Notify>,
}

/// Why a connection is closed by the server.
pub(super) enum Close {
    Eof,
    Shutdown,
    Io(io::Error),
    Bad(String),
}

/// The read size: every read goes into a per-thread buffer of this size ([`SCRATCH`]), so an
/// idle connection holds no read buffer at all (issue 16: the 512-byte buffer each connection
/// kept between requests was a sixth of its memory).
pub(super) const READ_CHUNK: usize = 64 * 1024;

thread_local! {
    /// The read buffer of the runtime thread(s): a connection's task reads into it and serves
    /// what it read in the same poll; bytes it cannot serve then (a partial request is kept by
    /// the decoder; only a flush in mid-batch leaves bytes over) are copied out.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// Reads what the socket has into [`SCRATCH`]; the bytes are there until the calling task's
/// next await (it serves them within the same poll).
pub(super) fn read_scratch(stream: &mut TcpStream) -> impl Future<Output = io::Result<usize>> + '_ {
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
pub(super) enum Step {
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
pub(super) struct Resume {
    pub(super) decoder: Decoder,
    pub(super) validated: bool,
    /// Bytes read and not served yet.
    pub(super) input: Vec<u8>,
    /// Replies not sent yet.
    pub(super) out: Vec<u8>,
    /// The stage found the connection bad: close it (after sending `out`) for this reason.
    pub(super) bad: Option<String>,
}

/// This connection's share of [`Shared::buffered`]; given back when dropped.
pub(super) struct Held<'a> {
    pub(super) total: &'a AtomicU64,
    pub(super) mine: u64,
}

impl Held<'_> {
    /// Accounts `now` bytes for this connection; `Err` when all connections together would hold
    /// more than `cap`.
    pub(super) fn set(&mut self, now: u64, cap: u64) -> Result<(), String> {
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
    pub(super) fn new(
        shared: &Arc<Shared>,
        done: &mpsc::Sender<()>,
        peer: SocketAddr,
    ) -> Connection {
        let conn = Connection {
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            shared: shared.clone(),
            _done: done.clone(),
            notify: Arc::new(Notify::new()),
        };
        crate::store::stats::STATS.opened();
        conn.shared.store.note_peer(conn.id, peer);
        conn
    }

    /// Forgets a connection that ends without a task (at shutdown, or when it could not be
    /// registered with the runtime).
    pub(super) fn forget(&self) {
        let unanswered = self.shared.store.pending_waits(self.id)
            + self.shared.store.take_ready(self.id) as usize;
        crate::store::stats::STATS.waits_ended(unanswered);
        self.shared.store.disconnect(self.id);
        crate::store::stats::STATS.closed();
    }

    /// Serves one connection from where the accept thread left it.
    pub(super) async fn run(self, mut stream: TcpStream, resume: Box<Resume>) {
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
    pub(super) fn process(
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
    pub(super) async fn serve(&self, stream: &mut TcpStream, resume: Box<Resume>) -> Close {
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
            if bad.is_none() && !spill.is_empty() {
                let state = (&mut decoder, &mut validated);
                match self.serve_spill(stream, state, &spill, &mut out).await {
                    Ok(why) => bad = why,
                    Err(e) => return Close::Io(e),
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
                    self.ready_waits(&mut out);
                }
                r = read_scratch(stream) => match r {
                    Ok(0) => return Close::Eof,
                    Ok(n) => {
                        crate::store::stats::STATS.read(n);
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

    /// Serves the bytes left in `spill` (a read cut short by a flush, or the stage's), writing
    /// the replies out whenever they pile up; returns the reason a request was bad, if one was.
    async fn serve_spill(
        &self,
        stream: &mut TcpStream,
        (decoder, validated): (&mut Decoder, &mut bool),
        spill: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<Option<String>> {
        let cfg = &self.shared.config;
        let mut pos = 0;
        while pos < spill.len() {
            if out.len() >= cfg.max_pending_output {
                write_out(stream, out).await?;
                *out = Vec::new();
            }
            match self.process(decoder, validated, &spill[pos..], out) {
                Step::Done => pos = spill.len(),
                Step::Flush(n) => pos += n,
                Step::Bad(why) => return Ok(Some(why)),
            }
        }
        Ok(None)
    }

    /// A STOP_WAITING for each of this connection's waits that became ready.
    fn ready_waits(&self, out: &mut Vec<u8>) {
        let ready = self.shared.store.take_ready(self.id);
        crate::store::stats::STATS.waits_ended(ready as usize);
        for _ in 0..ready {
            Reply::Byte(STOP_WAITING).encode(out);
        }
    }

    pub(super) fn check_pending_waits(&self) -> Result<(), String> {
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
    pub(super) fn handle(
        &self,
        req: Request,
        validated: &mut bool,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let store = &self.shared.store;
        crate::store::stats::STATS.op(&req);
        let reply = match req {
            Request::Validate { magic } => return validate(magic, validated),
            Request::Set { key, value } => {
                store.set(key, value);
                return Ok(());
            }
            // The clock key answers the time (issue 28); nothing is stored under it.
            Request::CompareSet { key, .. } | Request::Get { key } if is_clock_key(&key) => {
                Reply::Str(clock_now())
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
                    crate::store::stats::STATS.wait_started();
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
            Request::CancelWait => self.cancel_waits(out),
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
                    crate::store::stats::STATS.wait_started();
                    return Ok(());
                }
                Reply::Byte(STOP_WAITING)
            }
        };
        reply.encode(out);
        Ok(())
    }

    /// CANCEL_WAIT: waits that finished before the cancel still get their STOP_WAITING first.
    fn cancel_waits(&self, out: &mut Vec<u8>) -> Reply {
        let store = &self.shared.store;
        let dropped = store.pending_waits(self.id);
        let ready = store.cancel_waits(self.id);
        crate::store::stats::STATS.waits_ended(dropped + ready as usize);
        for _ in 0..ready {
            Reply::Byte(STOP_WAITING).encode(out);
        }
        Reply::Byte(WAIT_CANCELED)
    }
}

/// VALIDATE: once per connection, with the right magic.
fn validate(magic: u32, validated: &mut bool) -> Result<(), String> {
    if *validated {
        return Err("second VALIDATE on one connection".into());
    }
    if magic != VALIDATION_MAGIC {
        return Err(format!("wrong validation magic {magic:#010x}"));
    }
    *validated = true;
    Ok(())
}

/// Whether a key on the wire is [`CLOCK_KEY`](crate::store::protocol::CLOCK_KEY) (raw, or with
/// the TCPStore client's "/" prefix).
fn is_clock_key(key: &[u8]) -> bool {
    key.strip_prefix(b"/").unwrap_or(key) == crate::store::protocol::CLOCK_KEY.as_bytes()
}

/// [`crate::store::protocol::CLOCK_KEY`]'s answer: now, in nanoseconds since the Unix epoch.
fn clock_now() -> Vec<u8> {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    ns.to_string().into_bytes()
}
