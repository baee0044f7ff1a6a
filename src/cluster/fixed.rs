//! A scheduler's fixed node set against a node count the user gave (issue 25.4): `--nnodes 3`
//! inside a 2-node `srun` step would wait for a third node until the rendezvous timeout, so a
//! count that cannot include the scheduler's is an error naming both, not an override note.
//!
//! Fixed node sets are the ones a scheduler allocated: a Slurm step, an MPI job in node mode,
//! an LSF job, Kubernetes pod counts (Volcano, PyTorchJob's pod `WORLD_SIZE`). `PET_*` is
//! torchrun's flag contract (an elastic `PET_NNODES` may be a range), and a hostfile is the
//! user's own list, so neither is fixed here. An elastic range that includes the scheduler's
//! count (`--nnodes 1:2` in a 2-node step) is no contradiction and stays an override note.

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
/// scheduler layer that fixes one. In-place launches are left to `config` (which refuses any
/// `--nnodes` there: the scheduler's ranks are the job).
pub(super) fn check_node_count(explicit: &[Layer], sched: &[Layer]) -> Result<(), ClusterError> {
    let in_place = sched
        .iter()
        .find_map(|l| l.fields.mode.as_ref())
        .is_some_and(|m| m.value == Mode::InPlace);
    if in_place {
        return Ok(());
    }
    let Some(given) = explicit.iter().find_map(|l| l.fields.nnodes.as_ref()) else {
        return Ok(());
    };
    let fixed = sched.iter().find_map(|l| {
        let n = l.fields.nnodes.as_ref()?;
        let fixed = l.name != "hostfile" && !n.source.starts_with("PET_");
        fixed.then_some((l, n))
    });
    let Some((layer, n)) = fixed else {
        return Ok(());
    };
    let count = n.value.max;
    if (given.value.min..=given.value.max).contains(&count) {
        return Ok(());
    }
    let scheduler = if layer.detail.is_empty() {
        layer.name.clone()
    } else {
        format!("{} ({})", layer.name, layer.detail)
    };
    Err(ClusterError(format!(
        "{} contradicts the scheduler's fixed node set: {scheduler} gives {} nodes ({}); drop it, or pass --cluster none for a local run",
        named(given),
        n.value,
        n.source
    )))
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// Node 1 of a 2-node srun step.
    fn step() -> BTreeMap<String, String> {
        [
            ("SLURM_JOB_ID", "81234"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
            ("SLURM_NODEID", "1"),
            ("SLURM_PROCID", "1"),
            ("SLURMD_NODENAME", "n2"),
        ]
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
        // The same count, or a range that includes it, is fine; the range is a note written as
        // a user writes it, never Rust's Debug text.
        run(&step(), &with_nnodes(2, 2, "--nnodes")).expect("the step's own count");
        let t = run(&step(), &with_nnodes(1, 2, "--nnodes")).expect("a range including 2");
        assert!(
            t.notes
                .iter()
                .any(|n| n == "nnodes: 1:2 (--nnodes) overrides 2 (SLURM_STEP_NUM_NODES)"),
            "{:?}",
            t.notes
        );
        assert!(
            t.notes.iter().all(|n| !n.contains("NodeCount")),
            "{:?}",
            t.notes
        );
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
