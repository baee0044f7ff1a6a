//! Command-line parsing of every torchrun 2.15 flag (both spellings, `PET_*` fallback) into
//! [`LaunchArgs`]. Parse only: no I/O and no resolution against the machine (that is `config.rs`);
//! the environment is read through the accessor the caller passes in.
//!
//! The parser is hand-written rather than clap-derived because torchrun's command line is Python
//! `argparse` (spec torchrun-compat §1.1) and several of its behaviours have no clap equivalent:
//! unique-prefix abbreviation where the two spellings of one flag collide (`--nproc` is ambiguous,
//! `--nproc-per` is not), `REMAINDER` after the script (flags after it belong to the script), the
//! Python 3.11 `--` rules, short-flag chaining (`-mr3`), `-r=3`, argparse's "does this look like a
//! flag" test for values (`--max-restarts -1` is a value, `--rdzv-conf -x` is not), and defaults
//! read from `PET_<DEST>` converted exactly like command-line text.
//!
//! One responsibility despite the length (about 1,140 lines of code, the rest tests): the option
//! table, the argparse rules and the `--help` text belong together.
//!
//! Deliberate differences from argparse (recorded in docs/compat.md):
//! - Arguments after the training script are never inspected. argparse classifies them too, so
//!   `torchrun t.py --nproc 2` fails with "ambiguous option"; rdrun passes `--nproc 2` to the script.
//! - rdrun's own flags (`--report-json`, `--exit-barrier-timeout`) must be spelled in full, so
//!   that adding them does not make a torchrun abbreviation (`--re` = `--redirects`) ambiguous.
//! - A non-integer `PET_<FLAG>` for a boolean flag is a usage error naming the variable (torchrun
//!   crashes with a Python traceback).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// `--print-completion` scripts and the `--print-man` page, generated from [`flag_table`].
pub mod completion;

/// Reads one environment variable; `None` when unset. Tests pass a closure over a map.
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What the user typed, typed as argparse types it, before any resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchArgs {
    /// `--nnodes`: `N` or `MIN:MAX` (text; checked in `config`).
    pub nnodes: String,
    /// `--nproc-per-node`: an integer, `cpu`, `gpu`, `auto` (text; resolved in `config`).
    pub nproc_per_node: String,
    pub rdzv_backend: String,
    pub rdzv_endpoint: String,
    /// `--rdzv-id`; torchrun's literal default is `none`.
    pub rdzv_id: String,
    pub rdzv_conf: String,
    pub standalone: bool,
    pub max_restarts: i64,
    pub monitor_interval: f64,
    /// Accepted for compatibility; meaningless without Python multiprocessing.
    pub start_method: String,
    pub event_log_handler: String,
    pub role: String,
    pub module: bool,
    pub no_python: bool,
    pub run_path: bool,
    pub log_dir: Option<String>,
    pub redirects: String,
    pub tee: String,
    pub log_line_prefix_template: String,
    pub local_ranks_filter: String,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
    pub node_rank: i64,
    pub master_addr: String,
    pub master_port: Option<i64>,
    pub local_addr: Option<String>,
    /// `--logs-specs` (a Python plugin name; rejected by [`parse_from`], kept for later issues).
    pub logs_specs: Option<String>,
    /// `--numa-binding node|socket|exclusive|core-complex` (applied by `config::numa`).
    pub numa_binding: Option<String>,
    /// rdrun's `--cpu-binding`: each local rank gets its own share of the affinity mask.
    pub cpu_binding: bool,
    /// rdrun's `--omp-num-threads cpus|N` (OMP_NUM_THREADS of every worker).
    pub omp_num_threads: Option<String>,
    pub signals_to_handle: String,
    pub shutdown_timeout: Option<i64>,
    pub virtual_local_rank: bool,
    /// rdrun's `--report-json PATH`.
    pub report_json: Option<PathBuf>,
    /// rdrun's `--exit-barrier-timeout SECS` (torchrun hard-codes 300).
    pub exit_barrier_timeout: f64,
    /// rdrun's `--leftovers kill|wait|leave` (else RDRUN_LEFTOVERS, read by `config`).
    pub leftovers: Option<String>,
    /// rdrun's `--cluster auto|none|slurm|k8s|mpi|lsf|hostfile` (else RDRUN_CLUSTER, read by
    /// `config` through `cluster::ClusterChoice::resolve`).
    pub cluster: Option<String>,
    /// rdrun's `--hostfile PATH` (RDRUN_HOSTFILE and Open MPI's variable are read by the
    /// cluster hostfile reader itself).
    pub hostfile: Option<String>,
    /// rdrun's `--include` / `--exclude NODE_SPEC[@NODE_SPEC…]`: DeepSpeed's documented hostfile
    /// filters (applied by the cluster hostfile reader).
    pub include: Option<String>,
    pub exclude: Option<String>,
    /// rdrun's `--dry-run`: resolve and print the topology, start nothing.
    pub dry_run: bool,
    /// rdrun's `--nested` (else RDRUN_NESTED=1, read by `config`): a launch from inside a
    /// torchrun/rdrun worker under a detected scheduler is intended (it forms its own world).
    pub nested: bool,
    /// rdrun's `--print-topology[=json]`: `Some("text")` or `Some("json")`; implies a dry run.
    pub print_topology: Option<String>,
    /// rdrun's `--events PATH|-`: lifecycle events as JSON lines (resolved in `config::observe`).
    pub events: Option<String>,
    /// rdrun's `--metrics-addr HOST:PORT` (else RDRUN_METRICS_ADDR, read by `config`).
    pub metrics_addr: Option<String>,
    /// The dests typed on the command line (not defaults, not `PET_*`): the cluster layer's
    /// "flags" win every field, so it must know which values the user actually gave.
    pub cli_given: BTreeSet<&'static str>,
    /// rdrun's hang-detection flags given on the command line, as (name without `--`, value)
    /// in [`HANG_FLAGS`] order; `config` applies them over the `RDRUN_HANG_*` variables.
    pub hang: Vec<(&'static str, String)>,
    /// The script path, module name (`-m`) or program (`--no-python`), as typed (any bytes).
    pub training_script: OsString,
    /// Everything after the training script, byte for byte (after the `--` rules of spec §1.1):
    /// it reaches the workers' `execve` unchanged, UTF-8 or not.
    pub training_script_args: Vec<OsString>,
    /// Values that came from `PET_*` variables: dest (e.g. `nproc_per_node`) -> variable name,
    /// so that an error found later (in `config`) names the variable the user set.
    pub from_env: BTreeMap<String, String>,
}

/// Result of a successful parse.
#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// Launch with these arguments.
    Launch(Box<LaunchArgs>),
    /// `-h`/`--help` was given: print [`help_text`] and exit 0.
    Help,
    /// `--print-completion SHELL` or `--print-man`: print this text on stdout and exit 0
    /// (generated from [`OPTIONS`] by [`completion`]).
    Print(String),
}

/// A command-line usage error; the binary prints `rdrun: error: <message>` and exits 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("ambiguous option: {option} could match {matches}")]
    Ambiguous { option: String, matches: String },
    #[error("unrecognized arguments: {}", .0.join(" "))]
    Unrecognized(Vec<String>),
    #[error("argument {flag}: expected one argument")]
    ExpectedValue { flag: String },
    #[error("argument {flag}: ignored explicit argument '{value}'")]
    IgnoredExplicit { flag: String, value: String },
    #[error("argument {flag}: the value {value:?} is not valid UTF-8")]
    NotText { flag: String, value: String },
    #[error("argument {flag}: invalid {kind} value: '{value}'{}", from_env(.var))]
    InvalidValue {
        flag: String,
        kind: &'static str,
        value: String,
        /// The `PET_*` variable the value came from, if it did not come from the command line.
        var: Option<String>,
    },
    #[error("argument {flag}: invalid choice: '{value}' (choose from {choices})")]
    InvalidChoice {
        flag: String,
        value: String,
        choices: String,
    },
    #[error("{var}={value:?}: a boolean flag read from the environment must be an integer (0 = off, non-zero = on)")]
    InvalidEnvFlag { var: String, value: String },
    #[error("the following arguments are required: training_script, training_script_args")]
    MissingScript,
    #[error("{flag} is not supported by rdrun: {why}")]
    Unsupported { flag: String, why: &'static str },
}

fn from_env(var: &Option<String>) -> String {
    match var {
        Some(v) => format!(" (from {v})"),
        None => String::new(),
    }
}

/// How an option consumes its value and converts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No value; `check_env` semantics for the `PET_*` default.
    Flag,
    Str,
    Int,
    Float,
    /// A comma-separated list where `,,` is a literal comma.
    List,
    /// A string restricted to these values on the command line (not in `PET_*`, as argparse).
    Choice(&'static [&'static str]),
    /// A flag that takes a value only as `--flag=VALUE` (one of these), like argparse's
    /// `nargs='?'` with `const`: `--print-topology` or `--print-topology=json`.
    OptionalChoice(&'static [&'static str]),
    Help,
    Completion,
    /// `--print-man`: print the man page and exit, like `-h`.
    Man,
}

/// One option of the table below.
#[derive(Debug)]
struct OptSpec {
    /// argparse's dest; also the suffix of the `PET_*` variable.
    dest: &'static str,
    names: &'static [&'static str],
    kind: Kind,
    /// Whether `PET_<DEST>` supplies the default.
    pet: bool,
    /// rdrun's own flags take part in no abbreviation (see the module docs).
    abbreviable: bool,
    /// Default as shown in `--help`.
    default: &'static str,
    help: &'static str,
    /// The closed set of words a [`Kind::Str`] option accepts, for the completion scripts and
    /// the man page. The parser passes the text through unchecked (torchrun's argparse does, and
    /// `config` gives the precise error); `config`'s tests check each word resolves.
    values: &'static [&'static str],
}

const fn opt(
    dest: &'static str,
    names: &'static [&'static str],
    kind: Kind,
    default: &'static str,
    help: &'static str,
) -> OptSpec {
    OptSpec {
        dest,
        names,
        kind,
        pet: true,
        abbreviable: true,
        default,
        help,
        values: &[],
    }
}

const START_METHODS: &[&str] = &["spawn", "fork", "forkserver"];
const NUMA_MODES: &[&str] = &["node", "socket", "exclusive", "core-complex"];
/// torchrun offers shtab's shells (bash, zsh, tcsh); rdrun adds fish.
pub const SHELLS: &[&str] = &["bash", "zsh", "tcsh", "fish"];
/// `--rdzv-backend` (`etcd` is an alias of `etcd-v3`, not offered twice).
pub const RDZV_BACKENDS: &[&str] = &["static", "c10d", "etcd-v3"];
/// `--event-log-handler`.
pub const EVENT_HANDLERS: &[&str] = &["null", "console"];
/// `--leftovers`.
pub const LEFTOVER_POLICIES: &[&str] = &["kill", "wait", "leave"];
/// `--cluster`.
pub const CLUSTER_CHOICES: &[&str] = &["auto", "none", "slurm", "k8s", "mpi", "lsf", "hostfile"];
/// `--hang-detect`.
pub const HANG_MODES: &[&str] = &["off", "observe", "kill"];

/// Every option, in torchrun's registration order (which is the order argparse lists ambiguous
/// matches in), followed by rdrun's own.
static OPTIONS: &[OptSpec] = &[
    OptSpec {
        pet: false,
        ..opt("help", &["-h", "--help"], Kind::Help, "", "show this help message and exit")
    },
    opt("nnodes", &["--nnodes"], Kind::Str, "1:1",
        "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>; more than one node runs the --rdzv-backend rendezvous (static: node ranks; c10d: elastic)."),
    opt("nproc_per_node", &["--nproc-per-node", "--nproc_per_node"], Kind::Str, "1",
        "Number of workers per node; supported values: [auto, cpu, gpu, int] (int: at most 4096)."),
    OptSpec {
        values: RDZV_BACKENDS,
        ..opt("rdzv_backend", &["--rdzv-backend", "--rdzv_backend"], Kind::Str, "static",
            "Rendezvous backend: static, c10d, etcd-v3 (alias etcd; needs the `etcd` build feature).")
    },
    opt("rdzv_endpoint", &["--rdzv-endpoint", "--rdzv_endpoint"], Kind::Str, "",
        "Rendezvous backend endpoint; usually in form <host>:<port>."),
    opt("rdzv_id", &["--rdzv-id", "--rdzv_id"], Kind::Str, "none", "User-defined group id."),
    opt("rdzv_conf", &["--rdzv-conf", "--rdzv_conf"], Kind::Str, "",
        "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...)."),
    opt("standalone", &["--standalone"], Kind::Flag, "off",
        "Single-node run with a local store on a free loopback port and a fresh run id; --rdzv-backend, --rdzv-endpoint and --rdzv-id are ignored."),
    opt("max_restarts", &["--max-restarts", "--max_restarts"], Kind::Int, "0",
        "Maximum number of worker group restarts before failing."),
    opt("monitor_interval", &["--monitor-interval", "--monitor_interval"], Kind::Float, "0.1",
        "Accepted for compatibility; rdrun reacts to worker exits as events and does not poll."),
    opt("start_method", &["--start-method", "--start_method"], Kind::Choice(START_METHODS), "spawn",
        "Accepted for compatibility and ignored (torchrun uses it only for Python function entrypoints)."),
    OptSpec {
        values: EVENT_HANDLERS,
        ..opt("event_log_handler", &["--event-log-handler", "--event_log_handler"], Kind::Str, "null",
            "Event logging handler: null or console (other handlers are Python plugins, not supported).")
    },
    opt("role", &["--role"], Kind::Str, "default", "User-defined role for the workers."),
    opt("module", &["-m", "--module"], Kind::Flag, "off",
        "Interpret the training script as a Python module, executing with the same behavior as 'python -m'."),
    opt("no_python", &["--no-python", "--no_python"], Kind::Flag, "off",
        "Execute the training script directly instead of under python (rdrun also does this for any executable that is not a .py file)."),
    opt("run_path", &["--run-path", "--run_path"], Kind::Flag, "off",
        "Run the training script with runpy.run_path in a python -u -c bootstrap that writes the error file; takes precedence over --no-python."),
    opt("log_dir", &["--log-dir", "--log_dir"], Kind::Str, "none",
        "Base directory for log files; a <run_id>_<suffix>/attempt_<n>/<local_rank>/ tree is created in it when something is written."),
    opt("redirects", &["-r", "--redirects"], Kind::Str, "0",
        "Redirect std streams into log files (0 none, 1 stdout, 2 stderr, 3 both; or a map like 0:1,1:2 with ranks of any number of digits)."),
    opt("tee", &["-t", "--tee"], Kind::Str, "0",
        "Tee std streams into a log file and also to the console (same format as --redirects)."),
    opt("log_line_prefix_template", &["--log-line-prefix-template", "--log_line_prefix_template"], Kind::Str, "",
        "Prefix of each tee'd console line; macros ${role_name}, ${local_rank}, ${rank}, ${hostname}. Defaults to TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else '[${role_name}${local_rank}]:'."),
    opt("local_ranks_filter", &["--local-ranks-filter", "--local_ranks_filter"], Kind::Str, "",
        "Only show the console output of these comma-separated local ranks (log files are unaffected)."),
    opt("duplicate_stdout_filters", &["--duplicate-stdout-filters", "--duplicate_stdout_filters"], Kind::List, "",
        "Also copy tee'd stdout lines containing any of these comma-separated strings (',,' is a literal comma) to filtered_stdout.log."),
    opt("duplicate_stderr_filters", &["--duplicate-stderr-filters", "--duplicate_stderr_filters"], Kind::List, "",
        "Same as --duplicate-stdout-filters, for stderr."),
    opt("node_rank", &["--node-rank", "--node_rank"], Kind::Int, "0",
        "Rank of the node for multi-node training (static rendezvous only)."),
    opt("master_addr", &["--master-addr", "--master_addr"], Kind::Str, "127.0.0.1",
        "Address of the master node (static rendezvous only); IPv6 as [::1]."),
    opt("master_port", &["--master-port", "--master_port"], Kind::Int, "none",
        "Port on the master node (static rendezvous only); setting it disables the automatic standalone mode. Static default 29500."),
    opt("local_addr", &["--local-addr", "--local_addr"], Kind::Str, "none",
        "Address of the local node."),
    OptSpec {
        pet: false,
        ..opt("logs_specs", &["--logs-specs", "--logs_specs"], Kind::Str, "none",
            "Not supported: a torchrun.logs_specs Python plugin.")
    },
    OptSpec {
        pet: false,
        ..opt("numa_binding", &["--numa-binding", "--numa_binding"], Kind::Choice(NUMA_MODES), "none",
            "Bind each worker to the CPUs near the accelerator whose index is its local rank (torch/numa/binding.py modes), read from sysfs and set by rdrun between fork and exec (no numactl needed).")
    },
    opt("signals_to_handle", &["--signals-to-handle", "--signals_to_handle"], Kind::Str,
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2",
        "Comma-separated signals to catch and forward to every worker's process group. TERM/INT/HUP/QUIT stop the run; USR1/USR2 (e.g. a scheduler's preemption notice) are forwarded and the run goes on, but a worker that does not handle them dies of them (exit 138/140) and fails the run: list only TERM,INT,HUP,QUIT (torchrun's default) not to forward them (a USR1/USR2 then ends rdrun by its default action, as torchrun)."),
    opt("shutdown_timeout", &["--shutdown-timeout", "--shutdown_timeout"], Kind::Int, "30",
        "Seconds between the stop signal and SIGKILL, for every stop (also after a worker failure). Else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30."),
    opt("virtual_local_rank", &["--virtual-local-rank", "--virtual_local_rank"], Kind::Flag, "off",
        "LOCAL_RANK=0 for every worker and one GPU each through CUDA_VISIBLE_DEVICES."),
    OptSpec {
        pet: false,
        ..opt("print_completion", &["--print-completion", "--print_completion"], Kind::Completion, "",
            "Print a shell completion script for rdrun to stdout and exit (e.g. --print-completion bash > ~/.local/share/bash-completion/completions/rdrun).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("cpu_binding", &["--cpu-binding", "--cpu_binding"], Kind::Flag, "off",
            "rdrun: give each local rank its own share of rdrun's CPU affinity mask (whole physical cores when there are enough), for CPU-only jobs; not with --numa-binding.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("omp_num_threads", &["--omp-num-threads", "--omp_num_threads"], Kind::Str, "none",
            "rdrun: OMP_NUM_THREADS for every worker, over any inherited value: cpus (the number of CPUs the worker is bound to; unbound: the affinity mask divided by the workers) or a positive integer. Without it torchrun's rule holds (1 when unset and nproc > 1).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("print_man", &["--print-man"], Kind::Man, "",
            "rdrun: print rdrun's man page (roff, from this option table) to stdout and exit.")
    },
    OptSpec {
        abbreviable: false,
        ..opt("report_json", &["--report-json", "--report_json"], Kind::Str, "none",
            "rdrun: write the run's outcome (root cause, failures, exit code) as JSON to this path.")
    },
    OptSpec {
        abbreviable: false,
        ..opt("exit_barrier_timeout", &["--exit-barrier-timeout", "--exit_barrier_timeout"], Kind::Float, "300",
            "rdrun: seconds to wait for the other nodes after local success (multi-node).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: LEFTOVER_POLICIES,
        ..opt("leftovers", &["--leftovers"], Kind::Str, "kill",
            "rdrun: processes the workers leave behind after a successful run: kill (stop them, each named at WARN), wait (until they exit), leave. Else RDRUN_LEFTOVERS.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: CLUSTER_CHOICES,
        ..opt("cluster", &["--cluster"], Kind::Str, "auto",
            "rdrun: scheduler detection: auto (read Slurm, Kubernetes, MPI, LSF, hostfile environments), none (a local run as torchrun), or force one of slurm, k8s, mpi, lsf, hostfile. Else RDRUN_CLUSTER.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("hostfile", &["--hostfile"], Kind::Str, "none",
            "rdrun: a hostfile (DeepSpeed 'host slots=N' or Open MPI dialect); this node's rank is its host's position. Else RDRUN_HOSTFILE or OMPI_MCA_orte_default_hostfile.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("include", &["--include"], Kind::Str, "none",
            "rdrun: keep only these hostfile hosts/slots, DeepSpeed's NODE_SPEC[@NODE_SPEC...] with NODE_SPEC = NAME[:SLOT[,SLOT...]] (slots are device indices).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("exclude", &["--exclude"], Kind::Str, "none",
            "rdrun: drop these hostfile hosts/slots (same syntax as --include; not both).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("nested", &["--nested"], Kind::Flag, "off",
            "rdrun: allow this launch from inside a torchrun/rdrun worker while a scheduler is detected (it forms a world of its own; refused by default). Else RDRUN_NESTED=1.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("dry_run", &["--dry-run", "--dry_run"], Kind::Flag, "off",
            "rdrun: resolve the configuration, print the topology (where every value came from) and exit 0 without starting anything.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("print_topology", &["--print-topology", "--print_topology"], Kind::OptionalChoice(TOPOLOGY_FORMATS), "off",
            "rdrun: as --dry-run; --print-topology=json prints the topology as JSON.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("events", &["--events"], Kind::Str, "none",
            "rdrun: also write every lifecycle event (spawn, exit, stop, restart, rendezvous, ...) as one JSON object per line to this file, or to stderr with '-' (with --log-dir they always go to <run dir>/events.jsonl).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt("metrics_addr", &["--metrics-addr", "--metrics_addr"], Kind::Str, "none",
            "rdrun: serve Prometheus metrics at http://HOST:PORT/metrics and the health state at /healthz (PORT alone: loopback). Else RDRUN_METRICS_ADDR.")
    },
    OptSpec {
        values: HANG_MODES,
        ..hang_opt("hang_detect", &["--hang-detect"], "kill; observe when rdrun's stdin is a terminal",
            "rdrun: hang detection: kill (capture stacks, then stop and restart the group), observe (capture and report only), off. Else RDRUN_HANG_DETECT.")
    },
    hang_opt("hang_timeout", &["--hang-timeout"], "900",
        "rdrun: a hang is every rank quiet (no CPU, I/O, output or heartbeat) for this long once running (seconds, or 90s/15m/1h). Else RDRUN_HANG_TIMEOUT."),
    hang_opt("hang_startup_timeout", &["--hang-startup-timeout"], "1800",
        "rdrun: the same budget from spawn until every rank has shown progress (output or a heartbeat). Else RDRUN_HANG_STARTUP_TIMEOUT."),
    hang_opt("hang_exit_skew_timeout", &["--hang-exit-skew-timeout"], "300",
        "rdrun: a hang is also some rank exited 0 and the others quiet for this long. Else RDRUN_HANG_EXIT_SKEW_TIMEOUT."),
    hang_opt("hang_poll_interval", &["--hang-poll-interval"], "5",
        "rdrun: how often every rank's activity is sampled from /proc. Else RDRUN_HANG_POLL_INTERVAL."),
    hang_opt("hang_cpu_idle", &["--hang-cpu-idle"], "5",
        "rdrun: a rank using less CPU than this percentage of one core in a poll interval is quiet. Else RDRUN_HANG_CPU_IDLE."),
    hang_opt("hang_io_idle", &["--hang-io-idle"], "65536",
        "rdrun: a rank reading+writing fewer bytes than this in a poll interval is quiet. Else RDRUN_HANG_IO_IDLE."),
    hang_opt("hang_capture_timeout", &["--hang-capture-timeout"], "20",
        "rdrun: wall-clock bound of the capture (stacks, kernel waits) after a hang. Else RDRUN_HANG_CAPTURE_TIMEOUT."),
    hang_opt("py_spy", &["--py-spy"], "py-spy on PATH, else beside the worker's python",
        "rdrun: the py-spy binary used for the Python stacks of a hung job (absent: stacks are recorded as unavailable). Else RDRUN_PY_SPY."),
];

const TOPOLOGY_FORMATS: &[&str] = &["text", "json"];

/// rdrun's hang-detection flags: (dest, name without `--`), as `HangSettings::set` names them.
pub const HANG_FLAGS: &[(&str, &str)] = &[
    ("hang_detect", "hang-detect"),
    ("hang_timeout", "hang-timeout"),
    ("hang_startup_timeout", "hang-startup-timeout"),
    ("hang_exit_skew_timeout", "hang-exit-skew-timeout"),
    ("hang_poll_interval", "hang-poll-interval"),
    ("hang_cpu_idle", "hang-cpu-idle"),
    ("hang_io_idle", "hang-io-idle"),
    ("hang_capture_timeout", "hang-capture-timeout"),
    ("py_spy", "py-spy"),
];

/// An rdrun hang-detection option: a string checked by `config` (through `HangSettings`), no
/// `PET_*` variable (its `RDRUN_*` one is read by `config`), never abbreviated.
const fn hang_opt(
    dest: &'static str,
    names: &'static [&'static str],
    default: &'static str,
    help: &'static str,
) -> OptSpec {
    OptSpec {
        abbreviable: false,
        pet: false,
        ..opt(dest, names, Kind::Str, default, help)
    }
}

/// What an option takes, as completion scripts and the man page describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagValue {
    /// No value (a switch, `-h`, `--print-man`).
    None,
    /// Any text; `metavar` names it.
    Text { metavar: &'static str },
    /// A path (file or directory).
    Path { metavar: &'static str },
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Optionally `=` one of these words (`--print-topology[=json]`).
    OptionalChoice(&'static [&'static str]),
}

/// One option of the parser's table, for [`completion`] (scripts and man page come from
/// the same table the parser uses: no second list to keep in sync).
#[derive(Debug, Clone)]
pub struct FlagView {
    /// Every spelling, canonical first (`--nproc-per-node`, `--nproc_per_node`).
    pub names: &'static [&'static str],
    pub value: FlagValue,
    pub help: &'static str,
    /// Default as `--help` shows it; empty for none.
    pub default: &'static str,
    /// `PET_<DEST>` when that variable supplies the default.
    pub env: Option<String>,
}

/// The option table, in `--help` order.
pub fn flag_table() -> Vec<FlagView> {
    OPTIONS
        .iter()
        .map(|o| {
            let metavar = match o.dest {
                "log_dir" => "DIR",
                "report_json" | "hostfile" | "py_spy" | "events" => "PATH",
                _ => "VALUE",
            };
            let value = match o.kind {
                Kind::Flag | Kind::Help | Kind::Man => FlagValue::None,
                Kind::Choice(c) => FlagValue::Choice(c),
                Kind::Str if !o.values.is_empty() => FlagValue::Choice(o.values),
                Kind::Completion => FlagValue::Choice(SHELLS),
                Kind::OptionalChoice(c) => FlagValue::OptionalChoice(c),
                _ if metavar != "VALUE" => FlagValue::Path { metavar },
                _ => FlagValue::Text { metavar: o.dest },
            };
            FlagView {
                names: o.names,
                value,
                help: o.help,
                default: if matches!(o.kind, Kind::Help | Kind::Completion | Kind::Man) {
                    ""
                } else {
                    o.default
                },
                env: o
                    .pet
                    .then(|| format!("PET_{}", o.dest.to_ascii_uppercase())),
            }
        })
        .collect()
}

/// Index into [`OPTIONS`].
type OptId = usize;

/// What one command-line word is, by argparse's rules (`_parse_optional`).
enum Class<'a> {
    Positional,
    Unknown,
    Option {
        id: OptId,
        name: &'static str,
        explicit: Option<&'a str>,
    },
}

fn exact(name: &str) -> Option<(OptId, &'static str)> {
    OPTIONS
        .iter()
        .enumerate()
        .find_map(|(id, o)| o.names.iter().find(|n| **n == name).map(|n| (id, *n)))
}

/// argparse's "looks like a negative number" test; such words are values, not flags.
fn is_negative_number(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('-') else {
        return false;
    };
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if all_digits(rest) {
        return true;
    }
    match rest.split_once('.') {
        Some((int, frac)) => (int.is_empty() || all_digits(int)) && all_digits(frac),
        None => false,
    }
}

fn classify(arg: &str) -> Result<Class<'_>, UsageError> {
    if !arg.starts_with('-') {
        return Ok(Class::Positional);
    }
    if let Some((id, name)) = exact(arg) {
        return Ok(Class::Option {
            id,
            name,
            explicit: None,
        });
    }
    if arg.len() == 1 {
        return Ok(Class::Positional);
    }
    if let Some((flag, value)) = arg.split_once('=') {
        if let Some((id, name)) = exact(flag) {
            return Ok(Class::Option {
                id,
                name,
                explicit: Some(value),
            });
        }
    }
    // Unique-prefix abbreviation (argparse `_get_option_tuples`, Python 3.11).
    let mut matches: Vec<(OptId, &'static str, Option<&str>)> = Vec::new();
    if arg.starts_with("--") {
        let (prefix, explicit) = match arg.split_once('=') {
            Some((p, v)) => (p, Some(v)),
            None => (arg, None),
        };
        for (id, o) in OPTIONS.iter().enumerate().filter(|(_, o)| o.abbreviable) {
            for n in o.names.iter().filter(|n| n.starts_with(prefix)) {
                matches.push((id, n, explicit));
            }
        }
    } else {
        // `-r3` is `-r` with the value `3`; `-mr3` is `-m` then `-r3` (chained in `parse_from`).
        let short = arg.get(..2).unwrap_or(arg);
        let rest = arg.get(2..).unwrap_or("");
        for (id, o) in OPTIONS.iter().enumerate() {
            for n in o.names.iter() {
                if *n == short {
                    matches.push((id, n, Some(rest)));
                } else if n.starts_with(arg) {
                    matches.push((id, n, None));
                }
            }
        }
    }
    match matches.len() {
        0 => {}
        1 => {
            let (id, name, explicit) = matches[0];
            return Ok(Class::Option { id, name, explicit });
        }
        _ => {
            return Err(UsageError::Ambiguous {
                option: arg.to_string(),
                matches: matches.iter().map(|m| m.1).collect::<Vec<_>>().join(", "),
            })
        }
    }
    if is_negative_number(arg) || arg.contains(' ') {
        return Ok(Class::Positional);
    }
    Ok(Class::Unknown)
}

/// argparse's display name of an option: all its spellings joined by `/`.
fn display(id: OptId) -> String {
    OPTIONS[id].names.join("/")
}

/// Python `int(text)`: surrounding whitespace, an optional sign, `_` between digits.
pub(crate) fn python_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let v: i64 = clean.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Python `float(text)` for the forms people type: decimals, exponents, `inf`, `nan`.
pub(crate) fn python_float(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty() || t.contains("__") || t.starts_with('_') || t.ends_with('_') {
        return None;
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse::<f64>().ok()
}

/// torchrun's `comma_separated_list`: split on `,`, where `,,` stands for a literal comma.
pub(crate) fn comma_separated_list(value: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                items.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    items.push(cur);
    items
}

/// A value seen for one option, and where it came from.
#[derive(Debug, Clone)]
struct Given {
    text: String,
    /// The `PET_*` variable, when not from the command line.
    var: Option<String>,
}

/// Parses torchrun's command line (without the program name) plus `PET_*` defaults from `env`.
///
/// Words are classified as text (a non-UTF-8 flag value is a usage error naming the flag); the
/// training script and its arguments are kept as the bytes given.
pub fn parse_from<A: AsRef<OsStr>>(raw: &[A], env: EnvFn<'_>) -> Result<Invocation, UsageError> {
    let argv: Vec<String> = raw
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let verbatim = |from: usize| -> Vec<OsString> {
        raw.get(from..)
            .unwrap_or_default()
            .iter()
            .map(|a| a.as_ref().to_owned())
            .collect()
    };
    // A flag's value must be text: the lossy copy of a non-UTF-8 word is not what was typed.
    let text_word = |word: usize, id: OptId, value: &str| -> Result<(), UsageError> {
        match raw[word].as_ref().to_str() {
            Some(_) => Ok(()),
            None => Err(UsageError::NotText {
                flag: display(id),
                value: value.to_string(),
            }),
        }
    };
    let mut given: Vec<Option<Given>> = vec![None; OPTIONS.len()];
    let mut flags: Vec<bool> = vec![false; OPTIONS.len()];
    let mut unknown: Vec<String> = Vec::new();
    let mut script: Option<(OsString, Vec<OsString>)> = None;
    // argparse runs the actions of one word (e.g. `-mh`) after reading all of it; help exits.
    let mut help = false;

    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i].as_str();
        if arg == "--" {
            // A `--` before the script ends option parsing and is dropped; everything after it
            // is the script and its arguments, verbatim (even a second `--`).
            if let Some(s) = raw.get(i + 1) {
                script = Some((s.as_ref().to_owned(), verbatim(i + 2)));
            }
            break;
        }
        match classify(arg)? {
            Class::Positional => {
                // argparse REMAINDER: the rest belongs to the script; a `--` right after the
                // script name is dropped (Python 3.11 `(-*A-*)` pattern), a later one is kept.
                let mut j = i + 1;
                if argv.get(j).map(String::as_str) == Some("--") {
                    j += 1;
                }
                script = Some((raw[i].as_ref().to_owned(), verbatim(j)));
                break;
            }
            Class::Unknown => {
                unknown.push(arg.to_string());
                i += 1;
            }
            Class::Option {
                mut id,
                mut name,
                mut explicit,
            } => {
                let word = i;
                i += 1;
                loop {
                    let spec = &OPTIONS[id];
                    match spec.kind {
                        Kind::Man => {
                            if let Some(e) = explicit {
                                return Err(UsageError::IgnoredExplicit {
                                    flag: display(id),
                                    value: e.to_string(),
                                });
                            }
                            return Ok(Invocation::Print(completion::man_page()));
                        }
                        Kind::Help | Kind::Flag => {
                            if spec.kind == Kind::Help {
                                help = true;
                            }
                            flags[id] = true;
                            let Some(e) = explicit else {
                                break;
                            };
                            // `-mr3`: a short flag followed by more short options.
                            let is_short = name.len() == 2 && !name.starts_with("--");
                            let next = e.chars().next().map(|c| format!("-{c}"));
                            match next
                                .as_deref()
                                .and_then(exact)
                                .filter(|_| is_short && !e.is_empty())
                            {
                                Some((nid, nname)) => {
                                    let rest = &e[e.chars().next().map_or(0, char::len_utf8)..];
                                    id = nid;
                                    name = nname;
                                    explicit = (!rest.is_empty()).then_some(rest);
                                }
                                None => {
                                    return Err(UsageError::IgnoredExplicit {
                                        flag: display(id),
                                        value: e.to_string(),
                                    })
                                }
                            }
                        }
                        Kind::OptionalChoice(choices) => {
                            let value = explicit.unwrap_or(choices[0]);
                            text_word(word, id, value)?;
                            if !choices.contains(&value) {
                                return Err(UsageError::InvalidChoice {
                                    flag: display(id),
                                    value: value.to_string(),
                                    choices: quoted(choices),
                                });
                            }
                            given[id] = Some(Given {
                                text: value.to_string(),
                                var: None,
                            });
                            break;
                        }
                        _ => {
                            let value = match explicit {
                                Some(v) => {
                                    text_word(word, id, v)?;
                                    v.to_string()
                                }
                                None => {
                                    let next = argv.get(i).map(String::as_str);
                                    let ok = match next {
                                        None | Some("--") => false,
                                        Some(n) => matches!(classify(n)?, Class::Positional),
                                    };
                                    if !ok {
                                        return Err(UsageError::ExpectedValue {
                                            flag: display(id),
                                        });
                                    }
                                    text_word(i, id, &argv[i])?;
                                    i += 1;
                                    argv[i - 1].clone()
                                }
                            };
                            check_cli_value(id, &value)?;
                            if spec.kind == Kind::Completion {
                                // argparse runs the action as soon as it is parsed: print, exit 0.
                                return Ok(Invocation::Print(completion::script(&value)));
                            }
                            given[id] = Some(Given {
                                text: value,
                                var: None,
                            });
                            break;
                        }
                    }
                }
                if help {
                    return Ok(Invocation::Help);
                }
            }
        }
    }

    let Some((training_script, training_script_args)) = script else {
        return Err(UsageError::MissingScript);
    };
    if !unknown.is_empty() {
        return Err(UsageError::Unrecognized(unknown));
    }

    let cli_given: BTreeSet<&'static str> = OPTIONS
        .iter()
        .enumerate()
        .filter(|(id, _)| given[*id].is_some() || flags[*id])
        .map(|(_, o)| o.dest)
        .collect();
    let mut b = Builder {
        given,
        flags,
        env,
        from_env: BTreeMap::new(),
    };
    let mut args = LaunchArgs {
        nnodes: b.string("nnodes")?,
        nproc_per_node: b.string("nproc_per_node")?,
        rdzv_backend: b.string("rdzv_backend")?,
        rdzv_endpoint: b.string("rdzv_endpoint")?,
        rdzv_id: b.string("rdzv_id")?,
        rdzv_conf: b.string("rdzv_conf")?,
        standalone: b.flag("standalone")?,
        max_restarts: b.int("max_restarts")?.unwrap_or(0),
        monitor_interval: b.float("monitor_interval")?.unwrap_or(0.1),
        start_method: b.string("start_method")?,
        event_log_handler: b.string("event_log_handler")?,
        role: b.string("role")?,
        module: b.flag("module")?,
        no_python: b.flag("no_python")?,
        run_path: b.flag("run_path")?,
        log_dir: b.opt_string("log_dir")?,
        redirects: b.string("redirects")?,
        tee: b.string("tee")?,
        log_line_prefix_template: b.string("log_line_prefix_template")?,
        local_ranks_filter: b.string("local_ranks_filter")?,
        duplicate_stdout_filters: b.list("duplicate_stdout_filters")?,
        duplicate_stderr_filters: b.list("duplicate_stderr_filters")?,
        node_rank: b.int("node_rank")?.unwrap_or(0),
        master_addr: b.string("master_addr")?,
        master_port: b.int("master_port")?,
        local_addr: b.opt_string("local_addr")?,
        logs_specs: b.opt_string("logs_specs")?,
        numa_binding: b.opt_string("numa_binding")?,
        cpu_binding: b.flags[Builder::id("cpu_binding")],
        omp_num_threads: b.opt_string("omp_num_threads")?,
        signals_to_handle: b.string("signals_to_handle")?,
        shutdown_timeout: b.int("shutdown_timeout")?,
        virtual_local_rank: b.flag("virtual_local_rank")?,
        report_json: b.opt_string("report_json")?.map(PathBuf::from),
        exit_barrier_timeout: b.float("exit_barrier_timeout")?.unwrap_or(300.0),
        leftovers: b.opt_string("leftovers")?,
        cluster: b.opt_string("cluster")?,
        hostfile: b.opt_string("hostfile")?,
        include: b.opt_string("include")?,
        exclude: b.opt_string("exclude")?,
        dry_run: b.flags[Builder::id("dry_run")],
        nested: b.flags[Builder::id("nested")],
        print_topology: b.opt_string("print_topology")?,
        events: b.opt_string("events")?,
        metrics_addr: b.opt_string("metrics_addr")?,
        cli_given,
        hang: {
            let mut given = Vec::new();
            for (dest, name) in HANG_FLAGS {
                if let Some(v) = b.opt_string(dest)? {
                    given.push((*name, v));
                }
            }
            given
        },
        training_script,
        training_script_args,
        from_env: BTreeMap::new(),
    };
    args.from_env = b.from_env;
    check_supported(&args)?;
    Ok(Invocation::Launch(Box::new(args)))
}

/// Type and choice checks argparse applies to a command-line value as soon as it is read.
fn check_cli_value(id: OptId, value: &str) -> Result<(), UsageError> {
    let invalid = |kind| UsageError::InvalidValue {
        flag: display(id),
        kind,
        value: value.to_string(),
        var: None,
    };
    let choices = match OPTIONS[id].kind {
        Kind::Int if python_int(value).is_none() => return Err(invalid("int")),
        Kind::Float if python_float(value).is_none() => return Err(invalid("float")),
        Kind::Choice(c) => c,
        Kind::Completion => SHELLS,
        _ => return Ok(()),
    };
    if choices.contains(&value) {
        return Ok(());
    }
    Err(UsageError::InvalidChoice {
        flag: display(id),
        value: value.to_string(),
        choices: quoted(choices),
    })
}

/// `'a', 'b'` as argparse lists choices.
fn quoted(choices: &[&str]) -> String {
    choices
        .iter()
        .map(|c| format!("'{c}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Flags that only make sense as Python plugins or are not built yet: rejected, never ignored.
fn check_supported(args: &LaunchArgs) -> Result<(), UsageError> {
    if args.logs_specs.is_some() {
        return Err(UsageError::Unsupported {
            flag: "--logs-specs".into(),
            why: "it loads a Python plugin (torchrun.logs_specs entry point)",
        });
    }
    if let (Some(mode), true) = (&args.numa_binding, args.cpu_binding) {
        return Err(UsageError::Unsupported {
            flag: format!("--cpu-binding with --numa-binding {mode}"),
            why: "choose one: --numa-binding binds to the accelerator's CPUs, --cpu-binding shares the affinity mask",
        });
    }
    if !matches!(args.event_log_handler.as_str(), "null" | "console") {
        return Err(UsageError::Unsupported {
            flag: format!("--event-log-handler {}", args.event_log_handler),
            why: "only the null and console handlers exist outside Python",
        });
    }
    Ok(())
}

/// Final values: command line, else `PET_<DEST>`, else the default; typed like argparse does.
struct Builder<'e> {
    given: Vec<Option<Given>>,
    flags: Vec<bool>,
    env: EnvFn<'e>,
    /// dest -> `PET_*` variable, for every value taken from the environment.
    from_env: BTreeMap<String, String>,
}

impl Builder<'_> {
    fn id(dest: &str) -> OptId {
        OPTIONS
            .iter()
            .position(|o| o.dest == dest)
            .expect("every dest used by the builder is in OPTIONS")
    }

    fn pet_name(dest: &str) -> String {
        format!("PET_{}", dest.to_ascii_uppercase())
    }

    /// The value from the command line or `PET_*`; `None` = use the default.
    fn raw(&mut self, dest: &str) -> Option<Given> {
        let id = Self::id(dest);
        if let Some(g) = self.given[id].take() {
            return Some(g);
        }
        if !OPTIONS[id].pet {
            return None;
        }
        let var = Self::pet_name(dest);
        let text = (self.env)(&var)?;
        self.from_env.insert(dest.to_string(), var.clone());
        Some(Given {
            text,
            var: Some(var),
        })
    }

    fn string(&mut self, dest: &str) -> Result<String, UsageError> {
        let default = OPTIONS[Self::id(dest)].default;
        Ok(self
            .raw(dest)
            .map_or_else(|| default.to_string(), |g| g.text))
    }

    fn opt_string(&mut self, dest: &str) -> Result<Option<String>, UsageError> {
        Ok(self.raw(dest).map(|g| g.text))
    }

    fn list(&mut self, dest: &str) -> Result<Vec<String>, UsageError> {
        Ok(self
            .raw(dest)
            .map(|g| comma_separated_list(&g.text))
            .unwrap_or_default())
    }

    fn int(&mut self, dest: &str) -> Result<Option<i64>, UsageError> {
        let id = Self::id(dest);
        match self.raw(dest) {
            None => Ok(None),
            Some(g) => python_int(&g.text)
                .map(Some)
                .ok_or_else(|| UsageError::InvalidValue {
                    flag: display(id),
                    kind: "int",
                    value: g.text,
                    var: g.var,
                }),
        }
    }

    fn float(&mut self, dest: &str) -> Result<Option<f64>, UsageError> {
        let id = Self::id(dest);
        match self.raw(dest) {
            None => Ok(None),
            Some(g) => python_float(&g.text)
                .map(Some)
                .ok_or_else(|| UsageError::InvalidValue {
                    flag: display(id),
                    kind: "float",
                    value: g.text,
                    var: g.var,
                }),
        }
    }

    /// torchrun's `check_env`: on when given, else `bool(int(PET_X))`, else off. One deliberate
    /// difference: an empty `PET_STANDALONE` is on, because the PyTorchJob operator sets it so
    /// for a one-replica job and the cluster reader reads it the same way (docs/compat.md).
    fn flag(&mut self, dest: &str) -> Result<bool, UsageError> {
        let id = Self::id(dest);
        if self.flags[id] {
            return Ok(true);
        }
        let var = Self::pet_name(dest);
        match (self.env)(&var) {
            None => Ok(false),
            Some(text) if dest == "standalone" && text.trim().is_empty() => Ok(true),
            Some(text) => match python_int(&text) {
                Some(v) => Ok(v != 0),
                None => Err(UsageError::InvalidEnvFlag { var, value: text }),
            },
        }
    }
}

/// The `--help` text: every flag with its spellings, default and `PET_*` variable.
pub fn help_text() -> String {
    let mut out = String::from(
        "usage: rdrun [OPTIONS] training_script [training_script_args ...]\n\n\
         rdrun: a drop-in replacement for torchrun (torch.distributed.run, PyTorch 2.15).\n\
         Everything after training_script is passed to it verbatim.\n\n\
         positional arguments:\n  \
         training_script       Path of the training script (.py), module name (-m) or program to launch.\n  \
         training_script_args  Arguments for the training script; ${local_rank} becomes the local rank.\n\n\
         options (every long option also accepts '_' for '-', --opt=value, and unique prefixes):\n",
    );
    for o in OPTIONS {
        let names = o.names.join(", ");
        let metavar = match o.kind {
            Kind::Flag | Kind::Help | Kind::Man => String::new(),
            Kind::Choice(c) => format!(" {{{}}}", c.join(",")),
            Kind::OptionalChoice(c) => format!("[={{{}}}]", c.join(",")),
            Kind::Completion => format!(" {{{}}}", SHELLS.join(",")),
            _ => format!(" {}", o.dest.to_ascii_uppercase()),
        };
        out.push_str(&format!("  {names}{metavar}\n      {}\n", o.help));
        let mut notes = Vec::new();
        if !matches!(o.kind, Kind::Help | Kind::Completion | Kind::Man) {
            let d = if o.default.is_empty() {
                "\"\"".to_string()
            } else {
                o.default.to_string()
            };
            notes.push(format!("default: {d}"));
        }
        if o.pet {
            notes.push(format!("env: PET_{}", o.dest.to_ascii_uppercase()));
        }
        if !notes.is_empty() {
            out.push_str(&format!("      [{}]\n", notes.join("; ")));
        }
    }
    out.push_str(
        "\nExit status: 0 on success; the failed worker's own status (its exit code, or 128+N for \
         signal N) on worker failure; 1 when rdrun itself fails; 2 on a usage error; 128+N after a \
         forwarded shutdown signal N.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn sv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn parse_env(args: &[&str], env: &[(&str, &str)]) -> Result<LaunchArgs, UsageError> {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = move |k: &str| map.get(k).cloned();
        match parse_from(&sv(args), &get)? {
            Invocation::Launch(a) => Ok(*a),
            Invocation::Help | Invocation::Print(_) => panic!("unexpected help for {args:?}"),
        }
    }

    fn parse(args: &[&str]) -> Result<LaunchArgs, UsageError> {
        parse_env(args, &[])
    }

    fn err(args: &[&str]) -> String {
        parse(args).expect_err("must fail").to_string()
    }

    #[test]
    fn defaults_match_torchrun() {
        let a = parse(&["t.py"]).unwrap();
        assert_eq!(a.nnodes, "1:1");
        assert_eq!(a.nproc_per_node, "1");
        assert_eq!(a.rdzv_backend, "static");
        assert_eq!(a.rdzv_endpoint, "");
        assert_eq!(a.rdzv_id, "none");
        assert_eq!(a.rdzv_conf, "");
        assert!(!a.standalone && !a.module && !a.no_python && !a.run_path);
        assert!(!a.virtual_local_rank);
        assert_eq!(a.max_restarts, 0);
        assert_eq!(a.monitor_interval, 0.1);
        assert_eq!(a.start_method, "spawn");
        assert_eq!(a.event_log_handler, "null");
        assert_eq!(a.role, "default");
        assert_eq!(a.log_dir, None);
        assert_eq!((a.redirects.as_str(), a.tee.as_str()), ("0", "0"));
        assert_eq!(a.log_line_prefix_template, "");
        assert_eq!(a.local_ranks_filter, "");
        assert!(a.duplicate_stdout_filters.is_empty() && a.duplicate_stderr_filters.is_empty());
        assert_eq!(a.node_rank, 0);
        assert_eq!(a.master_addr, "127.0.0.1");
        assert_eq!(a.master_port, None);
        assert_eq!(a.local_addr, None);
        assert_eq!(
            a.signals_to_handle,
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
        );
        assert_eq!(a.shutdown_timeout, None);
        assert_eq!(a.report_json, None);
        assert_eq!(a.exit_barrier_timeout, 300.0);
        assert_eq!(a.training_script, "t.py");
        assert!(a.training_script_args.is_empty());
    }

    /// Every value flag: (both spellings..., value, getter).
    #[test]
    fn every_value_flag_in_every_spelling_and_via_pet() {
        type Get = fn(&LaunchArgs) -> String;
        let table: &[(&[&str], &str, &str, Get)] = &[
            (&["--nnodes"], "2:4", "PET_NNODES", |a| a.nnodes.clone()),
            (
                &["--nproc-per-node", "--nproc_per_node"],
                "4",
                "PET_NPROC_PER_NODE",
                |a| a.nproc_per_node.clone(),
            ),
            (
                &["--rdzv-backend", "--rdzv_backend"],
                "c10d",
                "PET_RDZV_BACKEND",
                |a| a.rdzv_backend.clone(),
            ),
            (
                &["--rdzv-endpoint", "--rdzv_endpoint"],
                "h:1",
                "PET_RDZV_ENDPOINT",
                |a| a.rdzv_endpoint.clone(),
            ),
            (&["--rdzv-id", "--rdzv_id"], "job", "PET_RDZV_ID", |a| {
                a.rdzv_id.clone()
            }),
            (
                &["--rdzv-conf", "--rdzv_conf"],
                "a=1",
                "PET_RDZV_CONF",
                |a| a.rdzv_conf.clone(),
            ),
            (
                &["--max-restarts", "--max_restarts"],
                "3",
                "PET_MAX_RESTARTS",
                |a| a.max_restarts.to_string(),
            ),
            (
                &["--monitor-interval", "--monitor_interval"],
                "0.5",
                "PET_MONITOR_INTERVAL",
                |a| a.monitor_interval.to_string(),
            ),
            (
                &["--start-method", "--start_method"],
                "fork",
                "PET_START_METHOD",
                |a| a.start_method.clone(),
            ),
            (
                &["--event-log-handler", "--event_log_handler"],
                "console",
                "PET_EVENT_LOG_HANDLER",
                |a| a.event_log_handler.clone(),
            ),
            (&["--role"], "trainer", "PET_ROLE", |a| a.role.clone()),
            (&["--log-dir", "--log_dir"], "/tmp/l", "PET_LOG_DIR", |a| {
                a.log_dir.clone().unwrap()
            }),
            (&["-r", "--redirects"], "3", "PET_REDIRECTS", |a| {
                a.redirects.clone()
            }),
            (&["-t", "--tee"], "0:1,1:2", "PET_TEE", |a| a.tee.clone()),
            (
                &["--log-line-prefix-template", "--log_line_prefix_template"],
                "[${rank}]",
                "PET_LOG_LINE_PREFIX_TEMPLATE",
                |a| a.log_line_prefix_template.clone(),
            ),
            (
                &["--local-ranks-filter", "--local_ranks_filter"],
                "0,2",
                "PET_LOCAL_RANKS_FILTER",
                |a| a.local_ranks_filter.clone(),
            ),
            (
                &["--duplicate-stdout-filters", "--duplicate_stdout_filters"],
                "a,,b,c",
                "PET_DUPLICATE_STDOUT_FILTERS",
                |a| a.duplicate_stdout_filters.join("|"),
            ),
            (
                &["--duplicate-stderr-filters", "--duplicate_stderr_filters"],
                "x",
                "PET_DUPLICATE_STDERR_FILTERS",
                |a| a.duplicate_stderr_filters.join("|"),
            ),
            (&["--node-rank", "--node_rank"], "1", "PET_NODE_RANK", |a| {
                a.node_rank.to_string()
            }),
            (
                &["--master-addr", "--master_addr"],
                "10.0.0.1",
                "PET_MASTER_ADDR",
                |a| a.master_addr.clone(),
            ),
            (
                &["--master-port", "--master_port"],
                "29555",
                "PET_MASTER_PORT",
                |a| a.master_port.unwrap().to_string(),
            ),
            (
                &["--local-addr", "--local_addr"],
                "node1",
                "PET_LOCAL_ADDR",
                |a| a.local_addr.clone().unwrap(),
            ),
            (
                &["--signals-to-handle", "--signals_to_handle"],
                "SIGTERM",
                "PET_SIGNALS_TO_HANDLE",
                |a| a.signals_to_handle.clone(),
            ),
            (
                &["--shutdown-timeout", "--shutdown_timeout"],
                "7",
                "PET_SHUTDOWN_TIMEOUT",
                |a| a.shutdown_timeout.unwrap().to_string(),
            ),
            (
                &["--report-json", "--report_json"],
                "/tmp/r.json",
                "PET_REPORT_JSON",
                |a| a.report_json.clone().unwrap().display().to_string(),
            ),
            (
                &["--exit-barrier-timeout", "--exit_barrier_timeout"],
                "12.5",
                "PET_EXIT_BARRIER_TIMEOUT",
                |a| a.exit_barrier_timeout.to_string(),
            ),
        ];
        for (names, value, pet, get) in table {
            let expected = if *pet == "PET_DUPLICATE_STDOUT_FILTERS" {
                "a,b|c".to_string()
            } else {
                value.to_string()
            };
            for name in *names {
                let a = parse(&[name, value, "t.py"]).unwrap();
                assert_eq!(get(&a), expected, "{name} {value}");
                let joined = format!("{name}={value}");
                let a = parse(&[&joined, "t.py"]).unwrap();
                assert_eq!(get(&a), expected, "{joined}");
            }
            let a = parse_env(&["t.py"], &[(pet, value)]).unwrap();
            assert_eq!(get(&a), expected, "{pet}");
            // The command line wins over PET_*.
            let a = parse_env(&[names[0], value, "t.py"], &[(pet, "99")]).unwrap();
            assert_eq!(get(&a), expected, "{} over {pet}", names[0]);
        }
    }

    #[test]
    fn every_boolean_flag_in_every_spelling_and_via_pet() {
        type Get = fn(&LaunchArgs) -> bool;
        let table: &[(&[&str], &str, Get)] = &[
            (&["--standalone"], "PET_STANDALONE", |a| a.standalone),
            (&["-m", "--module"], "PET_MODULE", |a| a.module),
            (&["--no-python", "--no_python"], "PET_NO_PYTHON", |a| {
                a.no_python
            }),
            (&["--run-path", "--run_path"], "PET_RUN_PATH", |a| {
                a.run_path
            }),
            (
                &["--virtual-local-rank", "--virtual_local_rank"],
                "PET_VIRTUAL_LOCAL_RANK",
                |a| a.virtual_local_rank,
            ),
        ];
        for (names, pet, get) in table {
            for name in *names {
                assert!(get(&parse(&[name, "t.py"]).unwrap()), "{name}");
                // PET_X=0 does not turn a command-line flag off (check_env).
                assert!(get(&parse_env(&[name, "t.py"], &[(pet, "0")]).unwrap()));
            }
            assert!(!get(&parse(&["t.py"]).unwrap()));
            for (text, on) in [("1", true), ("0", false), (" 2 ", true), ("-1", true)] {
                assert_eq!(
                    get(&parse_env(&["t.py"], &[(pet, text)]).unwrap()),
                    on,
                    "{pet}={text}"
                );
            }
            if *pet == "PET_STANDALONE" {
                // As PyTorchJob sets it: empty means on (issue 25.1).
                assert!(get(&parse_env(&["t.py"], &[(pet, "")]).unwrap()), "{pet}=");
            } else {
                assert!(parse_env(&["t.py"], &[(pet, "")]).is_err(), "{pet}=");
            }
            let e = parse_env(&["t.py"], &[(pet, "true")]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{pet}=\"true\": a boolean flag read from the environment must be an integer (0 = off, non-zero = on)")
            );
            let e = parse(&[&format!("{}=1", names[names.len() - 1]), "t.py"]).unwrap_err();
            assert!(
                e.to_string().contains("ignored explicit argument '1'"),
                "{e}"
            );
        }
    }

    #[test]
    fn abbreviations_follow_argparse() {
        assert_eq!(
            parse(&["--nproc-per", "3", "t.py"]).unwrap().nproc_per_node,
            "3"
        );
        assert_eq!(
            parse(&["--nproc_per=3", "t.py"]).unwrap().nproc_per_node,
            "3"
        );
        assert_eq!(parse(&["--re", "3", "t.py"]).unwrap().redirects, "3");
        assert!(parse(&["--mod", "t.py"]).unwrap().module);
        assert_eq!(
            err(&["--nproc", "2", "t.py"]),
            "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
        );
        assert_eq!(
            err(&["--st", "t.py"]),
            "ambiguous option: --st could match --standalone, --start-method, --start_method"
        );
        // rdrun's own flags never take part in abbreviations.
        assert_eq!(
            err(&["--report", "x", "t.py"]),
            "unrecognized arguments: --report"
        );
        assert!(matches!(
            parse_from(&sv(&["--he"]), &|_| None),
            Ok(Invocation::Help)
        ));
    }

    #[test]
    fn short_options() {
        assert_eq!(parse(&["-r3", "t.py"]).unwrap().redirects, "3");
        assert_eq!(parse(&["-r=3", "t.py"]).unwrap().redirects, "3");
        assert_eq!(parse(&["-t", "1", "t.py"]).unwrap().tee, "1");
        let a = parse(&["-mr3", "t.py"]).unwrap();
        assert!(a.module);
        assert_eq!(a.redirects, "3");
        assert_eq!(
            err(&["-mx", "t.py"]),
            "argument -m/--module: ignored explicit argument 'x'"
        );
        assert!(matches!(
            parse_from(&sv(&["-mh"]), &|_| None),
            Ok(Invocation::Help)
        ));
        assert!(matches!(
            parse_from(&sv(&["-h", "--bogus"]), &|_| None),
            Ok(Invocation::Help)
        ));
        assert!(matches!(
            parse_from(&sv(&["-hr3"]), &|_| None),
            Ok(Invocation::Help)
        ));
        assert_eq!(
            err(&["-m=", "t.py"]),
            "argument -m/--module: ignored explicit argument ''"
        );
        assert_eq!(
            err(&["--help=1"]),
            "argument -h/--help: ignored explicit argument '1'"
        );
        assert_eq!(
            err(&["-hx"]),
            "argument -h/--help: ignored explicit argument 'x'"
        );
    }

    #[test]
    fn remainder_and_double_dash_rules() {
        let cases: &[(&[&str], &str, &[&str])] = &[
            (
                &["t.py", "--nproc-per-node", "5"],
                "t.py",
                &["--nproc-per-node", "5"],
            ),
            (&["--", "t.py", "a"], "t.py", &["a"]),
            (&["t.py", "--", "x"], "t.py", &["x"]),
            (&["t.py", "--", "--", "x"], "t.py", &["--", "x"]),
            (&["t.py", "a", "--", "b"], "t.py", &["a", "--", "b"]),
            (&["--", "--nnodes", "1", "t.py"], "--nnodes", &["1", "t.py"]),
            (&["--", "t.py", "--", "x"], "t.py", &["--", "x"]),
            (&["--nnodes", "2", "-", "x"], "-", &["x"]),
            (&["t.py", "-h"], "t.py", &["-h"]),
            // argparse would reject this ambiguous prefix even after the script; rdrun does not.
            (&["t.py", "--nproc", "2"], "t.py", &["--nproc", "2"]),
            (
                &["t.py", "${local_rank}", "$$x"],
                "t.py",
                &["${local_rank}", "$$x"],
            ),
        ];
        for (argv, script, rest) in cases {
            let a = parse(argv).unwrap();
            assert_eq!(a.training_script, *script, "{argv:?}");
            let rest: Vec<OsString> = rest.iter().map(OsString::from).collect();
            assert_eq!(a.training_script_args, rest, "{argv:?}");
        }
    }

    #[test]
    fn script_and_arguments_keep_their_bytes() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let bytes = |b: &[u8]| OsString::from_vec(b.to_vec());
        let argv = vec![
            OsString::from("--nproc-per-node"),
            OsString::from("2"),
            bytes(b"s\xff.py"),
            bytes(b"--lr=\xfe\x80"),
            OsString::from("${local_rank}"),
        ];
        let Ok(Invocation::Launch(a)) = parse_from(&argv, &|_| None) else {
            panic!("parses");
        };
        assert_eq!(a.training_script.as_bytes(), b"s\xff.py");
        assert_eq!(a.training_script_args, argv[3..].to_vec());
        // The same after `--`.
        let argv = vec![OsString::from("--"), bytes(b"t.py"), bytes(b"\xff")];
        let Ok(Invocation::Launch(a)) = parse_from(&argv, &|_| None) else {
            panic!("parses");
        };
        assert_eq!(a.training_script_args, vec![bytes(b"\xff")]);
        // A flag value must be text: rdrun would otherwise use a lossy copy.
        for argv in [
            vec![
                OsString::from("--role"),
                bytes(b"r\xff"),
                OsString::from("t.py"),
            ],
            vec![bytes(b"--role=r\xff"), OsString::from("t.py")],
        ] {
            let e = parse_from(&argv, &|_| None).unwrap_err();
            assert_eq!(
                e.to_string(),
                "argument --role: the value \"r\u{fffd}\" is not valid UTF-8"
            );
        }
    }

    #[test]
    fn values_that_look_like_flags() {
        assert_eq!(
            parse(&["--max-restarts", "-1", "t.py"])
                .unwrap()
                .max_restarts,
            -1
        );
        assert_eq!(parse(&["-r", "-1", "t.py"]).unwrap().redirects, "-1");
        assert_eq!(
            parse(&["--rdzv-conf", "-a b", "t.py"]).unwrap().rdzv_conf,
            "-a b"
        );
        assert_eq!(parse(&["--rdzv-conf=", "t.py"]).unwrap().rdzv_conf, "");
        assert_eq!(
            parse(&["--log-dir", "-", "t.py"])
                .unwrap()
                .log_dir
                .as_deref(),
            Some("-")
        );
        assert_eq!(
            err(&["--max-restarts", "-x", "t.py"]),
            "argument --max-restarts/--max_restarts: expected one argument"
        );
        assert_eq!(
            err(&["-t", "--", "t.py"]),
            "argument -t/--tee: expected one argument"
        );
        assert_eq!(
            err(&["--nnodes"]),
            "argument --nnodes: expected one argument"
        );
        // Last occurrence wins, as argparse's store.
        assert_eq!(
            parse(&["--nnodes", "1", "--nnodes", "2", "t.py"])
                .unwrap()
                .nnodes,
            "2"
        );
    }

    #[test]
    fn usage_errors_name_the_flag_and_value() {
        assert_eq!(
            err(&[]),
            "the following arguments are required: training_script, training_script_args"
        );
        assert_eq!(
            err(&["-x"]),
            "the following arguments are required: training_script, training_script_args"
        );
        assert_eq!(err(&["--foo", "t.py"]), "unrecognized arguments: --foo");
        assert_eq!(
            err(&["--max-restarts", "abc", "t.py"]),
            "argument --max-restarts/--max_restarts: invalid int value: 'abc'"
        );
        assert_eq!(
            err(&["--monitor-interval", "fast", "t.py"]),
            "argument --monitor-interval/--monitor_interval: invalid float value: 'fast'"
        );
        assert_eq!(
            err(&["--start-method", "x", "t.py"]),
            "argument --start-method/--start_method: invalid choice: 'x' (choose from 'spawn', 'fork', 'forkserver')"
        );
        assert_eq!(
            parse_env(&["t.py"], &[("PET_MAX_RESTARTS", "two")])
                .unwrap_err()
                .to_string(),
            "argument --max-restarts/--max_restarts: invalid int value: 'two' (from PET_MAX_RESTARTS)"
        );
        // Choices are not checked for PET values (argparse), and start-method is ignored anyway.
        assert_eq!(
            parse_env(&["t.py"], &[("PET_START_METHOD", "x")])
                .unwrap()
                .start_method,
            "x"
        );
    }

    #[test]
    fn rejected_flags() {
        assert_eq!(
            err(&["--logs-specs", "x", "t.py"]),
            "--logs-specs is not supported by rdrun: it loads a Python plugin (torchrun.logs_specs entry point)"
        );
        assert_eq!(
            parse_env(&["--numa_binding", "node", "t.py"], &[])
                .unwrap()
                .numa_binding
                .as_deref(),
            Some("node")
        );
        assert!(err(&["--numa-binding", "node", "--cpu-binding", "t.py"]).contains("choose one"));
        assert!(err(&["--numa-binding", "bogus", "t.py"]).contains("invalid choice"));
        assert_eq!(
            err(&["--event-log-handler", "dynamic_rendezvous", "t.py"]),
            "--event-log-handler dynamic_rendezvous is not supported by rdrun: only the null and console handlers exist outside Python"
        );
        assert!(parse_env(&["t.py"], &[("PET_EVENT_LOG_HANDLER", "x")]).is_err());
        // Printed at once, even without a script and before later bad words (argparse action).
        for argv in [
            &["--print-completion", "bash"][..],
            &["--print_completion=zsh", "--bogus"],
        ] {
            match parse_from(&sv(argv), &|_| None) {
                Ok(Invocation::Print(text)) => {
                    assert!(text.contains("--nproc-per-node"), "{argv:?}")
                }
                other => panic!("{argv:?}: {other:?}"),
            }
        }
        assert!(err(&["--print-completion", "ksh"]).contains("invalid choice: 'ksh'"));
        assert!(
            matches!(parse_from(&sv(&["--print-man"]), &|_| None), Ok(Invocation::Print(t)) if t.starts_with(".TH RDRUN 1"))
        );
        assert!(err(&["--print-man=1"]).contains("ignored explicit argument"));
        // No PET fallback for these (as torchrun).
        assert!(parse_env(
            &["t.py"],
            &[("PET_LOGS_SPECS", "x"), ("PET_NUMA_BINDING", "node")]
        )
        .is_ok());
    }

    #[test]
    fn python_number_text() {
        assert_eq!(python_int(" 1_0 "), Some(10));
        assert_eq!(python_int("+3"), Some(3));
        assert_eq!(python_int("-3"), Some(-3));
        for bad in ["", "1.0", "_1", "1__0", "0x10", "abc", "1_"] {
            assert_eq!(python_int(bad), None, "{bad:?}");
        }
        assert_eq!(python_float("1e-3"), Some(0.001));
        assert_eq!(python_float(" 2 "), Some(2.0));
        assert!(python_float("inf").unwrap().is_infinite());
        assert_eq!(python_float("x"), None);
    }

    #[test]
    fn comma_lists() {
        assert_eq!(comma_separated_list("a,b"), sv(&["a", "b"]));
        assert_eq!(comma_separated_list("a,,b"), sv(&["a,b"]));
        assert_eq!(comma_separated_list(""), sv(&[""]));
    }

    #[test]
    fn cluster_flags() {
        let a = parse(&["t.py"]).unwrap();
        assert_eq!(
            (a.cluster, a.hostfile, a.dry_run, a.print_topology),
            (None, None, false, None)
        );
        assert!(a.cli_given.is_empty());
        let a = parse(&[
            "--cluster",
            "slurm",
            "--hostfile",
            "h.txt",
            "--dry-run",
            "--print-topology",
            "--nnodes",
            "2",
            "t.py",
        ])
        .unwrap();
        assert_eq!(a.cluster.as_deref(), Some("slurm"));
        assert_eq!(a.hostfile.as_deref(), Some("h.txt"));
        assert!(a.dry_run);
        assert_eq!(a.print_topology.as_deref(), Some("text"));
        let given: Vec<&str> = a.cli_given.iter().copied().collect();
        assert_eq!(
            given,
            ["cluster", "dry_run", "hostfile", "nnodes", "print_topology"]
        );
        let a = parse(&["--print-topology=json", "t.py"]).unwrap();
        assert_eq!(a.print_topology.as_deref(), Some("json"));
        assert_eq!(
            err(&["--print-topology=yaml", "t.py"]),
            "argument --print-topology/--print_topology: invalid choice: 'yaml' (choose from 'text', 'json')"
        );
        // `--print-topology json` is the flag and then the script `json`.
        let a = parse(&["--print-topology", "json"]).unwrap();
        assert_eq!(a.training_script, "json");
        // PET_* values are not "given": the cluster layer names them itself.
        let a = parse_env(&["t.py"], &[("PET_NNODES", "2")]).unwrap();
        assert!(a.cli_given.is_empty());
        // rdrun's own flags take part in no abbreviation.
        assert_eq!(err(&["--dry", "t.py"]), "unrecognized arguments: --dry");
    }

    #[test]
    fn help_lists_every_flag_with_default() {
        let h = help_text();
        for o in OPTIONS {
            for n in o.names {
                assert!(h.contains(n), "{n} missing from help");
            }
            if !matches!(o.kind, Kind::Help | Kind::Completion) {
                assert!(h.contains("default: "), "{}", o.dest);
            }
        }
        assert!(h.contains("[default: 1:1; env: PET_NNODES]"));
        assert!(h.contains("[default: SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2;"));
        // Stale text (issue 9/10): multi-node has been supported for a while.
        assert!(!h.contains("one node only"), "{h}");
        assert!(h.contains("a worker that does not handle them dies of them"));
    }
}
