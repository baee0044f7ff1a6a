//! Unit tests of `cluster.rs` (moved out so that the module fits in a head).

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
        reason_strength("not in a collective: waits in Event.wait from its own code x (t.py:1)")
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
