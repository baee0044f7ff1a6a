//! The supervisor's single entry point: [`Rendezvous::start`] turns the resolved rendezvous
//! settings ([`RdzvConfig`]) and this node's [`NodeSpec`] into a running rendezvous (store
//! hosted or connected, address chosen), with one API for every backend (the supervisor's
//! `nodes::join` drives it for multi-node launches only).
//!
//! Loop shape (the agent owns the handle; `watch` is cancel-safe):
//! ```text
//! let mut rdzv = Rendezvous::start(&config.rdzv, node).await?; // hosts/connects the store
//! let mut reason = RoundReason::Initial;
//! loop {
//!     let worker_store = /* c10d: bind the worker store now (port 0) */;
//!     let asg = rdzv.next_round(RoundRequest { reason, master_port }).await?;
//!     start workers with asg (RANK = asg.base_rank + local_rank, WORLD_SIZE = asg.world_size,
//!         GROUP_RANK, MASTER_ADDR/PORT, TORCHELASTIC_RESTART_COUNT = asg.restart_count);
//!     select! {
//!         ev = rdzv.watch() => match ev {               // stop workers, then:
//!             NodesWaiting(_) | RoundChanged{..} | PeersLost(_) => reason = Membership,
//!             Closed | JobFailed(_) | StoreUnreachable(_) => give up (exit 1),
//!         },
//!         workers failed => restart (reason = WorkerFailure) or give up, as the supervisor's
//!                           pure restart decision says (`rdzv.close_failed()` on giving up),
//!         workers succeeded => { rdzv.exit_barrier(&asg, exit_barrier_timeout).await (log
//!                                errors only); rdzv.close().await; exit 0 },
//!     }
//! }
//! ```
//! Static: MASTER_ADDR/PORT are the rendezvous store itself (TORCHELASTIC_USE_AGENT_STORE=True,
//! `uses_rendezvous_store()`); `master_port` in the request is ignored. c10d: the request's
//! `master_port` is the worker store this agent serves if it becomes group rank 0.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::addr;
use super::barrier::exit_barrier;
use super::c10d::{C10dRendezvous, RoundRequest};
use super::error::RendezvousError;
use super::plumbing::RdzvEvent;
use super::state::{Assignment, RoundReason};
use super::static_::StaticRendezvous;
use super::store::{RdzvStore, StoreOpError};
use super::tcp::{self, TcpRdzvStore};
use crate::config::rdzv_conf::unknown_keys;
use crate::config::{Endpoint, NodeRange, RdzvBackend, RdzvConfig, RdzvSettings};
use crate::store::StoreServer;

/// What the rendezvous needs to know about this node (the caller builds it from the launch's
/// `--nnodes`, `--node-rank`, `--nproc-per-node` and `--local-addr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub nnodes: NodeRange,
    pub node_rank: usize,
    pub nproc_per_node: usize,
    pub local_addr: Option<String>,
}

/// The endpoint to connect to: port 0 (issue 17.5, one node only, checked by the config) means
/// the port the kernel picked for the store this agent hosts; an agent that does not host it
/// cannot know that port.
fn served_endpoint(
    endpoint: Endpoint,
    server: Option<&StoreServer>,
) -> Result<Endpoint, RendezvousError> {
    if endpoint.port != 0 {
        return Ok(endpoint);
    }
    match server {
        Some(s) => Ok(Endpoint {
            port: s.port(),
            ..endpoint
        }),
        None => Err(RendezvousError::Unsupported(format!(
            "rendezvous endpoint {}: port 0 means \"pick a free port\", which only the agent \
             hosting the store can do; this agent does not host it (give a fixed port)",
            addr::host_port(&endpoint.host, 0)
        ))),
    }
}

/// The store this agent hosts (if `hosting` served it; a failure names the endpoint), and the
/// endpoint every agent connects to then (see [`served_endpoint`]).
fn hosted(
    endpoint: Endpoint,
    hosting: Result<Option<StoreServer>, tcp::HostError>,
) -> Result<(Option<StoreServer>, Endpoint), RendezvousError> {
    let server = hosting.map_err(|e| RendezvousError::Host {
        endpoint: addr::host_port(&endpoint.host, endpoint.port),
        source: e.source,
    })?;
    let endpoint = served_endpoint(endpoint, server.as_ref())?;
    Ok((server, endpoint))
}

/// One connection to the rendezvous store, retried until `deadline`.
async fn connect(
    endpoint: &Endpoint,
    deadline: Instant,
    read_timeout: Duration,
) -> Result<Arc<TcpRdzvStore>, RendezvousError> {
    tcp::connect(&endpoint.host, endpoint.port, deadline, read_timeout).await
}

/// One rendezvous of any backend.
pub enum Backend {
    Static(StaticRendezvous<TcpRdzvStore>),
    C10d(C10dRendezvous<TcpRdzvStore>),
    /// `--rdzv-backend etcd-v3` (feature `etcd`): no rendezvous store to host or connect.
    #[cfg(feature = "etcd")]
    Etcd(Box<super::etcd::driver::EtcdRendezvous>),
}

/// A started rendezvous: the handle, the store client and the server this agent hosts (if any;
/// it must live as long as the agent, so peers can finish their exit barrier).
pub struct Rendezvous {
    pub rdzv: Backend,
    pub store: Option<Arc<TcpRdzvStore>>,
    pub server: Option<StoreServer>,
    /// This node as the others should read it in a failure (`node 1 (10.0.0.2)`), once it ran
    /// a round.
    me: Option<String>,
    /// The address this agent advertises (c10d; MASTER_ADDR if it becomes group rank 0): its
    /// worker store listens there.
    pub advertised: Option<String>,
    /// The prefix of the run's keys (`rdrun.static.<run_id>`, `rdrun.rendezvous.<run_id>`):
    /// what the agents exchange for the whole run lives under it (`keys::round::FailureKeys`).
    pub run_prefix: String,
}

/// How long an agent that does not host the store tries to close the rendezvous: the host may
/// be gone already, and the close is then not worth a wait (issue 11.3).
const NON_HOST_CLOSE: Duration = Duration::from_secs(2);

/// How long the store's host waits, after closing, for every agent it knows to say it saw the
/// close (at least this, and at least 3 poll periods): then no agent, not even one waiting on
/// the redundancy list, sees the store vanish instead of the close.
const CLOSE_ACK_WAIT: Duration = Duration::from_secs(5);

impl Rendezvous {
    /// Hosts or connects the store of `rdzv`'s backend and chooses this node's address: what it
    /// reads of the launch is the resolved rendezvous settings and this node's [`NodeSpec`], both
    /// built by the caller. Standalone / single-node runs (`rdzv.endpoint == None`) have none: an
    /// error here.
    pub async fn start(rdzv: &RdzvConfig, node: NodeSpec) -> Result<Rendezvous, RendezvousError> {
        // A single-node run needs no rendezvous: the supervisor never starts one for it.
        let Some(endpoint) = rdzv.endpoint.clone() else {
            return Err(RendezvousError::Unsupported(
                "a rendezvous needs an endpoint (--rdzv-endpoint or --master-addr/--master-port)"
                    .into(),
            ));
        };
        let unknown = unknown_keys(&rdzv.conf);
        if !unknown.is_empty() {
            tracing::warn!(?unknown, "ignoring unknown --rdzv-conf keys");
        }
        // Typed when the run was resolved (`RdzvConfig::settings`): nothing is parsed here.
        let Some(typed) = rdzv.settings.clone() else {
            return Err(RendezvousError::Unsupported(
                "the rendezvous settings were not typed (this run holds no rendezvous)".into(),
            ));
        };
        match (rdzv.backend, typed) {
            (RdzvBackend::Static, RdzvSettings::Static(settings)) => {
                start_static(rdzv, settings, node, endpoint).await
            }
            (RdzvBackend::C10d, RdzvSettings::C10d(settings)) => {
                start_c10d(rdzv, settings, node, endpoint).await
            }
            (RdzvBackend::Etcd, RdzvSettings::Etcd(settings)) => {
                start_etcd(rdzv, settings, node, endpoint).await
            }
            (RdzvBackend::EtcdV2, _) => {
                Err(RendezvousError::Unsupported(super::etcd::v2_is_gone()))
            }
            (backend, _) => Err(RendezvousError::Unsupported(format!(
                "the rendezvous settings were typed for another backend than {backend:?}"
            ))),
        }
    }

    /// Joins the next round; see [`Backend::next_round`].
    pub async fn next_round(&mut self, req: RoundRequest) -> Result<Assignment, RendezvousError> {
        let asg = match self.rdzv.next_round(req).await {
            Ok(asg) => asg,
            Err(e @ RendezvousError::NnodesDisagree { .. }) if self.server.is_some() => {
                // The others read who said what from the store this agent serves: keep it up
                // for two of their poll periods before leaving.
                tokio::time::sleep(self.rdzv.poll_interval() * 2 + Duration::from_millis(500))
                    .await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let addr = asg
            .nodes
            .get(asg.group_rank)
            .map(|n| n.0.clone())
            .filter(|a| !a.is_empty())
            // A large c10d round lists no nodes (`Assignment::nodes`): the address it joined with.
            .or_else(|| self.advertised.clone())
            .or_else(|| {
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
            });
        self.me = Some(match addr {
            Some(a) => format!("node {} ({a})", asg.group_rank),
            None => format!("node {}", asg.group_rank),
        });
        Ok(asg)
    }

    /// The next event of the running round (cancel-safe); see [`Backend::watch`].
    pub async fn watch(&mut self) -> RdzvEvent {
        self.rdzv.watch().await
    }

    /// After this node's workers failed: the peer nodes found lost around the failure (c10d:
    /// heartbeats, see `C10dRendezvous::lost_peers_after_failure`; etcd: leases, see
    /// `EtcdRendezvous::lost_peers_after_failure`). A static job charges a lost peer as a
    /// failure anyway, so it does not wait: always empty.
    pub async fn lost_peers_after_failure(&mut self) -> Vec<String> {
        match &mut self.rdzv {
            Backend::C10d(r) => r.lost_peers_after_failure().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.lost_peers_after_failure().await,
            _ => Vec::new(),
        }
    }

    /// The peers of the round this node ran that a later round knows are gone (issue 38 item
    /// 4), for a node that learned of the loss from the new round rather than from its own
    /// watch (c10d: dropped by another node's keeper; etcd: also leases gone). The static
    /// backend's nodes all see a loss themselves: always empty.
    pub async fn lost_since_round(&self) -> Vec<String> {
        match &self.rdzv {
            Backend::C10d(r) => r.lost_since_round().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.lost_since_round().await,
            _ => Vec::new(),
        }
    }

    /// Marks the rendezvous closed for every node and stops heartbeats (torchrun's `shutdown()`):
    /// the job finished.
    pub async fn close(&mut self) -> Result<(), RendezvousError> {
        self.close_with(None).await
    }

    /// Closes the rendezvous because this node's workers failed and no restart is left: the
    /// others say `the job failed on node N (addr)` rather than that the store vanished, followed
    /// by `detail`: the stop verdict when that is why (issue 28.5: they exit "do not requeue"
    /// too), else the root cause (issue 38 item 7).
    pub async fn close_failed(&mut self, detail: Option<&str>) -> Result<(), RendezvousError> {
        let why = self.failed_here(detail);
        self.close_with(Some(&why)).await
    }

    /// The reason [`Self::close_failed`] closes with: `failed on node N (addr)[: detail]`.
    pub fn failed_here(&self, detail: Option<&str>) -> String {
        let why = format!("failed on {}", self.me.as_deref().unwrap_or("another node"));
        match detail {
            Some(d) => format!("{why}: {d}"),
            None => why,
        }
    }

    /// Closes the rendezvous because of `why`, a sentence of its own (this node cannot take
    /// part: `node n1 failed the health check: …`, issue 28); the others say `the job ended:
    /// <why>` (issue 38 item 17: `the job node n1 failed …` read as one noun).
    pub async fn close_because(&mut self, why: &str) -> Result<(), RendezvousError> {
        self.close_with(Some(&format!("ended: {why}"))).await
    }

    /// Leaves an elastic (c10d, etcd) rendezvous while the others go on (issue 28: a slow node,
    /// or one that failed too often): the round it runs is bumped without it. The static backend
    /// has no spare nodes to go on with: `Ok(false)`, as when the others would be fewer than MIN.
    /// `charged`: the round's bump counts as a restart (the node leaves after its own failure),
    /// else a membership change.
    pub async fn leave(&mut self, charged: bool) -> Result<bool, RendezvousError> {
        let reason = match charged {
            true => RoundReason::WorkerFailure,
            false => RoundReason::Membership,
        };
        match &mut self.rdzv {
            Backend::C10d(r) => r.leave(reason).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.leave(reason).await,
            Backend::Static(_) => Ok(false),
        }
    }

    /// Whether nodes can leave this rendezvous while the others go on ([`Rendezvous::leave`]).
    pub fn can_leave(&self) -> bool {
        match self.rdzv {
            Backend::C10d(_) => true,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => true,
            Backend::Static(_) => false,
        }
    }

    /// One look at the rendezvous by a node that has not joined it (an unhealthy elastic node
    /// between two rounds of its health checks, issue 38.5): `Ok(Some(why))` once it is closed
    /// (`why`: a node gave up; `None`: the job finished); `Err`: the store did not answer. A
    /// static node never stays out: `Ok(None)`.
    pub async fn closed_from_outside(&self) -> Result<Option<Option<String>>, String> {
        match &self.rdzv {
            Backend::C10d(r) => r.closed_from_outside().await.map_err(|e| e.to_string()),
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.closed_from_outside().await.map_err(|e| e.to_string()),
            Backend::Static(_) => Ok(None),
        }
    }

    /// Whether the rendezvous store lives in one of the run's agents (c10d: the host's), so
    /// that it is gone when the run is; etcd outlives every run.
    pub fn store_ends_with_the_run(&self) -> bool {
        matches!(self.rdzv, Backend::C10d(_))
    }

    /// The run's key-value exchange between agents (issue 28): its TCPStore, or etcd.
    pub fn exchange(&self) -> Option<super::Exchange> {
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(r) = &self.rdzv {
            return Some(super::Exchange::Etcd(Box::new(r.exchange())));
        }
        self.store.clone().map(super::Exchange::Tcp)
    }

    /// The store's host closes, then waits (bounded) until every agent it knows saw the close;
    /// any other agent gives the close [`NON_HOST_CLOSE`], as the host may be gone.
    async fn close_with(&mut self, reason: Option<&str>) -> Result<(), RendezvousError> {
        if self.server.is_none() {
            return match tokio::time::timeout(NON_HOST_CLOSE, self.rdzv.close(reason)).await {
                Ok(r) => r,
                Err(_) => Err(RendezvousError::Unreachable {
                    endpoint: self
                        .store
                        .as_ref()
                        .map_or_else(String::new, |s| s.describe()),
                    waited: NON_HOST_CLOSE,
                    source: StoreOpError("could not mark the rendezvous closed".into()),
                }),
            };
        }
        self.rdzv.close(reason).await?;
        let until = Instant::now() + CLOSE_ACK_WAIT.max(self.rdzv.poll_interval() * 3);
        loop {
            let missing = self.rdzv.unacked_close().await;
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                tracing::info!(?missing, "agents did not confirm the close; leaving anyway");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether workers use the rendezvous store at MASTER_ADDR:MASTER_PORT (static, as torchrun);
    /// otherwise the agent serves a worker store on the port it passes to `next_round`.
    pub fn uses_rendezvous_store(&self) -> bool {
        matches!(self.rdzv, Backend::Static(_))
    }

    /// Waits for the other agents of the round (no-op for a single node); see [`exit_barrier`].
    /// It ends early when the job ends elsewhere (closed, a failure on another node, a lost
    /// peer or store). The agent hosting the store then stays, even after its own barrier
    /// timed out, until every agent has left the barrier, the job ended elsewhere, or a peer
    /// stopped heartbeating: the others may still be working, and need the store (issue 17.3).
    pub async fn exit_barrier(
        &mut self,
        asg: &Assignment,
        timeout: Duration,
    ) -> Result<(), RendezvousError> {
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(r) = &mut self.rdzv {
            return r.exit_barrier(asg, timeout, ends_the_wait).await;
        }
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let barrier = exit_barrier(&*store, &asg.store_prefix, asg.group_world_size, timeout);
        tokio::pin!(barrier);
        let res = loop {
            tokio::select! {
                r = &mut barrier => break r,
                ev = self.rdzv.watch() => {
                    if let Some(why) = ends_the_wait(ev) {
                        break Err(RendezvousError::BarrierEnded(why));
                    }
                }
            }
        };
        if matches!(
            res,
            Err(RendezvousError::BarrierEnded(_) | RendezvousError::Store(_))
        ) {
            return res;
        }
        let departed = format!(
            "{}/torchelastic/agent/terminal_state/departed",
            asg.store_prefix
        );
        store.add(&departed, 1).await?;
        if self.server.is_none() {
            return res;
        }
        if let Err(e) = &res {
            tracing::warn!(
                "{e}; this node hosts the rendezvous store and keeps serving it until the other nodes leave"
            );
        }
        loop {
            match store.add(&departed, 0).await {
                Ok(n) if n >= asg.group_world_size as i64 => break,
                Ok(_) => {}
                Err(_) => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                ev = self.rdzv.watch() => {
                    if let Some(why) = ends_the_wait(ev) {
                        tracing::warn!("stopped waiting for the other nodes to leave: {why}");
                        break;
                    }
                }
            }
        }
        res
    }
}

/// Starts the static backend: hosts the store on node 0 (its workers' store too, emptied
/// before each round opens) and connects the agent's and its keeper's connections.
async fn start_static(
    rdzv: &RdzvConfig,
    settings: crate::config::rdzv_conf::StaticSettings,
    config: NodeSpec,
    endpoint: Endpoint,
) -> Result<Rendezvous, RendezvousError> {
    let hosting = tcp::host_static_store(config.node_rank, &endpoint.host, endpoint.port).await;
    let (server, endpoint) = hosted(endpoint, hosting)?;
    let deadline = Instant::now() + settings.timeout;
    let store = connect(&endpoint, deadline, settings.read_timeout).await?;
    // The keeper's own connection (see `StaticRendezvous::with_keeper_store`).
    let keeper = connect(&endpoint, deadline, settings.read_timeout).await?;
    let r = StaticRendezvous::new(
        store.clone(),
        settings,
        &rdzv.run_id,
        config.node_rank,
        config.nnodes.max,
        config.nproc_per_node,
        &endpoint.host,
        endpoint.port,
    )?
    .with_keeper_store(keeper);
    // The workers share this store (TORCHELASTIC_USE_AGENT_STORE): node 0 empties
    // their namespace before each round opens (issue 24.1).
    let r = match server.as_ref() {
        Some(s) => {
            let hosted = s.store().clone();
            // rdrun's keys as clients send them ("/" + key, as TCPStore) or raw.
            r.with_worker_reset(Arc::new(move || {
                hosted.clear_except(&[b"/rdrun.", b"rdrun."])
            }))
        }
        None => r,
    };
    let r = match config.local_addr.as_deref() {
        Some(a) => r.with_identity(a),
        None => r,
    };
    Ok(Rendezvous {
        rdzv: Backend::Static(r),
        store: Some(store),
        server,
        me: None,
        advertised: None,
        run_prefix: super::keys::static_::Keys::new(&rdzv.run_id)
            .prefix()
            .to_string(),
    })
}

/// Starts the c10d backend: hosts the store where `is_host` says, connects, and chooses the
/// address this agent advertises.
async fn start_c10d(
    rdzv: &RdzvConfig,
    settings: crate::config::rdzv_conf::C10dSettings,
    config: NodeSpec,
    endpoint: Endpoint,
) -> Result<Rendezvous, RendezvousError> {
    let hosting = tcp::host_c10d_store(&endpoint.host, endpoint.port, settings.is_host).await;
    let (server, endpoint) = hosted(endpoint, hosting)?;
    // Peers start unevenly: keep trying for the whole join timeout (pain point 13).
    let deadline = Instant::now() + settings.join_timeout;
    let store = connect(&endpoint, deadline, settings.read_timeout).await?;
    let me = addr::advertised_addr(
        config.local_addr.as_deref(),
        &endpoint.host,
        endpoint.port,
        deadline,
    )
    .await?;
    tracing::info!(addr = %me, endpoint = %addr::host_port(&endpoint.host, endpoint.port),
        hosting = server.is_some(), "joining the c10d rendezvous");
    // Per-process counter, as torchrun's node descriptor: several agents in one
    // process (tests, embedders) stay distinct even with the same address.
    static LOCAL_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let local_id = LOCAL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The keeper's own connection (see `C10dRendezvous::with_keeper_store`).
    let keeper = connect(&endpoint, deadline, settings.read_timeout).await?;
    let r = C10dRendezvous::new(
        store.clone(),
        settings,
        &rdzv.run_id,
        &me,
        local_id,
        config.nproc_per_node,
    )
    .with_keeper_store(keeper);
    Ok(Rendezvous {
        rdzv: Backend::C10d(r),
        store: Some(store),
        server,
        me: None,
        advertised: Some(me),
        run_prefix: super::keys::c10d::prefix(&rdzv.run_id),
    })
}

/// Starts the etcd backend: connects to every member (bounded; one-line errors naming them),
/// chooses this node's address by the route to the first member, and joins the membership.
#[cfg(feature = "etcd")]
async fn start_etcd(
    rdzv: &RdzvConfig,
    settings: crate::config::etcd_conf::EtcdSettings,
    config: NodeSpec,
    endpoint: Endpoint,
) -> Result<Rendezvous, RendezvousError> {
    use super::etcd::{client::Etcd, driver::EtcdRendezvous};
    let etcd = Etcd::connect(&settings, &rdzv.run_id).await?;
    let deadline = Instant::now() + super::etcd::client::CONNECT_BOUND;
    let me = addr::advertised_addr(
        config.local_addr.as_deref(),
        &endpoint.host,
        endpoint.port,
        deadline,
    )
    .await?;
    tracing::info!(addr = %me, endpoints = %settings.describe_endpoints(), "joining the etcd rendezvous");
    // Per-process counter, as c10d's: several agents in one process stay distinct.
    static LOCAL_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let local_id = LOCAL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let r = EtcdRendezvous::start(
        etcd,
        settings,
        &rdzv.run_id,
        &me,
        local_id,
        config.nproc_per_node,
    )
    .await?;
    Ok(Rendezvous {
        rdzv: Backend::Etcd(Box::new(r)),
        store: None,
        server: None,
        me: None,
        advertised: Some(me),
        run_prefix: super::keys::c10d::prefix(&rdzv.run_id),
    })
}

#[cfg(not(feature = "etcd"))]
async fn start_etcd(
    _: &RdzvConfig,
    _: crate::config::etcd_conf::EtcdSettings,
    _: NodeSpec,
    _: Endpoint,
) -> Result<Rendezvous, RendezvousError> {
    Err(RendezvousError::Unsupported(super::etcd::missing_feature()))
}

/// Why an event seen while waiting at the end of the job ends the wait (`None`: keep waiting).
fn ends_the_wait(ev: RdzvEvent) -> Option<String> {
    match ev {
        RdzvEvent::NodesWaiting(_) => None,
        RdzvEvent::Closed => Some("the rendezvous was closed by another node".into()),
        RdzvEvent::JobFailed(why) => Some(format!("the job {why}")),
        RdzvEvent::PeersLost(ids) => {
            Some(format!("node(s) {} stopped heartbeating", ids.join(", ")))
        }
        RdzvEvent::RoundChanged { round, .. } => {
            Some(format!("another node started round {round} (a restart)"))
        }
        RdzvEvent::StoreUnreachable(why) => Some(format!("lost the rendezvous store: {why}")),
    }
}

impl Backend {
    /// See `C10dRendezvous::next_round` / `StaticRendezvous::next_round`.
    pub async fn next_round(&mut self, req: RoundRequest) -> Result<Assignment, RendezvousError> {
        match self {
            Backend::C10d(r) => r.next_round(req).await,
            Backend::Static(r) => r.next_round(req.reason).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.next_round(req).await,
        }
    }

    /// The next event of the running round.
    pub async fn watch(&mut self) -> RdzvEvent {
        match self {
            Backend::C10d(r) => r.watch().await,
            Backend::Static(r) => r.watch().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.watch().await,
        }
    }

    /// Marks the rendezvous closed for every node (with why, if a node gave up) and stops
    /// heartbeats.
    pub async fn close(&mut self, reason: Option<&str>) -> Result<(), RendezvousError> {
        match self {
            Backend::C10d(r) => r.close(reason).await,
            Backend::Static(r) => r.close(reason).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.close(reason).await,
        }
    }

    /// Agents that have not yet said they saw the close.
    async fn unacked_close(&self) -> Vec<String> {
        match self {
            Backend::C10d(r) => r.unacked_close().await,
            Backend::Static(r) => r.unacked_close().await,
            // Nobody hosts an etcd rendezvous: no agent must outlive the others' close.
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Vec::new(),
        }
    }

    fn poll_interval(&self) -> Duration {
        match self {
            Backend::C10d(r) => r.poll_interval(),
            Backend::Static(r) => r.poll_interval(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(r) => r.poll_interval(),
        }
    }
}

#[cfg(test)]
#[path = "handle_tests.rs"]
mod tests;
