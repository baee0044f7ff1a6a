//! Multi-node launches end to end: several real `rdrun` agents, one per simulated node, on
//! loopback (127.0.0.1, 127.0.0.2, … via `--local-addr`) and in network namespaces
//! (`scripts/netns.sh`, skipped with a message where not root or without `ip`).
//!
//! Workers are `workers/mn_worker`: each writes `w.<GROUP_WORLD_SIZE>.<restart>.<RANK>` (its
//! environment) into a shared directory, so a test sees every rank of every round. Every agent
//! runs under the runner's hard bound and is SIGKILLed by PID when a test ends early; namespace
//! harnesses remove everything they made when dropped.
//!
//! This file: the shared helpers (agents, their arguments, the worker records and the checks of
//! a round, also used by `cluster`, `slurm`, `mpi`, `schedenv` and `etcd`) and forming the job:
//! static and c10d jobs with heterogeneous `--nproc-per-node`, in namespaces and over IPv6, a
//! late joiner growing it, worker failures restarting every node with one count, an exhausted
//! budget and rendezvous timeouts ending every node with one line. The children:
//! - `node_loss`: a node lost while the job runs (SIGKILL, SIGTERM, a cut link, the store's
//!   host): detected, named, survivors regroup or end with one line.
//! - `job_end`: how the job ends across nodes: stragglers in the exit barrier, a failure on
//!   every node, an agent beyond `--nnodes`, the store host after its exit barrier timed out.
//! - `job_over`: how fast every node learns that an attempt is over (issue 38): a frozen node's
//!   survivors regroup together; a failure with no restart left ends every node at once.
//! - `conflicts`: nodes that contradict each other: a duplicate `--node-rank`, a different
//!   `--nnodes`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::netns::{bounded, Netns};
use crate::util::{assert_no_leak, free_port, parse_env0, worker, Output, Rdrun, Running, TempDir};

mod conflicts;
mod job_end;
pub(crate) mod job_over;
mod node_loss;

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
