//! The LSF reader: `LSB_MCPU_HOSTS` / `LSB_HOSTS` host lists.

#![allow(clippy::field_reassign_with_default)]

use super::*;

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
