//! The etcd v3 rendezvous (`--rdzv-backend etcd-v3`, feature `etcd`) against a real etcd:
//! a 3-member cluster started here on free loopback ports (members stopped by PID when the
//! test ends), real `rdrun` agents advertising 127.0.0.N as simulated nodes, workers
//! `workers/mn_worker` (see `multinode`). Each test has its own run id (its key prefix), and
//! its own cluster, because several of them kill members. Skipped with a message when `etcd`
//! is not installed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::multinode::{
    assert_ok, check_round, get, recorded_pids, records, wait_records, Records,
};
use crate::util::{assert_no_leak, free_port, worker, Output, Rdrun, TempDir};

/// Hard bound on one agent of these tests.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// A real etcd cluster on loopback; members are SIGKILLed by PID and reaped on drop.
struct Cluster {
    members: Vec<Option<Child>>,
    endpoints: Vec<String>,
    _dir: TempDir,
}

fn etcd_bin() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join("etcd"))
        .find(|p| p.is_file())
}

impl Cluster {
    /// `n` members, healthy (a put/get through etcdctl answers) before this returns; `None`
    /// (with a message) when etcd is not installed.
    fn start(n: usize) -> Option<Cluster> {
        let Some(etcd) = etcd_bin() else {
            eprintln!("SKIPPED: etcd not installed (Debian: etcd-server etcd-client)");
            return None;
        };
        let dir = TempDir::new("etcd");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let mut members = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let child = Command::new(&etcd)
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("m{i}")))
                .args(["--listen-client-urls", &format!("http://127.0.0.1:{c}")])
                .args(["--advertise-client-urls", &format!("http://127.0.0.1:{c}")])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{p}"),
                ])
                .args(["--initial-cluster", &cluster.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--log-level", "error"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn etcd");
            members.push(Some(child));
        }
        let c = Cluster {
            members,
            endpoints: ports
                .iter()
                .map(|(c, _)| format!("127.0.0.1:{c}"))
                .collect(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !c.healthy() {
            assert!(
                Instant::now() < deadline,
                "etcd cluster not healthy after 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(c)
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints.join(",")))
            .arg("--command-timeout=3s")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl")
    }

    fn healthy(&self) -> bool {
        self.ctl(&["put", "/health", "1"]).status.success()
    }

    fn list(&self) -> String {
        self.endpoints.join(",")
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

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// An etcd agent advertising 127.0.0.`host` with one worker `mn_worker dir`.
fn agent(dir: &TempDir, eps: &str, run: &str, nnodes: &str, host: usize, conf: &str) -> Rdrun {
    let conf = if conf.is_empty() {
        "last_call_timeout=20".to_string()
    } else {
        format!("last_call_timeout=20,{conf}")
    };
    Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .args(strings(&[
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
            "--local-addr",
            &format!("127.0.0.{host}"),
            "--nproc-per-node",
            "1",
            "--no-python",
        ]))
        .arg(worker("mn_worker"))
        .arg(dir.path())
}

/// The MASTER_ADDR of round (gws, restart 0), from its records.
fn master_of(recs: &Records, gws: usize) -> String {
    let (_, env) = recs
        .iter()
        .find(|((g, r, _), _)| *g == gws && *r == 0)
        .expect("a record of the round");
    get(env, "MASTER_ADDR").to_string()
}

/// (a) The agent hosting the workers' store (group rank 0) is SIGKILLed: the other two regroup
/// in a new round with a new store host and finish; not charged as a restart.
#[test]
fn store_host_killed_survivors_regroup_with_a_new_store_host() {
    let Some(etcd) = Cluster::start(3) else {
        return;
    };
    let dir = TempDir::new("etcd-kill-host");
    let mut running: Vec<_> = (1..=3)
        .map(|h| {
            agent(&dir, &etcd.list(), "killhost", "2:4", h, "")
                .env("MN_HOLD_GWS", "3")
                .spawn()
        })
        .collect();
    wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
    let recs = records(dir.path());
    let (old_master, _) = check_round(&recs, 3, 0, Some(&[1, 1, 1]));
    let host: usize = old_master.rsplit('.').next().unwrap().parse().unwrap();
    let pids = recorded_pids(dir.path());
    let victim = running.remove(host - 1);
    let t0 = Instant::now();
    victim.signal(libc::SIGKILL);
    assert_eq!(victim.wait().signal, Some(libc::SIGKILL));
    let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    eprintln!(
        "SIGKILL of the store host -> survivors done in {:?}",
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
    assert_no_leak(&pids, Duration::from_secs(10));
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

/// (b) One of three etcd members is SIGKILLed mid-run: nothing notices (no new round).
#[test]
fn one_etcd_member_killed_nothing_notices() {
    let Some(mut etcd) = Cluster::start(3) else {
        return;
    };
    let dir = TempDir::new("etcd-kill-member");
    let until = dir.join("go");
    let running: Vec<_> = (1..=3)
        .map(|h| {
            agent(&dir, &etcd.list(), "killone", "2:4", h, "ttl=3")
                .env("MN_UNTIL", &until)
                .spawn()
        })
        .collect();
    wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
    etcd.kill(0);
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
}

/// (c) Two of three members are SIGKILLed: quorum is gone; every agent fails with an error
/// naming the endpoints within a bound, its workers stopped.
#[test]
fn etcd_quorum_lost_is_a_bounded_error_naming_the_endpoints() {
    let Some(mut etcd) = Cluster::start(3) else {
        return;
    };
    let dir = TempDir::new("etcd-kill-two");
    let running: Vec<_> = (1..=3)
        .map(|h| {
            agent(&dir, &etcd.list(), "killtwo", "2:4", h, "ttl=3")
                .env("MN_HOLD_GWS", "3")
                .spawn()
        })
        .collect();
    wait_records(dir.path(), 3, 0, 3, Duration::from_secs(90));
    let pids = recorded_pids(dir.path());
    let t0 = Instant::now();
    etcd.kill(0);
    etcd.kill(1);
    let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
    let took = t0.elapsed();
    eprintln!("quorum lost -> agents exited in {took:?}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    for o in &outs {
        assert_eq!(o.code, Some(1), "{o:?}");
        assert!(
            o.stderr.contains(&etcd.endpoints[2]),
            "names the endpoints: {o:?}"
        );
        assert!(o.stderr.contains("etcd"), "{o:?}");
    }
    assert_no_leak(&pids, Duration::from_secs(10));
}

/// (d) Scale up: a third node joins a running 2-node job (2:4); the job grows to 3 nodes
/// without a restart being charged, and finishes.
#[test]
fn a_node_added_mid_run_grows_the_world() {
    let Some(etcd) = Cluster::start(3) else {
        return;
    };
    let dir = TempDir::new("etcd-scale-up");
    let mut running: Vec<_> = (1..=2)
        .map(|h| {
            agent(&dir, &etcd.list(), "grow", "2:4", h, "last_call_timeout=2")
                .env("MN_HOLD_GWS", "2")
                .spawn()
        })
        .collect();
    wait_records(dir.path(), 2, 0, 2, Duration::from_secs(90));
    running.push(
        agent(&dir, &etcd.list(), "grow", "2:4", 3, "last_call_timeout=2")
            .env("MN_HOLD_GWS", "2")
            .spawn(),
    );
    let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    check_round(&recs, 2, 0, Some(&[1, 1]));
    check_round(&recs, 3, 0, Some(&[1, 1, 1]));
    assert_no_leak(&recorded_pids(dir.path()), Duration::from_secs(10));
}

/// Bad input: unreachable members, an etcd with auth on (a wrong password; a user whose role
/// does not cover the key prefix), and the v2 backend: one-line errors naming what failed.
#[test]
fn bad_endpoints_auth_and_prefix_are_one_line_errors() {
    let Some(etcd) = Cluster::start(1) else {
        return;
    };
    let dir = TempDir::new("etcd-bad");
    let run = |eps: &str, conf: &str| {
        let t0 = Instant::now();
        let o = agent(&dir, eps, "bad", "2", 1, conf)
            .timeout(Duration::from_secs(60))
            .run();
        assert_eq!(o.code, Some(1), "{o:?}");
        assert!(t0.elapsed() < Duration::from_secs(30), "bounded: {o:?}");
        let line = o
            .stderr
            .lines()
            .find(|l| l.contains("error") && l.contains("etcd rendezvous at"))
            .unwrap_or_else(|| panic!("no error line: {o:?}"))
            .to_string();
        line
    };
    let dead = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let line = run(&dead, "");
    assert!(line.contains(&dead.replace(',', ", ")), "{line}");
    assert!(line.contains("no member answered"), "{line}");

    // Auth: root (needed to enable it) and a user limited to /allowed/.
    for args in [
        &[
            "user",
            "add",
            "root",
            "--new-user-password=rootpw",
            "--interactive=false",
        ][..],
        &["role", "add", "r"],
        &[
            "role",
            "grant-permission",
            "r",
            "--prefix=true",
            "readwrite",
            "/allowed/",
        ],
        &[
            "user",
            "add",
            "u",
            "--new-user-password=upw",
            "--interactive=false",
        ],
        &["user", "grant-role", "u", "r"],
        &["auth", "enable"],
    ] {
        let o = etcd.ctl(args);
        assert!(o.status.success(), "etcdctl {args:?}: {o:?}");
    }
    let eps = etcd.list();
    let line = run(&eps, "username=u,password=wrong,key_prefix=/allowed");
    assert!(line.contains("authentication failed (user u)"), "{line}");
    let line = run(&eps, "username=u,password=upw,key_prefix=/elsewhere");
    assert!(
        line.contains("permission denied for keys under /elsewhere/"),
        "{line}"
    );
    // The same user inside its prefix gets past the checks (and then waits for a 2nd node).
    let o = agent(
        &dir,
        &eps,
        "bad",
        "2",
        1,
        "username=u,password=upw,key_prefix=/allowed,join_timeout=2",
    )
    .run();
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("rendezvous timed out"), "{o:?}");

    let o = Rdrun::new()
        .args([
            "--nnodes",
            "2",
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            &eps,
        ])
        .args(["--no-python", "true"])
        .run();
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(
        o.stderr.contains("v2 API is gone") && o.stderr.contains("etcd-v3"),
        "{o:?}"
    );
}

/// The torch venv's python (`scripts/torch-venv.sh` builds it), if present.
fn torch_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/python");
    p.exists().then_some(p)
}

/// (e) PyTorch gloo DDP across three nodes under the etcd backend: every rank trains, the
/// parameters agree after training, and the ranks are 0..3.
#[test]
fn pytorch_gloo_ddp_across_nodes() {
    let Some(python) = torch_python() else {
        eprintln!("SKIPPED: no torch venv (scripts/torch-venv.sh builds it)");
        return;
    };
    let Some(etcd) = Cluster::start(3) else {
        return;
    };
    let dir = TempDir::new("etcd-ddp");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("launcher-tests/torch/scripts/ddp_train.py");
    let running: Vec<_> = (1..=3)
        .map(|h| {
            Rdrun::new()
                .timeout(Duration::from_secs(240))
                .env("PYTHON_EXEC", &python)
                .args(strings(&[
                    "--nnodes",
                    "3",
                    "--rdzv-backend",
                    "etcd",
                    "--rdzv-endpoint",
                    &etcd.list(),
                    "--rdzv-id",
                    "ddp",
                    "--local-addr",
                    &format!("127.0.0.{h}"),
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
}
