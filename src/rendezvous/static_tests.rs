//! Unit tests of the static rendezvous (`static_.rs`): ranks, timeouts, job-wide restarts,
//! node 0's reset of the workers' namespace, dead peers, rank claims.
use super::*;
use crate::rendezvous::store::MemStore;
use std::collections::BTreeMap;

pub(super) fn settings(pairs: &[(&str, &str)]) -> StaticSettings {
    let conf: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    StaticSettings::from_conf(&conf).unwrap()
}

pub(super) fn nodes(
    store: &MemStore,
    s: &StaticSettings,
    nprocs: &[usize],
) -> Vec<StaticRendezvous<MemStore>> {
    nprocs
        .iter()
        .enumerate()
        .map(|(rank, &n)| {
            StaticRendezvous::new(
                Arc::new(store.handle()),
                s.clone(),
                "none",
                rank,
                nprocs.len(),
                n,
                "10.0.0.1",
                29500,
            )
            .unwrap()
        })
        .collect()
}

pub(super) async fn round_all(
    ns: Vec<StaticRendezvous<MemStore>>,
    reason: RoundReason,
) -> (Vec<StaticRendezvous<MemStore>>, Vec<Assignment>) {
    let tasks: Vec<_> = ns
        .into_iter()
        .map(|mut n| {
            tokio::spawn(async move {
                let r = n.next_round(reason).await;
                (n, r)
            })
        })
        .collect();
    let mut out = (Vec::new(), Vec::new());
    for t in tasks {
        let (n, r) = t.await.unwrap();
        out.0.push(n);
        out.1.push(r.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn heterogeneous_ranks_from_node_rank() {
    let store = MemStore::new();
    let (_ns, asgs) = round_all(
        nodes(&store, &settings(&[]), &[2, 1, 3]),
        RoundReason::Initial,
    )
    .await;
    let got: Vec<(usize, usize, usize, usize)> = asgs
        .iter()
        .map(|a| (a.group_rank, a.base_rank, a.world_size, a.group_world_size))
        .collect();
    assert_eq!(got, [(0, 0, 6, 3), (1, 2, 6, 3), (2, 3, 6, 3)]);
    assert!(asgs
        .iter()
        .all(|a| a.master_addr == "10.0.0.1" && a.master_port == 29500 && a.restart_count == 0));
}

#[tokio::test(start_paused = true)]
async fn missing_node_times_out_naming_counts() {
    let store = MemStore::new();
    let mut ns = nodes(&store, &settings(&[("timeout", "4")]), &[1, 1]);
    let err = ns[0].next_round(RoundReason::Initial).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "rendezvous timed out after 4s: 1 node(s) joined, at least 2 needed"
    );
    assert!(StaticRendezvous::new(
        Arc::new(store.handle()),
        settings(&[]),
        "x",
        2,
        2,
        1,
        "a",
        1
    )
    .is_err());
}

#[tokio::test(start_paused = true)]
async fn failure_restarts_all_nodes_with_one_shared_count() {
    let store = MemStore::new();
    let (mut ns, _) = round_all(
        nodes(&store, &settings(&[]), &[1, 1, 1]),
        RoundReason::Initial,
    )
    .await;
    // Node 1 fails and rejoins; nodes 0 and 2 see the new generation.
    let mut failed = ns.remove(1);
    let t = tokio::spawn(async move {
        let r = failed.next_round(RoundReason::WorkerFailure).await;
        (failed, r)
    });
    for n in ns.iter_mut() {
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
    let (_ns, mut asgs) = round_all(ns, RoundReason::WorkerFailure).await;
    asgs.push(t.await.unwrap().1.unwrap());
    assert!(
        asgs.iter().all(|a| a.restart_count == 1 && a.round == 1),
        "{asgs:?}"
    );
}

/// Issue 24.1: node 0 resets the workers' namespace once per round, after every agent
/// arrived and before any agent (node 0 included) gets its assignment, so no worker of the
/// new attempt can read a key of the old one.
#[tokio::test(start_paused = true)]
async fn node_zero_resets_the_worker_namespace_before_any_round_opens() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let store = MemStore::new();
    let resets = Arc::new(AtomicUsize::new(0));
    let opened = Arc::new(AtomicUsize::new(0));
    let mut ns = nodes(&store, &settings(&[]), &[2, 2]);
    let (r, o, mem) = (resets.clone(), opened.clone(), store.handle());
    let first = ns.remove(0).with_worker_reset(Arc::new(move || {
        // No agent may have its assignment yet: the round is not open.
        assert_eq!(
            o.load(Ordering::SeqCst),
            0,
            "a round opened before the reset"
        );
        r.fetch_add(1, Ordering::SeqCst);
        // A worker key of the previous attempt (as gloo writes it) is removed here.
        usize::from(mem.peek("0//cpu//0/0").is_some())
    }));
    ns.insert(0, first);
    let run = |ns: Vec<StaticRendezvous<MemStore>>, reason| {
        let opened = opened.clone();
        async move {
            let tasks: Vec<_> = ns
                .into_iter()
                .map(|mut n| {
                    let opened = opened.clone();
                    tokio::spawn(async move {
                        let r = n.next_round(reason).await.unwrap();
                        opened.fetch_add(1, Ordering::SeqCst);
                        (n, r)
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        }
    };
    let ns: Vec<_> = run(ns, RoundReason::Initial)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(resets.load(Ordering::SeqCst), 1);
    opened.store(0, Ordering::SeqCst);
    let out = run(ns, RoundReason::WorkerFailure).await;
    assert_eq!(resets.load(Ordering::SeqCst), 2);
    assert!(out.iter().all(|(_, a)| a.restart_count == 1));
}

#[tokio::test(start_paused = true)]
async fn dead_peer_is_reported_within_the_heartbeat_budget() {
    let store = MemStore::new();
    let s = settings(&[]);
    let (mut ns, _) = round_all(nodes(&store, &s, &[1, 1]), RoundReason::Initial).await;
    drop(ns.pop());
    let t0 = Instant::now();
    let ev = tokio::time::timeout(Duration::from_secs(30), ns[0].watch())
        .await
        .unwrap();
    assert_eq!(ev, RdzvEvent::PeersLost(vec!["1".into()]));
    assert!(t0.elapsed() <= s.dead_after() + Duration::from_secs(2));
    ns[0].close(None).await.unwrap();
    assert!(matches!(
        ns[0].next_round(RoundReason::WorkerFailure).await,
        Err(RendezvousError::Closed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_taken_rank_is_refused_while_its_agent_beats_and_taken_over_after() {
    let store = MemStore::new();
    let s = settings(&[]);
    let (mut ns, _) = round_all(nodes(&store, &s, &[1, 1]), RoundReason::Initial).await;
    let dup = |who: &str| {
        StaticRendezvous::new(
            Arc::new(store.handle()),
            s.clone(),
            "none",
            1,
            2,
            1,
            "10.0.0.1",
            29500,
        )
        .unwrap()
        .with_identity(who)
    };
    let t0 = Instant::now();
    let err = dup("10.0.0.9")
        .next_round(RoundReason::Initial)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("node rank 1 is already taken by the agent on ")
            && msg.contains(&format!("(pid {}", std::process::id())),
        "{msg}"
    );
    assert!(t0.elapsed() <= s.dead_after() + Duration::from_secs(3));
    // The first rank-1 agent dies: a new one takes the rank over and the job goes on.
    drop(ns.pop());
    let mut back = dup("10.0.0.2");
    let (r0, r1) = tokio::join!(
        async {
            // Node 0 sees its peer lost, then waits for it in the next generation.
            let _ = tokio::time::timeout(Duration::from_secs(30), ns[0].watch()).await;
            ns[0].next_round(RoundReason::PeerLost).await
        },
        back.next_round(RoundReason::Initial)
    );
    assert_eq!(r1.unwrap().group_rank, 1);
    assert_eq!(r0.unwrap().group_rank, 0);
}
