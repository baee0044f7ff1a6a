//! The Slurm reader: a `srun` step (node mode with one task per node, in-place mode with several)
//! and a batch/salloc context (refused with the `srun` hint when it spans several nodes).

#![allow(clippy::field_reassign_with_default)]

use super::*;

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
    let mut f = Fields::default();
    f.devices = devices(env);
    if let Some(g) = env.get("SLURM_GPUS_ON_NODE") {
        f.nproc = src(g, "SLURM_GPUS_ON_NODE");
    }
    let Some(step_list) = step_list.filter(|_| !matches!(kind, Some("batch") | Some("extern")))
    else {
        return allocation(env, f, &job_var, &job);
    };
    let (step_var, step_id) = step.unwrap_or(("default".into(), "0".into()));
    let (nodes, nnodes) = step_nodes(env, &step_list)?;
    let node_id = own_node(env, &nodes, &step_list)?;
    let tasks_here = tasks_here(env, &nodes, node_id)?;
    let step_n: u64 = step_id.trim().parse().unwrap_or(0);
    f.master_addr = src(nodes[0].clone(), "first host of SLURM_STEP_NODELIST");
    f.master_port = step_port(env, (job_n, &job_var), (step_n, &step_var))?;
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
    let mut notes = Vec::new();
    if kind == Some("interactive") {
        if let Some(jn) = num(env, "SLURM_JOB_NUM_NODES")? {
            if jn > 1 {
                notes.push(format!("interactive step on one node of a {jn}-node job (SLURM_JOB_NUM_NODES={jn}); using the step's own values"));
            }
        }
    }
    if tasks_here.0 > 1 {
        in_place(env, &mut f, tasks_here, node_id, &nodes, &step_list)?;
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

/// A batch script or salloc shell (no step, or the batch/extern step): it runs on one node
/// only, so a job of several nodes is refused with the `srun` hint.
fn allocation(env: &dyn Env, mut f: Fields, job_var: &str, job: &str) -> R<Option<Layer>> {
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
    let job_name = env.get("SLURM_JOB_NAME").unwrap_or_default();
    if job_name == "bash" || job_name == "interactive" {
        return Ok(None);
    }
    f.mode = src(Mode::Node, format!("{job_var} without a step, one node"));
    f.nnodes = src(NodeCount { min: 1, max: 1 }, nodes.1);
    f.node_rank = src(0, "one node");
    f.run_id = src(job.to_string(), job_var.to_string());
    Ok(Some(Layer {
        name: "slurm-allocation".into(),
        detail: format!("job {job}, one node, no step"),
        fields: f,
        notes: Vec::new(),
    }))
}

/// The step's hosts, and its node count (checked against them when Slurm gives one).
fn step_nodes(env: &dyn Env, step_list: &str) -> R<(Vec<String>, Sourced<usize>)> {
    let nodes = expand(step_list).map_err(|e| ClusterError(format!("SLURM_STEP_NODELIST: {e}")))?;
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
    Ok((nodes, nnodes))
}

/// This node's index in the step (`SLURM_NODEID`), checked against the host list and, when
/// set, `SLURMD_NODENAME`.
fn own_node(env: &dyn Env, nodes: &[String], step_list: &str) -> R<usize> {
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
    Ok(node_id)
}

/// The step's task count on this node and the variable it came from (1 without one).
fn tasks_here(env: &dyn Env, nodes: &[String], node_id: usize) -> R<(usize, String)> {
    Ok(
        match first(env, &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]) {
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
        },
    )
}

/// The step's port: the first reserved one, else one derived from the job and step ids.
fn step_port(
    env: &dyn Env,
    (job_n, job_var): (u64, &str),
    (step_n, step_var): (u64, &str),
) -> R<Option<Sourced<u16>>> {
    Ok(match env.get("SLURM_STEP_RESV_PORTS") {
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
    })
}

/// In-place mode (several tasks on this node, one worker each): the task's rank values.
fn in_place(
    env: &dyn Env,
    f: &mut Fields,
    (k, tasks_var): (usize, String),
    node_id: usize,
    nodes: &[String],
    step_list: &str,
) -> R<()> {
    f.mode = src(
        Mode::InPlace,
        format!("{tasks_var}: {k} tasks on this node"),
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
            return fail("SLURM_STEP_NUM_TASKS unset in a step with several tasks per node".into())
        }
    };
    f.local_world_size = src(k, tasks_var);
    f.nproc = src("1".into(), "in-place (one worker per Slurm task)");
    // Task 0 hosts the store at the endpoint, the first host of the step.
    if f.rank.as_ref().map(|r| r.value) == Some(0) && node_id != 0 {
        return fail(format!(
            "SLURM_PROCID=0 runs on node {node_id} ({}) of SLURM_STEP_NODELIST={step_list}, not on its first host {}: task 0 hosts the rendezvous store there; use a block or cyclic distribution",
            nodes[node_id], nodes[0]
        ));
    }
    Ok(())
}
