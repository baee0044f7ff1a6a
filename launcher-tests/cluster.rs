//! Cluster environments (issue 12) end to end: real `rdrun` agents started with the exact
//! variables a scheduler sets and no flag beyond the program, on loopback.
//!
//! Slurm: a 2-node `srun` step with one task per node, as `srun -N2 --ntasks-per-node=1
//! --gpus-per-node=2 --resv-ports` exports it. The step's node list is `localhost,rdnode2`: its
//! first host (the endpoint) resolves to loopback on any machine, and the node identity comes
//! from `SLURMD_NODENAME`/`SLURM_NODEID`, not from the machine's hostname, so both agents can run
//! here. No real slurmctld/slurmd is involved (see docs/compat.md).
//! Kubernetes: a PyTorchJob v1 static pod's variables (`PET_*` plus the pod-level ones).
//! Across network namespaces (`cluster/pods.rs`; one per pod, with its own hostname and
//! /etc/hosts): PyTorchJob v1 static (with the master's DNS name appearing late) and elastic,
//! Trainer v2, JobSet, Volcano and LSF, each a 2-node PyTorch gloo all_reduce with no rdrun
//! flag (skipped without root namespaces or the torch venv).
//!
//! Workers are `workers/mn_worker`: each writes its environment to `w.<GWS>.<restart>.<RANK>`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::multinode::{get, records};
use crate::util::{free_port, worker, Output, Rdrun, TempDir};

/// Pods and LSF hosts across network namespaces.
mod pods;
pub(crate) use pods::{hosts_of, Pods};

const AGENT_TIMEOUT: Duration = Duration::from_secs(120);
const NODES: [&str; 2] = ["localhost", "rdnode2"];
const JOB: &str = "81234";

/// The variables Slurm 22.05 sets for task `node` of `srun -N2 --ntasks-per-node=1
/// --gpus-per-node=2 --resv-ports` (job 81234, step 0); `port` is the reserved port.
pub(crate) fn slurm_step_env(node: usize, port: u16) -> Vec<(String, String)> {
    let list = NODES.join(",");
    let n = node.to_string();
    [
        ("SLURM_JOB_ID", JOB),
        ("SLURM_JOBID", JOB),
        ("SLURM_JOB_NAME", "pe.sh"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NODELIST", &list),
        ("SLURM_NODELIST", &list),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEPID", "0"),
        ("SLURM_STEP_NODELIST", &list),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_STEP_RESV_PORTS", &port.to_string()),
        ("SLURM_NTASKS", "2"),
        ("SLURM_NPROCS", "2"),
        ("SLURM_NTASKS_PER_NODE", "1"),
        ("SLURM_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_NODEID", &n),
        ("SLURM_PROCID", &n),
        ("SLURM_LOCALID", "0"),
        ("SLURMD_NODENAME", NODES[node]),
        ("SLURM_TOPOLOGY_ADDR", NODES[node]),
        ("SLURM_GPUS_ON_NODE", "2"),
        // Set by the gres plugin beside SLURM_GPUS_ON_NODE (workers here use no GPU).
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("SLURM_CLUSTER_NAME", "rdtest"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// rdrun with `env`, then `args`, then `mn_worker dir` (the program: not a .py, so exec'd).
fn agent(dir: &TempDir, env: &[(String, String)], args: &[&str]) -> Rdrun {
    let mut r = Rdrun::new().timeout(AGENT_TIMEOUT);
    for (k, v) in env {
        r = r.env(k, v);
    }
    r.args(args).arg(worker("mn_worker")).arg(dir.path())
}

/// Two agents of one 2-node job with 2 workers each: one world of 4 (not two worlds of 2),
/// ranks 0..4, group ranks 0/1 with ranks 0,1 and 2,3, one run id, one master.
fn assert_one_world_of_four(
    recs: &BTreeMap<(usize, u32, usize), BTreeMap<String, String>>,
    run_id: &str,
    master: (&str, u16),
) {
    assert_eq!(recs.len(), 4, "four workers: {recs:#?}");
    let ranks: Vec<usize> = recs.keys().map(|k| k.2).collect();
    assert_eq!(ranks, vec![0, 1, 2, 3], "distinct ranks of one world");
    for ((gws, restart, rank), env) in recs {
        assert_eq!((*gws, *restart), (2, 0), "{env:?}");
        assert_eq!(get(env, "WORLD_SIZE"), "4", "rank {rank}");
        assert_eq!(get(env, "GROUP_WORLD_SIZE"), "2", "rank {rank}");
        assert_eq!(get(env, "LOCAL_WORLD_SIZE"), "2", "rank {rank}");
        assert_eq!(
            get(env, "GROUP_RANK"),
            (rank / 2).to_string(),
            "rank {rank}"
        );
        assert_eq!(
            get(env, "LOCAL_RANK"),
            (rank % 2).to_string(),
            "rank {rank}"
        );
        assert_eq!(get(env, "TORCHELASTIC_RUN_ID"), run_id, "rank {rank}");
        assert_eq!(get(env, "MASTER_ADDR"), master.0, "rank {rank}");
        assert_eq!(get(env, "MASTER_PORT"), master.1.to_string(), "rank {rank}");
    }
}

fn assert_ok(outs: &[Output]) {
    for o in outs {
        o.assert_code(0);
    }
}

/// The headline bug: `srun -N2 --ntasks-per-node=1 rdrun pe.sh` formed two worlds of
/// one node each (WORLD_SIZE=2, GROUP_RANK=0 on both; checked failing with `--cluster none`,
/// which is the behaviour before the wiring). Now the agents read the step and form one world.
#[test]
fn slurm_step_two_agents_form_one_world() {
    let dir = TempDir::new("cl_slurm2");
    let port = free_port();
    let runs: Vec<_> = (0..2)
        .map(|n| agent(&dir, &slurm_step_env(n, port), &[]).spawn())
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    assert_one_world_of_four(&records(dir.path()), "81234.0", ("localhost", port));
    // Before spawning: the full topology on node 0, one line on node 1.
    let node0 = &outs[0].stderr;
    assert!(
        node0.contains("rdrun: topology  source=slurm-step (job 81234 step 0)"),
        "{node0}"
    );
    assert!(node0.contains("(SLURM_NODEID)"), "{node0}");
    let node1 = &outs[1].stderr;
    assert!(
        node1.contains(&format!(
            "rdrun: node 1/2 -> endpoint localhost:{port} (slurm-step (job 81234 step 0)), mode node"
        )),
        "{node1}"
    );
    assert!(!node1.contains("rdrun: topology"), "{node1}");
}

/// Issue 38.6: `--nnodes 1:3` (or `2:4`) in a 2-node step waited 15 minutes for a third node on
/// the static rendezvous. The range resolves to the step's two nodes: both agents form one
/// world of four and end, node 0's topology says so in one note, node 1's line counts 2 nodes.
#[test]
fn slurm_step_with_a_node_range_runs_the_steps_nodes() {
    for range in ["1:3", "2:4"] {
        let dir = TempDir::new("cl_slurm_range");
        let port = free_port();
        let runs: Vec<_> = (0..2)
            .map(|n| agent(&dir, &slurm_step_env(n, port), &["--nnodes", range]).spawn())
            .collect();
        let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        assert_one_world_of_four(&records(dir.path()), "81234.0", ("localhost", port));
        let node0 = &outs[0].stderr;
        assert!(
            node0.contains(&format!(
                "rdrun:   nnodes           2  (--nnodes {range} within SLURM_STEP_NUM_NODES)\n"
            )),
            "{node0}"
        );
        let notes: Vec<&str> = node0
            .lines()
            .filter(|l| l.starts_with("rdrun:   note: nnodes"))
            .collect();
        assert_eq!(
            notes,
            [format!("rdrun:   note: nnodes: --nnodes {range} resolved to 2: slurm-step (job 81234 step 0) gives a fixed set of 2 nodes (SLURM_STEP_NUM_NODES), and a static rendezvous runs exactly the nodes it counts")],
            "{node0}"
        );
        assert!(
            outs[1].stderr.contains(&format!(
                "rdrun: node 1/2 -> endpoint localhost:{port} (slurm-step (job 81234 step 0)), mode node"
            )),
            "{outs:?}"
        );
    }
}

/// Control for the test above: with detection off (the old behaviour), the same environment
/// gives each agent its own world: the failure the wiring fixes.
#[test]
fn slurm_step_with_cluster_none_is_a_local_run() {
    let dir = TempDir::new("cl_slurm_none");
    let out = agent(
        &dir,
        &slurm_step_env(1, free_port()),
        &["--cluster", "none"],
    )
    .run();
    out.assert_code(0);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 1, "one local worker: {recs:#?}");
    let env = recs.values().next().expect("one record");
    assert_eq!(get(env, "WORLD_SIZE"), "1");
    assert_eq!(get(env, "GROUP_RANK"), "0");
}

/// `--dry-run` prints every field with its source and starts nothing; flags win their field;
/// `--print-topology=json` gives the same as JSON.
#[test]
fn dry_run_prints_topology_with_sources_and_starts_nothing() {
    let dir = TempDir::new("cl_dry");
    let mut env = slurm_step_env(1, 0);
    env.retain(|(k, _)| k != "SLURM_STEP_RESV_PORTS");
    let out = agent(&dir, &env, &["--dry-run"]).run();
    out.assert_code(0);
    let port = rdrun::cluster::derived_port(81234, 0);
    let want = [
        "rdrun: topology  source=slurm-step (job 81234 step 0)".to_string(),
        "rdrun:   mode             node  (SLURM_STEP_TASKS_PER_NODE: one task on this node)".into(),
        "rdrun:   nnodes           2  (SLURM_STEP_NUM_NODES)".into(),
        "rdrun:   node_rank        1  (SLURM_NODEID)".into(),
        "rdrun:   master_addr      localhost  (first host of SLURM_STEP_NODELIST)".into(),
        format!("rdrun:   master_port      {port}  (derived from SLURM_JOB_ID+SLURM_STEP_ID)"),
        "rdrun:   backend          static  (Slurm step: fixed node set)".into(),
        "rdrun:   run_id           81234.0  (SLURM_JOB_ID.SLURM_STEP_ID)".into(),
        "rdrun:   nproc_per_node   2  (SLURM_GPUS_ON_NODE)".into(),
        "rdrun:   node_list        [localhost, rdnode2]  (SLURM_STEP_NODELIST)".into(),
        "rdrun:   devices          0,1  (CUDA_VISIBLE_DEVICES)".into(),
    ];
    let lines: Vec<&str> = out.stdout.lines().collect();
    for w in &want {
        assert!(
            lines.contains(&w.as_str()),
            "{w:?} missing from:\n{}",
            out.stdout
        );
    }
    assert!(records(dir.path()).is_empty(), "nothing started");
    assert!(
        !std::fs::read_dir(dir.path())
            .expect("dir")
            .any(|e| e.is_ok()),
        "no worker file at all"
    );

    // A flag wins its field and is named as the source.
    let out = agent(
        &dir,
        &env,
        &["--print-topology=json", "--nproc-per-node", "3"],
    )
    .run();
    out.assert_code(0);
    let j: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON topology");
    assert_eq!(j["source"], "slurm-step (job 81234 step 0)");
    assert_eq!(j["fields"]["nnodes"]["value"]["max"], 2);
    assert_eq!(j["fields"]["node_rank"]["value"], 1);
    assert_eq!(j["fields"]["node_rank"]["source"], "SLURM_NODEID");
    assert_eq!(j["fields"]["master_port"]["value"], u64::from(port));
    assert_eq!(j["fields"]["nproc_per_node"]["value"], "3");
    assert_eq!(j["fields"]["nproc_per_node"]["source"], "--nproc-per-node");
    assert!(
        j["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("SLURM_GPUS_ON_NODE"))),
        "the overridden value is kept as a note: {j}"
    );
    assert!(records(dir.path()).is_empty(), "nothing started");
}

/// One line on stderr starting `rdrun: error: ` and containing `want`, exit 1, no worker.
fn assert_refused(dir: &TempDir, env: &[(String, String)], args: &[&str], want: &str) {
    let out = agent(dir, env, args).run();
    out.assert_code(1);
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
    assert!(out.stderr.starts_with("rdrun: error: "), "{}", out.stderr);
    assert!(out.stderr.contains(want), "{want:?} not in {}", out.stderr);
    assert!(records(dir.path()).is_empty(), "nothing started");
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A multi-node batch script (no step) would make rdrun node 0 of a job whose other nodes never
/// come: refused with the srun hint.
#[test]
fn batch_script_of_two_nodes_is_refused_with_the_srun_hint() {
    let dir = TempDir::new("cl_batch");
    let env = vars(&[
        ("SLURM_JOB_ID", JOB),
        ("SLURM_JOBID", JOB),
        ("SLURM_JOB_NAME", "job.sh"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_JOB_NODELIST", "localhost,rdnode2"),
        ("SLURM_NODELIST", "localhost,rdnode2"),
        ("SLURM_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_NODEID", "0"),
        ("SLURMD_NODENAME", "localhost"),
        ("ENVIRONMENT", "BATCH"),
    ]);
    assert_refused(
        &dir,
        &env,
        &[],
        "Slurm job 81234 spans 2 nodes (SLURM_JOB_NUM_NODES=2) but this is a batch script (ENVIRONMENT=BATCH), not an srun step (SLURM_STEP_NODELIST unset): the other nodes would never join; run `srun --ntasks-per-node=1 rdrun ...`",
    );
    // The same job without its variables' claim of two nodes is a one-node run, and
    // --cluster none turns detection off.
    let out = agent(&dir, &env, &["--cluster", "none", "--dry-run"]).run();
    out.assert_code(0);
    assert!(
        out.stdout.contains("source=local (no scheduler detected)"),
        "{}",
        out.stdout
    );
}

/// Contradictions are one-line errors naming the variables.
#[test]
fn contradictions_are_one_line_errors() {
    let dir = TempDir::new("cl_contra");
    let mut env = slurm_step_env(1, free_port());
    for (k, v) in env.iter_mut() {
        if k == "SLURM_NODEID" {
            *v = "2".into();
        }
    }
    assert_refused(
        &dir,
        &env,
        &[],
        "SLURM_NODEID=2 is not below the node count 2 (SLURM_STEP_NODELIST=localhost,rdnode2)",
    );
    // This node's name at another index of the node list.
    let mut env = slurm_step_env(1, free_port());
    for (k, v) in env.iter_mut() {
        if k == "SLURMD_NODENAME" {
            *v = "localhost".into();
        }
    }
    assert_refused(
        &dir,
        &env,
        &[],
        "SLURMD_NODENAME=localhost is at index 0 of SLURM_STEP_NODELIST=localhost,rdnode2, but SLURM_NODEID=1",
    );
    // A flag that contradicts the step: node rank beyond the step's node count.
    assert_refused(
        &dir,
        &slurm_step_env(1, free_port()),
        &["--node-rank", "5"],
        "node rank 5 (--node-rank) is not below the node count 2 (SLURM_STEP_NUM_NODES)",
    );
    // Several tasks per node (in-place mode): k×n oversubscription is an error.
    let env = slurm_task_env(3, free_port());
    assert_refused(
        &dir,
        &env,
        &["--nproc-per-node", "2"],
        "would start 2x2=4 workers; drop it or launch one task per node",
    );
    assert_refused(
        &dir,
        &env,
        &["--node-rank", "1"],
        "in-place mode (this rdrun is rank 3 of 4, one worker): --node-rank cannot apply",
    );
}

/// Task `task` of `srun -N2 --ntasks-per-node=2 --resv-ports` (job 81234, step 0): block
/// distribution, tasks 0,1 on the first node and 2,3 on the second.
fn slurm_task_env(task: usize, port: u16) -> Vec<(String, String)> {
    let node = task / 2;
    let mut env = slurm_step_env(node, port);
    for (k, v) in env.iter_mut() {
        match k.as_str() {
            "SLURM_STEP_TASKS_PER_NODE" | "SLURM_TASKS_PER_NODE" => *v = "2(x2)".into(),
            "SLURM_STEP_NUM_TASKS" | "SLURM_NTASKS" | "SLURM_NPROCS" => *v = "4".into(),
            "SLURM_NTASKS_PER_NODE" => *v = "2".into(),
            "SLURM_PROCID" => *v = task.to_string(),
            "SLURM_LOCALID" => *v = (task % 2).to_string(),
            _ => {}
        }
    }
    // No GPUs requested: the gres plugin sets neither variable.
    env.retain(|(k, _)| k != "SLURM_GPUS_ON_NODE" && k != "CUDA_VISIBLE_DEVICES");
    env
}

/// `srun -N2 --ntasks-per-node=2 rdrun mn_worker`: four rdruns, each one rank in place with one
/// worker; together one world of 4 with the step's ranks, the per-node values from Slurm
/// (LOCAL_RANK = SLURM_LOCALID, GROUP_RANK = SLURM_NODEID) and task 0's store as the master.
/// Before in-place mode this was refused (and before the refusal, 4×2 workers in 4 worlds).
#[test]
fn slurm_several_tasks_per_node_run_in_place() {
    let dir = TempDir::new("cl_slurm_inplace");
    let port = free_port();
    let runs: Vec<_> = (0..4)
        .map(|t| agent(&dir, &slurm_task_env(t, port), &[]).spawn())
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    assert_one_world_of_four(&recs, "81234.0", ("localhost", port));
    for env in recs.values() {
        assert_eq!(get(env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
        assert_eq!(
            get(env, "SLURM_PROCID"),
            get(env, "RANK"),
            "the task's own rank"
        );
    }
    assert!(
        outs[0].stderr.contains(
            "rdrun:   mode             in-place  (SLURM_STEP_TASKS_PER_NODE: 2 tasks on this node)"
        ),
        "{}",
        outs[0].stderr
    );
    assert!(
        outs[3].stderr.contains(&format!(
            "rdrun: rank 3/4 (local 1/2) -> endpoint localhost:{port} (slurm-step (job 81234 step 0)), mode in-place"
        )),
        "{}",
        outs[3].stderr
    );
}

/// A PyTorchJob v1 static pod's variables (training-operator): `PET_*` plus the pod-level
/// MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (node rank and node count): two pods, one world.
#[test]
fn pytorchjob_static_pods_form_one_world() {
    let dir = TempDir::new("cl_pytorchjob");
    let port = free_port();
    let pod = |rank: usize| {
        let p = port.to_string();
        let r = rank.to_string();
        vars(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("PET_MASTER_ADDR", "127.0.0.1"),
            ("PET_MASTER_PORT", &p),
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", &r),
            ("PET_NPROC_PER_NODE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &p),
            ("RANK", &r),
            ("WORLD_SIZE", "2"),
            ("PYTHONUNBUFFERED", "1"),
        ])
    };
    let runs: Vec<_> = (0..2).map(|r| agent(&dir, &pod(r), &[]).spawn()).collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    assert_ok(&outs);
    let recs = records(dir.path());
    assert_one_world_of_four(
        &recs,
        get(
            recs.values().next().expect("a record"),
            "TORCHELASTIC_RUN_ID",
        ),
        ("127.0.0.1", port),
    );
    assert!(
        outs[0]
            .stderr
            .contains("rdrun: topology  source=kubernetes pytorchjob-v1 static"),
        "{}",
        outs[0].stderr
    );
    assert!(
        outs[0].stderr.contains("(PET_NODE_RANK)"),
        "{}",
        outs[0].stderr
    );
}

/// `--hostfile` (DeepSpeed dialect): this node's rank is its hostname's position, its workers
/// the slots; `RDRUN_HOSTFILE` names the file too; a hostfile without this host is refused.
#[test]
fn hostfile_gives_node_rank_and_slots() {
    let dir = TempDir::new("cl_hostfile");
    let me = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("UTF-8 hostname");
    let hf = dir.join("hostfile");
    std::fs::write(&hf, format!("rdfirst slots=2\n{me} slots=3\n")).expect("write hostfile");
    let hf_text = hf.to_string_lossy().into_owned();
    for (args, env) in [
        (vec!["--hostfile", hf_text.as_str(), "--dry-run"], vec![]),
        (
            vec!["--dry-run"],
            vec![("RDRUN_HOSTFILE".to_string(), hf_text.clone())],
        ),
    ] {
        let out = agent(&dir, &env, &args).run();
        out.assert_code(0);
        let s = &out.stdout;
        assert!(s.contains("rdrun:   nnodes           2  (hostfile "), "{s}");
        assert!(
            s.contains("rdrun:   node_rank        1  (position of this host"),
            "{s}"
        );
        assert!(
            s.contains("rdrun:   master_addr      rdfirst  (first host"),
            "{s}"
        );
        assert!(
            s.contains("rdrun:   nproc_per_node   3  (slots of this host"),
            "{s}"
        );
    }
    std::fs::write(&hf, "rdfirst slots=2\nrdsecond\n").expect("write hostfile");
    let out = agent(&dir, &[], &["--hostfile", &hf_text]).run();
    out.assert_code(1);
    assert!(
        out.stderr
            .contains(&format!("own host {me} is missing from hostfile")),
        "{}",
        out.stderr
    );
    let workers = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("w."))
        .count();
    assert_eq!(workers, 0, "nothing started");
}

/// `--include HOST:1,3` (DeepSpeed's documented filter): this host runs 2 workers, which see
/// CUDA_VISIBLE_DEVICES=1,3 (slots are device indices); excluding this host is refused.
#[test]
fn hostfile_include_selects_this_hosts_slots_as_devices() {
    let dir = TempDir::new("cl_include");
    let me = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("UTF-8 hostname");
    let hf = dir.join("hostfile");
    std::fs::write(&hf, format!("{me} slots=4\n")).expect("write hostfile");
    let hf = hf.to_string_lossy().into_owned();
    let port = free_port().to_string();
    let include = format!("{me}:1,3");
    let out = agent(
        &dir,
        &[],
        &[
            "--hostfile",
            &hf,
            "--include",
            &include,
            "--master-port",
            &port,
        ],
    )
    .run();
    out.assert_code(0);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 2, "two slots kept: {recs:#?}");
    for env in recs.values() {
        assert_eq!(get(env, "CUDA_VISIBLE_DEVICES"), "1,3");
        assert_eq!(get(env, "WORLD_SIZE"), "2");
    }
    let out = agent(&dir, &[], &["--hostfile", &hf, "--exclude", &me]).run();
    out.assert_code(1);
    assert!(
        out.stderr
            .contains("--include/--exclude leave no host of hostfile"),
        "{}",
        out.stderr
    );
}
