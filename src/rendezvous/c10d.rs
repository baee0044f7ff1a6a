//! `--rdzv-backend=c10d`: rdrun's dynamic rendezvous driver over the shared store.
//!
//! The decisions live in `state.rs` (pure); this file does the I/O: reads the state key, writes
//! with compare-and-set, measures time with tokio's monotonic clock (so tests run on a paused,
//! injected clock), and runs a background keeper task per agent that
//! - writes this agent's heartbeat (`add(<prefix>/hb/<id>, 1)`) every `keep_alive_interval`;
//! - while this agent runs a round, reads the state's version counter every `poll_interval`
//!   (the state document itself only when the version moved) and turns what it sees into
//!   [`RdzvEvent`]s for the agent: another agent started a new round, nodes are waiting, the
//!   rendezvous was closed, a watched peer stopped heartbeating (then it starts the new round
//!   itself), the store became unreachable.
//!
//! Scale (issue 16): each node watches the heartbeats of two peers (its successors in group-rank
//! order, `state::watch_targets`), not all of them, and every poll reads O(1) keys; whoever finds
//! a peer dead drops it from the state, and the others learn it through the version. Before,
//! every node read the whole state and all n heartbeats every poll (O(n²) per poll interval):
//! at 1,000 simulated nodes the store fell behind and live nodes were declared dead.
//!
//! Liveness is judged by *change*: an observer remembers each peer's heartbeat counter and the
//! local instant it last changed; no change for `keep_alive_interval × keep_alive_max_attempt`
//! means dead. No wall clock is compared across machines (torchrun stores UTC times).
//!
//! Store keys (all under `rdrun.rendezvous.<run_id>`; torchrun uses `torch.rendezvous.<run_id>`):
//! `/state` (JSON, see `state.rs`), `/version` (counter bumped after every state write),
//! `/hb/<node id>` (decimal counter), `/suspects/<round>` (watchers of a stalled peer), `/nnodes/first`
//! and `/nnodes/conflict` (the `--nnodes` agreement check), `/complete/<round>` (set
//! when a round completes, so joined agents wait on it instead of polling), `/joiners/<round>`
//! (appended JSON lines: agents announcing themselves, admitted in batches), and per round
//! `rdrun.rendezvous.<run_id>.<round>/…` for agent keys such as the exit barrier.
//!
//! Length: about 1,030 lines before the tests (the version key and watched-peer selection of issue 16 included), for one responsibility, the c10d protocol over the
//! store (join, rounds, heartbeats, close, the redundancy list). The pure round logic is already
//! apart (`state`), and so is the plumbing it shares with `static_` (`plumbing`: events and
//! the keeper task, retry, heartbeats and liveness rules, close acknowledgements).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::RendezvousError;
use super::plumbing::{
    ack_closed, beat, closed_acks, closed_event, lock, nnodes_conflict, nnodes_text, retry,
    watched_ids, HeartbeatTracker, KeeperTask, RdzvEvent, SharedRef, StoreLoss,
};
use super::settings::C10dSettings;
use super::state::{
    self, assignment, join_step, prune_dead, watch_targets, Assignment, JoinStep, JoinView, Member,
    RdzvState, RoundReason, NO_STATE,
};
use super::store::{try_get, RdzvStore, StoreOpError};

/// What the agent asks for when it calls [`C10dRendezvous::next_round`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundRequest {
    /// Why the agent wants a (new) round; only matters if this agent is the one that starts it.
    pub reason: RoundReason,
    /// The port of the worker store this agent serves if it becomes group rank 0 (MASTER_PORT).
    pub master_port: u16,
}

/// Store keys of one run.
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
    run_id: String,
}

impl Keys {
    fn new(run_id: &str) -> Self {
        Self {
            prefix: format!("rdrun.rendezvous.{run_id}"),
            run_id: run_id.to_string(),
        }
    }
    fn state(&self) -> String {
        format!("{}/state", self.prefix)
    }
    fn hb(&self, id: &str) -> String {
        format!("{}/hb/{id}", self.prefix)
    }
    fn complete(&self, round: u64) -> String {
        format!("{}/complete/{round}", self.prefix)
    }
    /// torchrun's c10d state key (`torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py`).
    fn torch_state(&self) -> String {
        format!("torch.rendezvous.{}", self.run_id)
    }
    fn joiners(&self, round: u64) -> String {
        format!("{}/joiners/{round}", self.prefix)
    }
    /// Bumped (ADD 1) after every write of the state: monitors read this small counter every
    /// poll and the state document only when it moved.
    fn version(&self) -> String {
        format!("{}/version", self.prefix)
    }
    /// The first agent's `<nnodes> <id>` (see [`nnodes_conflict`]).
    fn nnodes_first(&self) -> String {
        format!("{}/nnodes/first", self.prefix)
    }
    /// The first agent's `<nnodes> <id>` that disagreed with `nnodes_first`.
    fn nnodes_conflict(&self) -> String {
        format!("{}/nnodes/conflict", self.prefix)
    }
    /// Counter of agents suspecting a watched peer of `round` (its heartbeat stalled): read by
    /// agents whose workers failed, which do not watch every peer themselves.
    fn suspects(&self, round: u64) -> String {
        format!("{}/suspects/{round}", self.prefix)
    }
    /// Appended `<id>\n` by every agent that learnt the rendezvous is closed.
    fn closed_acks(&self) -> String {
        format!("{}/closed_acks", self.prefix)
    }
}

/// Reads the state text without blocking and without changing an existing state.
async fn read_text<S: RdzvStore>(store: &S, key: &str) -> Result<Vec<u8>, StoreOpError> {
    store.compare_set(key, b"", NO_STATE).await
}

/// The state's version counter (empty before the first write).
async fn read_version<S: RdzvStore>(store: &S, keys: &Keys) -> Result<Vec<u8>, StoreOpError> {
    Ok(try_get(store, &keys.version()).await?.unwrap_or_default())
}

/// Writes the state with compare-and-set against `expected` and, when the write went through,
/// bumps the version so that every monitor reads the new state. Returns what compare_set did.
async fn write_state<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    expected: &[u8],
    desired: &[u8],
) -> Result<Vec<u8>, StoreOpError> {
    let got = store.compare_set(&keys.state(), expected, desired).await?;
    if got == desired {
        if let Err(e) = store.add(&keys.version(), 1).await {
            // Monitors see this write with the next one (or the next version bump).
            tracing::debug!(error = %e, "bumping the rendezvous state version failed");
        }
    }
    Ok(got)
}

/// Peers' heartbeats are judged by all-to-all watching up to this many nodes after a worker
/// failure ([`C10dRendezvous::lost_peers_after_failure`]); above it, by the watched few plus the
/// suspects counter (O(1) per node instead of O(n)).
const FULL_CHECK_MAX: usize = 256;

/// A watched peer whose heartbeat counter has not moved for this many keep-alive intervals is
/// published on the round's suspects counter by the keeper watching it (a live peer's counter
/// moves every interval; two allow for one poll that falls between two beats).
const SUSPECT_AFTER: u32 = 2;

/// A decimal counter's value (0 when it is not one).
fn parse_count(v: &[u8]) -> i64 {
    std::str::from_utf8(v)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The heartbeat counters of `ids` (each key exists: a node beats before it joins any list).
async fn read_beats<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    ids: Vec<String>,
) -> Result<Vec<(String, Vec<u8>)>, StoreOpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let hb_keys: Vec<String> = ids.iter().map(|id| keys.hb(id)).collect();
    let values = store.multi_get(&hb_keys).await?;
    Ok(ids.into_iter().zip(values).collect())
}

/// The announced joiners of a round: one JSON member per line, first announcement per id kept.
fn parse_joiners(list: &[u8]) -> Vec<Member> {
    let mut out: Vec<Member> = Vec::new();
    for line in list.split(|b| *b == b'\n') {
        if let Ok(m) = serde_json::from_slice::<Member>(line) {
            if !out.iter().any(|o| o.id == m.id) {
                out.push(m);
            }
        }
    }
    out
}

/// One agent's handle on the dynamic rendezvous.
///
/// Loop shape for the agent: `next_round` → start workers → `select!` over worker events and
/// `watch()` → on an event or a worker failure stop the workers → `next_round` again; at the end
/// `exit_barrier` (on success) and `close`.
pub struct C10dRendezvous<S: RdzvStore> {
    store: Arc<S>,
    /// The keeper's own connection: heartbeats must never queue behind a WAIT of the join loop
    /// or the exit barrier, or peers see them stall and declare this node dead.
    keeper_store: Arc<S>,
    settings: C10dSettings,
    keys: Keys,
    me: Member,
    my_round: Option<u64>,
    shared: SharedRef,
    keeper: KeeperTask,
    /// The first agent's `--nnodes` line, once read (see [`nnodes_conflict`]).
    nnodes_first: Option<String>,
    /// The other participants of the round this agent runs (ids).
    round_peers: Vec<String>,
    /// [`FULL_CHECK_MAX`] (lowered by tests to reach the large-world path with a few nodes).
    full_check_max: usize,
}

impl<S: RdzvStore> C10dRendezvous<S> {
    /// A handle for the agent at `addr` (the address peers reach it at) with `nproc` workers.
    /// `local_id` distinguishes several handles in one process (0 for a normal agent).
    pub fn new(
        store: Arc<S>,
        settings: C10dSettings,
        run_id: &str,
        addr: &str,
        local_id: u32,
        nproc: usize,
    ) -> Self {
        Self {
            keeper_store: store.clone(),
            store,
            settings,
            keys: Keys::new(run_id),
            me: Member::new(addr, std::process::id(), local_id, nproc, 0),
            my_round: None,
            shared: Arc::default(),
            keeper: KeeperTask::new(),
            nnodes_first: None,
            round_peers: Vec::new(),
            full_check_max: FULL_CHECK_MAX,
        }
    }

    /// Gives the background keeper (heartbeats, monitoring) its own store connection.
    pub fn with_keeper_store(mut self, store: Arc<S>) -> Self {
        self.keeper_store = store;
        self
    }

    /// Overrides the pid of the node descriptor (simulated nodes in one process).
    pub fn with_pid(mut self, pid: u32) -> Self {
        self.me = Member::new(&self.me.addr, pid, self.me.local_id, self.me.nproc, 0);
        self
    }

    #[cfg(test)]
    fn with_full_check_max(mut self, n: usize) -> Self {
        self.full_check_max = n;
        self
    }

    /// This agent's node id (`<addr>_<pid>_<local_id>`).
    pub fn node_id(&self) -> &str {
        &self.me.id
    }

    /// Nodes on the wait list as last seen by the keeper (torchrun's `num_nodes_waiting()`,
    /// refreshed every `poll_interval`).
    pub fn num_nodes_waiting(&self) -> usize {
        lock(&self.shared).waiting
    }

    /// The next event of the round this agent runs. Pending forever while nothing happens;
    /// cancel-safe, so it can sit in a `select!`. Events of older rounds are dropped.
    pub async fn watch(&mut self) -> RdzvEvent {
        self.keeper.next(self.my_round).await
    }

    fn ensure_keeper(&mut self) {
        let keeper = Keeper {
            store: self.keeper_store.clone(),
            settings: self.settings.clone(),
            keys: self.keys.clone(),
            me: self.me.id.clone(),
            shared: self.shared.clone(),
            tx: self.keeper.sender(),
        };
        self.keeper.ensure(|| tokio::spawn(keeper.run()));
    }

    /// Joins the next round and waits until it completes with this agent in it.
    ///
    /// The first call joins round 0 (or the current round). A later call after this agent's
    /// workers failed (`RoundReason::WorkerFailure`) or to admit waiting nodes
    /// (`RoundReason::Membership`) starts a new round for every node, unless another agent already
    /// did; only a `WorkerFailure` start is charged to the job-wide restart count.
    pub async fn next_round(&mut self, req: RoundRequest) -> Result<Assignment, RendezvousError> {
        lock(&self.shared).running = None;
        self.me.master_port = req.master_port;
        let started = Instant::now();
        let join_timeout = self.settings.join_timeout;
        let mut deadline = started + join_timeout;
        // The heartbeat key exists before this node appears in any list (peers multi_get it).
        self.retry_store(deadline, |s, k| {
            let key = k.hb(&self.me.id);
            async move { s.add(&key, 1).await.map(|_| ()) }
        })
        .await?;
        self.ensure_keeper();
        let bump_from = self.my_round.map(|r| {
            let reason = match req.reason {
                RoundReason::Initial => RoundReason::Membership,
                other => other,
            };
            (r, reason)
        });
        let state_key = self.keys.state();
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let mut tracker = HeartbeatTracker::default();
        let mut last_call: Option<((u64, u64), Instant)> = None;
        let min_poll = Duration::from_millis(20).min(self.settings.poll_interval);
        let mut poll = min_poll;
        let mut lost = 0u32;
        let max_backoff = Duration::from_millis(100).min(self.settings.poll_interval);
        let mut announced: Option<u64> = None;
        let nnodes = nnodes_text(min, max);
        // The version read just before `text` (`None`: unknown, e.g. `text` came back from a
        // compare_set): while it is unchanged, `text` is current and is not read again.
        let mut text_version = read_version(&*self.store, &self.keys).await.ok();
        let mut text = self
            .retry_store(deadline, |s, _| {
                let key = state_key.clone();
                async move { read_text(&*s, &key).await }
            })
            .await?;
        // Decoded once per change of `text`, with what this loop asks of it on every pass (all
        // O(n) at n nodes, so not repeated while nothing changed).
        let mut cur = RdzvState::default();
        let mut dirty = true;
        let (mut me_in, mut me_redundant) = (false, false);
        let mut targets: Vec<String> = Vec::new();
        // The inputs of the last `join_step` that said Wait: the same state and inputs say it again.
        let mut waited_on: Option<(bool, bool, usize)> = None;
        loop {
            if dirty {
                cur = RdzvState::decode(&text)?;
                me_in = cur.is_participant(&self.me.id);
                me_redundant = cur.in_redundancy_list(&self.me.id);
                targets = watch_targets(&cur, &self.me.id);
                waited_on = None;
                dirty = false;
            }
            let state = &cur;
            let now = Instant::now();
            let id = self.me.id.as_str();
            // A redundant node waits without a deadline while the round is full (torchrun).
            if state.complete && me_redundant && state.participants.len() >= max {
                deadline = now + join_timeout;
            }
            let last_call_expired = if !state.complete && me_in && state.participants.len() >= min {
                let key = (state.round, state.last_call_seq);
                match last_call {
                    Some((k, since)) if k == key => {
                        now.duration_since(since) >= self.settings.last_call_timeout
                    }
                    _ => {
                        last_call = Some((key, now));
                        self.settings.last_call_timeout.is_zero()
                    }
                }
            } else {
                false
            };
            // Announce this agent for the round (once), and read who else did, so a writer can
            // admit every announced agent at once.
            let mut pending = Vec::new();
            if !state.complete && !state.closed && !me_in {
                let key = self.keys.joiners(state.round);
                if announced != Some(state.round) {
                    let mut line = serde_json::to_vec(&self.me).expect("member serializes");
                    line.push(b'\n');
                    if self.store.append(&key, &line).await.is_ok() {
                        announced = Some(state.round);
                    }
                }
                if let Ok(Some(list)) = try_get(&*self.store, &key).await {
                    pending = parse_joiners(&list);
                }
            }
            let view = JoinView {
                me: &self.me,
                min,
                max,
                past_deadline: now >= deadline,
                last_call_expired,
                bump_from,
                pending: &pending,
            };
            let inputs = (view.past_deadline, view.last_call_expired, pending.len());
            let step = if waited_on == Some(inputs) {
                JoinStep::Wait
            } else {
                join_step(state, &view)
            };
            waited_on = matches!(step, JoinStep::Wait).then_some(inputs);
            let write = match step {
                JoinStep::Done => {
                    let asg = assignment(state, id, &self.keys.prefix).expect(
                        "join_step returns Done only for a participant of a complete round",
                    );
                    self.my_round = Some(state.round);
                    self.round_peers = state
                        .participants
                        .iter()
                        .filter(|m| m.id != self.me.id)
                        .map(|m| m.id.clone())
                        .collect();
                    {
                        let mut sh = lock(&self.shared);
                        sh.running = Some(state.round);
                        sh.waiting = state.num_nodes_waiting();
                    }
                    // The agent logs the completed round at INFO (once per round).
                    tracing::debug!(round = asg.round, "c10d round complete");
                    return Ok(asg);
                }
                JoinStep::Closed { redundant } => {
                    ack_closed(&*self.store, &self.keys.closed_acks(), id).await;
                    return Err(match &state.closed_reason {
                        Some(why) if !redundant => RendezvousError::JobFailed(why.clone()),
                        _ => RendezvousError::Closed { redundant },
                    });
                }
                JoinStep::TimedOut(leave) => {
                    if let Some(new) = leave {
                        // Best effort: leave the lists so the others do not wait for us.
                        let _ = write_state(&*self.store, &self.keys, &text, &new.encode()).await;
                    }
                    return Err(RendezvousError::Timeout {
                        waited: now.duration_since(started),
                        joined: state.participants.len(),
                        min,
                    });
                }
                JoinStep::Write(new) => Some(new),
                JoinStep::Wait => {
                    super::progress::c10d(
                        state.round,
                        state.participants.len(),
                        min,
                        max,
                        deadline,
                    );
                    if let Ok(Some((other_node, other))) = nnodes_conflict(
                        &*self.store,
                        &self.keys.nnodes_first(),
                        &self.keys.nnodes_conflict(),
                        &nnodes,
                        id,
                        &mut self.nnodes_first,
                    )
                    .await
                    {
                        let mut new = state.clone();
                        new.remove_everywhere(id);
                        // Best effort: leave the lists so the others do not wait for us.
                        let _ = write_state(&*self.store, &self.keys, &text, &new.encode()).await;
                        return Err(RendezvousError::NnodesDisagree {
                            mine: nnodes,
                            other_node,
                            other,
                        });
                    }
                    // A PyTorch torchrun agent on the same endpoint and run id waits in a
                    // rendezvous of its own: say so instead of timing out much later.
                    if let Ok(Some(_)) = try_get(&*self.store, &self.keys.torch_state()).await {
                        return Err(RendezvousError::TorchrunPeer {
                            key: self.keys.torch_state(),
                        });
                    }
                    // While waiting, drop the watched peers that stopped heartbeating so the
                    // round can go on (each node watches a few, see `watch_targets`).
                    match read_beats(&*self.store, &self.keys, targets.clone()).await {
                        Ok(beats) => {
                            let dead = tracker.observe(now, beats, self.settings.dead_after());
                            if dead.is_empty() {
                                None
                            } else {
                                tracing::warn!(?dead, "dropping nodes that stopped heartbeating");
                                prune_dead(state, &dead, min, max)
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "reading heartbeats failed");
                            None
                        }
                    }
                }
            };
            // `Ok(None)`: `text` is still current.
            let next: Result<Option<Vec<u8>>, StoreOpError> = match write {
                Some(new) => {
                    let desired = new.encode();
                    match write_state(&*self.store, &self.keys, &text, &desired).await {
                        Ok(got) if got == desired => {
                            lost = 0;
                            poll = min_poll;
                            if new.complete && !state.complete {
                                // Wake the participants waiting on this round at once.
                                let _ = self.store.set(&self.keys.complete(new.round), b"1").await;
                            }
                            text_version = None;
                            Ok(Some(got))
                        }
                        Ok(got) => {
                            // Lost a race: back off a random while before retrying, so that many
                            // agents joining together do not all retry in lockstep (each lost
                            // attempt costs a full state transfer).
                            lost += 1;
                            let cap = Duration::from_millis(1u64 << lost.min(7)).min(max_backoff);
                            tokio::time::sleep(cap.mul_f64(fastrand::f64())).await;
                            tracing::debug!(lost, "rendezvous state changed under us; retrying");
                            text_version = None;
                            Ok(Some(got))
                        }
                        Err(e) => Err(e),
                    }
                }
                None => {
                    let mut completed = false;
                    if !state.complete && me_in {
                        // Joined and waiting: the completer sets the round's complete key.
                        let key = [self.keys.complete(state.round)];
                        // A WAIT holds the store connection: keep it shorter than the heartbeat
                        // period, or peers would see this agent's beats stall.
                        let slice = poll.min(self.settings.keep_alive_interval);
                        match self.store.wait(&key, slice).await {
                            Ok(done) => completed = done,
                            Err(e) => {
                                tracing::debug!(error = %e, "waiting for round completion failed");
                                tokio::time::sleep(poll).await;
                            }
                        }
                    } else {
                        tokio::time::sleep(poll).await;
                    }
                    // The state document is read again only when its version moved.
                    let read = async {
                        let v = read_version(&*self.store, &self.keys).await?;
                        if !completed && text_version.as_ref() == Some(&v) {
                            return Ok((v, None));
                        }
                        Ok((v, Some(read_text(&*self.store, &state_key).await?)))
                    };
                    match read.await {
                        Ok((v, got)) => {
                            text_version = Some(v);
                            let changed = got.as_ref().is_some_and(|g| *g != text);
                            // A joined node backs off regardless; a waiting one looks again
                            // soon after a change.
                            poll = if changed && (state.complete || !me_in) {
                                min_poll
                            } else {
                                (poll * 2).min(self.settings.poll_interval)
                            };
                            Ok(got)
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            let got = match next {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "rendezvous store error; retrying");
                    text_version = None;
                    Some(
                        self.retry_store(deadline, |s, _| {
                            let key = state_key.clone();
                            async move { read_text(&*s, &key).await }
                        })
                        .await?,
                    )
                }
            };
            if let Some(t) = got {
                if t != text {
                    text = t;
                    dirty = true;
                }
            }
        }
    }

    /// [`retry`] with this agent's store and keys.
    async fn retry_store<T, F, Fut>(&self, deadline: Instant, op: F) -> Result<T, RendezvousError>
    where
        F: Fn(Arc<S>, &Keys) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreOpError>>,
    {
        retry(
            &|| self.store.describe(),
            &|| lock(&self.shared).lost.clone(),
            deadline,
            || op(self.store.clone(), &self.keys),
        )
        .await
    }

    /// Marks the rendezvous closed for every node (torchrun's `shutdown()`), within
    /// `close_timeout`, and stops this agent's heartbeats. `reason` (`failed on node N`) tells
    /// the others why; `None` = the job finished. A store already found lost fails at once.
    pub async fn close(&mut self, reason: Option<&str>) -> Result<(), RendezvousError> {
        lock(&self.shared).running = None;
        self.keeper.stop();
        if let Some(why) = lock(&self.shared).lost.clone() {
            return Err(RendezvousError::StoreLost(why));
        }
        let deadline = Instant::now() + self.settings.close_timeout;
        let key = self.keys.state();
        let mut backoff = Duration::from_millis(20);
        loop {
            let text = self
                .retry_store(deadline, |s, _| {
                    let key = key.clone();
                    async move { read_text(&*s, &key).await }
                })
                .await?;
            let st = RdzvState::decode(&text)?;
            if st.closed {
                ack_closed(&*self.store, &self.keys.closed_acks(), &self.me.id).await;
                return Ok(());
            }
            let desired = state::close(&st, reason).encode();
            if let Ok(got) = write_state(&*self.store, &self.keys, &text, &desired).await {
                if got == desired {
                    ack_closed(&*self.store, &self.keys.closed_acks(), &self.me.id).await;
                    return Ok(());
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RendezvousError::Unreachable {
                    endpoint: self.store.describe(),
                    waited: self.settings.close_timeout,
                    source: StoreOpError("could not mark the rendezvous closed".into()),
                });
            }
            // Lost a race or the store failed: pause before the next try (issue 9).
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// The agents of the closed rendezvous that have not yet said they saw the close (every
    /// agent in the state but this one); empty when the store cannot be read.
    pub async fn unacked_close(&self) -> Vec<String> {
        let Ok(text) = read_text(&*self.store, &self.keys.state()).await else {
            return Vec::new();
        };
        let Ok(state) = RdzvState::decode(&text) else {
            return Vec::new();
        };
        let Some(acked) = closed_acks(&*self.store, &self.keys.closed_acks()).await else {
            return Vec::new();
        };
        state
            .watched_members(&self.me.id)
            .into_iter()
            .map(|m| m.id.clone())
            .filter(|id| !acked.contains(id))
            .collect()
    }

    /// This agent's poll period (how soon it notices a change such as a close).
    pub fn poll_interval(&self) -> Duration {
        self.settings.poll_interval
    }

    /// After this agent's workers failed, before the failure is charged: which peers of the
    /// running round are lost (issue 17.7). A SIGKILLed node makes its peers' collectives fail
    /// a second or so before any heartbeat budget runs out, so the failure alone cannot say
    /// whether a node died. Waits until every checked peer's heartbeat counter has moved since
    /// the call (all alive: returns empty, at most about one keep-alive interval later), or the
    /// keeper drops a peer that stopped beating (returns it), bounded by the heartbeat budget
    /// plus two polls; a peer still silent at that bound counts as lost. Any other change (a
    /// close, a lost store, another node's new round) returns empty: `next_round` deals with it.
    ///
    /// Up to [`FULL_CHECK_MAX`] nodes every peer is checked. Above, only the peers this node
    /// watches (`watch_targets`) are, which keeps a failure of every node at once O(n) in all
    /// instead of O(n²): the others' watchers publish a stalled peer on the round's suspects
    /// counter (their keepers, and this same call on their nodes), so "all alive" also waits
    /// until two keep-alive intervals plus two polls have passed with no suspect.
    pub async fn lost_peers_after_failure(&mut self) -> Vec<String> {
        let Some(round) = self.my_round else {
            return Vec::new();
        };
        let key = self.keys.state();
        let state = match read_text(&*self.store, &key).await {
            Ok(text) => match RdzvState::decode(&text) {
                Ok(st) => st,
                Err(_) => return Vec::new(),
            },
            Err(_) => return Vec::new(),
        };
        if state.closed {
            return Vec::new();
        }
        if state.round != round {
            // Another node already moved on: a loss if it dropped peers of this round.
            return super::plumbing::dropped_by(&self.round_peers, &state);
        }
        let full = state.participants.len() <= self.full_check_max;
        let ids = if full {
            watched_ids(&state, &self.me.id)
        } else {
            watch_targets(&state, &self.me.id)
        };
        if full && ids.is_empty() {
            return Vec::new();
        }
        let Ok(first) = read_beats(&*self.store, &self.keys, ids.clone()).await else {
            return Vec::new();
        };
        let first: HashMap<String, Vec<u8>> = first.into_iter().collect();
        let mut alive: HashSet<String> = HashSet::new();
        let interval = self.settings.keep_alive_interval;
        let tick = (interval / 4).max(Duration::from_millis(10));
        let t0 = Instant::now();
        let deadline = t0 + self.settings.dead_after() + 2 * self.settings.poll_interval;
        // Beyond FULL_CHECK_MAX: when to suspect a silent watched peer, and when "no suspect
        // anywhere" is believed (the other watchers' keepers suspect after SUSPECT_AFTER).
        let suspect_at = t0 + interval.mul_f64(1.25);
        // A watcher sees the last beat of a killed peer up to a poll late and suspects it up to
        // a poll after SUSPECT_AFTER intervals of silence: up to this long after the kill.
        let settle_at = t0 + interval * SUSPECT_AFTER + 2 * self.settings.poll_interval + tick;
        let suspects = self.keys.suspects(round);
        let mut suspecting = false;
        let lost = loop {
            let mut ev_out = None;
            while let Some(ev) = self.keeper.try_next(round) {
                match ev {
                    RdzvEvent::PeersLost(lost) => {
                        ev_out = Some(lost);
                        break;
                    }
                    RdzvEvent::NodesWaiting(_) => {}
                    RdzvEvent::RoundChanged { .. } => {
                        let dropped = match read_text(&*self.store, &key).await {
                            Ok(text) => RdzvState::decode(&text)
                                .map(|st| super::plumbing::dropped_by(&self.round_peers, &st))
                                .unwrap_or_default(),
                            Err(_) => Vec::new(),
                        };
                        ev_out = Some(dropped);
                        break;
                    }
                    _ => {
                        ev_out = Some(Vec::new());
                        break;
                    }
                }
            }
            if let Some(lost) = ev_out {
                break lost;
            }
            let silent: Vec<String> = ids
                .iter()
                .filter(|i| !alive.contains(*i))
                .cloned()
                .collect();
            if !silent.is_empty() {
                if let Ok(now) = read_beats(&*self.store, &self.keys, silent).await {
                    for (id, v) in now {
                        if first.get(&id).is_some_and(|f| *f != v) {
                            alive.insert(id);
                        }
                    }
                }
            }
            let now = Instant::now();
            let all_alive = alive.len() == ids.len();
            if !full {
                if !all_alive && !suspecting && now >= suspect_at {
                    suspecting = self.store.add(&suspects, 1).await.is_ok();
                } else if all_alive && suspecting && self.store.add(&suspects, -1).await.is_ok() {
                    suspecting = false;
                }
            }
            if all_alive {
                if full {
                    break Vec::new();
                }
                if now >= settle_at {
                    match try_get(&*self.store, &suspects).await {
                        Ok(Some(v)) if parse_count(&v) > 0 => {}
                        _ => break Vec::new(),
                    }
                }
            }
            if now >= deadline {
                break ids
                    .iter()
                    .filter(|id| !alive.contains(*id))
                    .cloned()
                    .collect();
            }
            tokio::time::sleep(tick).await;
        };
        if suspecting {
            let _ = self.store.add(&suspects, -1).await;
        }
        lost
    }
}

/// The background task of one agent: heartbeats, and monitoring of the round it runs.
struct Keeper<S: RdzvStore> {
    store: Arc<S>,
    settings: C10dSettings,
    keys: Keys,
    me: String,
    shared: SharedRef,
    tx: mpsc::UnboundedSender<(u64, RdzvEvent)>,
}

/// What the keeper last read of the round it monitors: the state text at `version`, decoded,
/// and the peers this node watches in it.
struct Seen {
    version: Vec<u8>,
    text: Vec<u8>,
    state: RdzvState,
    targets: Vec<String>,
}

/// The keeper's monitoring memory for one round.
struct Monitor {
    round: u64,
    /// The waiting count last reported.
    waiting: usize,
    /// The round ended (another round, a close): nothing more to report for it.
    ended: bool,
    seen: Option<Seen>,
    tracker: HeartbeatTracker,
    /// This keeper counts itself on the round's suspects counter.
    suspecting: bool,
}

impl<S: RdzvStore> Keeper<S> {
    async fn run(self) {
        let interval = self.settings.keep_alive_interval;
        let poll = self.settings.poll_interval;
        let tick = interval.min(poll);
        let hb_key = self.keys.hb(&self.me);
        let mut next_beat = Instant::now();
        let mut next_poll = Instant::now();
        let mut loss = StoreLoss::new(Instant::now());
        let mut mon: Option<Monitor> = None;
        loop {
            let now = Instant::now();
            let running = lock(&self.shared).running;
            if now >= next_beat {
                next_beat = now + interval;
                let lost = match beat(&*self.store, &hb_key, self.settings.heartbeat_timeout).await
                {
                    Ok(()) => {
                        loss.ok(Instant::now());
                        false
                    }
                    Err(why) => self.beat_failed(&mut loss, running, why),
                };
                if lost {
                    // Fatal (no node can take the store over): nothing left to beat or watch.
                    return;
                }
            }
            if let Some(round) = running {
                // A suspicion stays on the counter of a round that ended: it is the round's
                // record that a peer stalled (read by `lost_peers_after_failure`).
                if mon.as_ref().map(|m| m.round) != Some(round) {
                    mon = Some(Monitor {
                        round,
                        waiting: 0,
                        ended: false,
                        seen: None,
                        tracker: HeartbeatTracker::default(),
                        suspecting: false,
                    });
                }
                let m = mon.as_mut().expect("just set");
                if now >= next_poll && !m.ended {
                    next_poll = now + poll;
                    if let Err(e) = self.monitor(m).await {
                        tracing::debug!(error = %e, "monitoring the rendezvous failed");
                    }
                }
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// Records a failed beat; true once the store counts as lost (then it is recorded for
    /// `next_round`/`close`, and reported to a running round).
    fn beat_failed(&self, loss: &mut StoreLoss, running: Option<u64>, why: String) -> bool {
        let lost = loss.failed(
            Instant::now(),
            self.settings.keep_alive_interval,
            self.settings.keep_alive_max_attempt,
        );
        tracing::warn!(failures = loss.failures(), error = %why, "rendezvous heartbeat failed");
        if lost {
            lock(&self.shared).lost = Some(why.clone());
            if let Some(round) = running {
                let _ = self.tx.send((round, RdzvEvent::StoreUnreachable(why)));
            }
        }
        lost
    }

    /// One poll of the running round: the version counter and the heartbeats of the few watched
    /// peers (one multi_get); the state only when the version moved. A watched peer found dead is
    /// dropped from the state (which every other node then sees through the version).
    async fn monitor(&self, m: &mut Monitor) -> Result<(), StoreOpError> {
        let round = m.round;
        let key = self.keys.state();
        // Once the version key is known to exist (keys are never removed), the version and the
        // watched heartbeats are one multi_get: two requests per node per poll with the beat.
        let (version, mut beats) = match &m.seen {
            Some(s) if !s.version.is_empty() && s.state.round == round => {
                let mut keys = vec![self.keys.version()];
                keys.extend(s.targets.iter().map(|id| self.keys.hb(id)));
                let mut values = self.store.multi_get(&keys).await?;
                let version = values.remove(0);
                let beats: Vec<(String, Vec<u8>)> = s.targets.iter().cloned().zip(values).collect();
                (version, Some(beats))
            }
            _ => (read_version(&*self.store, &self.keys).await?, None),
        };
        let fresh = m
            .seen
            .as_ref()
            .map_or(true, |s| s.version != version || s.state.round != round);
        if fresh {
            let text = read_text(&*self.store, &key).await?;
            let Ok(state) = RdzvState::decode(&text) else {
                return Ok(());
            };
            let send = |ev| {
                let _ = self.tx.send((round, ev));
            };
            if state.closed {
                m.ended = true;
                ack_closed(&*self.store, &self.keys.closed_acks(), &self.me).await;
                send(closed_event(&state));
                return Ok(());
            }
            if state.round != round {
                m.ended = true;
                send(RdzvEvent::RoundChanged {
                    round: state.round,
                    reason: state.reason,
                });
                return Ok(());
            }
            let waiting = state.num_nodes_waiting();
            lock(&self.shared).waiting = waiting;
            if waiting > 0 && waiting != m.waiting {
                send(RdzvEvent::NodesWaiting(waiting));
            }
            m.waiting = waiting;
            let targets = watch_targets(&state, &self.me);
            m.seen = Some(Seen {
                version,
                text,
                state,
                targets,
            });
            // The watched peers may have changed with the state.
            beats = None;
        }
        let seen = m.seen.as_ref().expect("read above");
        let beats = match beats {
            Some(b) => b,
            None => read_beats(&*self.store, &self.keys, seen.targets.clone()).await?,
        };
        let now = Instant::now();
        let dead = m.tracker.observe(now, beats, self.settings.dead_after());
        // A stalled watched peer is published for agents whose workers just failed (see
        // `lost_peers_after_failure`), and withdrawn once it beats again or is dropped.
        let stalled = !m
            .tracker
            .silent(now, self.settings.keep_alive_interval * SUSPECT_AFTER)
            .is_empty();
        if stalled != m.suspecting {
            let delta = if stalled { 1 } else { -1 };
            if self
                .store
                .add(&self.keys.suspects(round), delta)
                .await
                .is_ok()
            {
                m.suspecting = stalled;
            }
        }
        if dead.is_empty() {
            return Ok(());
        }
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let Some(new) = prune_dead(&seen.state, &dead, min, max) else {
            return Ok(());
        };
        let desired = new.encode();
        let got = write_state(&*self.store, &self.keys, &seen.text, &desired).await?;
        if got == desired {
            tracing::warn!(?dead, round, "peers stopped heartbeating; dropped them");
            if new.round != round {
                m.ended = true;
                send_lost(&self.tx, round, dead);
            }
        } else {
            // The state moved under us: read it again next poll.
            m.seen = None;
        }
        Ok(())
    }
}

/// Reports peers this keeper dropped to the agent running `round`.
fn send_lost(tx: &mpsc::UnboundedSender<(u64, RdzvEvent)>, round: u64, dead: Vec<String>) {
    let _ = tx.send((round, RdzvEvent::PeersLost(dead)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeRange;
    use crate::rendezvous::store::MemStore;
    use std::collections::BTreeMap;

    fn settings(min: usize, max: usize, conf: &[(&str, &str)]) -> C10dSettings {
        let conf: BTreeMap<String, String> = conf
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        C10dSettings::from_conf(NodeRange { min, max }, &conf).unwrap()
    }

    fn node(store: &MemStore, s: &C10dSettings, i: u32, nproc: usize) -> C10dRendezvous<MemStore> {
        C10dRendezvous::new(
            Arc::new(store.handle()),
            s.clone(),
            "job",
            &format!("10.0.0.{i}"),
            0,
            nproc,
        )
        .with_pid(100)
    }

    fn req(reason: RoundReason) -> RoundRequest {
        RoundRequest {
            reason,
            master_port: 29500,
        }
    }

    /// Runs `next_round` for several nodes concurrently and returns their assignments.
    async fn join_all(
        nodes: &mut [C10dRendezvous<MemStore>],
        reason: RoundReason,
    ) -> Vec<Assignment> {
        let futs = nodes.iter_mut().map(|n| n.next_round(req(reason)));
        futures_join_all(futs)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    }

    /// Minimal join_all without the futures crate: spawn-free, polls all futures in turn.
    async fn futures_join_all<F: std::future::Future>(
        futs: impl Iterator<Item = F>,
    ) -> Vec<F::Output> {
        let mut pinned: Vec<_> = futs.map(|f| Some(Box::pin(f))).collect();
        let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
        std::future::poll_fn(|cx| {
            let mut pending = false;
            for (i, f) in pinned.iter_mut().enumerate() {
                if let Some(fut) = f {
                    match fut.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => {
                            out[i] = Some(v);
                            *f = None;
                        }
                        std::task::Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(())
            }
        })
        .await;
        out.into_iter()
            .map(|o| o.expect("every future finished"))
            .collect()
    }

    fn check_ranks(asgs: &[Assignment], nprocs: &[usize]) {
        let world: usize = nprocs.iter().sum();
        let mut ranks: Vec<usize> = Vec::new();
        let mut groups: Vec<usize> = asgs.iter().map(|a| a.group_rank).collect();
        for a in asgs {
            assert_eq!(a.world_size, world);
            assert_eq!(a.group_world_size, asgs.len());
            ranks.extend(a.base_rank..a.base_rank + a.local_world_size);
        }
        ranks.sort();
        groups.sort();
        assert_eq!(
            ranks,
            (0..world).collect::<Vec<_>>(),
            "ranks unique and contiguous"
        );
        assert_eq!(groups, (0..asgs.len()).collect::<Vec<_>>());
        let masters: HashSet<(String, u16)> = asgs
            .iter()
            .map(|a| (a.master_addr.clone(), a.master_port))
            .collect();
        assert_eq!(masters.len(), 1, "every node agrees on MASTER_ADDR/PORT");
    }

    #[tokio::test(start_paused = true)]
    async fn three_nodes_heterogeneous_complete_at_max_without_waiting() {
        let store = MemStore::new();
        let s = settings(2, 3, &[]);
        let mut nodes: Vec<_> = [(3, 1), (1, 2), (2, 4)]
            .iter()
            .map(|&(i, n)| node(&store, &s, i, n))
            .collect();
        let t0 = Instant::now();
        let asgs = join_all(&mut nodes, RoundReason::Initial).await;
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "max reached: no last call"
        );
        check_ranks(&asgs, &[1, 2, 4]);
        // Group rank by address: 10.0.0.1 (nproc 2) is 0, 10.0.0.2 (4) is 1, 10.0.0.3 (1) is 2.
        let by_node: Vec<(usize, usize)> =
            asgs.iter().map(|a| (a.group_rank, a.base_rank)).collect();
        assert_eq!(by_node, [(2, 6), (0, 0), (1, 2)]);
        assert_eq!(asgs[0].master_addr, "10.0.0.1");
    }

    #[tokio::test(start_paused = true)]
    async fn min_nodes_complete_after_last_call() {
        let store = MemStore::new();
        let s = settings(2, 4, &[("last_call_timeout", "7")]);
        let mut nodes: Vec<_> = (1..=2).map(|i| node(&store, &s, i, 2)).collect();
        let t0 = Instant::now();
        let asgs = join_all(&mut nodes, RoundReason::Initial).await;
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(7) && took < Duration::from_secs(10),
            "{took:?}"
        );
        check_ranks(&asgs, &[2, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn join_timeout_is_an_error_and_leaves_the_lists() {
        let store = MemStore::new();
        let s = settings(2, 2, &[("join_timeout", "3")]);
        let mut n = node(&store, &s, 1, 1);
        let err = n.next_round(req(RoundReason::Initial)).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "rendezvous timed out after 3s: 1 node(s) joined, at least 2 needed"
        );
        let st = RdzvState::decode(&store.peek("rdrun.rendezvous.job/state").unwrap()).unwrap();
        assert!(st.participants.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn late_joiner_waits_and_running_nodes_grow_the_world_without_charge() {
        let store = MemStore::new();
        let s = settings(2, 3, &[("last_call_timeout", "1")]);
        let mut nodes: Vec<_> = (1..=2).map(|i| node(&store, &s, i, 1)).collect();
        let asgs = join_all(&mut nodes, RoundReason::Initial).await;
        check_ranks(&asgs, &[1, 1]);
        let mut late = node(&store, &s, 3, 1);
        let late_task = tokio::spawn(async move {
            let r = late.next_round(req(RoundReason::Initial)).await;
            (late, r)
        });
        // Both running nodes are told that a node waits.
        for n in nodes.iter_mut() {
            let ev = tokio::time::timeout(Duration::from_secs(10), n.watch())
                .await
                .unwrap();
            assert_eq!(ev, RdzvEvent::NodesWaiting(1));
        }
        assert_eq!(nodes[0].num_nodes_waiting(), 1);
        let t0 = Instant::now();
        let mut asgs = join_all(&mut nodes, RoundReason::Membership).await;
        let (_late, r) = late_task.await.unwrap();
        asgs.push(r.unwrap());
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "all expected nodes rejoined: no last call"
        );
        check_ranks(&asgs, &[1, 1, 1]);
        assert!(asgs.iter().all(|a| a.round == 1 && a.restart_count == 0));
        assert_eq!(
            asgs[2].group_rank, 2,
            "the newcomer follows the previous order"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn worker_failure_restarts_every_node_and_counts_once() {
        let store = MemStore::new();
        let s = settings(3, 3, &[]);
        let mut nodes: Vec<_> = (1..=3).map(|i| node(&store, &s, i, 2)).collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        // Node 10.0.0.2's workers fail: it starts round 1; the others learn it from watch().
        let mut failing = nodes.remove(1);
        let failing_task = tokio::spawn(async move {
            let r = failing.next_round(req(RoundReason::WorkerFailure)).await;
            (failing, r)
        });
        for n in nodes.iter_mut() {
            let ev = tokio::time::timeout(Duration::from_secs(10), n.watch())
                .await
                .unwrap();
            assert_eq!(
                ev,
                RdzvEvent::RoundChanged {
                    round: 1,
                    reason: RoundReason::WorkerFailure
                }
            );
        }
        // One survivor also reports a failure (as if its collectives broke): still one charge.
        let futs = nodes.iter_mut().enumerate().map(|(i, n)| {
            let reason = if i == 0 {
                RoundReason::Membership
            } else {
                RoundReason::WorkerFailure
            };
            n.next_round(req(reason))
        });
        let mut asgs: Vec<Assignment> = futures_join_all(futs)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let (_failing, r) = failing_task.await.unwrap();
        asgs.push(r.unwrap());
        check_ranks(&asgs, &[2, 2, 2]);
        assert!(
            asgs.iter().all(|a| a.restart_count == 1 && a.round == 1),
            "{asgs:?}"
        );
        // Ranks are stable across the restart (10.0.0.1, 10.0.0.3, then 10.0.0.2).
        assert_eq!(
            asgs.iter().map(|a| a.group_rank).collect::<Vec<_>>(),
            [0, 2, 1]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dead_node_is_detected_and_survivors_continue_as_smaller_world() {
        let store = MemStore::new();
        let s = settings(2, 3, &[]);
        let mut nodes: Vec<_> = (1..=3).map(|i| node(&store, &s, i, 1)).collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        // Node 3 is SIGKILLed: its handle (and heartbeat task) vanishes.
        let dead = nodes.pop().unwrap();
        let dead_id = dead.node_id().to_string();
        drop(dead);
        let t0 = Instant::now();
        let mut saw_lost = false;
        for n in nodes.iter_mut() {
            let ev = tokio::time::timeout(Duration::from_secs(30), n.watch())
                .await
                .unwrap();
            match ev {
                RdzvEvent::PeersLost(ids) => {
                    assert_eq!(ids, std::slice::from_ref(&dead_id));
                    saw_lost = true;
                }
                RdzvEvent::RoundChanged {
                    round: 1,
                    reason: RoundReason::PeerLost,
                } => {}
                other => panic!("{other:?}"),
            }
        }
        assert!(saw_lost);
        let took = t0.elapsed();
        assert!(
            took <= s.dead_after() + Duration::from_secs(3),
            "detected in {took:?}"
        );
        let t1 = Instant::now();
        let asgs = join_all(&mut nodes, RoundReason::Membership).await;
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "survivors are expected: no last call"
        );
        check_ranks(&asgs, &[1, 1]);
        assert!(asgs.iter().all(|a| a.restart_count == 0 && a.round == 1));
    }

    /// Issue 17.7: a survivor whose workers failed because a peer was SIGKILLed learns of the
    /// loss before the failure is charged; with every peer alive it learns that within about a
    /// heartbeat interval.
    #[tokio::test(start_paused = true)]
    async fn a_failure_next_to_a_killed_node_is_the_loss_and_next_to_live_nodes_is_not() {
        let store = MemStore::new();
        let s = settings(2, 3, &[]);
        let mut nodes: Vec<_> = (1..=3).map(|i| node(&store, &s, i, 1)).collect();
        join_all(&mut nodes, RoundReason::Initial).await;

        // All alive: empty, within about one keep-alive interval.
        let t0 = Instant::now();
        let lost = nodes[0].lost_peers_after_failure().await;
        assert!(lost.is_empty(), "{lost:?}");
        assert!(
            t0.elapsed() <= s.keep_alive_interval * 2,
            "took {:?}",
            t0.elapsed()
        );

        let dead = nodes.pop().unwrap();
        let dead_id = dead.node_id().to_string();
        drop(dead);
        let t1 = Instant::now();
        let lost = nodes[0].lost_peers_after_failure().await;
        assert_eq!(lost, vec![dead_id.clone()]);
        assert!(
            t1.elapsed() <= s.dead_after() + s.poll_interval * 3,
            "took {:?}",
            t1.elapsed()
        );
        // The survivors regroup without a charged restart.
        let asgs = join_all(&mut nodes, RoundReason::Membership).await;
        check_ranks(&asgs, &[1, 1]);
        assert!(asgs.iter().all(|a| a.restart_count == 0), "{asgs:?}");
    }

    /// Issue 16: at steady state a node reads the small version counter and the heartbeats of
    /// the few peers it watches, not the state document and every heartbeat (O(n) per node per
    /// poll before: 1,000 nodes fell behind and declared live peers dead).
    #[tokio::test(start_paused = true)]
    async fn steady_state_reads_neither_the_state_nor_every_heartbeat() {
        let store = MemStore::new();
        let n = 12;
        let s = settings(2, n, &[]);
        let mut nodes: Vec<_> = (1..=n as u32).map(|i| node(&store, &s, i, 1)).collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        // Let every keeper take its first look at the round.
        tokio::time::sleep(s.poll_interval * 3).await;
        let state_len = store.peek("rdrun.rendezvous.job/state").unwrap().len() as u64;
        let before = store.read_bytes();
        let secs = 20;
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let per_node_poll = (store.read_bytes() - before) / (n as u64 * secs);
        // About 3 small counters per poll (the version and two heartbeats).
        assert!(
            per_node_poll * 20 < state_len,
            "{per_node_poll} bytes per node per second, state is {state_len} bytes"
        );
        for n in nodes.iter_mut() {
            assert!(
                tokio::time::timeout(Duration::from_millis(1), n.watch())
                    .await
                    .is_err(),
                "no event at steady state"
            );
        }
        // A node lost among 12 (watched by two of them) still reaches every survivor, in time.
        let dead = nodes.remove(5);
        let dead_id = dead.node_id().to_string();
        drop(dead);
        let t0 = Instant::now();
        let mut pruned = 0;
        for n in nodes.iter_mut() {
            match tokio::time::timeout(Duration::from_secs(30), n.watch())
                .await
                .unwrap()
            {
                RdzvEvent::PeersLost(ids) => {
                    assert_eq!(ids, std::slice::from_ref(&dead_id));
                    pruned += 1;
                }
                RdzvEvent::RoundChanged {
                    round: 1,
                    reason: RoundReason::PeerLost,
                } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(pruned, 1, "one watcher drops it, the others read the state");
        assert!(
            t0.elapsed() <= s.dead_after() + s.poll_interval * 3,
            "detected in {:?}",
            t0.elapsed()
        );
        let asgs = join_all(&mut nodes, RoundReason::Membership).await;
        check_ranks(&asgs, &[1; 11]);
    }

    /// Issue 17.7 above the all-to-all size: a node that does not watch the killed peer learns
    /// of the loss through the suspects counter (published by the peer's watchers), and with
    /// every peer alive it says so within two intervals plus two polls.
    #[tokio::test(start_paused = true)]
    async fn a_failure_in_a_large_world_learns_of_a_loss_it_does_not_watch() {
        let store = MemStore::new();
        let s = settings(2, 6, &[]);
        let mut nodes: Vec<_> = (1..=6)
            .map(|i| node(&store, &s, i, 1).with_full_check_max(0))
            .collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        tokio::time::sleep(s.poll_interval * 3).await;
        let t0 = Instant::now();
        let lost = nodes[0].lost_peers_after_failure().await;
        assert!(lost.is_empty(), "{lost:?}");
        let bound = s.keep_alive_interval * 2 + s.poll_interval * 3;
        assert!(t0.elapsed() <= bound, "took {:?}", t0.elapsed());
        // Group rank 0 watches ranks 1 and 2; rank 4 dies.
        let dead = nodes.remove(4);
        let dead_id = dead.node_id().to_string();
        assert!(!watch_targets(
            &RdzvState::decode(&store.peek("rdrun.rendezvous.job/state").unwrap()).unwrap(),
            nodes[0].node_id()
        )
        .contains(&dead_id));
        drop(dead);
        let t1 = Instant::now();
        let lost = nodes[0].lost_peers_after_failure().await;
        assert_eq!(lost, vec![dead_id.clone()]);
        assert!(
            t1.elapsed() <= s.dead_after() + s.poll_interval * 3,
            "took {:?}",
            t1.elapsed()
        );
        let asgs = join_all(&mut nodes, RoundReason::Membership).await;
        check_ranks(&asgs, &[1; 5]);
        assert!(asgs.iter().all(|a| a.restart_count == 0), "{asgs:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn cut_node_is_dropped_and_learns_it_lost_the_store() {
        let store = MemStore::new();
        let s = settings(1, 2, &[]);
        let handles: Vec<MemStore> = (0..2).map(|_| store.handle()).collect();
        let mut nodes: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, h)| {
                C10dRendezvous::new(
                    Arc::new(h.clone()),
                    s.clone(),
                    "job",
                    &format!("10.0.0.{}", i + 1),
                    0,
                    1,
                )
            })
            .collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        handles[1].set_cut(true);
        let ev = tokio::time::timeout(Duration::from_secs(30), nodes[1].watch())
            .await
            .unwrap();
        assert!(matches!(ev, RdzvEvent::StoreUnreachable(_)), "{ev:?}");
        let ev = tokio::time::timeout(Duration::from_secs(30), nodes[0].watch())
            .await
            .unwrap();
        assert!(matches!(ev, RdzvEvent::PeersLost(_)), "{ev:?}");
        let a = nodes[0]
            .next_round(req(RoundReason::Membership))
            .await
            .unwrap();
        assert_eq!((a.group_world_size, a.world_size), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn over_max_node_is_redundant_then_closed() {
        let store = MemStore::new();
        let s = settings(1, 2, &[("join_timeout", "5")]);
        let mut nodes: Vec<_> = (1..=2).map(|i| node(&store, &s, i, 1)).collect();
        join_all(&mut nodes, RoundReason::Initial).await;
        let mut extra = node(&store, &s, 9, 1);
        let extra_task =
            tokio::spawn(async move { extra.next_round(req(RoundReason::Initial)).await });
        // Redundant: waits past its join timeout, and does not make the others restart.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!extra_task.is_finished());
        assert_eq!(nodes[0].num_nodes_waiting(), 0);
        nodes[0].close(None).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), extra_task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(r, Err(RendezvousError::Closed { redundant: true })),
            "{r:?}"
        );
        let ev = tokio::time::timeout(Duration::from_secs(10), nodes[1].watch())
            .await
            .unwrap();
        assert_eq!(ev, RdzvEvent::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_torchrun_agent_on_the_same_run_is_a_clear_error() {
        let store = MemStore::new();
        let s = settings(2, 2, &[]);
        let mut n = node(&store, &s, 1, 1);
        let task = tokio::spawn(async move { n.next_round(req(RoundReason::Initial)).await });
        tokio::time::sleep(Duration::from_secs(2)).await;
        // What torchrun's C10dRendezvousBackend writes first (its "no state" sentinel).
        store
            .set("torch.rendezvous.job", b"Y2FuaW1hZGFt")
            .await
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("PyTorch torchrun agent"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn unreachable_store_fails_at_the_join_deadline_naming_it() {
        let store = MemStore::new();
        store.set_cut(true);
        let s = settings(1, 1, &[("join_timeout", "2")]);
        let mut n = C10dRendezvous::new(Arc::new(store), s, "job", "10.0.0.1", 0, 1);
        let err = n.next_round(req(RoundReason::Initial)).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "rendezvous store (in memory) unreachable after 2s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn foreign_state_is_a_clear_error() {
        let store = MemStore::new();
        store
            .set("rdrun.rendezvous.job/state", b"Y2FuaW1hZGFt")
            .await
            .unwrap();
        let s = settings(1, 1, &[]);
        let mut n = node(&store, &s, 1, 1);
        let err = n.next_round(req(RoundReason::Initial)).await.unwrap_err();
        assert!(matches!(err, RendezvousError::State(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_that_disagree_on_nnodes_say_so_naming_both_values() {
        let store = MemStore::new();
        let mut a = node(&store, &settings(2, 2, &[]), 1, 1);
        let mut b = node(&store, &settings(3, 3, &[]), 2, 1);
        let (ra, rb) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(
                a.next_round(req(RoundReason::Initial)),
                b.next_round(req(RoundReason::Initial))
            )
        })
        .await
        .unwrap();
        let msgs: Vec<String> = [ra, rb]
            .into_iter()
            .map(|r| r.unwrap_err().to_string())
            .collect();
        assert!(
            msgs.contains(
                &"the nodes disagree on --nnodes: this node says 2, 10.0.0.2_100_0 says 3"
                    .to_string()
            ) || msgs.contains(
                &"the nodes disagree on --nnodes: this node says 3, 10.0.0.1_100_0 says 2"
                    .to_string()
            ),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .all(|m| m.starts_with("the nodes disagree on --nnodes")),
            "{msgs:?}"
        );
    }
}
