//! Table tests of detection over exact scheduler environments (spec cluster.md §1–4, issue 12).
//!
//! The whole file is tests (one table per scheduler and per contradiction); its length is the
//! number of environments checked, not code.

use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn detect_on(
    pairs: &[(&str, &str)],
    host: &HostFacts<'_>,
    flags: &Fields,
) -> Result<Option<Topology>, ClusterError> {
    detect(&env(pairs), host, ClusterChoice::Auto, flags)
}

fn ok(pairs: &[(&str, &str)], hostname: &str) -> Topology {
    detect_on(pairs, &HostFacts::named(hostname), &Fields::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a topology")
}

fn err(pairs: &[(&str, &str)], hostname: &str) -> String {
    detect_on(pairs, &HostFacts::named(hostname), &Fields::default())
        .expect_err("an error")
        .0
}

fn val<T: Clone>(f: &Option<Sourced<T>>) -> (T, String) {
    let s = f.as_ref().expect("field set");
    (s.value.clone(), s.source.clone())
}

fn nn(n: usize) -> NodeCount {
    NodeCount { min: n, max: n }
}

const SLURM_NODE: &[(&str, &str)] = &[
    ("SLURM_JOB_ID", "81234"),
    ("SLURM_JOB_NODELIST", "gpu-st-p4d-[1-4]"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_STEP_NODELIST", "gpu-st-p4d-[1-4]"),
    ("SLURM_STEP_NUM_NODES", "4"),
    ("SLURM_STEP_NUM_TASKS", "4"),
    ("SLURM_STEP_TASKS_PER_NODE", "1(x4)"),
    ("SLURM_NODEID", "2"),
    ("SLURM_PROCID", "2"),
    ("SLURM_LOCALID", "0"),
    ("SLURMD_NODENAME", "gpu-st-p4d-3"),
    ("SLURM_GPUS_ON_NODE", "8"),
    ("CUDA_VISIBLE_DEVICES", "GPU-1a2b,GPU-3c4d"),
];

fn with(
    base: &[(&'static str, &'static str)],
    changes: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base
        .iter()
        .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
        .cloned()
        .collect();
    v.extend(changes.iter().filter(|(_, v)| *v != "<unset>").cloned());
    v
}

#[test]
fn slurm_step_one_task_per_node_is_node_mode() {
    let t = ok(SLURM_NODE, "gpu-st-p4d-3");
    assert_eq!(t.scheduler, "slurm-step (job 81234 step 0)");
    let f = &t.fields;
    assert_eq!(val(&f.mode).0, Mode::Node);
    assert_eq!(val(&f.nnodes), (nn(4), "SLURM_STEP_NUM_NODES".into()));
    assert_eq!(val(&f.node_rank), (2, "SLURM_NODEID".into()));
    assert_eq!(val(&f.master_addr).0, "gpu-st-p4d-1");
    assert_eq!(
        val(&f.master_port),
        (
            derived_port(81234, 0),
            "derived from SLURM_JOB_ID+SLURM_STEP_ID".into()
        )
    );
    assert_eq!(val(&f.run_id).0, "81234.0");
    assert_eq!(val(&f.nproc), ("8".into(), "SLURM_GPUS_ON_NODE".into()));
    assert_eq!(val(&f.devices).0, vec!["GPU-1a2b", "GPU-3c4d"]);
    assert!(f.rank.is_none(), "node mode sets no per-rank fields");

    let t = ok(
        &with(SLURM_NODE, &[("SLURM_STEP_RESV_PORTS", "12000-12004")]),
        "x",
    );
    assert_eq!(
        val(&t.fields.master_port),
        (12000, "SLURM_STEP_RESV_PORTS".into())
    );
    // Another step of the same job and the next job get other ports.
    assert_ne!(derived_port(81234, 0), derived_port(81234, 1));
    assert_ne!(derived_port(81234, 0), derived_port(81235, 0));
    for (j, s) in [(0, 0), (u64::MAX, u64::MAX), (4294967291, 7)] {
        assert!((10000..32768).contains(&derived_port(j, s)));
    }
}

#[test]
fn slurm_node_list_is_never_sorted() {
    let t = ok(
        &with(
            SLURM_NODE,
            &[
                ("SLURM_STEP_NODELIST", "node[3,1-2]"),
                ("SLURM_STEP_NUM_NODES", "3"),
                ("SLURM_STEP_TASKS_PER_NODE", "1(x3)"),
                ("SLURM_STEP_NUM_TASKS", "3"),
                ("SLURM_NODEID", "0"),
                ("SLURMD_NODENAME", "node3"),
            ],
        ),
        "node3",
    );
    assert_eq!(val(&t.fields.master_addr).0, "node3");
    assert_eq!(val(&t.fields.node_rank).0, 0);
}

const SLURM_INPLACE: &[(&str, &str)] = &[
    ("SLURM_JOB_ID", "900"),
    ("SLURM_STEP_ID", "3"),
    ("SLURM_STEP_NODELIST", "n[01-02]"),
    ("SLURM_STEP_NUM_NODES", "2"),
    ("SLURM_STEP_NUM_TASKS", "8"),
    ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
    ("SLURM_NODEID", "1"),
    ("SLURM_PROCID", "5"),
    ("SLURM_LOCALID", "1"),
    ("SLURMD_NODENAME", "n02"),
];

#[test]
fn slurm_step_several_tasks_per_node_is_in_place() {
    let t = ok(SLURM_INPLACE, "n02");
    let f = &t.fields;
    assert_eq!(val(&f.mode).0, Mode::InPlace);
    assert_eq!(val(&f.rank), (5, "SLURM_PROCID".into()));
    assert_eq!(val(&f.local_rank), (1, "SLURM_LOCALID".into()));
    assert_eq!(val(&f.world_size), (8, "SLURM_STEP_NUM_TASKS".into()));
    assert_eq!(
        val(&f.local_world_size),
        (4, "SLURM_STEP_TASKS_PER_NODE".into())
    );
    assert_eq!(val(&f.node_rank), (1, "SLURM_NODEID".into()));
    assert_eq!(val(&f.nproc).0, "1");
    assert_eq!(val(&f.run_id).0, "900.3");

    let flags = Fields {
        nproc: src("2".into(), "--nproc-per-node"),
        ..Fields::default()
    };
    let e = detect_on(SLURM_INPLACE, &HostFacts::named("n02"), &flags)
        .unwrap_err()
        .0;
    assert_eq!(
        e,
        "slurm-step (job 900 step 3) starts 4 tasks on this node (SLURM_STEP_TASKS_PER_NODE), each an rdrun in place; --nproc-per-node=2 would start 4x2=8 workers; drop it or launch one task per node"
    );
    let flags = Fields {
        nproc: src("1".into(), "--nproc-per-node"),
        ..Fields::default()
    };
    assert!(detect_on(SLURM_INPLACE, &HostFacts::named("n02"), &flags).is_ok());
}

#[test]
fn slurm_contradictions_are_one_line_errors() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("SLURM_NODEID", "4")], "SLURM_NODEID=4 is not below the node count 4 (SLURM_STEP_NODELIST=gpu-st-p4d-[1-4])"),
        (&[("SLURM_STEP_TASKS_PER_NODE", "2(x3),1"), ("SLURM_STEP_NUM_NODES", "<unset>"), ("SLURM_STEP_NODELIST", "a[1-3]"), ("SLURM_NODEID", "0"), ("SLURMD_NODENAME", "a1")],
         "SLURM_STEP_TASKS_PER_NODE=2(x3),1 describes 4 nodes but SLURM_STEP_NODELIST holds 3"),
        (&[("SLURMD_NODENAME", "elsewhere")], "own host SLURMD_NODENAME=elsewhere is missing from SLURM_STEP_NODELIST=gpu-st-p4d-[1-4]"),
        (&[("SLURMD_NODENAME", "gpu-st-p4d-1")], "SLURMD_NODENAME=gpu-st-p4d-1 is at index 0 of SLURM_STEP_NODELIST=gpu-st-p4d-[1-4], but SLURM_NODEID=2"),
        (&[("SLURM_STEP_NUM_NODES", "3")], "SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST=gpu-st-p4d-[1-4] holds 4 nodes"),
        (&[("SLURM_STEP_NUM_TASKS", "5")], "SLURM_STEP_TASKS_PER_NODE=1(x4) sums to 4 tasks but SLURM_STEP_NUM_TASKS=5"),
        (&[("SLURM_STEP_NODELIST", "gpu[1-4")], "SLURM_STEP_NODELIST: invalid hostlist \"gpu[1-4\": '[' without a matching ']'"),
        (&[("SLURM_NODEID", "<unset>")], "SLURM_STEP_NODELIST is set but SLURM_NODEID is not"),
        (&[("SLURM_NODEID", "x")], "SLURM_NODEID=\"x\" is not a non-negative integer"),
    ];
    for (changes, want) in cases {
        let changes: Vec<(&'static str, &'static str)> =
            changes.iter().map(|(k, v)| (leak(k), leak(v))).collect();
        assert_eq!(err(&with(SLURM_NODE, &changes), "h"), *want);
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

#[test]
fn slurm_batch_or_salloc_without_a_step() {
    let batch = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_JOB_NODELIST", "node[1-2]"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NNODES", "2"),
        ("ENVIRONMENT", "BATCH"),
        ("SLURM_JOB_NAME", "train.sh"),
    ];
    let e = err(&batch, "node1");
    assert_eq!(e, "Slurm job 77 spans 2 nodes (SLURM_JOB_NUM_NODES=2) but this is a batch script (ENVIRONMENT=BATCH), not an srun step (SLURM_STEP_NODELIST unset): the other nodes would never join; run `srun --ntasks-per-node=1 rdrun ...` (or --cluster none for a local run)");
    // The batch step's sentinel id with a node list is still not a step.
    let mut b2 = batch.to_vec();
    b2.extend([
        ("SLURM_STEP_ID", "4294967291"),
        ("SLURM_STEP_NODELIST", "node1"),
    ]);
    assert!(err(&b2, "node1").contains("batch script"));
    let salloc = [
        ("SLURM_JOB_ID", "78"),
        ("SLURM_JOB_NODELIST", "node[1-3]"),
        ("SLURM_JOB_NAME", "myalloc"),
    ];
    let e = err(&salloc, "login1");
    assert!(
        e.contains("spans 3 nodes (SLURM_JOB_NODELIST=3)")
            && e.contains("salloc")
            && e.contains("srun"),
        "{e}"
    );
    // Job name bash/interactive: the opt-out, a local run, on one node only; several nodes are
    // refused even so (salloc's default job name is "interactive").
    let optout = [
        ("SLURM_JOB_ID", "79"),
        ("SLURM_JOB_NUM_NODES", "1"),
        ("SLURM_JOB_NAME", "bash"),
    ];
    assert_eq!(
        detect_on(&optout, &HostFacts::named("login1"), &Fields::default()),
        Ok(None)
    );
    for name in ["bash", "interactive"] {
        let multi = [
            ("SLURM_JOB_ID", "79"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_JOB_NAME", name),
        ];
        let e = err(&multi, "login1");
        assert!(e.contains("spans 2 nodes") && e.contains("salloc"), "{e}");
    }
    // One node: a local run that says it is Slurm's.
    let one = [
        ("SLURM_JOB_ID", "80"),
        ("SLURM_JOB_NUM_NODES", "1"),
        ("ENVIRONMENT", "BATCH"),
        ("SLURM_GPUS_ON_NODE", "2"),
    ];
    let t = ok(&one, "node1");
    assert_eq!(t.scheduler, "slurm-allocation (job 80, one node, no step)");
    assert_eq!(val(&t.fields.nnodes), (nn(1), "SLURM_JOB_NUM_NODES".into()));
    assert_eq!(val(&t.fields.nproc).0, "2");
    assert!(t.fields.master_addr.is_none());
}

#[test]
fn slurm_interactive_step_uses_step_values() {
    let t = ok(
        &[
            ("SLURM_JOB_ID", "5"),
            ("SLURM_STEP_ID", "4294967290"),
            ("SLURM_STEP_NODELIST", "c1"),
            ("SLURM_STEP_NUM_NODES", "1"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NNODES", "2"),
        ],
        "c1",
    );
    assert_eq!(val(&t.fields.nnodes).0, nn(1));
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("interactive step on one node of a 2-node job")),
        "{:?}",
        t.notes
    );
}

#[test]
fn pytorchjob_v1_static() {
    let pods = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("PYTHONUNBUFFERED", "1"),
        ("PET_NPROC_PER_NODE", "auto"),
        ("MASTER_ADDR", "job-master-0"),
        ("PET_MASTER_ADDR", "job-master-0"),
        ("MASTER_PORT", "23456"),
        ("PET_MASTER_PORT", "23456"),
        ("RANK", "2"),
        ("PET_NODE_RANK", "2"),
        ("WORLD_SIZE", "3"),
        ("PET_NNODES", "3"),
    ];
    let t = ok(&pods, "job-worker-1");
    assert_eq!(t.scheduler, "kubernetes pytorchjob-v1 static");
    let f = &t.fields;
    assert_eq!(val(&f.node_rank), (2, "PET_NODE_RANK".into()));
    assert_eq!(val(&f.nnodes), (nn(3), "PET_NNODES".into()));
    assert_eq!(
        val(&f.master_addr),
        ("job-master-0".into(), "PET_MASTER_ADDR".into())
    );
    assert_eq!(val(&f.master_port), (23456, "PET_MASTER_PORT".into()));
    assert_eq!(val(&f.nproc), ("auto".into(), "PET_NPROC_PER_NODE".into()));
    assert_eq!(val(&f.backend).0, "static");
    // Pod-level WORLD_SIZE counts pods: never a process count.
    assert!(f.world_size.is_none());
    // Before PET_NODE_RANK (v1.7): the pod-level RANK beside PET_MASTER_ADDR.
    let old: Vec<_> = pods
        .iter()
        .filter(|(k, _)| *k != "PET_NODE_RANK")
        .cloned()
        .collect();
    assert_eq!(
        val(&ok(&old, "x").fields.node_rank),
        (2, "RANK (pod index)".into())
    );
    // A node rank past the node count is an error naming both.
    let bad = with(&pods, &[("PET_NODE_RANK", "3")]);
    assert_eq!(
        err(&bad, "x"),
        "node rank 3 (PET_NODE_RANK) is not below the node count 3 (PET_NNODES)"
    );
}

#[test]
fn pytorchjob_v1_elastic_with_operator_quirks() {
    let t = ok(
        &[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("PET_NNODES", "2:4"),
            ("PET_RDZV_ENDPOINT", "job-worker-0:23456"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_RDZV_ID", "job"),
            ("PET_N_PROC_PER_NODE", "2"),
            ("PET_STANDALONE", ""),
            ("PET_MAX_RESTARTS", "3"),
        ],
        "job-worker-1",
    );
    assert_eq!(t.scheduler, "kubernetes pytorchjob-v1 elastic");
    let f = &t.fields;
    assert_eq!(val(&f.nnodes).0, NodeCount { min: 2, max: 4 });
    assert!(
        f.node_rank.is_none(),
        "elastic: ranks come from the rendezvous"
    );
    assert_eq!(val(&f.master_addr).0, "job-worker-0");
    assert_eq!(val(&f.master_port).0, 23456);
    assert_eq!(val(&f.backend), ("c10d".into(), "PET_RDZV_BACKEND".into()));
    assert_eq!(val(&f.run_id).0, "job");
    assert_eq!(val(&f.nproc), ("2".into(), "PET_N_PROC_PER_NODE".into()));
    assert!(val(&f.standalone).0);
    assert!(t.notes.iter().any(|n| n.contains("typo")));
}

#[test]
fn trainer_v2() {
    let t = ok(
        &[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "auto"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
            ("PET_MASTER_PORT", "29500"),
        ],
        "tj-node-0-1",
    );
    assert_eq!(t.scheduler, "kubernetes trainer-v2");
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(val(&t.fields.master_addr).0, "tj-node-0-0.tj");
}

#[test]
fn jobset_and_indexed_job() {
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("JOB_COMPLETION_INDEX", "1"),
    ];
    let host = HostFacts {
        fqdn: Some("js-workers-0-1.js.default.svc.cluster.local".into()),
        ..HostFacts::named("js-workers-0-1")
    };
    let e = detect_on(&pod, &host, &Fields::default()).unwrap_err().0;
    assert_eq!(
        e,
        "kubernetes jobset: the node count is in no variable; pass --nnodes (or RDRUN_NNODES)"
    );
    let flags = Fields {
        nnodes: src(nn(2), "--nnodes"),
        ..Fields::default()
    };
    let t = detect_on(&pod, &host, &flags).unwrap().unwrap();
    assert_eq!(t.scheduler, "kubernetes jobset");
    assert_eq!(val(&t.fields.node_rank), (1, "JOB_COMPLETION_INDEX".into()));
    assert_eq!(val(&t.fields.nnodes), (nn(2), "--nnodes".into()));
    assert_eq!(
        val(&t.fields.master_addr).0,
        "js-workers-0-0.js.default.svc.cluster.local"
    );
    assert_eq!(val(&t.fields.master_port).0, 29500);

    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("JOB_COMPLETION_INDEX", "3"),
        ("RDRUN_NNODES", "4"),
    ];
    let t = ok(&pod, "train-3");
    assert_eq!(t.scheduler, "kubernetes indexed-job");
    assert_eq!(val(&t.fields.master_addr).0, "train-0");
    assert_eq!(val(&t.fields.nnodes), (nn(4), "RDRUN_NNODES".into()));
    assert_eq!(
        err(&pod, "other-pod"),
        "JOB_COMPLETION_INDEX=3 but hostname other-pod does not end in -3 (Indexed Job pods are <job>-<index>)"
    );
    assert!(err(
        &[
            ("KUBERNETES_SERVICE_HOST", "x"),
            ("JOB_COMPLETION_INDEX", "0")
        ],
        "js-w-1-0"
    )
    .contains("child Job 1"));
}

#[test]
fn volcano() {
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("VC_TASK_INDEX", "1"),
        ("VK_TASK_INDEX", "1"),
        ("VC_MASTER_HOSTS", "vj-master-0.vj"),
        ("VC_MASTER_NUM", "1"),
        ("VC_WORKER_HOSTS", "vj-worker-0.vj,vj-worker-1.vj"),
        ("VC_WORKER_NUM", "2"),
        ("MASTER_ADDR", "vj-master-0.vj"),
        ("MASTER_PORT", "23456"),
        ("RANK", "2"),
        ("WORLD_SIZE", "3"),
    ];
    let t = ok(&pod, "vj-worker-1");
    assert_eq!(t.scheduler, "kubernetes volcano");
    let f = &t.fields;
    assert_eq!(
        val(&f.node_rank),
        (
            2,
            "position of vj-worker-1 in VC_MASTER_HOSTS+VC_WORKER_HOSTS".into()
        )
    );
    assert_eq!(val(&f.nnodes).0, nn(3));
    assert_eq!(
        val(&f.master_addr),
        ("vj-master-0.vj".into(), "MASTER_ADDR".into())
    );
    assert_eq!(val(&f.master_port), (23456, "MASTER_PORT".into()));
    assert_eq!(val(&f.node_list).0.len(), 3);
    assert_eq!(
        err(&pod, "vj-worker-7"),
        "own host vj-worker-7 is missing from VC_MASTER_HOSTS+VC_WORKER_HOSTS"
    );
    assert_eq!(
        err(&with(&pod, &[("VC_WORKER_NUM", "3")]), "vj-worker-1"),
        "VC_WORKER_NUM=3 but VC_WORKER_HOSTS lists 2 hosts"
    );
}

const OMPI_ONE_HOST: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "2"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ("OMPI_COMM_WORLD_NODE_RANK", "2"),
];

#[test]
fn mpi_on_one_host_needs_no_endpoint() {
    let host = HostFacts {
        ppid: Some(4242),
        ..HostFacts::named("box")
    };
    let t = detect_on(OMPI_ONE_HOST, &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(t.scheduler, "mpi openmpi");
    let f = &t.fields;
    assert_eq!(val(&f.mode).0, Mode::InPlace);
    assert_eq!(val(&f.rank), (2, "OMPI_COMM_WORLD_RANK".into()));
    assert_eq!(val(&f.world_size).0, 4);
    assert_eq!(val(&f.local_world_size).0, 4);
    assert_eq!(val(&f.nnodes).0, nn(1));
    assert_eq!(val(&f.master_addr).0, "127.0.0.1");
    assert_eq!(
        val(&f.master_port),
        (
            derived_port(4242, 0),
            "derived from parent pid (the MPI launcher)".into()
        )
    );
    // Every rank of the job derives the same port from the job id when there is one.
    let with_job = with(OMPI_ONE_HOST, &[("OMPI_MCA_ess_base_jobid", "3045457921")]);
    let a = detect_on(&with_job, &host, &Fields::default())
        .unwrap()
        .unwrap();
    let b = detect_on(&with_job, &HostFacts::named("box"), &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(a.fields.master_port, b.fields.master_port);
    assert_eq!(
        val(&a.fields.master_port).1,
        "derived from OMPI_MCA_ess_base_jobid"
    );
}

#[test]
fn mpi_across_hosts() {
    let two = with(
        OMPI_ONE_HOST,
        &[("OMPI_COMM_WORLD_SIZE", "8"), ("OMPI_COMM_WORLD_RANK", "6")],
    );
    assert_eq!(err(&two, "hB"), "mpi openmpi: a multi-node job but no endpoint in the environment; pass --rdzv-endpoint (or RDRUN_RDZV_ENDPOINT)");
    // LSF supplies the host list: MPI keeps the ranks, LSF gives endpoint and node rank.
    let lsf = with(
        &two,
        &[("LSB_JOBID", "55"), ("LSB_MCPU_HOSTS", "hA 4 hB 4")],
    );
    let t = ok(&lsf, "hB");
    assert_eq!(t.scheduler, "mpi openmpi");
    assert_eq!(val(&t.fields.rank).0, 6);
    assert_eq!(
        val(&t.fields.node_rank),
        (1, "position of this host in LSB_MCPU_HOSTS".into())
    );
    assert_eq!(
        val(&t.fields.master_addr),
        ("hA".into(), "first host of LSB_MCPU_HOSTS".into())
    );
    // An explicit endpoint suffices.
    let flags = Fields {
        master_addr: src("10.0.0.5".into(), "--rdzv-endpoint"),
        ..Fields::default()
    };
    assert!(detect_on(&two, &HostFacts::named("hB"), &flags).is_ok());
    // One rank per host: node mode with node rank = rank.
    let per_host = [
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "0"),
        ("MPI_LOCALNRANKS", "1"),
        ("RDRUN_RDZV_ENDPOINT", "h0:29400"),
    ];
    let t = ok(&per_host, "h1");
    assert_eq!(t.scheduler, "mpi mpich");
    assert_eq!(val(&t.fields.mode).0, Mode::Node);
    assert_eq!(val(&t.fields.node_rank), (1, "PMI_RANK".into()));
    assert_eq!(val(&t.fields.nnodes), (nn(2), "PMI_SIZE".into()));
    assert_eq!(
        val(&t.fields.master_port),
        (29400, "RDRUN_RDZV_ENDPOINT".into())
    );
    assert_eq!(err(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")], "h"), "PMI_RANK/PMI_SIZE without MPI_LOCALRANKID/MPI_LOCALNRANKS: cannot tell how many ranks share this host");
    let mv = [
        ("MV2_COMM_WORLD_RANK", "0"),
        ("MV2_COMM_WORLD_SIZE", "2"),
        ("MV2_COMM_WORLD_LOCAL_RANK", "0"),
        ("MV2_COMM_WORLD_LOCAL_SIZE", "2"),
    ];
    let host = HostFacts {
        ppid: Some(9),
        ..HostFacts::named("h")
    };
    assert_eq!(
        detect_on(&mv, &host, &Fields::default())
            .unwrap()
            .unwrap()
            .scheduler,
        "mpi mvapich2"
    );
}

#[test]
fn innermost_launcher_wins() {
    // mpirun inside an allocation: the Slurm step describes the orteds (1 per node), MPI the ranks.
    let mut e = with(SLURM_NODE, &[]);
    e.extend([
        ("OMPI_COMM_WORLD_RANK", "9"),
        ("OMPI_COMM_WORLD_SIZE", "16"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ]);
    let t = ok(&e, "gpu-st-p4d-3");
    assert_eq!(t.scheduler, "mpi openmpi");
    assert_eq!(val(&t.fields.mode).0, Mode::InPlace);
    assert_eq!(val(&t.fields.rank).0, 9);
    assert_eq!(val(&t.fields.node_rank), (2, "SLURM_NODEID".into()));
    assert_eq!(val(&t.fields.master_addr).0, "gpu-st-p4d-1");
    assert!(
        t.notes
            .iter()
            .any(|n| n.starts_with("mode: in-place (OMPI_COMM_WORLD_LOCAL_SIZE=4) overrides node")),
        "{:?}",
        t.notes
    );
    // srun --mpi=pmi2: PMI_* equal the step's own ids, one launcher: the Slurm layer.
    let mut e = with(SLURM_INPLACE, &[]);
    e.extend([("PMI_RANK", "5"), ("PMI_SIZE", "8")]);
    assert_eq!(ok(&e, "n02").scheduler, "slurm-step (job 900 step 3)");
    // Slurm running in pods: the Slurm step beats the pod variables.
    let mut e = with(SLURM_NODE, &[]);
    e.extend([
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("MASTER_ADDR", "pod-0"),
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
    ]);
    let t = ok(&e, "gpu-st-p4d-3");
    assert_eq!(t.scheduler, "slurm-step (job 81234 step 0)");
    assert_eq!(val(&t.fields.master_addr).0, "gpu-st-p4d-1");
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("overrides pod-0 (MASTER_ADDR)")),
        "{:?}",
        t.notes
    );
}

#[test]
fn flags_then_rdrun_env_win_every_field() {
    let mut e = with(SLURM_NODE, &[]);
    e.push(("RDRUN_NODE_RANK", "1"));
    e.push(("RDRUN_RDZV_ENDPOINT", "[fd00::1]:29400"));
    let flags = Fields {
        node_rank: src(3, "--node-rank"),
        ..Fields::default()
    };
    let t = detect_on(&e, &HostFacts::named("h"), &flags)
        .unwrap()
        .unwrap();
    assert_eq!(val(&t.fields.node_rank), (3, "--node-rank".into()));
    assert_eq!(
        val(&t.fields.master_addr),
        ("fd00::1".into(), "RDRUN_RDZV_ENDPOINT".into())
    );
    assert_eq!(val(&t.fields.master_port).0, 29400);
    assert_eq!(
        val(&t.fields.nnodes).0,
        nn(4),
        "unset fields still come from Slurm"
    );
    assert!(
        t.notes
            .contains(&"node_rank: 3 (--node-rank) overrides 1 (RDRUN_NODE_RANK)".to_string()),
        "{:?}",
        t.notes
    );
    assert!(
        t.notes
            .contains(&"node_rank: 3 (--node-rank) overrides 2 (SLURM_NODEID)".to_string()),
        "{:?}",
        t.notes
    );
    assert_eq!(
        err(&[("RDRUN_NNODES", "2:1"), ("SLURM_JOB_ID", "1")], "h"),
        "RDRUN_NNODES=\"2:1\" is not N or MIN:MAX"
    );
}

#[test]
fn cluster_choice_forces_or_turns_off() {
    let e = env(SLURM_NODE);
    let h = HostFacts::named("gpu-st-p4d-3");
    assert_eq!(
        detect(&e, &h, ClusterChoice::None, &Fields::default()),
        Ok(None)
    );
    assert!(detect(&e, &h, ClusterChoice::Slurm, &Fields::default())
        .unwrap()
        .is_some());
    assert_eq!(
        detect(&e, &h, ClusterChoice::Mpi, &Fields::default()).unwrap_err().0,
        "--cluster mpi: no mpi environment found (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or MV2_COMM_WORLD_SIZE)"
    );
    assert_eq!(
        detect(&env(&[]), &h, ClusterChoice::Auto, &Fields::default()),
        Ok(None)
    );
    assert_eq!(
        ClusterChoice::resolve(None, &env(&[("RDRUN_CLUSTER", "lsf")])),
        Ok(ClusterChoice::Lsf)
    );
    assert_eq!(
        ClusterChoice::resolve(Some("none"), &env(&[("RDRUN_CLUSTER", "lsf")])),
        Ok(ClusterChoice::None)
    );
    assert_eq!(
        ClusterChoice::resolve(None, &env(&[])),
        Ok(ClusterChoice::Auto)
    );
    assert!(ClusterChoice::parse("pbs")
        .unwrap_err()
        .0
        .contains("\"pbs\" is not one of auto, none"));
    // A forced choice ignores the other schedulers: a multi-node batch context does not matter
    // to --cluster mpi.
    let both = env(&[
        ("SLURM_JOB_ID", "1"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "1"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ("PMIX_NAMESPACE", "prterun-x-1@1"),
    ]);
    assert!(detect(&both, &h, ClusterChoice::Auto, &Fields::default()).is_err());
    assert!(detect(&both, &h, ClusterChoice::Mpi, &Fields::default())
        .unwrap()
        .is_some());
}

#[test]
fn lsf_host_lists() {
    let e = [("LSB_JOBID", "1234"), ("LSB_HOSTS", "batch1 hA hA hB hB")];
    let t = ok(&e, "hB.example.org");
    assert_eq!(t.scheduler, "lsf (job 1234)");
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(val(&t.fields.nnodes), (nn(2), "LSB_HOSTS".into()));
    assert_eq!(val(&t.fields.node_list).0, vec!["hA", "hB"]);
    assert!(t
        .notes
        .iter()
        .any(|n| n.contains("dropped launch node batch1")));
    assert_eq!(err(&e, "hC"), "own host hC is missing from LSB_HOSTS");
    assert!(err(&[("LSB_JOBID", "1"), ("LSB_MCPU_HOSTS", "hA 4 hB")], "hA").contains("pairs"));
    let files = |p: &str| {
        if p == "/lsf/hosts" {
            Ok("hA\nhA\nhB\n".to_string())
        } else {
            Err(format!("{p}: no such file"))
        }
    };
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("hA")
    };
    let t = detect_on(
        &[("LSB_JOBID", "1"), ("LSB_DJOB_HOSTFILE", "/lsf/hosts")],
        &host,
        &Fields::default(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 0);
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
}

#[test]
fn hostfiles_in_both_dialects() {
    let files = |p: &str| {
        match p {
        "/hf" => Ok("# DeepSpeed and Open MPI lines\nworker-0 slots=4\nworker-1:2 // comment\n\nworker-2 slots=2 max_slots=8\nworker-0 slots=4\n".to_string()),
        "/bad" => Ok("worker-0 slots=x\n".to_string()),
        p => Err(format!("{p}: no such file")),
    }
    };
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("worker-1")
    };
    let t = detect_on(&[("RDRUN_HOSTFILE", "/hf")], &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(t.scheduler, "hostfile (/hf)");
    let f = &t.fields;
    assert_eq!(val(&f.node_rank).0, 1);
    assert_eq!(val(&f.nnodes).0, nn(3));
    assert_eq!(val(&f.master_addr).0, "worker-0");
    assert_eq!(
        val(&f.nproc),
        (
            "2".into(),
            "slots of this host in hostfile /hf (RDRUN_HOSTFILE)".into()
        )
    );
    assert!(t
        .notes
        .iter()
        .any(|n| n.contains("worker-0 listed more than once")));
    // Matched by a local address; two matches are an error naming both.
    let host = HostFacts {
        read_file: &files,
        addresses: vec!["worker-2".into(), "worker-0".into()],
        ..HostFacts::named("box")
    };
    let e = detect_on(
        &[("OMPI_MCA_orte_default_hostfile", "/hf")],
        &host,
        &Fields::default(),
    )
    .unwrap_err()
    .0;
    assert_eq!(e, "hostfile /hf (OMPI_MCA_orte_default_hostfile): this host (box) matches several entries: worker-0, worker-2");
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("worker-0")
    };
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/bad")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "/bad:1: bad slot count in \"worker-0 slots=x\""
    );
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/none")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "hostfile /none (RDRUN_HOSTFILE): /none: no such file"
    );
    let flags = Fields {
        hostfile: src("/hf".into(), "--hostfile"),
        ..Fields::default()
    };
    let t = detect_on(&[], &host, &flags).unwrap().unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 0);
}

#[test]
fn render_text_and_json_name_every_source() {
    let t = ok(SLURM_NODE, "gpu-st-p4d-3");
    let text = render::text(&t);
    assert!(
        text.starts_with("rdrun: topology  source=slurm-step (job 81234 step 0)\n"),
        "{text}"
    );
    assert!(
        text.contains("rdrun:   node_rank        2  (SLURM_NODEID)\n"),
        "{text}"
    );
    assert!(
        text.contains("rdrun:   nnodes           4  (SLURM_STEP_NUM_NODES)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "rdrun:   master_addr      gpu-st-p4d-1  (first host of SLURM_STEP_NODELIST)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "rdrun:   node_list        [gpu-st-p4d-1, gpu-st-p4d-2, gpu-st-p4d-3, gpu-st-p4d-4]"
        ),
        "{text}"
    );
    assert_eq!(
        render::one_line(&t),
        format!("rdrun: node 2/4 -> endpoint gpu-st-p4d-1:{} (slurm-step (job 81234 step 0)), mode node", derived_port(81234, 0))
    );
    let j = render::json(&t);
    assert_eq!(j["source"], "slurm-step (job 81234 step 0)");
    assert_eq!(j["fields"]["node_rank"]["value"], 2);
    assert_eq!(j["fields"]["node_rank"]["source"], "SLURM_NODEID");
    assert_eq!(j["fields"]["nnodes"]["value"]["max"], 4);
    assert_eq!(j["fields"]["node_list"]["value"][3], "gpu-st-p4d-4");
    assert_eq!(j["fields"]["devices"]["value"][0], "GPU-1a2b");
    assert_eq!(j["fields"]["mode"]["value"], "node");
    assert!(j["fields"].get("rank").is_none());
}

#[test]
fn srun_pmi2_one_task_per_node_is_the_slurm_step() {
    let mut e = with(SLURM_NODE, &[]);
    e.extend([("PMI_RANK", "2"), ("PMI_SIZE", "4"), ("PMI_FD", "5")]);
    let t = ok(&e, "gpu-st-p4d-3");
    assert_eq!(t.scheduler, "slurm-step (job 81234 step 0)");
    assert!(t.fields.rank.is_none());
    // PMI ids that are not the step's, with no local size: refused, not guessed.
    let mut e = with(SLURM_NODE, &[]);
    e.extend([("PMI_RANK", "7"), ("PMI_SIZE", "16")]);
    assert!(err(&e, "gpu-st-p4d-3").contains("differ from the Slurm step's"));
}

#[test]
fn pet_typed_by_hand_is_not_a_cluster() {
    // torchrun's own PET_* fallback on a workstation: nothing detected, cli/config handle it.
    let e = [("PET_NNODES", "2"), ("PET_NODE_RANK", "1")];
    assert_eq!(
        detect_on(&e, &HostFacts::named("ws"), &Fields::default()),
        Ok(None)
    );
    // ...but it still wins over a detected scheduler's value.
    let mut s = with(SLURM_NODE, &[]);
    s.push(("PET_NODE_RANK", "1"));
    assert_eq!(
        val(&ok(&s, "h").fields.node_rank),
        (1, "PET_NODE_RANK".into())
    );
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    const VARS: &[&str] = &[
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_NUM_NODES",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURMD_NODENAME",
        "SLURM_JOB_NUM_NODES",
        "SLURM_STEP_RESV_PORTS",
        "KUBERNETES_SERVICE_HOST",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_RDZV_ENDPOINT",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "JOB_COMPLETION_INDEX",
        "VC_TASK_INDEX",
        "VC_W_HOSTS",
        "VC_W_NUM",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "LSB_JOBID",
        "LSB_HOSTS",
        "LSB_MCPU_HOSTS",
        "RDRUN_NNODES",
        "RDRUN_NODE_RANK",
        "RDRUN_RDZV_ENDPOINT",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u32..6).prop_map(|n| n.to_string()),
            Just("h0".to_string()),
            Just("h[0-2]".to_string()),
            Just("2(x2)".to_string()),
            Just("h0 2 h1".to_string()),
            Just("[::1]:1".to_string()),
            "[a-z0-9\\[\\],:()x -]{0,10}",
        ]
    }

    proptest! {
        /// Any mix of scheduler variables gives a topology or a one-line error, never a panic.
        #[test]
        fn detect_is_total(pairs in prop::collection::vec((prop::sample::select(VARS), value()), 0..12),
                           host in prop::sample::select(vec!["h0", "h1", "h-1", "x"])) {
            let e: BTreeMap<String, String> = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let h = HostFacts { ppid: Some(1), ..HostFacts::named(host) };
            match detect(&e, &h, ClusterChoice::Auto, &Fields::default()) {
                Ok(Some(t)) => {
                    let _ = render::text(&t);
                    let _ = render::json(&t);
                }
                Ok(None) => {}
                Err(err) => prop_assert!(!err.0.contains('\n'), "{}", err.0),
            }
        }
    }
}

#[test]
fn deepspeed_documented_include_exclude() {
    use readers::resource_filter as rf;
    let hosts = vec![("worker-0".to_string(), 4), ("worker-1".to_string(), 4)];
    let m = |v: &[(&str, &[usize])]| {
        v.iter()
            .map(|(h, s)| (h.to_string(), s.to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rf(&hosts, Some("worker-0@worker-1:0,2"), None).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3]), ("worker-1", &[0, 2])])
    );
    assert_eq!(
        rf(&hosts, None, Some("worker-1:0")).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3]), ("worker-1", &[1, 2, 3])])
    );
    assert_eq!(
        rf(&hosts, None, Some("worker-1")).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3])])
    );
    assert_eq!(
        rf(&hosts, Some("worker-1:0@worker-1:2"), None).unwrap(),
        m(&[("worker-1", &[0, 2])])
    );
    assert_eq!(
        rf(&hosts, Some("worker-2"), None).unwrap_err().0,
        "--include \"worker-2\": host \"worker-2\" is not in the hostfile"
    );
    assert_eq!(
        rf(&hosts, Some("worker-1:9"), None).unwrap_err().0,
        "--include \"worker-1:9\": No slot '9' specified on host 'worker-1'"
    );
    assert!(rf(&hosts, Some("worker-0"), Some("worker-1"))
        .unwrap_err()
        .0
        .contains("mutually exclusive"));
    assert_eq!(rf(&hosts, None, None).unwrap().len(), 2);
}

#[test]
fn nested_launch_is_refused_unless_allowed() {
    let e = env(&[("TORCHELASTIC_RUN_ID", "abc")]);
    assert_eq!(
        nested_guard(&e, false).unwrap_err().0,
        "rdrun was started by a torchrun/rdrun worker (TORCHELASTIC_RUN_ID=abc); a nested launch forms its own world; pass --nested if that is intended"
    );
    assert!(nested_guard(&e, true).is_ok());
    assert!(nested_guard(&env(&[]), false).is_ok());
}

#[test]
fn in_place_node_identity_from_exchanged_hostnames() {
    let hosts = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // --map-by node: ranks alternate hosts; node 0 is rank 0's host.
    let h = hosts(&["b", "a", "b", "a"]);
    let id = |r| node_of(&h, r).expect("listed");
    assert_eq!(
        id(0),
        NodeIdentity {
            group_rank: 0,
            group_world_size: 2,
            ranks_here: 2
        }
    );
    assert_eq!(id(3).group_rank, 1);
    assert_eq!(id(2).group_rank, 0);
    assert_eq!(node_of(&h, 4), None);
    // One host: one node.
    let one = hosts(&["x", "x", "x"]);
    assert_eq!(
        node_of(&one, 2).map(|i| (i.group_rank, i.group_world_size, i.ranks_here)),
        Some((0, 1, 3))
    );
    // A hostfile gives the endpoint but not the node index (it may list hosts the job does not
    // use); the exchange decides.
    let e = with(
        OMPI_ONE_HOST,
        &[
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_RANK", "6"),
            ("OMPI_MCA_orte_default_hostfile", "/hf"),
        ],
    );
    let read = |_: &str| Ok("hA slots=4\nhB slots=4\nhC slots=4\n".to_string());
    let host = HostFacts {
        read_file: &read,
        ..HostFacts::named("hB")
    };
    let t = detect_on(&e, &host, &Fields::default())
        .expect("detects")
        .expect("a topology");
    assert_eq!(val(&t.fields.mode).0, Mode::InPlace);
    assert_eq!(t.fields.node_rank, None);
    assert_eq!(t.fields.nnodes, None);
    assert_eq!(val(&t.fields.master_addr).0, "hA");
    assert!(
        t.notes
            .iter()
            .any(|n| n.starts_with("group_rank: from the hostnames")),
        "{:?}",
        t.notes
    );
}

#[test]
fn hostfile_filters_with_deepspeeds_documented_semantics() {
    let read = |_: &str| Ok("worker-0 slots=4\nworker-1 slots=4\n".to_string());
    let on = |me: &'static str| HostFacts {
        read_file: &read,
        ..HostFacts::named(me)
    };
    let flags = |inc: Option<&str>, exc: Option<&str>| Fields {
        hostfile: src("/hf".into(), "--hostfile"),
        include: inc.and_then(|v| src(v.to_string(), "--include")),
        exclude: exc.and_then(|v| src(v.to_string(), "--exclude")),
        ..Fields::default()
    };
    let run = |me, inc, exc| detect_on(&[], &on(me), &flags(inc, exc));
    // -i "worker-0@worker-1:0,2": worker-0 whole, worker-1 slots 0 and 2 (DeepSpeed's CLI would
    // drop worker-0 since PR #6530).
    let t = run("worker-1", Some("worker-0@worker-1:0,2"), None)
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(
        val(&t.fields.nproc),
        ("2".into(), readers::FILTER_DEVICES.into())
    );
    assert_eq!(val(&t.fields.devices).0, vec!["0".to_string(), "2".into()]);
    let t = run("worker-0", Some("worker-0@worker-1:0,2"), None)
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.devices).0, vec!["0", "1", "2", "3"]);
    // -e worker-0: worker-1 alone is node 0 and the endpoint.
    let t = run("worker-1", None, Some("worker-0"))
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.nnodes).0, nn(1));
    assert_eq!(val(&t.fields.node_rank).0, 0);
    assert_eq!(val(&t.fields.master_addr).0, "worker-1");
    // -e "worker-1:0": slots 1,2,3 there.
    let t = run("worker-1", None, Some("worker-1:0"))
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.devices).0, vec!["1", "2", "3"]);
    // Errors: an excluded host, an unknown host or slot, both filters, a filter without a hostfile.
    let e = run("worker-1", None, Some("worker-1")).unwrap_err().0;
    assert_eq!(e, "this host (worker-1) is left out of hostfile /hf (--hostfile) by --exclude: it takes no part in the job; start rdrun only on worker-0");
    let e = run("worker-0", Some("worker-2"), None).unwrap_err().0;
    assert_eq!(
        e,
        "--include \"worker-2\": host \"worker-2\" is not in the hostfile"
    );
    let e = run("worker-0", Some("worker-1:9"), None).unwrap_err().0;
    assert_eq!(
        e,
        "--include \"worker-1:9\": No slot '9' specified on host 'worker-1'"
    );
    let e = run("worker-0", Some("worker-0"), Some("worker-1"))
        .unwrap_err()
        .0;
    assert_eq!(e, "--include and --exclude are mutually exclusive");
    let no_file = Fields {
        include: src("a".into(), "--include"),
        ..Fields::default()
    };
    let e = detect_on(&[], &HostFacts::named("x"), &no_file)
        .unwrap_err()
        .0;
    assert!(
        e.starts_with("--include/--exclude filter a hostfile's hosts, and no hostfile is named"),
        "{e}"
    );
    let bare = |_: &str| Ok("worker-0\nworker-1 slots=2\n".to_string());
    let host = HostFacts {
        read_file: &bare,
        ..HostFacts::named("worker-1")
    };
    let e = detect_on(&[], &host, &flags(Some("worker-1:0"), None))
        .unwrap_err()
        .0;
    assert_eq!(e, "--include/--exclude select slots, but worker-0 has no slots=N in hostfile /hf (--hostfile)");
}

/// An IPv6-only cluster's hostfile of bare address literals (one bracketed): this host is the
/// entry assigned to one of its interfaces (compared as addresses, not text), MASTER_ADDR is the
/// first literal without brackets, and the one-line summary brackets the endpoint. Before, no
/// interface address was ever consulted ("own host ... is missing").
#[test]
fn hostfile_of_ipv6_literals_matches_this_hosts_address() {
    let files = |p: &str| match p {
        "/hf6" => Ok("fd00:231::1 slots=1\n[fd00:231::2] slots=1\n".to_string()),
        p => Err(format!("{p}: no such file")),
    };
    let mine: std::net::IpAddr = "fd00:231:0:0::2".parse().unwrap();
    let local = move |ip: std::net::IpAddr| ip == mine;
    let host = HostFacts {
        read_file: &files,
        is_local_ip: &local,
        ..HostFacts::named("v6-worker-1")
    };
    let t = detect_on(&[("RDRUN_HOSTFILE", "/hf6")], &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
    assert_eq!(val(&t.fields.master_addr).0, "fd00:231::1");
    assert_eq!(
        render::one_line(&t),
        "rdrun: node 1/2 -> endpoint [fd00:231::1]:29500 (hostfile (/hf6)), mode node"
    );
    // Not this machine's address: still missing, with the usual error.
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("v6-worker-1")
    };
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/hf6")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "own host v6-worker-1 is missing from hostfile /hf6 (RDRUN_HOSTFILE)"
    );
    assert_eq!(host_port("fd00::1", "1"), "[fd00::1]:1");
    assert_eq!(host_port("[fd00::1]", "1"), "[fd00::1]:1");
    assert_eq!(host_port("n1", "1"), "n1:1");
    assert_eq!(host_port("10.0.0.1", "1"), "10.0.0.1:1");
}
