//! The rendezvous over rdrun's TCPStore-compatible store: who hosts it, and a reconnecting client.
//!
//! - [`TcpRdzvStore`] implements [`RdzvStore`] with `crate::store::Client`. A request that timed
//!   out or lost its connection leaves that connection unusable (the client cannot resync a
//!   half-read reply), so the adapter drops it and reconnects on the next operation, with a short
//!   connect timeout: an agent whose link comes back rejoins instead of failing for good.
//! - [`host_c10d_store`]: `--rdzv-backend=c10d`: the endpoint's host (conf `is_host`, else
//!   inferred, see `addr.rs`) serves the store on the endpoint port on all interfaces; when the
//!   inferred host finds the port taken (another agent on this machine hosts it) it becomes a
//!   client, as torchrun does; an explicit `is_host=true` gets no fallback.
//! - [`host_static_store`]: `--rdzv-backend=static`: node rank 0 serves on `master_port`.
//! - [`connect`]: every agent (the host too) connects to the endpoint with retry and backoff until
//!   the rendezvous deadline, with an error naming host:port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::addr;
use super::error::RendezvousError;
use super::store::{RdzvStore, StoreOpError, StoreResult};
use crate::store::{Client, ServerConfig, StoreError, StoreServer};

/// Connect timeout of a reconnection after a lost connection (the caller retries on error).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn op_err(e: StoreError) -> StoreOpError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    StoreOpError(msg)
}

/// A store client for the rendezvous that reconnects after a lost or abandoned connection.
pub struct TcpRdzvStore {
    host: String,
    port: u16,
    op_timeout: Duration,
    /// The current connection and its generation (so only the failed one is dropped).
    conn: Mutex<(u64, Option<Client>)>,
}

impl TcpRdzvStore {
    /// Connects to `host:port`, retrying with backoff until `deadline`; every later operation
    /// times out after `op_timeout` (conf `read_timeout`).
    pub async fn connect(
        host: &str,
        port: u16,
        deadline: Instant,
        op_timeout: Duration,
    ) -> Result<Self, RendezvousError> {
        let started = Instant::now();
        let wait = deadline.saturating_duration_since(started);
        let client =
            Client::connect(host, port, wait)
                .await
                .map_err(|e| RendezvousError::Unreachable {
                    endpoint: addr::host_port(host, port),
                    waited: started.elapsed(),
                    source: op_err(e),
                })?;
        client.set_timeout(op_timeout);
        Ok(Self {
            host: host.to_string(),
            port,
            op_timeout,
            conn: Mutex::new((0, Some(client))),
        })
    }

    /// `host:port` of the store.
    pub fn endpoint(&self) -> String {
        addr::host_port(&self.host, self.port)
    }

    async fn client(&self) -> StoreResult<(u64, Client)> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = &conn.1 {
            return Ok((conn.0, c.clone()));
        }
        let c = Client::connect(&self.host, self.port, RECONNECT_TIMEOUT)
            .await
            .map_err(op_err)?;
        c.set_timeout(self.op_timeout);
        conn.0 += 1;
        conn.1 = Some(c.clone());
        tracing::info!(endpoint = %self.endpoint(), "reconnected to the rendezvous store");
        Ok((conn.0, c))
    }

    async fn drop_conn(&self, generation: u64) {
        let mut conn = self.conn.lock().await;
        if conn.0 == generation {
            conn.1 = None;
        }
    }

    /// Runs one operation; a failure drops the connection so the next operation reconnects.
    async fn run<T, F, Fut>(&self, op: F) -> StoreResult<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let (generation, client) = self.client().await?;
        // Mark the connection for replacement if this future is dropped mid-request (a caller's
        // timeout): the client cannot reuse a connection with a request abandoned half-way.
        let mut guard = DropGuard {
            store: self,
            generation,
            armed: true,
        };
        let res = op(client).await;
        guard.armed = false;
        match res {
            Ok(v) => Ok(v),
            Err(e) => {
                self.drop_conn(generation).await;
                Err(op_err(e))
            }
        }
    }
}

struct DropGuard<'a> {
    store: &'a TcpRdzvStore,
    generation: u64,
    armed: bool,
}

impl Drop for DropGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(mut conn) = self.store.conn.try_lock() {
                if conn.0 == self.generation {
                    conn.1 = None;
                }
            }
        }
    }
}

impl RdzvStore for TcpRdzvStore {
    fn describe(&self) -> String {
        self.endpoint()
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> StoreResult<Vec<u8>> {
        self.run(|c| async move { c.compare_set(key, expected, desired).await })
            .await
    }

    async fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.run(|c| async move { c.set(key, value).await }).await
    }

    async fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        self.run(|c| async move { c.add(key, delta).await }).await
    }

    async fn append(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.run(|c| async move { c.append(key, value).await })
            .await
    }

    async fn multi_get(&self, keys: &[String]) -> StoreResult<Vec<Vec<u8>>> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.run(|c| async move { c.multi_get(&keys).await }).await
    }

    async fn wait(&self, keys: &[String], timeout: Duration) -> StoreResult<bool> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (generation, client) = self.client().await?;
        match client.wait(&keys, timeout).await {
            Ok(()) => Ok(true),
            // The client cancelled the wait cleanly (CANCEL_WAIT): the connection is fine.
            Err(StoreError::Timeout { op: "wait", .. }) => Ok(false),
            Err(e) => {
                self.drop_conn(generation).await;
                Err(op_err(e))
            }
        }
    }
}

/// Serves a store on `port` on every interface: dual-stack `[::]`, or `0.0.0.0` where IPv6 is
/// unavailable (torchrun's TCPStore also listens on all interfaces, spec §2.3).
pub fn serve_all_interfaces(port: u16) -> std::io::Result<StoreServer> {
    let v6: SocketAddr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    match StoreServer::bind(v6, ServerConfig::default()) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "no IPv6 listener; serving on 0.0.0.0");
            StoreServer::bind(
                SocketAddr::from(([0, 0, 0, 0], port)),
                ServerConfig::default(),
            )
        }
    }
}

/// Why this agent could not host the store.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve the rendezvous store on port {port}")]
pub struct HostError {
    pub port: u16,
    #[source]
    pub source: std::io::Error,
}

/// c10d: serves the store if this agent is the endpoint's host (see the module docs). Must run
/// inside the agent's tokio runtime (the server lives on it). `None` = another agent hosts it.
pub fn host_c10d_store(
    host: &str,
    port: u16,
    is_host: Option<bool>,
) -> Result<Option<StoreServer>, HostError> {
    if !addr::is_host(host, is_host) {
        return Ok(None);
    }
    let mut attempt = 0u32;
    loop {
        match serve_all_interfaces(port) {
            Ok(s) => return Ok(Some(s)),
            // Two agents of one machine that both infer they host can both lose: with
            // SO_REUSEADDR both bind(2) calls succeed, then each listen(2) sees the other socket
            // already marked listening and fails with EADDRINUSE, and nobody serves the store.
            // While nothing answers on the port, take a short, different nap and try again.
            Err(e)
                if is_host.is_none()
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && attempt < 8
                    && !someone_listens(port) =>
            {
                attempt += 1;
                std::thread::sleep(host_retry_nap(attempt));
            }
            Err(e) if is_host.is_none() => {
                tracing::info!(port, error = %e, "rendezvous port taken; joining as a client");
                return Ok(None);
            }
            Err(source) => return Err(HostError { port, source }),
        }
    }
}

/// Whether a listener answers on `port` on this machine's loopback (either family).
fn someone_listens(port: u16) -> bool {
    let limit = Duration::from_millis(200);
    [
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        SocketAddr::from(([127, 0, 0, 1], port)),
    ]
    .iter()
    .any(|a| std::net::TcpStream::connect_timeout(a, limit).is_ok())
}

/// 2-65 ms, growing with `attempt` and different for every caller (a process-wide counter and
/// the clock), so that two agents that collided do not collide again.
fn host_retry_nap(attempt: u32) -> Duration {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let salt = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mix = (nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id()))
        .wrapping_mul(0x2545_F491_4F6C_DD1D);
    Duration::from_millis(2 + (mix >> 59) + 4 * u64::from(attempt.min(8)))
}

/// static: node rank 0 serves the store on `master_port`; no fallback (the job's store must be
/// this agent's).
pub fn host_static_store(
    node_rank: usize,
    master_port: u16,
) -> Result<Option<StoreServer>, HostError> {
    if node_rank != 0 {
        return Ok(None);
    }
    serve_all_interfaces(master_port)
        .map(Some)
        .map_err(|source| HostError {
            port: master_port,
            source,
        })
}

/// Connects to the rendezvous store (every agent, the host too) until `deadline`.
pub async fn connect(
    host: &str,
    port: u16,
    deadline: Instant,
    op_timeout: Duration,
) -> Result<Arc<TcpRdzvStore>, RendezvousError> {
    TcpRdzvStore::connect(host, port, deadline, op_timeout)
        .await
        .map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two agents that both infer they host, started at the same instant: exactly one serves
    /// (both used to lose the bind/listen race now and then, and nobody served the store).
    #[test]
    fn two_simultaneous_hosts_one_serves() {
        for _ in 0..30 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap();
            let go = Arc::new(std::sync::Barrier::new(2));
            let (tx, rx) = std::sync::mpsc::channel();
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (go, tx) = (go.clone(), tx.clone());
                    std::thread::spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap();
                        rt.block_on(async {
                            go.wait();
                            let served = host_c10d_store("127.0.0.1", port, None).unwrap();
                            tx.send(served.is_some()).unwrap();
                            // Keep serving until both have decided.
                            go.wait();
                            if let Some(s) = served {
                                s.shutdown().await;
                            }
                        });
                    })
                })
                .collect();
            let a = rx.recv_timeout(Duration::from_secs(30)).unwrap();
            let b = rx.recv_timeout(Duration::from_secs(30)).unwrap();
            for t in threads {
                t.join().unwrap();
            }
            assert!(a ^ b, "port {port}: hosts {a} {b}");
        }
    }

    #[tokio::test]
    async fn reconnects_after_the_server_restarts_and_maps_wait_timeout() {
        let server = serve_all_interfaces(0).unwrap();
        let port = server.port();
        let deadline = Instant::now() + Duration::from_secs(10);
        let s = TcpRdzvStore::connect("127.0.0.1", port, deadline, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(s.add("n", 2).await.unwrap(), 2);
        assert!(!s
            .wait(&["missing".into()], Duration::from_millis(100))
            .await
            .unwrap());
        assert_eq!(s.compare_set("k", b"", b"v").await.unwrap(), b"v");
        assert_eq!(
            s.multi_get(&["k".into(), "n".into()]).await.unwrap(),
            [b"v".to_vec(), b"2".to_vec()]
        );
        server.shutdown().await;
        assert!(s.add("n", 1).await.is_err(), "server gone");
        // A new server on the same port: the adapter reconnects by itself.
        let server = StoreServer::bind(
            SocketAddr::from(([0, 0, 0, 0], port)),
            ServerConfig::default(),
        )
        .unwrap();
        let mut ok = false;
        for _ in 0..20 {
            if s.add("n", 1).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "reconnected");
        server.shutdown().await;
    }

    #[tokio::test]
    async fn inferred_host_falls_back_to_client_when_port_is_taken_explicit_does_not() {
        let first = host_c10d_store("127.0.0.1", 0, None)
            .unwrap()
            .expect("loopback hosts");
        let port = first.port();
        assert!(host_c10d_store("127.0.0.1", port, None).unwrap().is_none());
        let err = host_c10d_store("127.0.0.1", port, Some(true))
            .err()
            .expect("explicit host: no fallback");
        assert_eq!(
            err.to_string(),
            format!("cannot serve the rendezvous store on port {port}")
        );
        assert!(
            host_c10d_store("192.0.2.1", port, None).unwrap().is_none(),
            "not this machine"
        );
        assert!(host_static_store(1, port).unwrap().is_none());
        assert!(host_static_store(0, port).is_err());
        first.shutdown().await;
    }

    #[tokio::test]
    async fn unreachable_endpoint_error_names_host_and_port() {
        // Bind then drop to get a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let deadline = Instant::now() + Duration::from_millis(600);
        let err = connect("127.0.0.1", port, deadline, Duration::from_secs(1))
            .await
            .err()
            .expect("nobody listens");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "rendezvous store 127.0.0.1:{port} unreachable after"
            )),
            "{msg}"
        );
    }
}
