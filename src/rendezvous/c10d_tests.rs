//! Unit tests of the c10d driver (`c10d.rs`) over an in-memory store on a paused clock: joins,
//! rounds, failures, dead and cut nodes, large rounds, redundancy, a torchrun agent on the run.
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

/// The full state the head names.
fn peek_state(store: &MemStore) -> RdzvState {
    let head = store.peek("rdrun.rendezvous.job/state").unwrap();
    let head = Head::decode(&head).unwrap().unwrap();
    RdzvState::decode(&store.peek(&head.body).unwrap()).unwrap()
}

fn req(reason: RoundReason) -> RoundRequest {
    RoundRequest {
        reason,
        master_port: 29500,
    }
}

/// Runs `next_round` for several nodes concurrently and returns their assignments.
async fn join_all(nodes: &mut [C10dRendezvous<MemStore>], reason: RoundReason) -> Vec<Assignment> {
    let futs = nodes.iter_mut().map(|n| n.next_round(req(reason)));
    futures_join_all(futs)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// Minimal join_all without the futures crate: spawn-free, polls all futures in turn.
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
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
    let by_node: Vec<(usize, usize)> = asgs.iter().map(|a| (a.group_rank, a.base_rank)).collect();
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
    let st = peek_state(&store);
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
    // The state document (now the body the small head names).
    let state_len = peek_state(&store).encode().len() as u64;
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
    assert!(!watch_targets(&peek_state(&store), nodes[0].node_id()).contains(&dead_id));
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

/// Issue 16: above `FULL_CHECK_MAX` nodes a participant builds its assignment from the
/// round's summary and its own notice (no roster read), the same as from the state but for
/// the node list; a node whose workers failed after another node already dropped a peer
/// reads the roster only then, to name the loss.
#[tokio::test(start_paused = true)]
async fn a_large_round_assigns_from_the_summary_and_reads_the_roster_only_for_a_loss() {
    let store = MemStore::new();
    let s = settings(5, 5, &[]);
    let nprocs = [2, 1, 4, 1, 3];
    let mut nodes: Vec<_> = nprocs
        .iter()
        .zip(1..)
        .map(|(&np, i)| node(&store, &s, i, np).with_full_check_max(2))
        .collect();
    let asgs = join_all(&mut nodes, RoundReason::Initial).await;
    let mut sorted: Vec<_> = asgs.iter().zip(&nodes).collect();
    sorted.sort_by_key(|(a, _)| a.group_rank);
    let by_rank: Vec<usize> = sorted.iter().map(|(a, _)| a.local_world_size).collect();
    check_ranks(&asgs, &by_rank);
    let st = peek_state(&store);
    for (a, n) in asgs.iter().zip(&nodes) {
        let mut want = assignment(&st, n.node_id(), "rdrun.rendezvous.job").unwrap();
        assert!(!want.nodes.is_empty() && !want.uniform_nproc);
        want.nodes.clear();
        assert_eq!(*a, want, "{}", n.node_id());
    }
    // A round within the limit still lists every node (the events name them).
    let small = MemStore::new();
    let s2 = settings(2, 2, &[]);
    let mut two: Vec<_> = (1..=2).map(|i| node(&small, &s2, i, 1)).collect();
    let asgs2 = join_all(&mut two, RoundReason::Initial).await;
    assert!(asgs2.iter().all(|a| a.nodes.len() == 2 && a.uniform_nproc));

    // A node dies; its watchers drop it and start the next round.
    let dead = nodes.remove(2);
    let dead_id = dead.node_id().to_string();
    drop(dead);
    let round = asgs[0].round;
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(s.poll_interval).await;
        if peek_state(&store).round != round {
            break;
        }
        assert!(
            t0.elapsed() <= s.dead_after() + s.poll_interval * 4,
            "nobody dropped the dead node"
        );
    }
    // A node whose workers fail now learns the loss from the roster it had not read.
    let lost = nodes[0].lost_peers_after_failure().await;
    assert_eq!(lost, vec![dead_id]);
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
    let extra_task = tokio::spawn(async move { extra.next_round(req(RoundReason::Initial)).await });
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
            &"the nodes disagree on --nnodes: this node says 2, 10.0.0.2_100_0 says 3".to_string()
        ) || msgs.contains(
            &"the nodes disagree on --nnodes: this node says 3, 10.0.0.1_100_0 says 2".to_string()
        ),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .all(|m| m.starts_with("the nodes disagree on --nnodes")),
        "{msgs:?}"
    );
}
