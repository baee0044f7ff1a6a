//! Issue 38 items 4 and 7 across loopback nodes: how fast every node learns that an attempt is
//! over. A frozen (SIGSTOPped) node is dropped and both survivors regroup together, neither
//! waiting out the shutdown grace for the dead node's root cause (item 4); a failure after which
//! no restart is left ends the job on every node at once, and every node exits non-zero naming
//! the root cause (item 7). The etcd versions are in `etcd/job_over.rs`.
//!
//! Each test runs with `--shutdown-timeout 60`: the wait these tests rule out lasted the grace
//! plus 5 s, so its bounds (30 s) sit far from both what they allow and what they catch.

use std::time::{Duration, Instant};

use crate::netns::bounded;
use crate::util::{assert_no_leak, free_port, Output, Running, TempDir};

use super::{
    agent, assert_ok, c10d_hosted_args, check_round, recorded_pids, records, static_args, strings,
    wait_records,
};

/// The grace every agent of these tests runs with (see the module docs).
pub(crate) const GRACE: &str = "60";

/// What each test allows for what it checks: far below the grace plus 5 s.
pub(crate) const PROMPT: Duration = Duration::from_secs(30);

/// The parent pid of `pid` (`/proc/<pid>/stat`), if it runs.
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces, so read after its last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Freezes agent `frozen` and its workers (SIGSTOP by PID, the agent first so that it cannot
/// react to its workers' stop); returns the workers' PIDs.
pub(crate) fn freeze(frozen: &Running, dir: &std::path::Path) -> Vec<i32> {
    frozen.signal(libc::SIGSTOP);
    let workers: Vec<i32> = recorded_pids(dir)
        .into_iter()
        .filter(|p| parent_of(*p) == Some(frozen.pid))
        .collect();
    assert!(!workers.is_empty(), "the frozen agent's worker is recorded");
    for pid in &workers {
        // SAFETY: kill(2) on a worker PID this test read from its own records.
        unsafe {
            libc::kill(*pid, libc::SIGSTOP);
        }
    }
    workers
}

/// Ends a frozen agent and its workers (SIGKILL by PID; a stopped process dies of it too).
pub(crate) fn kill_frozen(frozen: Running, workers: &[i32]) {
    for pid in workers {
        // SAFETY: as in `freeze`.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    frozen.signal(libc::SIGKILL);
    assert_eq!(frozen.wait().signal, Some(libc::SIGKILL));
    assert_no_leak(workers, Duration::from_secs(10));
}

/// The survivors' side of item 4: both regrouped (checked by the caller), finished, and
/// neither waited for the frozen node's word.
#[track_caller]
pub(crate) fn assert_survivors_judged_alone(outs: &[Output]) {
    assert_ok(outs);
    for o in outs {
        assert!(
            !o.stderr.contains("without these nodes' word"),
            "a survivor waited for the lost node's root cause: {o:?}"
        );
    }
}

/// Item 4: three c10d agents (2:3, host 1 serves the store); agent 3 and its worker are frozen.
/// One survivor's keeper drops it; the other learns of the loss from the new round. Before the
/// fix that one waited the grace plus 5 s for the frozen node's root cause ("judging the
/// attempt's root cause without these nodes' word (none within 65s) missing=[..]") while the
/// first waited for it in the new round.
#[test]
fn c10d_frozen_node_both_survivors_regroup_together() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_frozen");
        let port = free_port();
        let running: Vec<_> = (1..=3)
            .map(|h| {
                agent(
                    &dir,
                    &c10d_hosted_args(port, "2:3", h, &["--shutdown-timeout", GRACE]),
                )
                .env("MN_HOLD_GWS", "3")
                .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(60));
        freeze_one_survivors_regroup(running, 2, dir.path());
    });
}

/// Item 4's scenario after the first round of three agents: agent `victim` (not the store
/// host) and its worker frozen; the two survivors must form their round within [`PROMPT`],
/// each judging the attempt alone; then the frozen ones are killed by pid and nothing is left.
/// Shared by the c10d test here and the etcd one (`etcd/job_over.rs`).
pub(crate) fn freeze_one_survivors_regroup(
    mut running: Vec<Running>,
    victim: usize,
    dir: &std::path::Path,
) {
    let frozen = running.remove(victim);
    let workers = freeze(&frozen, dir);
    let t0 = Instant::now();
    wait_records(dir, 2, 0, 2, PROMPT);
    eprintln!("freeze -> both survivors regrouped in {:?}", t0.elapsed());
    let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
    assert_survivors_judged_alone(&outs);
    check_round(&records(dir), 2, 0, Some(&[1, 1]));
    kill_frozen(frozen, &workers);
    assert_no_leak(&recorded_pids(dir), Duration::from_secs(10));
}

/// Item 7's check on two agents that ran `(2, 0)`: the job ended on both within [`PROMPT`] of
/// the failure (`t0`), both non-zero; the failing node (`failing`) reports its worker, the
/// other names the failing node and the root cause (every part of `told`).
#[track_caller]
pub(crate) fn assert_ended_everywhere(outs: &[Output], failing: usize, t0: Instant, told: &[&str]) {
    let took = t0.elapsed();
    eprintln!("failure -> both agents ended in {took:?}");
    assert!(took < PROMPT, "the job ended after {took:?}: {outs:?}");
    let (bad, other) = (&outs[failing], &outs[1 - failing]);
    bad.assert_code(1);
    assert!(bad.stderr.contains("Root Cause"), "{bad:?}");
    other.assert_code(1);
    assert!(told.iter().all(|t| other.stderr.contains(t)), "{other:?}");
}

/// Item 7, static: node 1's rank fails with `--max-restarts 0` while node 0's works on. Before
/// the fix node 1 closed the job only after the grace plus 5 s.
#[test]
fn static_failure_with_no_restart_left_ends_every_node_at_once() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_static_over");
        let port = free_port();
        let run = |rank| {
            let local = format!("127.0.0.{}", rank + 1);
            agent(
                &dir,
                &[
                    static_args(port, 2, rank, 1),
                    strings(&["--local-addr", &local, "--shutdown-timeout", GRACE]),
                ]
                .concat(),
            )
            .env("MN_FAIL_RANK", "1")
            .spawn()
        };
        let (a, b) = (run(0), run(1));
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
        let t0 = Instant::now();
        let outs = [a.wait(), b.wait()];
        // A static node is named by its host name.
        let told = [
            "rdrun: error: the job failed on node 1 (",
            "): exit code 1; its agent closed the rendezvous",
        ];
        assert_ended_everywhere(&outs, 1, t0, &told);
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Item 7, c10d (the case, PyTorch's `repro_close_delay` pattern): one rank fails with
/// `--max-restarts 0` while the other node's works on; before the fix the failing node exited
/// after the grace plus 5 s and the other let its worker run. Both ways round: the failing node
/// is the other's store client, then the store's host.
#[test]
fn c10d_failure_with_no_restart_left_ends_every_node_at_once() {
    bounded(Duration::from_secs(240), || {
        // Rank r runs on group rank r (127.0.0.1 sorts first), and host 1 serves the store.
        for failing in [1, 0] {
            let dir = TempDir::new("mn_c10d_over");
            let port = free_port();
            let runs: Vec<_> = (1..=2)
                .map(|h| {
                    agent(
                        &dir,
                        &c10d_hosted_args(port, "2", h, &["--shutdown-timeout", GRACE]),
                    )
                    .env("MN_FAIL_RANK", failing.to_string())
                    .spawn()
                })
                .collect();
            wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
            let t0 = Instant::now();
            let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
            let told = format!(
                "rdrun: error: the job failed on node {failing} (127.0.0.{}): exit code 1; its agent closed the rendezvous",
                failing + 1
            );
            assert_ended_everywhere(&outs, failing, t0, &[&told]);
            assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
        }
    });
}

/// Item 7 where the stop verdict may still apply (`--max-same-failures 1`: one failure is
/// enough): the failing node closes at once all the same, waits for the stopped node's entry,
/// and both exit 93 naming the verdict (the stopped one told it through the exchange).
#[test]
fn c10d_verdict_with_no_restart_left_ends_every_node_at_once_with_do_not_requeue() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_over_verdict");
        let port = free_port();
        let runs: Vec<_> = (1..=2)
            .map(|h| {
                agent(
                    &dir,
                    &c10d_hosted_args(
                        port,
                        "2",
                        h,
                        &["--shutdown-timeout", GRACE, "--max-same-failures", "1"],
                    ),
                )
                .env("MN_FAIL_RANK", "1")
                .spawn()
            })
            .collect();
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
        let t0 = Instant::now();
        let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
        let took = t0.elapsed();
        assert!(took < PROMPT, "the job ended after {took:?}: {outs:?}");
        let line = "the same failure 1 attempts in a row: exit code 1; not restarting";
        for o in &outs {
            o.assert_code(93);
            assert!(o.stderr.contains(line), "{outs:?}");
        }
        assert!(
            outs[0]
                .stderr
                .contains("rdrun: error: the job failed on node 1 (127.0.0.2): the same failure"),
            "{outs:?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}
