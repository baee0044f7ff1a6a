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
//! Length: about 1,140 lines of pure decisions (the head, notices, roster and round summary of issue 16
//! included); the rest are their table and property tests.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

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
        return JoinStep::Wait;
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
    // Every other announced joiner that fits is admitted in the same write (announcement order),
    // so N agents starting together need a few writes instead of N contended ones.
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
    if me_in {
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

/// What one agent runs with in a completed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub round: u64,
    /// GROUP_RANK.
    pub group_rank: usize,
    /// GROUP_WORLD_SIZE.
    pub group_world_size: usize,
    /// LOCAL_WORLD_SIZE of this node.
    pub local_world_size: usize,
    /// RANK of local rank 0: the sum of the nproc of lower group ranks.
    pub base_rank: usize,
    /// WORLD_SIZE: the sum of every node's nproc.
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// TORCHELASTIC_RESTART_COUNT, equal on every node (job-wide).
    pub restart_count: u32,
    /// Why this round started.
    pub reason: RoundReason,
    /// Store key prefix for this round's agent keys (exit barrier), without trailing "/".
    pub store_prefix: String,
    /// `(addr, nproc)` of every node in group-rank order, or empty where the rendezvous does
    /// not read every node's entry: c10d rounds above [`ROSTER_EAGER_MAX`] nodes (issue 16: a
    /// 10,000-node roster read by every node is 2 GB through the store) and single-node runs.
    pub nodes: Vec<(String, usize)>,
    /// Every node runs the same number of workers (known even when `nodes` is empty).
    pub uniform_nproc: bool,
}

/// c10d participants of a round of up to this many nodes read its whole roster (and fill
/// [`Assignment::nodes`]); above, each reads the round's summary and its own notice only
/// (O(1) bytes per node), and the roster only where a loss needs the peers' ids.
pub const ROSTER_EAGER_MAX: usize = 256;

/// Ranks from per-node nproc in group-rank order: `(base_rank, world_size)` for `group_rank`.
pub fn base_rank(nprocs: &[usize], group_rank: usize) -> (usize, usize) {
    (
        nprocs[..group_rank.min(nprocs.len())].iter().sum(),
        nprocs.iter().sum(),
    )
}

/// The assignment of `id` in a complete state, or `None` if it is not a participant.
pub fn assignment(state: &RdzvState, id: &str, store_prefix: &str) -> Option<Assignment> {
    if !state.complete {
        return None;
    }
    let group_rank = state.participants.iter().position(|m| m.id == id)?;
    let nprocs: Vec<usize> = state.participants.iter().map(|m| m.nproc).collect();
    let (base, world) = base_rank(&nprocs, group_rank);
    let master = &state.participants[0];
    Some(Assignment {
        round: state.round,
        group_rank,
        group_world_size: state.participants.len(),
        local_world_size: state.participants[group_rank].nproc,
        base_rank: base,
        world_size: world,
        master_addr: master.addr.clone(),
        master_port: master.master_port,
        restart_count: state.restart_count,
        reason: state.reason,
        store_prefix: format!("{store_prefix}.{}", state.round),
        nodes: state
            .participants
            .iter()
            .map(|m| (m.addr.clone(), m.nproc))
            .collect(),
        uniform_nproc: nprocs.iter().all(|n| *n == nprocs[0]),
    })
}

/// How many members one writer's notices cover per `multi_set` (keeps a request well under the
/// store's limits at any size).
pub const NOTICE_CHUNK: usize = 512;

/// The small key every agent reads (`<prefix>/state`): the summary of the current state and
/// where its body (the full [`RdzvState`], O(n) bytes) is. Writes compare-and-set this head, so
/// a lost race costs a few hundred bytes instead of the whole state (issue 16); the body key is
/// written once, before the head that names it, and never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub format: u32,
    /// Incremented by every write (the body key is unique per write).
    pub seq: u64,
    /// The body's key, relative to the run's prefix.
    pub body: String,
    pub round: u64,
    pub complete: bool,
    pub closed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_reason: Option<String>,
    pub reason: RoundReason,
    pub restart_count: u32,
    pub participants: usize,
    pub waiting: usize,
    pub redundant: usize,
    pub last_call_seq: u64,
}

impl Head {
    /// The head of `state` written as write number `seq` with its body at `body`.
    pub fn of(state: &RdzvState, seq: u64, body: &str) -> Self {
        Self {
            format: STATE_FORMAT,
            seq,
            body: body.to_string(),
            round: state.round,
            complete: state.complete,
            closed: state.closed,
            closed_reason: state.closed_reason.clone(),
            reason: state.reason,
            restart_count: state.restart_count,
            participants: state.participants.len(),
            waiting: state.wait_list.len(),
            redundant: state.redundancy_list.len(),
            last_call_seq: state.last_call_seq,
        }
    }

    /// Parses the head key's text: `None` for [`NO_STATE`] (nothing written yet).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, StateError> {
        if bytes == NO_STATE {
            return Ok(None);
        }
        #[derive(Deserialize)]
        struct Probe {
            format: u32,
        }
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| StateError::Foreign(e.to_string()))?;
        if probe.format != STATE_FORMAT {
            return Err(StateError::Format {
                found: probe.format,
            });
        }
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| StateError::Foreign(e.to_string()))
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("head is plain data and always serializes")
    }
}

/// [`watch_targets`] of every known node at once, in O(n) (a writer publishes them all).
pub fn all_watch_targets(state: &RdzvState) -> Vec<(String, Vec<String>)> {
    let (parts, others) = watch_lists(state);
    fn push(out: &mut Vec<String>, me: &str, id: &str) {
        if id != me && !out.iter().any(|o| o == id) {
            out.push(id.to_string());
        }
    }
    let n = parts.len();
    let mut pt: Vec<Vec<String>> = vec![Vec::new(); n];
    for (i, t) in pt.iter_mut().enumerate() {
        for d in 1..=WATCHERS.min(n.saturating_sub(1)) {
            push(t, parts[i], parts[(i + d) % n]);
        }
    }
    let m = others.len();
    let mut ot: Vec<Vec<String>> = vec![Vec::new(); m];
    for (j, o) in others.iter().enumerate() {
        if n > 0 {
            for d in 0..WATCHERS {
                let i = (j + d) % n;
                push(&mut pt[i], parts[i], o);
            }
            for d in 0..WATCHERS.min(n) {
                push(&mut ot[j], o, parts[(j + d) % n]);
            }
        } else {
            for d in 1..=WATCHERS.min(m - 1) {
                push(&mut ot[j], o, others[(j + d) % m]);
            }
        }
    }
    parts
        .iter()
        .map(|p| p.to_string())
        .zip(pt)
        .chain(others.iter().map(|o| o.to_string()).zip(ot))
        .collect()
}

/// What a node's notice key says about it in one round: which list it is on (`p` participant,
/// `e` expected but not rejoined, `w` wait list, `r` redundancy list, `x` no longer in any) and
/// the peers it watches.
/// A participant's notice in a complete round also carries its group rank and base rank
/// (encoded `p=<group_rank>,<base_rank> <targets>`): with the round's summary
/// ([`round_summary`]) that is its whole assignment, without reading the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub status: char,
    /// `(group_rank, base_rank)`: a participant of a complete round.
    pub rank: Option<(usize, usize)>,
    pub targets: Vec<String>,
}

impl Notice {
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::from(self.status);
        if let Some((g, b)) = self.rank {
            s.push_str(&format!("={g},{b}"));
        }
        for t in &self.targets {
            s.push(' ');
            s.push_str(t);
        }
        s.into_bytes()
    }
    pub fn decode(v: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(v).ok()?;
        let mut it = text.split(' ');
        let first = it.next()?;
        let mut chars = first.chars();
        let status = chars.next()?;
        let rest = chars.as_str();
        let rank = match rest.strip_prefix('=') {
            None if rest.is_empty() => None,
            None => return None,
            Some(r) => {
                let (g, b) = r.split_once(',')?;
                Some((g.parse().ok()?, b.parse().ok()?))
            }
        };
        Some(Self {
            status,
            rank,
            targets: it.filter(|t| !t.is_empty()).map(str::to_string).collect(),
        })
    }
}

/// Every known node's notice in `state`.
fn all_notices(state: &RdzvState) -> Vec<(String, Notice)> {
    let parts: HashSet<&str> = state.participants.iter().map(|m| m.id.as_str()).collect();
    let wait: HashSet<&str> = state.wait_list.iter().map(|m| m.id.as_str()).collect();
    let red: HashSet<&str> = state
        .redundancy_list
        .iter()
        .map(|m| m.id.as_str())
        .collect();
    // A complete round's participants learn their ranks from their notices.
    let mut ranks: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    if state.complete {
        let mut base = 0;
        for (g, m) in state.participants.iter().enumerate() {
            ranks.insert(m.id.as_str(), (g, base));
            base += m.nproc;
        }
    }
    let mut out = Vec::new();
    for (id, targets) in all_watch_targets(state) {
        let rank = ranks.get(id.as_str()).copied();
        let status = if parts.contains(id.as_str()) {
            'p'
        } else if wait.contains(id.as_str()) {
            'w'
        } else if red.contains(id.as_str()) {
            'r'
        } else {
            // Expected, not rejoined: no key (it waits to be admitted; participants watch it).
            continue;
        };
        out.push((
            id,
            Notice {
                status,
                rank,
                targets,
            },
        ));
    }
    out
}

/// The notices a writer publishes after replacing `old` with `new` (issue 16): nodes wait on
/// their own small key instead of reading the O(n) state. Within one round only the nodes
/// whose notice changed (and `x` for the ones dropped); for a new round (or no `old`) every
/// node of it. A closed state needs none (the head says so).
pub fn notices(old: Option<&RdzvState>, new: &RdzvState) -> Vec<(String, Notice)> {
    if new.closed {
        return Vec::new();
    }
    let fresh = all_notices(new);
    let Some(old) = old.filter(|o| o.round == new.round && !o.closed) else {
        return fresh;
    };
    let before: std::collections::HashMap<String, Notice> = all_notices(old).into_iter().collect();
    let now: std::collections::HashSet<&str> = fresh.iter().map(|(id, _)| id.as_str()).collect();
    let mut gone: Vec<(String, Notice)> = before
        .keys()
        .filter(|id| !now.contains(id.as_str()))
        .map(|id| {
            (
                id.clone(),
                Notice {
                    status: 'x',
                    rank: None,
                    targets: Vec::new(),
                },
            )
        })
        .collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    fresh
        .into_iter()
        .filter(|(id, n)| before.get(id) != Some(n))
        .chain(gone)
        .collect()
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

/// The compact roster of a complete round (issue 16): a header line
/// `rdrun-roster <round> <restart_count> <reason> <master_port>` and one `<id> <nproc>` line per
/// participant in group-rank order. Written once when the round completes; every participant
/// reads it once and builds its [`Assignment`] from it ([`roster_assignment`]).
pub fn roster(state: &RdzvState) -> Vec<u8> {
    let port = state.participants.first().map_or(0, |m| m.master_port);
    let mut out = format!(
        "rdrun-roster {} {} {} {port}\n",
        state.round,
        state.restart_count,
        state.reason.name()
    );
    for m in &state.participants {
        out.push_str(&m.id);
        out.push(' ');
        out.push_str(&m.nproc.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

/// The address part of a node id (`<addr>_<pid>_<local_id>`).
pub fn id_addr(id: &str) -> &str {
    id.rsplitn(3, '_').nth(2).unwrap_or(id)
}

/// The roster's participant ids, in group-rank order (`None`: not a roster).
pub fn roster_ids(roster: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(roster).ok()?;
    let mut lines = text.lines();
    lines.next()?.strip_prefix("rdrun-roster ")?;
    lines
        .map(|l| l.split(' ').next().map(str::to_string))
        .collect()
}

/// `id`'s assignment from a roster ([`roster`]); `None` if it is not in it or the roster is bad.
/// Equal to [`assignment`] on the state the roster was made from.
pub fn roster_assignment(roster: &[u8], id: &str, store_prefix: &str) -> Option<Assignment> {
    let text = std::str::from_utf8(roster).ok()?;
    let nl = text.find('\n').unwrap_or(text.len());
    let head: Vec<&str> = text[..nl].split(' ').collect();
    if head.len() != 5 || head[0] != "rdrun-roster" {
        return None;
    }
    let round: u64 = head[1].parse().ok()?;
    let restart_count: u32 = head[2].parse().ok()?;
    let reason = RoundReason::from_name(head[3])?;
    let master_port: u16 = head[4].parse().ok()?;
    // One pass over bytes: every participant reads this once per round, and a round of 10,000
    // nodes has 10,000 lines (issue 16: the per-node cost of a join).
    let rest = text.get(nl + 1..).unwrap_or("").as_bytes();
    let mut nodes: Vec<(String, usize)> = Vec::with_capacity(rest.len() / 16 + 1);
    let mut group_rank = None;
    let mut first = None;
    for line in rest.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let sp = line.iter().rposition(|b| *b == b' ')?;
        let (nid, nproc) = (&line[..sp], &line[sp + 1..]);
        let mut np: usize = 0;
        for d in nproc {
            if !d.is_ascii_digit() {
                return None;
            }
            np = np.checked_mul(10)?.checked_add(usize::from(d - b'0'))?;
        }
        if nid == id.as_bytes() {
            group_rank = Some(nodes.len());
        }
        let nid = std::str::from_utf8(nid).ok()?;
        if first.is_none() {
            first = Some(nid);
        }
        nodes.push((id_addr(nid).to_string(), np));
    }
    let group_rank = group_rank?;
    let nprocs: Vec<usize> = nodes.iter().map(|n| n.1).collect();
    let (base, world) = base_rank(&nprocs, group_rank);
    Some(Assignment {
        round,
        group_rank,
        group_world_size: nodes.len(),
        local_world_size: nodes[group_rank].1,
        base_rank: base,
        world_size: world,
        master_addr: id_addr(first?).to_string(),
        master_port,
        restart_count,
        reason,
        store_prefix: format!("{store_prefix}.{round}"),
        uniform_nproc: nprocs.iter().all(|n| *n == nprocs[0]),
        nodes,
    })
}

/// The small summary of a complete round (issue 16), the key its participants wait on:
/// `rdrun-round <round> <restart_count> <reason> <master_port> <group_world_size> <world_size>
/// <nproc | mixed> <master id>`. With its own notice's ranks it is a node's whole assignment
/// ([`summary_assignment`]); the roster ([`roster`]) is read only by rounds up to
/// [`ROSTER_EAGER_MAX`] nodes, and after a failure.
pub fn round_summary(state: &RdzvState) -> Vec<u8> {
    let ps = &state.participants;
    let port = ps.first().map_or(0, |m| m.master_port);
    let world: usize = ps.iter().map(|m| m.nproc).sum();
    let nproc = match ps.first() {
        Some(f) if ps.iter().all(|m| m.nproc == f.nproc) => f.nproc.to_string(),
        _ => "mixed".to_string(),
    };
    format!(
        "rdrun-round {} {} {} {port} {} {world} {nproc} {}",
        state.round,
        state.restart_count,
        state.reason.name(),
        ps.len(),
        ps.first().map_or("", |m| m.id.as_str()),
    )
    .into_bytes()
}

/// A round summary's fields ([`round_summary`]).
struct Summary<'a> {
    round: u64,
    restart_count: u32,
    reason: RoundReason,
    master_port: u16,
    group_world_size: usize,
    world_size: usize,
    uniform: bool,
    master_id: &'a str,
}

fn parse_summary(summary: &[u8]) -> Option<Summary<'_>> {
    let f: Vec<&str> = std::str::from_utf8(summary).ok()?.split(' ').collect();
    if f.len() != 9 || f[0] != "rdrun-round" {
        return None;
    }
    Some(Summary {
        round: f[1].parse().ok()?,
        restart_count: f[2].parse().ok()?,
        reason: RoundReason::from_name(f[3])?,
        master_port: f[4].parse().ok()?,
        group_world_size: f[5].parse().ok()?,
        world_size: f[6].parse().ok()?,
        uniform: f[7] != "mixed",
        master_id: f[8],
    })
}

/// The number of nodes of a round summary (`None`: not a summary).
pub fn summary_size(summary: &[u8]) -> Option<usize> {
    parse_summary(summary).map(|s| s.group_world_size)
}

/// The assignment of a participant running `nproc` workers from the round's summary and its
/// own notice (which carries its group and base rank), with [`Assignment::nodes`] empty; `None`
/// if they do not fit together (another round, no ranks, out of range). Equal to
/// [`assignment`] on the state they were made from, but for `nodes`.
pub fn summary_assignment(
    summary: &[u8],
    notice: &Notice,
    nproc: usize,
    store_prefix: &str,
) -> Option<Assignment> {
    let s = parse_summary(summary)?;
    let (group_rank, base_rank) = notice.rank.filter(|_| notice.status == 'p')?;
    if group_rank >= s.group_world_size || base_rank + nproc > s.world_size {
        return None;
    }
    Some(Assignment {
        round: s.round,
        group_rank,
        group_world_size: s.group_world_size,
        local_world_size: nproc,
        base_rank,
        world_size: s.world_size,
        master_addr: id_addr(s.master_id).to_string(),
        master_port: s.master_port,
        restart_count: s.restart_count,
        reason: s.reason,
        store_prefix: format!("{store_prefix}.{}", s.round),
        nodes: Vec::new(),
        uniform_nproc: s.uniform,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(addr: &str, pid: u32) -> Member {
        Member::new(addr, pid, 0, 2, 1000 + pid as u16)
    }

    fn view<'a>(me: &'a Member, min: usize, max: usize) -> JoinView<'a> {
        JoinView {
            me,
            min,
            max,
            past_deadline: false,
            last_call_expired: false,
            bump_from: None,
            pending: &[],
        }
    }

    /// Applies steps until the agent waits or finishes; returns the final step.
    fn settle(state: &mut RdzvState, v: &JoinView<'_>) -> JoinStep {
        for _ in 0..10 {
            match join_step(state, v) {
                JoinStep::Write(s) => *state = s,
                other => return other,
            }
        }
        panic!("join_step did not settle");
    }

    #[test]
    fn encode_decode_round_trip_and_foreign_state() {
        let mut s = RdzvState::default();
        s.participants.push(m("10.0.0.1", 5));
        assert_eq!(RdzvState::decode(&s.encode()).unwrap(), s);
        assert_eq!(RdzvState::decode(NO_STATE).unwrap(), RdzvState::default());
        // torchrun's pickled state is base64 text.
        assert!(matches!(
            RdzvState::decode(b"Y2FuaW1hZGFt"),
            Err(StateError::Foreign(_))
        ));
        let mut other = s.clone();
        other.format = 99;
        assert_eq!(
            RdzvState::decode(&other.encode()),
            Err(StateError::Format { found: 99 })
        );
    }

    #[test]
    fn order_is_numeric_by_address_then_pid_and_keeps_previous_order() {
        let mut ps = vec![
            m("10.0.0.10", 1),
            m("node-b", 1),
            m("10.0.0.2", 9),
            m("::1", 1),
            m("10.0.0.2", 3),
        ];
        order_participants(&mut ps, &[]);
        let addrs: Vec<String> = ps.iter().map(|p| p.id.clone()).collect();
        assert_eq!(
            addrs,
            [
                "10.0.0.2_3_0",
                "10.0.0.2_9_0",
                "10.0.0.10_1_0",
                "::1_1_0",
                "node-b_1_0"
            ]
        );
        // Survivors of the previous round keep their order; newcomers follow.
        let prev = vec!["node-b_1_0".to_string(), "10.0.0.10_1_0".to_string()];
        order_participants(&mut ps, &prev);
        let ids: Vec<&str> = ps.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "node-b_1_0",
                "10.0.0.10_1_0",
                "10.0.0.2_3_0",
                "10.0.0.2_9_0",
                "::1_1_0"
            ]
        );
    }

    #[test]
    fn every_node_is_watched_by_two_and_watches_at_most_a_few() {
        let ms: Vec<Member> = (1..=7).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
        let s = RdzvState {
            participants: ms[..4].to_vec(),
            wait_list: vec![ms[4].clone()],
            redundancy_list: vec![ms[5].clone()],
            expected: vec![ms[6].id.clone(), ms[0].id.clone()],
            ..Default::default()
        };
        let all: Vec<&str> = ms.iter().map(|m| m.id.as_str()).collect();
        let mut watched_by: std::collections::HashMap<&str, Vec<&str>> = Default::default();
        for w in &all {
            let t = watch_targets(&s, w);
            assert!(t.len() <= 2 * WATCHERS, "{w}: {t:?}");
            for id in &t {
                assert_ne!(id, w);
                let id = *all.iter().find(|a| *a == id).unwrap();
                watched_by.entry(id).or_default().push(w);
            }
        }
        for id in &all {
            assert!(
                watched_by.get(id).is_some_and(|v| v.len() >= WATCHERS),
                "{id} watched by {:?}",
                watched_by.get(id)
            );
        }
        // Participants watch their successors in list order (cyclic).
        assert_eq!(
            watch_targets(&s, &ms[3].id)[..2],
            [ms[0].id.clone(), ms[1].id.clone()]
        );
        // Without participants the others watch each other; a stranger watches nobody.
        let mut s2 = s.clone();
        s2.participants.clear();
        assert_eq!(
            watch_targets(&s2, &ms[4].id),
            [ms[5].id.clone(), ms[6].id.clone()]
        );
        assert!(watch_targets(&s, "nobody").is_empty());
        // Two nodes watch each other; one alone watches nobody.
        let mut s3 = RdzvState {
            participants: ms[..2].to_vec(),
            ..Default::default()
        };
        assert_eq!(watch_targets(&s3, &ms[0].id), [ms[1].id.clone()]);
        s3.participants.truncate(1);
        assert!(watch_targets(&s3, &ms[0].id).is_empty());
    }

    #[test]
    fn base_rank_table() {
        let cases: &[(&[usize], usize, (usize, usize))] = &[
            (&[2, 2], 0, (0, 4)),
            (&[2, 2], 1, (2, 4)),
            (&[1, 3, 2], 2, (4, 6)),
            (&[4], 0, (0, 4)),
        ];
        for (nprocs, gr, want) in cases {
            assert_eq!(base_rank(nprocs, *gr), *want, "{nprocs:?} {gr}");
        }
    }

    #[test]
    fn completes_immediately_at_max() {
        let (a, b) = (m("10.0.0.2", 1), m("10.0.0.1", 1));
        let mut s = RdzvState::default();
        assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Wait);
        assert!(!s.complete);
        assert_eq!(s.last_call_seq, 1, "min reached starts the last call");
        assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
        assert!(s.complete);
        assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Done);
        // Ordered by address: 10.0.0.1 is group rank 0 and provides MASTER_ADDR/PORT.
        let asg = assignment(&s, &a.id, "p").unwrap();
        assert_eq!((asg.group_rank, asg.base_rank, asg.world_size), (1, 2, 4));
        assert_eq!(
            (asg.master_addr.as_str(), asg.master_port),
            ("10.0.0.1", 1001)
        );
        assert_eq!(asg.store_prefix, "p.0");
    }

    #[test]
    fn last_call_completes_after_min() {
        let (a, b) = (m("10.0.0.1", 1), m("10.0.0.2", 1));
        let mut s = RdzvState::default();
        assert_eq!(settle(&mut s, &view(&a, 2, 4)), JoinStep::Wait);
        assert_eq!(s.last_call_seq, 0);
        assert_eq!(settle(&mut s, &view(&b, 2, 4)), JoinStep::Wait);
        assert_eq!(s.last_call_seq, 1);
        // The last call has not expired: keep waiting.
        assert_eq!(settle(&mut s, &view(&a, 2, 4)), JoinStep::Wait);
        let mut v = view(&a, 2, 4);
        v.last_call_expired = true;
        assert_eq!(settle(&mut s, &v), JoinStep::Done);
        assert!(s.complete);
        assert_eq!(s.participants.len(), 2);
    }

    #[test]
    fn below_min_never_completes_and_times_out_leaving_the_lists() {
        let a = m("10.0.0.1", 1);
        let mut s = RdzvState::default();
        let mut v = view(&a, 2, 2);
        v.last_call_expired = true;
        assert_eq!(settle(&mut s, &v), JoinStep::Wait);
        v.past_deadline = true;
        match join_step(&s, &v) {
            JoinStep::TimedOut(Some(new)) => assert!(new.participants.is_empty()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            join_step(&RdzvState::default(), &v),
            JoinStep::TimedOut(None)
        );
    }

    #[test]
    fn late_joiner_waits_then_bump_admits_it_without_charging() {
        let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
        let mut s = RdzvState::default();
        settle(&mut s, &view(&a, 2, 3));
        settle(&mut s, &view(&b, 2, 3));
        let mut v = view(&a, 2, 3);
        v.last_call_expired = true;
        assert_eq!(settle(&mut s, &v), JoinStep::Done);
        // c arrives late: wait list.
        assert_eq!(settle(&mut s, &view(&c, 2, 3)), JoinStep::Wait);
        assert_eq!(s.num_nodes_waiting(), 1);
        // a restarts for membership: one bump; expected = a, b (survivors) + c (waiting).
        let mut v = view(&a, 2, 3);
        v.bump_from = Some((0, RoundReason::Membership));
        assert_eq!(settle(&mut s, &v), JoinStep::Wait);
        assert_eq!((s.round, s.complete, s.restart_count), (1, false, 0));
        assert_eq!(s.expected.len(), 3);
        // b also asks from round 0: no second bump.
        let mut v = view(&b, 2, 3);
        v.bump_from = Some((0, RoundReason::Membership));
        assert_eq!(settle(&mut s, &v), JoinStep::Wait);
        assert_eq!(s.round, 1);
        assert_eq!(settle(&mut s, &view(&c, 2, 3)), JoinStep::Done);
        assert!(s.complete);
        assert_eq!(s.num_nodes_waiting(), 0);
        // a and b keep ranks 0 and 1 (previous order), c follows.
        let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, [a.id.as_str(), b.id.as_str(), c.id.as_str()]);
    }

    #[test]
    fn bumped_round_completes_when_all_expected_rejoin_without_last_call() {
        let (a, b) = (m("10.0.0.1", 1), m("10.0.0.2", 1));
        let mut s = RdzvState::default();
        settle(&mut s, &view(&a, 1, 4));
        settle(&mut s, &view(&b, 1, 4));
        let mut v = view(&a, 1, 4);
        v.last_call_expired = true;
        settle(&mut s, &v);
        assert!(s.complete);
        let mut v = view(&b, 1, 4);
        v.bump_from = Some((0, RoundReason::WorkerFailure));
        assert_eq!(settle(&mut s, &v), JoinStep::Wait);
        assert_eq!(s.restart_count, 1);
        assert_eq!(settle(&mut s, &view(&a, 1, 4)), JoinStep::Done);
        assert_eq!(assignment(&s, &b.id, "p").unwrap().restart_count, 1);
    }

    #[test]
    fn full_round_sends_newcomer_to_redundancy_and_reserves_expected_slots() {
        let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
        let mut s = RdzvState::default();
        settle(&mut s, &view(&a, 1, 2));
        assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
        assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
        assert!(s.in_redundancy_list(&c.id));
        assert_eq!(
            s.num_nodes_waiting(),
            0,
            "redundant nodes do not trigger restarts"
        );
        // A failure bump: c must not take a slot expected for a or b.
        let mut v = view(&a, 1, 2);
        v.bump_from = Some((0, RoundReason::WorkerFailure));
        settle(&mut s, &v);
        assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
        assert!(!s.is_participant(&c.id));
        assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
        // b is lost: c moves to the wait list, then into the next round.
        let s2 = prune_dead(&s, std::slice::from_ref(&b.id), 1, 2).unwrap();
        assert_eq!(
            (s2.round, s2.reason, s2.restart_count),
            (2, RoundReason::PeerLost, 1)
        );
        let mut s = s2;
        assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
        assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Done);
        assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Done);
        let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, [a.id.as_str(), c.id.as_str()]);
    }

    #[test]
    fn pruning_during_join_completes_the_round_for_the_rest() {
        let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
        let mut s = RdzvState::default();
        for n in [&a, &b, &c] {
            settle(&mut s, &view(n, 2, 3));
        }
        assert!(s.complete);
        let mut v = view(&a, 2, 3);
        v.bump_from = Some((0, RoundReason::WorkerFailure));
        settle(&mut s, &v);
        settle(&mut s, &view(&b, 2, 3));
        assert!(!s.complete, "c is still expected");
        let s = prune_dead(&s, std::slice::from_ref(&c.id), 2, 3).unwrap();
        assert!(s.complete);
        assert_eq!(s.participants.len(), 2);
        assert_eq!(prune_dead(&s, &["nobody".into()], 2, 3), None);
    }

    #[test]
    fn one_write_admits_every_announced_joiner_that_fits() {
        let ms: Vec<Member> = (1..=4).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
        let mut s = RdzvState::default();
        // Announcement order: .1, .2, the writer .4, then .3.
        let pending = [ms[0].clone(), ms[1].clone(), ms[3].clone(), ms[2].clone()];
        let mut v = view(&ms[3], 2, 3);
        v.pending = &pending;
        match join_step(&s, &v) {
            JoinStep::Write(new) => s = new,
            other => panic!("{other:?}"),
        }
        // .1, .2 and the writer fill the round (max 3); .3 is left over.
        assert!(s.complete);
        let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            [ms[0].id.as_str(), ms[1].id.as_str(), ms[3].id.as_str()]
        );
        assert_eq!(settle(&mut s, &view(&ms[2], 2, 3)), JoinStep::Wait);
        assert!(s.in_redundancy_list(&ms[2].id));
    }

    #[test]
    fn closed_rendezvous_reports_redundancy() {
        let a = m("10.0.0.1", 1);
        let mut s = close(&RdzvState::default(), None);
        assert_eq!(
            join_step(&s, &view(&a, 1, 1)),
            JoinStep::Closed { redundant: false }
        );
        s.redundancy_list.push(a.clone());
        assert_eq!(
            join_step(&s, &view(&a, 1, 1)),
            JoinStep::Closed { redundant: true }
        );
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn check_invariants(s: &RdzvState, max: usize, min: usize) {
            let mut all: Vec<&str> = s.listed().map(|m| m.id.as_str()).collect();
            let n = all.len();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), n, "a node is in at most one list: {s:?}");
            assert!(s.participants.len() <= max, "{s:?}");
            if s.complete {
                assert!(s.participants.len() >= min, "{s:?}");
            }
        }

        proptest! {
            /// Random interleavings of joins, restarts and deaths keep the lists consistent, and
            /// once every live node keeps stepping, the round completes with min(live, max).
            #[test]
            fn random_interleavings_stay_consistent_and_complete(
                n in 1usize..6,
                min in 1usize..4,
                extra in 0usize..3,
                steps in proptest::collection::vec((0usize..6, 0u8..4, any::<bool>()), 0..60),
            ) {
                let max = min + extra;
                let nodes: Vec<Member> = (0..n).map(|i| m(&format!("10.0.0.{}", i + 1), 1)).collect();
                let mut dead = vec![false; n];
                let mut my_round: Vec<Option<u64>> = vec![None; n];
                let mut s = RdzvState::default();
                let mut failures = 0u32;
                let mut announced: Vec<Option<u64>> = vec![None; n];
                for (who, action, expired) in steps {
                    let i = who % n;
                    if dead[i] {
                        continue;
                    }
                    match action {
                        // A death, noticed by the others.
                        0 if dead.iter().filter(|d| !**d).count() > 1 => {
                            dead[i] = true;
                            if let Some(new) = prune_dead(&s, std::slice::from_ref(&nodes[i].id), min, max) {
                                s = new;
                            }
                        }
                        // A worker failure on a node that ran a round.
                        1 if my_round[i].is_some() => {
                            let mut v = view(&nodes[i], min, max);
                            v.bump_from = my_round[i].map(|r| (r, RoundReason::WorkerFailure));
                            if let JoinStep::Write(new) = join_step(&s, &v) {
                                if new.restart_count > s.restart_count { failures += 1; }
                                s = new;
                            }
                        }
                        // Announced, but its own write lost a race (admission by others).
                        2 if !s.complete => announced[i] = Some(s.round),
                        _ => {
                            // Live nodes announced for this round (batch admission).
                            let pending: Vec<Member> = (0..n)
                                .filter(|j| !dead[*j] && announced[*j] == Some(s.round))
                                .map(|j| nodes[j].clone())
                                .collect();
                            if !s.complete {
                                announced[i] = Some(s.round);
                            }
                            let mut v = view(&nodes[i], min, max);
                            v.pending = &pending;
                            v.last_call_expired = expired;
                            match join_step(&s, &v) {
                                JoinStep::Write(new) => s = new,
                                JoinStep::Done => my_round[i] = Some(s.round),
                                _ => {}
                            }
                        }
                    }
                    check_invariants(&s, max, min);
                    prop_assert_eq!(s.restart_count, failures);
                }
                // Liveness: every live node keeps stepping with expired last calls.
                let live: Vec<usize> = (0..n).filter(|i| !dead[*i]).collect();
                for _ in 0..20 {
                    for &i in &live {
                        let mut v = view(&nodes[i], min, max);
                        v.last_call_expired = true;
                        if let JoinStep::Write(new) = join_step(&s, &v) {
                            s = new;
                        }
                        check_invariants(&s, max, min);
                    }
                }
                if live.len() >= min {
                    prop_assert!(s.complete, "{:?}", s);
                    // Live nodes on the wait list would trigger the next round (scale-up).
                    let running = s.participants.len() + s.wait_list.len();
                    prop_assert_eq!(running.min(max), live.len().min(max), "{:?}", s);
                }
            }
        }
    }

    /// Issue 16: the per-node-keys join builds the same assignment from the compact roster as
    /// from the full state, and publishes the same watch targets as `watch_targets`.
    #[test]
    fn roster_gives_the_assignment_of_the_state_and_batch_targets_match() {
        let mut s = RdzvState {
            participants: vec![
                Member::new("10.0.0.3", 7, 0, 4, 29500),
                Member::new("node-a", 3, 1, 2, 29400),
                Member::new("::1", 9, 0, 1, 1),
            ],
            round: 3,
            restart_count: 2,
            reason: RoundReason::PeerLost,
            ..Default::default()
        };
        mark_complete(&mut s);
        let r = roster(&s);
        for m in &s.participants {
            assert_eq!(
                roster_assignment(&r, &m.id, "p"),
                assignment(&s, &m.id, "p"),
                "{}",
                String::from_utf8_lossy(&r)
            );
        }
        // The summary and each participant's own notice give the same, without the roster.
        let sum = round_summary(&s);
        assert_eq!(summary_size(&sum), Some(3));
        let notes: std::collections::HashMap<String, Notice> =
            notices(None, &s).into_iter().collect();
        for m in &s.participants {
            let n = &notes[&m.id];
            assert_eq!(Notice::decode(&n.encode()).as_ref(), Some(n), "round trip");
            let mut want = assignment(&s, &m.id, "p").unwrap();
            assert!(!want.uniform_nproc, "4, 2 and 1 workers");
            want.nodes.clear();
            assert_eq!(
                summary_assignment(&sum, n, m.nproc, "p"),
                Some(want),
                "{}",
                String::from_utf8_lossy(&sum)
            );
        }
        // A notice without ranks (an incomplete round's), or ranks that do not fit: none.
        let plain = Notice {
            status: 'p',
            rank: None,
            targets: vec![],
        };
        assert_eq!(summary_assignment(&sum, &plain, 1, "p"), None);
        let far = Notice {
            rank: Some((3, 0)),
            ..plain.clone()
        };
        assert_eq!(summary_assignment(&sum, &far, 1, "p"), None);
        assert_eq!(summary_assignment(b"rdrun-round 1", &far, 1, "p"), None);
        assert_eq!(Notice::decode(b"p=1 a"), None, "bad ranks");
        assert_eq!(roster_assignment(&r, "10.0.0.9_1_0", "p"), None);
        assert_eq!(roster_assignment(b"junk", &s.participants[0].id, "p"), None);
        assert_eq!(
            roster_ids(&r).unwrap(),
            s.participants
                .iter()
                .map(|m| m.id.clone())
                .collect::<Vec<_>>()
        );
        let ms: Vec<Member> = (1..=9).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
        for (np, nw, nr, ne) in [(4, 1, 1, 2), (0, 2, 1, 1), (1, 0, 0, 3), (5, 0, 0, 0)] {
            let st = RdzvState {
                participants: ms[..np].to_vec(),
                wait_list: ms[np..np + nw].to_vec(),
                redundancy_list: ms[np + nw..np + nw + nr].to_vec(),
                expected: ms[np + nw + nr..np + nw + nr + ne]
                    .iter()
                    .map(|m| m.id.clone())
                    .chain(ms.first().map(|m| m.id.clone()))
                    .collect(),
                ..Default::default()
            };
            for (id, t) in all_watch_targets(&st) {
                assert_eq!(t, watch_targets(&st, &id), "{id} in {np}/{nw}/{nr}/{ne}");
            }
        }
    }

    /// The reason's name (roster, summary, events) is its serde name, and reads back.
    #[test]
    fn round_reason_names_match_serde_and_read_back() {
        for r in [
            RoundReason::Initial,
            RoundReason::WorkerFailure,
            RoundReason::Membership,
            RoundReason::PeerLost,
        ] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.name())
            );
            assert_eq!(RoundReason::from_name(r.name()), Some(r));
        }
        assert_eq!(RoundReason::from_name("restart"), None);
    }

    #[test]
    fn notices_cover_changed_nodes_and_dropped_ones() {
        let ms: Vec<Member> = (1..=5).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
        let old = RdzvState {
            participants: ms[..3].to_vec(),
            ..Default::default()
        };
        let all = notices(None, &old);
        assert_eq!(all.len(), 3);
        assert!(all
            .iter()
            .all(|(_, n)| n.status == 'p' && n.targets.len() == 2));
        // One more admitted: it and the node whose successors wrap around to it change.
        let mut new = old.clone();
        new.participants.push(ms[3].clone());
        let ch: Vec<String> = notices(Some(&old), &new)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert!(ch.contains(&ms[3].id) && ch.contains(&ms[2].id), "{ch:?}");
        assert!(!ch.contains(&ms[0].id), "{ch:?}");
        // One dropped: `x`.
        let mut gone = new.clone();
        gone.remove_everywhere(&ms[1].id);
        let x = notices(Some(&new), &gone);
        assert!(x.iter().any(|(id, n)| *id == ms[1].id && n.status == 'x'));
        assert_eq!(
            Notice::decode(&x[0].1.encode()),
            Some(x[0].1.clone()),
            "round trip"
        );
        // A closed state needs none.
        assert!(notices(Some(&new), &close(&new, None)).is_empty());
    }

    #[test]
    fn one_batch_places_every_announced_node_as_their_own_steps_would() {
        let ms: Vec<Member> = (1..=5).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
        // Incomplete round, max 3: three admitted, it completes, the other two wait.
        let s = place_pending(&RdzvState::default(), &ms, 2, 3);
        assert!(s.complete);
        assert_eq!(s.participants.len(), 3);
        assert_eq!(s.wait_list.len() + s.redundancy_list.len(), 2);
        let mut one_by_one = RdzvState::default();
        for p in &ms {
            settle(&mut one_by_one, &view(p, 2, 3));
        }
        assert_eq!(s, one_by_one);
        // Head: foreign text and another format are clear errors.
        assert!(matches!(
            Head::decode(b"Y2FuaW1hZGFt"),
            Err(StateError::Foreign(_))
        ));
        assert_eq!(
            Head::decode(br#"{"format":1}"#),
            Err(StateError::Format { found: 1 })
        );
        let h = Head::of(&s, 4, "k");
        assert_eq!(Head::decode(&h.encode()).unwrap(), Some(h));
        assert_eq!(Head::decode(NO_STATE).unwrap(), None);
    }
}
