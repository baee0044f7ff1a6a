//! The resolved configuration's types: the contract between `cli`/`config` and the supervisor
//! ([`LaunchConfig`] and the specs it is made of). A leaf: the resolvers beside it fill these,
//! nothing here decides anything.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::{Fields, Topology};

use super::command::WorkerCommand;
use super::spec::{Endpoint, NodeRange, RdzvBackend};
use super::{
    console, etcd_conf, hang, numa, observe, rdzv_conf, resilience, runenv, torchenv, warm,
};

/// Rendezvous settings after resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct RdzvConfig {
    pub backend: RdzvBackend,
    /// `None` only for a single-node (standalone) run, where rdrun binds loopback port 0.
    pub endpoint: Option<Endpoint>,
    /// TORCHELASTIC_RUN_ID: `--rdzv-id`, or a fresh UUID for standalone.
    pub run_id: String,
    /// `--rdzv-conf` key/value pairs, whitespace-stripped, values kept as text (the unknown ones
    /// are logged; the known ones are typed in `settings`).
    pub conf: BTreeMap<String, String>,
    /// The backend's settings, typed at resolve time from `conf` and `--nnodes`; `None` when the
    /// run holds no rendezvous ([`LaunchConfig::uses_rendezvous`]).
    pub settings: Option<RdzvSettings>,
}

/// A rendezvous backend's typed `--rdzv-conf` settings.
#[derive(Debug, Clone, PartialEq)]
pub enum RdzvSettings {
    Static(rdzv_conf::StaticSettings),
    C10d(rdzv_conf::C10dSettings),
    Etcd(etcd_conf::EtcdSettings),
}

/// Which of a worker's streams a `-r`/`-t` value selects (torchrun's `Std`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StdSelect {
    #[default]
    None,
    Out,
    Err,
    All,
}

impl StdSelect {
    pub fn stdout(self) -> bool {
        matches!(self, StdSelect::Out | StdSelect::All)
    }
    pub fn stderr(self) -> bool {
        matches!(self, StdSelect::Err | StdSelect::All)
    }
}

/// A `-r`/`-t` value: one selection for all ranks, or per local rank (unlisted ranks: `None`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StdSpec {
    pub all: StdSelect,
    pub per_rank: BTreeMap<usize, StdSelect>,
}

impl StdSpec {
    pub fn for_rank(&self, local_rank: usize) -> StdSelect {
        if self.per_rank.is_empty() {
            self.all
        } else {
            self.per_rank.get(&local_rank).copied().unwrap_or_default()
        }
    }
}

/// Output and log-directory settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogConfig {
    /// `--log-dir`; `None` = no log directory unless something must be written.
    pub log_dir: Option<PathBuf>,
    pub redirects: StdSpec,
    pub tee: StdSpec,
    /// `--local-ranks-filter`; `None` = every rank reaches the console.
    pub local_ranks_filter: Option<Vec<usize>>,
    /// `--log-line-prefix-template` or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
    pub prefix_template: Option<String>,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
    /// `--output collapse`: the window within which identical lines of several ranks are shown
    /// once; `None` (`--output all`): every line as it comes. Log files are unaffected.
    pub collapse: Option<console::Collapse>,
    /// `--progress`: the stage that shows several ranks' `\r` progress bars as one line;
    /// `None` (`--progress all`): every bar as written. Log files are unaffected.
    pub progress: Option<console::Progress>,
}

/// Everything the supervisor needs to run one launch.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    pub nproc_per_node: usize,
    pub nnodes: NodeRange,
    pub node_rank: usize,
    pub rdzv: RdzvConfig,
    /// `--standalone` or the auto-standalone case (spec §1.3 step 2).
    pub standalone: bool,
    /// MASTER_ADDR: `127.0.0.1` for standalone (loopback only); for `static` the host of the
    /// endpoint (`--master-addr` by default, IPv6 without brackets); otherwise `--local-addr` if
    /// given, else `--master-addr`.
    pub master_addr: String,
    /// MASTER_PORT: for `static`, the port of `--rdzv-endpoint` or `--master-port` (29500 when
    /// neither is given), always `Some`; otherwise `--master-port` if given, `None` = let the
    /// kernel pick (standalone, c10d, etcd: torchrun's agent store also uses a kernel-chosen port).
    pub master_port: Option<u16>,
    pub local_addr: Option<String>,
    pub max_restarts: u32,
    pub role: String,
    pub command: WorkerCommand,
    pub log: LogConfig,
    /// Signal numbers to catch and forward (`--signals-to-handle`).
    pub signals_to_handle: Vec<i32>,
    /// Grace between the stop signal and SIGKILL (`--shutdown-timeout`, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s).
    pub shutdown_timeout: Duration,
    pub virtual_local_rank: bool,
    /// rdrun's `--report-json PATH`.
    pub report_json: Option<PathBuf>,
    /// rdrun's `--report-junit PATH` (`supervisor::report::ci`).
    pub report_junit: Option<PathBuf>,
    /// rdrun's `--exit-barrier-timeout` (multi-node; default 300 s as torchrun).
    pub exit_barrier_timeout: Duration,
    /// rdrun's `--leftovers` / RDRUN_LEFTOVERS: processes left behind after a successful run.
    pub leftovers: LeftoverPolicy,
    /// The resolved topology (detected scheduler or local) and whether this is a dry run.
    pub cluster: ClusterPlan,
    /// Hang detection (issue 13): `RDRUN_HANG_*` / `RDRUN_PY_SPY`, then the `--hang-*` flags.
    pub hang: hang::HangSettings,
    /// Events, metrics, health endpoint (issue 15): `--events`, `--metrics-addr`, ...
    pub observe: observe::ObserveSettings,
    /// CPU sets and OMP_NUM_THREADS per local rank (`--numa-binding`, `--cpu-binding`,
    /// `--omp-num-threads`; `numa.rs`); the default binds nothing.
    pub binding: numa::Binding,
    /// Per-rank control and the console (`--wrap`, `--stdin`, `--output`; `console.rs`).
    pub console: console::ConsoleSettings,
    /// torch agent variables rdrun honours (`torchenv.rs`).
    pub torch_env: torchenv::TorchAgentEnv,
    /// The rest of rdrun's environment the run consults (`runenv.rs`).
    pub run_env: runenv::RunEnv,
    /// Health checks and the stop verdict (issue 28, `resilience.rs`).
    pub resilience: resilience::Resilience,
    /// Warm starts (`--warm-start`, `--preload`; `warm.rs`).
    pub warm: warm::WarmSettings,
    /// Chaos mode (`--chaos`, `--chaos-progress`, issue 41); `None`: off.
    pub chaos: Option<ChaosSettings>,
}

/// `--chaos` (every one given, joined with `;`) or `RDRUN_CHAOS`, typed and checked against the
/// run when the config is resolved (`config/chaos.rs`), and `--chaos-progress` or
/// `RDRUN_CHAOS_PROGRESS` (a valid regular expression). Never from a scheduler's variables.
#[derive(Debug, Clone, PartialEq)]
pub struct ChaosSettings {
    pub spec: super::chaos::ChaosSpec,
    pub progress: Option<String>,
}

/// What rdrun does with processes the workers left behind once every worker exited 0
/// (`--leftovers`, RDRUN_LEFTOVERS; docs/compat.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeftoverPolicy {
    /// Stop them as any stop does (SIGTERM, grace, SIGKILL), each named at WARN. The default:
    /// no orphans, as Slurm at the end of a step.
    #[default]
    Kill,
    /// Wait until they have exited on their own (a shutdown signal still stops them).
    Wait,
    /// Leave them running and exit (torchrun's behaviour).
    Leave,
}

impl LeftoverPolicy {
    /// `kill`, `wait` or `leave`.
    pub fn parse(text: &str) -> Option<LeftoverPolicy> {
        match text.trim().to_ascii_lowercase().as_str() {
            "kill" => Some(LeftoverPolicy::Kill),
            "wait" => Some(LeftoverPolicy::Wait),
            "leave" => Some(LeftoverPolicy::Leave),
            _ => None,
        }
    }
}

/// Default stop grace when neither `--shutdown-timeout` nor TORCH_ELASTIC_SHUTDOWN_TIMEOUT is set.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;

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
    pub run: Option<RunPreview>,
}

/// A local run that is not a dry run (test fixtures; `cluster::plan` fills the real one).
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

/// What the run would do, as the dry run prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPreview {
    /// `4`, or `2-8` for an elastic node range.
    pub world_size: String,
    /// How the world size was counted (`2 nodes x 2 workers, if every node runs 2`).
    pub world_how: String,
    /// This node's global ranks (`2-3`), or `None` where the rendezvous assigns them.
    pub ranks: Option<String>,
    /// Why the ranks are what they are, or why they are not known yet.
    pub ranks_how: String,
    /// The worker's command line, shell-quoted (`--run-path`'s bootstrap program abbreviated).
    pub command: String,
    /// The Python interpreter workers run under (`None`: the program runs directly).
    pub interpreter: Option<String>,
    /// `--wrap`: the wrapper's words (before `%r`/`%l`/`%n`) and the ranks it applies to.
    pub wrapper: Option<String>,
    /// `--debug-rank`: the rank that waits for a debugger, and how.
    pub debug_rank: Option<String>,
    /// `host:port` of the rendezvous, or how standalone picks it.
    pub endpoint: String,
    /// The backend that serves it (`static`, `c10d`, …).
    pub backend: &'static str,
    /// The run id the real run uses; `None`: a fresh one at each launch.
    pub run_id: Option<String>,
}
