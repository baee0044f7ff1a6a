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
mod tests {
    use super::*;
    use crate::rendezvous::store::MemStore;
    use crate::supervisor::watch::hang::Phase;

    const S: Duration = Duration::from_secs(1);
    const STALE: Duration = Duration::from_secs(30);

    fn rep(live: u32, watched: u32, quiet_s: u64, budget_s: u64) -> NodeReport {
        NodeReport {
            seq: 1,
            live,
            watched,
            quiet_ms: quiet_s * 1000,
            budget_ms: budget_s * 1000,
            phase: "steady".into(),
            stale_ms: 0,
        }
    }

    fn fresh(r: NodeReport) -> Option<Seen> {
        Some(Seen {
            report: r,
            age: Duration::ZERO,
        })
    }

    fn quiet(live: u32, watched: u32, quiet_for: Duration, budget: Duration) -> NodeQuiet {
        NodeQuiet {
            phase: Phase::Steady,
            budget,
            live,
            watched,
            quiet_for,
        }
    }

    #[test]
    fn every_node_quiet_past_its_budget_is_a_verdict() {
        let v = decide(&[fresh(rep(2, 2, 12, 10)), fresh(rep(2, 2, 11, 10))], STALE);
        assert_eq!(
            v,
            Some(ClusterQuiet {
                quiet_for: 11 * S,
                budget: 10 * S
            })
        );
    }

    #[test]
    fn a_slow_polling_peer_is_not_stale_between_its_polls() {
        // This agent's bound is 4 s; the peer polls slowly (its bound 40 s) and said "active"
        // 20 s ago. Taken as stale it would count 20 s of quiet, past the 10 s budget.
        let stale_here = 4 * S;
        let mut active = rep(2, 2, 0, 10);
        let seen = |r: NodeReport| {
            Some(Seen {
                report: r,
                age: 20 * S,
            })
        };
        assert!(decide(
            &[fresh(rep(2, 2, 30, 10)), seen(active.clone())],
            stale_here
        )
        .is_some());
        active.stale_ms = 40_000;
        assert_eq!(
            decide(
                &[fresh(rep(2, 2, 30, 10)), seen(active.clone())],
                stale_here
            ),
            None
        );
        // Past its own bound it is stale again and counts as quiet since it was last seen.
        let late = Some(Seen {
            report: active,
            age: 41 * S,
        });
        assert!(decide(&[fresh(rep(2, 2, 30, 10)), late], stale_here).is_some());
    }

    #[test]
    fn one_active_or_exempt_or_silent_node_prevents_it() {
        // Node 1 active (quiet 3 s of 10).
        assert_eq!(
            decide(&[fresh(rep(2, 2, 50, 10)), fresh(rep(2, 2, 3, 10))], STALE),
            None
        );
        // Node 1's ranks are all being debugged.
        assert_eq!(
            decide(&[fresh(rep(2, 2, 50, 10)), fresh(rep(1, 0, 50, 10))], STALE),
            None
        );
        // Node 1 has not published yet.
        assert_eq!(decide(&[fresh(rep(2, 2, 50, 10)), None], STALE), None);
        // Nobody alive anywhere.
        assert_eq!(
            decide(&[fresh(rep(0, 0, 50, 10)), fresh(rep(0, 0, 50, 10))], STALE),
            None
        );
    }

    #[test]
    fn a_node_without_live_ranks_does_not_block_and_a_stale_report_ages() {
        assert!(decide(&[fresh(rep(2, 2, 12, 10)), fresh(rep(0, 0, 0, 10))], STALE).is_some());
        // Node 1 last said "active" 40 s ago and stopped reporting: quiet since then.
        let stale = Some(Seen {
            report: rep(2, 2, 0, 10),
            age: 40 * S,
        });
        assert_eq!(
            decide(&[fresh(rep(2, 2, 12, 10)), stale.clone()], STALE),
            Some(ClusterQuiet {
                quiet_for: 12 * S,
                budget: 10 * S
            })
        );
        // Only stale reports: no verdict (this node is always fresh in practice).
        assert_eq!(decide(&[stale.clone(), stale], STALE), None);
    }

    #[test]
    fn fallback_needs_twice_the_budget_and_a_watched_rank() {
        assert_eq!(fallback(&rep(2, 2, 19, 10)), None);
        assert_eq!(
            fallback(&rep(2, 2, 20, 10)),
            Some(ClusterQuiet {
                quiet_for: 20 * S,
                budget: 20 * S
            })
        );
        assert_eq!(fallback(&rep(2, 0, 99, 10)), None);
        assert_eq!(fallback(&rep(0, 0, 99, 10)), None);
    }

    #[test]
    fn tracker_ages_a_report_only_while_its_seq_stays() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        assert_eq!(t.update(1, rep(1, 1, 0, 10), t0).age, Duration::ZERO);
        assert_eq!(t.update(1, rep(1, 1, 0, 10), t0 + 7 * S).age, 7 * S);
        let mut r = rep(1, 1, 0, 10);
        r.seq = 2;
        assert_eq!(t.update(1, r, t0 + 9 * S).age, Duration::ZERO);
    }

    #[test]
    fn job_suspect_prefers_the_strongest_reason() {
        let a = NodeFindings {
            node: 0,
            ranks: vec![0, 1],
            suspects: vec![1],
            reason: "kernel wait differs from the other ranks".into(),
            files: None,
        };
        let b = NodeFindings {
            node: 1,
            ranks: vec![2, 3],
            suspects: vec![3],
            reason: "not in a collective".into(),
            files: None,
        };
        assert_eq!(job_suspect(&[&a, &b]).map(|s| s.0), Some(3));
        let none = NodeFindings {
            suspects: vec![],
            reason: String::new(),
            ..a.clone()
        };
        assert_eq!(job_suspect(&[&none]).map(|s| s.0), None);
        // A quoted user function name does not change a reason's strength.
        let odd = "top frame differs from the other ranks";
        let stuck = "its DataLoader worker pid 7 is stuck in reset_heartbeat (data.py:3)";
        assert!(reason_strength(stuck) > reason_strength(odd));
        assert_eq!(
            reason_strength(stuck),
            reason_strength(
                "not in a collective: waits in Event.wait from its own code x (t.py:1)"
            )
        );
        assert!(reason_strength("heartbeat past its budget") > reason_strength(stuck));
    }

    /// Two agents on one in-memory store: node 1 active keeps node 0 from a verdict; once both
    /// are quiet one verdict is created, both read the same one, findings are exchanged.
    #[tokio::test]
    async fn two_agents_agree_on_one_verdict_and_exchange_findings() {
        let store = MemStore::new();
        let poll = S;
        let mut a = Cluster::new(Some(store.handle()), "p.0", 0, 2, poll);
        let mut b = Cluster::new(Some(store.handle()), "p.0", 1, 2, poll);
        let t0 = Instant::now();
        let q = quiet(2, 2, 60 * S, 10 * S);
        let busy = quiet(2, 2, Duration::ZERO, 10 * S);
        assert_eq!(a.step(&q, t0).await, Step::Nothing, "node 1 not published");
        assert_eq!(b.step(&busy, t0).await, Step::Nothing);
        assert_eq!(a.step(&q, t0 + S).await, Step::Nothing, "node 1 is active");
        let Step::Verdict(vb) = b.step(&q, t0 + 2 * S).await else {
            panic!("every node quiet: a verdict");
        };
        assert_eq!(vb.by, 1);
        // Node 0 reads the same verdict even while active again: one per round.
        assert_eq!(a.step(&busy, t0 + 3 * S).await, Step::Verdict(vb.clone()));
        assert_eq!(a.step(&q, t0 + 4 * S).await, Step::Nothing, "once a round");
        assert_eq!(b.step(&q, t0 + 4 * S).await, Step::Nothing, "once a round");
        let fa = NodeFindings {
            node: 0,
            ranks: vec![0, 1],
            suspects: vec![],
            reason: String::new(),
            files: None,
        };
        let fb = NodeFindings {
            node: 1,
            ranks: vec![2, 3],
            suspects: vec![3],
            reason: "not in a collective".into(),
            files: Some("/x".into()),
        };
        let (ra, rb) = tokio::join!(a.share_findings(&fa, 5 * S), b.share_findings(&fb, 5 * S));
        assert_eq!(ra.get(&1), Some(&Some(fb)));
        assert_eq!(rb.get(&0), Some(&Some(fa)));
        // Another round's keys are apart.
        let mut c = Cluster::new(Some(store.handle()), "p.1", 0, 2, poll);
        assert_eq!(c.step(&q, t0).await, Step::Nothing);
    }

    #[tokio::test]
    async fn store_lost_falls_back_to_the_local_rule_at_twice_the_budget() {
        let store = MemStore::new();
        let h = store.handle();
        let mut a = Cluster::new(Some(h.clone()), "p.0", 0, 2, S);
        h.set_cut(true);
        let t0 = Instant::now();
        assert_eq!(
            a.step(&quiet(1, 1, 15 * S, 10 * S), t0).await,
            Step::Nothing
        );
        // Quiet long enough, but the store has been down for less than a budget.
        assert_eq!(
            a.step(&quiet(1, 1, 20 * S, 10 * S), t0 + 9 * S).await,
            Step::Nothing
        );
        assert_eq!(
            a.step(&quiet(1, 1, 20 * S, 10 * S), t0 + 10 * S).await,
            Step::Fallback(ClusterQuiet {
                quiet_for: 20 * S,
                budget: 20 * S
            })
        );
        assert_eq!(
            a.step(&quiet(1, 1, 25 * S, 10 * S), t0 + 11 * S).await,
            Step::Nothing,
            "once per quiet episode"
        );
        // No store at all (etcd): the same rule.
        let mut e = Cluster::<MemStore>::new(None, "p.0", 0, 2, S);
        assert!(matches!(
            e.step(&quiet(1, 1, 20 * S, 10 * S), t0).await,
            Step::Fallback(_)
        ));
        // Store back, other node silent: nothing.
        h.set_cut(false);
        let mut b = Cluster::new(Some(store.handle()), "p.0", 0, 2, S);
        assert_eq!(
            b.step(&quiet(1, 1, 99 * S, 10 * S), t0).await,
            Step::Nothing
        );
    }

    fn arb_report() -> impl proptest::strategy::Strategy<Value = (NodeReport, u64)> {
        use proptest::prelude::*;
        (0u32..3, 0u32..3, 0u64..40, 1u64..20, 0u64..60).prop_map(|(live, w, q, b, age)| {
            (
                NodeReport {
                    seq: 1,
                    live,
                    watched: w.min(live),
                    quiet_ms: q * 1000,
                    budget_ms: b * 1000,
                    phase: "steady".into(),
                    stale_ms: 0,
                },
                age,
            )
        })
    }

    proptest::proptest! {
        /// Never a verdict while any node's fresh report shows activity (quiet under its budget)
        /// or only exempt ranks; and whenever there is one, every node with live ranks is quiet
        /// past its budget by the rule's own estimate.
        #[test]
        fn never_a_verdict_while_a_node_reports_activity(
            nodes in proptest::collection::vec(arb_report(), 1..6)
        ) {
            let seen: Vec<Option<Seen>> = nodes
                .iter()
                .map(|(r, age)| Some(Seen { report: r.clone(), age: Duration::from_secs(*age) }))
                .collect();
            let active = nodes.iter().any(|(r, age)| {
                Duration::from_secs(*age) < STALE
                    && r.live > 0
                    && (r.watched == 0 || r.quiet_ms < r.budget_ms)
            });
            let v = decide(&seen, STALE);
            if active {
                proptest::prop_assert!(v.is_none(), "verdict {:?} while active: {:?}", v, nodes);
            }
            if let Some(q) = v {
                proptest::prop_assert!(q.quiet_for >= Duration::from_millis(
                    nodes.iter().filter(|(r, _)| r.live > 0).map(|(r, _)| r.budget_ms).min().unwrap_or(0)));
                proptest::prop_assert!(nodes.iter().any(|(r, age)| r.live > 0 && Duration::from_secs(*age) < STALE));
            }
        }
    }
}
