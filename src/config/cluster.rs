//! The cluster step of [`super::resolve`]: what a scheduler put in the environment
//! ([`crate::cluster::detect`]) becomes the launch's nnodes, node rank, endpoint, backend, run id
//! and workers per node, unless the command line said otherwise; and the resolved topology that
//! rdrun prints before spawning (`--dry-run`, `--print-topology[=json]`).
//!
//! Precedence is the cluster module's: values typed on the command line
//! ([`LaunchArgs::cli_given`]) are its "flags" layer and win every field; `RDRUN_*`, `PET_*` and
//! the schedulers follow. The detected values arrive typed and are laid over the typed
//! layout ([`super::layout`]); nothing is written back into the parsed arguments as text.

use crate::cli::{EnvFn, LaunchArgs};
use crate::cluster::{self, ClusterChoice, Fields, HostFacts, Mode, NodeCount, Sourced, Topology};

use super::endpoint::parse_endpoint;
use super::error::ConfigError;
use super::layout::{EndpointSpec, Layout, Origin};
use super::spec::{NodeRange, RdzvBackend};
use super::types::{ClusterPlan, InPlace, LaunchConfig, TopologyFormat};

impl ClusterPlan {
    /// What rdrun prints before spawning: the full block on node 0 (and for a dry run), one line
    /// on the other nodes; `None` for a local run that is not a dry run (torchrun prints nothing).
    pub fn banner(&self) -> Option<String> {
        match self.dry_run {
            Some(TopologyFormat::Json) => {
                let mut j = cluster::render::json(&self.topology);
                if let (Some(run), Some(o)) = (&self.run, j.as_object_mut()) {
                    o.insert("run".into(), run.json());
                }
                Some(format!("{j}\n"))
            }
            Some(TopologyFormat::Text) => {
                let mut s = cluster::render::text(&self.topology);
                if let Some(run) = &self.run {
                    s.push_str(&run.text());
                }
                Some(s)
            }
            None if !self.detected => None,
            None => {
                let rank = match &self.in_place {
                    Some(p) => Some(p.rank),
                    None => self.topology.fields.node_rank.as_ref().map(|r| r.value),
                };
                if rank == Some(0) {
                    Some(cluster::render::text(&self.topology))
                } else {
                    Some(format!("{}\n", cluster::render::one_line(&self.topology)))
                }
            }
        }
    }
}

/// [`cluster::Env`] over the resolver's lookup function; names (only Volcano's `VC_*_HOSTS`
/// needs them) are the process environment's that the lookup also sees.
struct LookupEnv<'a>(EnvFn<'a>);

impl cluster::Env for LookupEnv<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name)
    }
    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| (self.0)(k).is_some())
            .collect()
    }
}

fn read_file(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

/// getaddrinfo(3) with AI_CANONNAME: the canonical name of `host` (in a pod, the kubelet's
/// /etc/hosts line `<ip> <host>.<subdomain>.<ns>.svc.<domain> <host>`), bounded by `limit` on a
/// helper thread since a resolver may not answer.
fn canonical_name(host: &str, limit: std::time::Duration) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let host = host.to_string();
    std::thread::spawn(move || {
        let _ = tx.send(super::host::canonical_name(&host));
    });
    rx.recv_timeout(limit).ok().flatten()
}

/// This machine's facts for the readers (hostname for Kubernetes/LSF/hostfile matching). The
/// FQDN is looked up only for an Indexed Job / JobSet pod, whose master name needs the pod's
/// subdomain (`<job>-0.<subdomain>`).
fn host_facts(env: &dyn cluster::Env) -> HostFacts<'static> {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let fqdn = env
        .get("JOB_COMPLETION_INDEX")
        .and_then(|_| canonical_name(&hostname, std::time::Duration::from_secs(2)))
        .filter(|q| q.starts_with(&format!("{hostname}.")));
    HostFacts {
        hostname,
        fqdn,
        addresses: Vec::new(),
        ppid: Some(std::os::unix::process::parent_id()),
        read_file: &read_file,
        is_local_ip: &is_local_ip,
    }
}

/// Whether `ip` is assigned to an interface here (in this network namespace): only then can a
/// socket be bound to it (the kernel's own test; no interface list to read and keep in sync).
fn is_local_ip(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

fn cluster_error(e: cluster::ClusterError) -> ConfigError {
    ConfigError::Cluster(e.0)
}

/// The command line's typed values as the cluster module's flag layer (a `PET_*` value is the
/// cluster module's own layer).
fn flag_fields(args: &LaunchArgs, p: &Layout) -> Result<Fields, ConfigError> {
    let typed = |o: &Origin| *o == Origin::Flag;
    let mut f = Fields::default();
    if typed(&p.nnodes.origin) {
        let n = p.nnodes.value;
        f.nnodes = cluster::src(
            NodeCount {
                min: n.min,
                max: n.max,
            },
            "--nnodes",
        );
    }
    if typed(&p.node_rank.origin) {
        f.node_rank = cluster::src(p.node_rank.value, "--node-rank");
    }
    match &p.endpoint {
        Some(e) if typed(&e.origin) => {
            if let EndpointSpec::Text(text) = &e.value {
                // The first member (an etcd list names several).
                let first = text.split(',').next().unwrap_or_default();
                let ep = parse_endpoint(first, p.backend.value)?;
                f.master_addr = cluster::src(ep.host, "--rdzv-endpoint");
                f.master_port = cluster::src(ep.port, "--rdzv-endpoint");
            }
        }
        _ => {
            if typed(&p.master_addr.origin) {
                f.master_addr = cluster::src(p.master_addr.value.clone(), "--master-addr");
            }
            if let Some(port) = p.master_port.as_ref().filter(|g| typed(&g.origin)) {
                f.master_port = cluster::src(port.value, "--master-port");
            }
        }
    }
    if typed(&p.backend.origin) {
        f.backend = cluster::src(p.backend_name.clone(), "--rdzv-backend");
    }
    if typed(&p.run_id.origin) {
        f.run_id = cluster::src(p.run_id.value.clone(), "--rdzv-id");
    }
    if typed(&p.nproc.origin) {
        f.nproc = cluster::src(p.nproc.value.clone(), "--nproc-per-node");
    }
    if typed(&p.standalone.origin) {
        f.standalone = cluster::src(true, "--standalone");
    }
    if let Some(h) = &args.hostfile {
        f.hostfile = cluster::src(h.clone(), "--hostfile");
    }
    f.include = args
        .include
        .as_ref()
        .and_then(|v| cluster::src(v.clone(), "--include"));
    f.exclude = args
        .exclude
        .as_ref()
        .and_then(|v| cluster::src(v.clone(), "--exclude"));
    Ok(f)
}

/// Lays an in-place topology over the layout ([`Layout::in_place`]) after refusing the
/// flags that would contradict it (a node count, a node rank, another backend, standalone).
fn apply_in_place(p: &mut Layout, t: &Topology) -> Result<(), ConfigError> {
    let f = &t.fields;
    let (Some(rank), Some(world)) = (&f.rank, &f.world_size) else {
        return Err(ConfigError::Cluster(format!(
            "{}: in-place mode without a rank and world size",
            t.scheduler
        )));
    };
    let what = format!(
        "{}: in-place mode (this rdrun is rank {} of {}, one worker)",
        t.scheduler, rank.value, world.value
    );
    for (origin, flag) in [
        (&p.nnodes.origin, "--nnodes"),
        (&p.node_rank.origin, "--node-rank"),
        (&p.standalone.origin, "--standalone"),
    ] {
        if *origin == Origin::Flag {
            return Err(ConfigError::Cluster(format!(
                "{what}: {flag} cannot apply, the scheduler's ranks are the job; drop it (or pass --cluster none)"
            )));
        }
    }
    if p.backend.origin == Origin::Flag && p.backend.value != RdzvBackend::Static {
        return Err(ConfigError::Cluster(format!(
            "{what}: --rdzv-backend {} cannot apply, the ranks form a fixed world (static); drop it",
            p.backend_name
        )));
    }
    p.in_place(rank, world, f);
    Ok(())
}

/// Detects the scheduler and lays what it found over `p` (the values the command line did not
/// type). `Ok(None)`: a local run (nothing detected, or `--cluster none`).
pub(super) fn apply(
    args: &LaunchArgs,
    p: &mut Layout,
    env: EnvFn<'_>,
) -> Result<Option<Topology>, ConfigError> {
    let lookup = LookupEnv(env);
    let choice = ClusterChoice::resolve(args.cluster.as_deref(), &lookup).map_err(|_| {
        super::error::invalid(
            "--cluster",
            args.cluster
                .clone()
                .or_else(|| env("RDRUN_CLUSTER"))
                .unwrap_or_default(),
            "must be one of auto, none, slurm, k8s, mpi, lsf, hostfile (also RDRUN_CLUSTER)",
        )
    })?;
    if choice == ClusterChoice::None {
        return Ok(None);
    }
    // A PET_* endpoint the cluster layer also reads is checked first, so that a bad one keeps
    // its torchrun-compatible usage error (`PET_RDZV_ENDPOINT='…': …`, exit 2).
    if let Some(e) = p.endpoint.as_ref().filter(|e| e.origin != Origin::Flag) {
        if let EndpointSpec::Text(text) = &e.value {
            parse_endpoint(text, RdzvBackend::C10d).map_err(|err| e.attribute(err))?;
        }
    }
    let facts = host_facts(&lookup);
    let flags = flag_fields(args, p)?;
    let Some(t) = cluster::detect(&lookup, &facts, choice, &flags).map_err(cluster_error)? else {
        return Ok(None);
    };
    // A worker of torchrun/rdrun inherits the scheduler's variables: a second rdrun would form a
    // second world out of them.
    let nested = args.nested || env("RDRUN_NESTED").is_some_and(|v| v == "1");
    cluster::nested_guard(&lookup, nested).map_err(cluster_error)?;
    let f = &t.fields;
    if f.mode.as_ref().map(|m| m.value) == Some(Mode::InPlace) {
        apply_in_place(p, &t)?;
        return Ok(Some(t));
    }
    // `--standalone` under a multi-node scheduler is the headline bug again (a world per node).
    let standalone = p.standalone.value || f.standalone.as_ref().is_some_and(|s| s.value);
    if let Some(n) = f.nnodes.as_ref().filter(|n| n.value.max > 1) {
        let scheduler_count = !n.source.starts_with("--") && !n.source.starts_with("PET_");
        if standalone && scheduler_count {
            return Err(ConfigError::Cluster(format!(
                "--standalone runs one node but {} gives {} nodes ({}): drop --standalone, or pass --cluster none for a local run",
                t.scheduler, n.value, n.source
            )));
        }
    }
    // Flags win every field, but a node range that the scheduler's fixed node set resolved
    // (`cluster::fixed`, issue 38.6) is the topology's only node count that differs from them.
    if let Some(n) = f
        .nnodes
        .as_ref()
        .filter(|_| p.nnodes.origin == Origin::Flag)
    {
        p.nnodes.value = NodeRange {
            min: n.value.min,
            max: n.value.max,
        };
    }
    p.overlay(f)?;
    Ok(Some(t))
}

/// Sets `slot` when nothing set it yet.
fn fill<T>(slot: &mut Option<Sourced<T>>, value: T, source: String) {
    if slot.is_none() {
        *slot = Some(Sourced { value, source });
    }
}

/// In-place mode's values, when the topology is in place with local rank and size.
fn in_place_of(f: &Fields, cfg: &LaunchConfig) -> Option<InPlace> {
    match (&f.mode, &f.local_rank, &f.local_world_size) {
        (Some(m), Some(lr), Some(lws)) if m.value == Mode::InPlace => Some(InPlace {
            // The rendezvous member index and count (apply_in_place wrote RANK/WORLD_SIZE there).
            rank: cfg.node_rank,
            world_size: cfg.nnodes.max,
            local_rank: lr.value,
            local_world_size: lws.value,
            node: match (&f.node_rank, &f.nnodes) {
                (Some(r), Some(n)) => Some((r.value, n.value.max)),
                _ => None,
            },
        }),
        _ => None,
    }
}

/// Where the nodes meet, filled where nothing detected said: standalone's loopback and fresh
/// id, or the endpoint, backend and run id with the flag or variable each came from.
fn fill_meeting(f: &mut Fields, p: &Layout, cfg: &LaunchConfig) {
    if cfg.standalone {
        let why = if p.standalone.value {
            p.standalone.origin.label("--standalone")
        } else {
            "auto (one node, static, no endpoint or port)".to_string()
        };
        fill(&mut f.standalone, true, why);
        fill(
            &mut f.master_addr,
            cfg.master_addr.clone(),
            "standalone (loopback)".into(),
        );
        fill(
            &mut f.run_id,
            cfg.rdzv.run_id.clone(),
            "standalone (fresh)".into(),
        );
    } else {
        if let Some(ep) = &cfg.rdzv.endpoint {
            let (addr, port) = match &p.endpoint {
                Some(e) => {
                    let l = e.origin.label("--rdzv-endpoint");
                    (l.clone(), l)
                }
                None => (
                    p.master_addr.origin.label("--master-addr"),
                    p.master_port
                        .as_ref()
                        .map_or("default".into(), |g| g.origin.label("--master-port")),
                ),
            };
            fill(&mut f.master_addr, ep.host.clone(), addr);
            fill(&mut f.master_port, ep.port, port);
        }
        fill(
            &mut f.backend,
            p.backend_name.clone(),
            p.backend.origin.label("--rdzv-backend"),
        );
        fill(
            &mut f.run_id,
            cfg.rdzv.run_id.clone(),
            p.run_id.origin.label("--rdzv-id"),
        );
    }
}

/// The launch's topology for printing: the detected one completed with the values resolution
/// settled on, each named by where it came from (flag, `PET_*`, default).
pub(super) fn plan(
    detected: Option<Topology>,
    args: &LaunchArgs,
    p: &Layout,
    cfg: &LaunchConfig,
) -> Result<ClusterPlan, ConfigError> {
    let dry_run = match args.print_topology.as_deref() {
        Some("json") => Some(TopologyFormat::Json),
        Some(_) => Some(TopologyFormat::Text),
        None if args.dry_run => Some(TopologyFormat::Text),
        None => None,
    };
    let is_detected = detected.is_some();
    let mut t = detected.unwrap_or_else(|| Topology {
        scheduler: "local (no scheduler detected)".into(),
        fields: Fields::default(),
        notes: Vec::new(),
    });
    let f = &mut t.fields;
    let in_place = in_place_of(f, cfg);
    fill(&mut f.mode, Mode::Node, "default".into());
    // In place, nnodes/node_rank are the node's (GROUP_*), never the member count and index.
    if in_place.is_none() {
        fill(
            &mut f.nnodes,
            NodeCount {
                min: cfg.nnodes.min,
                max: cfg.nnodes.max,
            },
            p.nnodes.origin.label("--nnodes"),
        );
        fill(
            &mut f.node_rank,
            cfg.node_rank,
            p.node_rank.origin.label("--node-rank"),
        );
    }
    fill_meeting(f, p, cfg);
    let nproc = cfg.nproc_per_node.to_string();
    match &mut f.nproc {
        // `auto`/`gpu` from a variable: show the count it resolved to, keep the source.
        Some(n) if n.value != nproc => n.value = format!("{nproc} ({})", n.value),
        Some(_) => {}
        None => f.nproc = cluster::src(nproc, p.nproc.origin.label("--nproc-per-node")),
    }
    let worker_env = match &t.fields.devices {
        Some(d) if d.source == cluster::readers::FILTER_DEVICES => {
            vec![("CUDA_VISIBLE_DEVICES".to_string(), d.value.join(","))]
        }
        _ => Vec::new(),
    };
    Ok(ClusterPlan {
        topology: t,
        detected: is_detected,
        dry_run,
        in_place,
        worker_env,
        run: None,
    })
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
