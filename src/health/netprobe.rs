//! The network pre-check's socket I/O (issue 28 item 3): one node's probe listener, and one
//! pair's exchange from the client's side. What is measured where (and why the pairs) is
//! `network.rs`; the store exchange is the supervisor's.
//!
//! A pair is three short connections from the client to the server's listener, each starting
//! with a header (magic, step, the client's group rank, the phase):
//! - `ping`: [`PINGS`] one-byte round trips; the client keeps the shortest;
//! - `up`: the client sends for [`WINDOW`]; the server counts what arrives;
//! - `down`: the server sends for [`WINDOW`]; the client counts.
//!
//! The receiver measures (what a rate limit lets through is what arrives, not what the sender
//! wrote into its socket buffer), from the end of its first read to the end of its last one
//! within the window; then it drops the connection, and the sender's next write fails or its
//! own window ends. Every wait is bounded, so one pair takes about `2 × WINDOW` plus a few
//! round trips, and a peer that does not answer costs at most [`CONNECT_BOUND`] per phase.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{timeout, Instant};

/// How long each direction's transfer runs.
pub const WINDOW: Duration = Duration::from_millis(150);
/// One-byte round trips per pair.
pub const PINGS: usize = 8;
/// How long connecting (and reading a header) may take.
pub const CONNECT_BOUND: Duration = Duration::from_secs(2);
/// The longest one pair can take from the client's side: three connections, the pings, two
/// windows, with slack.
pub const PAIR_BOUND: Duration = Duration::from_secs(8);

const MAGIC: &[u8; 4] = b"RDNC";
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Ping = 0,
    Up = 1,
    Down = 2,
}

impl Phase {
    fn of(b: u8) -> Option<Phase> {
        match b {
            0 => Some(Phase::Ping),
            1 => Some(Phase::Up),
            2 => Some(Phase::Down),
            _ => None,
        }
    }
}

fn header(step: u32, from: u32, phase: Phase) -> [u8; 13] {
    let mut h = [0u8; 13];
    h[..4].copy_from_slice(MAGIC);
    h[4..8].copy_from_slice(&step.to_be_bytes());
    h[8..12].copy_from_slice(&from.to_be_bytes());
    h[12] = phase as u8;
    h
}

/// What the server side saw of one client in one step.
#[derive(Debug, Default, Clone, Copy)]
struct Served {
    up_bps: Option<f64>,
    /// The down phase ended (the client's last phase).
    done: bool,
}

type ServedMap = Arc<Mutex<HashMap<(u32, u32), Served>>>;

/// This node's probe listener, serving every pair in which it is the server.
pub struct Probe {
    port: u16,
    served: ServedMap,
    changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Probe {
    /// Listens on `ip` (port 0: the kernel picks) and serves in the background until dropped.
    pub async fn bind(ip: std::net::IpAddr) -> std::io::Result<Probe> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let port = listener.local_addr()?.port();
        let served: ServedMap = Arc::default();
        let changed = Arc::new(Notify::new());
        let task = tokio::spawn(accept_loop(listener, served.clone(), changed.clone()));
        Ok(Probe {
            port,
            served,
            changed,
            task,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// As the server of `from` in `step`: waits until the client's last phase ended (or
    /// `bound`), and returns what arrived in its up phase (`None`: nothing came).
    pub async fn served(&self, step: u32, from: u32, bound: Duration) -> Option<f64> {
        let until = Instant::now() + bound;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let seen = lock(&self.served).get(&(step, from)).copied();
            if let Some(s) = seen.filter(|s| s.done) {
                return s.up_bps;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return seen.and_then(|s| s.up_bps);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn accept_loop(listener: TcpListener, served: ServedMap, changed: Arc<Notify>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            // Out of descriptors, say: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let served = served.clone();
        let changed = changed.clone();
        tokio::spawn(async move {
            let _ = timeout(PAIR_BOUND, serve(conn, served, changed)).await;
        });
    }
}

/// One incoming connection: its header, then its phase.
async fn serve(mut conn: TcpStream, served: ServedMap, changed: Arc<Notify>) {
    let _ = conn.set_nodelay(true);
    let mut h = [0u8; 13];
    if timeout(CONNECT_BOUND, conn.read_exact(&mut h))
        .await
        .is_err()
        || &h[..4] != MAGIC
    {
        return;
    }
    let step = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let from = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    let Some(phase) = Phase::of(h[12]) else {
        return;
    };
    match phase {
        Phase::Ping => {
            let mut b = [0u8; 1];
            for _ in 0..PINGS {
                if conn.read_exact(&mut b).await.is_err() || conn.write_all(&b).await.is_err() {
                    return;
                }
            }
        }
        Phase::Up => {
            let bps = receive(&mut conn).await;
            lock(&served).entry((step, from)).or_default().up_bps = Some(bps);
            changed.notify_waiters();
        }
        Phase::Down => {
            send(&mut conn).await;
            lock(&served).entry((step, from)).or_default().done = true;
            changed.notify_waiters();
        }
    }
}

/// Sends zeros for [`WINDOW`] (each write bounded by what is left of it).
async fn send(conn: &mut TcpStream) {
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let until = Instant::now() + WINDOW;
    while Instant::now() < until {
        match tokio::time::timeout_at(until, conn.write(&ZEROS)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
}

/// Counts what arrives for [`WINDOW`] after the first read (bytes per second; 0 when nothing
/// came within [`CONNECT_BOUND`]). The first read's bytes are not counted: they may have
/// waited in the buffer.
async fn receive(conn: &mut TcpStream) -> f64 {
    let mut buf = vec![0u8; CHUNK];
    match timeout(CONNECT_BOUND, conn.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return 0.0,
    }
    let t0 = Instant::now();
    let until = t0 + WINDOW;
    let mut bytes = 0u64;
    let mut last = t0;
    loop {
        match tokio::time::timeout_at(until, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                bytes += n as u64;
                last = Instant::now();
            }
            _ => break,
        }
    }
    let secs = (last - t0).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    bytes as f64 / secs
}

/// What the client of a pair measured: the shortest round trip and what arrived in the down
/// phase; `None` when it could not connect or the pings failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientSide {
    pub latency: Duration,
    pub down_bps: f64,
}

async fn open(addr: SocketAddr, step: u32, me: u32, phase: Phase) -> Option<TcpStream> {
    let mut conn = timeout(CONNECT_BOUND, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let _ = conn.set_nodelay(true);
    timeout(CONNECT_BOUND, conn.write_all(&header(step, me, phase)))
        .await
        .ok()?
        .ok()?;
    Some(conn)
}

/// Runs one pair as its client (`me`, in `step`) against the server at `addr`, within
/// [`PAIR_BOUND`].
pub async fn measure(addr: SocketAddr, step: u32, me: u32) -> Option<ClientSide> {
    timeout(PAIR_BOUND, measure_unbounded(addr, step, me))
        .await
        .ok()
        .flatten()
}

async fn measure_unbounded(addr: SocketAddr, step: u32, me: u32) -> Option<ClientSide> {
    let mut ping = open(addr, step, me, Phase::Ping).await?;
    let mut best = Duration::MAX;
    let mut b = [1u8; 1];
    for _ in 0..PINGS {
        let t = Instant::now();
        timeout(CONNECT_BOUND, async {
            ping.write_all(&b).await?;
            ping.read_exact(&mut b).await
        })
        .await
        .ok()?
        .ok()?;
        best = best.min(t.elapsed());
    }
    drop(ping);
    // A failed up or down phase measures 0 (a link that connects but does not carry data).
    if let Some(mut up) = open(addr, step, me, Phase::Up).await {
        send(&mut up).await;
    }
    let down_bps = match open(addr, step, me, Phase::Down).await {
        Some(mut down) => receive(&mut down).await,
        None => 0.0,
    };
    Some(ClientSide {
        latency: best,
        down_bps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pair_over_loopback_measures_both_directions() {
        let server = Probe::bind("127.0.0.1".parse().unwrap()).await.unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
        let t0 = std::time::Instant::now();
        let (client, up) = tokio::join!(measure(addr, 3, 7), server.served(3, 7, PAIR_BOUND));
        let client = client.expect("the pair ran");
        let up = up.expect("the server counted the up phase");
        // Loopback carries far more than 10 MB/s, in both directions.
        assert!(up > 1e7 && client.down_bps > 1e7, "{up} {client:?}");
        assert!(client.latency < Duration::from_millis(500), "{client:?}");
        // Two windows and a few round trips, well under the bound.
        assert!(t0.elapsed() < PAIR_BOUND, "{:?}", t0.elapsed());
        // Another step or client was not served.
        let none = server.served(4, 7, Duration::from_millis(50)).await;
        assert_eq!(none, None);
    }

    #[tokio::test]
    async fn nobody_listening_is_a_failed_pair_within_the_bound() {
        // A port that was just free: connecting is refused at once.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let t0 = std::time::Instant::now();
        assert_eq!(measure(addr, 0, 0).await, None);
        assert!(t0.elapsed() <= PAIR_BOUND);
    }

    #[tokio::test]
    async fn a_stranger_is_not_served() {
        let server = Probe::bind("127.0.0.1".parse().unwrap()).await.unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 8];
        // The server drops the connection: EOF (or a reset), never an answer.
        let n = timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}
