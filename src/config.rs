//! Resolution of parsed arguments ([`crate::cli::LaunchArgs`]) into a [`LaunchConfig`].
//!
//! Parsing (what the user typed) lives in `cli.rs`; this file decides what it means on this
//! machine: nnodes `N`/`MIN:MAX`, nproc `cpu`/`gpu`/`auto`/N, standalone and auto-standalone,
//! rendezvous endpoint and conf, the worker command, log and tee specs, signals and timeouts.
//! The supervisor consumes a `LaunchConfig` and never looks at raw arguments.
//!
//! The types below are the contract between `cli`/`config` and `supervisor`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdzvConfig {
    pub backend: RdzvBackend,
    /// `None` only for a single-node (standalone) run, where rdrun binds loopback port 0.
    pub endpoint: Option<Endpoint>,
    /// TORCHELASTIC_RUN_ID: `--rdzv-id`, or a fresh UUID for standalone.
    pub run_id: String,
    /// `--rdzv-conf` key/value pairs, whitespace-stripped, values kept as text.
    pub conf: BTreeMap<String, String>,
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
    /// Full argv after the program (e.g. `["-u", "train.py", "--lr", "0.1"]`).
    pub args: Vec<String>,
    /// Name used in the failure report title (script as typed, module, or binary).
    pub display_name: String,
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
    pub master_addr: String,
    /// `--master-port` as given; `None` = let the kernel pick (standalone) or 29500 (static).
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
    /// rdrun's `--exit-barrier-timeout` (multi-node; default 300 s as torchrun).
    pub exit_barrier_timeout: Duration,
}
