//! The rendezvous over rdrun's TCPStore-compatible store: who hosts it, and a reconnecting client.
//!
//! - [`TcpRdzvStore`] implements [`RdzvStore`] with `crate::store::Client`. A request that timed
//!   out or lost its connection leaves that connection unusable (the client cannot resync a
//!   half-read reply), so the adapter drops it and reconnects on the next operation, with a short
//!   connect timeout: an agent whose link comes back rejoins instead of failing for good.
//! - [`serve_on`] / [`serve_at`]: the one store binder (every store rdrun hosts: single-node
//!   worker store, c10d worker store, static and c10d rendezvous stores), listening where the
//!   user's address says (`addr::listen_plan`: loopback stays loopback, a specific address is
//!   bound alone, a wildcard or an address not found here means every interface).
//! - [`host_c10d_store`]: `--rdzv-backend=c10d`: the endpoint's host (conf `is_host`, else
//!   inferred, see `addr.rs`) serves the store on the endpoint port where the endpoint names;
//!   when the inferred host finds a store already answering on the port (another agent on this
//!   machine hosts it) it becomes a client, as torchrun does; an explicit `is_host=true` gets no
//!   fallback. A port in use where nothing answers (TIME_WAIT) is retried while that lasts, then
//!   a one-line error names the port and the reason: the host never waits for itself.
//! - [`host_static_store`]: `--rdzv-backend=static`: node rank 0 serves on `master_port`.
//! - [`connect`]: every agent (the host too) connects to the endpoint with retry and backoff until
//!   the rendezvous deadline, with an error naming host:port.
//!
//! Length: about 520 lines of code; the rest are its tests (binding, hosting races, reconnects).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::addr::{self, ListenOn};
use super::error::RendezvousError;
use super::store::{RdzvStore, StoreOpError, StoreResult};
use crate::store::{Client, ServerConfig, StoreError, StoreServer};

/// Connect timeout of a reconnection after a lost connection (the caller retries on error).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// While the store does not answer, how often the first connect says so.
const CONNECT_PROGRESS_EVERY: Duration = Duration::from_secs(10);

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
    /// times out after `op_timeout` (conf `read_timeout`). The name is resolved first (a name
    /// that does not resolve is reported at WARN at once, see `addr::resolve_until`); while the
    /// store does not answer, a line every few seconds says why (INFO: peers start unevenly).
    pub async fn connect(
        host: &str,
        port: u16,
        deadline: Instant,
        op_timeout: Duration,
    ) -> Result<Self, RendezvousError> {
        let started = Instant::now();
        addr::resolve_until(host, port, deadline, Duration::from_millis(500)).await?;
        let client = loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(CONNECT_PROGRESS_EVERY);
            match Client::connect(host, port, slice).await {
                Ok(c) => break c,
                Err(e) if Instant::now() >= deadline => {
                    return Err(RendezvousError::Unreachable {
                        endpoint: addr::host_port(host, port),
                        waited: started.elapsed(),
                        source: op_err(e),
                    })
                }
                Err(e) => tracing::info!(
                    "rendezvous store {} not reachable yet ({}); retrying for {:.0}s more",
                    addr::host_port(host, port),
                    op_err(e),
                    deadline
                        .saturating_duration_since(Instant::now())
                        .as_secs_f64()
                ),
            }
        };
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

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> StoreResult<()> {
        let pairs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        self.run(|c| {
            let pairs = &pairs;
            async move { c.multi_set(pairs).await }
        })
        .await
    }

    async fn beat_and_read(&self, hb_key: &str, keys: &[String]) -> StoreResult<Vec<Vec<u8>>> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.run(|c| {
            let keys = &keys;
            async move { c.add_and_multi_get(hb_key, 1, keys).await.map(|r| r.1) }
        })
        .await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.run(|c| async move { c.delete_key(key).await.map(|_| ()) })
            .await
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

/// Serves a store on `port` (0: the kernel picks one port, shared by every address) where
/// `plan` says: every interface (dual-stack `[::]`, or `0.0.0.0` where IPv6 is unavailable),
/// every IPv4 interface, or exactly the listed addresses, one listening socket each, all serving
/// one store. This is the one store binder: the single-node worker store, the c10d worker store,
/// and the static and c10d rendezvous stores all bind through it. An error keeps its kind
/// (`AddrInUse` above all) and names the address.
pub fn serve_on(plan: &ListenOn, port: u16) -> std::io::Result<StoreServer> {
    let named =
        |a: SocketAddr, e: std::io::Error| std::io::Error::new(e.kind(), format!("{a}: {e}"));
    match plan {
        ListenOn::Any => {
            let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
            match StoreServer::bind(v6, ServerConfig::default()) {
                Ok(s) => Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(named(v6, e)),
                Err(e) => {
                    tracing::debug!(error = %e, "no IPv6 listener; serving on 0.0.0.0");
                    let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
                    StoreServer::bind(v4, ServerConfig::default()).map_err(|e| named(v4, e))
                }
            }
        }
        ListenOn::AnyV4 => {
            let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            StoreServer::bind(v4, ServerConfig::default()).map_err(|e| named(v4, e))
        }
        ListenOn::Ips(ips) => {
            // With port 0 the first address picks the port; another address may have it taken
            // already: pick again (a fixed port is the user's and fails as it is).
            let mut tries = 0;
            loop {
                match bind_all(ips, port) {
                    Err(e)
                        if port == 0 && e.kind() == std::io::ErrorKind::AddrInUse && tries < 10 =>
                    {
                        tries += 1;
                    }
                    Err(e) => return Err(e),
                    Ok(listeners) => return serve_listeners(listeners),
                }
            }
        }
    }
}

/// One listening socket per address on one port; an address this machine lacks (`::1` where
/// IPv6 is off, for `localhost`) is skipped while another one binds.
fn bind_all(ips: &[IpAddr], port: u16) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::new();
    let mut port = port;
    let mut unavailable = None;
    for ip in ips {
        let a = SocketAddr::new(*ip, port);
        match crate::store::server::bind_listener(a) {
            Ok(l) => {
                port = l.local_addr()?.port();
                listeners.push(l);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                tracing::debug!("cannot listen on {a}: {e}; skipping it");
                unavailable = Some(std::io::Error::new(e.kind(), format!("{a}: {e}")));
            }
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("{a}: {e}"))),
        }
    }
    if listeners.is_empty() {
        return Err(unavailable.unwrap_or_else(|| std::io::Error::other("no address to listen on")));
    }
    Ok(listeners)
}

/// Serves every listener with one store. The first is the returned server; the others share
/// its store and stop when it stops (shutdown, drop or failure).
fn serve_listeners(listeners: Vec<std::net::TcpListener>) -> std::io::Result<StoreServer> {
    let mut it = listeners.into_iter();
    let first = it.next().expect("bind_all returns at least one listener");
    let primary = StoreServer::start(first, ServerConfig::default())?;
    let mut extra = Vec::new();
    for l in it {
        extra.push(StoreServer::start_with_store(
            l,
            ServerConfig::default(),
            primary.store().clone(),
        )?);
    }
    if !extra.is_empty() {
        let closed = primary.closed();
        tokio::spawn(async move {
            let _ = closed.await;
            for s in extra {
                s.shutdown().await;
            }
        });
    }
    Ok(primary)
}

/// Serves a store where `host` says (see `addr::listen_on`; `None`: standalone, 127.0.0.1).
pub async fn serve_at(host: Option<&str>, port: u16) -> std::io::Result<StoreServer> {
    serve_on(&addr::listen_on(host).await, port)
}

/// Why this agent could not host the store.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve the rendezvous store on port {port}")]
pub struct HostError {
    pub port: u16,
    #[source]
    pub source: std::io::Error,
}

/// How long a would-be host retries a port that is in use while nothing answers on it: the
/// kernel holds a port in TIME_WAIT for 60 s (Linux `TCP_TIMEWAIT_LEN`), and client sockets in
/// TIME_WAIT block a bind even with SO_REUSEADDR (they did not set it themselves).
const TAKEN_PORT_RETRY: Duration = Duration::from_secs(65);

/// After this long retrying a taken port, say so at WARN (shorter retries are the normal race
/// of two agents of one machine that both infer they host).
const TAKEN_PORT_WARN_AFTER: Duration = Duration::from_secs(1);

/// Whether a store, something else, or nothing answers on `port` where `plan` listens.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    Store,
    Other(SocketAddr),
    Nothing,
}

async fn probe(plan: &ListenOn, port: u16) -> Probe {
    let limit = Duration::from_millis(500);
    let mut other = None;
    for ip in plan.probe_ips() {
        let a = SocketAddr::new(ip, port);
        let connected = matches!(
            tokio::time::timeout(limit, tokio::net::TcpStream::connect(a)).await,
            Ok(Ok(_))
        );
        if !connected {
            continue;
        }
        if Client::connect(&ip.to_string(), port, Duration::from_millis(500))
            .await
            .is_ok()
        {
            return Probe::Store;
        }
        other = Some(a);
    }
    other.map_or(Probe::Nothing, Probe::Other)
}

/// Serves the rendezvous store on `port` where `plan` says, for an agent that must host it.
/// A port in use: if a store answers there, `Ok(None)` when `may_join` (another agent of this
/// machine hosts it), else an error; if another program answers, an error naming it; if nothing
/// answers (TIME_WAIT sockets, or another agent that lost the same bind/listen race), retry
/// with short, growing naps for up to `retry_for`, then an error naming the port and the reason.
/// Never blocks the runtime (async probes and naps), so a signal is handled at once.
async fn host_on(
    plan: &ListenOn,
    port: u16,
    may_join: bool,
    retry_for: Duration,
) -> Result<Option<StoreServer>, HostError> {
    let started = Instant::now();
    let mut attempt = 0u32;
    let mut warned = false;
    let fail = |kind: std::io::ErrorKind, msg: String| HostError {
        port,
        source: std::io::Error::new(kind, msg),
    };
    loop {
        let err = match serve_on(plan, port) {
            Ok(s) => {
                if warned {
                    tracing::warn!(
                        "port {port} is free again after {:.0}s: hosting the rendezvous store",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(Some(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && port != 0 => e,
            Err(source) => return Err(HostError { port, source }),
        };
        match probe(plan, port).await {
            Probe::Store if may_join => {
                tracing::info!(
                    "another agent on this machine serves the rendezvous store on port {port}; \
                     joining it as a client"
                );
                return Ok(None);
            }
            Probe::Store => {
                return Err(fail(
                    err.kind(),
                    format!("{err}: another process already serves a store on this port"),
                ))
            }
            // Something accepts but does not answer as a store (in time): maybe a busy agent
            // of this machine hosting it, maybe another program. The inferred host says at WARN
            // that it could not host, and why, then tries it as a client.
            Probe::Other(a) if may_join => {
                tracing::warn!(
                    "cannot host the rendezvous store on port {port}: {err}; something on {a} \
                     accepts connections but did not answer as a rendezvous store; joining it \
                     as a client"
                );
                return Ok(None);
            }
            Probe::Other(a) => {
                return Err(fail(
                    err.kind(),
                    format!("{err}: a program that is not a rendezvous store answers on {a}"),
                ))
            }
            Probe::Nothing if started.elapsed() >= retry_for => {
                return Err(fail(
                    err.kind(),
                    format!(
                        "{err}, and nothing answers there after {:.0}s of retries (sockets of \
                         earlier connections in TIME_WAIT hold the port; see `ss -tan`); \
                         choose another port",
                        started.elapsed().as_secs_f64()
                    ),
                ))
            }
            Probe::Nothing => {
                if !warned && started.elapsed() >= TAKEN_PORT_WARN_AFTER {
                    tracing::warn!(
                        "cannot host the rendezvous store on port {port} yet: {err}, but nothing \
                         answers there (sockets in TIME_WAIT?); retrying for up to {:.0}s",
                        retry_for.as_secs_f64()
                    );
                    warned = true;
                }
                attempt += 1;
                tokio::time::sleep(host_retry_nap(attempt)).await;
            }
        }
    }
}

/// c10d: serves the store if this agent is the endpoint's host (see the module docs), where the
/// endpoint's host names (`addr::listen_on`). Must run inside the agent's tokio runtime (the
/// server lives on it). `None` = another agent hosts it.
pub async fn host_c10d_store(
    host: &str,
    port: u16,
    is_host: Option<bool>,
) -> Result<Option<StoreServer>, HostError> {
    if !addr::is_host(host, is_host).await {
        return Ok(None);
    }
    let plan = addr::listen_on(Some(host)).await;
    host_on(&plan, port, is_host.is_none(), TAKEN_PORT_RETRY).await
}

/// 2-65 ms plus up to 250 ms growing with `attempt`, different for every caller (a
/// process-wide counter and the clock), so that two agents that collided do not collide again.
fn host_retry_nap(attempt: u32) -> Duration {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let salt = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mix = (nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id()))
        .wrapping_mul(0x2545_F491_4F6C_DD1D);
    Duration::from_millis(2 + (mix >> 59) + 4 * u64::from(attempt.min(64)))
}

/// static: node rank 0 serves the store on `master_port` where `master_addr` names; no
/// fallback to being a client (the job's store must be this agent's).
pub async fn host_static_store(
    node_rank: usize,
    master_addr: &str,
    master_port: u16,
) -> Result<Option<StoreServer>, HostError> {
    if node_rank != 0 {
        return Ok(None);
    }
    let plan = addr::listen_on(Some(master_addr)).await;
    host_on(&plan, master_port, false, TAKEN_PORT_RETRY).await
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
                            let served = host_c10d_store("127.0.0.1", port, None).await.unwrap();
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
        let server = serve_on(&ListenOn::Any, 0).unwrap();
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
            .await
            .unwrap()
            .expect("loopback hosts");
        let port = first.port();
        assert!(host_c10d_store("127.0.0.1", port, None)
            .await
            .unwrap()
            .is_none());
        let err = host_c10d_store("127.0.0.1", port, Some(true))
            .await
            .err()
            .expect("explicit host: no fallback");
        assert_eq!(
            err.to_string(),
            format!("cannot serve the rendezvous store on port {port}")
        );
        assert!(
            host_c10d_store("192.0.2.1", port, None)
                .await
                .unwrap()
                .is_none(),
            "not this machine"
        );
        assert!(host_static_store(1, "127.0.0.1", port)
            .await
            .unwrap()
            .is_none());
        assert!(host_static_store(0, "127.0.0.1", port).await.is_err());
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

    /// A socket bound to `127.0.0.1:port` without SO_REUSEADDR and never listening: like the
    /// client sockets in TIME_WAIT of issue 17.9, it makes a store's bind fail with EADDRINUSE
    /// while nothing answers on the port.
    fn port_blocker() -> (socket2::Socket, u16) {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let port = s.local_addr().unwrap().as_socket().unwrap().port();
        (s, port)
    }

    fn refused(a: SocketAddr) -> bool {
        std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_err()
    }

    fn has_ipv6_loopback() -> bool {
        std::net::TcpListener::bind("[::1]:0").is_ok()
    }

    /// Issue 17.9: the endpoint's host whose port is blocked while nothing answers there keeps
    /// trying and hosts once the port is free (it used to become a client of nobody and wait
    /// for its join timeout).
    #[tokio::test]
    async fn host_whose_port_is_blocked_while_nothing_answers_hosts_once_it_is_free() {
        let (blocker, port) = port_blocker();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            drop(blocker);
        });
        let served = tokio::time::timeout(
            Duration::from_secs(60),
            host_c10d_store("127.0.0.1", port, None),
        )
        .await
        .expect("bounded")
        .unwrap()
        .expect("the endpoint's host hosts");
        assert_eq!(served.port(), port);
        release.await.unwrap();
        served.shutdown().await;
    }

    /// Issue 17.9: when the port stays blocked, the error names the port and the reason (in
    /// the test, after a 1 s retry bound instead of the 65 s one).
    #[tokio::test]
    async fn host_whose_port_stays_blocked_fails_naming_the_port_and_the_reason() {
        let (_blocker, port) = port_blocker();
        let plan = ListenOn::Ips(vec![Ipv4Addr::LOCALHOST.into()]);
        let err = host_on(&plan, port, true, Duration::from_secs(1))
            .await
            .err()
            .expect("no host");
        let chain = format!("{err}: {}", err.source);
        assert!(chain.contains(&format!("port {port}")), "{chain}");
        assert!(chain.contains("nothing answers"), "{chain}");
        assert!(chain.contains("TIME_WAIT"), "{chain}");
        // Another program (not a store) on the port: for a host that must host, an error at
        // once, naming it; an inferred host tries it as a client (said at WARN).
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sport = squatter.local_addr().unwrap().port();
        let started = std::time::Instant::now();
        let err = host_on(&plan, sport, false, Duration::from_secs(30))
            .await
            .err()
            .expect("taken by a non-store");
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(
            err.source.to_string().contains("not a rendezvous store"),
            "{err:?}"
        );
    }

    /// Issue 9: hosting never blocks the agent's single-threaded runtime (it used to
    /// `std::thread::sleep` and connect synchronously), so a signal is handled at once: a
    /// timeout of 300 ms around a host that keeps retrying ends within a few seconds.
    #[test]
    fn hosting_does_not_block_a_current_thread_runtime() {
        let (_blocker, port) = port_blocker();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let res = rt.block_on(async {
            let ticks = tokio::spawn(async {
                let mut n = 0u32;
                let mut every = tokio::time::interval(Duration::from_millis(50));
                for _ in 0..10 {
                    every.tick().await;
                    n += 1;
                }
                n
            });
            let hosted = tokio::time::timeout(
                Duration::from_millis(300),
                host_c10d_store("127.0.0.1", port, None),
            )
            .await;
            (hosted.is_err(), ticks.await.unwrap())
        });
        assert!(
            res.0,
            "still retrying after 300 ms (the port stays blocked)"
        );
        assert_eq!(res.1, 10);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "runtime blocked for {:?}",
            started.elapsed()
        );
    }

    /// Issue 10 (binding) and 11.2: the store listens where the user's address is.
    #[tokio::test]
    async fn stores_listen_where_the_address_names() {
        // Standalone: 127.0.0.1 only.
        let s = serve_at(None, 0).await.unwrap();
        assert_eq!(s.local_addr().ip(), IpAddr::from(Ipv4Addr::LOCALHOST));
        assert!(refused(SocketAddr::from(([127, 0, 0, 2], s.port()))));
        s.shutdown().await;
        // Another loopback address: exactly it (workers get 127.0.0.2 and connect there).
        let s = serve_at(Some("127.0.0.2"), 0).await.unwrap();
        assert_eq!(s.local_addr(), SocketAddr::from(([127, 0, 0, 2], s.port())));
        assert!(!refused(SocketAddr::from(([127, 0, 0, 2], s.port()))));
        assert!(refused(SocketAddr::from(([127, 0, 0, 1], s.port()))));
        s.shutdown().await;
        // `localhost`: every loopback address it resolves to, one port, one store.
        let s = serve_at(Some("localhost"), 0).await.unwrap();
        let port = s.port();
        let v4 = Client::connect("127.0.0.1", port, Duration::from_secs(10))
            .await
            .expect("127.0.0.1");
        v4.set("k", b"v").await.unwrap();
        let six = lookup_has_v6_localhost();
        if six && has_ipv6_loopback() {
            let v6 = Client::connect("::1", port, Duration::from_secs(10))
                .await
                .expect("::1");
            assert_eq!(v6.get("k").await.unwrap(), b"v");
        } else {
            eprintln!("localhost has no IPv6 loopback here; ::1 not checked");
        }
        drop(v4);
        s.shutdown().await;
        // The wildcard, when asked for: both families.
        let s = serve_at(Some("0.0.0.0"), 0).await.unwrap();
        assert!(s.local_addr().ip().is_unspecified());
        s.shutdown().await;
        if has_ipv6_loopback() {
            let s = serve_at(Some("::1"), 0).await.unwrap();
            assert_eq!(s.local_addr().ip(), IpAddr::from(Ipv6Addr::LOCALHOST));
            assert!(refused(SocketAddr::from(([127, 0, 0, 1], s.port()))));
            s.shutdown().await;
        } else {
            eprintln!("no IPv6 loopback here; [::1] not checked");
        }
    }

    fn lookup_has_v6_localhost() -> bool {
        addr::lookup("localhost", 0)
            .map(|v| v.iter().any(SocketAddr::is_ipv6))
            .unwrap_or(false)
    }

    /// Moved from the agent with the binder: a fixed port is that port, kept bound; a taken
    /// port is a clear error naming the address.
    #[tokio::test]
    async fn fixed_port_is_kept_and_a_taken_port_names_the_address() {
        let s = serve_at(None, 0).await.unwrap();
        let local = s.local_addr();
        assert!(local.ip().is_loopback() && local.port() != 0);
        assert!(std::net::TcpListener::bind(local).is_err(), "kept bound");
        let port = local.port();
        s.shutdown().await;
        let s = serve_at(Some("127.0.0.1"), port).await.unwrap();
        assert_eq!(s.port(), port);
        let err = serve_at(Some("127.0.0.1"), port)
            .await
            .err()
            .expect("taken");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        assert!(
            err.to_string().contains(&format!("127.0.0.1:{port}")),
            "{err}"
        );
        s.shutdown().await;
    }
}
