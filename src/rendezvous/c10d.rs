//! `--rdzv-backend=c10d`: rdrun's dynamic rendezvous driver over the shared store.
//!
//! The decisions live in `state.rs` (pure); this file does the I/O: reads the state key, writes
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
//! Length: about 1,720 lines before the tests, for one responsibility, the c10d protocol over the
//! store (join, rounds, heartbeats, close, the redundancy list). The pure round logic is already
//! apart (`state`), and so is the plumbing it shares with `static_` (`plumbing`: events and
//! the keeper task, retry, heartbeats and liveness rules, close acknowledgements).

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
use super::settings::C10dSettings;
use super::state::{
    self, assignment, join_step, prune_dead, roster_assignment, watch_targets, Assignment, Head,
    JoinStep, JoinView, Member, Notice, RdzvState, RoundReason, StateError, NO_STATE,
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

/// A read of the rendezvous state that failed: the store, or a state that is not rdrun's.
#[derive(Debug)]
enum ReadError {
    Store(StoreOpError),
    State(StateError),
}

impl From<StoreOpError> for ReadError {
    fn from(e: StoreOpError) -> Self {
        Self::Store(e)
    }
}

impl From<StateError> for ReadError {
    fn from(e: StateError) -> Self {
        Self::State(e)
    }
}

impl From<ReadError> for RendezvousError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Store(e) => RendezvousError::Store(e),
            ReadError::State(e) => RendezvousError::State(e),
        }
    }
}

/// Reads the head text without blocking and without changing an existing state (creates the
/// [`NO_STATE`] sentinel on a fresh store).
async fn read_head<S: RdzvStore>(store: &S, keys: &Keys) -> Result<Vec<u8>, StoreOpError> {
    store.compare_set(&keys.state(), b"", NO_STATE).await
}

/// The body a head names (`Ok(None)`: gone, a newer write replaced it; read the head again).
async fn read_body<S: RdzvStore>(
    store: &S,
    head: Option<&Head>,
) -> Result<Option<RdzvState>, ReadError> {
    let Some(h) = head else {
        return Ok(Some(RdzvState::default()));
    };
    match try_get(store, &h.body).await? {
        None => Ok(None),
        Some(b) => Ok(Some(RdzvState::decode(&b)?)),
    }
}

/// The current head text and the full state it names: O(n) bytes, read only by writers and on
/// rare paths (issue 16).
async fn load_state<S: RdzvStore>(
    store: &S,
    keys: &Keys,
) -> Result<(Vec<u8>, RdzvState), ReadError> {
    for _ in 0..100 {
        let text = read_head(store, keys).await?;
        let head = Head::decode(&text)?;
        if let Some(st) = read_body(store, head.as_ref()).await? {
            return Ok((text, st));
        }
    }
    Err(ReadError::Store(StoreOpError(
        "the rendezvous state kept changing while being read".into(),
    )))
}

/// The state's version counter (empty before the first write).
async fn read_version<S: RdzvStore>(store: &S, keys: &Keys) -> Result<Vec<u8>, StoreOpError> {
    Ok(try_get(store, &keys.version()).await?.unwrap_or_default())
}

/// What a write did: the head now stored, ours or another writer's.
enum Wrote {
    Won(Vec<u8>),
    Lost(Vec<u8>),
}

/// Writes `new` (computed from `old`, read at head text `expected`): its body under a key of its
/// own, then the head with compare-and-set against `expected`. When it went through, publishes
/// what the nodes wait on instead of reading the state ([`publish`]), removes the previous
/// body and bumps the version so that every monitor reads the new head.
async fn write_state<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    expected: &[u8],
    old: Option<&RdzvState>,
    new: &RdzvState,
) -> Result<Wrote, StoreOpError> {
    let prev = Head::decode(expected).ok().flatten();
    let seq = prev.as_ref().map_or(1, |h| h.seq + 1);
    let body = keys.body(seq);
    store.set(&body, &new.encode()).await?;
    let desired = Head::of(new, seq, &body).encode();
    let got = match store.compare_set(&keys.state(), expected, &desired).await {
        Ok(g) => g,
        Err(e) => {
            let _ = store.delete(&body).await;
            return Err(e);
        }
    };
    if got != desired {
        let _ = store.delete(&body).await;
        return Ok(Wrote::Lost(got));
    }
    publish(store, keys, old, new).await;
    if let Some(p) = prev {
        let _ = store.delete(&p.body).await;
    }
    if let Err(e) = store.add(&keys.version(), 1).await {
        // Monitors see this write with the next one (or the next version bump).
        tracing::debug!(error = %e, "bumping the rendezvous state version failed");
    }
    Ok(Wrote::Won(desired))
}

/// After a write: every node whose place or watched peers changed gets its notice key (one
/// `multi_set` per [`state::NOTICE_CHUNK`] nodes; a participant's notice carries its ranks once
/// the round is complete), and a round that just completed gets its roster and then its
/// summary (what the participants wait on). Best effort: a node that misses its notice finds
/// its place in the state when its wait runs out.
async fn publish<S: RdzvStore>(store: &S, keys: &Keys, old: Option<&RdzvState>, new: &RdzvState) {
    let notes = state::notices(old, new);
    for chunk in notes.chunks(state::NOTICE_CHUNK) {
        let pairs: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|(id, n)| (keys.notice(new.round, id), n.encode()))
            .collect();
        if let Err(e) = store.multi_set(&pairs).await {
            tracing::debug!(error = %e, "publishing rendezvous notices failed");
        }
    }
    let newly_complete = old.map_or(true, |o| o.round != new.round || !o.complete);
    if new.complete && !new.closed && newly_complete {
        let written = store
            .multi_set(&[
                (keys.roster(new.round), state::roster(new)),
                (keys.complete(new.round), state::round_summary(new)),
            ])
            .await;
        if let Err(e) = written {
            tracing::debug!(error = %e, "writing the round's roster and summary failed");
        }
    }
}

/// This node's own notice in `round`, if one was published.
async fn read_notice<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    round: u64,
    id: &str,
) -> Result<Option<Notice>, StoreOpError> {
    Ok(try_get(store, &keys.notice(round, id))
        .await?
        .and_then(|v| Notice::decode(&v)))
}

/// `id`'s notice as the state itself says (after reading the state).
fn own_notice(state: &RdzvState, id: &str) -> Option<Notice> {
    let status = if state.is_participant(id) {
        'p'
    } else if state.in_wait_list(id) {
        'w'
    } else if state.in_redundancy_list(id) {
        'r'
    } else {
        return None;
    };
    let rank = if status == 'p' && state.complete {
        let g = state.participants.iter().position(|m| m.id == id)?;
        Some((g, state.participants[..g].iter().map(|m| m.nproc).sum()))
    } else {
        None
    };
    Some(Notice {
        status,
        rank,
        targets: watch_targets(state, id),
    })
}

/// Up to this many nodes a world is small: peers' heartbeats are judged by all-to-all watching
/// after a worker failure ([`C10dRendezvous::lost_peers_after_failure`]) and participants read
/// the whole roster of a completed round. Above it, by the watched few plus the suspects
/// counter, and from the round's summary and their own notice (O(1) per node instead of O(n)).
const FULL_CHECK_MAX: usize = state::ROSTER_EAGER_MAX;

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
    let mut seen: HashSet<String> = HashSet::new();
    for line in list.split(|b| *b == b'\n') {
        if let Ok(m) = serde_json::from_slice::<Member>(line) {
            if seen.insert(m.id.clone()) {
                out.push(m);
            }
        }
    }
    out
}

/// The head of a store nobody wrote yet.
fn empty_head() -> Head {
    Head::of(&RdzvState::default(), 0, "")
}

/// The participants of the round an agent runs: the roster it read, the ids from the state, or
/// the round whose roster it did not read (above [`state::ROSTER_EAGER_MAX`] nodes).
enum RoundPeers {
    Roster(Vec<u8>),
    Ids(Vec<String>),
    Unread(u64),
}

impl RoundPeers {
    /// The other participants' ids (the roster read now if it was not before; empty if that
    /// fails).
    async fn ids<S: RdzvStore>(&self, store: &S, keys: &Keys, me: &str) -> Vec<String> {
        let all = match self {
            Self::Roster(r) => state::roster_ids(r).unwrap_or_default(),
            Self::Ids(ids) => ids.clone(),
            Self::Unread(round) => match try_get(store, &keys.roster(*round)).await {
                Ok(Some(r)) => state::roster_ids(&r).unwrap_or_default(),
                _ => Vec::new(),
            },
        };
        all.into_iter().filter(|p| p != me).collect()
    }
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

    /// Joins the next round and waits until it completes with this agent in it.
    ///
    /// The first call joins round 0 (or the current round). A later call after this agent's
    /// workers failed (`RoundReason::WorkerFailure`) or to admit waiting nodes
    /// (`RoundReason::Membership`) starts a new round for every node, unless another agent already
    /// did; only a `WorkerFailure` start is charged to the job-wide restart count.
    ///
    /// Per-node keys (issue 16): a node announces itself on the round's joiners list and waits
    /// on its own notice key; one node at a time (the holder of the round's admission key for
    /// the current head) reads the state and admits every announced node in one write, then
    /// publishes each placed node's notice. A participant waits on the round's roster, written
    /// once when the round completes, and builds its assignment from it. Only writers (admission,
    /// last call, a dead peer, a bump, a timeout) read the O(n) state.
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
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let poll_max = self.settings.poll_interval;
        let min_poll = Duration::from_millis(20).min(poll_max);
        let max_backoff = Duration::from_millis(100).min(poll_max);
        // Another node holding the admission key for as long as this without writing is taken
        // over (it died, or its store link did).
        let admit_stale = (poll_max * 2).max(Duration::from_millis(200));
        let nnodes = nnodes_text(min, max);
        let mut tracker = HeartbeatTracker::default();
        let mut last_call: Option<((u64, u64), Instant)> = None;
        let mut poll = min_poll;
        let mut lost = 0u32;
        let mut announced: Option<u64> = None;
        // This node's place as last learnt (its notice key, or the state a write read).
        let mut mine: Option<(u64, Notice)> = None;
        // The admission key's value another node holds, and since when this node sees it.
        let mut admit_seen: Option<(Vec<u8>, Instant)> = None;
        // The head seq at which a waiting or redundant node last re-ran its join in the state.
        let mut rejoined_at: Option<u64> = None;
        // Since when a complete round's roster is missing (its completer may have died).
        let mut roster_missing: Option<(u64, Instant)> = None;
        // This node admitted a batch and holds the admission key for the head it wrote: it
        // admits the next batch at once (the others only wait on their notices).
        let mut keep_admitting = false;
        let mut next_checks = Instant::now();
        let mut notice_due = Instant::now();
        let mut version: Option<Vec<u8>> = None;
        let mut text = self
            .retry_store(deadline, |s, k| {
                let k = k.clone();
                async move { read_head(&*s, &k).await }
            })
            .await?;
        loop {
            let head = Head::decode(&text)?.unwrap_or_else(empty_head);
            let now = Instant::now();
            let id = self.me.id.clone();
            let placed = mine
                .as_ref()
                .filter(|(r, _)| *r == head.round)
                .map(|(_, n)| n.status);
            let me_in = placed == Some('p');
            // A redundant node waits without a deadline while the round is full (torchrun).
            if head.complete && placed == Some('r') && head.participants >= max {
                deadline = now + join_timeout;
            }
            let last_call_expired = !head.complete
                && me_in
                && head.participants >= min
                && last_call_over(
                    &mut last_call,
                    (head.round, head.last_call_seq),
                    now,
                    self.settings.last_call_timeout,
                );
            // The `--nnodes` agreement (and a torchrun agent on the run) before this node joins
            // anything, then once per poll interval while it waits.
            if !(head.closed || head.complete && me_in) && now >= next_checks {
                next_checks = now + poll_max;
                if let Some(err) = self.conflict_checks(&nnodes).await {
                    return Err(err);
                }
            }
            let bump_due = bump_from.is_some_and(|(r, _)| head.round == r && head.complete);
            let past_deadline = now >= deadline;
            // Decide what needs the full state; everything else is a wait on small keys.
            let mut slow = head.closed || bump_due || past_deadline;
            let mut admit = false;
            if std::mem::take(&mut keep_admitting) && !head.complete && !slow {
                slow = true;
                admit = true;
            }
            let mut dead: Vec<String> = Vec::new();
            if !slow && head.complete && me_in {
                // Done: the round's summary with this node's notice (or, in a small round, its
                // roster) says everything this node needs.
                let summary = try_get(&*self.store, &self.keys.complete(head.round)).await;
                match summary {
                    Ok(Some(sum)) => {
                        if let Some((asg, peers)) = self.completed(head.round, &sum).await {
                            return Ok(self.finish(asg, peers, head.waiting));
                        }
                        slow = true;
                    }
                    Ok(None) => {
                        // Its completer may have died before writing it: after two polls, any
                        // participant writes it (and the notices) from the state.
                        let since = match roster_missing {
                            Some((r, t)) if r == head.round => t,
                            _ => {
                                roster_missing = Some((head.round, now));
                                now
                            }
                        };
                        if now.duration_since(since) >= poll_max * 2 {
                            slow = true;
                        } else {
                            let key = [self.keys.complete(head.round)];
                            let _ = self.store.wait(&key, self.wait_slice(poll, deadline)).await;
                            poll = (poll * 2).min(poll_max);
                            text = self
                                .reread(deadline, &mut version, true, &text, None)
                                .await?;
                            continue;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the round's roster failed");
                        tokio::time::sleep(poll).await;
                        text = self
                            .reread(deadline, &mut version, true, &text, None)
                            .await?;
                        continue;
                    }
                }
            } else if !slow && last_call_expired {
                // Every participant's last call runs out at about the same time: the holder of
                // the admission key completes the round, the others see it complete.
                match self.try_admit(&head, &mut admit_seen, admit_stale).await {
                    Admit::Got => {
                        slow = true;
                        admit = true;
                    }
                    Admit::Busy => {}
                }
            } else if !slow
                && !head.complete
                && matches!(placed, None | Some('x'))
                && announced != Some(head.round)
            {
                // Announce this node for the round (once): a writer admits every announced node.
                let mut line = serde_json::to_vec(&self.me).expect("member serializes");
                line.push(b'\n');
                if self
                    .store
                    .append(&self.keys.joiners(head.round), &line)
                    .await
                    .is_ok()
                {
                    announced = Some(head.round);
                }
            } else if !slow && head.complete && matches!(placed, None | Some('x')) {
                // A complete round: this node goes to its wait or redundancy list.
                slow = true;
            } else if !slow
                && matches!(placed, Some('w') | Some('r'))
                && rejoined_at != Some(head.seq)
                && (!head.complete || head.participants < max)
            {
                // The state moved while this node waits on a list: see whether it fits now.
                slow = true;
            }
            if !slow && !me_in && !matches!(placed, Some('w') | Some('r')) && !head.complete {
                // Not placed yet: become the admission writer, or wait for a notice.
                if placed == Some('x') {
                    slow = true;
                } else {
                    match self.try_admit(&head, &mut admit_seen, admit_stale).await {
                        Admit::Got => {
                            slow = true;
                            admit = true;
                        }
                        Admit::Busy => {}
                    }
                }
            }
            if !slow {
                // A wait on small keys: the roster (participants), this node's notice (not yet
                // placed), or nothing (wait and redundancy lists); then the version and the
                // watched heartbeats.
                super::progress::c10d(head.round, head.participants, min, max, deadline);
                // A node not yet placed is woken by its notice; it tries to admit the others
                // itself only after a whole poll interval without one (the admission writer
                // keeps going while nodes arrive).
                // A participant of a large round is woken by the summary too, and polls only
                // for its watched peers and the head (issue 16: at 10,000 nodes the shorter
                // slices of a backing-off poll were half of all requests of a join); the last
                // call is not overslept.
                let large = me_in && head.participants > self.full_check_max;
                let slice = if placed.is_none() || large {
                    let lc_left = last_call
                        .filter(|(k, _)| *k == (head.round, head.last_call_seq))
                        .map(|(_, since)| {
                            (since + self.settings.last_call_timeout).saturating_duration_since(now)
                        });
                    self.wait_slice(poll_max, deadline)
                        .min(lc_left.unwrap_or(poll_max).max(min_poll))
                } else {
                    self.wait_slice(poll, deadline)
                };
                let waited = if me_in {
                    let key = [self.keys.complete(head.round)];
                    self.store.wait(&key, slice).await
                } else if placed.is_none() {
                    let key = [self.keys.notice(head.round, &id)];
                    self.store.wait(&key, slice).await
                } else {
                    tokio::time::sleep(slice).await;
                    Ok(false)
                };
                let woke = match waited {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!(error = %e, "waiting in the rendezvous failed");
                        tokio::time::sleep(poll).await;
                        false
                    }
                };
                if woke && placed.is_none() {
                    if let Ok(Some(n)) =
                        read_notice(&*self.store, &self.keys, head.round, &id).await
                    {
                        mine = Some((head.round, n));
                    }
                }
                // Watched peers (from this node's notice) that stopped heartbeating are dropped
                // so that the round can go on; read with the version in one request (both exist
                // once this node was placed).
                let mut known = None;
                if let Some((r, n)) = &mine {
                    if *r == head.round && !n.targets.is_empty() {
                        let mut ks = vec![self.keys.version()];
                        ks.extend(n.targets.iter().map(|t| self.keys.hb(t)));
                        match self.store.multi_get(&ks).await {
                            Ok(mut vals) => {
                                known = Some(vals.remove(0));
                                let beats = n.targets.iter().cloned().zip(vals).collect();
                                dead = tracker.observe(
                                    Instant::now(),
                                    beats,
                                    self.settings.dead_after(),
                                );
                            }
                            Err(e) => tracing::debug!(error = %e, "reading heartbeats failed"),
                        }
                    }
                }
                let before = version.clone();
                text = self
                    .reread(deadline, &mut version, woke, &text, known)
                    .await?;
                if me_in && !woke && before != version && now >= notice_due {
                    // A participant's own notice changes when its watched peers do (read at
                    // most once per poll interval: the join writes often).
                    notice_due = now + poll_max;
                    if let Ok(Some(n)) =
                        read_notice(&*self.store, &self.keys, head.round, &id).await
                    {
                        mine = Some((head.round, n));
                    }
                }
                poll = if woke {
                    min_poll
                } else {
                    (poll * 2).min(poll_max)
                };
                if dead.is_empty() {
                    continue;
                }
            }
            // The full state: read it, decide as before (`join_step`), write.
            let batch_started = Instant::now();
            let (t, state) = match load_state(&*self.store, &self.keys).await {
                Ok(v) => v,
                Err(ReadError::State(e)) => return Err(e.into()),
                Err(ReadError::Store(e)) => {
                    tracing::warn!(error = %e, "rendezvous store error; retrying");
                    self.release_admit(admit, &head).await;
                    tokio::time::sleep(poll).await;
                    text = self
                        .reread(deadline, &mut version, true, &text, None)
                        .await?;
                    continue;
                }
            };
            text = t;
            mine = own_notice(&state, &id).map(|n| (state.round, n));
            if matches!(mine.as_ref().map(|m| m.1.status), Some('w') | Some('r')) {
                rejoined_at = Head::decode(&text).ok().flatten().map(|h| h.seq);
            }
            if !dead.is_empty() {
                self.release_admit(admit, &head).await;
                if let Some(new) = prune_dead(&state, &dead, min, max) {
                    tracing::warn!(?dead, "dropping nodes that stopped heartbeating");
                    match write_state(&*self.store, &self.keys, &text, Some(&state), &new).await {
                        Ok(Wrote::Won(t)) | Ok(Wrote::Lost(t)) => text = t,
                        Err(e) => tracing::debug!(error = %e, "dropping dead nodes failed"),
                    }
                }
                continue;
            }
            let pending = if admit && !state.complete && !state.closed {
                match try_get(&*self.store, &self.keys.joiners(state.round)).await {
                    Ok(Some(list)) => parse_joiners(&list),
                    _ => Vec::new(),
                }
            } else {
                Vec::new()
            };
            let me_in_state = state.is_participant(&id);
            let last_call_expired = !state.complete
                && me_in_state
                && state.participants.len() >= min
                && last_call_over(
                    &mut last_call,
                    (state.round, state.last_call_seq),
                    now,
                    self.settings.last_call_timeout,
                );
            let view = JoinView {
                me: &self.me,
                min,
                max,
                past_deadline: now >= deadline,
                last_call_expired,
                bump_from,
                pending: &pending,
            };
            let new = match join_step(&state, &view) {
                JoinStep::Done => {
                    let asg = assignment(&state, &id, self.keys.prefix()).expect(
                        "join_step returns Done only for a participant of a complete round",
                    );
                    self.release_admit(admit, &head).await;
                    // The notices, roster and summary of this round, if its completer did not
                    // get to write them (O(n): only then).
                    if let Ok(None) = try_get(&*self.store, &self.keys.complete(state.round)).await
                    {
                        publish(&*self.store, &self.keys, None, &state).await;
                    }
                    let peers = state.participants.iter().map(|m| m.id.clone()).collect();
                    return Ok(self.finish(asg, RoundPeers::Ids(peers), state.num_nodes_waiting()));
                }
                JoinStep::Closed { redundant } => {
                    self.release_admit(admit, &head).await;
                    ack_closed(&*self.store, &self.keys.closed_acks(), &id).await;
                    return Err(match &state.closed_reason {
                        Some(why) if !redundant => RendezvousError::JobFailed(why.clone()),
                        _ => RendezvousError::Closed { redundant },
                    });
                }
                JoinStep::TimedOut(leave) => {
                    self.release_admit(admit, &head).await;
                    if let Some(new) = leave {
                        // Best effort: leave the lists so the others do not wait for us.
                        let _ =
                            write_state(&*self.store, &self.keys, &text, Some(&state), &new).await;
                    }
                    return Err(RendezvousError::Timeout {
                        waited: now.duration_since(started),
                        joined: state.participants.len(),
                        min,
                    });
                }
                JoinStep::Write(new) => new,
                JoinStep::Wait => {
                    // Already placed: the admission writer still places the announced nodes.
                    let batch = if pending.is_empty() {
                        None
                    } else {
                        Some(state::place_pending(&state, &pending, min, max))
                    };
                    match batch {
                        Some(b) if b != state => b,
                        _ => {
                            let h = Head::decode(&text)
                                .ok()
                                .flatten()
                                .unwrap_or_else(empty_head);
                            self.release_admit(admit, &h).await;
                            continue;
                        }
                    }
                }
            };
            // One write admits (or places) every announced node too.
            let new = if new.round == state.round && !pending.is_empty() {
                state::place_pending(&new, &pending, min, max)
            } else {
                new
            };
            match write_state(&*self.store, &self.keys, &text, Some(&state), &new).await {
                Ok(Wrote::Won(t)) => {
                    lost = 0;
                    poll = min_poll;
                    if admit && !new.complete && !new.closed && new.round == state.round {
                        // Keep the admission key for the head just written and admit whoever
                        // announced meanwhile after a short pause (batches, not one by one).
                        let key = self.keys.admit(new.round);
                        let old_seq = Head::decode(&text).ok().flatten().map_or(0, |h| h.seq);
                        let ours = |seq: u64| format!("{seq} {}", self.me.id).into_bytes();
                        let next = Head::decode(&t).ok().flatten().map_or(0, |h| h.seq);
                        if let Ok(got) = self
                            .store
                            .compare_set(&key, &ours(old_seq), &ours(next))
                            .await
                        {
                            if got == ours(next) {
                                keep_admitting = true;
                                // As long as the batch took (20-200 ms): more arrive per write.
                                let pause = batch_started
                                    .elapsed()
                                    .clamp(Duration::from_millis(20), Duration::from_millis(200))
                                    .min(poll_max);
                                tokio::time::sleep(pause).await;
                            }
                        }
                    }
                    text = t;
                    mine = own_notice(&new, &id).map(|n| (new.round, n));
                    if matches!(mine.as_ref().map(|m| m.1.status), Some('w') | Some('r')) {
                        rejoined_at = Head::decode(&text).ok().flatten().map(|h| h.seq);
                    }
                }
                Ok(Wrote::Lost(t)) => {
                    // Lost a race: back off a random while before retrying, so that many agents
                    // writing together do not all retry in lockstep.
                    lost += 1;
                    let cap = Duration::from_millis(1u64 << lost.min(7)).min(max_backoff);
                    tokio::time::sleep(cap.mul_f64(fastrand::f64())).await;
                    tracing::debug!(lost, "rendezvous state changed under us; retrying");
                    text = t;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rendezvous store error; retrying");
                    self.release_admit(admit, &head).await;
                    tokio::time::sleep(poll).await;
                    text = self
                        .reread(deadline, &mut version, true, &text, None)
                        .await?;
                }
            }
        }
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
        let ids = if full {
            match load_state(&*self.store, &self.keys).await {
                Ok((_, st)) => watched_ids(&st, &self.me.id),
                Err(_) => return Vec::new(),
            }
        } else {
            match read_notice(&*self.store, &self.keys, round, &self.me.id).await {
                Ok(Some(n)) => n.targets,
                _ => match load_state(&*self.store, &self.keys).await {
                    Ok((_, st)) => watch_targets(&st, &self.me.id),
                    Err(_) => return Vec::new(),
                },
            }
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
                        ev_out = Some(self.dropped_now().await);
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

/// What the keeper last read of the round it monitors: the version, the head at it, and the
/// peers this node watches (its notice).
struct Seen {
    version: Vec<u8>,
    head: Head,
    targets: Vec<String>,
}

impl Seen {
    /// The keys one poll reads (the version, then the watched heartbeats), once the version key
    /// is known to exist.
    fn poll_keys(&self, keys: &Keys, round: u64) -> Option<Vec<String>> {
        if self.version.is_empty() || self.head.round != round {
            return None;
        }
        let mut out = vec![keys.version()];
        out.extend(self.targets.iter().map(|id| keys.hb(id)));
        Some(out)
    }
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
            }
            // The beat and the poll fall due together (both every second by default): one
            // round trip carries both (issue 16: the store's load per node per second).
            let combined = match mon.as_ref().filter(|m| running == Some(m.round)) {
                Some(m) if now >= next_beat && now >= next_poll && !m.ended => m
                    .seen
                    .as_ref()
                    .and_then(|s| s.poll_keys(&self.keys, m.round)),
                _ => None,
            };
            if let Some(keys) = combined {
                next_beat = now + interval;
                next_poll = now + poll;
                let r = tokio::time::timeout(
                    self.settings.heartbeat_timeout,
                    self.store.beat_and_read(&hb_key, &keys),
                )
                .await;
                let values = match r {
                    Ok(Ok(v)) if v.len() == keys.len() => {
                        loss.ok(Instant::now());
                        Some(v)
                    }
                    Ok(Ok(_)) => {
                        loss.ok(Instant::now());
                        None
                    }
                    Ok(Err(e)) => {
                        if self.beat_failed(&mut loss, running, e.to_string()) {
                            return;
                        }
                        None
                    }
                    Err(_) => {
                        if self.beat_failed(&mut loss, running, "heartbeat timed out".into()) {
                            return;
                        }
                        None
                    }
                };
                if let (Some(values), Some(m)) = (values, mon.as_mut()) {
                    if let Err(e) = self.monitor(m, Some(values)).await {
                        tracing::debug!(error = %e, "monitoring the rendezvous failed");
                    }
                }
                tokio::time::sleep(tick).await;
                continue;
            }
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
            if let Some(m) = mon.as_mut().filter(|m| running == Some(m.round)) {
                if now >= next_poll && !m.ended {
                    next_poll = now + poll;
                    if let Err(e) = self.monitor(m, None).await {
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
    /// peers (one multi_get); the small head and this node's notice only when the version moved.
    /// A watched peer found dead is dropped from the state (read for that, rarely), which every
    /// other node then sees through the version.
    async fn monitor(
        &self,
        m: &mut Monitor,
        read: Option<Vec<Vec<u8>>>,
    ) -> Result<(), StoreOpError> {
        let round = m.round;
        // Once the version key is known to exist (keys are never removed), the version and the
        // watched heartbeats are one multi_get (`read`: already done with the beat).
        let poll_keys = m.seen.as_ref().and_then(|s| s.poll_keys(&self.keys, round));
        let (version, mut beats) = match (&m.seen, poll_keys) {
            (Some(s), Some(keys)) => {
                let mut values = match read {
                    Some(v) => v,
                    None => self.store.multi_get(&keys).await?,
                };
                let version = values.remove(0);
                let beats: Vec<(String, Vec<u8>)> = s.targets.iter().cloned().zip(values).collect();
                (version, Some(beats))
            }
            _ => (read_version(&*self.store, &self.keys).await?, None),
        };
        let fresh = m
            .seen
            .as_ref()
            .map_or(true, |s| s.version != version || s.head.round != round);
        if fresh {
            let text = read_head(&*self.store, &self.keys).await?;
            let Ok(Some(head)) = Head::decode(&text) else {
                return Ok(());
            };
            let send = |ev| {
                let _ = self.tx.send((round, ev));
            };
            if head.closed {
                m.ended = true;
                ack_closed(&*self.store, &self.keys.closed_acks(), &self.me).await;
                let st = RdzvState {
                    closed: true,
                    closed_reason: head.closed_reason.clone(),
                    ..RdzvState::default()
                };
                send(closed_event(&st));
                return Ok(());
            }
            if head.round != round {
                m.ended = true;
                send(RdzvEvent::RoundChanged {
                    round: head.round,
                    reason: head.reason,
                });
                return Ok(());
            }
            let waiting = head.waiting;
            lock(&self.shared).waiting = waiting;
            if waiting > 0 && waiting != m.waiting {
                send(RdzvEvent::NodesWaiting(waiting));
            }
            m.waiting = waiting;
            let targets = match read_notice(&*self.store, &self.keys, round, &self.me).await? {
                Some(n) => n.targets,
                None => m
                    .seen
                    .as_ref()
                    .map(|s| s.targets.clone())
                    .unwrap_or_default(),
            };
            m.seen = Some(Seen {
                version,
                head,
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
        let (text, state) = match load_state(&*self.store, &self.keys).await {
            Ok(v) => v,
            Err(ReadError::Store(e)) => return Err(e),
            Err(ReadError::State(_)) => return Ok(()),
        };
        if state.round != round {
            // Moved on meanwhile: the version shows it next poll.
            m.seen = None;
            return Ok(());
        }
        let Some(new) = prune_dead(&state, &dead, min, max) else {
            return Ok(());
        };
        match write_state(&*self.store, &self.keys, &text, Some(&state), &new).await? {
            Wrote::Won(_) => {
                tracing::warn!(?dead, round, "peers stopped heartbeating; dropped them");
                if new.round != round {
                    m.ended = true;
                    send_lost(&self.tx, round, dead);
                }
            }
            Wrote::Lost(_) => {
                // The state moved under us: read it again next poll.
                m.seen = None;
            }
        }
        Ok(())
    }
}

/// Reports peers this keeper dropped to the agent running `round`.
fn send_lost(tx: &mpsc::UnboundedSender<(u64, RdzvEvent)>, round: u64, dead: Vec<String>) {
    let _ = tx.send((round, RdzvEvent::PeersLost(dead)));
}

/// The last call of round state `key` (round, last-call sequence) is over: `timeout` since
/// this node first saw that key (a new key restarts the clock; a zero timeout is over at once).
fn last_call_over(
    seen: &mut Option<((u64, u64), Instant)>,
    key: (u64, u64),
    now: Instant,
    timeout: Duration,
) -> bool {
    match *seen {
        Some((k, since)) if k == key => now.duration_since(since) >= timeout,
        _ => {
            *seen = Some((key, now));
            timeout.is_zero()
        }
    }
}

#[cfg(test)]
#[path = "c10d_tests.rs"]
mod tests;
