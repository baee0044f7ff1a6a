//! Table tests of detection over exact scheduler environments (spec cluster.md §1–4, issue 12).
//!
//! One file per scheduler's reader (`slurm`, `kubernetes`, `mpi`, `lsf`, `hostfile`); here the
//! shared fixtures and the tests across readers: precedence, `--cluster`, rendering, nesting,
//! in-place node identity, and that no environment makes detection panic.

use super::*;

mod hostfile;
mod kubernetes;
mod lsf;
mod mpi;
mod slurm;

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

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

const OMPI_ONE_HOST: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "2"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ("OMPI_COMM_WORLD_NODE_RANK", "2"),
];

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
