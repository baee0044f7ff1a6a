//! Detection tests: Slurm steps (node and in-place mode), batch/salloc contexts, `srun --mpi=pmi2`.

use super::*;

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
