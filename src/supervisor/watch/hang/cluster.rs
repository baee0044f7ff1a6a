//! The multi-node hang rule (issue 13, spec hang-detection §5.9): a job spread over several
//! nodes is hung only when *every* node is quiet; one node's quiet ranks may simply be waiting
//! for another node's busy ones.
//!
//! Protocol, over the rendezvous store (static: node 0's store; c10d: the c10d store), with keys
//! under the round's prefix (`Assignment::store_prefix`, so a new round never sees an old
//! round's keys):
//! * `<prefix>/rdrun_hang/node/<group_rank>`: each agent SETs its node's [`NodeReport`] at every
//!   hang poll (live and watched ranks, how long the node has been quiet, its phase budget, and
//!   a sequence number that says the agent is still reporting).
//! * Each poll the agent reads every node's report (one `multi_get` once every node has
//!   published, single non-creating reads before) and the verdict key. [`decide`] — a pure
//!   function — says whether every node is quiet past its budget.
//! * `<prefix>/rdrun_hang/verdict`: the first agent that sees the job hung creates it with a
//!   compare-and-set ([`ClusterVerdict`]); whoever wins, every agent reads the same value, so the
//!   verdict is one per round and every node prints the same facts. Each agent then captures
//!   its own ranks, stops its workers (kill mode), and writes its findings (suspects and why)
//!   under `<prefix>/rdrun_hang/report/<group_rank>`, so every node's block names the suspects
//!   of the others as well.
//! * Store unreachable for at least one budget (or a backend without a store: etcd) → the
//!   local rule at [`FALLBACK_FACTOR`]× the budget: a node quiet that long on its own is hung
//!   whatever the others do, and the longer budget leaves room for a busy node this agent
//!   cannot see. One slow or failed exchange is not an outage.
//!
//! A report that stops changing (its agent ended the attempt, e.g. all its ranks exited 0, or is
//! wedged) counts as quiet since it was last seen to change; a fresh report is taken at its
//! word. In observe mode a round gives at most one cluster verdict.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::detector::NodeQuiet;
use crate::rendezvous::keys::round::HangKeys;
use crate::rendezvous::store::{try_get, RdzvStore};

/// Without the store, the local rule applies at this multiple of the budget.
pub const FALLBACK_FACTOR: u32 = 2;

/// One node's quiet state, as its agent publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Grows at every publication: a report whose `seq` stops changing is stale.
    pub seq: u64,
    /// Live ranks on the node.
    pub live: u32,
    /// Live ranks that are not exempt (stopped or traced ranks are exempt).
    pub watched: u32,
    /// How long every watched rank of the node has been inactive (0: active now).
    pub quiet_ms: u64,
    /// The node's current phase budget.
    pub budget_ms: u64,
    /// `startup` or `steady`.
    pub phase: String,
    /// How long this node's report stays fresh without a new one (its agent's own staleness
    /// bound, from its poll interval): a peer polling more slowly than this agent is not taken
    /// for stale between two of its polls. 0 (an older report): this agent's bound.
    #[serde(default)]
    pub stale_ms: u64,
}

impl NodeReport {
    /// The report of a node whose detector says `q`.
    pub fn of(q: &NodeQuiet, seq: u64) -> NodeReport {
        NodeReport {
            seq,
            live: q.live,
            watched: q.watched,
            quiet_ms: ms(q.quiet_for),
            budget_ms: ms(q.budget),
            phase: q.phase.as_str().to_string(),
            stale_ms: 0,
        }
    }

    /// Every live rank is exempt (someone is debugging): never a hang, as on one node.
    fn exempt(&self) -> bool {
        self.live > 0 && self.watched == 0
    }
}

/// A report as this agent sees it: `age` is how long ago its `seq` was first seen.
#[derive(Debug, Clone)]
pub struct Seen {
    pub report: NodeReport,
    pub age: Duration,
}

/// Every node quiet past its budget: how long (the least of the nodes) and the budget (the
/// largest of the nodes').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterQuiet {
    pub quiet_for: Duration,
    pub budget: Duration,
}

/// The pure multi-node rule. `nodes[i]` is node i's report (None: not published yet).
/// A verdict only when every node has reported, none *fresh* (changed within `stale_after`)
/// reports activity (quiet shorter than its budget) or only exempt ranks, every node with live
/// ranks is quiet past its budget (a stale report counts as quiet since it was first seen), and
/// at least one fresh report has live ranks.
pub fn decide(nodes: &[Option<Seen>], stale_after: Duration) -> Option<ClusterQuiet> {
    let mut quiet_for: Option<Duration> = None;
    let mut budget = Duration::ZERO;
    let mut fresh_live = false;
    for seen in nodes {
        let seen = seen.as_ref()?;
        let r = &seen.report;
        let fresh = seen.age < stale_after.max(Duration::from_millis(r.stale_ms));
        if r.live == 0 {
            // No live rank there (all exited): nothing to wait for on that node.
            continue;
        }
        let q = if fresh {
            if r.exempt() {
                return None;
            }
            fresh_live = true;
            Duration::from_millis(r.quiet_ms)
        } else if r.exempt() {
            seen.age
        } else {
            Duration::from_millis(r.quiet_ms) + seen.age
        };
        let b = Duration::from_millis(r.budget_ms);
        if q < b {
            return None;
        }
        budget = budget.max(b);
        quiet_for = Some(quiet_for.map_or(q, |m| m.min(q)));
    }
    if !fresh_live {
        return None;
    }
    quiet_for.map(|quiet_for| ClusterQuiet { quiet_for, budget })
}

/// The local rule at [`FALLBACK_FACTOR`]× the budget, for when the store cannot be read.
pub fn fallback(local: &NodeReport) -> Option<ClusterQuiet> {
    let budget = Duration::from_millis(local.budget_ms) * FALLBACK_FACTOR;
    let quiet_for = Duration::from_millis(local.quiet_ms);
    (local.live > 0 && !local.exempt() && quiet_for >= budget)
        .then_some(ClusterQuiet { quiet_for, budget })
}

/// When each node's report last changed, as this agent saw it.
#[derive(Debug, Default)]
pub struct Tracker {
    seen: BTreeMap<u32, (u64, Instant)>,
}

impl Tracker {
    /// Records `report` of `node` read at `now`; returns it with its age.
    pub fn update(&mut self, node: u32, report: NodeReport, now: Instant) -> Seen {
        let e = self.seen.entry(node).or_insert((report.seq, now));
        if e.0 != report.seq {
            *e = (report.seq, now);
        }
        Seen {
            age: now.saturating_duration_since(e.1),
            report,
        }
    }
}

/// The verdict every agent of the round reads (created once, by compare-and-set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterVerdict {
    /// The node (group rank) that declared it.
    pub by: u32,
    pub nodes: u32,
    pub quiet_ms: u64,
    pub budget_ms: u64,
}

/// What one node found after a cluster verdict: its suspects and why, for the other nodes'
/// blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFindings {
    pub node: u32,
    /// Global ranks of that node that were alive at the capture.
    pub ranks: Vec<u32>,
    pub suspects: Vec<u32>,
    pub reason: String,
    /// Where that node wrote its stacks (a path on that node).
    pub files: Option<String>,
}

/// How strong a suspect reason is, to pick the job's suspect among the nodes' findings:
/// a rank not in a collective (or whose child process is stuck) beats a missing setter beats
/// an odd top frame beats an odd kernel wait. Matched on the reasons' fixed beginnings: the
/// rest can quote the user's function names.
pub fn reason_strength(reason: &str) -> u8 {
    let starts = |p: &[&str]| p.iter().any(|p| reason.starts_with(p));
    if starts(&["heartbeat"]) {
        5
    } else if starts(&[
        "not in a collective",
        "its DataLoader worker",
        "its child process",
    ]) {
        4
    } else if starts(&["never set"]) {
        3
    } else if starts(&["top frame"]) {
        2
    } else if reason.is_empty() {
        0
    } else {
        1
    }
}

/// The job's suspect among every node's findings: the first suspect of the strongest reason
/// (ties: the lowest node).
pub fn job_suspect<'a>(findings: &[&'a NodeFindings]) -> Option<(u32, &'a NodeFindings)> {
    findings
        .iter()
        .filter(|f| !f.suspects.is_empty())
        .max_by_key(|f| (reason_strength(&f.reason), std::cmp::Reverse(f.node)))
        .map(|f| (f.suspects[0], *f))
}

/// What a poll of the cluster rule decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Nothing,
    /// The round's verdict (this node's or another's).
    Verdict(ClusterVerdict),
    /// The store could not be read and this node alone is quiet past the longer budget.
    Fallback(ClusterQuiet),
}

/// One agent's side of the protocol, for one round.
pub struct Cluster<S> {
    /// None: no store to share (the etcd backend): always the fallback rule.
    store: Option<S>,
    keys: HangKeys,
    node: u32,
    nodes: u32,
    seq: u64,
    tracker: Tracker,
    /// Every node has published once: one `multi_get` reads them all from now on.
    all_published: bool,
    /// Bound on one poll's store exchange.
    op_timeout: Duration,
    stale_after: Duration,
    /// A verdict of this round was taken: no more.
    decided: bool,
    /// The fallback fired in this quiet episode (observe mode: once per episode).
    fallback_fired: bool,
    /// Since when the store has been unreachable (None: it answered at the last poll).
    store_down: Option<Instant>,
}

impl<S: RdzvStore> Cluster<S> {
    /// Node `node` of `nodes`, keys under `round_prefix`; `poll` is the hang poll interval.
    pub fn new(
        store: Option<S>,
        round_prefix: &str,
        node: u32,
        nodes: u32,
        poll: Duration,
    ) -> Self {
        // The exchange runs in the agent's loop: keep it short, so a lost store delays the
        // agent's other events (the rendezvous' own store-loss verdict) by little.
        let op_timeout = poll.clamp(Duration::from_millis(500), Duration::from_secs(2));
        Cluster {
            store,
            keys: HangKeys::new(round_prefix),
            node,
            nodes,
            seq: 0,
            tracker: Tracker::default(),
            all_published: false,
            op_timeout,
            // Several missed publications, not one slow poll.
            stale_after: poll * 4 + op_timeout * 2,
            decided: false,
            fallback_fired: false,
            store_down: None,
        }
    }

    pub fn node(&self) -> u32 {
        self.node
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    fn node_key(&self, n: u32) -> String {
        self.keys.node(n)
    }

    fn verdict_key(&self) -> String {
        self.keys.verdict()
    }

    fn report_key(&self, n: u32) -> String {
        self.keys.report(n)
    }

    /// One poll: publish this node's state, read the others' and the verdict, decide.
    pub async fn step(&mut self, local: &NodeQuiet, now: Instant) -> Step {
        if self.decided {
            return Step::Nothing;
        }
        self.seq += 1;
        let mut mine = NodeReport::of(local, self.seq);
        mine.stale_ms = ms(self.stale_after);
        let res = match &self.store {
            None => Err("no rendezvous store to share the nodes' state".to_string()),
            Some(_) => match tokio::time::timeout(self.op_timeout, self.exchange(&mine)).await {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "no answer within {:.1}s",
                    self.op_timeout.as_secs_f64()
                )),
            },
        };
        match res {
            Ok((Some(v), _)) => {
                self.up();
                self.decided = true;
                Step::Verdict(v)
            }
            Ok((None, reports)) => {
                self.up();
                let seen: Vec<Option<Seen>> = reports
                    .into_iter()
                    .enumerate()
                    .map(|(n, r)| r.map(|r| self.tracker.update(n as u32, r, now)))
                    .collect();
                let Some(q) = decide(&seen, self.stale_after) else {
                    return Step::Nothing;
                };
                let v = ClusterVerdict {
                    by: self.node,
                    nodes: self.nodes,
                    quiet_ms: ms(q.quiet_for),
                    budget_ms: ms(q.budget),
                };
                match self.claim(&v).await {
                    Ok(v) => {
                        self.decided = true;
                        Step::Verdict(v)
                    }
                    Err(e) => {
                        tracing::warn!("cannot publish the hang verdict: {e}");
                        self.store_down.get_or_insert(now);
                        self.fallback_step(&mine, now)
                    }
                }
            }
            Err(e) => {
                if self.store_down.is_none() && self.store.is_some() {
                    tracing::warn!(
                        "hang detection cannot read the other nodes' state ({e}); if the store stays unreachable, the local rule applies at {FALLBACK_FACTOR}x the budget"
                    );
                }
                self.store_down.get_or_insert(now);
                self.all_published = false;
                self.fallback_step(&mine, now)
            }
        }
    }

    fn up(&mut self) {
        if self.store_down.take().is_some() {
            tracing::info!("hang detection reads the other nodes' state again");
        }
    }

    /// The local rule at the longer budget, once the store has been unreachable for at least
    /// one budget (a single slow answer is no reason to judge alone); at once without a store.
    fn fallback_step(&mut self, mine: &NodeReport, now: Instant) -> Step {
        let down_long = match (self.store.is_some(), self.store_down) {
            (false, _) => true,
            (true, Some(since)) => {
                now.saturating_duration_since(since) >= Duration::from_millis(mine.budget_ms)
            }
            (true, None) => false,
        };
        match fallback(mine).filter(|_| down_long) {
            Some(q) if !self.fallback_fired => {
                self.fallback_fired = true;
                Step::Fallback(q)
            }
            Some(_) => Step::Nothing,
            None => {
                self.fallback_fired = false;
                Step::Nothing
            }
        }
    }

    /// SET own report; read the verdict and every node's report.
    #[allow(clippy::type_complexity)]
    async fn exchange(
        &mut self,
        mine: &NodeReport,
    ) -> Result<(Option<ClusterVerdict>, Vec<Option<NodeReport>>), String> {
        let store = self.store.as_ref().expect("checked by the caller");
        let json = serde_json::to_vec(mine).map_err(|e| e.to_string())?;
        store
            .set(&self.node_key(self.node), &json)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(v) = try_get(store, &self.verdict_key())
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok((Some(parse(&v)?), Vec::new()));
        }
        let keys: Vec<String> = (0..self.nodes).map(|n| self.node_key(n)).collect();
        let raw: Vec<Option<Vec<u8>>> = if self.all_published {
            store
                .multi_get(&keys)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            let mut out = Vec::with_capacity(keys.len());
            for k in &keys {
                out.push(try_get(store, k).await.map_err(|e| e.to_string())?);
            }
            self.all_published = out.iter().all(Option::is_some);
            out
        };
        // A report that does not parse (another version?) is no report: no verdict.
        Ok((
            None,
            raw.into_iter()
                .map(|r| r.and_then(|r| parse::<NodeReport>(&r).ok()))
                .collect(),
        ))
    }

    /// Creates the verdict key unless another node did; returns the round's verdict.
    async fn claim(&self, v: &ClusterVerdict) -> Result<ClusterVerdict, String> {
        let store = self.store.as_ref().expect("claim needs the store");
        let json = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        let got = tokio::time::timeout(
            self.op_timeout,
            store.compare_set(&self.verdict_key(), b"", &json),
        )
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
        parse(&got)
    }

    /// Publishes this node's findings, then waits up to `bound` for every other node's.
    /// Missing ones are `None` (that node did not report in time).
    pub async fn share_findings(
        &self,
        mine: &NodeFindings,
        bound: Duration,
    ) -> BTreeMap<u32, Option<NodeFindings>> {
        let mut out: BTreeMap<u32, Option<NodeFindings>> = (0..self.nodes)
            .filter(|&n| n != self.node)
            .map(|n| (n, None))
            .collect();
        let Some(store) = self.store.as_ref() else {
            return out;
        };
        let deadline = tokio::time::Instant::now() + bound;
        if let Ok(json) = serde_json::to_vec(mine) {
            let key = self.report_key(self.node);
            let set = store.set(&key, &json);
            if !matches!(tokio::time::timeout_at(deadline, set).await, Ok(Ok(()))) {
                tracing::warn!("cannot publish this node's hang findings to the store");
            }
        }
        loop {
            let missing: Vec<u32> = out
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(&n, _)| n)
                .collect();
            if missing.is_empty() {
                break;
            }
            for n in missing {
                let key = self.report_key(n);
                let get = try_get(store, &key);
                match tokio::time::timeout_at(deadline, get).await {
                    Ok(Ok(Some(v))) => {
                        out.insert(n, parse(&v).ok());
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(_)) | Err(_) => return out,
                }
            }
            if out.values().all(Option::is_some) {
                break;
            }
            let next = tokio::time::Instant::now() + Duration::from_millis(200);
            if next >= deadline {
                break;
            }
            tokio::time::sleep_until(next).await;
        }
        out
    }
}

fn parse<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Result<T, String> {
    serde_json::from_slice(raw).map_err(|e| format!("unreadable hang key: {e}"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
