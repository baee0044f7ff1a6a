//! Cluster detection: what a scheduler put in the environment, resolved field by field into a
//! [`Topology`] that records where every value came from. Detection only: nothing here spawns,
//! binds or resolves names; `config::cluster` calls [`detect`] and applies the result.
//!
//! # What is read
//! - [`hostlist`]: Slurm's hostlist grammar and `N(xM)` run-length lists, natively.
//! - [`readers`]: one reader per source, each a pure function of an [`Env`] and [`HostFacts`]:
//!   `RDRUN_*`; `PET_*` (PyTorchJob v1 static/elastic, Kubeflow Trainer v2); Open MPI,
//!   MPICH/Intel MPI, MVAPICH2; a Slurm `srun` step (node mode with one task per node, in-place
//!   mode with several) and a batch/salloc context (refused with the `srun` hint when it spans
//!   several nodes); Kubernetes without `PET_*` (Volcano, Indexed Job/JobSet, PyTorchJob pod
//!   variables); LSF host lists; hostfiles (DeepSpeed and Open MPI dialects).
//!
//! # Precedence
//! Per field, the first layer that defines it wins: flags (built by the caller) > `RDRUN_*` >
//! `PET_*` > MPI > Slurm step > Kubernetes > LSF > hostfile; nothing detected means local
//! ([`detect`] returns `None`). The innermost launcher wins a conflict (mpirun inside an
//! allocation: MPI; Slurm in pods: Slurm), and every overridden value is kept as a note.
//! A Slurm step whose task count equals the MPI world (`srun --mpi=pmi2`) is one launcher, so the
//! richer Slurm layer is used and the PMI layer dropped.
//!
//! # Contradictions are errors
//! node rank ≥ nnodes, a run-length list that does not match its node list, this host missing
//! from the node list that gives its rank, in-place mode with an explicit nproc > 1 (k×n
//! oversubscription), a multi-node batch/salloc context without a step; each one line naming
//! the variables involved.
//!
//! # Wiring
//! `config::cluster` calls `detect(&env, &host_facts, ClusterChoice::resolve(flag, &env)?,
//! &flag_fields)` and [`nested_guard`] when something was detected, writes the fields into the
//! arguments the user did not type, and renders with [`render::text`] / [`render::one_line`] /
//! [`render::json`] for the banner and `--dry-run` / `--print-topology[=json]`. In-place mode
//! becomes a static rendezvous of one member per rank there (`config::cluster::InPlace`); the
//! node of an MPI rank comes from [`node_of`] over the hostnames the ranks exchange.

pub(crate) mod fixed;
pub mod hostlist;
pub mod readers;
pub mod render;

#[cfg(test)]
#[path = "difftest_tests.rs"]
mod difftest;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

/// The environment detection reads: lookup plus the list of names (Volcano's `VC_<TASK>_HOSTS`
/// can only be found by listing).
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
    fn names(&self) -> Vec<String>;
}

impl Env for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }
}

/// Facts about this machine the readers need; filled by the caller (tests fill them by hand).
pub struct HostFacts<'a> {
    /// `gethostname()`.
    pub hostname: String,
    /// The canonical name `getaddrinfo` gives for the hostname, if any.
    pub fqdn: Option<String>,
    /// Local interface addresses, as text (for matching hostfile entries).
    pub addresses: Vec<String>,
    /// `getppid()`: on one host, every rank of an MPI job shares its launcher parent.
    pub ppid: Option<u32>,
    /// Reads a named file (hostfiles); the only I/O detection does.
    pub read_file: &'a dyn Fn(&str) -> Result<String, String>,
    /// Whether an address literal of a host list is this machine's (assigned to one of its
    /// interfaces): a hostfile of bare addresses (an IPv6-only cluster) names no hostname.
    pub is_local_ip: &'a dyn Fn(std::net::IpAddr) -> bool,
}

fn no_files(path: &str) -> Result<String, String> {
    Err(format!("{path}: no file reader given"))
}

fn no_local_ips(_: std::net::IpAddr) -> bool {
    false
}

/// `host` as an address literal, brackets (`[fd00::1]`) allowed; `None` for a name.
pub fn ip_literal(host: &str) -> Option<std::net::IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

/// `host:port` as a user types it back: brackets around an IPv6 literal (`[fd00::1]:29500`),
/// never around a name.
pub fn host_port(host: &str, port: &str) -> String {
    match ip_literal(host) {
        Some(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

impl HostFacts<'static> {
    /// Facts for a host with only a name (tests, or a caller without more).
    pub fn named(hostname: &str) -> Self {
        HostFacts {
            hostname: hostname.to_string(),
            fqdn: None,
            addresses: Vec::new(),
            ppid: None,
            read_file: &no_files,
            is_local_ip: &no_local_ips,
        }
    }
}

/// A value and where it came from: a variable (`SLURM_NODEID`), a flag (`--nnodes`), a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    pub value: T,
    pub source: String,
}

/// Shorthand for building a [`Sourced`].
pub fn src<T>(value: T, source: impl Into<String>) -> Option<Sourced<T>> {
    Some(Sourced {
        value,
        source: source.into(),
    })
}

/// `--cluster auto|none|slurm|k8s|mpi|lsf|hostfile` (also `RDRUN_CLUSTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterChoice {
    Auto,
    None,
    Slurm,
    K8s,
    Mpi,
    Lsf,
    Hostfile,
}

impl ClusterChoice {
    pub fn parse(text: &str) -> Result<Self, ClusterError> {
        Ok(match text.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Self::Auto,
            "none" | "off" => Self::None,
            "slurm" => Self::Slurm,
            "k8s" | "kubernetes" => Self::K8s,
            "mpi" => Self::Mpi,
            "lsf" => Self::Lsf,
            "hostfile" => Self::Hostfile,
            other => {
                return Err(ClusterError(format!(
                "--cluster/RDRUN_CLUSTER: {other:?} is not one of auto, none, slurm, k8s, mpi, lsf, hostfile"
            )))
            }
        })
    }

    /// The flag if given, else `RDRUN_CLUSTER`, else auto.
    pub fn resolve(flag: Option<&str>, env: &dyn Env) -> Result<Self, ClusterError> {
        match flag
            .map(str::to_string)
            .or_else(|| env.get("RDRUN_CLUSTER"))
        {
            Some(text) => Self::parse(&text),
            None => Ok(Self::Auto),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::None => "none",
            Self::Slurm => "slurm",
            Self::K8s => "k8s",
            Self::Mpi => "mpi",
            Self::Lsf => "lsf",
            Self::Hostfile => "hostfile",
        }
    }
}

/// Node mode: this rdrun is the node agent and spawns the workers. In-place mode: this rdrun is
/// one rank that a scheduler already started (several tasks per node, MPI), so it runs one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Node,
    InPlace,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Node => "node",
            Mode::InPlace => "in-place",
        }
    }
}

/// `N` or `MIN:MAX` nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    pub min: usize,
    pub max: usize,
}

impl fmt::Display for NodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

/// Every field a layer may define; `None` = this layer says nothing about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pub mode: Option<Sourced<Mode>>,
    pub nnodes: Option<Sourced<NodeCount>>,
    /// This node's index (in-place mode: GROUP_RANK).
    pub node_rank: Option<Sourced<usize>>,
    pub master_addr: Option<Sourced<String>>,
    pub master_port: Option<Sourced<u16>>,
    /// `static`, `c10d`, … as text (config parses it).
    pub backend: Option<Sourced<String>>,
    pub run_id: Option<Sourced<String>>,
    /// Workers per node as text (`auto`, `gpu`, `8`); in-place mode: `1`.
    pub nproc: Option<Sourced<String>>,
    pub node_list: Option<Sourced<Vec<String>>>,
    /// `CUDA_VISIBLE_DEVICES` entries, kept as text (they may be UUIDs).
    pub devices: Option<Sourced<Vec<String>>>,
    /// In-place mode: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE.
    pub rank: Option<Sourced<usize>>,
    pub local_rank: Option<Sourced<usize>>,
    pub world_size: Option<Sourced<usize>>,
    pub local_world_size: Option<Sourced<usize>>,
    pub standalone: Option<Sourced<bool>>,
    /// Input only: a hostfile named by a flag (`--hostfile`); env names are read by the reader.
    pub hostfile: Option<Sourced<String>>,
    /// Input only: `--include` / `--exclude` hostfile filters (DeepSpeed's documented semantics).
    pub include: Option<Sourced<String>>,
    pub exclude: Option<Sourced<String>>,
}

/// One source's view: its name (`slurm-step`), a detail for the header, its fields and notes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    pub name: String,
    pub detail: String,
    pub fields: Fields,
    pub notes: Vec<String>,
}

/// The resolved topology: the merged fields, the scheduler that set the mode, and notes
/// (overrides, warnings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// e.g. `slurm-step (job 81234 step 0)`.
    pub scheduler: String,
    pub fields: Fields,
    pub notes: Vec<String>,
}

/// A one-line error naming the variables involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterError(pub String);

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterError {}

/// Detects the cluster environment and resolves the topology. `flags` holds what the command
/// line said (with sources like `--nnodes`); it wins every field. `Ok(None)`: no scheduler
/// detected (or `--cluster none`), so the caller resolves a local run as before.
pub fn detect(
    env: &dyn Env,
    host: &HostFacts<'_>,
    forced: ClusterChoice,
    flags: &Fields,
) -> Result<Option<Topology>, ClusterError> {
    use ClusterChoice as C;
    if forced == C::None {
        return Ok(None);
    }
    let mut explicit = vec![Layer {
        name: "flags".into(),
        fields: flags.clone(),
        ..Layer::default()
    }];
    explicit.push(readers::rdrun_env(env)?);
    let sched = scheduler_layers(env, host, forced, flags, &mut explicit)?;
    if sched.is_empty() && (flags.include.is_some() || flags.exclude.is_some()) {
        return Err(ClusterError(
            "--include/--exclude filter a hostfile's hosts, and no hostfile is named (--hostfile, RDRUN_HOSTFILE, OMPI_MCA_orte_default_hostfile)".into(),
        ));
    }
    if sched.is_empty() {
        if forced != C::Auto {
            return Err(ClusterError(format!(
                "--cluster {}: no {} environment found ({})",
                forced.name(),
                forced.name(),
                readers::tell_tale(forced)
            )));
        }
        return Ok(None);
    }
    let topology = resolve_layers(explicit, sched)?;
    validate(&topology)?;
    Ok(Some(topology))
}

/// Every scheduler's layer found (those `forced` allows), most specific first; `PET_*` typed
/// by hand outside a pod goes to `explicit` instead (torchrun's flag fallback).
fn scheduler_layers(
    env: &dyn Env,
    host: &HostFacts<'_>,
    forced: ClusterChoice,
    flags: &Fields,
    explicit: &mut Vec<Layer>,
) -> Result<Vec<Layer>, ClusterError> {
    use ClusterChoice as C;
    let want = |c: ClusterChoice| forced == C::Auto || forced == c;
    let mut sched: Vec<Layer> = Vec::new();
    if want(C::K8s) {
        if let Some(pet) = readers::pet(env)? {
            // PET_* typed by hand, outside a pod and naming no endpoint, is torchrun's flag
            // fallback (cli handles it), not a detected cluster.
            let detected =
                env.get("KUBERNETES_SERVICE_HOST").is_some() || pet.fields.master_addr.is_some();
            if detected || forced == C::K8s {
                sched.push(pet);
            } else {
                explicit.push(pet);
            }
        }
    }
    let slurm = if want(C::Slurm) {
        readers::slurm(env, host)?
    } else {
        None
    };
    if want(C::Mpi) {
        sched.extend(mpi_layer(env, host, slurm.as_ref())?);
    }
    sched.extend(slurm);
    if want(C::K8s) {
        sched.extend(readers::kubernetes(env, host, forced == C::K8s)?);
    }
    if want(C::Lsf) {
        sched.extend(readers::lsf(env, host)?);
    }
    if want(C::Hostfile) {
        sched.extend(readers::hostfile(env, host, flags)?);
    }
    Ok(sched)
}

/// The MPI layer, unless it only repeats the Slurm step's own task ids (`srun --mpi=pmi2`).
fn mpi_layer(
    env: &dyn Env,
    host: &HostFacts<'_>,
    slurm: Option<&Layer>,
) -> Result<Option<Layer>, ClusterError> {
    let Some(mpi) = readers::mpi(env, host)? else {
        return Ok(None);
    };
    // srun --mpi=pmi2 sets PMI_* equal to the step's own task ids: one launcher, and the
    // Slurm layer knows more (node rank, node list).
    let step_task = |var: &str| env.get(var).and_then(|v| v.trim().parse::<usize>().ok());
    let same = slurm.is_some_and(|s| s.name == "slurm-step")
        && step_task("SLURM_STEP_NUM_TASKS").or_else(|| step_task("SLURM_NTASKS"))
            == readers::mpi_rank_size(env).map(|r| r.1)
        && step_task("SLURM_PROCID") == readers::mpi_rank_size(env).map(|r| r.0);
    if same {
        return Ok(None);
    }
    if mpi.fields.mode.is_none() {
        return Err(ClusterError(format!(
            "{}: rank/size differ from the Slurm step's (SLURM_PROCID/SLURM_STEP_NUM_TASKS) and no local rank/size is set",
            mpi.name
        )));
    }
    Ok(Some(mpi))
}

/// The layers merged: the node count fitted to a fixed node set, and in place without a node
/// index from the launcher, the node rank left to the hostname exchange.
fn resolve_layers(mut explicit: Vec<Layer>, sched: Vec<Layer>) -> Result<Topology, ClusterError> {
    // In place, nnodes/node_rank are GROUP_WORLD_SIZE/GROUP_RANK. They are kept from the
    // launcher that set the mode (Slurm's SLURM_NODEID) or from an allocation around an mpirun
    // (a Slurm step of orteds, an LSF job: exactly the job's hosts). A hostfile may name more
    // hosts than the job uses, and an MPI launcher names no node index at all: then the ranks
    // exchange their hostnames in the store instead.
    let resolved_nnodes = fixed::fit_node_count(&mut explicit, &sched)?;
    let in_place = sched
        .iter()
        .find_map(|l| l.fields.mode.as_ref())
        .is_some_and(|m| m.value == Mode::InPlace);
    let node_from = sched
        .iter()
        .position(|l| l.fields.node_rank.is_some())
        .map(|i| (i, sched[i].name.clone()));
    let mode_at = sched.iter().position(|l| l.fields.mode.is_some());
    let node_known = match node_from {
        Some((i, name)) => Some(i) == mode_at || name == "slurm-step" || name == "lsf",
        None => false,
    };
    let mut topology = merge(explicit.into_iter().chain(sched).collect());
    if let Some((note, overrides)) = resolved_nnodes {
        // One note says what the range became and why, instead of the merge's "overrides".
        topology.notes.retain(|n| !n.starts_with(&overrides));
        topology.notes.push(note);
    }
    if in_place && !node_known {
        topology.fields.node_rank = None;
        topology.fields.nnodes = None;
        topology.notes.push(
            "group_rank: from the hostnames the ranks exchange in the store (the launcher names no node index)".into(),
        );
    }
    Ok(topology)
}

/// The per-field merge: the first layer defining a field wins; a later, different value becomes
/// a note `field: A (src) overrides B (src)`, values as a user writes them (`2:4`, `h0`).
pub fn merge(layers: Vec<Layer>) -> Topology {
    let mut out = Fields::default();
    let mut notes = Vec::new();
    let mut scheduler = None;
    fn take<T: Clone + PartialEq + render::UserText>(
        name: &str,
        out: &mut Option<Sourced<T>>,
        from: &Option<Sourced<T>>,
        notes: &mut Vec<String>,
    ) {
        match (out.as_ref(), from) {
            (None, Some(v)) => *out = Some(v.clone()),
            (Some(have), Some(v)) if have.value != v.value => notes.push(format!(
                "{name}: {} ({}) overrides {} ({})",
                have.value.user_text(),
                have.source,
                v.value.user_text(),
                v.source
            )),
            _ => {}
        }
    }
    for layer in &layers {
        let f = &layer.fields;
        if scheduler.is_none() && f.mode.is_some() {
            scheduler = Some(if layer.detail.is_empty() {
                layer.name.clone()
            } else {
                format!("{} ({})", layer.name, layer.detail)
            });
        }
        take("mode", &mut out.mode, &f.mode, &mut notes);
        take("nnodes", &mut out.nnodes, &f.nnodes, &mut notes);
        take("node_rank", &mut out.node_rank, &f.node_rank, &mut notes);
        take(
            "master_addr",
            &mut out.master_addr,
            &f.master_addr,
            &mut notes,
        );
        take(
            "master_port",
            &mut out.master_port,
            &f.master_port,
            &mut notes,
        );
        take("backend", &mut out.backend, &f.backend, &mut notes);
        take("run_id", &mut out.run_id, &f.run_id, &mut notes);
        take("nproc", &mut out.nproc, &f.nproc, &mut notes);
        take("node_list", &mut out.node_list, &f.node_list, &mut notes);
        take("devices", &mut out.devices, &f.devices, &mut notes);
        take("rank", &mut out.rank, &f.rank, &mut notes);
        take("local_rank", &mut out.local_rank, &f.local_rank, &mut notes);
        take("world_size", &mut out.world_size, &f.world_size, &mut notes);
        take(
            "local_world_size",
            &mut out.local_world_size,
            &f.local_world_size,
            &mut notes,
        );
        take("standalone", &mut out.standalone, &f.standalone, &mut notes);
        notes.extend(layer.notes.iter().cloned());
    }
    Topology {
        scheduler: scheduler.unwrap_or_else(|| "flags".into()),
        fields: out,
        notes,
    }
}

/// Contradictions across the merged fields.
pub fn validate(t: &Topology) -> Result<(), ClusterError> {
    let f = &t.fields;
    let e = |m: String| Err(ClusterError(m));
    if let (Some(r), Some(n)) = (&f.node_rank, &f.nnodes) {
        if r.value >= n.value.max {
            return e(format!(
                "node rank {} ({}) is not below the node count {} ({})",
                r.value, r.source, n.value, n.source
            ));
        }
    }
    if let (Some(r), Some(w)) = (&f.rank, &f.world_size) {
        if r.value >= w.value {
            return e(format!(
                "rank {} ({}) is not below the world size {} ({})",
                r.value, r.source, w.value, w.source
            ));
        }
    }
    if let (Some(r), Some(w)) = (&f.local_rank, &f.local_world_size) {
        if r.value >= w.value {
            return e(format!(
                "local rank {} ({}) is not below the local world size {} ({})",
                r.value, r.source, w.value, w.source
            ));
        }
    }
    let mode = f.mode.as_ref().map(|m| m.value);
    if mode == Some(Mode::InPlace) {
        if let Some(n) = &f.nproc {
            let k = f.local_world_size.as_ref();
            match n.value.trim().parse::<usize>() {
                Ok(1) => {}
                Ok(nproc) => {
                    let (k, ks) = k.map_or((0, "?".to_string()), |k| (k.value, k.source.clone()));
                    return e(format!(
                        "{} starts {k} tasks on this node ({ks}), each an rdrun in place; {}={nproc} would start {k}x{nproc}={} workers; drop it or launch one task per node",
                        t.scheduler,
                        n.source,
                        k * nproc
                    ));
                }
                Err(_) => {
                    return e(format!(
                        "{}: nproc {:?} ({}) cannot apply in in-place mode (one worker per task); drop it",
                        t.scheduler, n.value, n.source
                    ))
                }
            }
        }
    }
    if mode == Some(Mode::Node) && f.nnodes.is_none() {
        return e(format!(
            "{}: the node count is in no variable; pass --nnodes (or RDRUN_NNODES)",
            t.scheduler
        ));
    }
    let multi_node = f.nnodes.as_ref().is_some_and(|n| n.value.max > 1)
        || matches!((&f.world_size, &f.local_world_size), (Some(w), Some(l)) if w.value > l.value);
    if multi_node && f.master_addr.is_none() {
        return e(format!(
            "{}: a multi-node job but no endpoint in the environment; pass --rdzv-endpoint (or RDRUN_RDZV_ENDPOINT)",
            t.scheduler
        ));
    }
    Ok(())
}

/// The nested-launch guard (spec §6.2 step 0): a torchrun or rdrun worker (both export
/// `TORCHELASTIC_RUN_ID`) that starts rdrun would inherit the scheduler's variables and form a
/// second world; refused unless `allowed` (a later `--nested`). Separate from [`detect`] so the
/// caller decides where it runs.
pub fn nested_guard(env: &dyn Env, allowed: bool) -> Result<(), ClusterError> {
    match env.get("TORCHELASTIC_RUN_ID") {
        Some(id) if !allowed => Err(ClusterError(format!(
            "rdrun was started by a torchrun/rdrun worker (TORCHELASTIC_RUN_ID={id}); a nested launch forms its own world; pass --nested if that is intended"
        ))),
        _ => Ok(()),
    }
}

/// A port in 10000–32767 (below Linux's default ephemeral range) from two job identifiers, so
/// consecutive jobs and concurrent steps of one job get different ports.
pub fn derived_port(job: u64, step: u64) -> u16 {
    const SPAN: u64 = 32768 - 10000;
    (10000 + (job.wrapping_mul(97).wrapping_add(step)) % SPAN) as u16
}

/// Where an in-place rank's node is among the job's, from every rank's hostname (index = rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// GROUP_RANK: this host's index among the distinct hosts, ordered by their lowest rank.
    pub group_rank: usize,
    /// GROUP_WORLD_SIZE: the number of distinct hosts.
    pub group_world_size: usize,
    /// How many ranks name this host (must equal the launcher's LOCAL_WORLD_SIZE).
    pub ranks_here: usize,
}

/// The node identity of `rank` from the hostnames all ranks published (MPI names no node index:
/// `OMPI_COMM_WORLD_NODE_RANK` counts processes per node). Hosts are ordered by their lowest
/// rank, so node 0 is the host of rank 0, as torchrun numbers nodes. `None` if `rank` is not in
/// `hosts`.
pub fn node_of(hosts: &[String], rank: usize) -> Option<NodeIdentity> {
    let mine = hosts.get(rank)?;
    let mut distinct: Vec<&String> = Vec::new();
    for h in hosts {
        if !distinct.contains(&h) {
            distinct.push(h);
        }
    }
    Some(NodeIdentity {
        group_rank: distinct.iter().position(|h| *h == mine)?,
        group_world_size: distinct.len(),
        ranks_here: hosts.iter().filter(|h| *h == mine).count(),
    })
}
