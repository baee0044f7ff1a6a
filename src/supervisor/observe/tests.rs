//! Unit tests of the observer (`mod.rs`), moved out so that the module fits in a head.

use super::*;
use crate::config::observe::EventsDest;

/// Issue 25: the restart round's rendezvous events said `attempt 0` beside
/// `restart_count 1`. Every event after `restart` carries the next attempt.
#[tokio::test]
async fn restart_round_events_carry_the_next_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut config = crate::config::testkit::launch_config(false, "127.0.0.1", Some(1));
    config.observe.events = Some(EventsDest::File(path.clone()));
    let mut obs = Inner::start(&config, "h", None).await.unwrap();
    let asg = |restart_count| Assignment {
        round: u64::from(restart_count),
        group_rank: 0,
        group_world_size: 1,
        local_world_size: 1,
        base_rank: 0,
        world_size: 1,
        master_addr: "127.0.0.1".into(),
        master_port: 1,
        restart_count,
        reason: RoundReason::Initial,
        store_prefix: String::new(),
        nodes: vec![(String::new(), 1)],
        uniform_nproc: true,
    };
    let (a0, a1) = (asg(0), asg(1));
    obs.on(RunEvent::RendezvousBegins(RoundReason::Initial));
    obs.on(RunEvent::RendezvousEnded(Ok(&a0)));
    obs.on(RunEvent::AttemptBegins {
        attempt: 0,
        run_dir: None,
    });
    obs.on(RunEvent::Restart {
        next: 1,
        charged: true,
        kind: "restart",
    });
    obs.on(RunEvent::RendezvousBegins(RoundReason::WorkerFailure));
    obs.on(RunEvent::RendezvousEnded(Ok(&a1)));
    obs.on(RunEvent::AttemptBegins {
        attempt: 1,
        run_dir: None,
    });
    drop(obs);
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(String, u64)> = lines
        .iter()
        .map(|v| {
            (
                v["event"].as_str().unwrap().to_string(),
                v["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [
        ("run_start", 0),
        ("rendezvous_start", 0),
        ("rendezvous_complete", 0),
        ("restart", 0),
        ("rendezvous_start", 1),
        ("rendezvous_complete", 1),
    ]
    .iter()
    .map(|(e, a)| (e.to_string(), *a))
    .collect();
    assert_eq!(got, want);
    // A node joining late (its own count 0) runs the round's attempt.
    let mut late = Inner::start(&config, "h", None).await.unwrap();
    let a3 = asg(3);
    late.on(RunEvent::RendezvousBegins(RoundReason::Initial));
    late.on(RunEvent::RendezvousEnded(Ok(&a3)));
    drop(late);
    let last: Value = serde_json::from_str(
        std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["event"], "rendezvous_complete");
    assert_eq!(last["attempt"], 3);
}
