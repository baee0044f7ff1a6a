//! One reader per source of topology, each a pure function of the environment and
//! [`HostFacts`] returning the [`Layer`] it defines (or `None` when its source is absent). The
//! variables and their meaning are the scheduler's own (spec cluster.md §1–4); the sources
//! named in each field are the variables read, so the printed topology can say where each
//! value came from.
//!
//! This file holds the field helpers every reader shares and the two launcher-agnostic layers
//! (`RDRUN_*`, `PET_*`); each scheduler's reader has its own file.

// Each reader fills its `Fields` one variable at a time, in the order the scheduler defines
// them; a struct literal would hide that order.
#![allow(clippy::field_reassign_with_default)]

use super::hostlist::{expand, expand_counts_for};
use super::{
    derived_port, src, ClusterChoice, ClusterError, Env, Fields, HostFacts, Layer, Mode, NodeCount,
    Sourced,
};

mod hostfile;
mod kubernetes;
mod lsf;
mod mpi;
mod slurm;

pub use hostfile::{hostfile, parse_hostfile, resource_filter, HostEntry, FILTER_DEVICES};
pub use kubernetes::kubernetes;
pub use lsf::lsf;
pub use mpi::{mpi, mpi_rank_size};
pub use slurm::slurm;

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
