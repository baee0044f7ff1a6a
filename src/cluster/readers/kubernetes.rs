//! The Kubernetes reader without `PET_*`: Volcano, Indexed Job/JobSet and PyTorchJob pod variables.

#![allow(clippy::field_reassign_with_default)]

use super::*;

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
    if let Some((idx_var, _)) = first(env, &["VC_TASK_INDEX", "VK_TASK_INDEX"]) {
        return volcano(env, f, &short, idx_var).map(Some);
    }
    if let Some(idx) = num(env, "JOB_COMPLETION_INDEX")? {
        return indexed_job(env, host, f, &short, idx).map(Some);
    }
    // PyTorchJob pod variables without PET_*: RANK/WORLD_SIZE count pods.
    if let (Some(m), Some(r), Some(w)) = (
        env.get("MASTER_ADDR"),
        num(env, "RANK")?,
        num(env, "WORLD_SIZE")?,
    ) {
        f.master_addr = src(m, "MASTER_ADDR");
        default_port(env, &mut f, "PyTorchJob");
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

/// `MASTER_PORT` when it is a port, else torchrun's default (`what`: the job kind).
fn default_port(env: &dyn Env, f: &mut Fields, what: &str) {
    if let Some(p) = env
        .get("MASTER_PORT")
        .and_then(|p| p.trim().parse::<u16>().ok())
    {
        f.master_port = src(p, "MASTER_PORT");
    } else {
        f.master_port = src(29500, format!("torchrun default ({what})"));
    }
}

/// Volcano: the svc plugin's `VC_<TASK>_HOSTS` lists (master task first), else the pytorch
/// plugin's pod-level RANK/WORLD_SIZE.
fn volcano(env: &dyn Env, mut f: Fields, short: &str, idx_var: String) -> R<Layer> {
    let (tasks, nodes) = volcano_hosts(env)?;
    let pos = nodes
        .iter()
        .position(|h| h.split('.').next() == Some(short));
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
    default_port(env, &mut f, "Volcano");
    f.mode = src(Mode::Node, idx_var);
    f.backend = src("static".into(), "Volcano job: fixed pods");
    Ok(Layer {
        name: "kubernetes volcano".into(),
        fields: f,
        ..Layer::default()
    })
}

/// The Volcano tasks (master first, then by name) and their hosts in that order, each
/// `VC_<TASK>_NUM` checked against its list.
fn volcano_hosts(env: &dyn Env) -> R<(Vec<String>, Vec<String>)> {
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
    Ok((tasks, nodes))
}

/// Indexed Job / JobSet: the completion index, and the hostname pattern for the master.
fn indexed_job(
    env: &dyn Env,
    host: &HostFacts<'_>,
    mut f: Fields,
    short: &str,
    idx: usize,
) -> R<Layer> {
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
    default_port(env, &mut f, "Indexed Job");
    f.mode = src(Mode::Node, "JOB_COMPLETION_INDEX");
    f.backend = src("static".into(), "Indexed Job: fixed pods");
    // The completion count is in no variable: nnodes must come from --nnodes/RDRUN_NNODES.
    Ok(Layer {
        name: name.into(),
        fields: f,
        ..Layer::default()
    })
}
