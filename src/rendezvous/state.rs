//! The c10d-like rendezvous state every agent shares, and the pure decisions taken on it.
//!
//! The state is one JSON document ([`RdzvState`], the body) named by a small [`Head`] in one store
//! key (`rdrun.rendezvous.<run_id>/state`); the head is updated only with `compare_set` using the
//! previously read head as fencing token (as torchrun's `C10dRendezvousBackend` does with its
//! pickled state; spec torchrun-compat §4.2), each body is written once under a key of its own.
//! PyTorch's state is a pickled Python object, so rdrun and Python torchrun agents cannot share
//! one rendezvous. Issue 16 (10,000 nodes): the head carries the counts every node needs, and the
//! per-node keys are pure functions of the state here ([`notices`]: each node's list and watched
//! peers; [`roster`]: a complete round's `id nproc` lines, from which [`roster_assignment`]
//! builds the same [`Assignment`] as [`assignment`]); [`place_pending`] lets one write place
//! every announced joiner.
//!
//! Everything here is synchronous and clock-free: the driver (`c10d.rs`) reads the state, measures
//! local time, asks [`join_step`] what to do and writes the returned state. Time-dependent inputs
//! (join deadline passed, last call expired) are booleans computed by the driver with its own
//! monotonic clock, so clock skew between machines never matters.
//!
//! # Semantics (torchrun's, plus rdrun's changes)
//! - Rounds: a round collects participants until it completes; then it stays complete (agents run
//!   their workers) until some agent starts the next round ([`bump_round`]): after a worker
//!   failure (charged to the job-wide `restart_count`), to admit waiting nodes, or after a peer
//!   was lost. torchrun instead lets each agent leave separately; one bump restarts every node at
//!   once and counts once.
//! - Join: an incomplete round admits nodes up to `max`; at `min` a last call starts (completes
//!   after `last_call_timeout`), at `max` it completes at once. rdrun addition: a round started by
//!   a bump remembers the nodes it expects (survivors and waiting nodes) and completes as soon as
//!   all of them have rejoined, without waiting out the last call; their slots are reserved.
//! - A complete round with room (`< max`) puts newcomers on the wait list (running agents see
//!   `num_nodes_waiting() > 0` and restart into a bigger world without charging a restart); a full
//!   round puts them on the redundancy list, where they wait without a deadline.
//! - Node order (group rank), decided when a round completes: nodes of the previous round keep
//!   their relative order (so rank 0 stays on the same node while it lives), newcomers follow,
//!   ordered by address (IPv4 numerically, then IPv6 numerically, then names as text), then agent
//!   pid, then local id. torchrun sorts `(addr, pid, local_id)` as plain strings every round.
//! - MASTER_ADDR/MASTER_PORT come from the state of each round (group rank 0's address and the
//!   port it published when joining), so they are never stale.
//!
//! What a round publishes in keys of its own (the [`Assignment`] and how it is built, the
//! [`Head`], [`notices`], [`roster`] and round summary) is in `state/published.rs`.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

mod published;
pub use published::*;

/// Version of the JSON layout; agents refuse a state written in another format.
pub const STATE_FORMAT: u32 = 3;

/// One agent as the rendezvous knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `<addr>_<pid>_<local_id>`, unique per agent (torchrun's node descriptor).
    pub id: String,
    /// The address peers reach this node at (`--local-addr` or the detected route address).
    pub addr: String,
    pub pid: u32,
    pub local_id: u32,
    /// This node's number of workers (heterogeneous values are allowed).
    pub nproc: usize,
    /// Port of the worker store this node serves if it becomes group rank 0.
    pub master_port: u16,
}

impl Member {
    /// A member with the id built from its descriptor.
    pub fn new(addr: &str, pid: u32, local_id: u32, nproc: usize, master_port: u16) -> Self {
        Self {
            id: format!("{addr}_{pid}_{local_id}"),
            addr: addr.to_string(),
            pid,
            local_id,
            nproc,
            master_port,
        }
    }
}

/// Why the current round was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RoundReason {
    /// The first round of the job.
    #[default]
    Initial,
    /// Some agent's workers failed: charged to the job-wide restart budget.
    WorkerFailure,
    /// Nodes were waiting to join (scale-up); not charged.
    Membership,
    /// A node stopped heartbeating and was dropped; not charged.
    PeerLost,
}

impl RoundReason {
    /// The name in the state, the roster, the summary and the events (`initial`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::WorkerFailure => "worker_failure",
            Self::Membership => "membership",
            Self::PeerLost => "peer_lost",
        }
    }

    /// The reason [`RoundReason::name`] gives `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Initial,
            Self::WorkerFailure,
            Self::Membership,
            Self::PeerLost,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    }
}

/// The shared rendezvous state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdzvState {
    pub format: u32,
    pub round: u64,
    pub complete: bool,
    pub closed: bool,
    /// Why it was closed, when a node gave up (`failed on node N (addr)`); `None` = finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_reason: Option<String>,
    /// While incomplete: join order; once complete: group-rank order.
    pub participants: Vec<Member>,
    pub wait_list: Vec<Member>,
    pub redundancy_list: Vec<Member>,
    /// Ids this (bumped) round waits for; empty for the first round.
    pub expected: Vec<String>,
    /// Group-rank order of the previous complete round (rank stability).
    pub prev_order: Vec<String>,
    /// Incremented each time the participant count reaches `min` (a new last call starts).
    pub last_call_seq: u64,
    /// Job-wide failure restarts (TORCHELASTIC_RESTART_COUNT).
    pub restart_count: u32,
    pub reason: RoundReason,
}

impl Default for RdzvState {
    fn default() -> Self {
        Self {
            format: STATE_FORMAT,
            round: 0,
            complete: false,
            closed: false,
            closed_reason: None,
            participants: Vec::new(),
            wait_list: Vec::new(),
            redundancy_list: Vec::new(),
            expected: Vec::new(),
            prev_order: Vec::new(),
            last_call_seq: 0,
            restart_count: 0,
            reason: RoundReason::Initial,
        }
    }
}

/// Text stored in the state key before any agent wrote a state (also the read sentinel: reading
/// is `compare_set(key, "", NO_STATE)`, which never changes an existing state).
pub const NO_STATE: &[u8] = b"null";

/// Why a stored state could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("rendezvous state is not rdrun's (is a PyTorch torchrun agent using the same run id and endpoint?): {0}")]
    Foreign(String),
    #[error("rendezvous state has format {found}, this rdrun understands {STATE_FORMAT}")]
    Format { found: u32 },
}

impl RdzvState {
    /// Parses the stored text; [`NO_STATE`] means a fresh state.
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes == NO_STATE {
            return Ok(Self::default());
        }
        let state: RdzvState =
            serde_json::from_slice(bytes).map_err(|e| StateError::Foreign(e.to_string()))?;
        if state.format != STATE_FORMAT {
            return Err(StateError::Format {
                found: state.format,
            });
        }
        Ok(state)
    }

    /// The stored text.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("state is plain data and always serializes")
    }

    pub fn is_participant(&self, id: &str) -> bool {
        self.participants.iter().any(|m| m.id == id)
    }
    pub fn in_wait_list(&self, id: &str) -> bool {
        self.wait_list.iter().any(|m| m.id == id)
    }
    pub fn in_redundancy_list(&self, id: &str) -> bool {
        self.redundancy_list.iter().any(|m| m.id == id)
    }

    /// Number of nodes on the wait list (torchrun's `num_nodes_waiting()`).
    pub fn num_nodes_waiting(&self) -> usize {
        self.wait_list.len()
    }

    /// Every member on a list: participants, then the wait and the redundancy list.
    pub fn listed(&self) -> impl Iterator<Item = &Member> {
        self.participants
            .iter()
            .chain(&self.wait_list)
            .chain(&self.redundancy_list)
    }

    /// Every member known to the state, except `except` (whose heartbeats others watch).
    pub fn watched_members(&self, except: &str) -> Vec<&Member> {
        self.listed().filter(|m| m.id != except).collect()
    }

    /// Drops `id` from every list (an agent leaving).
    pub fn remove_everywhere(&mut self, id: &str) {
        self.participants.retain(|m| m.id != id);
        self.wait_list.retain(|m| m.id != id);
        self.redundancy_list.retain(|m| m.id != id);
        self.expected.retain(|e| e != id);
    }
}

/// How many peers' heartbeats each node watches (see [`watch_targets`]).
pub const WATCHERS: usize = 2;

/// The two lists [`watch_targets`] pairs: the participants in group-rank order, and every
/// other known node (expected, waiting, redundant) once, in that order.
fn watch_lists(state: &RdzvState) -> (Vec<&str>, Vec<&str>) {
    let parts: Vec<&str> = state.participants.iter().map(|m| m.id.as_str()).collect();
    let in_parts: std::collections::HashSet<&str> = parts.iter().copied().collect();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let others: Vec<&str> = state
        .expected
        .iter()
        .map(String::as_str)
        .chain(state.wait_list.iter().map(|m| m.id.as_str()))
        .chain(state.redundancy_list.iter().map(|m| m.id.as_str()))
        .filter(|id| !in_parts.contains(id) && seen.insert(id))
        .collect();
    (parts, others)
}

/// The peers whose heartbeats `me` watches in `state`: each node watches a few others
/// instead of all of them, so that a poll costs O(1) per node instead of O(n) (issue 16; the
/// all-to-all watching made the store's load grow with n² and, at 1,000 nodes, made live nodes
/// look dead). Rules, with `P` the participants in list order (group-rank order once complete)
/// and `O` every other known node (expected but not rejoined, wait list, redundancy list):
/// - participant `P[i]` watches its [`WATCHERS`] successors `P[i+1], P[i+2]` (cyclic), so every
///   participant is watched by its two predecessors;
/// - `O[j]` and `P[j mod n], P[j+1 mod n]` watch each other (a waiting node still notices when
///   every participant died), and without participants the `O` watch their successors in `O`.
///
/// Whoever notices a dead node drops it from the state; the others learn it from the state
/// (whose version key every node polls). A node in no list watches nobody.
pub fn watch_targets(state: &RdzvState, me: &str) -> Vec<String> {
    let (parts, others) = watch_lists(state);
    let mut out: Vec<String> = Vec::new();
    let mut push = |id: &str| {
        if id != me && !out.iter().any(|o| o == id) {
            out.push(id.to_string());
        }
    };
    let n = parts.len();
    if let Some(i) = parts.iter().position(|p| *p == me) {
        for d in 1..=WATCHERS.min(n - 1) {
            push(parts[(i + d) % n]);
        }
        for (j, o) in others.iter().enumerate() {
            if (0..WATCHERS).any(|d| (j + d) % n == i) {
                push(o);
            }
        }
    } else if let Some(j) = others.iter().position(|o| *o == me) {
        if n > 0 {
            for d in 0..WATCHERS.min(n) {
                push(parts[(j + d) % n]);
            }
        } else {
            let m = others.len();
            for d in 1..=WATCHERS.min(m - 1) {
                push(others[(j + d) % m]);
            }
        }
    }
    out
}

/// Sort key for a node's address: IPv4 (numeric) < IPv6 (numeric) < names (text).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum AddrKey {
    V4(std::net::Ipv4Addr),
    V6(std::net::Ipv6Addr),
    Name(String),
}

fn addr_key(addr: &str) -> AddrKey {
    match addr
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<IpAddr>()
    {
        Ok(IpAddr::V4(a)) => AddrKey::V4(a),
        Ok(IpAddr::V6(a)) => AddrKey::V6(a),
        Err(_) => AddrKey::Name(addr.to_string()),
    }
}

/// Orders participants into group ranks (see the module docs).
pub fn order_participants(participants: &mut [Member], prev_order: &[String]) {
    participants.sort_by_cached_key(|m| {
        let prev = prev_order
            .iter()
            .position(|id| *id == m.id)
            .unwrap_or(usize::MAX);
        (prev, addr_key(&m.addr), m.pid, m.local_id, m.id.clone())
    });
}

/// Marks the round complete: participants get their final order.
pub fn mark_complete(state: &mut RdzvState) {
    let prev = std::mem::take(&mut state.prev_order);
    order_participants(&mut state.participants, &prev);
    state.prev_order = prev;
    state.complete = true;
    state.expected.clear();
}

/// Completes an incomplete round when its completion rule holds: `max` reached, or (bumped round)
/// every expected node rejoined and there are at least `min`.
fn maybe_complete(state: &mut RdzvState, min: usize, max: usize) {
    if state.complete {
        return;
    }
    let n = state.participants.len();
    let all_expected = !state.expected.is_empty()
        && state
            .expected
            .iter()
            .all(|id| state.participants.iter().any(|m| &m.id == id));
    if n >= max || (all_expected && n >= min) {
        mark_complete(state);
    }
}

/// Starts the next round from a complete one. `dead` nodes are dropped everywhere; the survivors
/// and the waiting nodes are expected in the new round. A [`RoundReason::WorkerFailure`] bump
/// charges the job-wide restart count.
pub fn bump_round(state: &RdzvState, reason: RoundReason, dead: &[String]) -> RdzvState {
    let mut new = state.clone();
    for id in dead {
        new.remove_everywhere(id);
    }
    new.round += 1;
    new.complete = false;
    new.prev_order = state.participants.iter().map(|m| m.id.clone()).collect();
    new.expected = new
        .participants
        .iter()
        .chain(&new.wait_list)
        .map(|m| m.id.clone())
        .collect();
    new.participants.clear();
    if reason == RoundReason::WorkerFailure {
        new.restart_count += 1;
    }
    new.reason = reason;
    new
}

/// Drops nodes found dead. A complete round that loses a participant is bumped
/// ([`RoundReason::PeerLost`]); otherwise they are just removed. `None` if nothing changes.
pub fn prune_dead(state: &RdzvState, dead: &[String], min: usize, max: usize) -> Option<RdzvState> {
    let known: Vec<String> = dead
        .iter()
        .filter(|id| {
            state.is_participant(id)
                || state.in_wait_list(id)
                || state.in_redundancy_list(id)
                || state.expected.contains(id)
        })
        .cloned()
        .collect();
    if known.is_empty() || state.closed {
        return None;
    }
    if state.complete && known.iter().any(|id| state.is_participant(id)) {
        return Some(bump_round(state, RoundReason::PeerLost, &known));
    }
    let mut new = state.clone();
    for id in &known {
        new.remove_everywhere(id);
    }
    maybe_complete(&mut new, min, max);
    Some(new)
}

/// Node `id` leaves of its own accord (issue 28: its network pre-check found it slow, or its
/// workers failed `--max-node-failures` times) while the others go on: a complete round it runs
/// is bumped without it for `reason` ([`RoundReason::Membership`]: not charged;
/// [`RoundReason::WorkerFailure`]: charged); otherwise it is removed and the round completes if
/// it now can. `None` when it is not listed, the rendezvous is closed, or fewer than `min`
/// nodes would be left (several nodes failing at once: only as many leave as there are spares).
pub fn leave(
    state: &RdzvState,
    id: &str,
    reason: RoundReason,
    min: usize,
    max: usize,
) -> Option<RdzvState> {
    let known = state.is_participant(id)
        || state.in_wait_list(id)
        || state.in_redundancy_list(id)
        || state.expected.iter().any(|e| e == id);
    if !known || state.closed {
        return None;
    }
    let mut others: Vec<&str> = state
        .listed()
        .map(|m| m.id.as_str())
        .chain(state.expected.iter().map(String::as_str))
        .filter(|o| *o != id)
        .collect();
    others.sort_unstable();
    others.dedup();
    if others.len() < min {
        return None;
    }
    if state.complete && state.is_participant(id) {
        return Some(bump_round(state, reason, &[id.to_string()]));
    }
    let mut new = state.clone();
    new.remove_everywhere(id);
    maybe_complete(&mut new, min, max);
    Some(new)
}

/// Marks the rendezvous closed (no new rounds; joiners get an error), with why if a node gave up.
pub fn close(state: &RdzvState, reason: Option<&str>) -> RdzvState {
    let mut new = state.clone();
    new.closed = true;
    new.closed_reason = reason.map(str::to_string);
    new
}

/// Inputs of one join decision that come from the driver.
#[derive(Debug, Clone)]
pub struct JoinView<'a> {
    pub me: &'a Member,
    pub min: usize,
    pub max: usize,
    /// The join deadline passed (never set while waiting on the redundancy list of a full round).
    pub past_deadline: bool,
    /// The last call of the current `(round, last_call_seq)` has run for `last_call_timeout`.
    pub last_call_expired: bool,
    /// This agent ran round `r` and asks for a new one for this reason (bump if nobody did).
    pub bump_from: Option<(u64, RoundReason)>,
    /// Agents that announced they join the current round, in announcement order.
    pub pending: &'a [Member],
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinStep {
    /// The round is complete with this agent in it.
    Done,
    /// Write this state (compare_set against the text just read), then decide again.
    Write(RdzvState),
    /// Nothing to do now; read again later.
    Wait,
    /// The rendezvous is closed; `redundant` when this agent was only on the redundancy list.
    Closed { redundant: bool },
    /// Join deadline passed: write the state (leaving every list) if any, then fail.
    TimedOut(Option<RdzvState>),
}

/// Whether an incomplete round has a slot for `id`: slots of expected nodes that have not
/// rejoined yet are reserved for them.
fn can_admit(state: &RdzvState, id: &str, max: usize) -> bool {
    let reserved = if state.expected.iter().any(|e| e == id) {
        0
    } else {
        state
            .expected
            .iter()
            .filter(|e| !state.is_participant(e))
            .count()
    };
    state.participants.len() + reserved < max
}

/// Adds `m` to the participants of an incomplete round (leaving the other lists); reaching `min`
/// starts a new last call.
fn admit(state: &mut RdzvState, m: &Member, min: usize) {
    state.wait_list.retain(|w| w.id != m.id);
    state.redundancy_list.retain(|r| r.id != m.id);
    // The record is the joiner's own (its worker-store port may change between rounds).
    state.participants.push(m.clone());
    if state.participants.len() == min {
        state.last_call_seq += 1;
    }
}

/// One step of the join loop (torchrun's `_RendezvousJoinOp`, with rdrun's round bump and
/// reserved slots for expected nodes).
pub fn join_step(state: &RdzvState, v: &JoinView<'_>) -> JoinStep {
    let id = v.me.id.as_str();
    if state.closed {
        return JoinStep::Closed {
            redundant: state.in_redundancy_list(id) && !state.is_participant(id),
        };
    }
    if let Some((round, reason)) = v.bump_from {
        if state.round == round && state.complete {
            return JoinStep::Write(bump_round(state, reason, &[]));
        }
    }
    let is_participant = state.is_participant(id);
    if state.complete && is_participant {
        return JoinStep::Done;
    }
    if v.past_deadline {
        if is_participant || state.in_wait_list(id) || state.in_redundancy_list(id) {
            let mut new = state.clone();
            new.remove_everywhere(id);
            return JoinStep::TimedOut(Some(new));
        }
        return JoinStep::TimedOut(None);
    }
    if state.complete {
        return outside_complete_round(state, v);
    }
    if is_participant {
        if state.participants.len() >= v.min && v.last_call_expired {
            let mut new = state.clone();
            mark_complete(&mut new);
            return JoinStep::Write(new);
        }
        return JoinStep::Wait;
    }
    // Incomplete round, not yet in it: join unless the free slots are reserved for expected nodes.
    if let Some(mut new) = admit_batch(state, v) {
        maybe_complete(&mut new, v.min, v.max);
        return JoinStep::Write(new);
    }
    if !state.in_redundancy_list(id) {
        // No slot: wait on the redundancy list (leaving the wait list of an earlier round).
        let mut new = state.clone();
        new.wait_list.retain(|w| w.id != id);
        new.redundancy_list.push(v.me.clone());
        return JoinStep::Write(new);
    }
    JoinStep::Wait
}

/// A complete round this agent is not in: it waits on the wait list while the round has room
/// (a bump will take it in), else on the redundancy list.
fn outside_complete_round(state: &RdzvState, v: &JoinView<'_>) -> JoinStep {
    let id = v.me.id.as_str();
    let mut new = state.clone();
    if state.participants.len() < v.max {
        if !state.in_wait_list(id) {
            new.redundancy_list.retain(|m| m.id != id);
            new.wait_list.push(v.me.clone());
            return JoinStep::Write(new);
        }
    } else if !state.in_wait_list(id) && !state.in_redundancy_list(id) {
        new.redundancy_list.push(v.me.clone());
        return JoinStep::Write(new);
    }
    JoinStep::Wait
}

/// An incomplete round this agent is not in: admits it with every other announced joiner that
/// fits (announcement order), so N agents starting together need a few writes instead of N
/// contended ones. `None` when no slot is left for this agent (free slots are reserved for
/// expected nodes that have not rejoined).
fn admit_batch(state: &RdzvState, v: &JoinView<'_>) -> Option<RdzvState> {
    let id = v.me.id.as_str();
    // Sets instead of list scans: one write may admit thousands (issue 16); the decisions are
    // `can_admit`'s and `admit`'s, one candidate after the other.
    let parts: HashSet<&str> = state.participants.iter().map(|m| m.id.as_str()).collect();
    let mut candidates: Vec<&Member> = v
        .pending
        .iter()
        .filter(|p| !parts.contains(p.id.as_str()))
        .map(|p| if p.id == id { v.me } else { p })
        .collect();
    if !candidates.iter().any(|c| c.id == id) {
        candidates.push(v.me);
    }
    let mut expected: HashMap<&str, usize> = HashMap::new();
    for e in &state.expected {
        *expected.entry(e.as_str()).or_default() += 1;
    }
    // Slots reserved for expected nodes that have not rejoined (as `can_admit` counts them).
    let mut reserved: usize = state
        .expected
        .iter()
        .filter(|e| !parts.contains(e.as_str()))
        .count();
    let mut admitted: HashSet<&str> = HashSet::new();
    let mut new = state.clone();
    let mut me_in = false;
    for c in candidates {
        if admitted.contains(c.id.as_str()) {
            continue;
        }
        let times_expected = expected.get(c.id.as_str()).copied().unwrap_or(0);
        let r = if times_expected > 0 { 0 } else { reserved };
        let fits = new.participants.len() + r < v.max;
        // The counted rule is `can_admit`'s (checked in debug builds, O(n) each).
        debug_assert_eq!(fits, can_admit(&new, &c.id, v.max));
        if fits {
            admit(&mut new, c, v.min);
            admitted.insert(c.id.as_str());
            reserved -= times_expected.min(reserved);
            me_in |= c.id == id;
        }
    }
    me_in.then_some(new)
}

/// Places every announced joiner of `pending` as its own [`join_step`] would, one after the
/// other (so one write admits a whole batch, and a joiner that does not fit goes to the wait or
/// redundancy list as if it had written itself). Members already placed are left alone.
pub fn place_pending(state: &RdzvState, pending: &[Member], min: usize, max: usize) -> RdzvState {
    let mut cur = state.clone();
    let mut placed: HashSet<String> = cur.listed().map(|m| m.id.clone()).collect();
    let unplaced: Vec<Member> = pending
        .iter()
        .filter(|p| !placed.contains(&p.id))
        .cloned()
        .collect();
    // An incomplete round admits the whole batch in one step (one copy of the state); whoever
    // does not fit is placed one by one below.
    if let Some(first) = unplaced.first() {
        if !cur.complete && !cur.closed {
            let v = JoinView {
                me: first,
                min,
                max,
                past_deadline: false,
                last_call_expired: false,
                bump_from: None,
                pending: &unplaced,
            };
            if let JoinStep::Write(s) = join_step(&cur, &v) {
                if s.round == cur.round {
                    cur = s;
                }
            }
            placed.extend(cur.listed().map(|m| m.id.clone()));
        }
    }
    for p in &unplaced {
        if placed.contains(&p.id) {
            continue;
        }
        let v = JoinView {
            me: p,
            min,
            max,
            past_deadline: false,
            last_call_expired: false,
            bump_from: None,
            pending: &[],
        };
        for _ in 0..4 {
            match join_step(&cur, &v) {
                JoinStep::Write(s) if s.round == cur.round => cur = s,
                _ => break,
            }
        }
        placed.insert(p.id.clone());
    }
    cur
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
