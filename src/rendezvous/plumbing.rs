//! The plumbing the rendezvous backends share (issue 9 item 5): the events a running round
//! reports ([`RdzvEvent`]) and their channel with the keeper task that produces them
//! ([`KeeperTask`]: aborted on drop), store retries with one backoff ([`retry`]), heartbeats
//! and the two liveness rules ([`beat`], [`StoreLoss`] for this agent's own store,
//! [`HeartbeatTracker`] for peers), the close acknowledgements and the `--nnodes` agreement
//! check. The backends keep only their protocol: which keys, which rounds.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::error::RendezvousError;
use super::state::{RdzvState, RoundReason};
use super::store::{try_get, RdzvStore, StoreOpError};

/// Something the running agent must react to (select on `watch()` of any backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdzvEvent {
    /// Another agent started round `round` (worker failure, scale-up or a lost peer): stop the
    /// workers and call `next_round`.
    RoundChanged { round: u64, reason: RoundReason },
    /// Nodes are waiting to join: stop the workers and call `next_round` with
    /// [`RoundReason::Membership`] (not charged to the restart budget).
    NodesWaiting(usize),
    /// These peers stopped heartbeating; this agent already started the next round without them.
    PeersLost(Vec<String>),
    /// The rendezvous was closed (the job finished or gave up elsewhere).
    Closed,
    /// Another node's workers failed and its agent closed the rendezvous (`failed on node N`).
    JobFailed(String),
    /// This agent's heartbeats failed `keep_alive_max_attempt` times in a row.
    StoreUnreachable(String),
}

/// Remembers peers' heartbeat counters and when each last changed (local clock).
#[derive(Debug, Default)]
pub struct HeartbeatTracker {
    seen: HashMap<String, (Vec<u8>, Instant)>,
}

impl HeartbeatTracker {
    /// Records the current counters; returns the ids unchanged for at least `dead_after`. Ids
    /// not in `beats` are forgotten; a newly seen id gets a full `dead_after` of grace.
    pub fn observe(
        &mut self,
        now: Instant,
        beats: Vec<(String, Vec<u8>)>,
        dead_after: Duration,
    ) -> Vec<String> {
        let ids: HashSet<&str> = beats.iter().map(|(id, _)| id.as_str()).collect();
        self.seen.retain(|id, _| ids.contains(id.as_str()));
        let mut dead = Vec::new();
        for (id, value) in beats {
            match self.seen.get_mut(&id) {
                Some((old, since)) if *old == value => {
                    if now.duration_since(*since) >= dead_after {
                        dead.push(id);
                    }
                }
                Some(entry) => *entry = (value, now),
                None => {
                    self.seen.insert(id, (value, now));
                }
            }
        }
        dead
    }

    /// The ids seen by the last [`observe`](Self::observe) whose counter has not changed for
    /// at least `after` (suspects, before they count as dead).
    pub fn silent(&self, now: Instant, after: Duration) -> Vec<String> {
        let mut ids: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) >= after)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

/// Decides when this agent's own failed heartbeats mean the store is lost: `max_attempt`
/// failures in a row, or no successful beat for `interval × max_attempt`. Counting attempts
/// alone is not enough: against a host that is gone, each attempt can spend the whole
/// `heartbeat_timeout` reconnecting, which stretched the detection to 5 × 5 s.
#[derive(Debug)]
pub struct StoreLoss {
    last_ok: Instant,
    failures: u32,
    reported: bool,
}

impl StoreLoss {
    pub fn new(now: Instant) -> StoreLoss {
        StoreLoss {
            last_ok: now,
            failures: 0,
            reported: false,
        }
    }

    /// A heartbeat went through.
    pub fn ok(&mut self, now: Instant) {
        *self = StoreLoss::new(now);
    }

    /// A heartbeat failed; true exactly once per outage, when it is to be reported as lost.
    pub fn failed(&mut self, now: Instant, interval: Duration, max_attempt: u32) -> bool {
        self.failures += 1;
        let silent = now.duration_since(self.last_ok);
        let lost =
            self.failures >= max_attempt || silent >= interval.saturating_mul(max_attempt.max(1));
        if lost && !self.reported {
            self.reported = true;
            return true;
        }
        false
    }

    /// Failed beats in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// Runs `op` until it succeeds, backing off from 50 ms up to 1 s, or fails at `deadline` with
/// `Unreachable` naming `endpoint` (network blips and peers still starting are normal; pain
/// point 13). Once `lost()` says the store is gone for good, a failure is `StoreLost` at once.
pub(super) async fn retry<T, Fut>(
    endpoint: &(dyn Fn() -> String + Sync),
    lost: &(dyn Fn() -> Option<String> + Sync),
    deadline: Instant,
    mut op: impl FnMut() -> Fut,
) -> Result<T, RendezvousError>
where
    Fut: std::future::Future<Output = Result<T, StoreOpError>>,
{
    let started = Instant::now();
    let mut backoff = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if let Some(why) = lost() {
                    return Err(RendezvousError::StoreLost(why));
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(RendezvousError::Unreachable {
                        endpoint: endpoint(),
                        waited: now.duration_since(started),
                        source: e,
                    });
                }
                tracing::debug!(error = %e, "store operation failed; retrying");
                tokio::time::sleep(backoff.min(deadline - now)).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// One heartbeat (`add(key, 1)`), bounded by `timeout` so that a host that is gone cannot
/// hold the keeper; the error text says what failed.
pub(super) async fn beat<S: RdzvStore>(
    store: &S,
    key: &str,
    timeout: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, store.add(key, 1)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("heartbeat timed out".into()),
    }
}

/// The background keeper of one agent (heartbeats, monitoring) and the events it sends for a
/// round. The task is aborted when this is dropped (an agent that goes away stops beating).
pub(super) struct KeeperTask {
    tx: mpsc::UnboundedSender<(u64, RdzvEvent)>,
    rx: mpsc::UnboundedReceiver<(u64, RdzvEvent)>,
    task: Option<JoinHandle<()>>,
}

impl KeeperTask {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self { tx, rx, task: None }
    }

    /// Where a keeper sends `(round, event)`.
    pub(super) fn sender(&self) -> mpsc::UnboundedSender<(u64, RdzvEvent)> {
        self.tx.clone()
    }

    /// Starts the keeper `spawn` builds unless one is still running.
    pub(super) fn ensure(&mut self, spawn: impl FnOnce() -> JoinHandle<()>) {
        if self.task.as_ref().is_some_and(|k| !k.is_finished()) {
            return;
        }
        self.task = Some(spawn());
    }

    /// Stops the keeper (no more beats).
    pub(super) fn stop(&mut self) {
        if let Some(k) = self.task.take() {
            k.abort();
        }
    }

    /// The next event of `round` (cancel-safe; pending while nothing happens). Events of other
    /// rounds are dropped.
    pub(super) async fn next(&mut self, round: Option<u64>) -> RdzvEvent {
        loop {
            let (r, ev) = self
                .rx
                .recv()
                .await
                .expect("the keeper task keeps a sender alive");
            if Some(r) == round {
                return ev;
            }
        }
    }

    /// An event of `round` already sent, without waiting.
    pub(super) fn try_next(&mut self, round: u64) -> Option<RdzvEvent> {
        while let Ok((r, ev)) = self.rx.try_recv() {
            if r == round {
                return Some(ev);
            }
        }
        None
    }
}

impl Drop for KeeperTask {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Says that this agent (`me`) learnt the job is closed, by appending `me` to `key` (the
/// store's host waits for that before it leaves, so no agent sees the store vanish instead of
/// the close). Best effort.
pub(super) async fn ack_closed<S: RdzvStore>(store: &S, key: &str, me: &str) {
    let _ = store.append(key, format!("{me}\n").as_bytes()).await;
}

/// The agents that acknowledged the close (see [`ack_closed`]); `None` when the store cannot be
/// read.
pub(super) async fn closed_acks<S: RdzvStore>(store: &S, key: &str) -> Option<HashSet<String>> {
    let v = try_get(store, key).await.ok()?;
    Some(
        String::from_utf8_lossy(&v.unwrap_or_default())
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

/// `--nnodes` as the user wrote it: `2`, or `2:4`.
pub(super) fn nnodes_text(min: usize, max: usize) -> String {
    if min == max {
        format!("{min}")
    } else {
        format!("{min}:{max}")
    }
}

/// Every agent appends `<nnodes> <who>` to `key` once; the first line that says another
/// `--nnodes` than `mine` is returned as (who, what it said) (issue 17.8: nodes that disagree
/// used to wait for each other until a confusing timeout).
pub(super) async fn nnodes_disagreement<S: RdzvStore>(
    store: &S,
    key: &str,
    mine: &str,
    who: &str,
    said: &mut bool,
) -> Result<Option<(String, String)>, StoreOpError> {
    if !*said {
        store
            .append(key, format!("{mine} {who}\n").as_bytes())
            .await?;
        *said = true;
    }
    let list = try_get(store, key).await?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&list).lines().find_map(|l| {
        let (n, w) = l.split_once(' ')?;
        (n != mine).then(|| (w.to_string(), n.to_string()))
    }))
}

/// [`nnodes_disagreement`] in O(1) per check (c10d, issue 16: the appended list was read in full
/// on every poll by every node). The first agent's `<nnodes> <who>` stays in `first`; an agent
/// that says otherwise names itself in `conflict` (first conflict kept) and fails; every agent
/// reads `conflict` on each check, so the first agent and those agreeing with it fail too.
/// `seen_first` caches the first value after this agent's one write.
pub(super) async fn nnodes_conflict<S: RdzvStore>(
    store: &S,
    first: &str,
    conflict: &str,
    mine: &str,
    who: &str,
    seen_first: &mut Option<String>,
) -> Result<Option<(String, String)>, StoreOpError> {
    let me_line = format!("{mine} {who}");
    let split = |l: &str| -> Option<(String, String)> {
        let (n, w) = l.split_once(' ')?;
        (n != mine).then(|| (w.to_string(), n.to_string()))
    };
    if seen_first.is_none() {
        let got = store.compare_set(first, b"", me_line.as_bytes()).await?;
        *seen_first = Some(String::from_utf8_lossy(&got).into_owned());
    }
    if let Some(other) = seen_first.as_deref().and_then(split) {
        // Recorded so that the first agent learns of the disagreement too.
        store.compare_set(conflict, b"", me_line.as_bytes()).await?;
        return Ok(Some(other));
    }
    let c = try_get(store, conflict).await?.unwrap_or_default();
    Ok(split(&String::from_utf8_lossy(&c)))
}

/// What an agent's handle and its keeper task share (c10d and etcd): the round it runs, the
/// waiting count last seen, and the store/lease loss once found.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// The round this agent runs (keeper monitors it), `None` while joining or closed.
    pub(super) running: Option<u64>,
    pub(super) waiting: usize,
    /// Set for good once the keeper found the store lost (see [`StoreLoss`]; etcd: the lease
    /// could not be renewed for a TTL).
    pub(super) lost: Option<String>,
}

pub(super) type SharedRef = std::sync::Arc<std::sync::Mutex<Shared>>;

/// Locks the shared state, surviving a poisoned lock (a panicked keeper must not take the
/// agent down with it).
pub(super) fn lock(shared: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a closed round state means for an agent of it.
pub(super) fn closed_event(state: &RdzvState) -> RdzvEvent {
    match &state.closed_reason {
        Some(why) => RdzvEvent::JobFailed(why.clone()),
        None => RdzvEvent::Closed,
    }
}

/// Ids whose liveness a node checks in `state`: every member and expected node but itself.
pub(super) fn watched_ids(state: &RdzvState, me: &str) -> Vec<String> {
    let mut ids: Vec<String> = state
        .watched_members(me)
        .into_iter()
        .map(|m| m.id.clone())
        .collect();
    for e in &state.expected {
        if e != me && !ids.contains(e) {
            ids.push(e.clone());
        }
    }
    ids
}

/// The peers of an earlier round (`round_peers`, this agent excluded) that `state`, a later
/// round, no longer has, when that round was started because peers were lost (c10d: a keeper
/// dropped a peer that stopped heartbeating; etcd: leases expired). Any other later round:
/// none (the backend judges those by their heartbeats or leases).
pub(super) fn dropped_by(round_peers: &[String], state: &RdzvState) -> Vec<String> {
    if state.reason != RoundReason::PeerLost {
        return Vec::new();
    }
    let kept: HashSet<&str> = state
        .watched_members("")
        .into_iter()
        .map(|m| m.id.as_str())
        .chain(state.expected.iter().map(String::as_str))
        .collect();
    round_peers
        .iter()
        .filter(|id| !kept.contains(id.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_loss_by_count_or_by_silence_reported_once() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        // Quick failures (connection refused): the count decides.
        let mut l = StoreLoss::new(t0);
        let got: Vec<bool> = (1..=6)
            .map(|i| l.failed(t0 + Duration::from_millis(10 * i), s(1), 5))
            .collect();
        assert_eq!(got, [false, false, false, false, true, false]);
        // Slow failures (each attempt waits out a connect timeout): the silence decides.
        let mut l = StoreLoss::new(t0);
        assert!(!l.failed(t0 + s(1), s(1), 5));
        assert!(l.failed(t0 + s(6), s(1), 5));
        assert!(!l.failed(t0 + s(11), s(1), 5), "reported once per outage");
        // A beat that goes through starts a new outage count.
        l.ok(t0 + s(12));
        assert_eq!(l.failures(), 0);
        assert!(!l.failed(t0 + s(13), s(1), 5));
        assert!(l.failed(t0 + s(17), s(1), 5));
        // max_attempt 0 is treated as 1.
        let mut l = StoreLoss::new(t0);
        assert!(l.failed(t0 + s(2), s(1), 0));
    }

    #[test]
    fn tracker_declares_dead_only_after_no_change() {
        let t0 = Instant::now();
        let d = Duration::from_secs(5);
        let mut t = HeartbeatTracker::default();
        let beat = |v: &str| vec![("a".to_string(), v.as_bytes().to_vec())];
        assert!(t.observe(t0, beat("1"), d).is_empty());
        assert!(t
            .observe(t0 + Duration::from_secs(4), beat("1"), d)
            .is_empty());
        assert!(t
            .observe(t0 + Duration::from_secs(6), beat("2"), d)
            .is_empty());
        assert!(t
            .observe(t0 + Duration::from_secs(10), beat("2"), d)
            .is_empty());
        assert_eq!(t.observe(t0 + Duration::from_secs(11), beat("2"), d), ["a"]);
        // Forgotten when no longer watched; a new sighting gets full grace.
        assert!(t
            .observe(t0 + Duration::from_secs(12), vec![], d)
            .is_empty());
        assert!(t
            .observe(t0 + Duration::from_secs(13), beat("2"), d)
            .is_empty());
    }
}
