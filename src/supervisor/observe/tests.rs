//! Unit tests of the observer (`mod.rs`), moved out so that the module fits in a head.

use serde_json::Value;

use super::*;
use crate::config::observe::EventsDest;
use crate::rendezvous::{Assignment, RoundReason};
use crate::supervisor::setup::observer_settings;

/// Issue 25: the restart round's rendezvous events said `attempt 0` beside
/// `restart_count 1`. Every event after `restart` carries the next attempt.
#[tokio::test]
async fn restart_round_events_carry_the_next_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut config = crate::config::testkit::launch_config(false, "127.0.0.1", Some(1));
    config.observe.events = Some(EventsDest::File(path.clone()));
    let mut obs = Inner::start(&observer_settings(&config), "h", None)
        .await
        .unwrap();
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
        ended: 0,
        cause: "exit code 3",
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
    let mut late = Inner::start(&observer_settings(&config), "h", None)
        .await
        .unwrap();
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

/// The health renderer reads the shared facts: `running` only once the whole group is spawned,
/// a child that is not one of the attempt's workers changes nothing, a worker's failure is
/// `stopping`, and the facts list the attempt's ranks.
#[test]
fn health_follows_the_attempts_workers() {
    use super::facts::Facts;
    use super::health::State;
    use super::render_health::HealthRenderer;
    use crate::exit::WorkerStatus;
    use crate::supervisor::watch::hang::OutputCounter;
    let common = Common {
        run_id: "r".into(),
        attempt: 0,
        node_rank: Some(0),
        host: "h".into(),
    };
    let mut facts = Facts::new(common, 2, std::time::Duration::from_secs(1));
    let health = Health::default();
    let mut r = HealthRenderer::new(health.clone());
    let mut on = |ev: RunEvent<'_>| {
        facts.before(&ev);
        r.on(&ev, &facts);
        facts.after(&ev);
        (health.get(), facts.now.exited.is_some(), facts.last_ranks())
    };
    let out = OutputCounter::new();
    let spawn = |local_rank: usize, pid: i32| RunEvent::Spawned {
        local_rank,
        rank: local_rank + 2,
        pid,
        output: &out,
    };
    let begins = RunEvent::AttemptBegins {
        attempt: 0,
        run_dir: None,
    };
    assert_eq!(on(begins).0, State::Spawning);
    assert_eq!(on(spawn(0, 100)).0, State::Spawning);
    assert_eq!(on(spawn(1, 101)).0, State::Running);
    let reaped = |pid, code| RunEvent::Reaped {
        pid,
        status: WorkerStatus::Exited(code),
    };
    assert_eq!(
        on(reaped(7, 1)),
        (State::Running, false, vec![(0, 2), (1, 3)])
    );
    assert_eq!(on(reaped(101, 1)).0, State::Stopping);
}

/// The report's restarts come from the events: each `restart` with the attempt that ended and
/// its cause, the next attempt's cost on the restart before it, and the back-in-user-code time
/// on that cost; a cost with no restart before it (the first attempt) is no one's.
#[test]
fn the_report_renderer_lists_the_restarts_with_their_costs() {
    use super::facts::Facts;
    use super::render_report::ReportRenderer;
    use crate::supervisor::report::end::Restart;
    let common = Common {
        run_id: "r".into(),
        attempt: 0,
        node_rank: Some(0),
        host: "h".into(),
    };
    let facts = Facts::new(common, 2, std::time::Duration::from_secs(1));
    let mut r = ReportRenderer::default();
    let cost = serde_json::json!({"total_s": 0.5});
    r.on(
        &RunEvent::RestartCost {
            fields: &cost,
            total: std::time::Duration::from_millis(500),
        },
        &facts,
    );
    assert!(r.restarts().is_empty());
    r.on(
        &RunEvent::Restart {
            next: 1,
            charged: true,
            kind: "restart",
            ended: 0,
            cause: "exit code 3",
        },
        &facts,
    );
    r.on(
        &RunEvent::RestartCost {
            fields: &cost,
            total: std::time::Duration::from_millis(500),
        },
        &facts,
    );
    r.on(
        &RunEvent::RestartBack {
            restart: 1,
            secs: 0.75,
        },
        &facts,
    );
    r.on(
        &RunEvent::Restart {
            next: 1,
            charged: false,
            kind: "regroup",
            ended: 1,
            cause: "membership change",
        },
        &facts,
    );
    assert_eq!(
        r.restarts(),
        [
            Restart {
                restart_count: 0,
                charged: true,
                cause: "exit code 3".into(),
                cost: Some(serde_json::json!({"total_s": 0.5, "back_in_user_code_s": 0.75})),
            },
            Restart {
                restart_count: 1,
                charged: false,
                cause: "membership change".into(),
                cost: None,
            },
        ]
    );
}
