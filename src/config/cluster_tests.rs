//! Tests of config/cluster.rs (detection applied to the launch, in-place mode, the printed plan).

use super::super::testkit::*;
use super::super::*;
use super::TopologyFormat;
use crate::cli::{parse_from, Invocation};

/// Parses `argv` with `env` as the process environment (so `PET_*` defaults apply) and
/// resolves it against a fake machine.
fn launch(argv: &[&str], env: &[(&str, &str)]) -> Result<LaunchConfig, ConfigError> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let lookup = env_of(env);
    let Ok(Invocation::Launch(a)) = parse_from(&argv, &lookup) else {
        panic!("parses");
    };
    resolve_with(*a, &lookup, &FakeHost::new())
}

/// Node 1 of a 2-node srun step with one task per node and 2 GPUs per node.
const STEP: &[(&str, &str)] = &[
    ("SLURM_JOB_ID", "81234"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_NNODES", "2"),
    ("SLURM_STEP_NUM_NODES", "2"),
    ("SLURM_STEP_NODELIST", "n[1-2]"),
    ("SLURMD_NODENAME", "n2"),
    ("SLURM_NODEID", "1"),
    ("SLURM_PROCID", "1"),
    ("SLURM_NTASKS", "2"),
    ("SLURM_STEP_NUM_TASKS", "2"),
    ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
    ("SLURM_STEP_RESV_PORTS", "12001-12002"),
    ("SLURM_GPUS_ON_NODE", "2"),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut env: Vec<_> = STEP
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    env.extend_from_slice(extra);
    env
}

#[test]
fn slurm_step_fills_the_launch() {
    let c = launch(&["t.py"], STEP).expect("resolves");
    assert_eq!(c.nnodes, NodeRange { min: 2, max: 2 });
    assert_eq!(c.node_rank, 1);
    assert_eq!(c.nproc_per_node, 2);
    assert!(!c.standalone);
    assert_eq!(c.rdzv.backend, RdzvBackend::Static);
    assert_eq!(c.rdzv.run_id, "81234.0");
    assert_eq!(
        c.rdzv.endpoint,
        Some(Endpoint {
            host: "n1".into(),
            port: 12001
        })
    );
    assert_eq!((c.master_addr.as_str(), c.master_port), ("n1", Some(12001)));
    assert!(c.cluster.detected);
    assert_eq!(c.cluster.dry_run, None);
    let banner = c
        .cluster
        .banner()
        .expect("a detected run prints its topology");
    assert_eq!(
        banner,
        "rdrun: node 1/2 -> endpoint n1:12001 (slurm-step (job 81234 step 0)), mode node\n"
    );
    // Node 0 prints the full block.
    let c = launch(
        &["t.py"],
        &with(&[("SLURM_NODEID", "0"), ("SLURMD_NODENAME", "n1")]),
    )
    .expect("resolves");
    let banner = c.cluster.banner().expect("banner");
    assert!(
        banner.starts_with("rdrun: topology  source=slurm-step"),
        "{banner}"
    );
    assert!(
        banner.contains("nproc_per_node   2  (SLURM_GPUS_ON_NODE)"),
        "{banner}"
    );
}

#[test]
fn flags_win_their_fields() {
    let c = launch(
        &[
            "--node-rank",
            "0",
            "--master-port",
            "23456",
            "--rdzv-id",
            "mine",
            "--nproc-per-node",
            "1",
            "t.py",
        ],
        STEP,
    )
    .expect("resolves");
    assert_eq!(c.node_rank, 0);
    assert_eq!(c.master_port, Some(23456));
    assert_eq!(c.rdzv.run_id, "mine");
    assert_eq!(c.nproc_per_node, 1);
    // Still the step's node count and endpoint host.
    assert_eq!(c.nnodes.max, 2);
    assert_eq!(c.master_addr, "n1");
    let f = &c.cluster.topology.fields;
    assert_eq!(
        f.node_rank.as_ref().map(|s| s.source.as_str()),
        Some("--node-rank")
    );
    assert!(
        c.cluster
            .topology
            .notes
            .iter()
            .any(|n| n.contains("SLURM_NODEID")),
        "{:?}",
        c.cluster.topology.notes
    );
    // An elastic backend from the command line gets the step's endpoint as its store.
    let c = launch(&["--rdzv-backend", "c10d", "t.py"], STEP).expect("resolves");
    assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
    assert_eq!(
        c.node_rank, 0,
        "c10d assigns ranks; no node rank is passed to it"
    );
    assert_eq!(c.rdzv.run_id, "81234.0", "one run id on every node");
    assert_eq!(
        c.rdzv.endpoint,
        Some(Endpoint {
            host: "n1".into(),
            port: 12001
        })
    );
    // --cluster none (or RDRUN_CLUSTER=none): a local run, as before.
    for (argv, env) in [
        (&["--cluster", "none", "t.py"][..], STEP.to_vec()),
        (&["t.py"][..], with(&[("RDRUN_CLUSTER", "none")])),
    ] {
        let c = launch(argv, &env).expect("resolves");
        assert!(c.standalone && !c.cluster.detected, "{argv:?}");
        assert_eq!(c.cluster.banner(), None);
    }
}

#[test]
fn bad_values_are_named_by_their_source() {
    let e = launch(&["t.py"], &with(&[("SLURM_GPUS_ON_NODE", "x")])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("SLURM_GPUS_ON_NODE='x': expected a positive integer"),
        "{e}"
    );
    let e = launch(&["--cluster", "bogus", "t.py"], &[]).unwrap_err();
    assert_eq!(
            e.to_string(),
            "--cluster 'bogus': must be one of auto, none, slurm, k8s, mpi, lsf, hostfile (also RDRUN_CLUSTER)"
        );
    assert_eq!(e.exit_code(), crate::exit::USAGE);
    // A PET_* value keeps torchrun's usage error even in a pod (checked before detection).
    let e = launch(
        &["t.py"],
        &[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("PET_MASTER_ADDR", "m"),
            ("PET_NNODES", "2:1"),
        ],
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("PET_NNODES='2:1': "), "{e}");
    assert_eq!(e.exit_code(), crate::exit::USAGE);
    let e = launch(&["--standalone", "t.py"], STEP).unwrap_err();
    assert_eq!(
            e.to_string(),
            "--standalone runs one node but slurm-step (job 81234 step 0) gives 2 nodes (SLURM_STEP_NUM_NODES): drop --standalone, or pass --cluster none for a local run"
        );
    // Contradictions and refusals exit 1 with the module's one line.
    let e = launch(&["t.py"], &with(&[("SLURM_NODEID", "2")])).unwrap_err();
    assert!(matches!(e, ConfigError::Cluster(_)), "{e:?}");
    assert_eq!(e.exit_code(), crate::exit::LAUNCHER_FAILURE);
    // A nested launch under a scheduler.
    let e = launch(&["t.py"], &with(&[("TORCHELASTIC_RUN_ID", "outer")])).unwrap_err();
    assert!(e.to_string().contains("TORCHELASTIC_RUN_ID=outer"), "{e}");
    assert!(e.to_string().contains("pass --nested"), "{e}");
    // ... unless asked for: --nested or RDRUN_NESTED=1 (then the scheduler's world applies).
    for (argv, env) in [
        (
            &["--nested", "t.py"][..],
            with(&[("TORCHELASTIC_RUN_ID", "outer")]),
        ),
        (
            &["t.py"][..],
            with(&[("TORCHELASTIC_RUN_ID", "outer"), ("RDRUN_NESTED", "1")]),
        ),
    ] {
        let c = launch(argv, &env).expect("an intended nested launch resolves");
        assert!(c.cluster.detected, "{argv:?}");
    }
}

#[test]
fn slurm_in_place_is_one_rank_of_a_static_world() {
    // Task 3 of `srun -N2 --ntasks-per-node=2`: node 1, local rank 1.
    let env = with(&[
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_STEP_NUM_TASKS", "4"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_PROCID", "3"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_GPUS_ON_NODE", "1"),
    ]);
    let c = launch(&["t.py"], &env).expect("in place resolves");
    assert_eq!(c.nproc_per_node, 1, "one worker per task");
    assert_eq!(
        c.nnodes,
        NodeRange { min: 4, max: 4 },
        "one member per rank"
    );
    assert_eq!(c.node_rank, 3, "member index = RANK");
    assert_eq!(c.rdzv.backend, RdzvBackend::Static);
    assert!(!c.standalone);
    assert_eq!(c.rdzv.run_id, "81234.0");
    assert_eq!(
        c.rdzv.endpoint,
        Some(Endpoint {
            host: "n1".into(),
            port: 12001
        }),
        "task 0 hosts the store on the step's first host"
    );
    assert_eq!(
        c.cluster.in_place,
        Some(super::InPlace {
            rank: 3,
            local_rank: 1,
            world_size: 4,
            local_world_size: 2,
            node: Some((1, 2)),
        })
    );
    let line = c.cluster.banner().expect("banner");
    assert_eq!(
            line,
            "rdrun: rank 3/4 (local 1/2) -> endpoint n1:12001 (slurm-step (job 81234 step 0)), mode in-place\n"
        );
    // k×n oversubscription is still an error; an explicit 1 is fine.
    let e = launch(&["--nproc-per-node", "2", "t.py"], &env).unwrap_err();
    assert!(e.to_string().contains("2x2=4 workers"), "{e}");
    assert!(launch(&["--nproc-per-node", "1", "t.py"], &env).is_ok());
    // Flags that contradict one member per rank are refused.
    for (argv, want) in [
        (&["--nnodes", "2", "t.py"][..], "--nnodes cannot apply"),
        (
            &["--node-rank", "1", "t.py"][..],
            "--node-rank cannot apply",
        ),
        (
            &["--rdzv-backend", "c10d", "t.py"][..],
            "--rdzv-backend c10d cannot apply",
        ),
    ] {
        let e = launch(argv, &env).unwrap_err();
        assert!(e.to_string().contains(want), "{argv:?}: {e}");
        assert!(
            e.to_string().starts_with(
                "slurm-step (job 81234 step 0): in-place mode (this rdrun is rank 3 of 4"
            ),
            "{e}"
        );
    }
    // Task 0 placed off the first node could not host the store there.
    let e = launch(
        &["t.py"],
        &with(&[
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_LOCALID", "0"),
        ]),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("SLURM_PROCID=0 runs on node 1 (n2)"),
        "{e}"
    );
}

#[test]
fn mpi_in_place_on_one_host_needs_no_endpoint() {
    let rank = |r: &'static str| {
        vec![
            ("OMPI_COMM_WORLD_RANK", r),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_COMM_WORLD_NODE_RANK", r),
            ("OMPI_MCA_ess_base_jobid", "1344602113"),
        ]
    };
    let c0 = launch(&["t.py"], &rank("0")).expect("resolves");
    let c2 = launch(&["t.py"], &rank("2")).expect("resolves");
    assert_eq!((c0.node_rank, c2.node_rank), (0, 2));
    assert_eq!(c2.nnodes.max, 4);
    assert_eq!(c2.nproc_per_node, 1);
    let ep = c2.rdzv.endpoint.clone().expect("an endpoint");
    assert_eq!(ep.host, "127.0.0.1");
    assert_eq!(
        c0.rdzv.endpoint,
        Some(ep.clone()),
        "one port for every rank"
    );
    assert_eq!(c0.rdzv.run_id, c2.rdzv.run_id);
    assert_eq!(
        c2.cluster
            .in_place
            .as_ref()
            .map(|p| (p.local_rank, p.local_world_size, p.node)),
        Some((2, 4, Some((0, 1))))
    );
    // Another MPI job gets another port.
    let mut other = rank("2");
    other[5].1 = "1344602177";
    let c = launch(&["t.py"], &other).expect("resolves");
    assert_ne!(c.rdzv.endpoint.map(|e| e.port), Some(ep.port));
    // Several hosts: the node index comes from the exchanged hostnames, not NODE_RANK.
    let mut multi = rank("2");
    multi[1].1 = "8";
    multi.push(("RDRUN_RDZV_ENDPOINT", "10.0.0.1"));
    let c = launch(&["t.py"], &multi).expect("resolves");
    let p = c.cluster.in_place.expect("in place");
    assert_eq!((p.rank, p.world_size, p.node), (2, 8, None));
    assert_eq!(c.rdzv.endpoint.map(|e| e.host), Some("10.0.0.1".into()));
    // Without any host list or endpoint: refused, naming the flag.
    multi.pop();
    let e = launch(&["t.py"], &multi).unwrap_err();
    assert!(e.to_string().contains("pass --rdzv-endpoint"), "{e}");
}

/// Issue 38 item 16: `standalone` set by `PET_STANDALONE` is named by that variable in the dry
/// run, as every other value is by its origin (it said `default`).
#[test]
fn dry_run_names_pet_standalone_as_the_origin() {
    for value in ["1", ""] {
        let c = launch(&["--dry-run", "t.py"], &[("PET_STANDALONE", value)]).expect("resolves");
        let text = c.cluster.banner().expect("a dry run prints");
        assert!(
            text.contains("standalone       true  (PET_STANDALONE)\n"),
            "{value:?}: {text}"
        );
    }
    let c = launch(&["--dry-run", "--standalone", "t.py"], &[]).expect("resolves");
    let text = c.cluster.banner().expect("a dry run prints");
    assert!(
        text.contains("standalone       true  (--standalone)\n"),
        "{text}"
    );
}

#[test]
fn dry_run_and_local_topology() {
    let c = launch(&["--dry-run", "t.py"], &[]).expect("resolves");
    assert_eq!(c.cluster.dry_run, Some(TopologyFormat::Text));
    let text = c.cluster.banner().expect("a dry run prints");
    assert!(text.starts_with("rdrun: topology  source=local"), "{text}");
    assert!(text.contains("standalone       true  (auto"), "{text}");
    let c = launch(
        &[
            "--print-topology=json",
            "--nnodes",
            "2",
            "--master-addr",
            "h",
            "t.py",
        ],
        &[("PET_NPROC_PER_NODE", "3")],
    )
    .expect("resolves");
    assert_eq!(c.cluster.dry_run, Some(TopologyFormat::Json));
    let j: serde_json::Value =
        serde_json::from_str(&c.cluster.banner().expect("json")).expect("valid JSON");
    assert_eq!(j["fields"]["nnodes"]["source"], "--nnodes");
    assert_eq!(j["fields"]["master_addr"]["value"], "h");
    assert_eq!(j["fields"]["master_port"]["value"], 29500);
    assert_eq!(j["fields"]["master_port"]["source"], "default");
    assert_eq!(
        j["fields"]["nproc_per_node"]["source"],
        "PET_NPROC_PER_NODE"
    );
    // A local run that is not a dry run prints nothing (as torchrun).
    assert_eq!(ok(&["t.py"]).cluster.banner(), None);
}

/// The layout is typed once (config/layout.rs): a scheduler's host and port reach the c10d
/// endpoint as values, not as `host:port` text parsed again; an error names the value's own
/// source, and a typed flag is never attributed to a variable.
#[test]
fn placement_is_typed_once_and_named_by_its_source() {
    // A typed c10d backend under a Slurm step: the scheduler's master is the store's host.
    let c = launch(&["--rdzv-backend", "c10d", "t.py"], STEP).expect("resolves");
    assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
    assert_eq!(
        c.rdzv.endpoint,
        Some(Endpoint {
            host: "n1".into(),
            port: 12001
        })
    );
    // A bad master address from PET_MASTER_ADDR is named by that variable and by its own flag.
    let e = launch(
        &["--cluster", "none", "--nnodes", "2", "t.py"],
        &[("PET_MASTER_ADDR", "bad host")],
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("PET_MASTER_ADDR='bad host': the host must be"),
        "{e}"
    );
    assert_eq!(e.exit_code(), crate::exit::USAGE);
    // Typed, the same value is the flag's (even with a PET_* value of another flag around).
    let e = launch(
        &[
            "--cluster",
            "none",
            "--nnodes",
            "2",
            "--master-addr",
            "bad host",
            "t.py",
        ],
        &[("PET_RDZV_ENDPOINT", "")],
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("--master-addr 'bad host': "),
        "{e}"
    );
    // A bracketed IPv6 master address keeps its port unambiguous and loses its brackets.
    let c = launch(
        &[
            "--cluster",
            "none",
            "--nnodes",
            "2",
            "--master-addr",
            "[::1]",
            "--master-port",
            "2345",
            "t.py",
        ],
        &[],
    )
    .expect("resolves");
    assert_eq!(
        c.rdzv.endpoint,
        Some(Endpoint {
            host: "::1".into(),
            port: 2345
        })
    );
    // A node rank is checked against the node count after both are typed, and named by the
    // variable that set it.
    let e = launch(
        &["--cluster", "none", "--nnodes", "2", "t.py"],
        &[("PET_NODE_RANK", "3")],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "PET_NODE_RANK='3': must be less than the number of nodes (2)"
    );
}
