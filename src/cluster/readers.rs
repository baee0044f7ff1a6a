//! One reader per source of topology, each a pure function of the environment and
//! [`HostFacts`] returning the [`Layer`] it defines (or `None` when its source is absent). The
//! variables and their meaning are the scheduler's own (spec cluster.md §1–4); the sources
//! named in each field are the variables read, so the printed topology can say where each
//! value came from.
//!
//! Length: about 1,085 lines before the tests, one reader per scheduler (Slurm, Kubernetes
//! PyTorchJob/Trainer/JobSet/Volcano, Open MPI/MPICH/MVAPICH2, LSF, hostfiles), each short and
//! independent; one file keeps their shared field helpers in one place. Splitting per scheduler
//! is the natural next step if a reader grows.

// Each reader fills its `Fields` one variable at a time, in the order the scheduler defines
// them; a struct literal would hide that order.
#![allow(clippy::field_reassign_with_default)]

use super::hostlist::{expand, expand_counts_for};
use super::{
    derived_port, src, ClusterChoice, ClusterError, Env, Fields, HostFacts, Layer, Mode, NodeCount,
    Sourced,
};

type R<T> = Result<T, ClusterError>;

fn fail<T>(msg: String) -> R<T> {
    Err(ClusterError(msg))
}

/// A variable parsed as an unsigned integer; a malformed value is an error naming it.
fn num(env: &dyn Env, var: &str) -> R<Option<usize>> {
    match env.get(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| ClusterError(format!("{var}={v:?} is not a non-negative integer"))),
    }
}

/// The first of several spellings that is set, with its name.
fn first(env: &dyn Env, vars: &[&str]) -> Option<(String, String)> {
    vars.iter()
        .find_map(|v| env.get(v).map(|x| (v.to_string(), x)))
}

fn sourced_num(env: &dyn Env, var: &str) -> R<Option<Sourced<usize>>> {
    Ok(num(env, var)?.and_then(|n| src(n, var)))
}

/// What each forced `--cluster` choice looks for, for the "nothing found" error.
pub fn tell_tale(c: ClusterChoice) -> &'static str {
    match c {
        ClusterChoice::Slurm => "SLURM_JOB_ID unset",
        ClusterChoice::K8s => {
            "no PET_*, VC_TASK_INDEX, JOB_COMPLETION_INDEX or MASTER_ADDR+RANK+WORLD_SIZE"
        }
        ClusterChoice::Mpi => "no OMPI_COMM_WORLD_SIZE, PMI_SIZE or MV2_COMM_WORLD_SIZE",
        ClusterChoice::Lsf => "LSB_JOBID with LSB_MCPU_HOSTS, LSB_HOSTS or LSB_DJOB_HOSTFILE unset",
        ClusterChoice::Hostfile => {
            "no --hostfile, RDRUN_HOSTFILE or OMPI_MCA_orte_default_hostfile"
        }
        ClusterChoice::Auto | ClusterChoice::None => "",
    }
}

/// `N` or `MIN:MAX`.
pub fn parse_nnodes(var: &str, text: &str) -> R<NodeCount> {
    let bad = || ClusterError(format!("{var}={text:?} is not N or MIN:MAX"));
    let n = |t: &str| t.trim().parse::<usize>().map_err(|_| bad());
    let (min, max) = match text.split_once(':') {
        Some((a, b)) => (n(a)?, n(b)?),
        None => (n(text)?, n(text)?),
    };
    if min == 0 || min > max {
        return Err(bad());
    }
    Ok(NodeCount { min, max })
}

/// `host:port` (IPv6 in brackets).
fn parse_host_port(var: &str, text: &str) -> R<(String, Option<u16>)> {
    let text = text.trim();
    let bad = || ClusterError(format!("{var}={text:?} is not HOST[:PORT]"));
    if let Some(rest) = text.strip_prefix('[') {
        let (h, p) = rest.split_once(']').ok_or_else(bad)?;
        let port = match p.strip_prefix(':') {
            Some(p) => Some(p.parse().map_err(|_| bad())?),
            None if p.is_empty() => None,
            None => return Err(bad()),
        };
        return Ok((h.to_string(), port));
    }
    match text.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            Ok((h.to_string(), Some(p.parse().map_err(|_| bad())?)))
        }
        _ if text.is_empty() => Err(bad()),
        _ => Ok((text.to_string(), None)),
    }
}

fn devices(env: &dyn Env) -> Option<Sourced<Vec<String>>> {
    let v = env.get("CUDA_VISIBLE_DEVICES")?;
    let list = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    src(list, "CUDA_VISIBLE_DEVICES")
}

/// `RDRUN_*`, mirroring the flags.
pub fn rdrun_env(env: &dyn Env) -> R<Layer> {
    let mut f = Fields::default();
    if let Some(v) = env.get("RDRUN_NNODES") {
        f.nnodes = src(parse_nnodes("RDRUN_NNODES", &v)?, "RDRUN_NNODES");
    }
    f.node_rank = sourced_num(env, "RDRUN_NODE_RANK")?;
    if let Some(v) = env.get("RDRUN_RDZV_ENDPOINT") {
        let (h, p) = parse_host_port("RDRUN_RDZV_ENDPOINT", &v)?;
        f.master_addr = src(h, "RDRUN_RDZV_ENDPOINT");
        f.master_port = p.and_then(|p| src(p, "RDRUN_RDZV_ENDPOINT"));
    }
    f.backend = env
        .get("RDRUN_RDZV_BACKEND")
        .and_then(|v| src(v, "RDRUN_RDZV_BACKEND"));
    f.run_id = env
        .get("RDRUN_RDZV_ID")
        .and_then(|v| src(v, "RDRUN_RDZV_ID"));
    f.nproc = env
        .get("RDRUN_NPROC_PER_NODE")
        .and_then(|v| src(v, "RDRUN_NPROC_PER_NODE"));
    Ok(Layer {
        name: "RDRUN_*".into(),
        fields: f,
        ..Layer::default()
    })
}

/// torchrun's `PET_*` contract as PyTorchJob v1 (static and elastic) and Trainer v2 set it.
pub fn pet(env: &dyn Env) -> R<Option<Layer>> {
    let any = [
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_RDZV_ENDPOINT",
    ]
    .iter()
    .any(|v| env.get(v).is_some());
    if !any {
        return Ok(None);
    }
    let mut f = Fields::default();
    let mut notes = Vec::new();
    if let Some(v) = env.get("PET_NNODES") {
        f.nnodes = src(parse_nnodes("PET_NNODES", &v)?, "PET_NNODES");
    }
    f.node_rank = sourced_num(env, "PET_NODE_RANK")?;
    if f.node_rank.is_none() && env.get("PET_MASTER_ADDR").is_some() {
        // PyTorchJob before v1.7 set only the pod-level RANK (= pod index) beside PET_MASTER_ADDR.
        f.node_rank = num(env, "RANK")?.and_then(|n| src(n, "RANK (pod index)"));
    }
    let elastic = env.get("PET_RDZV_ENDPOINT");
    let flavour;
    if let Some(ep) = &elastic {
        let (h, p) = parse_host_port("PET_RDZV_ENDPOINT", ep)?;
        f.master_addr = src(h, "PET_RDZV_ENDPOINT");
        f.master_port = p.and_then(|p| src(p, "PET_RDZV_ENDPOINT"));
        f.backend = match env.get("PET_RDZV_BACKEND") {
            Some(b) => src(b, "PET_RDZV_BACKEND"),
            None => src("c10d".to_string(), "PyTorchJob elastic default"),
        };
        f.run_id = env.get("PET_RDZV_ID").and_then(|v| src(v, "PET_RDZV_ID"));
        flavour = "pytorchjob-v1 elastic";
    } else {
        if let Some(h) = env.get("PET_MASTER_ADDR") {
            f.master_addr = src(h, "PET_MASTER_ADDR");
            f.backend = src("static".to_string(), "PET_MASTER_ADDR (static)");
        }
        if let Some(p) = num(env, "PET_MASTER_PORT")? {
            let p = u16::try_from(p)
                .map_err(|_| ClusterError(format!("PET_MASTER_PORT={p} is not a port")))?;
            f.master_port = src(p, "PET_MASTER_PORT");
        }
        // Trainer v2 sets only PET_*; PyTorchJob v1 also sets MASTER_ADDR and pod-level RANK.
        flavour = if env.get("MASTER_ADDR").is_some() || env.get("RANK").is_some() {
            "pytorchjob-v1 static"
        } else {
            "trainer-v2"
        };
    }
    if let Some(v) = env.get("PET_NPROC_PER_NODE") {
        f.nproc = src(v, "PET_NPROC_PER_NODE");
    } else if let Some(v) = env.get("PET_N_PROC_PER_NODE") {
        notes.push("PET_N_PROC_PER_NODE is the 2021-22 training-operator typo of PET_NPROC_PER_NODE; read it anyway".into());
        f.nproc = src(v, "PET_N_PROC_PER_NODE");
    }
    // The command line's rule (`cli`): empty is on (as PyTorchJob sets it), else an integer,
    // 0 = off; any other text was refused there.
    if let Some(v) = env.get("PET_STANDALONE") {
        let t = v.trim();
        if t.is_empty() {
            f.standalone = src(true, "PET_STANDALONE (empty = on)");
        } else if t.parse::<i64>() != Ok(0) {
            f.standalone = src(true, "PET_STANDALONE");
        }
    }
    f.mode = src(Mode::Node, "PET_*");
    f.devices = devices(env);
    let on_k8s = env.get("KUBERNETES_SERVICE_HOST").is_some();
    Ok(Some(Layer {
        name: if on_k8s {
            format!("kubernetes {flavour}")
        } else {
            "torchrun env (PET_*)".into()
        },
        detail: String::new(),
        fields: f,
        notes,
    }))
}

/// Slurm's step sentinels (`slurm/slurm.h`), also as `%d` prints them.
fn step_kind(step: &str) -> Option<&'static str> {
    match step.trim() {
        "4294967291" | "-5" => Some("batch"),
        "4294967292" | "-4" => Some("extern"),
        "4294967290" | "-6" => Some("interactive"),
        _ => None,
    }
}

/// A Slurm job: an srun step (node or in-place mode), or a batch/salloc context.
pub fn slurm(env: &dyn Env, _host: &HostFacts<'_>) -> R<Option<Layer>> {
    let Some((job_var, job)) = first(env, &["SLURM_JOB_ID", "SLURM_JOBID"]) else {
        return Ok(None);
    };
    let job_n: u64 = job
        .trim()
        .parse()
        .map_err(|_| ClusterError(format!("{job_var}={job:?} is not a job id")))?;
    let step = first(env, &["SLURM_STEP_ID", "SLURM_STEPID"]);
    let kind = step.as_ref().and_then(|(_, s)| step_kind(s));
    let step_list = env.get("SLURM_STEP_NODELIST");
    let job_name = env.get("SLURM_JOB_NAME").unwrap_or_default();
    let mut f = Fields::default();
    let mut notes = Vec::new();
    f.devices = devices(env);
    if let Some(g) = env.get("SLURM_GPUS_ON_NODE") {
        f.nproc = src(g, "SLURM_GPUS_ON_NODE");
    }

    if step_list.is_none() || matches!(kind, Some("batch") | Some("extern")) {
        // A batch script or salloc shell: it runs on one node only.
        let nodes = match first(env, &["SLURM_JOB_NUM_NODES", "SLURM_NNODES"]) {
            Some((var, _)) => (num(env, &var)?.unwrap_or(1), var),
            None => match env.get("SLURM_JOB_NODELIST") {
                Some(l) => (
                    expand(&l)
                        .map_err(|e| ClusterError(format!("SLURM_JOB_NODELIST: {e}")))?
                        .len(),
                    "SLURM_JOB_NODELIST".into(),
                ),
                None => (1, "default".into()),
            },
        };
        if nodes.0 > 1 {
            let context = if env.get("ENVIRONMENT").as_deref() == Some("BATCH") {
                "a batch script (ENVIRONMENT=BATCH)"
            } else {
                "an allocation shell (salloc)"
            };
            return fail(format!(
                "Slurm job {job} spans {} nodes ({}={}) but this is {context}, not an srun step (SLURM_STEP_NODELIST unset): the other nodes would never join; run `srun --ntasks-per-node=1 rdrun ...` (or --cluster none for a local run)",
                nodes.0, nodes.1, nodes.0
            ));
        }
        // Lightning's convention: an interactive allocation is not srun-managed. Only on one
        // node: salloc names every job "interactive" unless -J is given (seen on a real 22.05
        // cluster), so honouring it on several nodes would turn the refusal above into a
        // silent local run on the login node.
        if job_name == "bash" || job_name == "interactive" {
            return Ok(None);
        }
        f.mode = src(Mode::Node, format!("{job_var} without a step, one node"));
        f.nnodes = src(NodeCount { min: 1, max: 1 }, nodes.1);
        f.node_rank = src(0, "one node");
        f.run_id = src(job.clone(), job_var.clone());
        return Ok(Some(Layer {
            name: "slurm-allocation".into(),
            detail: format!("job {job}, one node, no step"),
            fields: f,
            notes,
        }));
    }
    let step_list = step_list.unwrap_or_default();
    let (step_var, step_id) = step.unwrap_or(("default".into(), "0".into()));
    let nodes =
        expand(&step_list).map_err(|e| ClusterError(format!("SLURM_STEP_NODELIST: {e}")))?;
    if nodes.is_empty() {
        return fail("SLURM_STEP_NODELIST is empty".into());
    }
    let nnodes = match num(env, "SLURM_STEP_NUM_NODES")? {
        Some(n) if n != nodes.len() => {
            return fail(format!(
                "SLURM_STEP_NUM_NODES={n} but SLURM_STEP_NODELIST={step_list} holds {} nodes",
                nodes.len()
            ))
        }
        Some(n) => src(n, "SLURM_STEP_NUM_NODES"),
        None => src(nodes.len(), "SLURM_STEP_NODELIST"),
    }
    .expect("some");
    let node_id = num(env, "SLURM_NODEID")?
        .ok_or_else(|| ClusterError("SLURM_STEP_NODELIST is set but SLURM_NODEID is not".into()))?;
    if node_id >= nodes.len() {
        return fail(format!(
            "SLURM_NODEID={node_id} is not below the node count {} (SLURM_STEP_NODELIST={step_list})",
            nodes.len()
        ));
    }
    if let Some(me) = env.get("SLURMD_NODENAME") {
        if nodes[node_id] != me {
            return fail(match nodes.iter().position(|n| *n == me) {
                Some(i) => format!(
                    "SLURMD_NODENAME={me} is at index {i} of SLURM_STEP_NODELIST={step_list}, but SLURM_NODEID={node_id}"
                ),
                None => format!(
                    "own host SLURMD_NODENAME={me} is missing from SLURM_STEP_NODELIST={step_list}"
                ),
            });
        }
    }
    let tasks_here = match first(env, &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]) {
        Some((var, text)) => {
            let counts = expand_counts_for(&text, nodes.len(), &var, "SLURM_STEP_NODELIST")
                .map_err(ClusterError)?;
            let total: u64 = counts.iter().map(|c| *c as u64).sum();
            if let Some(n) = num(env, "SLURM_STEP_NUM_TASKS")? {
                if n as u64 != total {
                    return fail(format!(
                        "{var}={text} sums to {total} tasks but SLURM_STEP_NUM_TASKS={n}"
                    ));
                }
            }
            (counts[node_id] as usize, var)
        }
        None => (1, "default (no SLURM_STEP_TASKS_PER_NODE)".into()),
    };
    let step_n: u64 = step_id.trim().parse().unwrap_or(0);
    let port = match env.get("SLURM_STEP_RESV_PORTS") {
        Some(p) => {
            let firstp = p
                .split([',', '-'])
                .next()
                .and_then(|x| x.trim().parse::<u16>().ok())
                .ok_or_else(|| {
                    ClusterError(format!("SLURM_STEP_RESV_PORTS={p:?} is not a port list"))
                })?;
            src(firstp, "SLURM_STEP_RESV_PORTS")
        }
        None => src(
            derived_port(job_n, step_n),
            format!("derived from {job_var}+{step_var}"),
        ),
    };
    f.master_addr = src(nodes[0].clone(), "first host of SLURM_STEP_NODELIST");
    f.master_port = port;
    f.run_id = src(
        format!("{job}.{}", step_id.trim()),
        format!("{job_var}.{step_var}"),
    );
    f.backend = src("static".into(), "Slurm step: fixed node set");
    f.node_rank = src(node_id, "SLURM_NODEID");
    f.node_list = src(nodes.clone(), "SLURM_STEP_NODELIST");
    f.nnodes = src(
        NodeCount {
            min: nnodes.value,
            max: nnodes.value,
        },
        nnodes.source,
    );
    if kind == Some("interactive") {
        if let Some(jn) = num(env, "SLURM_JOB_NUM_NODES")? {
            if jn > 1 {
                notes.push(format!("interactive step on one node of a {jn}-node job (SLURM_JOB_NUM_NODES={jn}); using the step's own values"));
            }
        }
    }
    if tasks_here.0 > 1 {
        let k = tasks_here.0;
        f.mode = src(
            Mode::InPlace,
            format!("{}: {k} tasks on this node", tasks_here.1),
        );
        f.rank = Some(sourced_num(env, "SLURM_PROCID")?.ok_or_else(|| {
            ClusterError("SLURM_PROCID unset in a step with several tasks per node".into())
        })?);
        f.local_rank = Some(sourced_num(env, "SLURM_LOCALID")?.ok_or_else(|| {
            ClusterError("SLURM_LOCALID unset in a step with several tasks per node".into())
        })?);
        f.world_size = match first(env, &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"]) {
            Some((var, _)) => sourced_num(env, &var)?,
            None => {
                return fail(
                    "SLURM_STEP_NUM_TASKS unset in a step with several tasks per node".into(),
                )
            }
        };
        f.local_world_size = src(k, tasks_here.1);
        f.nproc = src("1".into(), "in-place (one worker per Slurm task)");
        // Task 0 hosts the store at the endpoint, the first host of the step.
        if f.rank.as_ref().map(|r| r.value) == Some(0) && node_id != 0 {
            return fail(format!(
                "SLURM_PROCID=0 runs on node {node_id} ({}) of SLURM_STEP_NODELIST={step_list}, not on its first host {}: task 0 hosts the rendezvous store there; use a block or cyclic distribution",
                nodes[node_id], nodes[0]
            ));
        }
    } else {
        f.mode = src(
            Mode::Node,
            format!("{}: one task on this node", tasks_here.1),
        );
    }
    Ok(Some(Layer {
        name: "slurm-step".into(),
        detail: format!("job {job} step {}", step_id.trim()),
        fields: f,
        notes,
    }))
}

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

/// Open MPI, MPICH/Intel MPI, MVAPICH2: rank and size (in-place mode), or node mode with one
/// rank per host. Node identity across hosts is in no variable (never `OMPI_COMM_WORLD_NODE_RANK`).
pub fn mpi(env: &dyn Env, host: &HostFacts<'_>) -> R<Option<Layer>> {
    let flavours: [(&str, [&str; 4]); 3] = [
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
    let Some((name, vars)) = flavours.iter().find(|(_, v)| env.get(v[1]).is_some()) else {
        return Ok(None);
    };
    let need = |i: usize| -> R<Sourced<usize>> {
        sourced_num(env, vars[i])?
            .ok_or_else(|| ClusterError(format!("{} is set but {} is not", vars[1], vars[i])))
    };
    let (rank, size) = (need(0)?, need(1)?);
    let mut f = Fields::default();
    f.devices = devices(env);
    let (local_rank, local_size) = if env.get(vars[2]).is_none() && env.get(vars[3]).is_none() {
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
    } else {
        (need(2)?, need(3)?)
    };
    let job_seed = first(
        env,
        &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"],
    );
    let seed = |(var, v): &(String, String)| -> (u64, String) {
        let h = v
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
        (h, var.clone())
    };
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
    }
    Ok(Some(Layer {
        name: format!("mpi {name}"),
        detail: String::new(),
        fields: f,
        notes: Vec::new(),
    }))
}

/// Kubernetes without `PET_*`: Volcano, Indexed Job / JobSet, PyTorchJob pod variables.
pub fn kubernetes(env: &dyn Env, host: &HostFacts<'_>, forced: bool) -> R<Option<Layer>> {
    if env.get("KUBERNETES_SERVICE_HOST").is_none() && !forced {
        return Ok(None);
    }
    let mut f = Fields::default();
    f.devices = devices(env);
    let short = host
        .hostname
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string();
    let default_port = |f: &mut Fields, what: &str| {
        if let Some(p) = env
            .get("MASTER_PORT")
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            f.master_port = src(p, "MASTER_PORT");
        } else {
            f.master_port = src(29500, format!("torchrun default ({what})"));
        }
    };
    // Volcano: the svc plugin's VC_<TASK>_HOSTS lists, master task first.
    if let Some((idx_var, _)) = first(env, &["VC_TASK_INDEX", "VK_TASK_INDEX"]) {
        let mut tasks: Vec<String> = env
            .names()
            .into_iter()
            .filter_map(|n| {
                n.strip_prefix("VC_")?
                    .strip_suffix("_HOSTS")
                    .map(str::to_string)
            })
            .collect();
        tasks.sort_by_key(|t| (t != "MASTER", t.clone()));
        let mut nodes = Vec::new();
        for t in &tasks {
            let hosts: Vec<String> = env
                .get(&format!("VC_{t}_HOSTS"))
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(n) = num(env, &format!("VC_{t}_NUM"))? {
                if n != hosts.len() {
                    return fail(format!(
                        "VC_{t}_NUM={n} but VC_{t}_HOSTS lists {} hosts",
                        hosts.len()
                    ));
                }
            }
            nodes.extend(hosts);
        }
        let pos = nodes
            .iter()
            .position(|h| h.split('.').next() == Some(short.as_str()));
        if !nodes.is_empty() {
            let listed = tasks
                .iter()
                .map(|t| format!("VC_{t}_HOSTS"))
                .collect::<Vec<_>>()
                .join("+");
            let Some(pos) = pos else {
                return fail(format!("own host {short} is missing from {listed}"));
            };
            f.node_rank = src(pos, format!("position of {short} in {listed}"));
            f.nnodes = src(
                NodeCount {
                    min: nodes.len(),
                    max: nodes.len(),
                },
                listed.clone(),
            );
            f.master_addr = match env.get("MASTER_ADDR") {
                Some(m) => src(m, "MASTER_ADDR"),
                None => src(nodes[0].clone(), format!("first host of {listed}")),
            };
            f.node_list = src(nodes, listed);
        } else {
            // Only the pytorch plugin: pod-level RANK/WORLD_SIZE count pods (nodes).
            f.node_rank = sourced_num(env, "RANK")?.map(|s| Sourced {
                source: "RANK (Volcano pod index)".into(),
                ..s
            });
            f.nnodes = num(env, "WORLD_SIZE")?.and_then(|n| {
                src(
                    NodeCount { min: n, max: n },
                    "WORLD_SIZE (Volcano pod count)",
                )
            });
            f.master_addr = env.get("MASTER_ADDR").and_then(|m| src(m, "MASTER_ADDR"));
            if f.node_rank.is_none() {
                return fail(format!("Volcano ({idx_var} set) without VC_<TASK>_HOSTS (svc plugin) or RANK (pytorch plugin): cannot tell this pod's node rank"));
            }
        }
        default_port(&mut f, "Volcano");
        f.mode = src(Mode::Node, idx_var);
        f.backend = src("static".into(), "Volcano job: fixed pods");
        return Ok(Some(Layer {
            name: "kubernetes volcano".into(),
            fields: f,
            ..Layer::default()
        }));
    }
    // Indexed Job / JobSet: the completion index, and the hostname pattern for the master.
    if let Some(idx) = num(env, "JOB_COMPLETION_INDEX")? {
        let tail = format!("-{idx}");
        let Some(prefix) = short.strip_suffix(&tail) else {
            return fail(format!(
                "JOB_COMPLETION_INDEX={idx} but hostname {short} does not end in {tail} (Indexed Job pods are <job>-<index>)"
            ));
        };
        let jobset = prefix
            .rsplit_once('-')
            .filter(|(_, j)| !j.is_empty() && j.bytes().all(|b| b.is_ascii_digit()))
            .map(|(p, j)| (p.to_string(), j.parse::<usize>().unwrap_or(0)));
        let subdomain = host
            .fqdn
            .as_deref()
            .and_then(|q| q.strip_prefix(&format!("{short}.")))
            .map(|d| format!(".{d}"))
            .unwrap_or_default();
        let (name, master) = match &jobset {
            Some((p, 0)) => ("kubernetes jobset", format!("{p}-0-0{subdomain}")),
            Some((_, j)) => {
                return fail(format!(
                    "JobSet pod {short} belongs to child Job {j}: its node rank needs the completions per Job; pass --node-rank (or RDRUN_NODE_RANK)"
                ))
            }
            None => ("kubernetes indexed-job", format!("{prefix}-0{subdomain}")),
        };
        f.node_rank = src(idx, "JOB_COMPLETION_INDEX");
        f.master_addr = src(master, format!("hostname {short} with index 0"));
        default_port(&mut f, "Indexed Job");
        f.mode = src(Mode::Node, "JOB_COMPLETION_INDEX");
        f.backend = src("static".into(), "Indexed Job: fixed pods");
        // The completion count is in no variable: nnodes must come from --nnodes/RDRUN_NNODES.
        return Ok(Some(Layer {
            name: name.into(),
            fields: f,
            ..Layer::default()
        }));
    }
    // PyTorchJob pod variables without PET_*: RANK/WORLD_SIZE count pods.
    if let (Some(m), Some(r), Some(w)) = (
        env.get("MASTER_ADDR"),
        num(env, "RANK")?,
        num(env, "WORLD_SIZE")?,
    ) {
        f.master_addr = src(m, "MASTER_ADDR");
        default_port(&mut f, "PyTorchJob");
        f.node_rank = src(r, "RANK (PyTorchJob pod index)");
        f.nnodes = src(
            NodeCount { min: w, max: w },
            "WORLD_SIZE (PyTorchJob pod count)",
        );
        f.mode = src(Mode::Node, "MASTER_ADDR+RANK+WORLD_SIZE");
        f.backend = src("static".into(), "PyTorchJob: fixed pods");
        return Ok(Some(Layer {
            name: "kubernetes pytorchjob-v1 (no PET_*)".into(),
            fields: f,
            ..Layer::default()
        }));
    }
    Ok(None)
}

/// Unique hosts in first-appearance order with their slot counts.
fn unique_slots(hosts: impl IntoIterator<Item = (String, usize)>) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for (h, n) in hosts {
        match out.iter_mut().find(|(x, _)| *x == h) {
            Some(e) => e.1 += n,
            None => out.push((h, n)),
        }
    }
    out
}

/// Finds this host in a node list: by hostname, short name, FQDN or a local address.
/// Several matches is an error naming them.
fn find_self(hosts: &[String], host: &HostFacts<'_>, what: &str) -> R<usize> {
    let short = host.hostname.split('.').next().unwrap_or_default();
    let mut names: Vec<&str> = vec![&host.hostname, short];
    if let Some(q) = &host.fqdn {
        names.push(q);
    }
    names.extend(host.addresses.iter().map(String::as_str));
    let hits: Vec<usize> = hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| {
            let h = h.rsplit('@').next().unwrap_or(h);
            // An address literal is compared as an address (`fd00:0::1` is `fd00::1`), and
            // matches when it is this machine's own; a name by its text, or its first label.
            if let Some(ip) = super::ip_literal(h) {
                return (host.is_local_ip)(ip)
                    || host
                        .addresses
                        .iter()
                        .any(|a| super::ip_literal(a) == Some(ip));
            }
            names.contains(&h) || names.contains(&h.split('.').next().unwrap_or(h))
        })
        .map(|(i, _)| i)
        .collect();
    match hits.as_slice() {
        [i] => Ok(*i),
        [] => fail(format!("own host {} is missing from {what}", host.hostname)),
        many => fail(format!(
            "{what}: this host ({}) matches several entries: {}",
            host.hostname,
            many.iter()
                .map(|i| hosts[*i].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// LSF: hosts from `LSB_MCPU_HOSTS` (`host n` pairs), `LSB_HOSTS` (one per slot) or the
/// `LSB_DJOB_HOSTFILE`; this host found by name; the first host is the endpoint.
pub fn lsf(env: &dyn Env, host: &HostFacts<'_>) -> R<Option<Layer>> {
    let Some(job) = env.get("LSB_JOBID") else {
        return Ok(None);
    };
    let (var, hosts) = if let Some(m) = env.get("LSB_MCPU_HOSTS") {
        let t: Vec<&str> = m.split_whitespace().collect();
        if t.len() % 2 != 0 {
            return fail(format!(
                "LSB_MCPU_HOSTS={m:?} is not \"host n host n ...\" pairs"
            ));
        }
        let mut pairs = Vec::new();
        for c in t.chunks(2) {
            let n = c[1].parse().map_err(|_| {
                ClusterError(format!("LSB_MCPU_HOSTS: {:?} is not a slot count", c[1]))
            })?;
            pairs.push((c[0].to_string(), n));
        }
        ("LSB_MCPU_HOSTS", unique_slots(pairs))
    } else if let Some(h) = env.get("LSB_HOSTS") {
        (
            "LSB_HOSTS",
            unique_slots(h.split_whitespace().map(|x| (x.to_string(), 1))),
        )
    } else if let Some(p) = env.get("LSB_DJOB_HOSTFILE") {
        let text =
            (host.read_file)(&p).map_err(|e| ClusterError(format!("LSB_DJOB_HOSTFILE: {e}")))?;
        (
            "LSB_DJOB_HOSTFILE",
            unique_slots(text.split_whitespace().map(|x| (x.to_string(), 1))),
        )
    } else {
        return Ok(None);
    };
    let mut notes = Vec::new();
    let mut hosts = hosts;
    // CORAL/jsrun machines list the launch node first; it runs no tasks.
    if hosts.len() > 1 && hosts[0].0.starts_with("batch") {
        notes.push(format!("{var}: dropped launch node {}", hosts[0].0));
        hosts.remove(0);
    }
    let names: Vec<String> = hosts.iter().map(|h| h.0.clone()).collect();
    let me = find_self(&names, host, var)?;
    let mut f = Fields::default();
    f.mode = src(Mode::Node, "LSB_JOBID");
    f.nnodes = src(
        NodeCount {
            min: names.len(),
            max: names.len(),
        },
        var,
    );
    f.node_rank = src(me, format!("position of this host in {var}"));
    f.master_addr = src(names[0].clone(), format!("first host of {var}"));
    let jobn = job.trim().parse::<u64>().unwrap_or(0);
    f.master_port = src(derived_port(jobn, 0), "derived from LSB_JOBID");
    f.run_id = src(format!("lsf-{}", job.trim()), "LSB_JOBID");
    f.backend = src("static".into(), "LSF job: fixed hosts");
    // LSF slots are CPU slots (`bsub -n 64 -R "span[ptile=32]"` asks for cores), so they never
    // set the workers: a GPU job's workers are the GPUs LSF gave this host (`bsub -gpu` sets
    // CUDA_VISIBLE_DEVICES), else torchrun's default of 1. A hostfile's `slots=N` differ: there
    // they are DeepSpeed's device slots (docs/compat.md).
    let slots_here = hosts[me].1;
    f.devices = devices(env);
    match f.devices.as_ref().filter(|d| !d.value.is_empty()) {
        Some(d) => {
            f.nproc = src(
                d.value.len().to_string(),
                "CUDA_VISIBLE_DEVICES (the GPUs LSF gave this host)",
            );
        }
        None if slots_here > 1 => notes.push(format!(
            "{var} gives this host {slots_here} slots: LSF slots are CPU slots, not workers (workers: --nproc-per-node, else the GPUs in CUDA_VISIBLE_DEVICES)"
        )),
        None => {}
    }
    f.node_list = src(names, var);
    Ok(Some(Layer {
        name: "lsf".into(),
        detail: format!("job {}", job.trim()),
        fields: f,
        notes,
    }))
}

/// One parsed hostfile entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub host: String,
    pub slots: Option<usize>,
}

/// The union of DeepSpeed's `host slots=N` and Open MPI's dialects (`host`, `host slots=N`,
/// `host:N`, `max_slots` ignored, `#`/`//` comments); repeats merge in first-seen order (with a
/// note, since DeepSpeed rejects them).
pub fn parse_hostfile(path: &str, text: &str) -> R<(Vec<HostEntry>, Vec<String>)> {
    let mut out: Vec<HostEntry> = Vec::new();
    let mut notes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let line = line.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let bad = |what: &str| ClusterError(format!("{path}:{}: {what} in {raw:?}", i + 1));
        let (host, mut slots) = match first.rsplit_once(':') {
            Some((h, n))
                if !h.contains(':') && n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty() =>
            {
                (
                    h.to_string(),
                    Some(n.parse().map_err(|_| bad("bad slot count"))?),
                )
            }
            _ => (first.to_string(), None),
        };
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| bad("expected key=value"))?;
            match k {
                "slots" | "count" | "cpu" => {
                    slots = Some(v.parse().map_err(|_| bad("bad slot count"))?)
                }
                k if k.contains("max") => {}
                _ => return Err(bad(&format!("unknown key {k:?}"))),
            }
        }
        match out.iter_mut().find(|e| e.host == host) {
            Some(e) => {
                notes.push(format!(
                    "{path}: {host} listed more than once; slots merged"
                ));
                e.slots = match (e.slots, slots) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            None => out.push(HostEntry { host, slots }),
        }
    }
    if out.is_empty() {
        return fail(format!("hostfile {path} lists no hosts"));
    }
    Ok((out, notes))
}

/// The source of the devices a hostfile filter chose; `config` gives them to the workers as
/// CUDA_VISIBLE_DEVICES (DeepSpeed: slots are device indices).
pub const FILTER_DEVICES: &str = "slots kept by --include/--exclude";

/// A hostfile named by `--hostfile`, `RDRUN_HOSTFILE` or `OMPI_MCA_orte_default_hostfile`,
/// filtered by `--include`/`--exclude` (`flags`) with DeepSpeed's documented semantics.
pub fn hostfile(env: &dyn Env, host: &HostFacts<'_>, flags: &Fields) -> R<Option<Layer>> {
    let named = flags.hostfile.clone().or_else(|| {
        first(env, &["RDRUN_HOSTFILE", "OMPI_MCA_orte_default_hostfile"]).map(|(var, p)| Sourced {
            value: p,
            source: var,
        })
    });
    let Some(named) = named else {
        return Ok(None);
    };
    let text = (host.read_file)(&named.value)
        .map_err(|e| ClusterError(format!("hostfile {} ({}): {e}", named.value, named.source)))?;
    let (entries, notes) = parse_hostfile(&named.value, &text)?;
    let what = format!("hostfile {} ({})", named.value, named.source);
    let include = flags.include.as_ref().map(|s| s.value.as_str());
    let exclude = flags.exclude.as_ref().map(|s| s.value.as_str());
    // (host, slots chosen by a filter)
    let kept: Vec<(String, Option<Vec<usize>>)> = if include.is_some() || exclude.is_some() {
        let mut hosts = Vec::new();
        for e in &entries {
            let Some(n) = e.slots else {
                return fail(format!(
                    "--include/--exclude select slots, but {} has no slots=N in {what}",
                    e.host
                ));
            };
            hosts.push((e.host.clone(), n));
        }
        let chosen = resource_filter(&hosts, include, exclude)?;
        if chosen.is_empty() {
            return fail(format!("--include/--exclude leave no host of {what}"));
        }
        let all: Vec<String> = entries.iter().map(|e| e.host.clone()).collect();
        let names: Vec<String> = chosen.iter().map(|c| c.0.clone()).collect();
        if find_self(&names, host, &what).is_err() && find_self(&all, host, &what).is_ok() {
            let flag = if include.is_some() {
                "--include"
            } else {
                "--exclude"
            };
            return fail(format!(
                "this host ({}) is left out of {what} by {flag}: it takes no part in the job; start rdrun only on {}",
                host.hostname,
                names.join(", ")
            ));
        }
        chosen.into_iter().map(|(h, s)| (h, Some(s))).collect()
    } else {
        entries.iter().map(|e| (e.host.clone(), None)).collect()
    };
    let names: Vec<String> = kept.iter().map(|e| e.0.clone()).collect();
    let me = find_self(&names, host, &what)?;
    let mut f = Fields::default();
    f.mode = src(Mode::Node, what.clone());
    f.nnodes = src(
        NodeCount {
            min: names.len(),
            max: names.len(),
        },
        what.clone(),
    );
    f.node_rank = src(me, format!("position of this host in {what}"));
    let h0 = names[0].rsplit('@').next().unwrap_or(&names[0]);
    // MASTER_ADDR is a bare address, as torch's TCPStore takes it (`[fd00::1]` is `fd00::1`).
    let h0 = super::ip_literal(h0).map_or_else(|| h0.to_string(), |ip| ip.to_string());
    f.master_addr = src(h0, format!("first host of {what}"));
    f.master_port = src(29500, "torchrun default (hostfile)");
    f.backend = src("static".into(), "hostfile: fixed hosts");
    match &kept[me].1 {
        Some(slots) => {
            f.nproc = src(slots.len().to_string(), FILTER_DEVICES);
            f.devices = src(slots.iter().map(usize::to_string).collect(), FILTER_DEVICES);
        }
        None => {
            let mine = entries.iter().find(|e| e.host == names[me]);
            if let Some(s) = mine.and_then(|e| e.slots) {
                f.nproc = src(s.to_string(), format!("slots of this host in {what}"));
            }
        }
    }
    f.node_list = src(names, what);
    Ok(Some(Layer {
        name: "hostfile".into(),
        detail: named.value.clone(),
        fields: f,
        notes,
    }))
}

/// DeepSpeed's *documented* `-i/--include` and `-e/--exclude` semantics
/// (`parse_resource_filter`; its CLI deviates since PR #6530): `NAME[:SLOT[,SLOT…]]` specs joined
/// by `@`; include starts empty, exclude starts from every slot; an unknown host or slot is an
/// error; hosts left empty are dropped; hostfile order kept; slots merged and sorted.
pub fn resource_filter(
    hosts: &[(String, usize)],
    include: Option<&str>,
    exclude: Option<&str>,
) -> R<Vec<(String, Vec<usize>)>> {
    let spec = match (include, exclude) {
        (Some(_), Some(_)) => return fail("--include and --exclude are mutually exclusive".into()),
        (None, None) => {
            return Ok(hosts
                .iter()
                .map(|(h, n)| (h.clone(), (0..*n).collect()))
                .collect())
        }
        (Some(s), None) | (None, Some(s)) => s,
    };
    let including = include.is_some();
    let mut chosen: Vec<Vec<usize>> = hosts
        .iter()
        .map(|(_, n)| {
            if including {
                Vec::new()
            } else {
                (0..*n).collect()
            }
        })
        .collect();
    let flag = if including { "--include" } else { "--exclude" };
    for node in spec.split('@').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, slots) = match node.split_once(':') {
            Some((n, s)) => (n, Some(s)),
            None => (node, None),
        };
        let Some(i) = hosts.iter().position(|(h, _)| h == name) else {
            return fail(format!(
                "{flag} {spec:?}: host {name:?} is not in the hostfile"
            ));
        };
        let slots: Vec<usize> = match slots {
            None => (0..hosts[i].1).collect(),
            Some(s) => {
                let mut v = Vec::new();
                for t in s.split(',') {
                    let n: usize = t.trim().parse().map_err(|_| {
                        ClusterError(format!(
                            "{flag} {spec:?}: slot {t:?} of {name} is not a number"
                        ))
                    })?;
                    if n >= hosts[i].1 {
                        return fail(format!(
                            "{flag} {spec:?}: No slot '{n}' specified on host '{name}'"
                        ));
                    }
                    v.push(n);
                }
                v
            }
        };
        if including {
            chosen[i].extend(slots);
        } else if node.contains(':') {
            chosen[i].retain(|s| !slots.contains(s));
        } else {
            chosen[i].clear();
        }
    }
    Ok(hosts
        .iter()
        .zip(chosen)
        .filter_map(|((h, _), mut s)| {
            s.sort_unstable();
            s.dedup();
            (!s.is_empty()).then(|| (h.clone(), s))
        })
        .collect())
}
