//! Pods and LSF hosts across network namespaces: each "pod" is a network namespace of its own
//! (scripts/netns.sh) with its own UTS namespace (`unshare --uts`, its hostname set as the
//! operator sets it) and its own /etc/hosts (`ip netns exec` binds /etc/netns/<ns>/hosts over
//! /etc/hosts: the names the cluster DNS would serve). rdrun gets the operator's exact variables
//! and the script, nothing else, and the two pods run one PyTorch gloo all_reduce.

use super::*;

use crate::netns::Netns;

const POD_TIMEOUT: Duration = Duration::from_secs(240);

/// The torch venv's python (scripts/torch-venv.sh), or `None` with a SKIP line.
fn torch_venv() -> Option<String> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/rdrun"))
        })?;
    let venv = cache.join("torch-venv");
    if venv.join("bin/python").exists() {
        Some(venv.to_string_lossy().into_owned())
    } else {
        eprintln!("SKIP: no torch venv (scripts/torch-venv.sh installs it)");
        None
    }
}

/// Two pods: namespaces with per-pod /etc/hosts files, removed on drop (also the "hosts" of
/// the real cross-host mpirun in launcher-tests/mpi.rs).
pub(crate) struct Pods {
    pub(crate) net: Netns,
    etc: Vec<std::path::PathBuf>,
    /// rdruns started per pod (names their output files).
    started: Vec<std::sync::atomic::AtomicUsize>,
}

impl Pods {
    /// `hosts[i]`: the /etc/hosts text pod `i` sees.
    pub(crate) fn new(hosts: &[String]) -> Option<Pods> {
        let net = Netns::create(hosts.len())?;
        let mut etc = Vec::new();
        for (i, text) in hosts.iter().enumerate() {
            let dir = std::path::PathBuf::from(format!("/etc/netns/{}", net.name(i)));
            std::fs::create_dir_all(&dir).expect("create /etc/netns dir");
            std::fs::write(dir.join("hosts"), format!("127.0.0.1 localhost\n{text}"))
                .expect("write pod hosts");
            etc.push(dir);
        }
        let started = hosts.iter().map(|_| Default::default()).collect();
        Some(Pods { net, etc, started })
    }

    /// rdrun in pod `i` with hostname `hostname`, `env` and `args`; output to files in `dir`.
    fn start(
        &self,
        i: usize,
        hostname: &str,
        env: &[(String, String)],
        args: &[&str],
        dir: &TempDir,
    ) -> Pod {
        // pod<i>.err for the first rdrun of pod i, pod<i>.<n>.err for further ones.
        let n = self.started[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let tag = if n == 0 {
            format!("pod{i}")
        } else {
            format!("pod{i}.{n}")
        };
        let out = dir.join(format!("{tag}.out"));
        let err = dir.join(format!("{tag}.err"));
        let mut cmd = std::process::Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.net.name(i),
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        .arg("hostname \"$0\" && exec \"$@\"")
        .arg(hostname)
        .arg(crate::util::rdrun_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).expect("out file"))
        .stderr(std::fs::File::create(&err).expect("err file"));
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("PET_") || k.starts_with("SLURM_") || k == "TORCHELASTIC_RUN_ID" {
                cmd.env_remove(k);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Pod {
            child: cmd.spawn().expect("spawn pod"),
            err,
        }
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for d in &self.etc {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

struct Pod {
    child: std::process::Child,
    err: std::path::PathBuf,
}

impl Pod {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits (bounded, then SIGKILL by pid) and returns the exit code and stderr.
    fn wait(mut self) -> (Option<i32>, String) {
        let started = std::time::Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("wait pod") {
                return (st.code(), self.stderr());
            }
            if started.elapsed() > POD_TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, format!("killed at the bound\n{}", self.stderr()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs one 2-pod gloo job: `pods[i]` = (hostname, the operator's variables); checks one world
/// of two (ranks 0,1, sum 3, group ranks 0,1) and returns each pod's stderr.
fn gloo_job(
    pods: &Pods,
    spec: &[(&str, Vec<(String, String)>)],
    venv: &str,
    dir: &TempDir,
) -> Vec<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launcher-tests/torch/scripts/inplace_allreduce.py");
    let script = script.to_string_lossy().into_owned();
    let out = dir.path().to_string_lossy().into_owned();
    let running: Vec<Pod> = spec
        .iter()
        .enumerate()
        .map(|(i, (host, env))| {
            let mut env = env.clone();
            // An activated venv in the pod image (not an rdrun setting).
            env.push(("VIRTUAL_ENV".into(), venv.to_string()));
            pods.start(i, host, &env, &[&script, &out], dir)
        })
        .collect();
    let ends: Vec<(Option<i32>, String)> = running.into_iter().map(Pod::wait).collect();
    for (i, (code, err)) in ends.iter().enumerate() {
        assert_eq!(*code, Some(0), "pod {i} failed:\n{err}");
    }
    for r in 0..2 {
        let text = std::fs::read_to_string(dir.join(format!("r{r}.json")))
            .unwrap_or_else(|e| panic!("rank {r} wrote no record ({e}): {ends:?}"));
        let rec: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(rec["dist_world"], 2, "{rec}");
        assert_eq!(rec["sum"], 3.0, "one world of two: {rec}");
        assert_eq!(
            rec["WORLD_SIZE"], "2",
            "pod-level WORLD_SIZE overwritten: {rec}"
        );
        assert_eq!(rec["GROUP_RANK"], r.to_string().as_str(), "{rec}");
        assert_eq!(rec["GROUP_WORLD_SIZE"], "2", "{rec}");
    }
    ends.into_iter().map(|e| e.1).collect()
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    vars(pairs)
}

/// Both pods' /etc/hosts: every name of both pods (`names[i]` are pod i's).
pub(crate) fn hosts_of(names: &[&[&str]]) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("10.231.0.{} {}\n", i + 1, n.join(" ")))
        .collect()
}

const K8S: [(&str, &str); 2] = [
    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
    ("KUBERNETES_SERVICE_PORT", "443"),
];

fn with_k8s(mut v: Vec<(String, String)>) -> Vec<(String, String)> {
    v.extend(kv(&K8S));
    v
}

/// PyTorchJob v1 static (training-operator release-1.9, a Master and one Worker): PET_* plus the
/// pod-level MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (pod count). The worker pod's DNS name for
/// the master appears only after its rdrun has tried it (item 5): rdrun retries within the join
/// timeout, says so at WARN, and the job forms once the name resolves.
#[test]
fn pods_pytorchjob_static_with_late_dns() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names: [&[&str]; 2] = [&["pj-master-0"], &["pj-worker-0"]];
        // The worker pod sees only itself at first.
        let Some(pods) = Pods::new(&[hosts_of(&names), "10.231.0.2 pj-worker-0\n".into()]) else {
            return;
        };
        let dir = TempDir::new("pod_pj");
        let pod = |rank: &str| {
            with_k8s(kv(&[
                ("PET_MASTER_ADDR", "pj-master-0"),
                ("PET_MASTER_PORT", "23456"),
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", rank),
                ("PET_NPROC_PER_NODE", "1"),
                ("MASTER_ADDR", "pj-master-0"),
                ("MASTER_PORT", "23456"),
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
                ("PYTHONUNBUFFERED", "1"),
            ]))
        };
        // Publish the master's name only once the worker has said it cannot resolve it.
        let publisher = {
            let err = dir.join("pod1.err");
            let hosts = pods.etc[1].join("hosts");
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                while started.elapsed() < POD_TIMEOUT {
                    if std::fs::read_to_string(&err)
                        .unwrap_or_default()
                        .contains("cannot resolve pj-master-0")
                    {
                        use std::io::Write;
                        let mut f = std::fs::OpenOptions::new()
                            .append(true)
                            .open(&hosts)
                            .expect("hosts");
                        writeln!(f, "10.231.0.1 pj-master-0").expect("append");
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                false
            })
        };
        let errs = gloo_job(
            &pods,
            &[("pj-master-0", pod("0")), ("pj-worker-0", pod("1"))],
            &venv,
            &dir,
        );
        assert!(
            publisher.join().expect("publisher"),
            "the worker never said it could not resolve"
        );
        assert!(
            errs[1].contains("WARN") && errs[1].contains("cannot resolve pj-master-0"),
            "{}",
            errs[1]
        );
        assert!(
            errs[1].contains("resolved pj-master-0 after"),
            "{}",
            errs[1]
        );
        assert!(
            errs[0].contains("source=kubernetes pytorchjob-v1 static"),
            "{}",
            errs[0]
        );
    });
}

/// PyTorchJob v1 elastic (elasticPolicy, Workers only): PET_RDZV_ENDPOINT on worker 0,
/// c10d, PET_NNODES=2:2, no MASTER_ADDR/RANK/WORLD_SIZE.
#[test]
fn pods_pytorchjob_elastic() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names: [&[&str]; 2] = [&["pe-worker-0"], &["pe-worker-1"]];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("pod_pe");
        let pod = || {
            with_k8s(kv(&[
                ("PET_RDZV_ENDPOINT", "pe-worker-0:23456"),
                ("PET_RDZV_BACKEND", "c10d"),
                ("PET_RDZV_ID", "pe"),
                ("PET_NNODES", "2:2"),
                ("PET_NPROC_PER_NODE", "1"),
                ("PET_MAX_RESTARTS", "0"),
                ("PYTHONUNBUFFERED", "1"),
            ]))
        };
        let errs = gloo_job(
            &pods,
            &[("pe-worker-0", pod()), ("pe-worker-1", pod())],
            &venv,
            &dir,
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("source=kubernetes pytorchjob-v1 elastic")),
            "{errs:?}"
        );
    });
}

/// Kubeflow Trainer v2 (torch plugin): PET_* only, master `<job>-node-0-0.<job>`, port 29500,
/// node rank from the completion index; hostnames `<job>-node-0-<i>`.
#[test]
fn pods_trainer_v2() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names: [&[&str]; 2] = [
            &["tj-node-0-0.tj", "tj-node-0-0"],
            &["tj-node-0-1.tj", "tj-node-0-1"],
        ];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("pod_tv2");
        let pod = |rank: &str| {
            with_k8s(kv(&[
                ("PET_NNODES", "2"),
                ("PET_NPROC_PER_NODE", "1"),
                ("PET_NODE_RANK", rank),
                ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
                ("PET_MASTER_PORT", "29500"),
                ("JOB_COMPLETION_INDEX", rank),
            ]))
        };
        let errs = gloo_job(
            &pods,
            &[("tj-node-0-0", pod("0")), ("tj-node-0-1", pod("1"))],
            &venv,
            &dir,
        );
        assert!(
            errs[0].contains("source=kubernetes trainer-v2"),
            "{}",
            errs[0]
        );
    });
}

/// JobSet (one replicatedJob `workers`, 2 completions): JOB_COMPLETION_INDEX and the hostname
/// `<jobset>-workers-0-<i>`, the subdomain from the pod's FQDN (before: the bare short name,
/// which a pod's resolver does not find under a headless Service); the completion count is in no variable, so the pod spec sets
/// RDRUN_NNODES (not a flag).
#[test]
fn pods_jobset() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        // As the kubelet writes a pod's /etc/hosts with a subdomain (its FQDN first), plus what
        // the headless Service's DNS would answer.
        let names: [&[&str]; 2] = [
            &[
                "js-workers-0-0.js.default.svc.cluster.local",
                "js-workers-0-0",
            ],
            &[
                "js-workers-0-1.js.default.svc.cluster.local",
                "js-workers-0-1",
            ],
        ];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("pod_js");
        let pod = |idx: &str| with_k8s(kv(&[("JOB_COMPLETION_INDEX", idx), ("RDRUN_NNODES", "2")]));
        let errs = gloo_job(
            &pods,
            &[("js-workers-0-0", pod("0")), ("js-workers-0-1", pod("1"))],
            &venv,
            &dir,
        );
        assert!(errs[0].contains("source=kubernetes jobset"), "{}", errs[0]);
        assert!(
            errs[0].contains("js-workers-0-0.js.default.svc.cluster.local  (hostname js-workers-0-0 with index 0)"),
            "the master's name with the pod's subdomain: {}",
            errs[0]
        );
    });
}

/// Volcano (svc, env and pytorch plugins): VC_TASK_INDEX, VC_<TASK>_HOSTS/NUM, MASTER_ADDR,
/// MASTER_PORT=23456, pod-level RANK/WORLD_SIZE; hostnames `<job>-<task>-<i>`.
#[test]
fn pods_volcano() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names: [&[&str]; 2] = [
            &["vj-master-0.vj", "vj-master-0"],
            &["vj-worker-0.vj", "vj-worker-0"],
        ];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("pod_vc");
        let pod = |rank: &str| {
            with_k8s(kv(&[
                ("VC_TASK_INDEX", "0"),
                ("VK_TASK_INDEX", "0"),
                ("VC_MASTER_HOSTS", "vj-master-0.vj"),
                ("VC_MASTER_NUM", "1"),
                ("VC_WORKER_HOSTS", "vj-worker-0.vj"),
                ("VC_WORKER_NUM", "1"),
                ("MASTER_ADDR", "vj-master-0.vj"),
                ("MASTER_PORT", "23456"),
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
            ]))
        };
        let errs = gloo_job(
            &pods,
            &[("vj-master-0", pod("0")), ("vj-worker-0", pod("1"))],
            &venv,
            &dir,
        );
        assert!(errs[0].contains("source=kubernetes volcano"), "{}", errs[0]);
    });
}

/// LSF (`bsub -n 2 -R "span[ptile=1]"` then `blaunch rdrun script` on each host): LSB_JOBID,
/// LSB_MCPU_HOSTS, LSB_HOSTS; the endpoint is the first host, the port derived from the job id.
#[test]
fn hosts_lsf() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names: [&[&str]; 2] = [&["lsfa"], &["lsfb"]];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("pod_lsf");
        let host = || {
            kv(&[
                ("LSB_JOBID", "4242"),
                ("LSB_JOBNAME", "train"),
                ("LSB_MCPU_HOSTS", "lsfa 1 lsfb 1"),
                ("LSB_HOSTS", "lsfa lsfb"),
                ("LSB_DJOB_NUMPROC", "2"),
            ])
        };
        let errs = gloo_job(&pods, &[("lsfa", host()), ("lsfb", host())], &venv, &dir);
        assert!(errs[0].contains("source=lsf (job 4242)"), "{}", errs[0]);
    });
}

fn bounded_test(f: impl FnOnce() + Send + 'static) {
    crate::netns::bounded(Duration::from_secs(400), f);
}

/// Open MPI across two hosts (`mpirun -np 4 --host mpia:2,mpib:2 --map-by node rdrun mn_worker`,
/// with a default hostfile that also lists a third host): the
/// exact per-rank variables on hosts `mpia` (ranks 0, 2) and `mpib` (ranks 1, 3), each host a
/// network namespace with its hostname. The endpoint is the hostfile's first host
/// (OMPI_MCA_orte_default_hostfile), the port derived from the job id; the node of each rank
/// comes from the hostnames the ranks exchange in the store (GROUP_RANK 0 for mpia, the host of
/// rank 0, and 1 for mpib), never from OMPI_COMM_WORLD_NODE_RANK.
#[test]
fn mpi_ranks_on_two_hosts_find_their_node_by_hostname() {
    bounded_test(|| {
        let names: [&[&str]; 2] = [&["mpia"], &["mpib"]];
        let Some(pods) = Pods::new(&[hosts_of(&names), hosts_of(&names)]) else {
            return;
        };
        let dir = TempDir::new("mpi_2hosts");
        let hf = dir.join("hostfile");
        // mpic is listed but runs no rank (`--host mpia:2,mpib:2` on the command line): its
        // position must not count, so mpib is node 1 of 2, not node 2 of 3.
        std::fs::write(&hf, "mpia slots=2\nmpic slots=2\nmpib slots=2\n").expect("hostfile");
        let hf = hf.to_string_lossy().into_owned();
        let w = worker("mn_worker").to_string_lossy().into_owned();
        let out = dir.path().to_string_lossy().into_owned();
        let running: Vec<Pod> = (0..4usize)
            .map(|rank| {
                let host = rank % 2;
                let local = (rank / 2).to_string();
                let r = rank.to_string();
                let env = kv(&[
                    ("OMPI_COMM_WORLD_RANK", &r),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", &local),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                    ("OMPI_COMM_WORLD_NODE_RANK", &local),
                    ("OMPI_UNIVERSE_SIZE", "4"),
                    ("OMPI_MCA_ess_base_jobid", "2218786817"),
                    ("OMPI_MCA_orte_default_hostfile", &hf),
                    ("PMIX_NAMESPACE", "2218786817"),
                    ("PMIX_RANK", &r),
                ]);
                pods.start(host, names[host][0], &env, &[&w, &out], &dir)
            })
            .collect();
        for (rank, p) in running.into_iter().enumerate() {
            let (code, err) = p.wait();
            assert_eq!(code, Some(0), "rank {rank}:\n{err}");
        }
        let recs = records(dir.path());
        assert_eq!(recs.len(), 4, "{recs:#?}");
        for ((gws, _, rank), env) in &recs {
            assert_eq!(*gws, 2, "two hosts: {env:?}");
            assert_eq!(get(env, "RANK"), rank.to_string());
            assert_eq!(get(env, "WORLD_SIZE"), "4");
            assert_eq!(get(env, "LOCAL_WORLD_SIZE"), "2");
            assert_eq!(get(env, "LOCAL_RANK"), (rank / 2).to_string());
            assert_eq!(
                get(env, "GROUP_RANK"),
                (rank % 2).to_string(),
                "rank {rank}"
            );
            assert_eq!(get(env, "MASTER_ADDR"), "mpia");
        }
    });
}

/// While nodes are missing, the waiting agent says every few seconds how many joined, which node
/// ranks are missing and the time left (not silence until the timeout).
#[test]
fn waiting_for_a_missing_node_says_who_is_missing() {
    let dir = TempDir::new("cl_waiting");
    let out = agent(
        &dir,
        &slurm_step_env(0, free_port()),
        &["--rdzv-conf", "timeout=12"],
    )
    .run();
    out.assert_code(1);
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("waiting for nodes (round 0): "))
        .unwrap_or_else(|| panic!("no status line: {}", out.stderr));
    assert!(
        line.contains("waiting for nodes (round 0): 1 of 2 joined, missing: node rank 1; "),
        "{line}"
    );
    assert!(line.contains("s left"), "{line}");
    assert!(
        out.stderr.contains("rendezvous timed out"),
        "{}",
        out.stderr
    );
    assert!(records(dir.path()).is_empty(), "no worker started");
}

// --- An IPv6-only pair ------------------------------------------------------------------------
//
// Two pods whose only addresses besides loopback are fd00:231::1 and fd00:231::2 (ULA, `nodad`):
// the namespaces' IPv4 addresses are removed before anything starts, and each /etc/hosts maps
// the pod names to the IPv6 addresses only.

/// [`Pods`] with IPv4 removed from eth0 (lo keeps 127.0.0.1), names `names[i]` → fd00:231::(i+1).
fn ipv6_only_pods(names: &[&str; 2]) -> Option<Pods> {
    let hosts: String = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("fd00:231::{} {n}\n", i + 1))
        .collect();
    let pods = Pods::new(&[hosts.clone(), hosts])?;
    for i in 0..2 {
        let ns = pods.net.name(i);
        let st = std::process::Command::new("ip")
            .args([
                "-n",
                &ns,
                "addr",
                "del",
                &format!("{}/24", pods.net.addr(i)),
            ])
            .args(["dev", "eth0"])
            .status()
            .expect("ip addr del");
        assert!(st.success(), "removing IPv4 from {ns}");
        let v4 = std::process::Command::new("ip")
            .args(["-n", &ns, "-4", "-o", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip addr show");
        assert!(
            v4.stdout.is_empty(),
            "{ns} eth0 still has IPv4: {}",
            String::from_utf8_lossy(&v4.stdout)
        );
    }
    Some(pods)
}

/// PyTorchJob v1 elastic (c10d) on an IPv6-only pair, the endpoint a pod name that resolves to
/// IPv6 only: one world of two, a gloo all_reduce across the pods, and each agent advertises the
/// IPv6 source address of its route to the endpoint (logged at INFO), never loopback; workers get
/// node 0's advertised address as MASTER_ADDR, bare.
#[test]
fn ipv6_only_pods_pytorchjob_elastic_gloo() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names = ["v6-worker-0", "v6-worker-1"];
        let Some(pods) = ipv6_only_pods(&names) else {
            return;
        };
        let dir = TempDir::new("pod_v6");
        let pod = || {
            with_k8s(kv(&[
                ("PET_RDZV_ENDPOINT", "v6-worker-0:23456"),
                ("PET_RDZV_BACKEND", "c10d"),
                ("PET_RDZV_ID", "v6"),
                ("PET_NNODES", "2:2"),
                ("PET_NPROC_PER_NODE", "1"),
                ("PET_MAX_RESTARTS", "0"),
                ("PYTHONUNBUFFERED", "1"),
                // torchrun's LOGLEVEL: the advertised address is an INFO line.
                ("LOGLEVEL", "INFO"),
            ]))
        };
        let errs = gloo_job(&pods, &[(names[0], pod()), (names[1], pod())], &venv, &dir);
        for (i, err) in errs.iter().enumerate() {
            let want = format!("joining the c10d rendezvous addr={}", pods.net.addr6(i));
            assert!(
                err.contains(&want),
                "pod {i} advertises its IPv6 route address: {err}"
            );
            assert!(
                !err.contains("rendezvous addr=::1") && !err.contains("rendezvous addr=127."),
                "never loopback: {err}"
            );
            // The round's master as host:port, IPv6 bracketed (before: `fd00:231::1:PORT`).
            assert!(
                err.contains("master=[fd00:231::1]:"),
                "pod {i} logs the master bracketed: {err}"
            );
        }
        for r in 0..2 {
            let rec: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(format!("r{r}.json"))).expect("record"),
            )
            .expect("JSON");
            assert_eq!(rec["MASTER_ADDR"], "fd00:231::1", "{rec}");
            assert_eq!(rec["RANK"], r.to_string().as_str(), "{rec}");
        }
    });
}

/// PyTorchJob v1 static on an IPv6-only pair with the master given as an IPv6 literal (as an
/// operator with IPv6 pod IPs may set it): the store binds that address, the worker pod reaches
/// it, one world of two runs a gloo all_reduce, and the workers get the literal bare.
#[test]
fn ipv6_only_pods_pytorchjob_static_literal_gloo() {
    let Some(venv) = torch_venv() else { return };
    bounded_test(move || {
        let names = ["v6-master-0", "v6-worker-0"];
        let Some(pods) = ipv6_only_pods(&names) else {
            return;
        };
        let dir = TempDir::new("pod_v6s");
        let pod = |rank: &str| {
            with_k8s(kv(&[
                ("PET_MASTER_ADDR", "fd00:231::1"),
                ("PET_MASTER_PORT", "23456"),
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", rank),
                ("PET_NPROC_PER_NODE", "1"),
                ("MASTER_ADDR", "fd00:231::1"),
                ("MASTER_PORT", "23456"),
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
                ("PYTHONUNBUFFERED", "1"),
            ]))
        };
        let errs = gloo_job(
            &pods,
            &[(names[0], pod("0")), (names[1], pod("1"))],
            &venv,
            &dir,
        );
        assert!(
            errs[1].contains("-> endpoint [fd00:231::1]:23456 (kubernetes pytorchjob-v1 static)"),
            "{}",
            errs[1]
        );
        for r in 0..2 {
            let rec: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(format!("r{r}.json"))).expect("record"),
            )
            .expect("JSON");
            assert_eq!(rec["MASTER_ADDR"], "fd00:231::1", "{rec}");
        }
    });
}

/// A hostfile of bare IPv6 literals (one bracketed) on an IPv6-only pair, no flag: each host
/// finds its node rank by its own interface address (the hostnames are in no entry), the
/// endpoint is the first literal (bracketed in the summary, bare in MASTER_ADDR), and the static
/// world of two forms with shell workers (before: "own host ... is missing from hostfile").
#[test]
fn ipv6_only_hosts_hostfile_of_literals() {
    bounded_test(|| {
        let names = ["v6a", "v6b"];
        let Some(pods) = ipv6_only_pods(&names) else {
            return;
        };
        let dir = TempDir::new("hf_v6");
        let hf = dir.join("hostfile");
        std::fs::write(&hf, "fd00:231::1 slots=1\n[fd00:231::2] slots=1\n").expect("hostfile");
        let env = kv(&[("RDRUN_HOSTFILE", &hf.to_string_lossy())]);
        let w = worker("mn_worker").to_string_lossy().into_owned();
        let out = dir.path().to_string_lossy().into_owned();
        let running: Vec<Pod> = (0..2)
            .map(|i| pods.start(i, names[i], &env, &[&w, &out], &dir))
            .collect();
        let ends: Vec<(Option<i32>, String)> = running.into_iter().map(Pod::wait).collect();
        for (i, (code, err)) in ends.iter().enumerate() {
            assert_eq!(*code, Some(0), "host {i}:\n{err}");
        }
        assert!(
            ends[1]
                .1
                .contains("rdrun: node 1/2 -> endpoint [fd00:231::1]:29500 (hostfile ("),
            "{}",
            ends[1].1
        );
        let recs = records(dir.path());
        assert_eq!(recs.len(), 2, "{recs:#?}");
        for ((gws, _, rank), env) in &recs {
            assert_eq!(*gws, 2, "{env:?}");
            assert_eq!(get(env, "GROUP_RANK"), rank.to_string(), "by address");
            assert_eq!(get(env, "WORLD_SIZE"), "2");
            assert_eq!(get(env, "MASTER_ADDR"), "fd00:231::1");
        }
    });
}
