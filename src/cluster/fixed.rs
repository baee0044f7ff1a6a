//! A scheduler's fixed node set against a node count the user gave (issues 25.4, 38.6):
//! `--nnodes 3` inside a 2-node `srun` step would wait for a third node until the rendezvous
//! timeout, so a count that cannot include the scheduler's is an error naming both, not an
//! override note.
//!
//! A range that includes the scheduler's count (`--nnodes 1:3` in a 2-node step) is resolved
//! against it, with one note saying so: no node outside the set can ever join, so waiting for
//! one only costs the rendezvous timeout (a static round waits for MAX nodes: 15 minutes). On
//! the static rendezvous (every scheduler's default) it becomes the count itself, as a static
//! round runs exactly the nodes it counts; on an elastic one (`--rdzv-backend c10d`, `etcd`)
//! MAX becomes the count and MIN stays, so the job still goes on without a node it lost.
//!
//! Fixed node sets are the ones a scheduler allocated: a Slurm step, an MPI job in node mode,
//! an LSF job, Kubernetes pod counts (Volcano, PyTorchJob's pod `WORLD_SIZE`). `PET_*` is
//! torchrun's flag contract (an elastic `PET_NNODES` may be a range), and a hostfile is the
//! user's own list, so neither is fixed here.

use super::{ClusterError, Layer, Mode, NodeCount, Sourced};

/// How a node count is named in a message: `--nnodes 3` for a flag, `RDRUN_NNODES=2:4` for a
/// variable.
fn named(n: &Sourced<NodeCount>) -> String {
    if n.source.starts_with("--") {
        format!("{} {}", n.source, n.value)
    } else {
        format!("{}={}", n.source, n.value)
    }
}

/// The first explicit node count (flags, `RDRUN_*`, hand-typed `PET_*`) against the first
/// scheduler layer that fixes one: an error when it cannot include the scheduler's count; a
/// range that does is resolved in place (see the module doc), and the one note that says so
/// is returned with the start of the merge's "overrides" note it replaces. In-place launches
/// are left to `config` (which refuses any `--nnodes` there: the scheduler's ranks are the job).
pub(super) fn fit_node_count(
    explicit: &mut [Layer],
    sched: &[Layer],
) -> Result<Option<(String, String)>, ClusterError> {
    let in_place = sched
        .iter()
        .find_map(|l| l.fields.mode.as_ref())
        .is_some_and(|m| m.value == Mode::InPlace);
    if in_place {
        return Ok(None);
    }
    // The static rendezvous unless a layer names another (every scheduler names static).
    let elastic = explicit
        .iter()
        .chain(sched)
        .find_map(|l| l.fields.backend.as_ref())
        .is_some_and(|b| b.value.trim() != "static");
    let Some(given) = explicit.iter_mut().find_map(|l| l.fields.nnodes.as_mut()) else {
        return Ok(None);
    };
    let fixed = sched.iter().find_map(|l| {
        let n = l.fields.nnodes.as_ref()?;
        let fixed = l.name != "hostfile" && !n.source.starts_with("PET_");
        fixed.then_some((l, n))
    });
    let Some((layer, n)) = fixed else {
        return Ok(None);
    };
    let scheduler = if layer.detail.is_empty() {
        layer.name.clone()
    } else {
        format!("{} ({})", layer.name, layer.detail)
    };
    let count = n.value.max;
    if !(given.value.min..=given.value.max).contains(&count) {
        return Err(ClusterError(format!(
            "{} contradicts the scheduler's fixed node set: {scheduler} gives {} nodes ({}); drop it, or pass --cluster none for a local run",
            named(given),
            n.value,
            n.source
        )));
    }
    let resolved = match elastic {
        true => NodeCount {
            min: given.value.min,
            max: count,
        },
        false => NodeCount {
            min: count,
            max: count,
        },
    };
    if resolved == given.value {
        return Ok(None);
    }
    let why = match elastic {
        true => "no other node can join it",
        false => "a static rendezvous runs exactly the nodes it counts",
    };
    let note = format!(
        "nnodes: {} resolved to {resolved}: {scheduler} gives a fixed set of {count} nodes ({}), and {why}",
        named(given),
        n.source
    );
    *given = Sourced {
        value: resolved,
        source: format!("{} within {}", named(given), n.source),
    };
    let overrides = format!("nnodes: {resolved} ({}) overrides ", given.source);
    Ok(Some((note, overrides)))
}

/// Node 1 of a 2-node srun step (job 81234 step 0): the fixture of this file's tests and of
/// `config`'s scheduler-environment tests (one environment, written once).
#[cfg(test)]
pub(crate) const STEP_NODE_1: [(&str, &str); 9] = [
    ("SLURM_JOB_ID", "81234"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_STEP_NODELIST", "n[1-2]"),
    ("SLURM_STEP_NUM_NODES", "2"),
    ("SLURM_STEP_NUM_TASKS", "2"),
    ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
    ("SLURM_NODEID", "1"),
    ("SLURM_PROCID", "1"),
    ("SLURMD_NODENAME", "n2"),
];

#[cfg(test)]
mod tests {
    use super::super::*;

    /// Node 1 of a 2-node srun step.
    fn step() -> BTreeMap<String, String> {
        super::STEP_NODE_1
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with_nnodes(min: usize, max: usize, source: &str) -> Fields {
        Fields {
            nnodes: src(NodeCount { min, max }, source),
            ..Fields::default()
        }
    }

    fn run(env: &BTreeMap<String, String>, flags: &Fields) -> Result<Topology, ClusterError> {
        detect(env, &HostFacts::named("n2"), ClusterChoice::Auto, flags)
            .map(|t| t.expect("a topology"))
    }

    #[test]
    fn a_node_count_outside_the_schedulers_is_an_error_naming_both() {
        let e = run(&step(), &with_nnodes(3, 3, "--nnodes")).unwrap_err();
        assert_eq!(
            e.0,
            "--nnodes 3 contradicts the scheduler's fixed node set: slurm-step (job 81234 step 0) gives 2 nodes (SLURM_STEP_NUM_NODES); drop it, or pass --cluster none for a local run"
        );
        let e = run(&step(), &with_nnodes(3, 4, "--nnodes")).unwrap_err();
        assert!(e.0.starts_with("--nnodes 3:4 contradicts"), "{e}");
        let mut env = step();
        env.insert("RDRUN_NNODES".into(), "1".into());
        let e = run(&env, &Fields::default()).unwrap_err();
        assert!(e.0.starts_with("RDRUN_NNODES=1 contradicts"), "{e}");
        // The same count is fine; a range that includes it is resolved (the next test).
        run(&step(), &with_nnodes(2, 2, "--nnodes")).expect("the step's own count");
    }

    /// Issue 38.6: a range that includes the step's count resolves against it with one note
    /// naming the range, the step and the variable (written as a user writes them, never Rust's
    /// Debug text): to the count on the static rendezvous (it waited 15 minutes for a third
    /// node), to MIN:count on an elastic one. The flag layer's value is the resolved one.
    #[test]
    fn a_range_including_the_schedulers_count_resolves_to_it_with_one_note() {
        let nnodes = |t: &Topology| t.fields.nnodes.clone().expect("nnodes");
        let nnodes_notes = |t: &Topology| {
            t.notes
                .iter()
                .filter(|n| n.starts_with("nnodes"))
                .cloned()
                .collect::<Vec<_>>()
        };
        for (min, max) in [(1, 3), (2, 4), (1, 2)] {
            let t = run(&step(), &with_nnodes(min, max, "--nnodes")).expect("resolves");
            assert_eq!(nnodes(&t).value, NodeCount { min: 2, max: 2 });
            assert_eq!(
                nnodes(&t).source,
                format!("--nnodes {min}:{max} within SLURM_STEP_NUM_NODES")
            );
            assert_eq!(
                nnodes_notes(&t),
                [format!("nnodes: --nnodes {min}:{max} resolved to 2: slurm-step (job 81234 step 0) gives a fixed set of 2 nodes (SLURM_STEP_NUM_NODES), and a static rendezvous runs exactly the nodes it counts")]
            );
        }
        // A variable is named as one.
        let mut env = step();
        env.insert("RDRUN_NNODES".into(), "1:3".into());
        let t = run(&env, &Fields::default()).expect("resolves");
        assert_eq!(nnodes(&t).value, NodeCount { min: 2, max: 2 });
        assert!(
            nnodes_notes(&t)[0].starts_with("nnodes: RDRUN_NNODES=1:3 resolved to 2: "),
            "{:?}",
            t.notes
        );
        // Elastic: MIN stays (the job may go on without a node it lost), MAX is the count.
        let mut flags = with_nnodes(1, 3, "--nnodes");
        flags.backend = src("c10d".to_string(), "--rdzv-backend");
        let t = run(&step(), &flags).expect("resolves");
        assert_eq!(nnodes(&t).value, NodeCount { min: 1, max: 2 });
        assert_eq!(
            nnodes_notes(&t),
            ["nnodes: --nnodes 1:3 resolved to 1:2: slurm-step (job 81234 step 0) gives a fixed set of 2 nodes (SLURM_STEP_NUM_NODES), and no other node can join it"]
        );
        // An elastic range already within the set is the user's: the merge's note only.
        flags.nnodes = src(NodeCount { min: 1, max: 2 }, "--nnodes");
        let t = run(&step(), &flags).expect("resolves");
        assert_eq!(nnodes(&t).value, NodeCount { min: 1, max: 2 });
        assert_eq!(
            nnodes_notes(&t),
            ["nnodes: 1:2 (--nnodes) overrides 2 (SLURM_STEP_NUM_NODES)"]
        );
        // A range the set cannot satisfy stays refused, on either rendezvous.
        flags.nnodes = src(NodeCount { min: 3, max: 5 }, "--nnodes");
        let e = run(&step(), &flags).unwrap_err();
        assert!(e.0.starts_with("--nnodes 3:5 contradicts"), "{e}");
    }

    #[test]
    fn notes_print_values_as_a_user_writes_them() {
        let mut flags = with_nnodes(1, 2, "--nnodes");
        flags.master_addr = src("h0".to_string(), "--master-addr");
        flags.node_rank = src(0, "--node-rank");
        let t = run(&step(), &flags).expect("resolves");
        for want in [
            "master_addr: h0 (--master-addr) overrides n1 (first host of SLURM_STEP_NODELIST)",
            "node_rank: 0 (--node-rank) overrides 1 (SLURM_NODEID)",
        ] {
            assert!(t.notes.iter().any(|n| n == want), "{want}: {:?}", t.notes);
        }
        assert!(t.notes.iter().all(|n| !n.contains('"')), "{:?}", t.notes);
    }
}
