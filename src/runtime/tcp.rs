//! TCP backend: a full mesh of sockets and the classic CPU all-reduce algorithms over it.
//!
//! - Mesh: rank r connects to every lower rank and accepts every higher one; a 16-byte handshake
//!   (magic, rank) rejects strays from another run or restart round. All sockets are
//!   non-blocking with TCP_NODELAY; one `poll(2)` loop drives every send and receive of a step,
//!   so a step that sends to one neighbour and receives from another can never deadlock on full
//!   socket buffers and needs no extra threads.
//! - Small messages (< [`RING_THRESHOLD`]): recursive doubling (log2 n exchanges of the whole
//!   buffer; non-power-of-two worlds fold the extra ranks in first and out last). IEEE `a+b` is
//!   commutative, so partners compute the same bits (spec runtime.md §3.1).
//! - Large messages: segmented ring = reduce-scatter then all-gather, each chunk reduced by one
//!   owner and then forwarded, so every rank ends bit-identical. Segments of [`SEGMENT`] bytes keep
//!   the scratch in cache and let the kernel receive the next segment while we reduce this one
//!   (gloo `allreduce.cc` uses the same 1 MiB-ish segmentation).
//! - Every wait is bounded: no progress for `timeout` gives [`RuntimeError::Timeout`]; EOF or a
//!   reset gives [`RuntimeError::Peer`] naming the peer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::backend::{all_gather_own, alone, reduce_scatter_alone, Backend};
use super::elem::{div_bytes, reduce_bytes, AlignedBuf, DType, ReduceOp};
use super::error::{Result, RuntimeError};

/// Below this many bytes all-reduce uses recursive doubling, at or above it the ring.
pub const RING_THRESHOLD: usize = 64 * 1024;
/// Ring segment size in bytes.
pub const SEGMENT: usize = 512 * 1024;
const HANDSHAKE_MAGIC: u64 = 0x7264_7275_6e54_4350; // "rdrunTCP"

/// The TCP mesh of one rank.
pub struct TcpMesh {
    rank: usize,
    world: usize,
    peers: Vec<Option<TcpStream>>,
    timeout: Duration,
    scratch: AlignedBuf,
    work: AlignedBuf,
}

/// One send in an [`TcpMesh::exchange`] step.
struct Send<'a> {
    peer: usize,
    data: &'a [u8],
    done: usize,
}
/// One receive in an [`TcpMesh::exchange`] step.
struct Recv<'a> {
    peer: usize,
    data: &'a mut [u8],
    done: usize,
}

/// Splits `buf` into a shared view of `a` and a mutable view of `b` (ranges must not overlap).
fn split_ro_rw(
    buf: &mut [u8],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&[u8], &mut [u8]) {
    debug_assert!(a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty());
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if b.is_empty() {
        return (&buf[a], &mut []);
    }
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

/// Byte offsets of `n` nearly equal chunks of `len` bytes, split on element boundaries.
pub fn chunk_bounds(len: usize, elem: usize, n: usize) -> Vec<usize> {
    let count = len / elem;
    (0..=n).map(|c| c * count / n * elem).collect()
}

/// An I/O error of the mesh's set-up (`what`: the step).
fn init_io(rank: usize, e: std::io::Error, what: &str) -> RuntimeError {
    RuntimeError::Io {
        rank,
        op: "init",
        msg: format!("{what}: {e}"),
    }
}

/// Connects to lower rank `j` at `addr` and sends the handshake `hello`.
fn dial(
    rank: usize,
    j: usize,
    addr: &SocketAddr,
    hello: &[u8; 16],
    deadline: Instant,
) -> Result<TcpStream> {
    // The peer bound its listener before publishing its address, so the kernel queues our
    // connection even if it is not yet accepting; retry only for transient refusals.
    let mut s = loop {
        match TcpStream::connect_timeout(addr, Duration::from_secs(5)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(rank, peer = j, "connect retry: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(RuntimeError::Peer {
                    rank,
                    op: "init",
                    peer: j,
                    msg: format!("connect to {addr}: {e}"),
                })
            }
        }
    };
    s.write_all(hello)
        .map_err(|e| init_io(rank, e, "handshake"))?;
    Ok(s)
}

/// Accepts the connection of every higher rank (checked by its handshake: this mesh's magic
/// and a rank not yet connected) until `deadline`.
fn accept_higher(
    rank: usize,
    listener: &TcpListener,
    magic: u64,
    (deadline, timeout): (Instant, Duration),
    peers: &mut [Option<TcpStream>],
) -> Result<()> {
    let world = peers.len();
    let io = |e: std::io::Error, what: &str| init_io(rank, e, what);
    listener
        .set_nonblocking(true)
        .map_err(|e| io(e, "listener"))?;
    let mut pending = world - rank - 1;
    while pending > 0 {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| io(e, "accept"))?;
                s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .map_err(|e| io(e, "accept"))?;
                let mut got = [0u8; 16];
                if s.read_exact(&mut got).is_err() {
                    continue; // a stray or half-open connection: ignore it
                }
                let m = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
                let peer = u64::from_le_bytes(got[8..].try_into().expect("8 bytes")) as usize;
                if m != HANDSHAKE_MAGIC ^ magic
                    || peer <= rank
                    || peer >= world
                    || peers[peer].is_some()
                {
                    tracing::warn!(rank, peer, "rejected a connection with a wrong handshake");
                    continue;
                }
                peers[peer] = Some(s);
                pending -= 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> =
                        (rank + 1..world).filter(|p| peers[*p].is_none()).collect();
                    return Err(RuntimeError::Timeout {
                        rank,
                        op: "init",
                        after: timeout,
                        waiting_for: format!("connections from ranks {missing:?}"),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io(e, "accept")),
        }
    }
    Ok(())
}

/// Waits in `poll(2)` up to `ms` for the sockets of `fds`; an interrupted wait is no error.
fn poll_fds(rank: usize, op: &'static str, fds: &mut [libc::pollfd], ms: i32) -> Result<()> {
    // SAFETY: `fds` is a valid, initialized array of `fds.len()` pollfd structs that lives
    // across the call; poll only writes `revents`.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(RuntimeError::Io {
                rank,
                op,
                msg: format!("poll: {e}"),
            });
        }
    }
    Ok(())
}

impl TcpMesh {
    /// Builds the mesh. `listener` is this rank's bound listener, `addrs[j]` where rank j listens;
    /// `magic` must be equal on every rank of this communicator (derived from run id and round).
    pub fn connect(
        rank: usize,
        world: usize,
        listener: TcpListener,
        addrs: &[SocketAddr],
        magic: u64,
        timeout: Duration,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let mut hello = [0u8; 16];
        hello[..8].copy_from_slice(&(HANDSHAKE_MAGIC ^ magic).to_le_bytes());
        hello[8..].copy_from_slice(&(rank as u64).to_le_bytes());
        for (j, addr) in addrs.iter().enumerate().take(rank) {
            peers[j] = Some(dial(rank, j, addr, &hello, deadline)?);
        }
        accept_higher(rank, &listener, magic, (deadline, timeout), &mut peers)?;
        for s in peers.iter().flatten() {
            s.set_nodelay(true)
                .map_err(|e| init_io(rank, e, "nodelay"))?;
            s.set_read_timeout(None)
                .map_err(|e| init_io(rank, e, "socket"))?;
            s.set_nonblocking(true)
                .map_err(|e| init_io(rank, e, "socket"))?;
        }
        Ok(TcpMesh {
            rank,
            world,
            peers,
            timeout,
            scratch: AlignedBuf::new(0),
            work: AlignedBuf::new(0),
        })
    }

    fn stream(&mut self, peer: usize) -> &mut TcpStream {
        self.peers[peer]
            .as_mut()
            .expect("invariant: mesh has a socket for every other rank")
    }

    /// Drives all `sends` and `recvs` to completion with one poll loop.
    fn exchange(
        &mut self,
        op: &'static str,
        sends: &mut [Send<'_>],
        recvs: &mut [Recv<'_>],
    ) -> Result<()> {
        let rank = self.rank;
        let timeout = self.timeout;
        let mut last_progress = Instant::now();
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(sends.len() + recvs.len());
        loop {
            let sent = self.push_sends(op, sends)?;
            let received = self.pull_recvs(op, recvs)?;
            self.unfinished_fds(sends, recvs, &mut fds);
            if fds.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if sent || received {
                last_progress = now;
            }
            let left = (last_progress + timeout).saturating_duration_since(now);
            if left.is_zero() {
                let waiting: Vec<usize> = recvs
                    .iter()
                    .filter(|r| r.done < r.data.len())
                    .map(|r| r.peer)
                    .chain(
                        sends
                            .iter()
                            .filter(|s| s.done < s.data.len())
                            .map(|s| s.peer),
                    )
                    .collect();
                return Err(RuntimeError::Timeout {
                    rank,
                    op,
                    after: timeout,
                    waiting_for: format!("data from/to ranks {waiting:?}"),
                });
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            poll_fds(rank, op, &mut fds, ms)?;
            // POLLHUP/POLLERR are surfaced by the next read/write attempt above.
        }
    }

    /// Writes what each send's socket takes without blocking; whether any byte went.
    #[inline]
    fn push_sends(&mut self, op: &'static str, sends: &mut [Send<'_>]) -> Result<bool> {
        let rank = self.rank;
        let mut progressed = false;
        for s in sends.iter_mut() {
            while s.done < s.data.len() {
                match send_nosignal(self.stream(s.peer), &s.data[s.done..]) {
                    Ok(0) => return Err(peer_err(rank, op, s.peer, "connection closed")),
                    Ok(k) => {
                        s.done += k;
                        progressed = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(peer_err(rank, op, s.peer, &format!("send: {e}"))),
                }
            }
        }
        Ok(progressed)
    }

    /// Reads what each receive's socket holds without blocking; whether any byte came.
    #[inline]
    fn pull_recvs(&mut self, op: &'static str, recvs: &mut [Recv<'_>]) -> Result<bool> {
        let rank = self.rank;
        let mut progressed = false;
        for r in recvs.iter_mut() {
            while r.done < r.data.len() {
                match self.stream(r.peer).read(&mut r.data[r.done..]) {
                    Ok(0) => {
                        return Err(peer_err(
                            rank,
                            op,
                            r.peer,
                            "connection closed (peer exited?)",
                        ))
                    }
                    Ok(k) => {
                        r.done += k;
                        progressed = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(peer_err(rank, op, r.peer, &format!("recv: {e}"))),
                }
            }
        }
        Ok(progressed)
    }

    /// The pollfds of the sends and receives not yet done (writable / readable wanted).
    #[inline]
    fn unfinished_fds(&self, sends: &[Send<'_>], recvs: &[Recv<'_>], fds: &mut Vec<libc::pollfd>) {
        fds.clear();
        for s in sends.iter().filter(|s| s.done < s.data.len()) {
            fds.push(libc::pollfd {
                fd: self.peers[s.peer].as_ref().expect("invariant").as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            });
        }
        for r in recvs.iter().filter(|r| r.done < r.data.len()) {
            fds.push(libc::pollfd {
                fd: self.peers[r.peer].as_ref().expect("invariant").as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
    }

    fn sendrecv(
        &mut self,
        op: &'static str,
        to: usize,
        data: &[u8],
        from: usize,
        into: &mut [u8],
    ) -> Result<()> {
        let mut s = [Send {
            peer: to,
            data,
            done: 0,
        }];
        let mut r = [Recv {
            peer: from,
            data: into,
            done: 0,
        }];
        self.exchange(op, &mut s, &mut r)
    }

    /// Recursive doubling with the fold for non-power-of-two worlds; `buf` is fully reduced
    /// (and averaged for Avg) on every rank afterwards.
    fn recursive_doubling(
        &mut self,
        op_name: &'static str,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let mut scratch = std::mem::replace(&mut self.scratch, AlignedBuf::new(0));
        scratch.ensure(buf.len());
        let res = (|| {
            if r >= p {
                self.sendrecv(op_name, r - p, buf, r - p, &mut [])?;
                let mut rr = [Recv {
                    peer: r - p,
                    data: &mut *buf,
                    done: 0,
                }];
                return self.exchange(op_name, &mut [], &mut rr);
            }
            if r + p < n {
                self.sendrecv(op_name, r + p, &[], r + p, scratch.as_mut_slice())?;
                reduce_bytes(buf, scratch.as_slice(), dtype, op);
            }
            let mut mask = 1;
            while mask < p {
                let partner = r ^ mask;
                self.sendrecv(op_name, partner, buf, partner, scratch.as_mut_slice())?;
                reduce_bytes(buf, scratch.as_slice(), dtype, op);
                mask <<= 1;
            }
            if op == ReduceOp::Avg {
                div_bytes(buf, dtype, n);
            }
            if r + p < n {
                self.sendrecv(op_name, r + p, buf, r + p, &mut [])?;
            }
            Ok(())
        })();
        self.scratch = scratch;
        res
    }

    /// Ring reduce-scatter over chunks `bounds[c]..bounds[c+1]`; afterwards this rank's chunk
    /// (`c == rank`) holds the full reduction (averaged for Avg).
    fn ring_reduce_scatter(
        &mut self,
        op_name: &'static str,
        buf: &mut [u8],
        bounds: &[usize],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let es = dtype.size();
        let seg = (SEGMENT / es).max(1) * es;
        let mut scratch = std::mem::replace(&mut self.scratch, AlignedBuf::new(0));
        scratch.ensure(seg);
        let res = (|| {
            for s in 0..n - 1 {
                let sc = (r + 2 * n - s - 1) % n;
                let rc = (r + 2 * n - s - 2) % n;
                let (s0, s1) = (bounds[sc], bounds[sc + 1]);
                let (r0, r1) = (bounds[rc], bounds[rc + 1]);
                let longest = (s1 - s0).max(r1 - r0);
                let mut off = 0;
                while off < longest {
                    let sa = (s0 + off).min(s1)..(s0 + off + seg).min(s1);
                    let ra = (r0 + off).min(r1)..(r0 + off + seg).min(r1);
                    let rl = ra.len();
                    self.sendrecv(
                        op_name,
                        right,
                        &buf[sa],
                        left,
                        &mut scratch.as_mut_slice()[..rl],
                    )?;
                    reduce_bytes(&mut buf[ra], &scratch.as_slice()[..rl], dtype, op);
                    off += seg;
                }
            }
            if op == ReduceOp::Avg {
                div_bytes(&mut buf[bounds[r]..bounds[r + 1]], dtype, n);
            }
            Ok(())
        })();
        self.scratch = scratch;
        res
    }

    /// Ring all-gather: chunk c comes from rank c.
    fn ring_all_gather(
        &mut self,
        op_name: &'static str,
        buf: &mut [u8],
        bounds: &[usize],
    ) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        for s in 0..n - 1 {
            let sc = (r + n - s) % n;
            let rc = (r + 2 * n - s - 1) % n;
            let (a, b) = split_ro_rw(buf, bounds[sc]..bounds[sc + 1], bounds[rc]..bounds[rc + 1]);
            self.sendrecv(op_name, right, a, left, b)?;
        }
        Ok(())
    }
}

/// `send(2)` with MSG_NOSIGNAL: a peer that closed its socket gives EPIPE instead of a SIGPIPE
/// that would kill a host program which does not ignore the signal (Rust binaries do, C hosts
/// linking this library may not).
fn send_nosignal(s: &TcpStream, data: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `data` is a valid readable buffer of `data.len()` bytes for the call's duration
    // and the fd belongs to `s`.
    let n = unsafe {
        libc::send(
            s.as_raw_fd(),
            data.as_ptr() as *const libc::c_void,
            data.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn peer_err(rank: usize, op: &'static str, peer: usize, msg: &str) -> RuntimeError {
    RuntimeError::Peer {
        rank,
        op,
        peer,
        msg: msg.to_string(),
    }
}

impl Backend for TcpMesh {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        if alone(self.world, buf.len()) {
            return Ok(());
        }
        let count = buf.len() / dtype.size();
        if buf.len() < RING_THRESHOLD || count < self.world {
            return self.recursive_doubling("all_reduce", buf, dtype, op);
        }
        let bounds = chunk_bounds(buf.len(), dtype.size(), self.world);
        self.ring_reduce_scatter("all_reduce", buf, &bounds, dtype, op)?;
        self.ring_all_gather("all_reduce", buf, &bounds)
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        if alone(n, buf.len()) {
            return Ok(());
        }
        if buf.len() < RING_THRESHOLD {
            // Star: the root writes to everyone at once.
            if r == root {
                let data: &[u8] = buf;
                let mut sends: Vec<Send<'_>> = (0..n)
                    .filter(|p| *p != root)
                    .map(|peer| Send {
                        peer,
                        data,
                        done: 0,
                    })
                    .collect();
                return self.exchange("broadcast", &mut sends, &mut []);
            }
            let mut rr = [Recv {
                peer: root,
                data: buf,
                done: 0,
            }];
            return self.exchange("broadcast", &mut [], &mut rr);
        }
        // Pipelined chain root -> root+1 -> ...: segment i moves in while segment i-1 moves on.
        let pos = (r + n - root) % n;
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let len = buf.len();
        let nseg = len.div_ceil(SEGMENT);
        let seg = |i: usize| (i * SEGMENT).min(len)..((i + 1) * SEGMENT).min(len);
        for i in 0..=nseg {
            let send_rng = if i > 0 && pos + 1 < n {
                seg(i - 1)
            } else {
                0..0
            };
            let recv_rng = if i < nseg && pos > 0 { seg(i) } else { 0..0 };
            if pos == 0 {
                // The root has everything: send segment i directly.
                if i < nseg {
                    let mut s = [Send {
                        peer: next,
                        data: &buf[seg(i)],
                        done: 0,
                    }];
                    self.exchange("broadcast", &mut s, &mut [])?;
                }
                continue;
            }
            let (a, b) = split_ro_rw(buf, send_rng, recv_rng);
            let mut sends: Vec<Send<'_>> = Vec::new();
            if !a.is_empty() {
                sends.push(Send {
                    peer: next,
                    data: a,
                    done: 0,
                });
            }
            let mut recvs: Vec<Recv<'_>> = Vec::new();
            if !b.is_empty() {
                recvs.push(Recv {
                    peer: prev,
                    data: b,
                    done: 0,
                });
            }
            self.exchange("broadcast", &mut sends, &mut recvs)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (n, r, l) = (self.world, self.rank, send.len());
        if all_gather_own(n, r, send, recv) {
            return Ok(());
        }
        let bounds: Vec<usize> = (0..=n).map(|c| c * l).collect();
        self.ring_all_gather("all_gather", recv, &bounds)
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r, l) = (self.world, self.rank, recv.len());
        if reduce_scatter_alone(n, send, recv) {
            return Ok(());
        }
        let mut work = std::mem::replace(&mut self.work, AlignedBuf::new(0));
        work.ensure(send.len());
        work.as_mut_slice().copy_from_slice(send);
        let bounds: Vec<usize> = (0..=n).map(|c| c * l).collect();
        let res =
            self.ring_reduce_scatter("reduce_scatter", work.as_mut_slice(), &bounds, dtype, op);
        if res.is_ok() {
            recv.copy_from_slice(&work.as_slice()[r * l..(r + 1) * l]);
        }
        self.work = work;
        res
    }

    fn barrier(&mut self) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let mut one = 1i32.to_ne_bytes();
        self.recursive_doubling("barrier", &mut one, DType::I32, ReduceOp::Sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_bounds_table() {
        assert_eq!(chunk_bounds(40, 4, 3), vec![0, 12, 24, 40]);
        assert_eq!(chunk_bounds(8, 4, 4), vec![0, 0, 4, 4, 8]);
        assert_eq!(chunk_bounds(0, 2, 2), vec![0, 0, 0]);
    }

    #[test]
    fn split_views() {
        let mut b = [0u8, 1, 2, 3, 4, 5];
        let (a, m) = split_ro_rw(&mut b, 4..6, 0..2);
        assert_eq!(a, &[4, 5]);
        m[0] = 9;
        let (a, m) = split_ro_rw(&mut b, 0..2, 2..3);
        assert_eq!((a, m.len()), (&[9u8, 1][..], 1));
    }
}
