//! A duplicate static node rank is told within the heartbeat budget whatever the job does
//! (issue 25.2): while the owner beats, after the job ended, and when the job's store goes away
//! during the check (the store's host exits at the end of the job).

use super::tests::{nodes, round_all, settings};
use super::*;
use crate::rendezvous::store::MemStore;

/// A second agent for node rank 1 of the 2-node job in `store`, on its own handle.
fn duplicate(store: &MemStore, s: &StaticSettings) -> (StaticRendezvous<MemStore>, MemStore) {
    let handle = store.handle();
    let dup = StaticRendezvous::new(
        Arc::new(handle.clone()),
        s.clone(),
        "none",
        1,
        2,
        1,
        "10.0.0.1",
        29500,
    )
    .unwrap()
    .with_identity("10.0.0.9");
    (dup, handle)
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_a_job_that_ended_is_told_at_once_naming_the_owner() {
    let store = MemStore::new();
    let s = settings(&[]);
    let (mut ns, _) = round_all(nodes(&store, &s, &[1, 1]), RoundReason::Initial).await;
    for n in ns.iter_mut() {
        n.close(None).await.unwrap();
    }
    let (mut dup, _) = duplicate(&store, &s);
    let t0 = Instant::now();
    let msg = dup
        .next_round(RoundReason::Initial)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("node rank 1 is already taken by the agent on ")
            && msg.contains(&format!("(pid {}", std::process::id()))
            && msg.contains("that job has already ended; give every node its own --node-rank"),
        "{msg}"
    );
    assert!(t0.elapsed() < s.keep_alive_interval, "{:?}", t0.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_whose_job_store_goes_away_is_told_within_the_budget() {
    let store = MemStore::new();
    let s = settings(&[]);
    let (ns, _) = round_all(nodes(&store, &s, &[1, 1]), RoundReason::Initial).await;
    // The owner stops beating (its job is ending) and the store's host goes away while the
    // duplicate checks the owner's heartbeats.
    drop(ns);
    let (mut dup, link) = duplicate(&store, &s);
    let t0 = Instant::now();
    let check = tokio::spawn(async move { dup.next_round(RoundReason::Initial).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    link.set_cut(true);
    let msg = tokio::time::timeout(Duration::from_secs(60), check)
        .await
        .expect("told within the budget, not after the 900 s rendezvous timeout")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("node rank 1 is already taken by the agent on ")
            && msg.contains("that job's store went away while this agent checked it"),
        "{msg}"
    );
    assert!(
        t0.elapsed() <= s.dead_after() + s.keep_alive_interval,
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_a_running_job_is_told_at_the_owners_next_heartbeat() {
    let store = MemStore::new();
    let s = settings(&[]);
    let (_ns, _) = round_all(nodes(&store, &s, &[1, 1]), RoundReason::Initial).await;
    let (mut dup, _) = duplicate(&store, &s);
    let t0 = Instant::now();
    let err = dup.next_round(RoundReason::Initial).await.unwrap_err();
    assert!(
        matches!(err, RendezvousError::RankTaken { node_rank: 1, .. }),
        "{err}"
    );
    // One heartbeat interval or two, not the whole budget.
    assert!(
        t0.elapsed() <= 2 * s.keep_alive_interval + Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
}
