//! The MPI reader: Open MPI, MPICH/Intel MPI and MVAPICH2 rank and size variables, and the
//! node list they imply.

#![allow(clippy::field_reassign_with_default)]

use super::*;

/// The MPI world rank and size, whichever flavour set them (for comparing with a Slurm step).
pub fn mpi_rank_size(env: &dyn Env) -> Option<(usize, usize)> {
    [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ]
    .iter()
    .find(|(_, s)| env.get(s).is_some())
    .and_then(|(r, s)| Some((num(env, r).ok()??, num(env, s).ok()??)))
}

/// Each flavour's rank, size, local rank and local size variables, in the order looked for.
const FLAVOURS: [(&str, [&str; 4]); 3] = [
    (
        "openmpi",
        [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ],
    ),
    (
        "mvapich2",
        [
            "MV2_COMM_WORLD_RANK",
            "MV2_COMM_WORLD_SIZE",
            "MV2_COMM_WORLD_LOCAL_RANK",
            "MV2_COMM_WORLD_LOCAL_SIZE",
        ],
    ),
    (
        "mpich",
        ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
    ),
];

/// Open MPI, MPICH/Intel MPI, MVAPICH2: rank and size (in-place mode), or node mode with one
/// rank per host. Node identity across hosts is in no variable (never `OMPI_COMM_WORLD_NODE_RANK`).
pub fn mpi(env: &dyn Env, host: &HostFacts<'_>) -> R<Option<Layer>> {
    let Some((name, vars)) = FLAVOURS.iter().find(|(_, v)| env.get(v[1]).is_some()) else {
        return Ok(None);
    };
    let need = |i: usize| -> R<Sourced<usize>> {
        sourced_num(env, vars[i])?
            .ok_or_else(|| ClusterError(format!("{} is set but {} is not", vars[1], vars[i])))
    };
    let (rank, size) = (need(0)?, need(1)?);
    let mut f = Fields::default();
    f.devices = devices(env);
    if env.get(vars[2]).is_none() && env.get(vars[3]).is_none() {
        // srun --mpi=pmi2 sets only PMI_RANK/PMI_SIZE (equal to the step's ids): a mode-less
        // layer that `detect` drops in favour of the Slurm step, or refuses if they differ.
        if env.get("SLURM_STEP_NODELIST").is_some() {
            f.rank = Some(rank);
            f.world_size = Some(size);
            return Ok(Some(Layer {
                name: format!("mpi {name}"),
                fields: f,
                ..Layer::default()
            }));
        }
        return fail(format!(
            "{}/{} without {}/{}: cannot tell how many ranks share this host",
            vars[0], vars[1], vars[2], vars[3]
        ));
    }
    let (local_rank, local_size) = (need(2)?, need(3)?);
    // One rank on this host is node mode whatever the world (`mpirun -np 1 rdrun
    // --nproc-per-node 2` is one task per node too): this rdrun is the node's agent.
    if local_size.value == 1 {
        f.mode = src(Mode::Node, format!("{}=1: one rank per host", vars[3]));
        f.nnodes = src(
            NodeCount {
                min: size.value,
                max: size.value,
            },
            vars[1],
        );
        f.node_rank = src(rank.value, vars[0]);
    } else {
        in_place(
            env,
            host,
            &mut f,
            (name, vars),
            [rank, size, local_rank, local_size],
        )?;
    }
    Ok(Some(Layer {
        name: format!("mpi {name}"),
        detail: String::new(),
        fields: f,
        notes: Vec::new(),
    }))
}

/// In-place mode (several ranks on this host, one worker each): the rank values, and on one
/// host the endpoint; the port and run id from the job id (every host derives the same).
fn in_place(
    env: &dyn Env,
    host: &HostFacts<'_>,
    f: &mut Fields,
    (name, vars): (&str, &[&str; 4]),
    [rank, size, local_rank, local_size]: [Sourced<usize>; 4],
) -> R<()> {
    let job_seed = first(
        env,
        &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"],
    );
    f.mode = src(Mode::InPlace, format!("{}={}", vars[3], local_size.value));
    f.nproc = src("1".into(), "in-place (one worker per MPI rank)");
    if size.value == local_size.value {
        f.nnodes = src(
            NodeCount { min: 1, max: 1 },
            format!("{}={}", vars[1], vars[3]),
        );
        f.node_rank = src(0, "every rank on this host");
        f.master_addr = src("127.0.0.1".into(), "every rank on this host");
        let (s, var) = match &job_seed {
            Some(j) => seed(j),
            None => match host.ppid {
                Some(p) => (p as u64, "parent pid (the MPI launcher)".into()),
                None => {
                    return fail(format!(
                        "{name}: no job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, PMI_JOBID) to derive a port from; pass --rdzv-endpoint"
                    ))
                }
            },
        };
        f.master_port = src(derived_port(s, 0), format!("derived from {var}"));
        f.run_id = src(format!("mpi-{s}"), var);
    } else if let Some(j) = &job_seed {
        // Several hosts: the endpoint host comes from a host list (hostfile, LSF, Slurm) or
        // --rdzv-endpoint; the port from the job id, equal on every host.
        let (s, var) = seed(j);
        f.master_port = src(derived_port(s, 0), format!("derived from {var}"));
        f.run_id = src(format!("mpi-{s}"), var);
    }
    f.backend = src("static".into(), "MPI job: fixed world");
    f.rank = Some(rank);
    f.world_size = Some(size);
    f.local_rank = Some(local_rank);
    f.local_world_size = Some(local_size);
    Ok(())
}

/// A job id variable's value hashed into a port seed, with the variable's name.
fn seed((var, v): &(String, String)) -> (u64, String) {
    let h = v
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
    (h, var.clone())
}
