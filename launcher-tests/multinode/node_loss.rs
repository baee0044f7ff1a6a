//! A node lost while a multi-node job runs: a SIGKILLed c10d agent is detected and the
//! survivors regroup without a restart (on loopback and across network namespaces; also when its
//! peers' workers fail first, issue 17.7), a cable pulled in a namespace drops that node,
//! SIGTERM to one static agent stops the job on every node, a SIGKILLed static peer is named,
//! and losing the store's host ends the other nodes with one line (static, and c10d on the
//! restart path, issue 17.2).

use std::time::{Duration, Instant};

use crate::netns::{bounded, Netns};
use crate::util::{assert_no_leak, free_port, Output, Rdrun, TempDir};

use super::{
    agent, assert_ok, c10d_args, c10d_hosted_args, check_round, get, held_static_pair,
    recorded_pids, records, strings, wait_records,
};

/// Three c10d agents (2:3); the one at index `victim` is SIGKILLed by PID while its workers run;
/// the other two must regroup as a 2-node job (restart count unchanged) and finish.
fn c10d_kill_scenario(dir: &TempDir, runs: Vec<Rdrun>, victim: usize) {
    let mut running: Vec<_> = runs
        .into_iter()
        .map(|r| r.env("MN_HOLD_GWS", "3").spawn())
        .collect();
    wait_records(dir.path(), 3, 0, 3, Duration::from_secs(60));
    let victim_pids: Vec<i32> = recorded_pids(dir.path());
    let killed = running.remove(victim);
    let t0 = Instant::now();
    killed.signal(libc::SIGKILL);
    let dead = killed.wait();
    assert_eq!(dead.signal, Some(libc::SIGKILL));
    let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    eprintln!("SIGKILL -> survivors done in {:?}", t0.elapsed());
    let recs = records(dir.path());
    check_round(&recs, 2, 0, Some(&[1, 1]));
    assert!(
        !recs.keys().any(|k| k.1 > 0),
        "membership is not a restart: {recs:#?}"
    );
    // The killed agent's worker died with it (parent-death signal); the others were stopped.
    assert_no_leak(&victim_pids, Duration::from_secs(10));
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

#[test]
fn c10d_sigkilled_agent_is_detected_and_survivors_continue() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_kill");
        let port = free_port();
        // On loopback every agent's address is local, so each would infer that it hosts the store
        // and the first to bind wins. The victim must not be that host (torchrun's survivors would
        // lose the store too), so the test says who hosts with `is_host`, as a user would.
        let runs = (1..=3)
            .map(|h| {
                let mut args = c10d_args(port, "2:3", h, 1);
                let conf = args
                    .iter()
                    .position(|a| a == "last_call_timeout=20")
                    .unwrap();
                args[conf] = format!("last_call_timeout=20,is_host={}", h == 1);
                agent(&dir, &args)
            })
            .collect();
        c10d_kill_scenario(&dir, runs, 2);
    });
}

/// Issue 17.7: a SIGKILLed node makes its peers' workers fail (as gloo's do) before any
/// heartbeat budget runs out; with `--max-restarts 0` the survivors must still regroup and
/// finish, the failure counted as the membership change (before the fix the job ended with
/// exit 1: the failure was charged).
#[test]
fn c10d_sigkilled_node_whose_peers_fail_is_not_charged() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_kill_fail");
        let port = free_port();
        let mut running: Vec<_> = (1..=3)
            .map(|h| {
                let mut args = c10d_args(port, "2:3", h, 1);
                let conf = args
                    .iter()
                    .position(|a| a == "last_call_timeout=20")
                    .unwrap();
                args[conf] = format!("last_call_timeout=20,is_host={}", h == 1);
                args.extend(strings(&["--max-restarts", "0"]));
                agent(&dir, &args).env("MN_FAIL_ON_LOSS_GWS", "3").spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(60));
        let killed = running.remove(2);
        killed.signal(libc::SIGKILL);
        assert_eq!(killed.wait().signal, Some(libc::SIGKILL));
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        for o in &outs {
            assert!(
                o.stderr.contains("the failure is the membership change's"),
                "{o:?}"
            );
        }
        let recs = records(dir.path());
        check_round(&recs, 2, 0, Some(&[1, 1]));
        assert!(
            !recs.keys().any(|k| k.1 > 0),
            "a lost node is not a restart: {recs:#?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

#[test]
fn netns_c10d_sigkilled_agent_is_detected_and_survivors_continue() {
    bounded(Duration::from_secs(240), || {
        let Some(net) = Netns::create(3) else { return };
        let dir = TempDir::new("mn_netns_kill");
        let endpoint = format!("{}:29400", net.addr(0));
        let runs = (0..3)
            .map(|i| {
                agent(
                    &dir,
                    &strings(&[
                        "--nnodes",
                        "2:3",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        &endpoint,
                        "--rdzv-id",
                        "netjob",
                        "--rdzv-conf",
                        "last_call_timeout=20",
                    ]),
                )
                .netns(&net.name(i))
            })
            .collect();
        c10d_kill_scenario(&dir, runs, 2);
        // Without --local-addr every node advertised its address on the route to the endpoint.
        for env in records(dir.path()).values() {
            let addr = get(env, "MASTER_ADDR");
            assert!(
                addr.starts_with("10.231.0."),
                "MASTER_ADDR {addr} is not a host address"
            );
        }
    });
}

#[test]
fn sigterm_to_one_static_agent_stops_the_job_on_every_node() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_sigterm");
        let (a, b) = held_static_pair(&dir, 2);
        a.signal(libc::SIGTERM);
        let a = a.wait();
        // The signal is forwarded to the workers and rdrun exits 128 + SIGTERM, as single-node.
        a.assert_code(128 + libc::SIGTERM);
        // Node 1 loses its peer (and node 0's store): a clear error, not a hang.
        let b = b.wait();
        b.assert_code(1);
        assert!(b.stderr.contains("rdrun: error:"), "{b:?}");
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

#[test]
fn static_sigkilled_peer_is_detected_and_named() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_static_kill");
        let (a, b) = held_static_pair(&dir, 1);
        let pids = recorded_pids(dir.path());
        b.signal(libc::SIGKILL);
        assert_eq!(b.wait().signal, Some(libc::SIGKILL));
        // No restarts left: node 0 names the lost node instead of hanging until a timeout.
        let a = a.wait();
        a.assert_code(1);
        assert!(
            a.stderr.contains(
                "rdrun: error: node(s) 1 of the static job stopped heartbeating and no restarts are left"
            ),
            "{a:?}"
        );
        assert_no_leak(&pids, Duration::from_secs(10));
    });
}

#[test]
fn static_sigkilled_store_host_ends_the_other_node() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_static_kill_host");
        let (a, b) = held_static_pair(&dir, 1);
        let pids = recorded_pids(dir.path());
        let t0 = Instant::now();
        a.signal(libc::SIGKILL);
        assert_eq!(a.wait().signal, Some(libc::SIGKILL));
        // Node 0 hosted the store: node 1 sees its heartbeats fail, stops its worker and says
        // why, instead of waiting for a store that will not come back.
        let b = b.wait();
        b.assert_code(1);
        assert!(
            b.stderr.contains("rdrun: error: lost the rendezvous store"),
            "{b:?}"
        );
        eprintln!(
            "SIGKILL of the store host -> node 1 exited in {:?}",
            t0.elapsed()
        );
        assert_no_leak(&pids, Duration::from_secs(10));
    });
}

#[test]
fn netns_c10d_cut_link_node_is_dropped_and_survivors_continue() {
    bounded(Duration::from_secs(240), || {
        let Some(net) = Netns::create(3) else { return };
        let dir = TempDir::new("mn_netns_cut");
        let endpoint = format!("{}:29400", net.addr(0));
        let mut running: Vec<_> = (0..3)
            .map(|i| {
                agent(
                    &dir,
                    &strings(&[
                        "--nnodes",
                        "2:3",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        &endpoint,
                        "--rdzv-id",
                        "cutjob",
                        "--rdzv-conf",
                        "last_call_timeout=20",
                    ]),
                )
                .netns(&net.name(i))
                .env("MN_HOLD_GWS", "3")
                .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(60));
        // A pulled cable: no FIN, no RST; node 2 just goes silent.
        net.cut(2);
        let cut = running.pop().expect("three agents");
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let recs = records(dir.path());
        check_round(&recs, 2, 0, Some(&[1, 1]));
        // The cut node cannot reach the store any more: it stops its worker and says so.
        let cut = cut.wait();
        cut.assert_code(1);
        assert!(cut.stderr.contains("rdrun: error:"), "{cut:?}");
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Issue 17.2: the c10d store's host is SIGKILLed, then the survivors' workers fail (as gloo's
/// do when a peer vanishes) while restarts are left: the restart path notices the lost store and
/// ends at once with the one-line error, instead of retrying until the join timeout.
#[test]
fn c10d_sigkilled_store_host_is_fatal_on_the_restart_path() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_c10d_host_kill");
        let port = free_port();
        let go = dir.join("go");
        let mut running: Vec<_> = (1..=3)
            .map(|h| {
                agent(
                    &dir,
                    &c10d_hosted_args(port, "2:3", h, &["--max-restarts", "3"]),
                )
                .env("MN_UNTIL", &go)
                .env("MN_UNTIL_CODE", "1")
                .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(60));
        let host = running.remove(0);
        host.signal(libc::SIGKILL);
        assert_eq!(host.wait().signal, Some(libc::SIGKILL));
        let t0 = Instant::now();
        std::fs::write(&go, b"").expect("write go");
        for out in running.into_iter().map(|r| r.wait()) {
            out.assert_code(1);
            let errors: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| l.starts_with("rdrun: error:"))
                .collect();
            assert_eq!(errors.len(), 1, "{out:?}");
            assert!(
                errors[0].starts_with("rdrun: error: lost the rendezvous store"),
                "{out:?}"
            );
        }
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(30),
            "survivors ended after {took:?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}
