//! Detection tests: PyTorchJob v1 (static, elastic), Trainer v2, JobSet/Indexed Job, Volcano.

use super::*;

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
