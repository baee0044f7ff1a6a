//! Multi-node launches end to end: several real `rdrun` agents, one per simulated node, on
//! loopback (127.0.0.1, 127.0.0.2, … via `--local-addr`) and in network namespaces
//! (`scripts/netns.sh`, skipped with a message where not root or without `ip`).
//!
//! Workers are `workers/mn_worker`: each writes `w.<GROUP_WORLD_SIZE>.<restart>.<RANK>` (its
//! environment) into a shared directory, so a test sees every rank of every round. Every agent
//! runs under the runner's hard bound and is SIGKILLed by PID when a test ends early; namespace
//! harnesses remove everything they made when dropped.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::netns::{bounded, Netns};
use crate::util::{assert_no_leak, free_port, parse_env0, worker, Output, Rdrun, Running, TempDir};

/// Hard bound on one agent of these tests.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// One agent running `mn_worker dir` with `args` before the program.
fn agent(dir: &TempDir, args: &[String]) -> Rdrun {
    Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .args(args)
        .arg("--no-python")
        .arg(worker("mn_worker"))
        .arg(dir.path())
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Static agent `rank` of `nnodes` with `nproc` workers, store on 127.0.0.1:`port`.
fn static_args(port: u16, nnodes: usize, rank: usize, nproc: usize) -> Vec<String> {
    strings(&[
        "--nnodes",
        &nnodes.to_string(),
        "--node-rank",
        &rank.to_string(),
        "--nproc-per-node",
        &nproc.to_string(),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        &port.to_string(),
    ])
}

/// c10d agent with `nproc` workers advertising 127.0.0.`host`; 127.0.0.1 hosts the store.
/// The last call waits long enough that every agent of a test joins the first round even on a
/// loaded machine (the round completes at once when MAX agents are in).
fn c10d_args(port: u16, nnodes: &str, host: usize, nproc: usize) -> Vec<String> {
    strings(&[
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &format!("127.0.0.1:{port}"),
        "--rdzv-id",
        "mnjob",
        "--rdzv-conf",
        "last_call_timeout=20",
        "--local-addr",
        &format!("127.0.0.{host}"),
        "--nproc-per-node",
        &nproc.to_string(),
    ])
}

/// Every worker record in `dir`: `(group_world_size, restart, rank)` -> environment.
pub(crate) type Records = BTreeMap<(usize, u32, usize), BTreeMap<String, String>>;

pub(crate) fn records(dir: &Path) -> Records {
    let mut out = Records::new();
    for entry in std::fs::read_dir(dir).expect("read test dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let parts: Vec<&str> = name.split('.').collect();
        if let ["w", gws, restart, rank] = parts.as_slice() {
            let text = std::fs::read_to_string(entry.path()).expect("read record");
            out.insert(
                (
                    gws.parse().expect("gws"),
                    restart.parse().expect("restart"),
                    rank.parse().expect("rank"),
                ),
                parse_env0(&text),
            );
        }
    }
    out
}

/// Worker pids recorded in `dir` (`pid.*`).
pub(crate) fn recorded_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .expect("read test dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pid."))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| t.trim().parse().ok())
        .collect()
}

pub(crate) fn get<'a>(env: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    env.get(key)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("{key} missing from {env:?}"))
}

fn num(env: &BTreeMap<String, String>, key: &str) -> usize {
    get(env, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key}={:?} is not a number", get(env, key)))
}

/// Checks one round (`gws` nodes, restart `restart`): ranks 0..world all present, each node's
/// ranks contiguous from its base rank in group-rank order, sizes and master consistent.
/// `nprocs` are the expected per-node worker counts in group-rank order, if known.
#[track_caller]
pub(crate) fn check_round(
    recs: &Records,
    gws: usize,
    restart: u32,
    nprocs: Option<&[usize]>,
) -> (String, String) {
    let round: Vec<&BTreeMap<String, String>> = recs
        .iter()
        .filter(|((g, r, _), _)| *g == gws && *r == restart)
        .map(|(_, env)| env)
        .collect();
    assert!(
        !round.is_empty(),
        "no worker of round {gws}/{restart}: {recs:#?}"
    );
    let world = num(round[0], "WORLD_SIZE");
    let ranks: Vec<usize> = recs
        .keys()
        .filter(|(g, r, _)| *g == gws && *r == restart)
        .map(|k| k.2)
        .collect();
    assert_eq!(ranks, (0..world).collect::<Vec<_>>(), "ranks of the round");
    // Per group rank: the local world size and the ranks of that node.
    let mut nodes: BTreeMap<usize, Vec<(usize, usize, usize)>> = BTreeMap::new();
    let master = (
        get(round[0], "MASTER_ADDR").to_string(),
        get(round[0], "MASTER_PORT").to_string(),
    );
    for env in &round {
        assert_eq!(num(env, "WORLD_SIZE"), world);
        assert_eq!(num(env, "GROUP_WORLD_SIZE"), gws);
        assert_eq!(num(env, "TORCHELASTIC_RESTART_COUNT") as u32, restart);
        assert_eq!(get(env, "ROLE_RANK"), get(env, "RANK"));
        assert_eq!(num(env, "ROLE_WORLD_SIZE"), world);
        assert_eq!(get(env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
        assert_eq!(
            (get(env, "MASTER_ADDR"), get(env, "MASTER_PORT")),
            (master.0.as_str(), master.1.as_str()),
            "every worker of a round gets the same master"
        );
        nodes.entry(num(env, "GROUP_RANK")).or_default().push((
            num(env, "RANK"),
            num(env, "LOCAL_RANK"),
            num(env, "LOCAL_WORLD_SIZE"),
        ));
    }
    assert_eq!(
        nodes.keys().copied().collect::<Vec<_>>(),
        (0..gws).collect::<Vec<_>>()
    );
    let mut base = 0;
    let mut sizes = Vec::new();
    for workers in nodes.values_mut() {
        workers.sort();
        let lws = workers[0].2;
        let want: Vec<(usize, usize, usize)> = (0..lws).map(|lr| (base + lr, lr, lws)).collect();
        assert_eq!(*workers, want, "a node's ranks are base_rank + local_rank");
        base += lws;
        sizes.push(lws);
    }
    if let Some(n) = nprocs {
        assert_eq!(sizes, n, "local world sizes in group-rank order");
    }
    master
}

#[track_caller]
pub(crate) fn assert_ok(outs: &[Output]) {
    for o in outs {
        o.assert_code(0);
    }
}

/// Waits until `n` records of round `(gws, restart)` exist.
#[track_caller]
pub(crate) fn wait_records(dir: &Path, gws: usize, restart: u32, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let have = records(dir)
            .keys()
            .filter(|(g, r, _)| *g == gws && *r == restart)
            .count();
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {have} of {n} workers of round {gws}/{restart} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn static_two_nodes_heterogeneous_nproc() {
    let dir = TempDir::new("mn_static2");
    let port = free_port();
    let a = agent(&dir, &static_args(port, 2, 0, 2)).spawn();
    let b = agent(
        &dir,
        &[
            static_args(port, 2, 1, 3),
            strings(&["--local-addr", "127.0.0.2"]),
        ]
        .concat(),
    )
    .spawn();
    let outs = [a.wait(), b.wait()];
    assert_ok(&outs);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 5, "{recs:#?}");
    let master = check_round(&recs, 2, 0, Some(&[2, 3]));
    // Static: workers use the rendezvous store itself, on node 0.
    assert_eq!(master, ("127.0.0.1".to_string(), port.to_string()));
    let ids: Vec<&str> = recs
        .values()
        .map(|e| get(e, "TORCHELASTIC_RUN_ID"))
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "one run id: {ids:?}");
}

#[test]
fn c10d_three_nodes_heterogeneous_nproc() {
    let dir = TempDir::new("mn_c10d3");
    let port = free_port();
    let runs: Vec<_> = (1..=3)
        .map(|h| agent(&dir, &c10d_args(port, "2:3", h, h)).spawn())
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 6, "one round of 1+2+3 workers: {recs:#?}");
    let (addr, mport) = check_round(&recs, 3, 0, None);
    // The master is group rank 0's advertised address and its worker store, not the endpoint.
    let rank0 = &recs[&(3, 0, 0)];
    let node0 = num(rank0, "LOCAL_WORLD_SIZE");
    assert_eq!(
        addr,
        format!("127.0.0.{node0}"),
        "MASTER_ADDR = group rank 0's --local-addr"
    );
    assert_ne!(
        mport,
        port.to_string(),
        "MASTER_PORT is the worker store, not the rendezvous"
    );
}

#[test]
fn static_worker_failure_restarts_every_node_with_one_count() {
    let dir = TempDir::new("mn_static_restart");
    let port = free_port();
    let run = |rank| {
        agent(
            &dir,
            &[
                static_args(port, 2, rank, 2),
                strings(&["--max-restarts", "2"]),
            ]
            .concat(),
        )
        .env("MN_FAIL_RANK", "3")
        .spawn()
    };
    let (a, b) = (run(0), run(1));
    let outs = [a.wait(), b.wait()];
    assert_ok(&outs);
    let recs = records(dir.path());
    check_round(&recs, 2, 0, Some(&[2, 2]));
    check_round(&recs, 2, 1, Some(&[2, 2]));
    assert_eq!(
        recs.len(),
        8,
        "two attempts of 4 workers, no third: {recs:#?}"
    );
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

#[test]
fn c10d_worker_failure_restarts_every_node_with_one_count() {
    let dir = TempDir::new("mn_c10d_restart");
    let port = free_port();
    let runs: Vec<_> = (1..=2)
        .map(|h| {
            agent(
                &dir,
                &[
                    c10d_args(port, "2", h, 2),
                    strings(&["--max-restarts", "1"]),
                ]
                .concat(),
            )
            .env("MN_FAIL_RANK", "1")
            .spawn()
        })
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    check_round(&recs, 2, 0, Some(&[2, 2]));
    check_round(&recs, 2, 1, Some(&[2, 2]));
    assert_eq!(recs.len(), 8, "{recs:#?}");
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

#[test]
fn exhausted_restart_budget_ends_every_node() {
    let dir = TempDir::new("mn_budget");
    let port = free_port();
    let run = |rank| {
        agent(&dir, &static_args(port, 2, rank, 1))
            .env("MN_FAIL_RANK", "1")
            .spawn()
    };
    let (a, b) = (run(0), run(1));
    let (a, b) = (a.wait(), b.wait());
    // Node 1's worker failed: the usual report, its exit code.
    b.assert_code(1);
    assert!(b.stderr.contains("Root Cause"), "{b:?}");
    // Node 0 learns that the job is over (and where it failed) instead of waiting for its
    // worker forever.
    a.assert_code(1);
    assert!(
        a.stderr.contains("rdrun: error: the job failed on node 1"),
        "{a:?}"
    );
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

#[test]
fn rendezvous_timeouts_are_one_line_errors() {
    let dir = TempDir::new("mn_timeout");
    let port = free_port();
    let mut outs = Vec::new();
    // c10d: a second node never comes.
    let out = agent(
        &dir,
        &[
            c10d_args(port, "2", 1, 1),
            strings(&["--rdzv-conf", "join_timeout=2"]),
        ]
        .concat(),
    )
    .run();
    out.assert_code(1);
    // "after 2s" on an idle machine; the rounding may say 3s on a loaded one.
    assert!(
        out.stderr
            .contains("rdrun: error: rendezvous timed out after ")
            && out
                .stderr
                .contains("s: 1 node(s) joined, at least 2 needed"),
        "{out:?}"
    );
    outs.push(out);
    // Static node 1: nobody serves the store at the master address.
    let out = agent(
        &dir,
        &[
            static_args(port, 2, 1, 1),
            strings(&["--rdzv-conf", "timeout=2"]),
        ]
        .concat(),
    )
    .run();
    out.assert_code(1);
    let want = format!("rdrun: error: rendezvous store 127.0.0.1:{port} unreachable after");
    assert!(out.stderr.contains(&want), "{out:?}");
    outs.push(out);
    // Static node 0: hosts the store, node 1 never arrives.
    let out = agent(
        &dir,
        &[
            static_args(port, 2, 0, 1),
            strings(&["--rdzv-conf", "timeout=2"]),
        ]
        .concat(),
    )
    .run();
    out.assert_code(1);
    assert!(
        out.stderr.contains("rdrun: error: rendezvous timed out"),
        "{out:?}"
    );
    outs.push(out);
    assert!(records(dir.path()).is_empty(), "no worker may start");
    for o in &outs {
        assert_eq!(
            o.stderr
                .lines()
                .filter(|l| l.starts_with("rdrun: error:"))
                .count(),
            1,
            "{o:?}"
        );
    }
}

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
fn netns_static_three_hosts() {
    bounded(Duration::from_secs(240), || {
        let Some(net) = Netns::create(3) else { return };
        let dir = TempDir::new("mn_netns_static");
        let master = net.addr(0);
        let runs: Vec<_> = (0..3)
            .map(|i| {
                agent(
                    &dir,
                    &strings(&[
                        "--nnodes",
                        "3",
                        "--node-rank",
                        &i.to_string(),
                        "--nproc-per-node",
                        "2",
                        "--master-addr",
                        &master,
                        "--master-port",
                        "29500",
                    ]),
                )
                .netns(&net.name(i))
                .spawn()
            })
            .collect();
        let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let recs = records(dir.path());
        assert_eq!(recs.len(), 6, "{recs:#?}");
        let m = check_round(&recs, 3, 0, Some(&[2, 2, 2]));
        assert_eq!(m, (master, "29500".to_string()));
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
fn c10d_late_joiner_grows_the_job_without_a_restart() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_grow");
        let port = free_port();
        let args = |h| {
            [
                c10d_args(port, "2:3", h, 1),
                strings(&["--rdzv-conf", "last_call_timeout=1"]),
            ]
            .concat()
        };
        let first: Vec<_> = (1..=2)
            .map(|h| agent(&dir, &args(h)).env("MN_HOLD_GWS", "2").spawn())
            .collect();
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
        let late = agent(&dir, &args(3)).env("MN_HOLD_GWS", "2").spawn();
        let mut outs: Vec<Output> = first.into_iter().map(|r| r.wait()).collect();
        outs.push(late.wait());
        assert_ok(&outs);
        let recs = records(dir.path());
        check_round(&recs, 2, 0, Some(&[1, 1]));
        check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        assert!(
            !recs.keys().any(|k| k.1 > 0),
            "growing is not a restart: {recs:#?}"
        );
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Two static agents (`nproc` workers each) whose workers hold until stopped, once every worker
/// runs: (node 0's agent, node 1's agent).
fn held_static_pair(dir: &TempDir, nproc: usize) -> (Running, Running) {
    let port = free_port();
    let mut runs = (0..2).map(|rank| {
        agent(dir, &static_args(port, 2, rank, nproc))
            .env("MN_HOLD_GWS", "2")
            .spawn()
    });
    let pair = (runs.next().expect("agent 0"), runs.next().expect("agent 1"));
    wait_records(dir.path(), 2, 0, 2 * nproc, Duration::from_secs(60));
    pair
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

#[test]
fn c10d_ipv6_loopback_endpoint() {
    let dir = TempDir::new("mn_v6");
    let port = match std::net::TcpListener::bind("[::1]:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => {
            eprintln!("SKIP: no IPv6 loopback here: {e}");
            return;
        }
    };
    let args = strings(&[
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &format!("[::1]:{port}"),
        "--rdzv-id",
        "v6",
    ]);
    let runs: Vec<_> = (0..2).map(|_| agent(&dir, &args).spawn()).collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    let (addr, _) = check_round(&recs, 2, 0, Some(&[1, 1]));
    assert_eq!(
        addr, "::1",
        "MASTER_ADDR is the IPv6 address, without brackets"
    );
}

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

/// c10d agent `h` of `nnodes` where agent 1 (127.0.0.1) hosts the store (`is_host`), with
/// test-sized timeouts so that a defect shows as a slow or wrong end, not a hang.
fn c10d_hosted_args(port: u16, nnodes: &str, h: usize, extra: &[&str]) -> Vec<String> {
    let mut args = c10d_args(port, nnodes, h, 1);
    let conf = args
        .iter()
        .position(|a| a == "last_call_timeout=20")
        .expect("conf");
    args[conf] = format!("last_call_timeout=20,join_timeout=60,is_host={}", h == 1);
    [args, strings(extra)].concat()
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

/// Issue 11.3: a worker fails on every node (no restarts): the other agent no longer retries
/// closing the rendezvous on the vanished store for ~32 s (it did in about 1 of 3 runs; 3
/// tries). Then the failure is on the host only: the other node names it.
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
                "rdrun: error: the job failed on node 0 (127.0.0.1); its agent closed the rendezvous"
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

/// Issue 17.6: a second agent claiming a static node rank that a live agent holds gets a one-line
/// error naming the rank and the other agent's host, within the heartbeat budget.
#[test]
fn static_duplicate_node_rank_is_refused_naming_the_other_agent() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_dup_rank");
        let (a, b) = held_static_pair(&dir, 1);
        let port = get(&records(dir.path())[&(2, 0, 0)], "MASTER_PORT").to_string();
        let t0 = Instant::now();
        let dup = agent(
            &dir,
            &[
                static_args(port.parse().expect("port"), 2, 1, 1),
                strings(&["--local-addr", "127.0.0.3"]),
            ]
            .concat(),
        )
        .env("MN_HOLD_GWS", "2")
        .run();
        dup.assert_code(1);
        let errors: Vec<&str> = dup
            .stderr
            .lines()
            .filter(|l| l.starts_with("rdrun: error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{dup:?}");
        assert!(
            errors[0].starts_with("rdrun: error: node rank 1 is already taken by the agent on ")
                && errors[0].contains(&format!("(pid {}", b.pid)),
            "{dup:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert_eq!(records(dir.path()).len(), 2, "no third worker");
        let pids = recorded_pids(dir.path());
        a.signal(libc::SIGTERM);
        b.signal(libc::SIGTERM);
        let _ = (a.wait(), b.wait());
        assert_no_leak(&pids, Duration::from_secs(10));
    });
}

/// Issue 25.2: a duplicate whose job ends while it checks the rank's owner is told at once,
/// naming that agent, not after the static timeout as "store unreachable". The owner's
/// heartbeat is made slow (every 30 s, the job's agents declare a peer dead only after 150 s)
/// and the duplicate's budget long (200 s), so the job ends inside the duplicate's check
/// whatever the machine's load; if the owner's heartbeat comes first, the duplicate is told
/// that a live agent holds the rank. Either answer names the owner and comes within the bound
/// (before the fix it came after the duplicate's whole budget, then the static timeout).
#[test]
fn static_duplicate_whose_job_ends_meanwhile_is_told_at_once() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_dup_rank_end");
        let port = free_port();
        let release = dir.join("release");
        let slow = strings(&["--rdzv-conf", "keep_alive_interval=30"]);
        let run = |rank: usize, extra: &[String]| {
            agent(
                &dir,
                &[static_args(port, 2, rank, 1), slow.clone(), extra.to_vec()].concat(),
            )
            .env("MN_UNTIL", &release)
            .spawn()
        };
        let a = run(0, &[]);
        let b = run(1, &strings(&["--local-addr", "127.0.0.2"]));
        let owner = b.pid;
        wait_records(dir.path(), 2, 0, 2, Duration::from_secs(60));
        let dup = agent(
            &dir,
            &[
                static_args(port, 2, 1, 1),
                strings(&[
                    "--local-addr",
                    "127.0.0.3",
                    "--rdzv-conf",
                    "keep_alive_interval=1,keep_alive_max_attempt=200,timeout=600",
                ]),
            ]
            .concat(),
        )
        .timeout(Duration::from_secs(100))
        .spawn();
        // A generous time for the duplicate to connect and start its check, then the job ends.
        std::thread::sleep(Duration::from_secs(8));
        std::fs::write(&release, b"").expect("release the workers");
        let (a, b) = (a.wait(), b.wait());
        a.assert_code(0);
        b.assert_code(0);
        let dup = dup.wait();
        dup.assert_code(1);
        let errors: Vec<&str> = dup
            .stderr
            .lines()
            .filter(|l| l.starts_with("rdrun: error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{dup:?}");
        assert!(
            errors[0].starts_with(
                "rdrun: error: node rank 1 is already taken by the agent on 127.0.0.2 "
            ) && errors[0].contains(&format!("(pid {owner}"))
                && errors[0].ends_with("give every node its own --node-rank"),
            "{dup:?}"
        );
        assert!(!dup.stderr.contains("unreachable"), "{dup:?}");
        assert_eq!(records(dir.path()).len(), 2, "no third worker");
    });
}

/// Issue 17.8: `--nnodes 2` on one static node and `3` on the other: both say that the nodes
/// disagree and what each said, at once, instead of a confusing rendezvous timeout.
#[test]
fn static_nodes_that_disagree_on_nnodes_say_so() {
    bounded(Duration::from_secs(240), || {
        let dir = TempDir::new("mn_nnodes");
        let port = free_port();
        let a = agent(&dir, &static_args(port, 2, 0, 1)).spawn();
        let b = agent(
            &dir,
            &[
                static_args(port, 3, 1, 1),
                strings(&["--local-addr", "127.0.0.2"]),
            ]
            .concat(),
        )
        .spawn();
        let t0 = Instant::now();
        let (a, b) = (a.wait(), b.wait());
        for (o, want) in [
            (&a, "this node says 2, node rank 1 on 127.0.0.2 says 3"),
            (&b, "this node says 3, node rank 0 on "),
        ] {
            o.assert_code(1);
            assert!(
                o.stderr.contains(&format!(
                    "rdrun: error: the nodes disagree on --nnodes: {want}"
                )),
                "{o:?}"
            );
        }
        // Told at the agreement check, not after the rendezvous timeout (900 s): a generous bound,
        // since a loaded machine can stretch the two agents' start by many seconds (30 s was
        // seen to be too tight while other builds ran).
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "{:?}",
            t0.elapsed()
        );
        assert!(records(dir.path()).is_empty(), "no worker may start");
    });
}
