//! The etcd v3 rendezvous (`--rdzv-backend etcd-v3`, feature `etcd`) against a real etcd.
//!
//! A [`Testbed`] is the test's own network: one network namespace per node and one per etcd
//! member, all on one bridge (`scripts/netns.sh`; node i is 10.231.0.(i+1), member k follows the
//! nodes), so an agent reaches etcd and its peers over a real link and advertises its address
//! on the route to etcd. Where namespaces cannot be made (not root, no `ip`) the same tests run
//! on loopback instead (nodes 127.0.0.(i+1) via `--local-addr`, members on free ports), so they
//! still cover the protocol (`RDRUN_ETCD_LOOPBACK=1` chooses loopback anyway). Real `rdrun` agents run workers `workers/mn_worker` (see
//! `multinode`). Each test has its own cluster (several kill members) and run id. Members are
//! SIGKILLed by PID and the namespaces removed (with anything left inside them) on drop; every
//! agent runs under a hard bound. Skipped with a message when `etcd` is not installed.
//!
//! Bad endpoints, credentials and TLS (feature `etcd-tls`): `etcd/config.rs`; a frozen node and
//! a failure with no restart left (issue 38): `etcd/job_over.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::multinode::{
    assert_ok, check_round, get, recorded_pids, records, wait_records, Records,
};
use crate::netns::{bounded, Netns};
use crate::util::{assert_no_leak, free_port, worker, Output, Rdrun, TempDir};

/// Hard bound on one agent of these tests.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Hard bound on one test body.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);

/// One etcd member to start: its address, client and peer ports, and namespace (if any).
struct MemberSpec {
    addr: String,
    client: u16,
    peer: u16,
    netns: Option<String>,
}

/// A real etcd cluster; members are SIGKILLed by PID and reaped on drop.
pub(crate) struct Cluster {
    members: Vec<Option<Child>>,
    netns: Vec<Option<String>>,
    endpoints: Vec<String>,
    /// `http` or `https` (etcdctl is given full URLs).
    scheme: String,
    _dir: TempDir,
}

fn etcd_bin() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join("etcd"))
        .find(|p| p.is_file())
}

/// `cmd` inside namespace `ns` (`ip netns exec` execs it: the child's PID is `cmd`'s).
fn in_netns(ns: Option<&str>, cmd: &str) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, cmd]);
            c
        }
        None => Command::new(cmd),
    }
}

impl Cluster {
    /// Starts members as `specs` say, with `scheme` (`http`/`https`) and `extra` flags (TLS);
    /// see [`Cluster::wait_healthy`].
    fn start_with(etcd: &Path, specs: &[MemberSpec], scheme: &str, extra: &[String]) -> Cluster {
        let dir = TempDir::new("etcd");
        let cluster: Vec<String> = specs
            .iter()
            .enumerate()
            .map(|(i, m)| format!("m{i}=http://{}:{}", m.addr, m.peer))
            .collect();
        let mut members = Vec::new();
        for (i, m) in specs.iter().enumerate() {
            let client_url = format!("{scheme}://{}:{}", m.addr, m.client);
            let peer_url = format!("http://{}:{}", m.addr, m.peer);
            let child = in_netns(m.netns.as_deref(), &etcd.to_string_lossy())
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("m{i}")))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &cluster.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--log-level", "error"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn etcd");
            members.push(Some(child));
        }
        Cluster {
            members,
            netns: specs.iter().map(|m| m.netns.clone()).collect(),
            endpoints: specs
                .iter()
                .map(|m| format!("{}:{}", m.addr, m.client))
                .collect(),
            scheme: scheme.to_string(),
            _dir: dir,
        }
    }

    /// Waits (bounded) until `healthy` says the cluster answers.
    fn wait_healthy(&self, healthy: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !healthy(self) {
            assert!(
                Instant::now() < deadline,
                "etcd cluster not healthy after 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// etcdctl run next to a live member (in its namespace), over every endpoint.
    fn ctl(&self, args: &[&str]) -> std::process::Output {
        let live = (0..self.members.len())
            .find(|i| self.members[*i].is_some())
            .expect("a live member");
        in_netns(self.netns[live].as_deref(), "etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!(
                "--endpoints={}",
                self.endpoints
                    .iter()
                    .map(|e| format!("{}://{e}", self.scheme))
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .arg("--command-timeout=3s")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl")
    }

    fn healthy(&self) -> bool {
        self.ctl(&["put", "/health", "1"]).status.success()
    }

    pub(crate) fn list(&self) -> String {
        self.endpoints.join(",")
    }

    /// The index of the member that leads the cluster now (`etcdctl endpoint status`).
    fn leader(&self) -> usize {
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        assert!(out.status.success(), "endpoint status: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
        let rows = v.as_array().expect("status rows");
        let leader = rows[0]["Status"]["leader"].as_u64().expect("leader id");
        let i = rows
            .iter()
            .find(|r| r["Status"]["header"]["member_id"].as_u64() == Some(leader))
            .and_then(|r| r["Endpoint"].as_str())
            .and_then(|e| self.endpoints.iter().position(|m| e.ends_with(m.as_str())))
            .expect("the leader is one of the members");
        i
    }

    /// SIGKILL member `i` by PID.
    fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// The test's network (see the module docs): `nodes` agents' hosts and an etcd cluster (also
/// used by `netcheck_etcd`).
pub(crate) struct Testbed {
    // Dropped first: the members, then the namespaces they ran in.
    etcd: Cluster,
    pub(crate) net: Option<Netns>,
}

impl Testbed {
    /// `nodes` hosts and `members` etcd members (healthy); `None` with a message when etcd is
    /// not installed.
    pub(crate) fn new(nodes: usize, members: usize) -> Option<Testbed> {
        let Some(etcd) = etcd_bin() else {
            eprintln!("SKIPPED: etcd not installed (Debian: etcd-server etcd-client)");
            return None;
        };
        // RDRUN_ETCD_LOOPBACK=1 runs the loopback variant even where namespaces work.
        let net = if std::env::var_os("RDRUN_ETCD_LOOPBACK").is_some() {
            None
        } else {
            Netns::create(nodes + members)
        };
        let specs: Vec<MemberSpec> = (0..members)
            .map(|k| match &net {
                Some(net) => MemberSpec {
                    addr: net.addr(nodes + k),
                    client: 2379,
                    peer: 2380,
                    netns: Some(net.name(nodes + k)),
                },
                None => MemberSpec {
                    addr: "127.0.0.1".into(),
                    client: free_port(),
                    peer: free_port(),
                    netns: None,
                },
            })
            .collect();
        if net.is_none() {
            eprintln!("(no network namespaces here: this etcd test runs on loopback)");
        }
        let cluster = Cluster::start_with(&etcd, &specs, "http", &[]);
        cluster.wait_healthy(Cluster::healthy);
        Some(Testbed { etcd: cluster, net })
    }

    /// The etcd endpoints, `h:p,h:p`.
    pub(crate) fn endpoints(&self) -> String {
        self.etcd.list()
    }

    /// Node `i`'s address (what it advertises).
    pub(crate) fn addr(&self, i: usize) -> String {
        match &self.net {
            Some(net) => net.addr(i),
            None => format!("127.0.0.{}", i + 1),
        }
    }

    /// `rdrun` on node `i` (before any other argument): inside its namespace (its address is
    /// the one on the route to etcd), or on loopback with `--local-addr`.
    fn on_node(&self, i: usize, r: Rdrun) -> Rdrun {
        match &self.net {
            Some(net) => r.netns(&net.name(i)),
            None => r.args(["--local-addr".to_string(), self.addr(i)]),
        }
    }

    /// An etcd agent on node `i` with one worker `mn_worker dir`.
    fn agent(&self, dir: &TempDir, run: &str, nnodes: &str, i: usize, conf: &str) -> Rdrun {
        // Options go before the program: on loopback `agent` itself adds `--local-addr`.
        let host = self.net.is_none().then_some(i + 1);
        let r = agent(dir, &self.etcd.list(), run, nnodes, host, conf);
        match &self.net {
            Some(net) => r.netns(&net.name(i)),
            None => r,
        }
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// An etcd agent (on loopback 127.0.0.`host` when given) with one worker `mn_worker dir`.
fn agent(
    dir: &TempDir,
    eps: &str,
    run: &str,
    nnodes: &str,
    host: Option<usize>,
    conf: &str,
) -> Rdrun {
    let conf = if conf.is_empty() {
        "last_call_timeout=20".to_string()
    } else {
        format!("last_call_timeout=20,{conf}")
    };
    let r = Rdrun::new().timeout(AGENT_TIMEOUT).args(strings(&[
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "etcd-v3",
        "--rdzv-endpoint",
        eps,
        "--rdzv-id",
        run,
        "--rdzv-conf",
        &conf,
        "--nproc-per-node",
        "1",
    ]));
    let r = match host {
        Some(h) => r.args(["--local-addr".to_string(), format!("127.0.0.{h}")]),
        None => r,
    };
    r.arg("--no-python")
        .arg(worker("mn_worker"))
        .arg(dir.path())
}

/// Node index of a MASTER_ADDR (10.231.0.N or 127.0.0.N: node N-1).
fn node_of(addr: &str) -> usize {
    let last: usize = addr.rsplit('.').next().unwrap().parse().unwrap();
    last - 1
}

/// The MASTER_ADDR of round (gws, restart 0), from its records.
fn master_of(recs: &Records, gws: usize) -> String {
    let (_, env) = recs
        .iter()
        .find(|((g, r, _), _)| *g == gws && *r == 0)
        .expect("a record of the round");
    get(env, "MASTER_ADDR").to_string()
}

/// Every agent's MASTER_ADDR is a node address of the testbed (in namespaces: the address on
/// the route to etcd, found without `--local-addr`).
fn check_addrs(tb: &Testbed, recs: &Records, nodes: usize) {
    let addrs: Vec<String> = (0..nodes).map(|i| tb.addr(i)).collect();
    for env in recs.values() {
        let a = get(env, "MASTER_ADDR");
        assert!(
            addrs.iter().any(|x| x == a),
            "MASTER_ADDR {a} not one of {addrs:?}"
        );
    }
}

/// (a) The agent hosting the workers' store (group rank 0) is SIGKILLed: the other two regroup
/// in a new round with a new store host and finish; not charged as a restart.
#[test]
fn store_host_killed_survivors_regroup_with_a_new_store_host() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-kill-host");
        let mut running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "killhost", "2:4", i, "")
                    .env("MN_HOLD_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        let recs = records(dir.path());
        let (old_master, _) = check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        let pids = recorded_pids(dir.path());
        let victim = running.remove(node_of(&old_master));
        let t0 = Instant::now();
        victim.signal(libc::SIGKILL);
        assert_eq!(victim.wait().signal, Some(libc::SIGKILL));
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        eprintln!(
            "SIGKILL of the store host {old_master} -> survivors done in {:?}",
            t0.elapsed()
        );
        let recs = records(dir.path());
        let (new_master, _) = check_round(&recs, 2, 0, Some(&[1, 1]));
        assert_ne!(
            new_master, old_master,
            "a new agent hosts the workers' store"
        );
        assert_eq!(master_of(&recs, 2), new_master);
        assert!(
            !recs.keys().any(|k| k.1 > 0),
            "a lost peer is not a restart: {recs:#?}"
        );
        check_addrs(&tb, &recs, 3);
        assert_no_leak(&pids, Duration::from_secs(10));
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Issue 17.7 on etcd: a SIGKILLed node makes its peers' workers fail (as gloo's do) seconds
/// before its lease expires; with `--max-restarts 0` the survivors must still regroup and
/// finish, the failure counted as the membership change (before the etcd backend waited for
/// its peers' leases, the job ended with exit 1: the failure was charged).
#[test]
fn sigkilled_node_whose_peers_fail_is_not_charged() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-kill-fail");
        let mut running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "killfail", "2:3", i, "")
                    .args(["--max-restarts", "0"])
                    .env("MN_FAIL_ON_LOSS_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        // Not the store host: its peers' workers then fail only through the worker check.
        let recs = records(dir.path());
        let (master, _) = check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        let victim = (0..3).find(|i| *i != node_of(&master)).unwrap();
        let killed = running.remove(victim);
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

/// Issue 24.2: the same loss with the etcd leader SIGKILLed first (a minority of members
/// down, which nothing notices), then the agent that hosts the workers' store: still not
/// charged (before, the first read that reached the dead member ended the 17.7 wait at once, so
/// with `--max-restarts 0` both survivors exited 1 within 2.6 s).
#[test]
fn etcd_leader_down_then_store_host_sigkilled_is_not_charged() {
    bounded(TEST_TIMEOUT, || {
        let Some(mut tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-leader-host");
        let mut running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "leaderhost", "2:3", i, "")
                    .args(["--max-restarts", "0"])
                    .env("MN_FAIL_ON_LOSS_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        let leader = tb.etcd.leader();
        tb.etcd.kill(leader);
        // A new leader among the two others (the agents notice nothing).
        tb.etcd.wait_healthy(Cluster::healthy);
        let recs = records(dir.path());
        let (master, _) = check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        let killed = running.remove(node_of(&master));
        killed.signal(libc::SIGKILL);
        assert_eq!(killed.wait().signal, Some(libc::SIGKILL));
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        for o in &outs {
            assert!(!o.stderr.contains("restarting (attempt"), "{o:?}");
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

/// The other side of issue 17.7: a worker failure while every peer is alive (their leases are
/// seen renewed) is charged; with `--max-restarts 0` the job ends on every node, and no node
/// calls it a membership change.
#[test]
fn worker_failure_with_every_peer_alive_is_charged() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-fail-alive");
        let running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "failalive", "3", i, "")
                    .args(["--max-restarts", "0"])
                    .env("MN_FAIL_RANK", "1")
                    .spawn()
            })
            .collect();
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        for o in &outs {
            assert_eq!(o.code, Some(1), "{o:?}");
            assert!(!o.stderr.contains("membership change's"), "{o:?}");
        }
        assert!(
            outs.iter().any(|o| o.stderr.contains("Root Cause")),
            "the failing node reports its worker: {outs:?}"
        );
        let recs = records(dir.path());
        check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        assert!(!recs.keys().any(|k| k.1 > 0), "no restart: {recs:#?}");
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// (b) One of three etcd members is SIGKILLed mid-run: nothing notices (no new round).
#[test]
fn one_etcd_member_killed_nothing_notices() {
    bounded(TEST_TIMEOUT, || {
        let Some(mut tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-kill-member");
        let until = dir.join("go");
        let running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "killone", "2:4", i, "ttl=3")
                    .env("MN_UNTIL", &until)
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        tb.etcd.kill(0);
        // Several lease periods pass with the member gone.
        std::thread::sleep(Duration::from_secs(10));
        std::fs::write(&until, b"").unwrap();
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let recs = records(dir.path());
        check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        assert_eq!(recs.len(), 3, "one round only: {recs:#?}");
        for o in &outs {
            assert!(!o.stderr.contains("membership changed"), "{o:?}");
        }
    });
}

/// (c) Two of three members are SIGKILLed: quorum is gone; every agent fails with an error
/// naming the endpoints within a bound, its workers stopped.
#[test]
fn etcd_quorum_lost_is_a_bounded_error_naming_the_endpoints() {
    bounded(TEST_TIMEOUT, || {
        let Some(mut tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-kill-two");
        let running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "killtwo", "2:4", i, "ttl=3")
                    .env("MN_HOLD_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        let pids = recorded_pids(dir.path());
        let t0 = Instant::now();
        tb.etcd.kill(0);
        tb.etcd.kill(1);
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        let took = t0.elapsed();
        eprintln!("quorum lost -> agents exited in {took:?}");
        assert!(took < Duration::from_secs(60), "{took:?}");
        for o in &outs {
            assert_eq!(o.code, Some(1), "{o:?}");
            assert!(
                o.stderr.contains(&tb.etcd.endpoints[2]),
                "names the endpoints: {o:?}"
            );
            assert!(o.stderr.contains("etcd"), "{o:?}");
        }
        assert_no_leak(&pids, Duration::from_secs(10));
    });
}

/// (d) Scale up: a fourth node joins a running 3-node job (2:4); the job grows to 4 nodes
/// without a restart being charged, and finishes.
#[test]
fn a_node_added_mid_run_grows_the_world() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(4, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-scale-up");
        let conf = "last_call_timeout=2";
        let mut running: Vec<_> = (0..3)
            .map(|i| {
                tb.agent(&dir, "grow", "2:4", i, conf)
                    .env("MN_HOLD_GWS", "3")
                    .spawn()
            })
            .collect();
        wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
        running.push(
            tb.agent(&dir, "grow", "2:4", 3, conf)
                .env("MN_HOLD_GWS", "3")
                .spawn(),
        );
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let recs = records(dir.path());
        check_round(&recs, 3, 0, Some(&[1, 1, 1]));
        check_round(&recs, 4, 0, Some(&[1, 1, 1, 1]));
        check_addrs(&tb, &recs, 4);
        assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Issue 25: a successful etcd run logged `ERROR exit barrier: exit barrier ended early` — the
/// last agent to arrive saw the barrier complete, closed and revoked its lease (its barrier key
/// with it) before an earlier agent re-read the count. Agents finish one after another (the
/// stragglers arrive last), several runs; every agent exits 0 and no stderr line is an ERROR.
#[test]
fn a_successful_run_logs_no_error() {
    bounded(TEST_TIMEOUT, || {
        let Some(tb) = Testbed::new(3, 1) else {
            return;
        };
        for run in 0..3 {
            let dir = TempDir::new("etcd-clean-success");
            let running: Vec<_> = (0..3)
                .map(|i| {
                    tb.agent(&dir, &format!("clean{run}"), "3", i, "")
                        .env("MN_STRAGGLE", format!("{}:1", (run + 1) % 3))
                        .spawn()
                })
                .collect();
            let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
            assert_ok(&outs);
            for o in &outs {
                let errors: Vec<&str> =
                    o.stderr.lines().filter(|l| l.contains(" ERROR ")).collect();
                assert!(errors.is_empty(), "{errors:#?}\n{o:?}");
            }
        }
    });
}

/// (e) PyTorch gloo DDP across three nodes under the etcd backend: every rank trains, the
/// parameters agree after training, and the ranks are 0..3.
#[test]
fn pytorch_gloo_ddp_across_nodes() {
    bounded(TEST_TIMEOUT, || {
        let Some(python) = crate::util::torch_python() else {
            return;
        };
        let Some(tb) = Testbed::new(3, 3) else {
            return;
        };
        let dir = TempDir::new("etcd-ddp");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("launcher-tests/torch/scripts/ddp_train.py");
        let running: Vec<_> = (0..3)
            .map(|i| {
                let r = Rdrun::new()
                    .timeout(Duration::from_secs(240))
                    .env("PYTHON_EXEC", &python);
                // gloo binds the address its hostname resolves to unless told the interface;
                // the namespaces share the host's name, so say it (as on a multi-NIC host).
                let r = if tb.net.is_some() {
                    r.env("GLOO_SOCKET_IFNAME", "eth0")
                } else {
                    r
                };
                tb.on_node(i, r)
                    .args(strings(&[
                        "--nnodes",
                        "3",
                        "--rdzv-backend",
                        "etcd",
                        "--rdzv-endpoint",
                        &tb.etcd.list(),
                        "--rdzv-id",
                        "ddp",
                        "--nproc-per-node",
                        "1",
                    ]))
                    .arg(&script)
                    .arg("--out")
                    .arg(dir.path())
                    .spawn()
            })
            .collect();
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        let results: Vec<serde_json::Value> = (0..3)
            .map(|r| {
                let text = std::fs::read_to_string(dir.join(format!("rank{r}.json"))).unwrap();
                serde_json::from_str(&text).unwrap()
            })
            .collect();
        for (r, res) in results.iter().enumerate() {
            assert_eq!(res["rank"], r as u64);
            assert_eq!(res["world"], 3);
            assert_eq!(res["rank_sum"], 6);
            assert_eq!(res["equal_after_broadcast"], true);
            assert_eq!(res["changed"], true);
            assert_eq!(res["digest"], results[0]["digest"], "parameters agree");
        }
    });
}

mod config;
mod job_over;
