//! Against a real Slurm 22.05 cluster (issue 12): Debian's munged, slurmctld and one slurmd per
//! node, each node in its own network and UTS namespace with its node name as hostname
//! (`scripts/slurm-cluster.sh`). Everything is started through the real `srun`, `salloc` and
//! `sbatch` on the controller host, so rdrun sees exactly the environment Slurm gives it.
//!
//! - The harness itself: `srun -N2 hostname` answers from both nodes, and `down` leaves no
//!   daemon, namespace or file behind.
//! - `srun -N2 --ntasks-per-node=1 rdrun --nproc_per_node=2 script.py`: one world of 4 with a
//!   PyTorch gloo all_reduce across the nodes (the torch venv of `scripts/torch-venv.sh`).
//! - `salloc -N2 rdrun ...` and a 2-node `sbatch` script running rdrun: refused with the srun hint.
//! - Node names that give an odd but legal list (several bracket groups, mixed padding).
//! - `srun -N2 --ntasks-per-node=2 rdrun script.py` (in-place mode; ignored until it lands).
//!
//! Where root, namespaces or a Slurm tool are missing the tests print `SKIP: ...` and pass without
//! running; where the torch venv is missing the torch tests do. Every command has a hard bound.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::multinode::{get, records};
use crate::netns::bounded;
use crate::util::{rdrun_bin, torch_python, worker, Output, TempDir};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> Command {
    Command::new(repo_root().join("scripts/slurm-cluster.sh"))
}

/// A running cluster; `down` (also on drop, on panic) removes all of it.
struct Cluster {
    dir: PathBuf,
    names: Vec<String>,
}

impl Cluster {
    /// Starts a cluster with these node names, or returns None after printing why it cannot.
    fn up(names: &[&str]) -> Option<Cluster> {
        let check = script()
            .arg("check")
            .output()
            .expect("run slurm-cluster.sh");
        if !check.status.success() {
            eprintln!(
                "SKIP: {}{}",
                String::from_utf8_lossy(&check.stdout).trim(),
                String::from_utf8_lossy(&check.stderr).trim()
            );
            return None;
        }
        // Clusters of earlier runs that were killed before cleaning up.
        let _ = script().arg("reap").status();
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rdrun-slurm-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let out = script()
            .arg("up")
            .arg(&dir)
            .args(names)
            .env("RDRUN_SLURM_OWNER", std::process::id().to_string())
            .stdin(Stdio::null())
            .output()
            .expect("run slurm-cluster.sh up");
        let cluster = Cluster {
            dir,
            names: names.iter().map(|s| s.to_string()).collect(),
        };
        assert!(
            out.status.success(),
            "slurm-cluster.sh up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(cluster)
    }

    /// Runs `args` on the controller host (where users type srun), in `cwd`, with `env` added to
    /// a clean environment: no scheduler or torchrun variable of the test's own leaks in.
    /// SIGKILLed by PID after `limit`, which fails the test.
    /// `sinfo -h -o "%N %T"` once it reads `want`, asked every 200 ms for up to `limit`; the
    /// last answer when it never does. A node goes from `completing` to `idle` some time after a
    /// step's last task exits (slurmd reports the step's end asynchronously), so reading the
    /// state once right after `srun` returns is a race.
    fn wait_sinfo(&self, cwd: &Path, want: &str, limit: Duration) -> Output {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let info = self.run(
                cwd,
                &[],
                &["sinfo", "-h", "-o", "%N %T"],
                Duration::from_secs(30),
            );
            if info.stdout.trim() == want || std::time::Instant::now() >= deadline {
                return info;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn run(&self, cwd: &Path, env: &[(&str, &str)], args: &[&str], limit: Duration) -> Output {
        let mut cmd = script();
        cmd.arg("exec").arg(&self.dir).args(args).current_dir(cwd);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if [
                "SLURM_",
                "PET_",
                "RDRUN_",
                "TORCHELASTIC_",
                "MASTER_",
                "OMPI_",
                "PMI_",
            ]
            .iter()
            .any(|p| k.starts_with(p))
                || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "ENVIRONMENT"].contains(&&*k)
            {
                cmd.env_remove(&*k);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        run_bounded(cmd, &args.join(" "), limit)
    }

    fn down(&mut self) -> Output {
        let mut cmd = script();
        cmd.arg("down").arg(&self.dir);
        run_bounded(cmd, "slurm-cluster.sh down", Duration::from_secs(60))
    }

    /// The namespace tag, for the leftover checks.
    fn tag(&self) -> String {
        std::fs::read_to_string(self.dir.join("tag"))
            .expect("cluster tag")
            .trim()
            .to_string()
    }

    /// The daemons' pids (munged, slurmctld, slurmd-*).
    fn daemon_pids(&self) -> Vec<i32> {
        std::fs::read_dir(self.dir.join("pids"))
            .expect("pids dir")
            .flatten()
            .map(|e| {
                std::fs::read_to_string(e.path())
                    .expect("pid file")
                    .trim()
                    .parse()
                    .expect("pid")
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.dir.exists() {
            let out = self.down();
            if out.code != Some(0) {
                eprintln!("slurm-cluster.sh down failed: {out:?}");
            }
        }
    }
}

fn run_bounded(mut cmd: Command, what: &str, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let ro = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let re = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if start.elapsed() >= limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    // A killed srun may leave its pipes to task output open until the cluster is down; do not
    // wait on them then.
    let (stdout, stderr) = if timed_out {
        (String::new(), String::new())
    } else {
        (ro.join().unwrap_or_default(), re.join().unwrap_or_default())
    };
    let out = Output {
        cmd: what.to_string(),
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        waited: start.elapsed(),
        timed_out,
    };
    assert!(
        !out.timed_out,
        "exceeded its hard bound of {limit:?}: {out:?}"
    );
    out
}

fn rdrun() -> String {
    rdrun_bin().to_string_lossy().into_owned()
}

fn allreduce_script() -> String {
    repo_root()
        .join("launcher-tests/torch/scripts/slurm_allreduce.py")
        .to_string_lossy()
        .into_owned()
}

/// The records `slurm_allreduce.py` wrote (`rank<R>.json`), by rank.
fn allreduce_records(dir: &Path) -> BTreeMap<usize, serde_json::Value> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("read out dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(r) = name
            .strip_prefix("rank")
            .and_then(|s| s.strip_suffix(".json"))
        {
            let text = std::fs::read_to_string(e.path()).expect("read record");
            out.insert(
                r.parse().expect("rank"),
                serde_json::from_str(&text).expect("json record"),
            );
        }
    }
    out
}

fn s<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} missing or not a string in {v}"))
}

/// One world of `nodes.len() * per_node` ranks with a correct gloo all_reduce: ranks 0..W, node
/// `i` (the i-th host of the step's node list) holding ranks i*per_node.., MASTER_ADDR the first
/// node's name, which resolves (on the nodes) to its bridge address, never to loopback.
fn assert_gloo_world(recs: &BTreeMap<usize, serde_json::Value>, nodes: &[&str], per_node: usize) {
    let world = nodes.len() * per_node;
    assert_eq!(
        recs.keys().copied().collect::<Vec<_>>(),
        (0..world).collect::<Vec<_>>(),
        "every rank reported: {recs:#?}"
    );
    let want_sum = (world * (world + 1) / 2) as f64;
    for (rank, r) in recs {
        let node = rank / per_node;
        assert_eq!(s(r, "RANK"), rank.to_string(), "{r}");
        assert_eq!(r["dist_rank"].as_u64(), Some(*rank as u64), "{r}");
        assert_eq!(s(r, "WORLD_SIZE"), world.to_string(), "{r}");
        assert_eq!(r["dist_world"].as_u64(), Some(world as u64), "{r}");
        assert_eq!(s(r, "LOCAL_WORLD_SIZE"), per_node.to_string(), "{r}");
        assert_eq!(s(r, "LOCAL_RANK"), (rank % per_node).to_string(), "{r}");
        assert_eq!(s(r, "GROUP_RANK"), node.to_string(), "{r}");
        assert_eq!(s(r, "hostname"), nodes[node], "rank {rank} ran on {r}");
        assert_eq!(s(r, "SLURMD_NODENAME"), nodes[node], "{r}");
        assert_eq!(s(r, "MASTER_ADDR"), nodes[0], "{r}");
        let ip = s(r, "master_ip");
        assert!(
            ip.starts_with("10.231.0.") && !ip.starts_with("127."),
            "MASTER_ADDR must reach node 0 over the network: {r}"
        );
        assert_eq!(r["sum"].as_f64(), Some(want_sum), "all_reduce result: {r}");
    }
}

/// The harness: a real 2-node cluster answers `srun -N2 hostname` from both nodes (each its own
/// UTS namespace), and `down` removes every daemon, namespace and file.
#[test]
fn slurm_cluster_harness_runs_srun_and_leaves_nothing() {
    bounded(Duration::from_secs(180), || {
        let Some(mut c) = Cluster::up(&["node01", "node02"]) else {
            return;
        };
        let cwd = TempDir::new("slurm_harness");
        let out = c.run(
            cwd.path(),
            &[],
            &["srun", "-N2", "hostname"],
            Duration::from_secs(60),
        );
        out.assert_code(0);
        let mut hosts: Vec<&str> = out.stdout.lines().collect();
        hosts.sort();
        assert_eq!(hosts, ["node01", "node02"], "{out:?}");
        let info = c.wait_sinfo(cwd.path(), "node[01-02] idle", Duration::from_secs(90));
        assert_eq!(info.stdout.trim(), "node[01-02] idle", "{info:?}");

        let (tag, pids, dir) = (c.tag(), c.daemon_pids(), c.dir.clone());
        assert_eq!(pids.len(), 2 + c.names.len(), "munged, slurmctld, slurmds");
        c.down().assert_code(0);
        // `down` ends with SIGKILL for a daemon that ignored SIGTERM, and does not wait for it:
        // its death is then asynchronous, so it is waited for (bounded), not asserted at once.
        crate::util::assert_no_leak(&pids, Duration::from_secs(10));
        assert!(!dir.exists(), "{} left behind", dir.display());
        let ns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let ns = String::from_utf8_lossy(&ns.stdout);
        assert!(
            !ns.contains(&format!("rdrun-{tag}-")),
            "namespaces left: {ns}"
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mounts.contains(&format!("rdrun-{tag}-")) && !mounts.contains(&*dir.to_string_lossy()),
            "mounts left: {mounts}"
        );
        // down again is a no-op.
        c.down().assert_code(0);
    });
}

/// The headline: `srun -N2 --ntasks-per-node=1 rdrun --nproc_per_node=2 script.py` on a
/// real cluster is one world of 4 whose gloo all_reduce sums over both nodes (before the Slurm
/// wiring each node formed its own world of 2 with MASTER_ADDR=127.0.0.1).
#[test]
fn srun_one_task_per_node_is_one_gloo_world() {
    let Some(py) = torch_python() else { return };
    bounded(Duration::from_secs(300), move || {
        let Some(c) = Cluster::up(&["node01", "node02"]) else {
            return;
        };
        let out_dir = TempDir::new("slurm_gloo");
        let py = py.to_string_lossy();
        let out = c.run(
            out_dir.path(),
            &[("PYTHON_EXEC", &py)],
            &[
                "srun",
                "-N2",
                "--ntasks-per-node=1",
                &rdrun(),
                "--nproc_per_node=2",
                &allreduce_script(),
                &out_dir.path().to_string_lossy(),
            ],
            Duration::from_secs(240),
        );
        out.assert_code(0);
        assert_gloo_world(&allreduce_records(out_dir.path()), &["node01", "node02"], 2);
        // The topology banner on node 0 names the Slurm step; node 1 prints its one line.
        assert!(
            out.stderr
                .contains("rdrun: topology  source=slurm-step (job ")
                && out.stderr.contains("(first host of SLURM_STEP_NODELIST)")
                && out
                    .stderr
                    .contains("node_list        [node01, node02]  (SLURM_STEP_NODELIST)"),
            "{out:?}"
        );
        assert!(
            out.stderr.contains("rdrun: node 1/2 -> endpoint node01:"),
            "{out:?}"
        );
    });
}

/// Several tasks per node: `srun -N2 --ntasks-per-node=2 rdrun script.py` makes each rdrun one
/// rank in place (RANK/LOCAL_RANK/WORLD_SIZE from the step), one world of 4 with gloo.
#[test]
fn srun_several_tasks_per_node_is_in_place() {
    let Some(py) = torch_python() else { return };
    bounded(Duration::from_secs(300), move || {
        let Some(c) = Cluster::up(&["node01", "node02"]) else {
            return;
        };
        let out_dir = TempDir::new("slurm_inplace");
        let py = py.to_string_lossy();
        let out = c.run(
            out_dir.path(),
            &[("PYTHON_EXEC", &py)],
            &[
                "srun",
                "-N2",
                "--ntasks-per-node=2",
                &rdrun(),
                &allreduce_script(),
                &out_dir.path().to_string_lossy(),
            ],
            Duration::from_secs(240),
        );
        out.assert_code(0);
        let recs = allreduce_records(out_dir.path());
        assert_gloo_world(&recs, &["node01", "node02"], 2);
        // In place: each rank is the Slurm task of the same number.
        for (rank, r) in &recs {
            assert_eq!(s(r, "SLURM_PROCID"), rank.to_string(), "{r}");
        }
    });
}

/// A multi-node allocation without a step must never run: `salloc -N2 rdrun ...` (on the
/// controller host, as a user would) and a 2-node batch script that runs rdrun directly (on the
/// first node only) are refused with the srun hint, and no worker starts.
#[test]
fn salloc_and_sbatch_without_a_step_are_refused_with_the_srun_hint() {
    bounded(Duration::from_secs(180), || {
        let Some(c) = Cluster::up(&["node01", "node02"]) else {
            return;
        };
        let dir = TempDir::new("slurm_alloc");
        let mn = worker("mn_worker").to_string_lossy().into_owned();
        let d = dir.path().to_string_lossy().into_owned();
        let hint = "run `srun --ntasks-per-node=1 rdrun ...`";

        // salloc names the job "interactive" when no -J is given (checked on 22.05).
        let out = c.run(
            dir.path(),
            &[],
            &["salloc", "-N2", &rdrun(), "--nproc_per_node=2", &mn, &d],
            Duration::from_secs(60),
        );
        assert_ne!(out.code, Some(0), "{out:?}");
        assert!(
            out.stderr.contains("rdrun: error: Slurm job ")
                && out.stderr.contains("spans 2 nodes")
                && out.stderr.contains("an allocation shell (salloc)")
                && out.stderr.contains(hint),
            "{out:?}"
        );
        assert!(records(dir.path()).is_empty(), "a worker ran: {out:?}");

        let job = dir.join("job.sh");
        std::fs::write(
            &job,
            format!("#!/bin/sh\nexec {} --nproc_per_node=2 {mn} {d}\n", rdrun()),
        )
        .unwrap();
        let log = dir.join("job.out");
        let out = c.run(
            dir.path(),
            &[],
            &[
                "sbatch",
                "--wait",
                "-N2",
                "-o",
                &log.to_string_lossy(),
                &job.to_string_lossy(),
            ],
            Duration::from_secs(90),
        );
        assert_ne!(out.code, Some(0), "the job must fail: {out:?}");
        let text = std::fs::read_to_string(&log).expect("the job's output");
        assert!(
            text.contains("spans 2 nodes (SLURM_JOB_NUM_NODES=2) but this is a batch script (ENVIRONMENT=BATCH)")
                && text.contains(hint),
            "{text}"
        );
        assert!(records(dir.path()).is_empty(), "a worker ran: {text}");
    });
}

/// Node names that Slurm compresses into an odd but legal list, `cpu[01-02],gpu-b[7,10]` (two
/// bracket groups, padded and unpadded, non-contiguous, a dash in the prefix; Slurm sorts the
/// names), through the real daemons: 4 agents, one worker each, one world in list order.
#[test]
fn odd_node_list_through_the_real_daemons() {
    bounded(Duration::from_secs(240), || {
        // Declared out of order: the step's list is Slurm's own (sorted) order.
        let names = ["gpu-b10", "cpu02", "gpu-b7", "cpu01"];
        let Some(c) = Cluster::up(&names) else {
            return;
        };
        let dir = TempDir::new("slurm_odd");
        let mn = worker("mn_worker").to_string_lossy().into_owned();
        let d = dir.path().to_string_lossy().into_owned();
        let out = c.run(
            dir.path(),
            &[],
            &["srun", "-N4", "--ntasks-per-node=1", &rdrun(), &mn, &d],
            Duration::from_secs(180),
        );
        out.assert_code(0);
        let list = "cpu[01-02],gpu-b[7,10]";
        let order = ["cpu01", "cpu02", "gpu-b7", "gpu-b10"];
        assert!(
            out.stderr.contains(&format!(
                "node_list        [{}]  (SLURM_STEP_NODELIST)",
                order.join(", ")
            )),
            "{out:?}"
        );
        let recs = records(dir.path());
        assert_eq!(recs.len(), 4, "{recs:#?}\n{out:?}");
        for ((gws, _, rank), env) in &recs {
            assert_eq!(*gws, 4);
            assert_eq!(get(env, "SLURM_STEP_NODELIST"), list, "{env:?}");
            assert_eq!(get(env, "WORLD_SIZE"), "4");
            assert_eq!(get(env, "GROUP_RANK"), rank.to_string());
            assert_eq!(get(env, "SLURMD_NODENAME"), order[*rank], "{env:?}");
            assert_eq!(get(env, "SLURM_NODEID"), rank.to_string());
            assert_eq!(get(env, "MASTER_ADDR"), "cpu01");
        }
    });
}

/// Runs `srun -N2 --ntasks-per-node=<tasks> rdrun <extra> --max-restarts=1 ddp_restart.py`
/// with `fail` exiting 7 on attempt 0, and checks every rank of attempt 1 finished (issue 24.1).
fn srun_ddp_restart(
    tasks_per_node: &'static str,
    extra: &'static [&'static str],
    fail: &'static str,
) {
    let Some(py) = torch_python() else { return };
    bounded(Duration::from_secs(420), move || {
        let Some(c) = Cluster::up(&["node01", "node02"]) else {
            return;
        };
        let out_dir = TempDir::new("slurm_restart");
        let py = py.to_string_lossy();
        let script = crate::util::torch_script("ddp_restart.py");
        let (rdrun, script, dir) = (
            rdrun(),
            script.to_string_lossy().into_owned(),
            out_dir.path().to_string_lossy().into_owned(),
        );
        let ntasks = format!("--ntasks-per-node={tasks_per_node}");
        let mut args = vec!["srun", "-N2", ntasks.as_str(), rdrun.as_str()];
        args.extend_from_slice(extra);
        args.extend(["--max-restarts=1", script.as_str(), dir.as_str(), fail]);
        let out = c.run(
            out_dir.path(),
            &[("PYTHON_EXEC", &py)],
            &args,
            Duration::from_secs(360),
        );
        out.assert_code(0);
        crate::static_restart::assert_finished(out_dir.path(), 4, 1, std::slice::from_ref(&out));
    });
}

/// Issue 24.1 under the real daemons: `srun -N2 --ntasks-per-node=1 rdrun --nproc_per_node=2
/// --max-restarts=1` with rank 3 (node 2) exiting 7 on attempt 0 restarts every node once and
/// attempt 1 forms its gloo world (before, it read attempt 0's addresses from node 0's store
/// and died in connectFullMesh on both nodes).
#[test]
fn srun_one_task_per_node_ddp_restarts_after_a_failure() {
    srun_ddp_restart("1", &["--nproc_per_node=2"], "3");
}

/// The same in place (`srun -N2 --ntasks-per-node=2 rdrun`: each rdrun one rank, a static
/// rendezvous of four members), rank 0 — on the node whose agent hosts the store — failing.
#[test]
fn srun_in_place_ddp_restarts_after_a_failure() {
    srun_ddp_restart("2", &[], "0");
}
