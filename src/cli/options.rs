//! The option table: every flag rdrun accepts, with its spellings, kind, `PET_*` default, help
//! and `--help` section, in torchrun's registration order. The parser, `--help`
//! (`help.rs`), the completion scripts and the man page ([`flag_table`]) are all generated from
//! [`OPTIONS`]: there is no second list.

/// How an option consumes its value and converts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
    /// `-V`/`--version`: print the version and the git revision, and exit.
    Version,
}

/// The `--help` (and man page) section an option is listed in: torchrun's own flags first,
/// then rdrun's by topic, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    Torchrun,
    Cluster,
    Recovery,
    Health,
    Hangs,
    Console,
    Observability,
    About,
}

impl Section {
    /// Every section, in `--help` order.
    pub const ALL: &'static [Section] = &[
        Section::Torchrun,
        Section::Cluster,
        Section::Recovery,
        Section::Health,
        Section::Hangs,
        Section::Console,
        Section::Observability,
        Section::About,
    ];

    /// The section's heading.
    pub fn title(self) -> &'static str {
        match self {
            Section::Torchrun => "torchrun options",
            Section::Cluster => "rdrun: cluster and topology",
            Section::Recovery => "rdrun: recovery and warm start",
            Section::Health => "rdrun: node health",
            Section::Hangs => "rdrun: hangs",
            Section::Console => "rdrun: console and per-rank control",
            Section::Observability => "rdrun: observability and reports",
            Section::About => "rdrun: version and documentation",
        }
    }
}

/// One option of the table below.
#[derive(Debug)]
pub(super) struct OptSpec {
    /// argparse's dest; also the suffix of the `PET_*` variable.
    pub(super) dest: &'static str,
    pub(super) names: &'static [&'static str],
    pub(super) kind: Kind,
    /// Whether `PET_<DEST>` supplies the default.
    pub(super) pet: bool,
    /// rdrun's own flags take part in no abbreviation (see the module docs).
    pub(super) abbreviable: bool,
    /// Default as shown in `--help`.
    pub(super) default: &'static str,
    pub(super) help: &'static str,
    /// The closed set of words a [`Kind::Str`] option accepts, for the completion scripts and
    /// the man page. The parser passes the text through unchecked (torchrun's argparse does, and
    /// `config` gives the precise error); `config`'s tests check each word resolves.
    pub(super) values: &'static [&'static str],
    /// Where `--help` and the man page list it.
    pub(super) section: Section,
    /// Given several times, the values are joined with `;` (`--chaos`), not the last kept.
    pub(super) repeat: bool,
}

pub(super) const fn opt(
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
        section: Section::Torchrun,
        repeat: false,
    }
}

pub(super) const START_METHODS: &[&str] = &["spawn", "fork", "forkserver"];
pub(super) const NUMA_MODES: &[&str] = &["node", "socket", "exclusive", "core-complex"];
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
/// `--output`.
pub const OUTPUT_MODES: &[&str] = &["all", "collapse"];
/// Values of `--progress`.
pub const PROGRESS_MODES: &[&str] = &["auto", "one", "all"];
/// `--health-check`.
pub const HEALTH_MODES: &[&str] = &["off", "warn", "on"];
/// `--network-check`.
pub const NETWORK_CHECK_MODES: &[&str] = &["off", "on"];
/// `--warm-start`.
pub const WARM_MODES: &[&str] = &["off", "on", "auto"];
/// `--hang-detect`.
pub const HANG_MODES: &[&str] = &["off", "observe", "kill"];

/// Every option, in torchrun's registration order (which is the order argparse lists ambiguous
/// matches in), followed by rdrun's own.
pub(super) static OPTIONS: &[OptSpec] = &[
    OptSpec {
        pet: false,
        ..opt("help", &["-h", "--help"], Kind::Help, "", "show this help message and exit")
    },
    OptSpec {
        // Not abbreviable: `--v` stays `--virtual-local-rank`, as in torchrun.
        abbreviable: false,
        pet: false,
        section: Section::About,
        ..opt("version", &["-V", "--version"], Kind::Version, "",
            "rdrun: print rdrun's version and the git revision it was built from, and exit.")
    },
    opt("nnodes", &["--nnodes"], Kind::Str, "1:1",
        "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>; more than one node runs the --rdzv-backend rendezvous (static: node ranks; c10d: elastic)."),
    opt("nproc_per_node", &["--nproc-per-node", "--nproc_per_node"], Kind::Str, "1",
        "Number of workers per node; supported values: [auto, cpu, gpu, int] (int: at most 4096)."),
    OptSpec {
        values: RDZV_BACKENDS,
        ..opt("rdzv_backend", &["--rdzv-backend", "--rdzv_backend"], Kind::Str, "static",
            "Rendezvous backend: static, c10d, etcd-v3 (alias etcd; in the default build, not in one built with --no-default-features).")
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
        section: Section::Cluster,
        ..opt("cpu_binding", &["--cpu-binding", "--cpu_binding"], Kind::Flag, "off",
            "rdrun: give each local rank its own share of rdrun's CPU affinity mask (whole physical cores when there are enough), for CPU-only jobs; not with --numa-binding.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("omp_num_threads", &["--omp-num-threads", "--omp_num_threads"], Kind::Str, "none",
            "rdrun: OMP_NUM_THREADS for every worker, over any inherited value: cpus (the number of CPUs the worker is bound to; unbound: the affinity mask divided by the workers) or a positive integer. Without it torchrun's rule holds (1 when unset and nproc > 1).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::About,
        ..opt("print_man", &["--print-man"], Kind::Man, "",
            "rdrun: print rdrun's man page (roff, from this option table) to stdout and exit.")
    },
    OptSpec {
        abbreviable: false,
        section: Section::Observability,
        ..opt("report_json", &["--report-json", "--report_json"], Kind::Str, "none",
            "rdrun: write the run's outcome (root cause, failures, exit code) as JSON to this path.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Observability,
        ..opt("report_junit", &["--report-junit", "--report_junit"], Kind::Str, "none",
            "rdrun: write the run's outcome as JUnit XML to this path (one test case per rank of this node, a failure with its traceback; written on success too), for CI systems that read JUnit. Under GitHub Actions (GITHUB_ACTIONS=true) a failed run also annotates the failing rank's innermost frame and writes the report to $GITHUB_STEP_SUMMARY.")
    },
    OptSpec {
        abbreviable: false,
        section: Section::Cluster,
        ..opt("exit_barrier_timeout", &["--exit-barrier-timeout", "--exit_barrier_timeout"], Kind::Float, "300",
            "rdrun: seconds to wait for the other nodes after local success (multi-node).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: LEFTOVER_POLICIES,
        section: Section::Recovery,
        ..opt("leftovers", &["--leftovers"], Kind::Str, "kill",
            "rdrun: processes the workers leave behind after a successful run: kill (stop them, each named at WARN), wait (until they exit), leave. Else RDRUN_LEFTOVERS.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: CLUSTER_CHOICES,
        section: Section::Cluster,
        ..opt("cluster", &["--cluster"], Kind::Str, "auto",
            "rdrun: scheduler detection: auto (read Slurm, Kubernetes, MPI, LSF, hostfile environments), none (a local run as torchrun), or force one of slurm, k8s, mpi, lsf, hostfile. Else RDRUN_CLUSTER.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("hostfile", &["--hostfile"], Kind::Str, "none",
            "rdrun: a hostfile (DeepSpeed 'host slots=N' or Open MPI dialect); this node's rank is its host's position. Else RDRUN_HOSTFILE or OMPI_MCA_orte_default_hostfile.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("include", &["--include"], Kind::Str, "none",
            "rdrun: keep only these hostfile hosts/slots, DeepSpeed's NODE_SPEC[@NODE_SPEC...] with NODE_SPEC = NAME[:SLOT[,SLOT...]] (slots are device indices).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("exclude", &["--exclude"], Kind::Str, "none",
            "rdrun: drop these hostfile hosts/slots (same syntax as --include; not both).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("nested", &["--nested"], Kind::Flag, "off",
            "rdrun: allow this launch from inside a torchrun/rdrun worker while a scheduler is detected (it forms a world of its own; refused by default). Else RDRUN_NESTED=1.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("dry_run", &["--dry-run", "--dry_run"], Kind::Flag, "off",
            "rdrun: resolve the configuration, print the topology (where every value came from) and exit 0 without starting anything.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Cluster,
        ..opt("print_topology", &["--print-topology", "--print_topology"], Kind::OptionalChoice(TOPOLOGY_FORMATS), "off",
            "rdrun: as --dry-run; --print-topology=json prints the topology as JSON.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Observability,
        ..opt("events", &["--events"], Kind::Str, "none",
            "rdrun: also write every lifecycle event (spawn, exit, stop, restart, rendezvous, ...) as one JSON object per line to this file, or to stderr with '-' (with --log-dir they always go to <run dir>/events.jsonl).")
    },
    OptSpec {
        abbreviable: false,
        values: WARM_MODES,
        section: Section::Recovery,
        ..opt("warm_start", &["--warm-start", "--warm_start"], Kind::Str, "auto",
            "rdrun: start Python workers by forking them from a per-node template interpreter: auto (the default: the template learns what the workers import and imports it once for the next forks; reasons to spawn cold said at INFO), on (it imports torch and --preload before the first fork), off (every worker cold, as torchrun). Else RDRUN_WARM_START.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        repeat: true,
        section: Section::Recovery,
        ..opt("chaos", &["--chaos"], Kind::Str, "none",
            "rdrun: inject failures into the job on a seeded schedule and measure their detection and recovery (repeatable, or ';'-separated): KIND:WHEN[,WHERE], KIND kill, hang, slow or node-loss; WHEN after=, every= or mtbf=DURATION, at-attempt=N, count=N; WHERE rank=N|random, node=N|random; seed=N. Injected failures never count toward --max-same-failures or --max-node-failures; a fault the job does not survive fails the run. Else RDRUN_CHAOS (never from a scheduler). See docs/chaos.md.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Recovery,
        ..opt("chaos_progress", &["--chaos-progress", "--chaos_progress"], Kind::Str, "none",
            "rdrun: with --chaos, a regular expression that matches the workers' progress lines; its first group, a number (e.g. 'step (\\d+)'), gives the work lost to each fault. Else RDRUN_CHAOS_PROGRESS.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Recovery,
        ..opt("preload", &["--preload"], Kind::List, "torch (when importable)",
            "rdrun: modules the warm-start template imports besides torch (comma-separated); one that fails to import turns warm start off for the run. Else RDRUN_PRELOAD.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Observability,
        ..opt("metrics_addr", &["--metrics-addr", "--metrics_addr"], Kind::Str, "none",
            "rdrun: serve Prometheus metrics at http://HOST:PORT/metrics and the health state at /healthz (PORT alone: loopback). Else RDRUN_METRICS_ADDR.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Recovery,
        ..opt("max_same_failures", &["--max-same-failures", "--max_same_failures"], Kind::Int, "2",
            "rdrun: stop restarting when the same failure (exception type and innermost frame, else exit status) ended this many attempts in a row, restarts left or not; exit 93 (do not requeue). 0: never.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: HEALTH_MODES,
        section: Section::Health,
        ..opt("health_check", &["--health-check", "--health_check"], Kind::Str, "warn",
            "rdrun: health checks before this node joins (interpreter, disk, /dev/shm, memory, open files, GPUs, NICs, --health-check-cmd): off, warn (report only), on (a static job fails fast with exit 75, bad node; an elastic node retries after a back-off).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("health_check_cmd", &["--health-check-cmd", "--health_check_cmd"], Kind::Str, "none",
            "rdrun: the site's own node check, run with sh -c before the node joins: a non-zero exit or a timeout makes the node unhealthy; its output is shown.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("health_check_timeout", &["--health-check-timeout", "--health_check_timeout"], Kind::Float, "30",
            "rdrun: seconds each health check that runs a program may take (a check past it is killed and counts as failed).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("checkpoint_dir", &["--checkpoint-dir", "--checkpoint_dir"], Kind::Str, "none",
            "rdrun: the directory the job writes its checkpoints to: the health check requires 1 GiB free on its file system (as 100 MiB for --log-dir).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("bad_nodes_file", &["--bad-nodes-file", "--bad_nodes_file"], Kind::Str, "none",
            "rdrun: a node that ends as a bad node (a failed health check under --health-check on, or listed by --exclude-nodes-from) appends its host name to this file, one per line (a Slurm exclude list).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("exclude_nodes_from", &["--exclude-nodes-from", "--exclude_nodes_from"], Kind::Str, "none",
            "rdrun: host names (or Slurm hostlists) one per line, e.g. an earlier job's --bad-nodes-file: a listed node does not join (exit 75, bad node); a missing file lists none.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: NETWORK_CHECK_MODES,
        section: Section::Health,
        ..opt("network_check", &["--network-check", "--network_check"], Kind::Str, "off (on with --health-check on)",
            "rdrun: after each multi-node round, nodes pair up for a short TCP exchange (latency and bandwidth, about a second): a node far below the median is named; an elastic job with spare nodes (MAX above MIN) leaves it out of the next round.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("network_check_threshold", &["--network-check-threshold", "--network_check_threshold"], Kind::Float, "0.25",
            "rdrun: a node is slow when its best bandwidth is under this fraction of the median node's, or its latency over the median's divided by it (0 < F < 1).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Health,
        ..opt("max_node_failures", &["--max-node-failures", "--max_node_failures"], Kind::Int, "2",
            "rdrun: a node whose workers failed this many times in the run leaves an elastic job while spares exist (MAX above MIN): exit 75, bad node, remembered in --bad-nodes-file. 0: never.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("wrap", &["--wrap"], Kind::Str, "none",
            "rdrun: run the chosen ranks' command under this wrapper, split as a shell would ('nsys profile -o trace_%r', 'strace -f -o st.%r'); %r, %l, %n become the rank, local rank and node rank. The wrapper's exit status is the rank's.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("wrap_ranks", &["--wrap-ranks", "--wrap_ranks"], Kind::Str, "all",
            "rdrun: the global ranks --wrap applies to, comma-separated, ranges allowed (0,2 or 0-3,8).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("stdin", &["--stdin"], Kind::Str, "all",
            "rdrun: which worker reads rdrun's stdin: a global rank (the others get /dev/null; e.g. for pdb on that rank), none, or all (torchrun's behaviour).")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: OUTPUT_MODES,
        section: Section::Console,
        ..opt("output", &["--output"], Kind::Str, "all",
            "rdrun: console output of the ranks: all (every rank's line), or collapse (a line several ranks print identically within --output-window is shown once, prefixed with its ranks like [0-7]). Log files are unaffected.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("output_window", &["--output-window", "--output_window"], Kind::Str, "0.5",
            "rdrun: with --output collapse, how long a line waits for the same line of other ranks (seconds, or 500ms); at most 10.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        values: PROGRESS_MODES,
        section: Section::Console,
        ..opt("progress", &["--progress"], Kind::Str, "auto",
            "rdrun: carriage-return progress bars (tqdm) of several ranks: one (one line: the slowest rank's bar, its ranks and the spread; live on a terminal, at most one line per --progress-interval on a pipe), all (every rank's bar as written), auto (one on a terminal with more than one rank, else all). Log files are unaffected.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("progress_interval", &["--progress-interval", "--progress_interval"], Kind::Str, "1",
            "rdrun: with --progress one on a pipe, at most one progress line per this many seconds (or 500ms); at most 600.")
    },
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Console,
        ..opt("debug_rank", &["--debug-rank", "--debug_rank"], Kind::Str, "none",
            "rdrun: this global rank starts under 'python -m debugpy --listen 127.0.0.1:PORT --wait-for-client' (one line says where to attach; without debugpy it starts normally and rdrun prints how to attach py-spy or gdb); the hang detector does not count its pauses; it reads rdrun's stdin unless --stdin is given.")
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

pub(super) const TOPOLOGY_FORMATS: &[&str] = &["text", "json"];

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
pub(super) const fn hang_opt(
    dest: &'static str,
    names: &'static [&'static str],
    default: &'static str,
    help: &'static str,
) -> OptSpec {
    OptSpec {
        abbreviable: false,
        pet: false,
        section: Section::Hangs,
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

/// One option of the parser's table, for [`super::completion`] (scripts and man page come from
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
    /// Where `--help` lists it (the man page's subsections).
    pub section: Section,
}

/// The option table, in `--help` order.
pub fn flag_table() -> Vec<FlagView> {
    OPTIONS
        .iter()
        .map(|o| {
            let metavar = match o.dest {
                "log_dir" => "DIR",
                "report_json" | "report_junit" | "hostfile" | "py_spy" | "events" => "PATH",
                "health_check_cmd" => "PROG",
                "bad_nodes_file" | "exclude_nodes_from" => "PATH",
                _ => "VALUE",
            };
            let value = match o.kind {
                Kind::Flag | Kind::Help | Kind::Man | Kind::Version => FlagValue::None,
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
                default: if o.kind.prints_and_exits() {
                    ""
                } else {
                    o.default
                },
                env: o
                    .pet
                    .then(|| format!("PET_{}", o.dest.to_ascii_uppercase())),
                section: o.section,
            }
        })
        .collect()
}

impl Kind {
    /// `-h`, `--print-completion`, `--print-man`, `--version`: print something and exit; no
    /// default to show.
    pub(super) fn prints_and_exits(self) -> bool {
        matches!(
            self,
            Kind::Help | Kind::Completion | Kind::Man | Kind::Version
        )
    }
}
