//! [`EtcdRendezvous`]: the round protocol of the etcd backend.
//!
//! The decisions are `state.rs`'s ([`join_step`], [`prune_dead`], [`assignment`]), so joins,
//! last calls, scale-up and scale-down follow exactly the c10d rules. What this file changes is
//! the medium:
//! - **state**: the round state (`RdzvState` JSON) in `<prefix>/<run_id>/state`, written only by
//!   a transaction that compares the key's `mod_revision` with the one just read;
//! - **membership**: one key per agent, `alive/<node id>`, attached to the agent's lease; a
//!   background keeper renews the lease every TTL/3. An agent that dies stops renewing, etcd
//!   deletes its key when the lease expires, and every other agent sees the DELETE on its watch
//!   of the run's prefix (no heartbeat counters are polled);
//! - **per-node data in per-node keys**: join announcements (`joiners/<round>/<id>`), the
//!   `--nnodes` each agent was given (`nnodes/<id>`), the exit barrier (`barrier/<round>/<id>`),
//!   all leased, so a dead agent's keys vanish with it;
//! - **waiting**: a watch of the prefix from the revision of the last read wakes the join loop,
//!   the keeper and the exit barrier, so nothing between a read and the watch is missed.
//!
//! There is no rendezvous store host: losing any agent, the workers' store host included, is a
//! lost peer (a new round without it, not charged to the restart budget); losing etcd's quorum
//! is [`RdzvEvent::StoreUnreachable`] once the lease could not be renewed for a whole TTL.
//!
//! The background keeper (lease renewal, the watch of the running round) is `driver/keeper.rs`;
//! the steps of the join loop are `driver/join.rs`;
//! the shared plumbing is `plumbing.rs`, the key spellings `keys::etcd`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::Etcd;
use super::EtcdSettings;
use crate::rendezvous::c10d::RoundRequest;
use crate::rendezvous::error::RendezvousError;
use crate::rendezvous::keys::etcd::Keys;
use crate::rendezvous::plumbing::{
    closed_event, lock, nnodes_text, watched_ids, RdzvEvent, SharedRef,
};
use crate::rendezvous::state::{
    self, assignment, join_step, prune_dead, Assignment, JoinStep, JoinView, Member, RdzvState,
    RoundReason, NO_STATE,
};
use crate::rendezvous::store::StoreOpError;

mod join;
mod keeper;
mod leave;
use join::LastCall;
use keeper::Keeper;

/// The watched ids without an alive key (their lease expired or was revoked).
fn dead_among(state: &RdzvState, me: &str, alive: &HashSet<String>) -> Vec<String> {
    watched_ids(state, me)
        .into_iter()
        .filter(|id| !alive.contains(id))
        .collect()
}

/// Reads the state: the decoded state and the `mod_revision` to compare against.
async fn read_state(etcd: &Etcd, keys: &Keys) -> Result<(RdzvState, i64, i64), RendezvousError> {
    let r = etcd.get(&keys.state()).await?;
    let state = RdzvState::decode(r.value.as_deref().unwrap_or(NO_STATE))?;
    Ok((state, r.mod_revision, r.revision))
}

async fn alive_ids(etcd: &Etcd, keys: &Keys) -> Result<HashSet<String>, StoreOpError> {
    let (kvs, _) = etcd.get_prefix(&keys.alive_prefix()).await?;
    Ok(kvs.into_iter().map(|(k, _)| k).collect())
}

/// A watch of the run's prefix that wakes a waiter; re-created after an error.
struct Waker {
    etcd: Etcd,
    prefix: String,
    stream: Option<etcd_client::WatchStream>,
    /// The next revision to watch from.
    next: i64,
}

impl Waker {
    fn new(etcd: &Etcd, keys: &Keys, from: i64) -> Waker {
        Waker {
            etcd: etcd.clone(),
            prefix: keys.base().to_string(),
            stream: None,
            next: from,
        }
    }

    /// Waits until something under the prefix changed since `next`, or `max` passed.
    /// Returns the events seen (empty on a timeout or an error).
    async fn wait(&mut self, max: Duration) -> Vec<etcd_client::Event> {
        let until = Instant::now() + max;
        if self.stream.is_none() {
            match self.etcd.watch_prefix(&self.prefix, self.next).await {
                Ok(s) => self.stream = Some(s),
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch failed; retrying");
                    tokio::time::sleep_until(
                        until.min(Instant::now() + Duration::from_millis(200)),
                    )
                    .await;
                    return Vec::new();
                }
            }
        }
        let stream = self.stream.as_mut().expect("set above");
        loop {
            match tokio::time::timeout_at(until, stream.message()).await {
                Err(_) => return Vec::new(),
                Ok(Ok(Some(resp))) => {
                    if resp.canceled() {
                        // Compacted or cut off from the leader: re-read and watch anew.
                        tracing::debug!(reason = resp.cancel_reason(), "etcd watch cancelled");
                        self.stream = None;
                        if resp.compact_revision() > self.next {
                            self.next = resp.compact_revision();
                        }
                        return Vec::new();
                    }
                    if resp.created() && resp.events().is_empty() {
                        continue;
                    }
                    let events = resp.events().to_vec();
                    if let Some(kv) = events.last().and_then(|e| e.kv()) {
                        self.next = self.next.max(kv.mod_revision() + 1);
                    }
                    if events.is_empty() {
                        continue;
                    }
                    return events;
                }
                Ok(Ok(None)) | Ok(Err(_)) => {
                    self.stream = None;
                    return Vec::new();
                }
            }
        }
    }
}

/// One agent's handle on the etcd rendezvous (same loop shape as `C10dRendezvous`).
pub struct EtcdRendezvous {
    etcd: Etcd,
    settings: EtcdSettings,
    keys: Keys,
    me: Member,
    lease: i64,
    my_round: Option<u64>,
    /// The other participants of `my_round` (who a later round may have dropped).
    round_peers: Vec<String>,
    shared: SharedRef,
    running_changed: Arc<Notify>,
    events_tx: mpsc::UnboundedSender<(u64, RdzvEvent)>,
    events_rx: mpsc::UnboundedReceiver<(u64, RdzvEvent)>,
    keeper: Option<JoinHandle<()>>,
}

impl Drop for EtcdRendezvous {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

impl EtcdRendezvous {
    /// Joins the membership: grants this agent's lease, writes its alive and `--nnodes` keys
    /// and starts the keeper (lease renewal, watching the running round).
    pub async fn start(
        etcd: Etcd,
        settings: EtcdSettings,
        run_id: &str,
        addr: &str,
        local_id: u32,
        nproc: usize,
    ) -> Result<EtcdRendezvous, RendezvousError> {
        let keys = Keys::new(&settings.prefix, run_id);
        let me = Member::new(addr, std::process::id(), local_id, nproc, 0);
        let lease = etcd.grant(settings.ttl).await?;
        let record = serde_json::to_vec(&me).expect("member serializes");
        etcd.put(&keys.alive(&me.id), record, Some(lease)).await?;
        let nnodes = nnodes_text(settings.rounds.min_nodes, settings.rounds.max_nodes);
        etcd.put(&keys.nnodes(&me.id), nnodes.into_bytes(), Some(lease))
            .await?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let mut r = EtcdRendezvous {
            etcd,
            settings,
            keys,
            me,
            lease,
            my_round: None,
            round_peers: Vec::new(),
            shared: Arc::default(),
            running_changed: Arc::new(Notify::new()),
            events_tx,
            events_rx,
            keeper: None,
        };
        let keeper = Keeper {
            etcd: r.etcd.clone(),
            settings: r.settings.clone(),
            keys: r.keys.clone(),
            me: r.me.id.clone(),
            lease,
            shared: r.shared.clone(),
            running_changed: r.running_changed.clone(),
            tx: r.events_tx.clone(),
        };
        r.keeper = Some(tokio::spawn(keeper.run()));
        Ok(r)
    }

    /// This agent's node id (`<addr>_<pid>_<local_id>`).
    pub fn node_id(&self) -> &str {
        &self.me.id
    }

    /// Nodes on the wait list as the keeper last saw them.
    pub fn num_nodes_waiting(&self) -> usize {
        lock(&self.shared).waiting
    }

    /// The next event of the round this agent runs (cancel-safe; older rounds' are dropped).
    pub async fn watch(&mut self) -> RdzvEvent {
        loop {
            let (round, ev) = self
                .events_rx
                .recv()
                .await
                .expect("the rendezvous keeps a sender alive");
            if Some(round) == self.my_round {
                return ev;
            }
        }
    }

    fn lost(&self) -> Option<RendezvousError> {
        lock(&self.shared)
            .lost
            .clone()
            .map(RendezvousError::StoreLost)
    }

    /// Retries `op` until it succeeds or `deadline` (then `Unreachable`, naming the members).
    async fn retry<T, F, Fut>(&self, deadline: Instant, op: F) -> Result<T, RendezvousError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, RendezvousError>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(RendezvousError::Store(e)) => {
                    if let Some(lost) = self.lost() {
                        return Err(lost);
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(RendezvousError::Unreachable {
                            endpoint: format!("etcd {}", self.etcd.endpoints()),
                            waited: now.duration_since(started),
                            source: e,
                        });
                    }
                    tracing::debug!(error = %e, "etcd operation failed; retrying");
                    tokio::time::sleep(backoff.min(deadline - now)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Joins the next round and waits until it completes with this agent in it (see
    /// `C10dRendezvous::next_round`; the same rules). Its steps are in `driver/join.rs`.
    pub async fn next_round(&mut self, req: RoundRequest) -> Result<Assignment, RendezvousError> {
        lock(&self.shared).running = None;
        if let Some(lost) = self.lost() {
            return Err(lost);
        }
        self.me.master_port = req.master_port;
        let started = Instant::now();
        let join_timeout = self.settings.rounds.join_timeout;
        let mut deadline = started + join_timeout;
        let bump_from = self.my_round.map(|r| {
            let reason = match req.reason {
                RoundReason::Initial => RoundReason::Membership,
                other => other,
            };
            (r, reason)
        });
        let (min, max) = (
            self.settings.rounds.min_nodes,
            self.settings.rounds.max_nodes,
        );
        let mut last_call = LastCall::default();
        let mut announced: Option<u64> = None;
        let mut lost_races = 0u32;
        let mut waker: Option<Waker> = None;
        loop {
            let (state, seen, revision) = self
                .retry(deadline, || read_state(&self.etcd, &self.keys))
                .await?;
            let waker =
                waker.get_or_insert_with(|| Waker::new(&self.etcd, &self.keys, revision + 1));
            let now = Instant::now();
            let id = self.me.id.clone();
            if state.complete && state.in_redundancy_list(&id) && state.participants.len() >= max {
                deadline = now + join_timeout;
            }
            let mut wake_at = deadline.min(now + Duration::from_secs(1));
            let timeout = self.settings.rounds.last_call_timeout;
            let last_call_expired = last_call.expired(&state, &id, min, now, timeout, &mut wake_at);
            let pending = self.pending_joiners(&state, &mut announced).await;
            let view = JoinView {
                me: &self.me,
                min,
                max,
                past_deadline: now >= deadline,
                last_call_expired,
                bump_from,
                pending: &pending,
            };
            let write = match join_step(&state, &view) {
                JoinStep::Done => return Ok(self.round_complete(&state)),
                JoinStep::Closed { redundant } => {
                    return Err(match &state.closed_reason {
                        Some(why) if !redundant => RendezvousError::JobFailed(why.clone()),
                        _ => RendezvousError::Closed { redundant },
                    });
                }
                JoinStep::TimedOut(leave) => {
                    if let Some(new) = leave {
                        let _ = self
                            .etcd
                            .compare_and_set(&self.keys.state(), seen, new.encode())
                            .await;
                    }
                    return Err(RendezvousError::Timeout {
                        waited: now.duration_since(started),
                        joined: state.participants.len(),
                        min,
                    });
                }
                JoinStep::Write(new) => Some(new),
                JoinStep::Wait => self.while_waiting(&state, seen, min, max).await?,
            };
            match write {
                Some(new) => self.write_state(seen, new, &mut lost_races).await,
                None => {
                    let left = wake_at.saturating_duration_since(Instant::now());
                    waker.wait(left.max(Duration::from_millis(10))).await;
                }
            }
        }
    }

    /// The exit barrier over etcd: a leased `barrier/<round>/<id>` key per agent; waits until
    /// the round's group world size arrived, `timeout` passed, or the job ended elsewhere
    /// (`ends` says which events end the wait, with why).
    pub async fn exit_barrier(
        &mut self,
        asg: &Assignment,
        timeout: Duration,
        ends: fn(RdzvEvent) -> Option<String>,
    ) -> Result<(), RendezvousError> {
        let prefix = self.keys.barrier(asg.round);
        let deadline = Instant::now() + timeout;
        let key = self.keys.barrier_entry(asg.round, &self.me.id);
        self.retry(deadline, || async {
            Ok(self.etcd.put(&key, b"1".to_vec(), Some(self.lease)).await?)
        })
        .await?;
        let mut waker: Option<Waker> = None;
        let mut arrived = 0usize;
        let done = self.keys.barrier_done(asg.round);
        loop {
            if let Ok((kvs, revision)) = self.etcd.get_prefix(&prefix).await {
                arrived = kvs.len();
                if arrived >= asg.group_world_size {
                    // Before this agent closes and revokes its lease (its barrier key goes with
                    // it): an agent still waiting then finds the barrier complete, not a peer
                    // gone or the rendezvous closed (issue 25: an ERROR line on success).
                    let _ = self.etcd.put(&done, b"1".to_vec(), None).await;
                    return Ok(());
                }
                if waker.is_none() {
                    waker = Some(Waker::new(&self.etcd, &self.keys, revision + 1));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RendezvousError::BarrierTimeout {
                    waited: timeout,
                    arrived: arrived as i64,
                    expected: asg.group_world_size,
                });
            }
            let slice = (deadline - now).min(Duration::from_secs(1));
            let Some(w) = waker.as_mut() else {
                tokio::time::sleep(slice.min(Duration::from_millis(200))).await;
                continue;
            };
            let my_round = self.my_round;
            let rx = &mut self.events_rx;
            let ev = tokio::select! {
                _ = w.wait(slice) => None,
                ev = async {
                    loop {
                        let (round, ev) = rx.recv().await.expect("the rendezvous keeps a sender");
                        if Some(round) == my_round {
                            return ev;
                        }
                    }
                } => Some(ev),
            };
            if let Some(ev) = ev {
                // The count first: the last agent's close follows its complete barrier; an
                // agent that saw it complete has marked it done before it closed and left.
                if let Ok((kvs, _)) = self.etcd.get_prefix(&prefix).await {
                    if kvs.len() >= asg.group_world_size {
                        return Ok(());
                    }
                }
                if let Ok(r) = self.etcd.get(&done).await {
                    if r.value.is_some() {
                        return Ok(());
                    }
                }
                if let Some(why) = ends(ev) {
                    return Err(RendezvousError::BarrierEnded(why));
                }
            }
        }
    }

    /// Marks the rendezvous closed (with why, when this node gave up) within `close_timeout`,
    /// then revokes this agent's lease (its keys vanish at once) and stops the keeper.
    pub async fn close(&mut self, reason: Option<&str>) -> Result<(), RendezvousError> {
        lock(&self.shared).running = None;
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if let Some(lost) = self.lost() {
            return Err(lost);
        }
        let deadline = Instant::now() + self.settings.rounds.close_timeout;
        let key = self.keys.state();
        let res = loop {
            let (st, seen, _) = match self
                .retry(deadline, || read_state(&self.etcd, &self.keys))
                .await
            {
                Ok(v) => v,
                Err(e) => break Err(e),
            };
            if st.closed {
                break Ok(());
            }
            let desired = state::close(&st, reason).encode();
            if let Ok(true) = self.etcd.compare_and_set(&key, seen, desired).await {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(RendezvousError::Unreachable {
                    endpoint: format!("etcd {}", self.etcd.endpoints()),
                    waited: self.settings.rounds.close_timeout,
                    source: StoreOpError("could not mark the rendezvous closed".into()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20 + fastrand::u64(0..80))).await;
        };
        self.etcd.revoke(self.lease).await;
        res
    }

    /// How soon this agent notices a change (events arrive by watch).
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    /// The peers of the round this agent ran that are gone by `state`, a later round: those it
    /// dropped as lost, else those whose alive keys are gone (a later round for another reason
    /// is typically a survivor's that saw the lease expire first and regrouped as a membership
    /// change; before, this case returned none and a failure next to the loss was charged, a
    /// race between the survivors seen in `etcd::sigkilled_node_whose_peers_fail_is_not_charged`).
    async fn lost_by(&self, state: &RdzvState) -> Result<Vec<String>, StoreOpError> {
        let dropped = crate::rendezvous::plumbing::dropped_by(&self.round_peers, state);
        if !dropped.is_empty() {
            return Ok(dropped);
        }
        let leases = self.etcd.leases_under(&self.keys.alive_prefix()).await?;
        Ok(lost_in_later_round(&self.round_peers, &leases))
    }

    /// The peers of the round this agent ran that a later round knows are gone (issue 38 item
    /// 4: a node that learned of the loss from the new round, not from its own keeper); empty
    /// while that round still runs, once the rendezvous is closed, or when etcd does not answer.
    pub async fn lost_since_round(&self) -> Vec<String> {
        let Some(round) = self.my_round else {
            return Vec::new();
        };
        match read_state(&self.etcd, &self.keys).await {
            Ok((state, _, _)) if !state.closed && state.round != round => {
                self.lost_by(&state).await.unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// After this agent's workers failed, before the failure is charged: which peers of the
    /// running round are lost (issue 17.7, as `C10dRendezvous::lost_peers_after_failure`). A
    /// SIGKILLed node makes its peers' collectives fail seconds before its lease expires, so
    /// the failure alone cannot say whether a node died. Follows each peer's lease: a peer is
    /// alive once a renewal of its lease is seen ([`renewed`]), lost once its alive key is
    /// deleted or its lease is gone. Bounded by the lease TTL + 1 s (the TTL's resolution) + a
    /// poll: a dead peer's lease has expired by then, so a peer still not seen renewing counts
    /// as lost. A close, a lost etcd, or another agent's new round returns empty (`next_round`
    /// deals with it), except a round started because peers' leases expired: those peers.
    pub async fn lost_peers_after_failure(&mut self) -> Vec<String> {
        let Some(round) = self.my_round else {
            return Vec::new();
        };
        let tick = self.poll_interval();
        let deadline = Instant::now() + self.settings.ttl + Duration::from_secs(1) + tick;
        let mut watch = LeaseWatch::default();
        // Every request is bounded by the deadline too (one etcd request may take 5 s).
        let limit = deadline + tick;
        // Issue 24.2: with a member of the etcd cluster down (its leader, say), a request that
        // the client sends to that member fails at once, while the others answer. A failed
        // read is retried until the deadline, never taken as "no peer lost": charging on the
        // first error made a minority of etcd members decide how a node loss is attributed.
        let mut failed_reads = 0u32;
        // The peers of the round as last read: at the deadline, those not seen renewing are lost
        // even when the last reads failed.
        let mut last_ids: Option<Vec<String>> = None;
        loop {
            if failed_reads > 0 && Instant::now() >= deadline {
                let Some(ids) = last_ids else {
                    tracing::debug!(
                        "17.7 wait: etcd did not answer until the deadline; the failure is charged"
                    );
                    return Vec::new();
                };
                return watch.not_renewing(ids);
            }
            let (ids, leases) = match self.look_at_round(round, limit, &mut last_ids).await {
                RoundLook::Peers(ids, leases) => (ids, leases),
                RoundLook::Done(lost) => return lost,
                RoundLook::Failed(what, e) => {
                    failed_reads += 1;
                    tracing::debug!(what, error = %e, failed_reads, "17.7 wait: a read failed; retrying");
                    tokio::time::sleep(tick).await;
                    continue;
                }
            };
            let lost = watch.look(&self.etcd, &ids, &leases, limit).await;
            if !lost.is_empty() {
                tracing::debug!(?lost, "etcd leases of peers gone after a worker failure");
                return lost;
            }
            if ids.iter().all(|id| watch.renewing.contains(id)) {
                return Vec::new();
            }
            if Instant::now() >= deadline {
                return watch.not_renewing(ids);
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// One look of the 17.7 wait at the round: its peers (kept in `last_ids`) and their
    /// leases, or the wait's answer (closed, a later round, no answer within `limit`).
    async fn look_at_round(
        &self,
        round: u64,
        limit: Instant,
        last_ids: &mut Option<Vec<String>>,
    ) -> RoundLook {
        let state = match tokio::time::timeout_at(limit, read_state(&self.etcd, &self.keys)).await {
            Ok(Ok((state, _, _))) => state,
            Ok(Err(e)) => return RoundLook::Failed("round state", e.to_string()),
            Err(_) => {
                tracing::debug!("17.7 wait: cannot read the round state; the failure is charged");
                return RoundLook::Done(Vec::new());
            }
        };
        if state.closed {
            tracing::debug!("17.7 wait: the rendezvous is closed");
            return RoundLook::Done(Vec::new());
        }
        if state.round != round {
            let lost = match tokio::time::timeout_at(limit, self.lost_by(&state)).await {
                Ok(Ok(lost)) => lost,
                Ok(Err(e)) => return RoundLook::Failed("leases", e.to_string()),
                Err(_) => return RoundLook::Done(Vec::new()),
            };
            tracing::debug!(
                round = state.round,
                ?lost,
                "17.7 wait: a later round started"
            );
            return RoundLook::Done(lost);
        }
        let ids = watched_ids(&state, &self.me.id);
        *last_ids = Some(ids.clone());
        let alive_prefix = self.keys.alive_prefix();
        match tokio::time::timeout_at(limit, self.etcd.leases_under(&alive_prefix)).await {
            Ok(Ok(leases)) => RoundLook::Peers(ids, leases.into_iter().collect()),
            Ok(Err(e)) => RoundLook::Failed("leases", e.to_string()),
            Err(_) => {
                tracing::debug!("17.7 wait: cannot read the peers' leases; the failure is charged");
                RoundLook::Done(Vec::new())
            }
        }
    }
}

/// What one look of the 17.7 wait found.
enum RoundLook {
    /// The round's peers and the leases of the alive keys (id -> lease).
    Peers(Vec<String>, HashMap<String, i64>),
    /// The wait's answer: these peers are lost (none: the failure is charged).
    Done(Vec<String>),
    /// A read failed (what, the error): retried until the deadline.
    Failed(&'static str, String),
}

/// The 17.7 wait's view of the peers' leases across looks.
#[derive(Default)]
struct LeaseWatch {
    /// Per peer: its lease, the whole seconds it had left, and when that answer arrived.
    first: HashMap<String, (i64, i64, Instant)>,
    /// The peers seen renewing their lease (alive).
    renewing: HashSet<String>,
}

impl LeaseWatch {
    /// Looks at each peer of `ids` not yet seen renewing: returns those whose alive key or
    /// lease is gone; a renewal found moves a peer to `renewing`.
    async fn look(
        &mut self,
        etcd: &Etcd,
        ids: &[String],
        leases: &HashMap<String, i64>,
        limit: Instant,
    ) -> Vec<String> {
        let mut lost: Vec<String> = ids
            .iter()
            .filter(|id| !leases.contains_key(*id))
            .cloned()
            .collect();
        for id in ids {
            if self.renewing.contains(id) {
                continue;
            }
            let Some(&lease) = leases.get(id) else {
                continue;
            };
            let sent = Instant::now();
            let Ok(Ok(left)) = tokio::time::timeout_at(limit, etcd.lease_ttl(lease)).await else {
                continue;
            };
            if left < 0 {
                lost.push(id.clone());
                continue;
            }
            match self.first.get(id) {
                Some(&(l, was, at)) if l == lease => {
                    if renewed(was, left, sent.saturating_duration_since(at)) {
                        tracing::debug!(%id, lease, was, left, elapsed = ?sent.saturating_duration_since(at), "17.7 wait: lease renewed");
                        self.renewing.insert(id.clone());
                    }
                }
                _ => {
                    self.first.insert(id.clone(), (lease, left, Instant::now()));
                }
            }
        }
        lost
    }

    /// The peers of `ids` not seen renewing.
    fn not_renewing(&self, ids: Vec<String>) -> Vec<String> {
        ids.into_iter()
            .filter(|id| !self.renewing.contains(id))
            .collect()
    }
}

/// Whether a lease was renewed between two reads of its remaining TTL: `was` whole seconds left
/// at the first answer, `left` at a second request sent `elapsed` after that answer arrived
/// (`elapsed` is at most the time that passed on etcd between the two). Without a renewal the
/// true remaining time at the second read is under `was + 1 - elapsed`, and etcd's whole
/// seconds (it truncates) no more; so `left + elapsed >= was + 1` proves a renewal — but only
/// for `left >= 1`: etcd truncates toward zero, so a lease already expired (and not yet revoked
/// by its lessor) reads 0, which with a long enough `elapsed` would pass for a renewal (seen:
/// a SIGKILLed peer's lease read `was=2`, then `left=0` 3.02 s later, taken as alive).
fn renewed(was: i64, left: i64, elapsed: Duration) -> bool {
    left >= 1 && left as f64 + elapsed.as_secs_f64() >= (was + 1) as f64
}

/// The peers of an earlier round (`round_peers`) whose alive keys (`leases`: id, lease) are gone.
fn lost_in_later_round(round_peers: &[String], leases: &[(String, i64)]) -> Vec<String> {
    round_peers
        .iter()
        .filter(|id| !leases.iter().any(|(alive, _)| alive == *id))
        .cloned()
        .collect()
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
