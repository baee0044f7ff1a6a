//! Resolution of parsed arguments ([`crate::cli::LaunchArgs`]) into a [`LaunchConfig`].
//!
//! Parsing (what the user typed) lives in `cli.rs`; this folder decides what it means on this
//! machine. The supervisor consumes a `LaunchConfig` and never looks at raw arguments, and
//! nothing here is consulted again once [`resolve`] has returned.
//!
//! This file holds the contract between `cli`/`config` and `supervisor` (the types below), the
//! error and [`resolve`]. The rest is split by what it owns:
//! - [`host`]: machine facts ([`Host`], [`RealHost`]): CPU affinity, GPU probing, files, randomness,
//!   so that every decision is testable with a fake machine;
//! - [`flags`]: per-flag parsers (nnodes, nproc, `-r`/`-t`, filters, signals, timeouts);
//! - [`endpoint`]: standalone, the rendezvous backend/endpoint/conf/run id, and MASTER_ADDR/PORT,
//!   in one place;
//! - [`command`]: the worker command (program and python lookup, the `--run-path` bootstrap);
//! - [`cluster`]: scheduler detection ([`crate::cluster::detect`]) filling what the command line
//!   did not give, and the topology printed before spawning (`--dry-run`, `--print-topology`);
//! - [`dryrun`]: what a dry run adds to it (world size, this node's ranks, the worker command,
//!   the rendezvous endpoint).
//!
//! The per-worker rules the supervisor applies at spawn time (`${local_rank}`, OMP_NUM_THREADS,
//! `--virtual-local-rank` devices, the signal list) live in [`crate::workerenv`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{EnvFn, LaunchArgs};
use flags::resolve_logs;

mod cluster;
mod command;
pub mod console;
mod dryrun;
mod endpoint;
pub mod etcd_conf;
mod flags;
pub mod hang;
mod host;
mod layout;
pub mod numa;
pub mod observe;
pub mod rdzv_conf;
pub mod resilience;
pub mod runenv;
#[cfg(test)]
mod schedenv_tests;
pub mod torchenv;
pub mod warm;

pub use cluster::{ClusterPlan, InPlace, TopologyFormat};
pub use command::{find_program, find_python, resolve_command, RUN_PATH_BOOTSTRAP};
pub use endpoint::{parse_backend, parse_endpoint, parse_rdzv_conf, uuid4};
pub use flags::{
    parse_local_ranks_filter, parse_nnodes, parse_signals, parse_std_spec, resolve_nproc,
    resolve_shutdown_timeout, MAX_NPROC_PER_NODE,
};
pub use host::{canonical_name, FileKind, Host, RealHost};

/// `--nnodes`: `N` (min = max = N) or `MIN:MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRange {
    pub min: usize,
    pub max: usize,
}

/// `--rdzv-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdzvBackend {
    Static,
    C10d,
    Etcd,
    EtcdV2,
}

/// A `host:port` endpoint; `host` is kept without IPv6 brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

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

impl RdzvConfig {
    /// A rendezvous config with its settings typed from `conf` (for a run that holds one).
    pub fn typed(
        backend: RdzvBackend,
        endpoint: Endpoint,
        run_id: impl Into<String>,
        conf: BTreeMap<String, String>,
        nnodes: NodeRange,
    ) -> Result<RdzvConfig, ConfigError> {
        let mut r = RdzvConfig {
            backend,
            endpoint: Some(endpoint),
            run_id: run_id.into(),
            conf,
            settings: None,
        };
        r.settings = Some(r.type_settings(nnodes)?);
        Ok(r)
    }

    /// `conf` typed for `backend`: a bad value is a one-line error naming its key.
    fn type_settings(&self, nnodes: NodeRange) -> Result<RdzvSettings, ConfigError> {
        Ok(match self.backend {
            RdzvBackend::Static => {
                RdzvSettings::Static(rdzv_conf::StaticSettings::from_conf(&self.conf)?)
            }
            RdzvBackend::C10d => {
                RdzvSettings::C10d(rdzv_conf::C10dSettings::from_conf(nnodes, &self.conf)?)
            }
            RdzvBackend::Etcd | RdzvBackend::EtcdV2 => {
                let endpoint = self.endpoint.clone().unwrap_or(Endpoint {
                    host: "localhost".into(),
                    port: DEFAULT_ETCD_PORT,
                });
                RdzvSettings::Etcd(etcd_conf::EtcdSettings::from_conf(
                    nnodes, &endpoint, &self.conf,
                )?)
            }
        })
    }
}

/// How the worker program is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntrypointKind {
    /// `python -u script.py args…`.
    PythonScript,
    /// `python -u -m module args…`.
    PythonModule,
    /// Exec the program directly (`--no-python`, or a non-`.py` executable).
    Exec,
    /// `--run-path`: `python -u -c <bootstrap>` running the script with runpy, error file always written.
    RunPath,
}

/// The command each worker runs, before `${local_rank}` substitution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub kind: EntrypointKind,
    /// Program to exec (the Python interpreter, or the program itself).
    pub program: PathBuf,
    /// Full argv after the program (e.g. `["-u", "train.py", "--lr", "0.1"]`), bytes as typed.
    pub args: Vec<std::ffi::OsString>,
    /// Name used in the failure report title (script as typed, module, or binary).
    pub display_name: String,
    /// The launch's Python environment, resolved here once: the interpreter of a Python launch,
    /// else the one a Python launch would use (`PYTHON_EXEC`, `$VIRTUAL_ENV`, `python3` on PATH;
    /// `None` when there is none). The supervisor looks there for pip's NCCL.
    pub python: Option<PathBuf>,
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
/// torchrun's `master_port` default for the static backend.
pub const DEFAULT_STATIC_MASTER_PORT: u16 = 29500;
/// Default rendezvous ports when an endpoint has none (c10d; etcd and etcd-v2).
pub const DEFAULT_C10D_PORT: u16 = 29400;

/// The `--rdzv-conf` key under which an etcd endpoint list (`h1:2379,h2:2379`, every member)
/// reaches the etcd backend; the config's endpoint is the first member.
pub const ETCD_ENDPOINTS_KEY: &str = "etcd_endpoints";
pub const DEFAULT_ETCD_PORT: u16 = 2379;

/// Why a parsed command line cannot be turned into a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A flag value that is wrong whatever the machine: a usage error (exit 2). Named by the
    /// `PET_*` variable (`PET_NPROC_PER_NODE='abc': …`) when the value came from one.
    #[error("{}'{value}': {reason}", source_name(flag, var))]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
        /// The `PET_*` variable the value came from (set by [`resolve_with`]).
        var: Option<String>,
    },
    /// torchrun's own message for this combination.
    #[error("don't use both the '--no-python' flag and the '--module' flag at the same time")]
    ModuleWithNoPython,
    #[error("{} {value}: {reason}", var.as_deref().map_or("--nproc-per-node", |v| v))]
    NoDevices {
        value: String,
        reason: String,
        /// `PET_NPROC_PER_NODE` when the value came from it.
        var: Option<String>,
    },
    /// More workers than this user may have processes (RLIMIT_NPROC): a machine limit (exit 1).
    #[error("--nproc-per-node {workers}: more workers than this user's process limit allows (ulimit -u: {limit})")]
    ProcessLimit { workers: usize, limit: u64 },
    #[error("training script not found: {0}")]
    ScriptNotFound(String),
    #[error("program not found: {0} (no such file, and not an executable on PATH)")]
    ProgramNotFound(String),
    #[error("program is not executable: {0}")]
    NotExecutable(String),
    #[error("python interpreter not found: {0}")]
    PythonNotFound(String),
    #[error("--log-dir '{0}' exists and is not a directory")]
    LogDirNotDirectory(String),
    /// A scheduler environment that cannot be launched from (a contradiction, a batch script
    /// spanning several nodes, a nested launch): one line naming the variables.
    #[error("{0}")]
    Cluster(String),
    /// A `--hang-*` flag or `RDRUN_HANG_*` variable with a bad value (the message names it).
    #[error("{0}")]
    Hang(String),
    /// `--numa-binding` / `--cpu-binding` cannot be applied on this machine (exit 1).
    #[error("{flag}: {reason}")]
    Binding { flag: String, reason: String },
    #[error(transparent)]
    VirtualDevices(#[from] crate::workerenv::VirtualDevicesError),
    /// A variable of rdrun's environment with a bad value (`RDRUN_CGROUP=yes`; the message
    /// names it): a usage error.
    #[error("{0}")]
    Env(String),
    /// A `--rdzv-conf` value of the wrong type (the message names the key). A launcher failure
    /// (exit 1), as when the rendezvous found it at its start.
    #[error("invalid rendezvous configuration: {0}")]
    RdzvConf(#[from] rdzv_conf::ConfError),
}

impl ConfigError {
    /// How rdrun exits on this error (see docs/compat.md, "exit paths").
    ///
    /// A value that is wrong on any machine is a usage error (2), like argparse's type errors;
    /// what this machine lacks (GPUs, the script, an interpreter) or does not support yet is a
    /// launcher failure (1). torchrun exits 1 for all of these, with a Python traceback.
    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            ConfigError::Invalid { .. }
            | ConfigError::ModuleWithNoPython
            | ConfigError::Hang(_)
            | ConfigError::Env(_) => Exit::Usage,
            _ => Exit::LauncherFailure,
        }
    }

    /// [`ConfigError::exit`]'s number.
    pub fn exit_code(&self) -> i32 {
        self.exit().code()
    }
}

impl ConfigError {
    /// Names the `PET_*` variable in an error about a flag whose value came from one
    /// (`from_env`: [`LaunchArgs::from_env`]).
    fn attributed(self, from_env: &BTreeMap<String, String>) -> ConfigError {
        self.naming(|flag| {
            let dest = flag.trim_start_matches('-').replace('-', "_");
            from_env.get(&dest).cloned()
        })
    }

    /// An error about a flag's value that names no variable yet, naming `var_of(flag)`.
    pub(crate) fn naming(self, var_of: impl Fn(&str) -> Option<String>) -> ConfigError {
        match self {
            ConfigError::Invalid {
                flag,
                value,
                reason,
                var: None,
            } => ConfigError::Invalid {
                var: var_of(flag),
                flag,
                value,
                reason,
            },
            ConfigError::NoDevices {
                value,
                reason,
                var: None,
            } => ConfigError::NoDevices {
                var: var_of("--nproc-per-node"),
                value,
                reason,
            },
            other => other,
        }
    }
}

/// `--flag ` or `PET_FLAG=`: what an [`ConfigError::Invalid`] message starts with.
fn source_name(flag: &str, var: &Option<String>) -> String {
    match var {
        Some(v) => format!("{v}="),
        None => format!("{flag} "),
    }
}

pub(crate) fn invalid(
    flag: &'static str,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        reason: reason.into(),
        var: None,
    }
}

/// Resolves the parsed command line against this machine and the process environment.
pub fn resolve(args: LaunchArgs, env: EnvFn<'_>) -> Result<LaunchConfig, ConfigError> {
    let mut cfg = resolve_with(args, env, &RealHost)?;
    // The paths as the OS gives them (`env` converts to UTF-8).
    cfg.run_env.read_os(|k| std::env::var_os(k));
    cfg.hang.search_path = cfg.run_env.path.clone();
    Ok(cfg)
}

/// The process environment as an [`EnvFn`] (non-UTF-8 values are converted lossily).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// [`resolve`] with explicit machine facts.
pub fn resolve_with(
    args: LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<LaunchConfig, ConfigError> {
    // The layout first, typed once; then the scheduler's values laid over what the command
    // line did not type. Layout errors name their own source; the rest are named by the
    // `PET_*` variable that set the flag, if one did.
    let mut layout = layout::Layout::from_args(&args)?;
    let detected = cluster::apply(&args, &mut layout, env)?;
    let mut from_env = args.from_env.clone();
    for dest in layout::DESTS {
        from_env.remove(*dest);
    }
    resolve_args(args, layout, detected, env, host).map_err(|e| e.attributed(&from_env))
}

fn resolve_args(
    args: LaunchArgs,
    layout: layout::Layout,
    detected: Option<crate::cluster::Topology>,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<LaunchConfig, ConfigError> {
    let nnodes = layout.nnodes.value;
    let max_restarts = u32::try_from(args.max_restarts).map_err(|_| {
        invalid(
            "--max-restarts",
            args.max_restarts.to_string(),
            "must be >= 0",
        )
    })?;
    if args.monitor_interval.is_nan() || args.monitor_interval <= 0.0 {
        return Err(invalid(
            "--monitor-interval",
            args.monitor_interval.to_string(),
            "must be > 0",
        ));
    }
    if !(args.exit_barrier_timeout >= 0.0 && args.exit_barrier_timeout.is_finite()) {
        return Err(invalid(
            "--exit-barrier-timeout",
            args.exit_barrier_timeout.to_string(),
            "must be a finite number of seconds >= 0",
        ));
    }
    let mut resilience = resilience::resolve(
        args.max_same_failures,
        args.health_check.as_deref(),
        args.health_check_cmd.as_deref(),
        args.health_check_timeout,
        env,
    )?;
    resilience::resolve_memory(
        &mut resilience,
        args.bad_nodes_file.as_deref(),
        args.exclude_nodes_from.as_deref(),
    )?;
    resilience::resolve_nodes(&mut resilience, &args)?;
    let leftovers = match args.leftovers.clone().or_else(|| env("RDRUN_LEFTOVERS")) {
        None => LeftoverPolicy::default(),
        Some(text) => LeftoverPolicy::parse(&text).ok_or_else(|| {
            invalid(
                "--leftovers",
                text.clone(),
                "must be kill, wait or leave (also RDRUN_LEFTOVERS)",
            )
        })?,
    };
    let run_env = runenv::RunEnv::resolve(env)?;
    let mut hang = resolve_hang(&args, env)?;
    hang.search_path = run_env.path.clone();
    let observe = resolve_observe(&args, env)?;
    let warm = warm::resolve(&args, env)?;
    let conf = parse_rdzv_conf(&args.rdzv_conf)?;
    let node_rank = layout.node_rank.value;
    if args.start_method != "spawn" {
        tracing::info!(
            "--start-method {} is ignored: rdrun starts every worker as a new process",
            args.start_method
        );
    }
    if args.run_path && args.module {
        tracing::warn!("--module is ignored with --run-path (as torchrun)");
    }

    let (standalone, rdzv, master_addr, master_port) =
        endpoint::resolve_rendezvous(&layout, args.local_addr.as_deref(), conf, host)?;

    let mut rdzv = rdzv;
    if uses_rendezvous(standalone, &rdzv, nnodes) {
        // Typed now, so that a bad value stops the run before anything starts.
        rdzv.settings = Some(rdzv.type_settings(nnodes)?);
    }

    let mut log = resolve_logs(&args, env, host)?;
    let signals_to_handle = parse_signals(&args.signals_to_handle);
    let shutdown_timeout = resolve_shutdown_timeout(args.shutdown_timeout, env)?;
    // --nproc-per-node before the command: a value wrong on any machine (0, 100000) is a usage
    // error even when the script is missing too.
    let nproc_per_node =
        resolve_nproc(&layout.nproc.value, env, host).map_err(|e| layout.nproc.attribute(e))?;
    let command = resolve_command(&args, env, host)?;
    let binding = resolve_binding(&args, nproc_per_node, env, host)?;
    let torch_env = torchenv::resolve(env, standalone, rdzv.backend);
    let console = console::resolve(
        console::ConsoleFlags {
            wrap: args.wrap.as_deref(),
            wrap_ranks: args.wrap_ranks.as_deref(),
            stdin: args.stdin.as_deref(),
            output: args.output.as_deref(),
            output_window: args.output_window.as_deref(),
            progress: args.progress.as_deref(),
            progress_interval: args.progress_interval.as_deref(),
            debug_rank: args.debug_rank.as_deref(),
        },
        nproc_per_node.saturating_mul(nnodes.max),
        env,
        host,
    )?;
    log.collapse = console.collapse_for(nproc_per_node, log.local_ranks_filter.as_deref());
    log.progress = console.progress_for(nproc_per_node, log.local_ranks_filter.as_deref());

    if args.virtual_local_rank {
        // Fail before any worker starts, not when the first surplus rank is spawned.
        for local_rank in 0..nproc_per_node {
            crate::workerenv::virtual_local_rank_devices(
                local_rank,
                env("HIP_VISIBLE_DEVICES").as_deref(),
                env("CUDA_VISIBLE_DEVICES").as_deref(),
            )?;
        }
    }

    let mut cfg = LaunchConfig {
        nproc_per_node,
        nnodes,
        node_rank,
        rdzv,
        standalone,
        master_addr,
        master_port,
        local_addr: args.local_addr.clone(),
        max_restarts,
        role: args.role.clone(),
        command,
        log,
        signals_to_handle,
        shutdown_timeout,
        virtual_local_rank: args.virtual_local_rank,
        report_json: args.report_json.clone(),
        report_junit: args.report_junit.clone(),
        exit_barrier_timeout: Duration::from_secs_f64(args.exit_barrier_timeout),
        leftovers,
        cluster: ClusterPlan::default(),
        hang,
        observe,
        binding,
        console,
        torch_env,
        run_env,
        resilience,
        warm,
    };
    cfg.cluster = cluster::plan(detected, &args, &layout, &cfg)?;
    if cfg.cluster.dry_run.is_some() {
        // Standalone, or no --rdzv-id elsewhere: the real run makes its own id up at launch, so
        // the one made up here is not shown as if it were the run's.
        let fresh = cfg.standalone || layout.run_id.value.is_empty();
        if fresh {
            cfg.cluster.topology.fields.run_id = None;
        }
        cfg.cluster.run = Some(dryrun::preview(&cfg, fresh));
    }
    Ok(cfg)
}

/// Whether a run with these values holds a rendezvous (see [`LaunchConfig::uses_rendezvous`]).
fn uses_rendezvous(standalone: bool, rdzv: &RdzvConfig, nnodes: NodeRange) -> bool {
    !standalone && rdzv.endpoint.is_some() && (nnodes.max > 1 || rdzv.backend == RdzvBackend::C10d)
}

impl LaunchConfig {
    /// Whether the run holds a rendezvous: several nodes, or a c10d endpoint (a single-node
    /// run, standalone or not, starts none).
    pub fn uses_rendezvous(&self) -> bool {
        uses_rendezvous(self.standalone, &self.rdzv, self.nnodes)
    }
}

/// `--numa-binding`, `--cpu-binding`, `--omp-num-threads`: computed for every local rank now, so
/// that a machine that cannot honour them fails before any worker starts (torch fails at spawn).
fn resolve_binding(
    args: &LaunchArgs,
    nproc: usize,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<numa::Binding, ConfigError> {
    let omp = match &args.omp_num_threads {
        None => None,
        Some(text) => Some(numa::OmpThreads::parse(text).ok_or_else(|| {
            invalid(
                "--omp-num-threads",
                text.clone(),
                "must be cpus or a positive integer",
            )
        })?),
    };
    // The parser checked the choice.
    let mode = args.numa_binding.as_deref().and_then(numa::NumaMode::parse);
    numa::resolve(mode, args.cpu_binding, omp, nproc, env, host).map_err(|reason| {
        ConfigError::Binding {
            flag: match &args.numa_binding {
                Some(m) => format!("--numa-binding {m}"),
                None => "--cpu-binding".into(),
            },
            reason,
        }
    })
}

/// Hang settings: the defaults, the `RDRUN_HANG_*` variables, then the flags given.
fn resolve_hang(args: &LaunchArgs, env: EnvFn<'_>) -> Result<hang::HangSettings, ConfigError> {
    let mut s = hang::HangSettings::from_env(env).map_err(ConfigError::Hang)?;
    for (name, value) in &args.hang {
        s.set(name, value).map_err(ConfigError::Hang)?;
    }
    Ok(s)
}

/// Events, metrics and health settings; a bad value names its flag or variable.
fn resolve_observe(
    args: &LaunchArgs,
    env: EnvFn<'_>,
) -> Result<observe::ObserveSettings, ConfigError> {
    observe::resolve(
        args.events.as_deref(),
        &args.event_log_handler,
        args.metrics_addr.as_deref(),
        env,
    )
    .map_err(|(flag, value, reason)| ConfigError::Invalid {
        flag,
        value,
        reason,
        var: (!flag.starts_with('-')).then(|| flag.to_string()),
    })
}

#[cfg(test)]
pub(crate) mod testkit;

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
