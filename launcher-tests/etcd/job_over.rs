//! Issue 38 items 4 and 7 on etcd (a child module of `etcd`: its harness; `etcd::` selects these
//! too), as `multinode/job_over.rs` tests them on c10d and static: a frozen node's survivors
//! regroup together, and a failure with no restart left ends every node at once. The grace is
//! `--shutdown-timeout 60` (given as `PET_SHUTDOWN_TIMEOUT`: the harness puts the program last).

use super::*;
use crate::multinode::job_over::{freeze_one_survivors_regroup, GRACE, PROMPT};

/// Item 4: three agents (2:3), one that does not host the workers' store frozen with its
/// worker; both survivors regroup within [`PROMPT`], neither waiting for its root cause (before
/// the fix one of them waited the grace plus 5 s).
#[test]
fn frozen_node_both_survivors_regroup_together() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(3, 1) else {
            return;
        };
        let dir = TempDir::new("etcd-frozen");
        let running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "frozen", "2:3", i, "")
                    .env("PET_SHUTDOWN_TIMEOUT", GRACE)
                    .env("MN_HOLD_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        let (master, _) = check_round(&records(dir.path()), 3, 0, Some(&[1, 1, 1]));
        let victim = (0..3).find(|i| *i != node_of(&master)).unwrap();
        freeze_one_survivors_regroup(running, victim, dir.path());
    });
}

/// Item 7: two agents, rank 1 fails with no restart left while the other node's works on:
/// both end within [`PROMPT`], the failing one with its report, the other naming it and the
/// root cause (before the fix: after the grace plus 5 s).
#[test]
fn failure_with_no_restart_left_ends_every_node_at_once() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(2, 1) else {
            return;
        };
        let dir = TempDir::new("etcd-over");
        let running: Vec<_> = (0..2)
            .map(|i| {
                tb.agent(&dir, "over", "2", i, "")
                    .env("PET_SHUTDOWN_TIMEOUT", GRACE)
                    .env("PET_MAX_RESTARTS", "0")
                    .env("MN_FAIL_RANK", "1")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(90));
        let t0 = Instant::now();
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        let took = t0.elapsed();
        eprintln!("failure -> both agents ended in {took:?}");
        assert!(took < PROMPT, "the job ended after {took:?}: {outs:?}");
        let failing = outs
            .iter()
            .position(|o| o.stderr.contains("Root Cause"))
            .unwrap_or_else(|| panic!("no node reports its worker: {outs:?}"));
        outs[failing].assert_code(1);
        let other = &outs[1 - failing];
        other.assert_code(1);
        assert!(
            other
                .stderr
                .contains("rdrun: error: the job failed on node 1 (")
                && other
                    .stderr
                    .contains("): exit code 1; its agent closed the rendezvous"),
            "{other:?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}
