//! `--rdzv-backend=c10d`: rdrun's dynamic rendezvous driver over the shared store.
//!
//! The decisions live in `state.rs` (on the state) and `join_machine.rs` (the join loop's,
//! on the head), both pure; this driver does the I/O: reads the state key, writes
//! with compare-and-set, measures time with tokio's monotonic clock (so tests run on a paused,
//! injected clock), and runs a background keeper task per agent that
//! - writes this agent's heartbeat (`add(<prefix>/hb/<id>, 1)`) every `keep_alive_interval`;
//! - while this agent runs a round, reads the state's version counter every `poll_interval`
//!   (with the heartbeat, in one round trip; the small head and its own notice only when the
//!   version moved) and turns what it sees into
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
//! `/state` (the small JSON head every node reads: round, counts, flags, and the key of the
//! body), `/body/<seq>.<nonce>` (the full state, see `state.rs`, written once per write, the
//! previous one removed), `/version` (counter bumped after every write), `/hb/<node id>`
//! (decimal counter), `/suspects/<round>` (watchers of a stalled peer), `/nnodes/first` and
//! `/nnodes/conflict` (the `--nnodes` agreement check), `/joiners/<round>` (appended JSON lines:
//! agents announcing themselves), `/admit/<round>` (`<head seq> <id>`: who admits the announced
//! agents at that head), `/node/<round>/<id>` (that node's list and watched peers, written by
//! whoever changed them; once the round is complete, a participant's also carries its group
//! and base rank), `/roster/<round>` (every participant's id and nproc) and `/complete/<round>`
//! (the round's small summary: sizes, master, restart count), both written when it completes,
//! and per round `rdrun.rendezvous.<run_id>.<round>/…` for agent keys such as the exit barrier.
//!
//! The join by per-node keys (issue 16; before, every joiner read and compare-and-set one JSON
//! document, O(n) bytes per attempt, O(n²) per round: 2,000 simulated nodes did not finish in
//! 300 s): a joiner announces itself and waits on its `/node/<round>/<id>` key; one node at a time
//! (the holder of `/admit/<round>` for the current head, taken by compare-and-set, given up by
//! writing, released, or taken over after two polls) reads the state and places every announced
//! node in one write, and goes on while more arrive; participants wait on `/complete/<round>`
//! and build their assignment from the summary and their own notice (O(1) bytes), or in a round
//! of up to 256 nodes from the roster, which lists every node for the events. Only writers
//! read the O(n) body. (Every node reading a 10,000-node roster was 2 GB through the store.)
//!
//! Files: `c10d/join.rs` (the join loop, `next_round`), `c10d/io.rs` (the store reads and
//! writes of the state and the per-node keys), `c10d/keeper.rs` (the background keeper); this
//! file keeps the handle, the close, and the checks after a worker failure. Shared with `static_`: `plumbing` (events and the
//! keeper task, retry, heartbeats and liveness rules, close acknowledgements); the key spellings
//! are `keys::c10d`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::RendezvousError;
use super::keys::c10d::Keys;
use super::plumbing::{
    ack_closed, beat, closed_acks, closed_event, lock, nnodes_conflict, nnodes_text, retry,
    watched_ids, HeartbeatTracker, KeeperTask, RdzvEvent, SharedRef, StoreLoss,
};
use super::state::{
    self, assignment, join_step, prune_dead, roster_assignment, watch_targets, Assignment, Head,
    JoinStep, JoinView, Member, Notice, RdzvState, RoundReason, StateError, NO_STATE,
};
use super::store::{try_get, RdzvStore, StoreOpError};
use crate::config::rdzv_conf::C10dSettings;

mod io;
mod join;
mod keeper;
mod leave;

use io::{
    load_state, parse_count, read_beats, read_head, read_notice, read_version, write_state,
    ReadError, RoundPeers, Wrote,
};
use keeper::Keeper;

/// Up to this many nodes a world is small: peers' heartbeats are judged by all-to-all watching
/// after a worker failure ([`C10dRendezvous::lost_peers_after_failure`]) and participants read
/// the whole roster of a completed round. Above it, by the watched few plus the suspects
/// counter, and from the round's summary and their own notice (O(1) per node instead of O(n)).
const FULL_CHECK_MAX: usize = state::ROSTER_EAGER_MAX;

/// A watched peer whose heartbeat counter has not moved for this many keep-alive intervals is
/// published on the round's suspects counter by the keeper watching it (a live peer's counter
/// moves every interval; two allow for one poll that falls between two beats).
const SUSPECT_AFTER: u32 = 2;

/// What the agent asks for when it calls [`C10dRendezvous::next_round`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundRequest {
    /// Why the agent wants a (new) round; only matters if this agent is the one that starts it.
    pub reason: RoundReason,
    /// The port of the worker store this agent serves if it becomes group rank 0 (MASTER_PORT).
    pub master_port: u16,
}

/// How a node tried to become the round's admission writer.
enum Admit {
    /// It holds the admission key for the head it read: it reads the state and writes.
    Got,
    /// Another node writes at this head (or the head moved): wait.
    Busy,
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
    round_peers: RoundPeers,
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
            round_peers: RoundPeers::Ids(Vec::new()),
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

    /// This participant's assignment in the complete `round` whose summary it read: from the
    /// roster in a round of up to [`FULL_CHECK_MAX`] nodes, else from its own notice
    /// (its ranks; O(1) bytes). `None` if they are missing or do not fit (then the caller reads
    /// the state).
    async fn completed(&self, round: u64, summary: &[u8]) -> Option<(Assignment, RoundPeers)> {
        let size = state::summary_size(summary)?;
        if size <= self.full_check_max {
            let r = try_get(&*self.store, &self.keys.roster(round))
                .await
                .ok()??;
            let asg = roster_assignment(&r, &self.me.id, self.keys.prefix())?;
            // The peers' ids are parsed only if a loss needs them.
            return Some((asg, RoundPeers::Roster(r)));
        }
        let notice = read_notice(&*self.store, &self.keys, round, &self.me.id)
            .await
            .ok()??;
        let asg = state::summary_assignment(summary, &notice, self.me.nproc, self.keys.prefix())?;
        (asg.round == round).then_some((asg, RoundPeers::Unread(round)))
    }

    /// Records the completed round this agent runs and returns its assignment.
    fn finish(&mut self, asg: Assignment, peers: RoundPeers, waiting: usize) -> Assignment {
        self.my_round = Some(asg.round);
        self.round_peers = peers;
        {
            let mut sh = lock(&self.shared);
            sh.running = Some(asg.round);
            sh.waiting = waiting;
        }
        // The agent logs the completed round at INFO (once per round).
        tracing::debug!(round = asg.round, "c10d round complete");
        asg
    }

    /// How long one wait on a small key may hold the store connection: shorter than the
    /// heartbeat period, or peers would see this agent's beats stall when they share it.
    fn wait_slice(&self, poll: Duration, deadline: Instant) -> Duration {
        let s = poll.min(self.settings.keep_alive_interval);
        // Spread the many waiting nodes' wake-ups (issue 16), never past the join deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        s.mul_f64(0.75 + 0.5 * fastrand::f64())
            .min(left)
            .max(Duration::from_millis(1))
    }

    /// The head again (with the store retried up to the join deadline) when the version moved
    /// (or `force`), else `cur`. `known`: the version already read with the heartbeats.
    async fn reread(
        &self,
        deadline: Instant,
        version: &mut Option<Vec<u8>>,
        force: bool,
        cur: &[u8],
        known: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, RendezvousError> {
        let v = match known {
            Some(v) => Some(v),
            None => read_version(&*self.store, &self.keys).await.ok(),
        };
        let moved = v.is_none() || *version != v;
        *version = v;
        if !moved && !force {
            return Ok(cur.to_vec());
        }
        self.retry_store(deadline, |s, k| {
            let k = k.clone();
            async move { read_head(&*s, &k).await }
        })
        .await
    }

    /// Tries to become the round's admission writer for `head` (see [`Admit`]).
    async fn try_admit(
        &self,
        head: &Head,
        seen: &mut Option<(Vec<u8>, Instant)>,
        stale: Duration,
    ) -> Admit {
        let key = self.keys.admit(head.round);
        let mine = format!("{} {}", head.seq, self.me.id).into_bytes();
        let cur = match try_get(&*self.store, &key).await {
            Ok(c) => c,
            Err(_) => return Admit::Busy,
        };
        let expected: Vec<u8> = match cur {
            None => Vec::new(),
            Some(v) => {
                let held: Option<u64> = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|t| t.split(' ').next())
                    .and_then(|s| s.parse().ok());
                if held.is_some_and(|h| h >= head.seq) {
                    // Someone writes at this head (or a newer one exists): wait, unless it has
                    // held it too long.
                    let now = Instant::now();
                    match seen {
                        Some((sv, since)) if *sv == v => {
                            if now.duration_since(*since) < stale || held > Some(head.seq) {
                                return Admit::Busy;
                            }
                        }
                        _ => {
                            *seen = Some((v, now));
                            return Admit::Busy;
                        }
                    }
                }
                v
            }
        };
        match self.store.compare_set(&key, &expected, &mine).await {
            Ok(got) if got == mine => Admit::Got,
            _ => Admit::Busy,
        }
    }

    /// Gives the admission key back when this node held it and did not write.
    async fn release_admit(&self, held: bool, head: &Head) {
        if held {
            let key = self.keys.admit(head.round);
            let mine = format!("{} {}", head.seq, self.me.id).into_bytes();
            let _ = self.store.compare_set(&key, &mine, b"free").await;
        }
    }

    /// The `--nnodes` agreement and the torchrun-peer checks; `Some(error)` ends the join (this
    /// node leaves the lists first, best effort).
    async fn conflict_checks(&mut self, nnodes: &str) -> Option<RendezvousError> {
        let id = self.me.id.clone();
        if let Ok(Some((other_node, other))) = nnodes_conflict(
            &*self.store,
            &self.keys.nnodes_first(),
            &self.keys.nnodes_conflict(),
            nnodes,
            &id,
            &mut self.nnodes_first,
        )
        .await
        {
            if let Ok((text, state)) = load_state(&*self.store, &self.keys).await {
                let mut new = state.clone();
                new.remove_everywhere(&id);
                if new != state {
                    let _ = write_state(&*self.store, &self.keys, &text, Some(&state), &new).await;
                }
            }
            return Some(RendezvousError::NnodesDisagree {
                mine: nnodes.to_string(),
                other_node,
                other,
            });
        }
        // A PyTorch torchrun agent on the same endpoint and run id waits in a rendezvous of its
        // own: say so instead of timing out much later.
        if let Ok(Some(_)) = try_get(&*self.store, &self.keys.torch_state()).await {
            return Some(RendezvousError::TorchrunPeer {
                key: self.keys.torch_state(),
            });
        }
        None
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

    /// The current head and state, the store retried up to `deadline`.
    async fn load_retry(&self, deadline: Instant) -> Result<(Vec<u8>, RdzvState), RendezvousError> {
        let state_err: std::sync::Mutex<Option<StateError>> = std::sync::Mutex::new(None);
        let r = self
            .retry_store(deadline, |s, k| {
                let k = k.clone();
                let state_err = &state_err;
                async move {
                    match load_state(&*s, &k).await {
                        Ok(v) => Ok(Some(v)),
                        Err(ReadError::State(e)) => {
                            *state_err.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                            Ok(None)
                        }
                        Err(ReadError::Store(e)) => Err(e),
                    }
                }
            })
            .await?;
        match r {
            Some(v) => Ok(v),
            None => Err(state_err
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .map(RendezvousError::State)
                .unwrap_or_else(|| {
                    RendezvousError::Store(StoreOpError("unreadable rendezvous state".into()))
                })),
        }
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
        let mut backoff = Duration::from_millis(20);
        loop {
            let (text, st) = self.load_retry(deadline).await?;
            if st.closed {
                ack_closed(&*self.store, &self.keys.closed_acks(), &self.me.id).await;
                return Ok(());
            }
            let new = state::close(&st, reason);
            if let Ok(Wrote::Won(_)) =
                write_state(&*self.store, &self.keys, &text, Some(&st), &new).await
            {
                ack_closed(&*self.store, &self.keys.closed_acks(), &self.me.id).await;
                return Ok(());
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
        let Ok((_, state)) = load_state(&*self.store, &self.keys).await else {
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

    /// The peers of the round this agent ran that the current state no longer has (empty when
    /// it cannot be read).
    async fn dropped_now(&self) -> Vec<String> {
        match load_state(&*self.store, &self.keys).await {
            Ok((_, st)) => {
                let ids = self
                    .round_peers
                    .ids(&*self.store, &self.keys, &self.me.id)
                    .await;
                super::plumbing::dropped_by(&ids, &st)
            }
            Err(_) => Vec::new(),
        }
    }

    /// The peers of the round this agent ran that a later round dropped as lost (issue 38
    /// item 4: a node that learned of the loss from a new round, not from its own keeper);
    /// empty while that round still runs, once the rendezvous is closed, or when the store
    /// cannot be read.
    pub async fn lost_since_round(&self) -> Vec<String> {
        let Some(round) = self.my_round else {
            return Vec::new();
        };
        match read_head(&*self.store, &self.keys).await {
            Ok(text) => match Head::decode(&text) {
                Ok(Some(h)) if !h.closed && h.round != round => self.dropped_now().await,
                _ => Vec::new(),
            },
            Err(_) => Vec::new(),
        }
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
    /// watches (its notice's targets) are, which keeps a failure of every node at once O(n) in
    /// all instead of O(n²): the others' watchers publish a stalled peer on the round's suspects
    /// counter (their keepers, and this same call on their nodes), so "all alive" also waits
    /// until two keep-alive intervals plus two polls have passed with no suspect.
    pub async fn lost_peers_after_failure(&mut self) -> Vec<String> {
        let Some(round) = self.my_round else {
            return Vec::new();
        };
        let head = match read_head(&*self.store, &self.keys).await {
            Ok(text) => match Head::decode(&text) {
                Ok(Some(h)) => h,
                _ => return Vec::new(),
            },
            Err(_) => return Vec::new(),
        };
        if head.closed {
            return Vec::new();
        }
        if head.round != round {
            // Another node already moved on: a loss if it dropped peers of this round.
            return self.dropped_now().await;
        }
        let full = head.participants <= self.full_check_max;
        let Some(ids) = self.peers_to_check(round, full).await else {
            return Vec::new();
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
            if let Some(lost) = self.keeper_answer(round).await {
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

    /// The peers whose heartbeats [`Self::lost_peers_after_failure`] reads: every other member
    /// of a small round (`full`), else the ones this node watches (its notice, or computed from
    /// the state). `None`: the store did not answer.
    async fn peers_to_check(&self, round: u64, full: bool) -> Option<Vec<String>> {
        if full {
            let (_, st) = load_state(&*self.store, &self.keys).await.ok()?;
            return Some(watched_ids(&st, &self.me.id));
        }
        match read_notice(&*self.store, &self.keys, round, &self.me.id).await {
            Ok(Some(n)) => Some(n.targets),
            _ => {
                let (_, st) = load_state(&*self.store, &self.keys).await.ok()?;
                Some(watch_targets(&st, &self.me.id))
            }
        }
    }

    /// What the keeper already saw of `round`, if that settles the question: the peers it
    /// found lost, the ones a new round dropped, or none (the round ended otherwise).
    async fn keeper_answer(&mut self, round: u64) -> Option<Vec<String>> {
        while let Some(ev) = self.keeper.try_next(round) {
            match ev {
                RdzvEvent::PeersLost(lost) => return Some(lost),
                RdzvEvent::NodesWaiting(_) => {}
                RdzvEvent::RoundChanged { .. } => return Some(self.dropped_now().await),
                _ => return Some(Vec::new()),
            }
        }
        None
    }
}

#[cfg(test)]
#[path = "c10d_tests.rs"]
mod tests;
