//! Resolution tests of issue 25's scheduler environments, each an exact environment a user
//! reported, parsed and resolved as the binary does (`PET_*` defaults included).

use super::testkit::*;
use super::*;
use crate::cli::{parse_from, Invocation};

fn launch(argv: &[&str], env: &[(&str, &str)]) -> Result<LaunchConfig, String> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let lookup = env_of(env);
    let a = match parse_from(&argv, &lookup) {
        Ok(Invocation::Launch(a)) => a,
        Ok(other) => panic!("{other:?}"),
        Err(e) => return Err(e.to_string()),
    };
    resolve_with(*a, &lookup, &FakeHost::new()).map_err(|e| e.to_string())
}

/// 25.1: PyTorchJob sets `PET_STANDALONE=""`; empty is on, for the command line as for the
/// cluster reader, and `0` is off for both.
#[test]
fn an_empty_pet_standalone_is_on_everywhere() {
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("PET_STANDALONE", ""),
        ("PET_NPROC_PER_NODE", "2"),
    ];
    let c = launch(&["--dry-run", "t.py"], &pod).expect("an empty PET_STANDALONE is on");
    assert!(c.standalone);
    assert_eq!(c.nproc_per_node, 2);
    // Beside the operator's other variables (the cluster reader's path).
    let mut pod1 = pod.to_vec();
    pod1.extend([("PET_NNODES", "1"), ("PET_MASTER_ADDR", "job-master-0")]);
    let c = launch(&["t.py"], &pod1).expect("resolves");
    assert!(c.standalone);
    let f = &c.cluster.topology.fields;
    assert_eq!(
        f.standalone.as_ref().map(|s| (s.value, s.source.as_str())),
        Some((true, "PET_STANDALONE (empty = on)"))
    );
    // `0` is off for the reader too (it used to count any value as present = on).
    let mut off = pod1.clone();
    off.retain(|(k, _)| *k != "PET_STANDALONE");
    off.push(("PET_STANDALONE", "0"));
    let c = launch(&["t.py"], &off).expect("resolves");
    let source = c.cluster.topology.fields.standalone.map(|s| s.source);
    assert!(
        source
            .as_deref()
            .is_none_or(|s| !s.starts_with("PET_STANDALONE")),
        "{source:?}"
    );
}

/// 25.3: `mpirun -np 1 rdrun --nproc_per_node=2 x.py` is one task per node: node mode, two
/// workers, not the in-place "1x2=2 workers" refusal.
#[test]
fn one_mpi_rank_is_node_mode_whatever_the_world() {
    let one = [
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "1"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ("OMPI_MCA_ess_base_jobid", "1344602113"),
    ];
    let c = launch(&["--nproc_per_node=2", "t.py"], &one).expect("one task per node");
    assert_eq!(c.nproc_per_node, 2);
    assert_eq!(c.nnodes, NodeRange { min: 1, max: 1 });
    assert!(c.cluster.in_place.is_none(), "node mode");
    assert!(c.standalone, "one node: a local run");
    let f = &c.cluster.topology.fields;
    assert_eq!(
        f.mode.as_ref().map(|m| (m.value, m.source.as_str())),
        Some((
            crate::cluster::Mode::Node,
            "OMPI_COMM_WORLD_LOCAL_SIZE=1: one rank per host"
        ))
    );
}

/// 25.4: `--nnodes 3` in a 2-node step is an error naming both; a range that includes the
/// step's count is not.
use crate::cluster::fixed::STEP_NODE_1;

#[test]
fn a_node_count_contradicting_the_step_is_refused() {
    let step = STEP_NODE_1;
    let e = launch(&["--nnodes", "3", "t.py"], &step).unwrap_err();
    assert_eq!(
        e,
        "--nnodes 3 contradicts the scheduler's fixed node set: slurm-step (job 81234 step 0) gives 2 nodes (SLURM_STEP_NUM_NODES); drop it, or pass --cluster none for a local run"
    );
    let c = launch(
        &["--nnodes", "1:2", "--rdzv-backend", "c10d", "t.py"],
        &step,
    )
    .expect("a range including 2");
    assert_eq!(c.nnodes, NodeRange { min: 1, max: 2 });
}

/// 38.6: a typed range under the step's fixed node set is the launch's node count no more: on
/// the static rendezvous (the step's) it resolves to the step's 2 nodes, which the static
/// rendezvous then waits for (it waited for MAX = 3, 15 minutes); on c10d to MIN:2. The
/// resolved range is also what the c10d settings are typed from.
#[test]
fn a_node_range_under_the_step_resolves_to_its_count() {
    let step = STEP_NODE_1;
    for range in ["1:3", "2:4", "1:2"] {
        let c = launch(&["--nnodes", range, "t.py"], &step).expect("resolves");
        assert_eq!(c.nnodes, NodeRange { min: 2, max: 2 }, "{range}");
        assert_eq!(c.rdzv.backend, RdzvBackend::Static);
        let n = c.cluster.topology.fields.nnodes.expect("nnodes");
        assert_eq!(
            n.source,
            format!("--nnodes {range} within SLURM_STEP_NUM_NODES")
        );
    }
    let mut env = step.to_vec();
    env.push(("RDRUN_NNODES", "1:3"));
    let c = launch(&["t.py"], &env).expect("resolves");
    assert_eq!(c.nnodes, NodeRange { min: 2, max: 2 });
    let c = launch(
        &["--nnodes", "1:3", "--rdzv-backend", "c10d", "t.py"],
        &step,
    )
    .expect("resolves");
    assert_eq!(c.nnodes, NodeRange { min: 1, max: 2 });
    match &c.rdzv.settings {
        Some(RdzvSettings::C10d(s)) => assert_eq!((s.min_nodes, s.max_nodes), (1, 2)),
        other => panic!("{other:?}"),
    }
    let e = launch(&["--nnodes", "3:4", "t.py"], &step).unwrap_err();
    assert!(e.starts_with("--nnodes 3:4 contradicts"), "{e}");
}

/// 25.5: LSF slots are CPU slots, never workers; the GPUs LSF gave this host are.
#[test]
fn lsf_workers_come_from_its_gpus_not_its_slots() {
    let job = [("LSB_JOBID", "4242"), ("LSB_MCPU_HOSTS", "h0 2 h1 2")];
    // Detection with this host named h1 (resolution would use the machine's own name).
    let env: std::collections::BTreeMap<String, String> = job
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let host = crate::cluster::HostFacts::named("h1");
    let t = crate::cluster::detect(
        &env,
        &host,
        crate::cluster::ClusterChoice::Auto,
        &Default::default(),
    )
    .expect("detects")
    .expect("lsf");
    assert!(t.fields.nproc.is_none(), "{:?}", t.fields.nproc);
    assert!(
        t.notes.iter().any(|n| n
            == "LSB_MCPU_HOSTS gives this host 2 slots: LSF slots are CPU slots, not workers (workers: --nproc-per-node, else the GPUs in CUDA_VISIBLE_DEVICES)"),
        "{:?}",
        t.notes
    );
    let mut gpus = env.clone();
    gpus.insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3".into());
    let t = crate::cluster::detect(
        &gpus,
        &host,
        crate::cluster::ClusterChoice::Auto,
        &Default::default(),
    )
    .expect("detects")
    .expect("lsf");
    assert_eq!(
        t.fields.nproc.map(|n| (n.value, n.source)),
        Some((
            "4".to_string(),
            "CUDA_VISIBLE_DEVICES (the GPUs LSF gave this host)".to_string()
        ))
    );
}
