//! The cluster step of [`super::resolve`]: what a scheduler put in the environment
//! ([`crate::cluster::detect`]) becomes the launch's nnodes, node rank, endpoint, backend, run id
//! and workers per node, unless the command line said otherwise; and the resolved topology that
//! rdrun prints before spawning (`--dry-run`, `--print-topology[=json]`).
//!
//! Precedence is the cluster module's: values typed on the command line
//! ([`LaunchArgs::cli_given`]) are its "flags" layer and win every field; `RDRUN_*`, `PET_*` and
//! the schedulers follow. The detected values are written back into the parsed arguments, so the
//! rest of resolution (endpoint rules, nproc, checks) runs exactly as for typed flags.

use crate::cli::{EnvFn, LaunchArgs};
use crate::cluster::{self, ClusterChoice, Fields, HostFacts, Mode, NodeCount, Sourced, Topology};

use super::{ConfigError, LaunchConfig, RdzvBackend};

/// How the topology is printed by `--dry-run` / `--print-topology[=json]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyFormat {
    Text,
    Json,
}

/// The cluster part of a [`LaunchConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    /// Every field of the launch's topology with where it came from: the detected one, completed
    /// with the values resolution settled on (defaults, flags, `PET_*` of a local run).
    pub topology: Topology,
    /// Whether a scheduler environment was detected (else a local run, as torchrun).
    pub detected: bool,
    /// `--dry-run` / `--print-topology`: print it and exit 0, start nothing.
    pub dry_run: Option<TopologyFormat>,
    /// In-place mode: this rdrun is one rank and runs one worker with these values.
    pub in_place: Option<InPlace>,
    /// Variables every worker gets from the topology: CUDA_VISIBLE_DEVICES = the slots a
    /// hostfile filter kept (DeepSpeed: slots are device indices).
    pub worker_env: Vec<(String, String)>,
    /// A dry run's "what the run would do" rows (`super::dryrun`); `None` otherwise.
    pub run: Option<super::dryrun::RunPreview>,
}

/// A local run that is not a dry run (test fixtures; [`plan`] fills the real one).
impl Default for ClusterPlan {
    fn default() -> Self {
        ClusterPlan {
            topology: Topology {
                scheduler: "local (no scheduler detected)".into(),
                fields: Fields::default(),
                notes: Vec::new(),
            },
            detected: false,
            dry_run: None,
            in_place: None,
            worker_env: Vec::new(),
            run: None,
        }
    }
}

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

/// The command line's values as the cluster module's flag layer. A value that does not parse is
/// left out here and reported by the normal resolution (with its usual message).
fn flag_fields(args: &LaunchArgs) -> Fields {
    let given = |dest: &str| args.cli_given.contains(dest);
    let mut f = Fields::default();
    if given("nnodes") {
        if let Ok(n) = super::parse_nnodes(&args.nnodes) {
            f.nnodes = cluster::src(
                NodeCount {
                    min: n.min,
                    max: n.max,
                },
                "--nnodes",
            );
        }
    }
    if given("node_rank") {
        if let Ok(r) = usize::try_from(args.node_rank) {
            f.node_rank = cluster::src(r, "--node-rank");
        }
    }
    if given("rdzv_endpoint") && !args.rdzv_endpoint.is_empty() {
        let backend = super::parse_backend(&args.rdzv_backend).unwrap_or(RdzvBackend::C10d);
        if let Ok(ep) = super::parse_endpoint(&args.rdzv_endpoint, backend) {
            f.master_addr = cluster::src(ep.host, "--rdzv-endpoint");
            f.master_port = cluster::src(ep.port, "--rdzv-endpoint");
        }
    } else {
        if given("master_addr") {
            f.master_addr = cluster::src(args.master_addr.clone(), "--master-addr");
        }
        if let Some(p) = args
            .master_port
            .filter(|_| given("master_port"))
            .and_then(|p| u16::try_from(p).ok())
        {
            f.master_port = cluster::src(p, "--master-port");
        }
    }
    if given("rdzv_backend") {
        f.backend = cluster::src(args.rdzv_backend.clone(), "--rdzv-backend");
    }
    if given("rdzv_id") {
        f.run_id = cluster::src(args.rdzv_id.clone(), "--rdzv-id");
    }
    if given("nproc_per_node") {
        f.nproc = cluster::src(args.nproc_per_node.clone(), "--nproc-per-node");
    }
    if given("standalone") {
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
    f
}

/// Records where a written-back value came from: one from a single variable is named by it in a
/// later error (`SLURM_GPUS_ON_NODE='x': …`); any other source names no variable.
fn set(dest: &str, source: &str, args: &mut LaunchArgs) {
    let variable = !source.is_empty()
        && source
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if variable {
        args.from_env.insert(dest.to_string(), source.to_string());
    } else {
        args.from_env.remove(dest);
    }
}

/// In-place mode (issue 12): this rdrun is one rank the scheduler started (several Slurm tasks
/// per node, an MPI launcher) and runs exactly one worker with the scheduler's RANK, LOCAL_RANK,
/// WORLD_SIZE and LOCAL_WORLD_SIZE.
///
/// The ranks form a static rendezvous with one member per rank: member index = RANK, members =
/// WORLD_SIZE, one worker each, so the rendezvous' RANK/WORLD_SIZE are the scheduler's own and
/// global rank 0 hosts the one store at the endpoint (a port derived from the job id), which
/// every worker uses as its TCPStore (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun).
/// Only the per-node values differ from a node-mode launch: LOCAL_RANK/LOCAL_WORLD_SIZE come from
/// the scheduler, GROUP_RANK/GROUP_WORLD_SIZE from its node index where it has one (Slurm's
/// SLURM_NODEID), else from the hostnames the ranks publish in the store ([`InPlace::node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    /// `(GROUP_RANK, GROUP_WORLD_SIZE)` when the scheduler gives this node's index; `None`: from
    /// the hostnames of every rank, exchanged in the store (MPI names no node index:
    /// `OMPI_COMM_WORLD_NODE_RANK` is a per-node count, not one).
    pub node: Option<(usize, usize)>,
}

/// Writes an in-place topology into `args`: a static rendezvous of WORLD_SIZE members of one
/// worker each, member index RANK, at the scheduler's endpoint. The flags that would contradict
/// it (a node count, a node rank, another backend, standalone) are refused.
fn apply_in_place(args: &mut LaunchArgs, t: &Topology) -> Result<(), ConfigError> {
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
    for (dest, flag) in [
        ("nnodes", "--nnodes"),
        ("node_rank", "--node-rank"),
        ("standalone", "--standalone"),
    ] {
        if args.cli_given.contains(dest) {
            return Err(ConfigError::Cluster(format!(
                "{what}: {flag} cannot apply, the scheduler's ranks are the job; drop it (or pass --cluster none)"
            )));
        }
    }
    if args.cli_given.contains("rdzv_backend") && args.rdzv_backend != "static" {
        return Err(ConfigError::Cluster(format!(
            "{what}: --rdzv-backend {} cannot apply, the ranks form a fixed world (static); drop it",
            args.rdzv_backend
        )));
    }
    args.nnodes = world.value.to_string();
    set("nnodes", &world.source, args);
    args.node_rank = rank.value as i64;
    set("node_rank", &rank.source, args);
    if !args.cli_given.contains("nproc_per_node") {
        args.nproc_per_node = "1".into();
        args.from_env.remove("nproc_per_node");
    }
    args.rdzv_backend = "static".into();
    args.from_env.remove("rdzv_backend");
    args.standalone = false;
    let typed_endpoint = args.cli_given.contains("rdzv_endpoint") && !args.rdzv_endpoint.is_empty();
    if !typed_endpoint {
        if let Some(a) = f
            .master_addr
            .as_ref()
            .filter(|_| !args.cli_given.contains("master_addr"))
        {
            args.master_addr = a.value.clone();
        }
        if let Some(p) = f
            .master_port
            .as_ref()
            .filter(|_| !args.cli_given.contains("master_port"))
        {
            args.master_port = Some(i64::from(p.value));
        }
    }
    if !args.cli_given.contains("rdzv_id") {
        args.rdzv_id = match &f.run_id {
            Some(id) => id.value.clone(),
            // Every rank must name the same run: the endpoint is the one thing they share.
            None => format!(
                "inplace-{}-{}",
                args.master_addr,
                args.master_port
                    .unwrap_or(i64::from(super::DEFAULT_STATIC_MASTER_PORT))
            ),
        };
        args.from_env.remove("rdzv_id");
    }
    Ok(())
}

/// Detects the scheduler and writes what it found into `args` (fields the command line did not
/// give). `Ok(None)`: a local run (nothing detected, or `--cluster none`).
pub(super) fn apply(
    args: &mut LaunchArgs,
    env: EnvFn<'_>,
) -> Result<Option<Topology>, ConfigError> {
    let lookup = LookupEnv(env);
    let choice = ClusterChoice::resolve(args.cluster.as_deref(), &lookup).map_err(|_| {
        super::invalid(
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
    // The PET_* values the cluster layer also reads are checked first by the flag rules, so that
    // a bad one keeps its torchrun-compatible usage error (`PET_NNODES='2:1': …`, exit 2).
    if args.from_env.contains_key("nnodes") {
        super::parse_nnodes(&args.nnodes)?;
    }
    if args.from_env.contains_key("node_rank") && args.node_rank < 0 {
        return Err(super::invalid(
            "--node-rank",
            args.node_rank.to_string(),
            "must be >= 0",
        ));
    }
    if let Some(p) = args
        .master_port
        .filter(|_| args.from_env.contains_key("master_port"))
    {
        if u16::try_from(p).is_err() {
            return Err(super::invalid(
                "--master-port",
                p.to_string(),
                "must be between 0 and 65535",
            ));
        }
    }
    if args.from_env.contains_key("rdzv_endpoint") && !args.rdzv_endpoint.is_empty() {
        super::parse_endpoint(&args.rdzv_endpoint, RdzvBackend::C10d)?;
    }
    let facts = host_facts(&lookup);
    let Some(t) =
        cluster::detect(&lookup, &facts, choice, &flag_fields(args)).map_err(cluster_error)?
    else {
        return Ok(None);
    };
    // A worker of torchrun/rdrun inherits the scheduler's variables: a second rdrun would form a
    // second world out of them.
    let nested = args.nested || env("RDRUN_NESTED").is_some_and(|v| v == "1");
    cluster::nested_guard(&lookup, nested).map_err(cluster_error)?;
    let f = &t.fields;
    if f.mode.as_ref().map(|m| m.value) == Some(Mode::InPlace) {
        apply_in_place(args, &t)?;
        return Ok(Some(t));
    }
    // `--standalone` under a multi-node scheduler is the headline bug again (a world per node).
    let standalone = args.standalone || f.standalone.as_ref().is_some_and(|s| s.value);
    if let Some(n) = f.nnodes.as_ref().filter(|n| n.value.max > 1) {
        let scheduler_count = !n.source.starts_with("--") && !n.source.starts_with("PET_");
        if standalone && scheduler_count {
            return Err(ConfigError::Cluster(format!(
                "--standalone runs one node but {} gives {} nodes ({}): drop --standalone, or pass --cluster none for a local run",
                t.scheduler, n.value, n.source
            )));
        }
    }
    // Write back what the command line did not give; an overwritten PET_* attribution would name
    // the wrong variable in a later error.
    let typed = args.cli_given.clone();
    let not_typed = |dest: &str| !typed.contains(dest);
    if let Some(n) = f.nnodes.as_ref().filter(|_| not_typed("nnodes")) {
        args.nnodes = n.value.to_string();
        set("nnodes", &n.source, args);
    }
    if let Some(b) = f.backend.as_ref().filter(|_| not_typed("rdzv_backend")) {
        args.rdzv_backend = b.value.clone();
        set("rdzv_backend", &b.source, args);
    }
    // The node rank only means something to the static backend (c10d assigns ranks itself, and
    // warns about a node rank given to it).
    if let Some(r) = f
        .node_rank
        .as_ref()
        .filter(|_| not_typed("node_rank") && args.rdzv_backend == "static")
    {
        args.node_rank = r.value as i64;
        set("node_rank", &r.source, args);
    }
    if let Some(id) = f.run_id.as_ref().filter(|_| not_typed("rdzv_id")) {
        args.rdzv_id = id.value.clone();
        set("rdzv_id", &id.source, args);
    }
    if let Some(n) = f.nproc.as_ref().filter(|_| not_typed("nproc_per_node")) {
        args.nproc_per_node = n.value.clone();
        set("nproc_per_node", &n.source, args);
    }
    if let Some(s) = f.standalone.as_ref().filter(|_| not_typed("standalone")) {
        args.standalone = s.value;
    }
    let typed_endpoint = !not_typed("rdzv_endpoint") && !args.rdzv_endpoint.is_empty();
    if let (Some(a), false) = (&f.master_addr, typed_endpoint) {
        let static_backend = args.rdzv_backend == "static";
        let port = f.master_port.as_ref().map(|p| p.value);
        if static_backend {
            if not_typed("master_addr") {
                args.master_addr = a.value.clone();
            }
            if let Some(p) = port.filter(|_| not_typed("master_port")) {
                args.master_port = Some(i64::from(p));
            }
        } else {
            // c10d/etcd: the endpoint is the rendezvous store's.
            let host = if a.value.contains(':') {
                format!("[{}]", a.value)
            } else {
                a.value.clone()
            };
            args.rdzv_endpoint = match port {
                Some(p) => format!("{host}:{p}"),
                None => host,
            };
            args.from_env.remove("rdzv_endpoint");
        }
    }
    Ok(Some(t))
}

/// The launch's topology for printing: the detected one completed with the values resolution
/// settled on, each named by where it came from (flag, `PET_*`, default).
pub(super) fn plan(
    detected: Option<Topology>,
    args: &LaunchArgs,
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
    let source = |dest: &str, flag: &str| -> String {
        if args.cli_given.contains(dest) {
            flag.to_string()
        } else if let Some(var) = args.from_env.get(dest) {
            var.clone()
        } else {
            "default".to_string()
        }
    };
    fn fill<T>(slot: &mut Option<Sourced<T>>, value: T, source: String) {
        if slot.is_none() {
            *slot = Some(Sourced { value, source });
        }
    }
    let f = &mut t.fields;
    let in_place = match (&f.mode, &f.local_rank, &f.local_world_size) {
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
    };
    fill(&mut f.mode, Mode::Node, "default".into());
    // In place, nnodes/node_rank are the node's (GROUP_*), never the member count and index.
    if in_place.is_none() {
        fill(
            &mut f.nnodes,
            NodeCount {
                min: cfg.nnodes.min,
                max: cfg.nnodes.max,
            },
            source("nnodes", "--nnodes"),
        );
        fill(
            &mut f.node_rank,
            cfg.node_rank,
            source("node_rank", "--node-rank"),
        );
    }
    if cfg.standalone {
        let why = if args.standalone {
            source("standalone", "--standalone")
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
            let (flag, dest) = if args.rdzv_endpoint.is_empty() {
                ("--master-addr", "master_addr")
            } else {
                ("--rdzv-endpoint", "rdzv_endpoint")
            };
            fill(&mut f.master_addr, ep.host.clone(), source(dest, flag));
            let (pflag, pdest) = if args.rdzv_endpoint.is_empty() {
                ("--master-port", "master_port")
            } else {
                ("--rdzv-endpoint", "rdzv_endpoint")
            };
            fill(&mut f.master_port, ep.port, source(pdest, pflag));
        }
        fill(
            &mut f.backend,
            args.rdzv_backend.clone(),
            source("rdzv_backend", "--rdzv-backend"),
        );
        fill(
            &mut f.run_id,
            cfg.rdzv.run_id.clone(),
            source("rdzv_id", "--rdzv-id"),
        );
    }
    let nproc = cfg.nproc_per_node.to_string();
    match &mut f.nproc {
        // `auto`/`gpu` from a variable: show the count it resolved to, keep the source.
        Some(n) if n.value != nproc => n.value = format!("{nproc} ({})", n.value),
        Some(_) => {}
        None => f.nproc = cluster::src(nproc, source("nproc_per_node", "--nproc-per-node")),
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
