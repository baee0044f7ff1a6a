//! `--rdzv-backend=static`: a fixed set of `nnodes` agents, each given its `--node-rank`.
//!
//! Node 0 hosts the store at `master_addr:master_port` (see `tcp.rs`, the one store binder), the others connect with
//! retry until the rendezvous `timeout` (conf `timeout`, default 900 s as torchrun, spec §4.3).
//! GROUP_RANK = node rank; each agent publishes its nproc, so RANK = (Σ nproc of lower node
//! ranks) + local rank and WORLD_SIZE = Σ nproc (heterogeneous nproc works); MASTER_ADDR/PORT are
//! the master's, the very store the workers use (TORCHELASTIC_USE_AGENT_STORE=True).
//!
//! Better than torchrun: restarts are job-wide. A node whose workers failed bumps a generation
//! counter (compare-and-set, so simultaneous failures count once); every other agent sees it in
//! [`StaticRendezvous::watch`], stops its workers and rejoins, so TORCHELASTIC_RESTART_COUNT is the
//! generation on every node. Rounds start only when all `nnodes` agents arrived (no worker of a
//! new attempt talks to one of the old attempt). Agents heartbeat; a peer that stops is reported
//! as [`RdzvEvent::PeersLost`] within seconds (a static job cannot shrink, so the agent treats it
//! as a failure instead of hanging until an NCCL timeout).
//!
//! Keys under `rdrun.static.<run_id>`: `/nproc/<rank>`, `/hb/<rank>`, `/gen`, `/closed`,
//! `/round/<gen>/{arrived,go}`; agent keys of a round under `rdrun.static.<run_id>.<gen>`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::error::RendezvousError;
use super::keys::static_::Keys;
use super::plumbing::{
    ack_closed, beat, closed_acks, nnodes_disagreement, retry, HeartbeatTracker, KeeperTask,
    RdzvEvent, StoreLoss,
};
use super::state::{base_rank, Assignment, RoundReason};
use super::store::{try_get, RdzvStore, StoreOpError};
use crate::config::rdzv_conf::StaticSettings;

fn parse_u64(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// The reason stored in the closed key, `None` when the job finished.
fn closed_reason(value: &[u8]) -> Option<String> {
    (value != b"1").then(|| String::from_utf8_lossy(value).into_owned())
}

/// Empties the workers' namespace of the store node 0 hosts (every key outside the launcher's
/// own `rdrun.` keys) and returns how many keys it removed. Called by node 0 between "every
/// agent arrived" and "go": no worker of the old attempt is alive then, and none of the new one
/// has started.
pub type WorkerReset = Arc<dyn Fn() -> usize + Send + Sync>;

/// What a duplicate learnt about the agent that holds its node rank.
enum OwnerCheck {
    /// Its heartbeats change: a live agent holds the rank.
    Alive,
    /// Its job is over (closed, or its store went away): the claim can never be made; why.
    JobOver(String),
    /// No heartbeat for the budget: the rank may be taken over.
    Silent,
}

/// One agent's handle on a static rendezvous (same loop shape as `C10dRendezvous`).
pub struct StaticRendezvous<S: RdzvStore> {
    store: Arc<S>,
    /// The keeper's own connection: heartbeats must never queue behind a WAIT of the agent's
    /// (the exit barrier's), or peers see them stall and declare this node dead.
    keeper_store: Arc<S>,
    settings: StaticSettings,
    keys: Keys,
    node_rank: usize,
    nnodes: usize,
    nproc: usize,
    master_addr: String,
    master_port: u16,
    round: Option<u64>,
    running: Arc<Mutex<Option<u64>>>,
    /// Set for good once the keeper found the store lost.
    lost: Arc<Mutex<Option<String>>>,
    keeper: KeeperTask,
    /// This agent's claim on its node rank, once made (see [`StaticRendezvous::claim_rank`]).
    claim: Option<String>,
    /// How the claim names this agent's machine (`--local-addr` or the host name).
    who: String,
    /// This agent appended its `--nnodes`.
    said_nnodes: bool,
    /// `gethostname()`, published for the others (see [`Keys::host`]).
    host: String,
    /// Node 0's reset of the workers' namespace (see [`WorkerReset`]); `None` elsewhere.
    reset: Option<WorkerReset>,
}

impl<S: RdzvStore> StaticRendezvous<S> {
    /// A handle for node `node_rank` of `nnodes`, running `nproc` workers. `master_addr` and
    /// `master_port` are what workers get (the store node 0 hosts).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<S>,
        settings: StaticSettings,
        run_id: &str,
        node_rank: usize,
        nnodes: usize,
        nproc: usize,
        master_addr: &str,
        master_port: u16,
    ) -> Result<Self, RendezvousError> {
        if node_rank >= nnodes {
            return Err(RendezvousError::NodeRank { node_rank, nnodes });
        }
        Ok(Self {
            keeper_store: store.clone(),
            store,
            settings,
            keys: Keys::new(run_id),
            node_rank,
            nnodes,
            nproc,
            master_addr: master_addr.to_string(),
            master_port,
            round: None,
            running: Arc::default(),
            lost: Arc::default(),
            keeper: KeeperTask::new(),
            claim: None,
            said_nnodes: false,
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            who: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "an unnamed host".into()),
            reset: None,
        })
    }

    /// Node 0's reset of the workers' namespace, run before every round opens (issue 24.1):
    /// torch's `env://` rendezvous under `TORCHELASTIC_USE_AGENT_STORE` uses this store with no
    /// per-attempt prefix, so without it attempt 1 reads attempt 0's gloo/NCCL addresses.
    pub fn with_worker_reset(mut self, reset: WorkerReset) -> Self {
        self.reset = Some(reset);
        self
    }

    /// How this agent's rank claim names its machine (default: the host name).
    pub fn with_identity(mut self, who: &str) -> Self {
        self.who = who.to_string();
        self
    }

    /// Claims this node rank for this agent, once (issue 17.6). A rank claimed by another agent
    /// whose heartbeats still change is an error naming that agent; one whose heartbeats stopped
    /// for the heartbeat budget (a node that died and comes back) is taken over.
    ///
    /// The duplicate learns its answer within the heartbeat budget whatever the job does (issue
    /// 25.2): the owner's heartbeat is read every interval (the first change is the answer), and
    /// a job that has already ended, or whose store goes away meanwhile, is said at once with
    /// the owner's name, never after the rendezvous timeout as an unreachable store.
    async fn claim_rank(&mut self, deadline: Instant) -> Result<(), RendezvousError> {
        if self.claim.is_some() {
            return Ok(());
        }
        static AGENTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = AGENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = format!("{} (pid {}, agent {n})", self.who, std::process::id());
        let (store, keys, rank) = (self.store.clone(), self.keys.clone(), self.node_rank);
        let mut expected = String::new();
        loop {
            let got = self
                .retry(deadline, || {
                    let (store, key) = (store.clone(), keys.owner(rank));
                    let (e, t) = (expected.clone(), token.clone());
                    async move { store.compare_set(&key, e.as_bytes(), t.as_bytes()).await }
                })
                .await?;
            if got == token.as_bytes() {
                self.claim = Some(token);
                return Ok(());
            }
            let other = String::from_utf8_lossy(&got).into_owned();
            match self.owner_check().await {
                OwnerCheck::Alive => {
                    return Err(RendezvousError::RankTaken {
                        node_rank: rank,
                        other,
                    })
                }
                OwnerCheck::JobOver(why) => {
                    return Err(RendezvousError::RankTakenJobOver {
                        node_rank: rank,
                        other,
                        why,
                    })
                }
                OwnerCheck::Silent => {}
            }
            tracing::warn!(node_rank = rank, %other, "taking over the node rank of an agent that stopped heartbeating");
            expected = other;
        }
    }

    /// Whether the agent holding this node rank still heartbeats: its heartbeat key read every
    /// interval for the heartbeat budget (plus one interval), the job's closed key beside it.
    /// Each read is bounded, so a store host that went away cannot hold the duplicate.
    async fn owner_check(&self) -> OwnerCheck {
        let s = &self.settings;
        let (store, keys, rank) = (&self.store, &self.keys, self.node_rank);
        let until = Instant::now() + s.dead_after() + s.keep_alive_interval;
        let bound = s.heartbeat_timeout.max(s.keep_alive_interval);
        let read = || async move {
            let op = async {
                let hb = try_get(&**store, &keys.hb(rank)).await?;
                let closed = try_get(&**store, &keys.closed()).await?;
                Ok::<_, StoreOpError>((hb, closed))
            };
            match tokio::time::timeout(bound, op).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer in {}s", bound.as_secs_f64())),
            }
        };
        let over = |closed: &[u8]| {
            OwnerCheck::JobOver(match closed_reason(closed) {
                Some(why) => format!("that job has already ended ({why})"),
                None => "that job has already ended".into(),
            })
        };
        let gone = |e: String| {
            OwnerCheck::JobOver(format!(
                "that job's store went away while this agent checked it ({e}): the job ended"
            ))
        };
        let first = match read().await {
            Ok((_, Some(closed))) => return over(&closed),
            Ok((hb, None)) => hb,
            Err(e) => return gone(e),
        };
        loop {
            let now = Instant::now();
            if now >= until {
                return OwnerCheck::Silent;
            }
            tokio::time::sleep(s.keep_alive_interval.min(until - now)).await;
            match read().await {
                Ok((_, Some(closed))) => return over(&closed),
                Ok((hb, None)) if hb != first => return OwnerCheck::Alive,
                Ok(_) => {}
                Err(e) => return gone(e),
            }
        }
    }

    /// Gives the background keeper (heartbeats, monitoring) its own store connection.
    pub fn with_keeper_store(mut self, store: Arc<S>) -> Self {
        self.keeper_store = store;
        self
    }

    /// The next event of the running round (cancel-safe; pending while nothing happens).
    pub async fn watch(&mut self) -> RdzvEvent {
        self.keeper.next(self.round).await
    }

    fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn retry<T, Fut>(
        &self,
        deadline: Instant,
        op: impl FnMut() -> Fut,
    ) -> Result<T, RendezvousError>
    where
        Fut: std::future::Future<Output = Result<T, StoreOpError>>,
    {
        retry(&|| self.store.describe(), &|| self.lost(), deadline, op).await
    }

    /// Waits until all `nnodes` agents are in the same generation and returns this node's ranks.
    ///
    /// After a worker failure (or a lost peer) pass `WorkerFailure`/`PeerLost`: the first such
    /// call of a generation starts the next one for every node and is counted once.
    pub async fn next_round(&mut self, reason: RoundReason) -> Result<Assignment, RendezvousError> {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let started = Instant::now();
        let deadline = started + self.settings.timeout;
        self.claim_rank(deadline).await?;
        self.announce(deadline).await?;
        self.ensure_keeper();
        if let (Some(r), RoundReason::WorkerFailure | RoundReason::PeerLost) = (self.round, reason)
        {
            self.start_next_generation(r, deadline).await?;
        }
        let gen = self.wait_all_in(started, deadline).await?;
        self.assignment(gen, deadline).await
    }

    /// This node's heartbeat, host and `nproc` for the others to read (nproc last: its key is
    /// the one they wait for).
    async fn announce(&self, deadline: Instant) -> Result<(), RendezvousError> {
        let store = self.store.clone();
        let keys = self.keys.clone();
        let rank = self.node_rank;
        let nproc = self.nproc.to_string();
        let host = self.host.clone();
        self.retry(deadline, || {
            let (store, keys, nproc) = (store.clone(), keys.clone(), nproc.clone());
            let host = host.clone();
            async move {
                store.add(&keys.hb(rank), 1).await?;
                store.set(&keys.host(rank), host.as_bytes()).await?;
                store.set(&keys.nproc(rank), nproc.as_bytes()).await
            }
        })
        .await
    }

    /// Moves the generation from `r` to `r + 1` (compare-and-set: the first node after a failure
    /// does it, once for all).
    async fn start_next_generation(
        &self,
        r: u64,
        deadline: Instant,
    ) -> Result<(), RendezvousError> {
        let (store, keys) = (self.store.clone(), self.keys.clone());
        let (cur, next) = (r.to_string(), (r + 1).to_string());
        self.retry(deadline, || {
            let (store, keys, cur, next) = (store.clone(), keys.clone(), cur.clone(), next.clone());
            async move {
                store
                    .compare_set(&keys.gen(), cur.as_bytes(), next.as_bytes())
                    .await
            }
        })
        .await?;
        Ok(())
    }

    /// Arrives in the current generation and waits until every node is in (node 0 opens the
    /// round); returns the generation.
    async fn wait_all_in(
        &mut self,
        started: Instant,
        deadline: Instant,
    ) -> Result<u64, RendezvousError> {
        let store = self.store.clone();
        let rank = self.node_rank;
        let mut arrived_in: Option<u64> = None;
        // A status line while nodes are missing (issue 12), not silence until the timeout.
        let mut all_keys: Vec<String> = (0..self.nnodes).map(|r| self.keys.nproc(r)).collect();
        let mut looked = None; // the status line's last look (rendezvous::progress)
        loop {
            let gen = self.current_generation(deadline).await?;
            self.check_nnodes().await?;
            if arrived_in != Some(gen) {
                arrived_in = Some(gen);
                self.arrive(gen, deadline).await?;
            }
            all_keys.truncate(self.nnodes);
            // Node 0 opens the round (after the reset), the others wait for it to be open.
            all_keys.push(match rank {
                0 => self.keys.all_in(gen),
                _ => self.keys.go(gen),
            });
            let now = Instant::now();
            if now >= deadline {
                let joined = store.add(&self.keys.arrived(gen), 0).await.unwrap_or(0);
                return Err(RendezvousError::Timeout {
                    waited: now.duration_since(started),
                    joined: joined.max(0) as usize,
                    min: self.nnodes,
                });
            }
            super::progress::look_static(
                &*store,
                gen,
                &self.keys.arrived(gen),
                &all_keys[..self.nnodes],
                deadline,
                &mut looked,
            )
            .await;
            // A WAIT holds the store connection: shorter than the heartbeat period.
            let slice = self
                .settings
                .poll_interval
                .min(self.settings.keep_alive_interval)
                .min(deadline - now);
            match store.wait(&all_keys, slice).await {
                Ok(true) if rank == 0 => {
                    self.open_round(gen, deadline).await?;
                    return Ok(gen);
                }
                Ok(true) => return Ok(gen),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "waiting for the other nodes failed; retrying");
                    tokio::time::sleep(slice).await;
                }
            }
        }
    }

    /// The current generation (created as 0 by the first node); a closed job is its error.
    async fn current_generation(&self, deadline: Instant) -> Result<u64, RendezvousError> {
        let (store, keys) = (self.store.clone(), self.keys.clone());
        let (gen, closed) = self
            .retry(deadline, || {
                let (store, keys) = (store.clone(), keys.clone());
                async move {
                    let g = store.compare_set(&keys.gen(), b"", b"0").await?;
                    let closed = try_get(&*store, &keys.closed()).await?;
                    Ok((parse_u64(&g).unwrap_or(0), closed))
                }
            })
            .await?;
        if let Some(value) = closed {
            let rank = self.node_rank.to_string();
            ack_closed(&*store, &keys.closed_acks(), &rank).await;
            return Err(match closed_reason(&value) {
                Some(why) => RendezvousError::JobFailed(why),
                None => RendezvousError::Closed { redundant: false },
            });
        }
        Ok(gen)
    }

    /// Refuses a round whose nodes typed different `--nnodes`.
    async fn check_nnodes(&mut self) -> Result<(), RendezvousError> {
        // Before this node counts as arrived: its `--nnodes` is in the list before its
        // arrival is, so a node whose arrival completes the count (and opens the round)
        // reads every line of the nodes counted before it. Checked after the count, a node
        // could open the round and start its workers before a disagreeing node's line came
        // (seen once on a loaded machine: node 0 trained alone, node 1 failed).
        let (mine, who) = (
            self.nnodes.to_string(),
            format!("node rank {} on {}", self.node_rank, self.who),
        );
        let key = self.keys.nnodes();
        if let Ok(Some((other_node, other))) =
            nnodes_disagreement(&*self.store, &key, &mine, &who, &mut self.said_nnodes).await
        {
            return Err(RendezvousError::NnodesDisagree {
                mine,
                other_node,
                other,
            });
        }
        Ok(())
    }

    /// Counts this node as arrived in `gen`; the last to arrive marks everyone in.
    async fn arrive(&self, gen: u64, deadline: Instant) -> Result<(), RendezvousError> {
        let (store, keys) = (self.store.clone(), self.keys.clone());
        let n = self
            .retry(deadline, || {
                let (store, keys) = (store.clone(), keys.clone());
                async move { store.add(&keys.arrived(gen), 1).await }
            })
            .await?;
        if n == self.nnodes as i64 {
            store.set(&keys.all_in(gen), b"1").await?;
        }
        Ok(())
    }

    /// Node 0, every node in: clears the previous attempt's worker keys, then opens the round.
    async fn open_round(&self, gen: u64, deadline: Instant) -> Result<(), RendezvousError> {
        // Every agent arrived, so every worker of the previous attempt is gone: a clean
        // namespace for the new one before any of its workers can start.
        if let Some(reset) = &self.reset {
            let gone = reset();
            if gone > 0 {
                tracing::info!(
                    gone,
                    round = gen,
                    "cleared the previous attempt's worker keys from the store"
                );
            }
        }
        let (store, keys) = (self.store.clone(), self.keys.clone());
        self.retry(deadline, || {
            let (store, keys) = (store.clone(), keys.clone());
            async move { store.set(&keys.go(gen), b"1").await }
        })
        .await
    }

    /// This node's ranks in the open round `gen`, from every node's `nproc` and host.
    async fn assignment(
        &mut self,
        gen: u64,
        deadline: Instant,
    ) -> Result<Assignment, RendezvousError> {
        let store = self.store.clone();
        let all_keys: Vec<String> = (0..self.nnodes).map(|r| self.keys.nproc(r)).collect();
        let values = self
            .retry(deadline, || {
                let (store, all_keys) = (store.clone(), all_keys.clone());
                async move { store.multi_get(&all_keys).await }
            })
            .await?;
        let nprocs: Vec<usize> = values
            .iter()
            .map(|v| parse_u64(v).unwrap_or(0) as usize)
            .collect();
        // Every agent set its host before its nproc, so each host key exists now.
        let host_keys: Vec<String> = (0..self.nnodes).map(|r| self.keys.host(r)).collect();
        let hosts = self
            .retry(deadline, || {
                let (store, host_keys) = (store.clone(), host_keys.clone());
                async move { store.multi_get(&host_keys).await }
            })
            .await?;
        let (base, world) = base_rank(&nprocs, self.node_rank);
        self.round = Some(gen);
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(gen);
        Ok(Assignment {
            round: gen,
            group_rank: self.node_rank,
            group_world_size: self.nnodes,
            local_world_size: self.nproc,
            base_rank: base,
            world_size: world,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            restart_count: u32::try_from(gen).unwrap_or(u32::MAX),
            reason: if gen == 0 {
                RoundReason::Initial
            } else {
                RoundReason::WorkerFailure
            },
            store_prefix: self.keys.round_prefix(gen),
            uniform_nproc: nprocs.iter().all(|n| *n == self.nproc),
            nodes: hosts
                .iter()
                .map(|h| String::from_utf8_lossy(h).into_owned())
                .zip(nprocs)
                .collect(),
        })
    }

    /// Marks the job closed for every node (`reason`: `failed on node N`, `None` = finished; the
    /// first close wins) and stops this agent's heartbeats. A lost store fails at once.
    pub async fn close(&mut self, reason: Option<&str>) -> Result<(), RendezvousError> {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.keeper.stop();
        if let Some(why) = self.lost() {
            return Err(RendezvousError::StoreLost(why));
        }
        let value = reason.unwrap_or("1");
        self.store
            .compare_set(&self.keys.closed(), b"", value.as_bytes())
            .await?;
        ack_closed(
            &*self.store,
            &self.keys.closed_acks(),
            &self.node_rank.to_string(),
        )
        .await;
        Ok(())
    }

    /// Node ranks (but this one) that have not yet said they saw the close; empty when the store
    /// cannot be read.
    pub async fn unacked_close(&self) -> Vec<String> {
        let Some(acked) = closed_acks(&*self.store, &self.keys.closed_acks()).await else {
            return Vec::new();
        };
        (0..self.nnodes)
            .filter(|r| *r != self.node_rank)
            .map(|r| r.to_string())
            .filter(|r| !acked.contains(r))
            .collect()
    }

    /// This agent's poll period (how soon it notices a change such as a close).
    pub fn poll_interval(&self) -> Duration {
        self.settings
            .poll_interval
            .min(self.settings.keep_alive_interval)
    }

    fn ensure_keeper(&mut self) {
        let store = self.keeper_store.clone();
        let keys = self.keys.clone();
        let settings = self.settings.clone();
        let running = self.running.clone();
        let lost_flag = self.lost.clone();
        let tx = self.keeper.sender();
        let (me, nnodes) = (self.node_rank, self.nnodes);
        self.keeper.ensure(|| tokio::spawn(async move {
            let mut tracker = HeartbeatTracker::default();
            let mut done: Option<u64> = None;
            let mut loss = StoreLoss::new(Instant::now());
            let tick = settings.keep_alive_interval.min(settings.poll_interval);
            let mut next_beat = Instant::now();
            loop {
                let round = *running.lock().unwrap_or_else(|e| e.into_inner());
                if Instant::now() >= next_beat {
                    next_beat = Instant::now() + settings.keep_alive_interval;
                    match beat(&*store, &keys.hb(me), settings.heartbeat_timeout).await {
                        Ok(()) => loss.ok(Instant::now()),
                        Err(e) => {
                            let lost = loss.failed(
                                Instant::now(),
                                settings.keep_alive_interval,
                                settings.keep_alive_max_attempt,
                            );
                            tracing::warn!(
                                failures = loss.failures(),
                                error = %e,
                                "rendezvous heartbeat failed"
                            );
                            if lost {
                                *lost_flag.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some(e.clone());
                                if let Some(r) = round {
                                    let _ = tx.send((r, RdzvEvent::StoreUnreachable(e)));
                                }
                                // Fatal: nothing left to beat or watch.
                                return;
                            }
                        }
                    }
                }
                if let Some(r) = round.filter(|r| done != Some(*r)) {
                    let check = async {
                        if let Some(value) = try_get(&*store, &keys.closed()).await? {
                            ack_closed(&*store, &keys.closed_acks(), &me.to_string()).await;
                            return Ok::<_, StoreOpError>(Some(match closed_reason(&value) {
                                Some(why) => RdzvEvent::JobFailed(why),
                                None => RdzvEvent::Closed,
                            }));
                        }
                        let g = try_get(&*store, &keys.gen())
                            .await?
                            .and_then(|g| parse_u64(&g));
                        if let Some(g) = g.filter(|g| *g != r) {
                            return Ok(Some(RdzvEvent::RoundChanged {
                                round: g,
                                reason: RoundReason::WorkerFailure,
                            }));
                        }
                        let ids: Vec<usize> = (0..nnodes).filter(|i| *i != me).collect();
                        let hb_keys: Vec<String> = ids.iter().map(|i| keys.hb(*i)).collect();
                        let values = store.multi_get(&hb_keys).await?;
                        let beats = ids.iter().map(|i| i.to_string()).zip(values).collect();
                        let dead = tracker.observe(Instant::now(), beats, settings.dead_after());
                        Ok((!dead.is_empty()).then_some(RdzvEvent::PeersLost(dead)))
                    };
                    match check.await {
                        Ok(Some(ev)) => {
                            done = Some(r);
                            tracker = HeartbeatTracker::default();
                            let _ = tx.send((r, ev));
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "monitoring the static rendezvous failed")
                        }
                    }
                }
                tokio::time::sleep(tick).await;
            }
        }));
    }
}

#[cfg(test)]
#[path = "static_dup_tests.rs"]
mod dup_tests;

#[cfg(test)]
#[path = "static_tests.rs"]
mod tests;
