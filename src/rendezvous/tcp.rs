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
//! Its tests (binding, hosting races, reconnects) are in `tcp_tests.rs`.

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
        // A wait dropped mid-way (the exit barrier ended early by a rendezvous event) leaves
        // its WAIT unanswered on the connection: replaced, as `run` does, so that the close
        // that follows does not fail with "an earlier request was abandoned mid-way".
        let mut guard = DropGuard {
            store: self,
            generation,
            armed: true,
        };
        let res = client.wait(&keys, timeout).await;
        guard.armed = false;
        match res {
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
#[path = "tcp_tests.rs"]
mod tests;
