//! How a multi-node job ends on every node: a finished node waits in the exit barrier for a
//! straggler without declaring it dead (issue 17.1), a failure on every node ends both agents
//! promptly and a failure on the host is named by the other (issue 11.3), an agent beyond
//! `--nnodes` learns that the job ended (issue 17.4), and the static store host keeps serving
//! after its exit barrier timed out (issue 17.3).

use std::time::{Duration, Instant};

use crate::netns::bounded;
use crate::util::{assert_no_leak, free_port, Output, TempDir};

use super::{
    agent, assert_ok, c10d_hosted_args, recorded_pids, records, static_args, strings, wait_records,
};

/// Heartbeats every 0.25 s, a node is dead after 2 s without one: test-sized, and shorter than
/// the exit barrier's 1 s WAIT slices times the keeper's store operations per beat.
const FAST_BEATS: &str = "keep_alive_interval=0.25,keep_alive_max_attempt=8";

/// Issue 17.1: a static node whose worker finished at once waits in the exit barrier while the
/// other node's straggler works; its heartbeats used to queue behind the barrier's WAITs on the
/// one store connection, and the working node was declared dead. Both orders: the finished node
/// hosting the store, then the working one.
#[test]
fn static_finished_node_waits_for_a_straggler_without_being_declared_dead() {
    bounded(Duration::from_secs(240), || {
        for straggler in [1, 0] {
            let dir = TempDir::new("mn_straggler");
            let port = free_port();
            let run = |rank| {
                agent(
                    &dir,
                    &[
                        static_args(port, 2, rank, 1),
                        strings(&["--rdzv-conf", FAST_BEATS]),
                    ]
                    .concat(),
                )
                .env("MN_STRAGGLE", format!("{straggler}:8"))
                .spawn()
            };
            let (a, b) = (run(0), run(1));
            let t0 = Instant::now();
            let outs = [a.wait(), b.wait()];
            assert_ok(&outs);
            assert!(
                t0.elapsed() >= Duration::from_secs(8),
                "the straggler ran to its end"
            );
            for o in &outs {
                assert!(!o.stderr.contains("stopped heartbeating"), "{o:?}");
            }
            assert_eq!(records(dir.path()).len(), 2);
        }
    });
}

/// Issue 11.3: a worker fails on every node (no restarts): the other agent no longer retries
/// closing the rendezvous on the vanished store for ~32 s (it did in about 1 of 3 runs; 3
/// tries). Then the failure is on the host only: the other node names it and its root cause.
#[test]
fn c10d_failure_on_every_node_ends_promptly_and_a_host_failure_is_named() {
    bounded(Duration::from_secs(300), || {
        for attempt in 0..3 {
            let dir = TempDir::new("mn_c10d_all_fail");
            let port = free_port();
            let go = dir.join("go");
            let runs: Vec<_> = (1..=2)
                .map(|h| {
                    agent(&dir, &c10d_hosted_args(port, "2", h, &[]))
                        .env("MN_UNTIL", &go)
                        .env("MN_UNTIL_CODE", "3")
                        .spawn()
                })
                .collect();
            wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
            let t0 = Instant::now();
            std::fs::write(&go, b"").expect("write go");
            for out in runs.into_iter().map(|r| r.wait()) {
                out.assert_code(3);
            }
            let took = t0.elapsed();
            assert!(
                took < Duration::from_secs(15),
                "try {attempt}: both agents ended after {took:?}"
            );
        }
        // Only the host's worker fails (rank 0: 127.0.0.1 sorts first).
        let dir = TempDir::new("mn_c10d_host_fail");
        let port = free_port();
        let runs: Vec<_> = (1..=2)
            .map(|h| {
                agent(&dir, &c10d_hosted_args(port, "2", h, &[]))
                    .env("MN_FAIL_RANK", "0")
                    .spawn()
            })
            .collect();
        let mut outs = runs.into_iter().map(|r| r.wait());
        let (host, other) = (outs.next().unwrap(), outs.next().unwrap());
        host.assert_code(1);
        assert!(host.stderr.contains("Root Cause"), "{host:?}");
        other.assert_code(1);
        assert!(
            other.stderr.contains(
                "rdrun: error: the job failed on node 0 (127.0.0.1): exit code 1; its agent closed the rendezvous"
            ),
            "{other:?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Issue 17.4: an agent beyond `--nnodes 2` waits on the redundancy list; when the job ends the
/// host waits until it has seen the close, and it exits 0 (instead of losing the store).
#[test]
fn c10d_agent_beyond_max_learns_that_the_job_ended() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_redundant");
        let port = free_port();
        let go = dir.join("go");
        let run = |h| {
            agent(&dir, &c10d_hosted_args(port, "2", h, &[]))
                .env("MN_UNTIL", &go)
                .spawn()
        };
        let first: Vec<_> = (1..=2).map(run).collect();
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
        let extra = run(3);
        // Time to land on the redundancy list (it polls the state every second).
        std::thread::sleep(Duration::from_secs(3));
        std::fs::write(&go, b"").expect("write go");
        let t0 = Instant::now();
        let outs: Vec<Output> = first.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let extra = extra.wait();
        extra.assert_code(0);
        assert!(
            extra
                .stderr
                .contains("the job finished while this node waited to join"),
            "{extra:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert_eq!(
            records(dir.path()).len(),
            2,
            "the extra agent ran no worker"
        );
    });
}

/// Issue 17.3: `--exit-barrier-timeout 2` on the static store host (node 0, finished at once)
/// while node 1's straggler works 8 s: the host keeps serving until node 1 left, so both succeed.
#[test]
fn static_host_keeps_serving_after_its_exit_barrier_timed_out() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_static_barrier_timeout");
        let port = free_port();
        let run = |rank| {
            agent(
                &dir,
                &[
                    static_args(port, 2, rank, 1),
                    strings(&["--exit-barrier-timeout", "2"]),
                ]
                .concat(),
            )
            .env("MN_STRAGGLE", "1:8")
            .spawn()
        };
        let (a, b) = (run(0), run(1));
        let (a, b) = (a.wait(), b.wait());
        b.assert_code(0);
        a.assert_code(0);
        assert!(
            a.stderr
                .contains("keeps serving it until the other nodes leave"),
            "{a:?}"
        );
    });
}
