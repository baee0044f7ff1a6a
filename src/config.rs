//! Resolution of parsed arguments ([`crate::cli::LaunchArgs`]) into a [`LaunchConfig`].
//!
//! Parsing (what the user typed) lives in `cli.rs`; this file decides what it means on this
//! machine: nnodes `N`/`MIN:MAX`, nproc `cpu`/`gpu`/`auto`/N, standalone and auto-standalone,
//! rendezvous endpoint and conf, the worker command, log and tee specs, signals and timeouts.
//! The supervisor consumes a `LaunchConfig` and never looks at raw arguments.
//!
//! The types below are the contract between `cli`/`config` and `supervisor`. The pure helpers
//! the supervisor calls per worker also live here: [`substitute_local_rank`],
//! [`should_set_omp_num_threads`], [`virtual_local_rank_devices`], [`signal_names`].
//!
//! Machine facts (CPU affinity, GPUs, files, randomness) come through the [`Host`] trait so that
//! every decision is testable; [`resolve`] uses the real machine.

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
    /// rdrun's `--exit-barrier-timeout` (multi-node; default 300 s as torchrun).
    pub exit_barrier_timeout: Duration,
}

// ---------------------------------------------------------------------------------------------
// Resolution.

use std::path::Path;

use crate::cli::{python_int, EnvFn, LaunchArgs};

/// Default stop grace when neither `--shutdown-timeout` nor TORCH_ELASTIC_SHUTDOWN_TIMEOUT is set.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// torchrun's `master_port` default for the static backend.
pub const DEFAULT_STATIC_MASTER_PORT: u16 = 29500;
/// Default rendezvous ports when an endpoint has none (c10d; etcd and etcd-v2).
pub const DEFAULT_C10D_PORT: u16 = 29400;
pub const DEFAULT_ETCD_PORT: u16 = 2379;

/// Why a parsed command line cannot be turned into a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A flag value that is wrong whatever the machine: a usage error (exit 2).
    #[error("{flag} '{value}': {reason}")]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
    },
    /// torchrun's own message for this combination.
    #[error("don't use both the '--no-python' flag and the '--module' flag at the same time")]
    ModuleWithNoPython,
    #[error("--nproc-per-node {value}: {reason}")]
    NoDevices { value: String, reason: String },
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
    #[error(
        "--virtual-local-rank: local_rank {local_rank} exceeds available GPUs in {var}={value}"
    )]
    VirtualDevices {
        local_rank: usize,
        var: &'static str,
        value: String,
    },
}

impl ConfigError {
    /// The process exit status for this error (see docs/compat.md, "exit paths").
    ///
    /// A value that is wrong on any machine is a usage error (2), like argparse's type errors;
    /// what this machine lacks (GPUs, the script, an interpreter) or does not support yet is a
    /// launcher failure (1). torchrun exits 1 for all of these, with a Python traceback.
    pub fn exit_code(&self) -> i32 {
        match self {
            ConfigError::Invalid { .. } | ConfigError::ModuleWithNoPython => crate::exit::USAGE,
            _ => crate::exit::LAUNCHER_FAILURE,
        }
    }
}

fn invalid(flag: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        reason: reason.into(),
    }
}

/// What [`Host::file`] found at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Missing,
    Dir,
    File { executable: bool },
}

/// The machine facts resolution needs; [`RealHost`] in production, a fake in tests.
pub trait Host {
    /// CPUs in this process's affinity mask (torchrun: `os.sched_getaffinity`).
    fn cpu_count(&self) -> usize;
    /// NVIDIA GPUs the driver lists; `None` when there is no NVIDIA driver.
    fn nvidia_gpu_count(&self) -> Option<usize>;
    /// What is at `path` (relative paths against the current directory).
    fn file(&self, path: &Path) -> FileKind;
    /// 16 random bytes for a run id.
    fn random_bytes(&self) -> [u8; 16];
}

/// The real machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl Host for RealHost {
    fn cpu_count(&self) -> usize {
        use nix::sched::{sched_getaffinity, CpuSet};
        use nix::unistd::Pid;
        match sched_getaffinity(Pid::from_raw(0)) {
            Ok(set) => (0..CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count()
                .max(1),
            Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    fn nvidia_gpu_count(&self) -> Option<usize> {
        // The driver lists one directory per GPU here (nvidia kernel module's procfs).
        if let Ok(entries) = std::fs::read_dir("/proc/driver/nvidia/gpus") {
            return Some(entries.filter(Result::is_ok).count());
        }
        nvidia_smi_count()
    }

    fn file(&self, path: &Path) -> FileKind {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(path) {
            Err(_) => FileKind::Missing,
            Ok(m) if m.is_dir() => FileKind::Dir,
            Ok(m) => FileKind::File {
                executable: m.permissions().mode() & 0o111 != 0,
            },
        }
    }

    fn random_bytes(&self) -> [u8; 16] {
        let mut buf = [0u8; 16];
        // SAFETY: `buf` is a valid, writable 16-byte buffer for the duration of the call.
        let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n != buf.len() as isize {
            use std::io::Read;
            let ok = std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut buf))
                .is_ok();
            if !ok {
                // Last resort: time and pid are unique enough for a single-node run id.
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                buf = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
            }
        }
        buf
    }
}

/// `nvidia-smi -L` line count, with a bound so that a wedged driver cannot hang rdrun.
fn nvidia_smi_count() -> Option<usize> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new("nvidia-smi")
        .arg("-L")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                child.stdout.take()?.read_to_string(&mut out).ok()?;
                if !status.success() {
                    return None;
                }
                return Some(out.lines().filter(|l| l.starts_with("GPU ")).count());
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("nvidia-smi -L did not answer within 10 s; assuming no GPUs");
                return None;
            }
        }
    }
}

/// Resolves the parsed command line against this machine and the process environment.
pub fn resolve(args: LaunchArgs, env: EnvFn<'_>) -> Result<LaunchConfig, ConfigError> {
    resolve_with(args, env, &RealHost)
}

/// [`resolve`] with explicit machine facts.
pub fn resolve_with(
    args: LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<LaunchConfig, ConfigError> {
    let nnodes = parse_nnodes(&args.nnodes)?;
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
    let backend = parse_backend(&args.rdzv_backend)?;
    let conf = parse_rdzv_conf(&args.rdzv_conf)?;
    let node_rank = usize::try_from(args.node_rank)
        .map_err(|_| invalid("--node-rank", args.node_rank.to_string(), "must be >= 0"))?;
    let master_port = args
        .master_port
        .map(|p| {
            u16::try_from(p).map_err(|_| {
                invalid(
                    "--master-port",
                    p.to_string(),
                    "must be between 0 and 65535",
                )
            })
        })
        .transpose()?;
    if args.start_method != "spawn" {
        tracing::info!(
            "--start-method {} is ignored: rdrun starts every worker as a new process",
            args.start_method
        );
    }
    if args.run_path && args.module {
        tracing::warn!("--module is ignored with --run-path (as torchrun)");
    }

    // Spec §1.3 step 2: explicit and automatic standalone.
    let standalone = args.standalone
        || (backend == RdzvBackend::Static
            && args.rdzv_endpoint.is_empty()
            && master_port.is_none()
            && nnodes.max == 1);

    let (rdzv, master_addr, master_port) = if standalone {
        let rdzv = RdzvConfig {
            backend: RdzvBackend::C10d,
            endpoint: None,
            run_id: uuid4(host.random_bytes()),
            conf,
        };
        (rdzv, "127.0.0.1".to_string(), master_port)
    } else {
        if backend != RdzvBackend::Static && node_rank != 0 {
            tracing::warn!(
                "node_rank is only used for static rdzv_backend. It will be ignored for rdzv_backend={}.",
                args.rdzv_backend
            );
        }
        if backend != RdzvBackend::Static && args.rdzv_endpoint.is_empty() {
            tracing::warn!(
                "master_addr is only used for static rdzv_backend and when rdzv_endpoint is not specified."
            );
        }
        if backend == RdzvBackend::Static && node_rank >= nnodes.max {
            return Err(invalid(
                "--node-rank",
                node_rank.to_string(),
                format!("must be less than the number of nodes ({})", nnodes.max),
            ));
        }
        let run_id = if args.rdzv_id.is_empty() {
            // torchrun: `str(uuid.uuid4().int)` with a warning.
            let id = u128::from_be_bytes(uuid4_bytes(host.random_bytes())).to_string();
            tracing::warn!("config has no run_id, generated a random run_id: {id}");
            id
        } else {
            args.rdzv_id.clone()
        };
        let from_master = backend == RdzvBackend::Static && args.rdzv_endpoint.is_empty();
        let endpoint_text = if from_master {
            // An IPv6 --master-addr gets brackets, so that its port is never ambiguous.
            let a = args.master_addr.as_str();
            let port = master_port.unwrap_or(DEFAULT_STATIC_MASTER_PORT);
            if a.contains(':') && !a.starts_with('[') {
                format!("[{a}]:{port}")
            } else {
                format!("{a}:{port}")
            }
        } else {
            args.rdzv_endpoint.clone()
        };
        let endpoint = parse_endpoint(&endpoint_text, backend)?;
        // Issue 17.5: port 0 means "pick a free port"; only one node can know which it got.
        if endpoint.port == 0 && nnodes.max > 1 {
            let (flag, value) = if from_master {
                ("--master-port", "0".to_string())
            } else {
                ("--rdzv-endpoint", endpoint_text.clone())
            };
            return Err(invalid(
                flag,
                value,
                "port 0 (pick a free port) works only for one node: the other nodes cannot \
                 learn which port was picked; give a fixed port",
            ));
        }
        let (addr, port) = if backend == RdzvBackend::Static {
            (endpoint.host.clone(), Some(endpoint.port))
        } else {
            (
                args.local_addr
                    .clone()
                    .unwrap_or_else(|| args.master_addr.clone()),
                master_port,
            )
        };
        let rdzv = RdzvConfig {
            backend,
            endpoint: Some(endpoint),
            run_id,
            conf,
        };
        (rdzv, addr, port)
    };

    let log = resolve_logs(&args, env, host)?;
    let signals_to_handle = parse_signals(&args.signals_to_handle);
    let shutdown_timeout = resolve_shutdown_timeout(args.shutdown_timeout, env)?;
    let command = resolve_command(&args, env, host)?;

    let nproc_per_node = resolve_nproc(&args.nproc_per_node, env, host)?;
    if args.virtual_local_rank {
        // Fail before any worker starts, not when the first surplus rank is spawned.
        for local_rank in 0..nproc_per_node {
            virtual_local_rank_devices(
                local_rank,
                env("HIP_VISIBLE_DEVICES").as_deref(),
                env("CUDA_VISIBLE_DEVICES").as_deref(),
            )?;
        }
    }

    Ok(LaunchConfig {
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
        exit_barrier_timeout: Duration::from_secs_f64(args.exit_barrier_timeout),
    })
}

/// `--nnodes`: `N` or `MIN:MAX` with `0 < MIN <= MAX`.
pub fn parse_nnodes(text: &str) -> Result<NodeRange, ConfigError> {
    let bad = |reason: &str| invalid("--nnodes", text, reason);
    let parts: Vec<&str> = text.split(':').collect();
    let num = |s: &str| python_int(s).ok_or_else(|| bad("expected N or MIN:MAX with integers"));
    let (min, max) = match parts.as_slice() {
        [n] => {
            let n = num(n)?;
            (n, n)
        }
        [a, b] => (num(a)?, num(b)?),
        _ => return Err(bad("expected N or MIN:MAX")),
    };
    if !(0 < min && min <= max) {
        return Err(bad("the node counts must satisfy 0 < MIN <= MAX"));
    }
    let to_usize = |v: i64| usize::try_from(v).map_err(|_| bad("node count too large"));
    Ok(NodeRange {
        min: to_usize(min)?,
        max: to_usize(max)?,
    })
}

/// `--rdzv-backend`.
pub fn parse_backend(text: &str) -> Result<RdzvBackend, ConfigError> {
    match text {
        "static" => Ok(RdzvBackend::Static),
        "c10d" => Ok(RdzvBackend::C10d),
        "etcd" => Ok(RdzvBackend::Etcd),
        "etcd-v2" => Ok(RdzvBackend::EtcdV2),
        _ => Err(invalid(
            "--rdzv-backend",
            text,
            "unknown rendezvous backend (expected static, c10d, etcd or etcd-v2)",
        )),
    }
}

/// `--rdzv-conf`: `k1=v1,k2=v2`, stripped, split on the first `=`; empty keys or values are errors.
pub fn parse_rdzv_conf(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut conf = BTreeMap::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(conf);
    }
    for kv in text.split(',') {
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (kv.trim(), ""),
        };
        if key.is_empty() {
            return Err(invalid(
                "--rdzv-conf",
                text,
                "expected <key1>=<value1>,...,<keyN>=<valueN>",
            ));
        }
        if value.is_empty() {
            return Err(invalid(
                "--rdzv-conf",
                text,
                format!("option '{key}' must have a value"),
            ));
        }
        conf.insert(key.to_string(), value.to_string());
    }
    Ok(conf)
}

/// A rendezvous endpoint (torchrun `parse_rendezvous_endpoint`): `host[:port]`, `[v6]` or
/// `[v6]:port`, split on the last `:`; the backend's default port when none is given (the static
/// backend needs one).
pub fn parse_endpoint(text: &str, backend: RdzvBackend) -> Result<Endpoint, ConfigError> {
    let default_port = match backend {
        RdzvBackend::Static => None,
        RdzvBackend::C10d => Some(DEFAULT_C10D_PORT),
        RdzvBackend::Etcd | RdzvBackend::EtcdV2 => Some(DEFAULT_ETCD_PORT),
    };
    let t = text.trim();
    if t.is_empty() {
        return match default_port {
            Some(port) => Ok(Endpoint {
                host: "localhost".into(),
                port,
            }),
            None => Err(invalid("--rdzv-endpoint", text, "a port is required")),
        };
    }
    let (mut host, port_text) = if t.starts_with('[') && t.ends_with(']') {
        (t, None)
    } else if !t.starts_with('[') && t.matches(':').count() >= 2 {
        // An unbracketed IPv6 literal (issue 10): `::1` is that address, not host ":" port 1.
        // `ADDR:PORT` is accepted as torchrun reads it when ADDR alone is an IPv6 address and
        // the whole is not; when both readings are addresses, brackets must say which.
        let whole = t.parse::<std::net::Ipv6Addr>().is_ok();
        let split = t.rsplit_once(':').filter(|(h, p)| {
            h.parse::<std::net::Ipv6Addr>().is_ok()
                && !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
        });
        match (whole, split) {
            (true, None) => (t, None),
            (false, Some((h, p))) => (h, Some(p)),
            _ => {
                return Err(invalid(
                    "--rdzv-endpoint",
                    text,
                    "write an IPv6 address in brackets: [ADDR] or [ADDR]:PORT",
                ))
            }
        }
    } else {
        match t.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (t, None),
        }
    };
    if host.len() > 1 && host.starts_with('[') && host.ends_with(']') {
        host = &host[1..host.len() - 1];
    }
    let port = match port_text {
        Some(p) => {
            let ok = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            match p
                .parse::<u32>()
                .ok()
                .filter(|_| ok)
                .and_then(|v| u16::try_from(v).ok())
            {
                Some(v) => v,
                None => {
                    return Err(invalid(
                        "--rdzv-endpoint",
                        text,
                        "the port must be an integer between 0 and 65535",
                    ))
                }
            }
        }
        None => match default_port {
            Some(p) => p,
            None => {
                return Err(invalid(
                    "--rdzv-endpoint",
                    text,
                    "a port is required (try --master-port)",
                ))
            }
        },
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if !host_ok {
        return Err(invalid(
            "--rdzv-endpoint",
            text,
            "the host must be a hostname, an IPv4 address, or an IPv6 address in brackets",
        ));
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
    })
}

/// `--nproc-per-node`: a positive integer, `cpu`, `gpu` or `auto`.
pub fn resolve_nproc(text: &str, env: EnvFn<'_>, host: &dyn Host) -> Result<usize, ConfigError> {
    let n = match text {
        "cpu" => host.cpu_count(),
        "gpu" => match gpu_count(env, host) {
            Ok(n) => n,
            Err(reason) => {
                return Err(ConfigError::NoDevices {
                    value: text.into(),
                    reason,
                })
            }
        },
        "auto" => gpu_count(env, host).unwrap_or_else(|_| host.cpu_count()),
        _ => {
            let v = python_int(text).ok_or_else(|| {
                invalid(
                    "--nproc-per-node",
                    text,
                    "expected a positive integer, cpu, gpu or auto",
                )
            })?;
            return usize::try_from(v)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid("--nproc-per-node", text, "must be > 0"));
        }
    };
    if n == 0 {
        return Err(ConfigError::NoDevices {
            value: text.into(),
            reason: "found 0 devices".into(),
        });
    }
    tracing::info!("Using nproc_per_node={text}, setting nproc_per_node to {n}");
    Ok(n)
}

/// GPUs a CUDA program would see: CUDA_VISIBLE_DEVICES if set (entries up to the first invalid
/// one, as the CUDA runtime reads it), capped by what the driver lists; else the driver's count.
fn gpu_count(env: EnvFn<'_>, host: &dyn Host) -> Result<usize, String> {
    let driver = host.nvidia_gpu_count();
    if let Some(cvd) = env("CUDA_VISIBLE_DEVICES") {
        let listed = visible_device_entries(&cvd);
        let n = driver.map_or(listed, |d| listed.min(d));
        if n == 0 {
            return Err(format!("no GPU is visible (CUDA_VISIBLE_DEVICES={cvd:?})"));
        }
        return Ok(n);
    }
    match driver {
        Some(n) if n > 0 => Ok(n),
        _ => Err(
            "no NVIDIA GPU found (no /proc/driver/nvidia/gpus entries, nvidia-smi -L lists none)"
                .into(),
        ),
    }
}

/// Number of usable entries in a CUDA_VISIBLE_DEVICES list: the CUDA runtime stops at the first
/// entry that is not a device index or a `GPU-`/`MIG-` UUID (e.g. `-1` hides every device).
fn visible_device_entries(list: &str) -> usize {
    list.split(',')
        .map(str::trim)
        .take_while(|e| {
            (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
                || e.starts_with("GPU-")
                || e.starts_with("MIG-")
        })
        .count()
}

/// `-r`/`-t`: one digit 0–3 for every rank, or a `rank:digit,...` map (ranks of any length).
pub fn parse_std_spec(flag: &'static str, text: &str) -> Result<StdSpec, ConfigError> {
    let digit = |s: &str| match s {
        "0" => Some(StdSelect::None),
        "1" => Some(StdSelect::Out),
        "2" => Some(StdSelect::Err),
        "3" => Some(StdSelect::All),
        _ => None,
    };
    if let Some(all) = digit(text) {
        return Ok(StdSpec {
            all,
            per_rank: BTreeMap::new(),
        });
    }
    let bad = || {
        invalid(
            flag,
            text,
            "expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a map like 0:1,1:2",
        )
    };
    let mut per_rank = BTreeMap::new();
    for item in text.split(',') {
        let (rank, sel) = item.split_once(':').ok_or_else(bad)?;
        if rank.is_empty() || !rank.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let rank: usize = rank.parse().map_err(|_| bad())?;
        per_rank.insert(rank, digit(sel).ok_or_else(bad)?);
    }
    Ok(StdSpec {
        all: StdSelect::None,
        per_rank,
    })
}

/// `--local-ranks-filter`: empty = no filter; else comma-separated local ranks.
pub fn parse_local_ranks_filter(text: &str) -> Result<Option<Vec<usize>>, ConfigError> {
    if text.is_empty() {
        return Ok(None);
    }
    let mut ranks = Vec::new();
    for item in text.split(',') {
        let r = python_int(item)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                invalid(
                    "--local-ranks-filter",
                    text,
                    "must be a comma-separated list of local ranks, e.g. --local-ranks-filter=0,1,2",
                )
            })?;
        ranks.push(r);
    }
    ranks.sort_unstable();
    ranks.dedup();
    Ok(Some(ranks))
}

fn resolve_logs(
    args: &LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<LogConfig, ConfigError> {
    let log_dir = args
        .log_dir
        .as_deref()
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    if let Some(dir) = &log_dir {
        if dir != Path::new("/dev/null") && matches!(host.file(dir), FileKind::File { .. }) {
            return Err(ConfigError::LogDirNotDirectory(dir.display().to_string()));
        }
    }
    let prefix_template = Some(args.log_line_prefix_template.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
        .filter(|t| !t.is_empty());
    // An empty filter would match every line; torchrun's help promises "an empty filters list
    // won't duplicate any lines", so empty items are dropped.
    let filters = |v: &[String]| v.iter().filter(|f| !f.is_empty()).cloned().collect();
    Ok(LogConfig {
        log_dir,
        redirects: parse_std_spec("--redirects", &args.redirects)?,
        tee: parse_std_spec("--tee", &args.tee)?,
        local_ranks_filter: parse_local_ranks_filter(&args.local_ranks_filter)?,
        prefix_template,
        duplicate_stdout_filters: filters(&args.duplicate_stdout_filters),
        duplicate_stderr_filters: filters(&args.duplicate_stderr_filters),
    })
}

/// `--signals-to-handle`: `SIG*` names to numbers; unknown or uncatchable names are skipped with
/// a warning (torchrun logs "Failed to register signal handler for X" and goes on).
pub fn parse_signals(text: &str) -> Vec<i32> {
    use std::str::FromStr;
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim) {
        match nix::sys::signal::Signal::from_str(name) {
            Ok(nix::sys::signal::Signal::SIGKILL | nix::sys::signal::Signal::SIGSTOP) => {
                tracing::warn!("Failed to register signal handler for {name}: it cannot be caught");
            }
            Ok(sig) => {
                if !out.contains(&(sig as i32)) {
                    out.push(sig as i32);
                }
            }
            Err(_) => {
                tracing::warn!("Failed to register signal handler for {name}: unknown signal")
            }
        }
    }
    out
}

/// Signal numbers back to their `SIG*` names, comma-joined (the TORCHELASTIC_SIGNALS_TO_HANDLE
/// text torchrun exports to workers).
pub fn signal_names(signals: &[i32]) -> String {
    signals
        .iter()
        .filter_map(|s| nix::sys::signal::Signal::try_from(*s).ok())
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `--shutdown-timeout`, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s; negative is an error.
pub fn resolve_shutdown_timeout(
    flag: Option<i64>,
    env: EnvFn<'_>,
) -> Result<Duration, ConfigError> {
    let secs = match flag {
        Some(v) => u64::try_from(v)
            .map_err(|_| invalid("--shutdown-timeout", v.to_string(), "must be >= 0"))?,
        None => match env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            None => DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            Some(text) => python_int(&text)
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| {
                    invalid(
                        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                        text.clone(),
                        "must be a whole number of seconds >= 0",
                    )
                })?,
        },
    };
    Ok(Duration::from_secs(secs))
}

/// Whether rdrun must set OMP_NUM_THREADS=1 for the workers: only when the user has not set it
/// (any value, even empty, is passed through) and more than one worker shares the node.
pub fn should_set_omp_num_threads(existing: Option<&str>, nproc_per_node: usize) -> bool {
    existing.is_none() && nproc_per_node > 1
}

/// `--virtual-local-rank`: the variables one worker gets so that it sees only its own GPU, as
/// torchrun: the `local_rank`-th entry of the parent's HIP_VISIBLE_DEVICES (then both HIP_ and
/// CUDA_VISIBLE_DEVICES are set) or CUDA_VISIBLE_DEVICES, else the local rank itself.
pub fn virtual_local_rank_devices(
    local_rank: usize,
    hip_visible_devices: Option<&str>,
    cuda_visible_devices: Option<&str>,
) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let hip = hip_visible_devices.filter(|h| !h.is_empty());
    let (var, parent) = match hip {
        Some(h) => ("HIP_VISIBLE_DEVICES", Some(h)),
        None => ("CUDA_VISIBLE_DEVICES", cuda_visible_devices),
    };
    let device = match parent {
        Some(list) => list
            .split(',')
            .nth(local_rank)
            .map(|d| d.trim().to_string())
            .ok_or_else(|| ConfigError::VirtualDevices {
                local_rank,
                var,
                value: list.to_string(),
            })?,
        None => local_rank.to_string(),
    };
    let mut vars = vec![("CUDA_VISIBLE_DEVICES", device.clone())];
    if hip.is_some() {
        vars.push(("HIP_VISIBLE_DEVICES", device));
    }
    Ok(vars)
}

/// torchrun's arg macro: `${local_rank}` and `$local_rank` become the local rank. Unlike
/// Python's `string.Template`, `$$` is not collapsed to `$` (it is kept, and `$$local_rank` stays
/// literal), and every other `$` is kept as typed.
pub fn substitute_local_rank(arg: &str, local_rank: usize) -> String {
    const NAME: &str = "local_rank";
    let rank = local_rank.to_string();
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push_str("$$");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("{local_rank}") {
            out.push_str(&rank);
            rest = tail;
        } else if let Some(tail) = after.strip_prefix(NAME).filter(|t| {
            // `$local_rankX` is the identifier `local_rankX`, not this macro.
            !t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        }) {
            out.push_str(&rank);
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The `python -u -c` program behind `--run-path` (spec §3.10): argv as `python script args`,
/// the script's directory first on `sys.path` as for `python script.py`, `runpy.run_path(script,
/// run_name="__main__")`, and on an uncaught exception the TORCHELASTIC_ERROR_FILE JSON of
/// torch's `@record` (spec §3.9): `{"message": {"message": "<Type>: <str>", "extraInfo":
/// {"py_callstack": <traceback>, "timestamp": "<epoch s>"}}}`. `SystemExit` passes through
/// unrecorded, as under `@record`.
pub const RUN_PATH_BOOTSTRAP: &str = r#"import faulthandler, json, os, runpy, sys, time, traceback
faulthandler.enable(all_threads=True)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    raise
except Exception as e:
    _f = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if _f:
        with open(_f, "w") as _fp:
            json.dump({"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}, _fp)
    raise
"#;

/// Finds `name` the way `execvp` does: a name with a `/` is a path; otherwise the first
/// executable regular file in the PATH directories.
pub fn find_program(name: &str, env: EnvFn<'_>, host: &dyn Host) -> Option<PathBuf> {
    if name.is_empty() {
        return None;
    }
    if name.contains('/') {
        return matches!(host.file(Path::new(name)), FileKind::File { .. }).then(|| name.into());
    }
    let path = env("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    path.split(':').find_map(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = Path::new(dir).join(name);
        matches!(host.file(&candidate), FileKind::File { executable: true }).then_some(candidate)
    })
}

/// The interpreter for Python workers: `$PYTHON_EXEC`, else `$VIRTUAL_ENV/bin/python`, else
/// `python3` then `python` on PATH (spec §6: rdrun has no `sys.executable` of its own).
pub fn find_python(env: EnvFn<'_>, host: &dyn Host) -> Result<PathBuf, ConfigError> {
    if let Some(exec) = env("PYTHON_EXEC").filter(|p| !p.is_empty()) {
        return find_program(&exec, env, host)
            .filter(|p| matches!(host.file(p), FileKind::File { executable: true }))
            .ok_or_else(|| ConfigError::PythonNotFound(format!("PYTHON_EXEC={exec}")));
    }
    if let Some(venv) = env("VIRTUAL_ENV").filter(|p| !p.is_empty()) {
        let p = Path::new(&venv).join("bin").join("python");
        if matches!(host.file(&p), FileKind::File { executable: true }) {
            return Ok(p);
        }
    }
    ["python3", "python"]
        .iter()
        .find_map(|n| find_program(n, env, host))
        .ok_or_else(|| {
            ConfigError::PythonNotFound(
                "no python3 or python on PATH (set PYTHON_EXEC or activate a virtualenv)".into(),
            )
        })
}

/// The worker command (spec §1.3 step 10, §6) and the improvement of issue #2: a program that
/// is not a `.py` file and is executable runs directly even without `--no-python`.
pub fn resolve_command(
    args: &LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<WorkerCommand, ConfigError> {
    let script = args.training_script.as_str();
    let rest = args.training_script_args.iter().cloned();
    let require_script = || match host.file(Path::new(script)) {
        FileKind::File { .. } => Ok(()),
        _ => Err(ConfigError::ScriptNotFound(script.to_string())),
    };
    if args.run_path {
        require_script()?;
        let mut a = vec![
            "-u".to_string(),
            "-c".into(),
            RUN_PATH_BOOTSTRAP.into(),
            script.into(),
        ];
        a.extend(rest);
        return Ok(WorkerCommand {
            kind: EntrypointKind::RunPath,
            program: find_python(env, host)?,
            args: a,
            display_name: "run_script_path".into(),
        });
    }
    if args.no_python && args.module {
        return Err(ConfigError::ModuleWithNoPython);
    }
    if args.module {
        let mut a = vec!["-u".to_string(), "-m".into(), script.into()];
        a.extend(rest);
        return Ok(WorkerCommand {
            kind: EntrypointKind::PythonModule,
            program: find_python(env, host)?,
            args: a,
            display_name: script.into(),
        });
    }
    let exec = |program: PathBuf| WorkerCommand {
        kind: EntrypointKind::Exec,
        program,
        args: args.training_script_args.clone(),
        display_name: script.into(),
    };
    let python_script = || -> Result<WorkerCommand, ConfigError> {
        let mut a = vec!["-u".to_string(), script.into()];
        a.extend(args.training_script_args.iter().cloned());
        Ok(WorkerCommand {
            kind: EntrypointKind::PythonScript,
            program: find_python(env, host)?,
            args: a,
            display_name: script.into(),
        })
    };
    if args.no_python {
        return match find_program(script, env, host) {
            Some(p) if matches!(host.file(&p), FileKind::File { executable: true }) => Ok(exec(p)),
            Some(_) => Err(ConfigError::NotExecutable(script.into())),
            None => Err(ConfigError::ProgramNotFound(script.into())),
        };
    }
    if script.ends_with(".py") {
        require_script()?;
        return python_script();
    }
    // Not a .py file: an existing file runs directly when executable, else under python (as
    // torchrun); a bare name that is no file here is looked up on PATH.
    match host.file(Path::new(script)) {
        FileKind::File { executable: true } => {
            let program = if script.contains('/') {
                PathBuf::from(script)
            } else {
                // execvp would search PATH for a bare name; the file meant is the one here.
                Path::new(".").join(script)
            };
            Ok(exec(program))
        }
        FileKind::File { executable: false } => python_script(),
        FileKind::Dir => {
            // `python dir` runs dir/__main__.py, as torchrun would.
            python_script()
        }
        FileKind::Missing => {
            match find_program(script, env, host).filter(|_| !script.contains('/')) {
                Some(p) => Ok(exec(p)),
                None => Err(ConfigError::ScriptNotFound(script.into())),
            }
        }
    }
}

/// A random (version 4) UUID's 16 bytes.
fn uuid4_bytes(mut b: [u8; 16]) -> [u8; 16] {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// `str(uuid.uuid4())`: lowercase 8-4-4-4-12 hex.
pub fn uuid4(random: [u8; 16]) -> String {
    let b = uuid4_bytes(random);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse_from, Invocation};
    use std::collections::HashMap;

    struct FakeHost {
        cpus: usize,
        gpus: Option<usize>,
        files: HashMap<PathBuf, FileKind>,
    }

    impl FakeHost {
        fn new() -> Self {
            let mut files = HashMap::new();
            for (p, k) in [
                ("t.py", FileKind::File { executable: false }),
                ("/usr/bin/python3", FileKind::File { executable: true }),
                ("/bin/true", FileKind::File { executable: true }),
                ("/usr/bin/train", FileKind::File { executable: true }),
                ("./prog", FileKind::File { executable: true }),
                ("./data.txt", FileKind::File { executable: false }),
                ("localbin", FileKind::File { executable: true }),
                ("script", FileKind::File { executable: false }),
                ("/venv/bin/python", FileKind::File { executable: true }),
                ("/opt/py", FileKind::File { executable: true }),
                ("/logs/file", FileKind::File { executable: false }),
                ("/logs", FileKind::Dir),
            ] {
                files.insert(PathBuf::from(p), k);
            }
            FakeHost {
                cpus: 6,
                gpus: None,
                files,
            }
        }
    }

    impl Host for FakeHost {
        fn cpu_count(&self) -> usize {
            self.cpus
        }
        fn nvidia_gpu_count(&self) -> Option<usize> {
            self.gpus
        }
        fn file(&self, path: &Path) -> FileKind {
            self.files.get(path).copied().unwrap_or(FileKind::Missing)
        }
        fn random_bytes(&self) -> [u8; 16] {
            [0xab; 16]
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut map: HashMap<String, String> = HashMap::new();
        map.insert("PATH".into(), "/usr/bin:/bin".into());
        for (k, v) in pairs {
            map.insert(k.to_string(), v.to_string());
        }
        move |k: &str| map.get(k).cloned()
    }

    fn args(argv: &[&str]) -> LaunchArgs {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        match parse_from(&argv, &|_| None).expect("test argv parses") {
            Invocation::Launch(a) => *a,
            Invocation::Help => panic!("help"),
        }
    }

    fn resolve_env(
        argv: &[&str],
        env: &[(&str, &str)],
        host: &FakeHost,
    ) -> Result<LaunchConfig, ConfigError> {
        resolve_with(args(argv), &env_of(env), host)
    }

    fn ok(argv: &[&str]) -> LaunchConfig {
        resolve_env(argv, &[], &FakeHost::new()).expect("resolves")
    }

    fn fail(argv: &[&str]) -> ConfigError {
        resolve_env(argv, &[], &FakeHost::new()).expect_err("must fail")
    }

    #[test]
    fn nnodes() {
        let ok_cases = [
            ("1", (1, 1)),
            ("1:1", (1, 1)),
            (" 2 ", (2, 2)),
            ("1:4", (1, 4)),
        ];
        for (text, (min, max)) in ok_cases {
            assert_eq!(
                parse_nnodes(text).unwrap(),
                NodeRange { min, max },
                "{text}"
            );
        }
        for bad in ["0", "2:1", "x", "1:2:3", "", "-1", "0:2", "1:"] {
            let e = parse_nnodes(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
            assert!(
                e.to_string().starts_with(&format!("--nnodes '{bad}': ")),
                "{e}"
            );
        }
    }

    #[test]
    fn multi_node_resolves_to_a_rendezvous() {
        // Static: node 0 hosts the store at --master-addr:--master-port (torchrun's default).
        let c = ok(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "1234",
            "t.py",
        ]);
        assert_eq!(
            (c.nnodes, c.node_rank, c.standalone),
            (NodeRange { min: 2, max: 2 }, 1, false)
        );
        assert_eq!(c.rdzv.backend, RdzvBackend::Static);
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "10.0.0.1".into(),
                port: 1234
            })
        );
        // c10d MIN:MAX with an endpoint.
        let c = ok(&[
            "--nnodes",
            "1:4",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "h:5",
            "--rdzv-id",
            "j",
            "t.py",
        ]);
        assert_eq!(c.nnodes, NodeRange { min: 1, max: 4 });
        assert_eq!(
            (c.rdzv.backend, c.rdzv.run_id.as_str()),
            (RdzvBackend::C10d, "j")
        );
        // A node rank outside the static job is still refused.
        let e = fail(&[
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-port",
            "1",
            "t.py",
        ]);
        assert!(e.to_string().starts_with("--node-rank '2'"), "{e}");
    }

    #[test]
    fn numeric_flag_ranges() {
        let cases: &[(&[&str], &str)] = &[
            (&["--max-restarts", "-1", "t.py"], "--max-restarts '-1': must be >= 0"),
            (&["--monitor-interval", "0", "t.py"], "--monitor-interval '0': must be > 0"),
            (&["--monitor-interval", "nan", "t.py"], "--monitor-interval 'NaN': must be > 0"),
            (&["--node-rank", "-2", "t.py"], "--node-rank '-2': must be >= 0"),
            (&["--master-port", "70000", "t.py"], "--master-port '70000': must be between 0 and 65535"),
            (&["--shutdown-timeout", "-1", "t.py"], "--shutdown-timeout '-1': must be >= 0"),
            (
                &["--exit-barrier-timeout", "-5", "t.py"],
                "--exit-barrier-timeout '-5': must be a finite number of seconds >= 0",
            ),
            (
                &["--master-port", "29555", "--node-rank", "1", "t.py"],
                "--node-rank '1': must be less than the number of nodes (1)",
            ),
            (
                &["--rdzv-backend", "zookeeper", "t.py"],
                "--rdzv-backend 'zookeeper': unknown rendezvous backend (expected static, c10d, etcd or etcd-v2)",
            ),
        ];
        for (argv, msg) in cases {
            let e = fail(argv);
            assert_eq!(e.to_string(), *msg, "{argv:?}");
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{argv:?}");
        }
        let c = ok(&[
            "--max-restarts",
            "3",
            "--exit-barrier-timeout",
            "1.5",
            "t.py",
        ]);
        assert_eq!(c.max_restarts, 3);
        assert_eq!(c.exit_barrier_timeout, Duration::from_millis(1500));
        assert_eq!(ok(&["t.py"]).exit_barrier_timeout, Duration::from_secs(300));
    }

    #[test]
    fn standalone_and_auto_standalone() {
        let uuid = "abababab-abab-4bab-abab-abababababab";
        // Plain run: auto-standalone (static default, no endpoint, no master port, one node).
        let c = ok(&["t.py"]);
        assert!(c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
        assert_eq!(c.rdzv.endpoint, None);
        assert_eq!(c.rdzv.run_id, uuid);
        assert_eq!((c.master_addr.as_str(), c.master_port), ("127.0.0.1", None));
        // --standalone ignores the user's backend, endpoint and id.
        let c = ok(&[
            "--standalone",
            "--rdzv-backend",
            "etcd",
            "--rdzv-id",
            "job",
            "--rdzv-endpoint",
            "h:1",
            "t.py",
        ]);
        assert!(c.standalone);
        assert_eq!(c.rdzv.run_id, uuid);
        assert_eq!(c.rdzv.endpoint, None);
        // --standalone with --master-port: that port, loopback.
        let c = ok(&["--standalone", "--master-port", "29511", "t.py"]);
        assert!(c.standalone);
        assert_eq!(c.master_port, Some(29511));
        // --master-port disables auto-standalone: static at master_addr:master_port.
        let c = ok(&["--master-port", "29555", "t.py"]);
        assert!(!c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::Static);
        assert_eq!(c.rdzv.run_id, "none");
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "127.0.0.1".into(),
                port: 29555
            })
        );
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", Some(29555))
        );
        // Static with an explicit endpoint: MASTER_* come from it (IPv6 without brackets).
        let c = ok(&["--rdzv-endpoint", "[::1]:29600", "t.py"]);
        assert!(!c.standalone);
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("::1", Some(29600))
        );
        let c = ok(&["--master-addr", "[::1]", "--master-port", "1", "t.py"]);
        assert_eq!(c.master_addr, "::1");
        // c10d on one node: not standalone, kernel-chosen MASTER_PORT, the user's run id.
        let c = ok(&[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:29400",
            "--rdzv-id",
            "j1",
            "t.py",
        ]);
        assert!(!c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
        assert_eq!(c.rdzv.run_id, "j1");
        assert_eq!(c.master_port, None);
        let c = ok(&["--rdzv-backend", "c10d", "--local-addr", "node7", "t.py"]);
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "localhost".into(),
                port: 29400
            })
        );
        assert_eq!(c.master_addr, "node7");
        // Empty run id outside standalone: torchrun's decimal uuid4().int.
        let c = ok(&["--rdzv-backend", "c10d", "--rdzv-id", "", "t.py"]);
        assert!(c.rdzv.run_id.bytes().all(|b| b.is_ascii_digit()) && c.rdzv.run_id.len() > 30);
    }

    /// Issue 17.5: port 0 is "pick a free port" for one node (the host tells itself the port),
    /// a one-line usage error for several (the others cannot learn it).
    #[test]
    fn port_zero_is_one_node_only() {
        let c = ok(&[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "t.py",
        ]);
        assert_eq!(c.rdzv.endpoint.unwrap().port, 0);
        for argv in [
            &[
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "localhost:0",
                "--nnodes",
                "2",
                "t.py",
            ][..],
            &[
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "localhost:0",
                "--nnodes",
                "1:3",
                "t.py",
            ],
            &["--nnodes", "2", "--master-port", "0", "t.py"],
        ] {
            let e = fail(argv);
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{argv:?}");
            let msg = e.to_string();
            assert!(msg.contains("port 0") && msg.contains("one node"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        // An IPv6 --master-addr is bracketed before its port is added (never ambiguous).
        let c = ok(&[
            "--master-addr",
            "fe80::1:2",
            "--master-port",
            "1234",
            "t.py",
        ]);
        assert_eq!(c.rdzv.endpoint.unwrap().host, "fe80::1:2");
        assert_eq!(c.master_addr, "fe80::1:2");
        let e = parse_endpoint("fe80::1:2940", RdzvBackend::C10d).unwrap_err();
        assert!(e.to_string().contains("brackets"), "{e}");
    }

    #[test]
    fn endpoints() {
        use RdzvBackend::*;
        let ep = |h: &str, p| Endpoint {
            host: h.into(),
            port: p,
        };
        let cases = [
            ("", C10d, ep("localhost", 29400)),
            ("  ", Etcd, ep("localhost", 2379)),
            ("host", C10d, ep("host", 29400)),
            ("host:1234", Static, ep("host", 1234)),
            ("10.0.0.1:0", C10d, ep("10.0.0.1", 0)),
            ("[::1]", EtcdV2, ep("::1", 2379)),
            ("[fe80::1]:29400", Static, ep("fe80::1", 29400)),
            // Issue 10: unbracketed IPv6 literals (they used to be host ":" port 1).
            ("::1", C10d, ep("::1", 29400)),
            ("fe80::1", C10d, ep("fe80::1", 29400)),
            ("2001:db8::7", Etcd, ep("2001:db8::7", 2379)),
            ("::1:29401", C10d, ep("::1", 29401)),
            (
                "node-1.example.com:65535",
                C10d,
                ep("node-1.example.com", 65535),
            ),
        ];
        for (text, b, want) in cases {
            assert_eq!(parse_endpoint(text, b).unwrap(), want, "{text}");
        }
        for (text, b) in [
            ("host", Static),
            ("", Static),
            ("host:65536", C10d),
            ("host:123456", C10d),
            ("host:x", C10d),
            ("host:", C10d),
            ("ho st:1", C10d),
            (":1", C10d),
            ("::1", Static),
            ("fe80::1:2940", C10d),
            ("a:b:c", C10d),
        ] {
            assert!(parse_endpoint(text, b).is_err(), "{text}");
        }
    }

    #[test]
    fn rdzv_conf() {
        let c = parse_rdzv_conf(" join_timeout = 5 ,is_host=1,x=a=b ").unwrap();
        assert_eq!(c.get("join_timeout").map(String::as_str), Some("5"));
        assert_eq!(c.get("is_host").map(String::as_str), Some("1"));
        assert_eq!(c.get("x").map(String::as_str), Some("a=b"));
        assert!(parse_rdzv_conf("").unwrap().is_empty());
        for bad in ["a", "a=", "=1", "a=1,,b=2", "a=1,"] {
            let e = parse_rdzv_conf(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        assert_eq!(
            parse_rdzv_conf("a=").unwrap_err().to_string(),
            "--rdzv-conf 'a=': option 'a' must have a value"
        );
    }

    #[test]
    fn nproc() {
        let mut host = FakeHost::new();
        let none = env_of(&[]);
        assert_eq!(resolve_nproc("4", &none, &host).unwrap(), 4);
        assert_eq!(resolve_nproc(" 2 ", &none, &host).unwrap(), 2);
        assert_eq!(resolve_nproc("cpu", &none, &host).unwrap(), 6);
        assert_eq!(resolve_nproc("auto", &none, &host).unwrap(), 6);
        for bad in ["0", "-1", "x", "", "xpu", "2.0"] {
            let e = resolve_nproc(bad, &none, &host).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        let e = resolve_nproc("gpu", &none, &host).unwrap_err();
        assert_eq!(e.exit_code(), crate::exit::LAUNCHER_FAILURE);
        assert!(
            e.to_string()
                .starts_with("--nproc-per-node gpu: no NVIDIA GPU found"),
            "{e}"
        );

        host.gpus = Some(8);
        assert_eq!(resolve_nproc("gpu", &none, &host).unwrap(), 8);
        assert_eq!(resolve_nproc("auto", &none, &host).unwrap(), 8);
        let cases = [
            ("0,1", Ok(2)),
            ("3", Ok(1)),
            ("0,1,2,3,4,5,6,7,8,9", Ok(8)),
            ("0,-1,2", Ok(1)),
            ("GPU-aaa,MIG-bbb", Ok(2)),
            ("", Err(())),
            ("-1", Err(())),
        ];
        for (cvd, want) in cases {
            let env = env_of(&[("CUDA_VISIBLE_DEVICES", cvd)]);
            let got = resolve_nproc("gpu", &env, &host).map_err(|_| ());
            assert_eq!(got, want, "CUDA_VISIBLE_DEVICES={cvd:?}");
        }
        // auto falls back to CPUs when CUDA_VISIBLE_DEVICES hides every GPU.
        let env = env_of(&[("CUDA_VISIBLE_DEVICES", "")]);
        assert_eq!(resolve_nproc("auto", &env, &host).unwrap(), 6);
        // No driver listing, but CUDA_VISIBLE_DEVICES is trusted.
        host.gpus = None;
        let env = env_of(&[("CUDA_VISIBLE_DEVICES", "0,1,2")]);
        assert_eq!(resolve_nproc("gpu", &env, &host).unwrap(), 3);
    }

    #[test]
    fn std_specs() {
        use StdSelect::*;
        let all = |s| StdSpec {
            all: s,
            per_rank: BTreeMap::new(),
        };
        assert_eq!(parse_std_spec("--tee", "0").unwrap(), all(None));
        assert_eq!(parse_std_spec("--tee", "1").unwrap(), all(Out));
        assert_eq!(parse_std_spec("--tee", "2").unwrap(), all(Err));
        assert_eq!(parse_std_spec("--tee", "3").unwrap(), all(All));
        let m = parse_std_spec("--redirects", "0:1,1:2,12:3,1:0").unwrap();
        assert_eq!(m.for_rank(0), Out);
        assert_eq!(m.for_rank(1), None, "a later entry wins");
        assert_eq!(m.for_rank(12), All, "ranks of several digits");
        assert_eq!(m.for_rank(5), None);
        for bad in ["", "4", "01", "0:4", "a:1", "0:1,", ":1", "0-1", " 1"] {
            let e = parse_std_spec("--tee", bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        assert!(fail(&["-t", "9", "t.py"])
            .to_string()
            .starts_with("--tee '9': "));
        assert!(fail(&["-r", "x", "t.py"])
            .to_string()
            .starts_with("--redirects 'x': "));
    }

    #[test]
    fn logs() {
        let c = ok(&["t.py"]);
        assert_eq!(c.log, LogConfig::default());
        let c = ok(&["--log-dir", "", "t.py"]);
        assert_eq!(c.log.log_dir, None);
        let c = ok(&[
            "--log-dir",
            "/logs",
            "--local-ranks-filter",
            "2,0,2",
            "t.py",
        ]);
        assert_eq!(c.log.log_dir, Some(PathBuf::from("/logs")));
        assert_eq!(c.log.local_ranks_filter, Some(vec![0, 2]));
        assert!(matches!(
            fail(&["--log-dir", "/logs/file", "t.py"]),
            ConfigError::LogDirNotDirectory(_)
        ));
        assert!(ok(&["--log-dir", "/dev/null", "t.py"])
            .log
            .log_dir
            .is_some());
        for bad in ["x", "-1", "0,,1"] {
            let e = fail(&["--local-ranks-filter", bad, "t.py"]);
            assert!(e.to_string().starts_with("--local-ranks-filter"), "{e}");
        }
        let host = FakeHost::new();
        let env = [("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]")];
        let c = resolve_env(&["t.py"], &env, &host).unwrap();
        assert_eq!(c.log.prefix_template.as_deref(), Some("[${rank}]"));
        let c = resolve_env(
            &["--log-line-prefix-template", "<${local_rank}>", "t.py"],
            &env,
            &host,
        )
        .unwrap();
        assert_eq!(c.log.prefix_template.as_deref(), Some("<${local_rank}>"));
        let c = ok(&[
            "--duplicate-stdout-filters",
            "a,,b,c",
            "--duplicate-stderr-filters",
            "",
            "t.py",
        ]);
        assert_eq!(c.log.duplicate_stdout_filters, vec!["a,b", "c"]);
        assert!(c.log.duplicate_stderr_filters.is_empty());
    }

    #[test]
    fn signals() {
        use libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let c = ok(&["t.py"]);
        assert_eq!(
            c.signals_to_handle,
            vec![SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2]
        );
        assert_eq!(
            parse_signals("SIGTERM, BOGUS,SIGKILL,TERM,,SIGINT,SIGTERM"),
            vec![SIGTERM, SIGINT]
        );
        assert_eq!(
            signal_names(&c.signals_to_handle),
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
        );
    }

    #[test]
    fn shutdown_timeout() {
        let cases: &[(Option<i64>, Option<&str>, Option<u64>)] = &[
            (None, None, Some(30)),
            (Some(5), None, Some(5)),
            (Some(0), Some("9"), Some(0)),
            (None, Some("7"), Some(7)),
            (None, Some(" 8 "), Some(8)),
            (Some(-1), None, None),
            (None, Some("-1"), None),
            (None, Some("soon"), None),
        ];
        for (flag, var, want) in cases {
            let env = match var {
                Some(v) => env_of(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", v)]),
                None => env_of(&[]),
            };
            let got = resolve_shutdown_timeout(*flag, &env)
                .ok()
                .map(|d| d.as_secs());
            assert_eq!(got, *want, "{flag:?} {var:?}");
        }
    }

    #[test]
    fn omp_num_threads() {
        assert!(should_set_omp_num_threads(None, 2));
        assert!(!should_set_omp_num_threads(None, 1));
        assert!(!should_set_omp_num_threads(Some("4"), 8));
        assert!(!should_set_omp_num_threads(Some(""), 8));
    }

    #[test]
    fn virtual_devices() {
        let v = |lr, hip, cuda| virtual_local_rank_devices(lr, hip, cuda);
        assert_eq!(
            v(2, None, None).unwrap(),
            vec![("CUDA_VISIBLE_DEVICES", "2".to_string())]
        );
        assert_eq!(
            v(1, None, Some("4, 5")).unwrap(),
            vec![("CUDA_VISIBLE_DEVICES", "5".to_string())]
        );
        assert_eq!(
            v(0, Some("7,6"), Some("0,1")).unwrap(),
            vec![
                ("CUDA_VISIBLE_DEVICES", "7".to_string()),
                ("HIP_VISIBLE_DEVICES", "7".to_string())
            ]
        );
        assert_eq!(
            v(2, None, Some("0,1")).unwrap_err().to_string(),
            "--virtual-local-rank: local_rank 2 exceeds available GPUs in CUDA_VISIBLE_DEVICES=0,1"
        );
        // Checked up front for every local rank.
        let host = FakeHost::new();
        let env = [("CUDA_VISIBLE_DEVICES", "0,1")];
        let e = resolve_env(
            &["--virtual-local-rank", "--nproc-per-node", "4", "t.py"],
            &env,
            &host,
        )
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::VirtualDevices { local_rank: 2, .. }),
            "{e}"
        );
        assert!(resolve_env(
            &["--virtual-local-rank", "--nproc-per-node", "2", "t.py"],
            &env,
            &host
        )
        .is_ok());
    }

    #[test]
    fn local_rank_macro() {
        let cases = [
            ("${local_rank}", "3"),
            ("$local_rank", "3"),
            ("--out=/x/$local_rank.log", "--out=/x/3.log"),
            ("${local_rank}${local_rank}", "33"),
            ("$local_rankx", "$local_rankx"),
            ("$local_rank_1", "$local_rank_1"),
            ("$$", "$$"),
            ("a$$b", "a$$b"),
            ("$$local_rank", "$$local_rank"),
            ("$$$local_rank", "$$3"),
            ("$other ${other}", "$other ${other}"),
            ("${local_rank", "${local_rank"),
            ("$", "$"),
            ("x$", "x$"),
            ("plain", "plain"),
            ("é$local_rankü", "é3ü"),
        ];
        for (arg, want) in cases {
            assert_eq!(substitute_local_rank(arg, 3), want, "{arg}");
        }
    }

    #[test]
    fn uuid_format() {
        let u = uuid4([0xff; 16]);
        assert_eq!(u, "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let u = uuid4([0; 16]);
        assert_eq!(u, "00000000-0000-4000-8000-000000000000");
        let a = RealHost.random_bytes();
        let b = RealHost.random_bytes();
        assert_ne!(a, b, "two run ids must differ");
    }

    #[test]
    fn real_host_counts_cpus() {
        assert!(RealHost.cpu_count() >= 1);
        assert_eq!(
            RealHost.file(Path::new("/definitely/missing")),
            FileKind::Missing
        );
        assert_eq!(RealHost.file(Path::new("/")), FileKind::Dir);
    }

    fn command(argv: &[&str], env: &[(&str, &str)]) -> Result<WorkerCommand, ConfigError> {
        resolve_command(&args(argv), &env_of(env), &FakeHost::new())
    }

    #[test]
    fn worker_commands() {
        use EntrypointKind::*;
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        type Case<'a> = (
            &'a [&'a str],
            &'a [(&'a str, &'a str)],
            EntrypointKind,
            &'a str,
            &'a [&'a str],
            &'a str,
        );
        let cases: &[Case] = &[
            (
                &["t.py", "a", "${local_rank}"],
                &[],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "t.py", "a", "${local_rank}"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("VIRTUAL_ENV", "/venv")],
                PythonScript,
                "/venv/bin/python",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("PYTHON_EXEC", "/opt/py"), ("VIRTUAL_ENV", "/venv")],
                PythonScript,
                "/opt/py",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["t.py"],
                &[("PYTHON_EXEC", "python3")],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "t.py"],
                "t.py",
            ),
            (
                &["-m", "pkg.mod", "x"],
                &[],
                PythonModule,
                "/usr/bin/python3",
                &["-u", "-m", "pkg.mod", "x"],
                "pkg.mod",
            ),
            (
                &["--no-python", "true", "x"],
                &[],
                Exec,
                "/bin/true",
                &["x"],
                "true",
            ),
            (
                &["--no-python", "./prog"],
                &[],
                Exec,
                "./prog",
                &[],
                "./prog",
            ),
            (
                &["train", "--lr", "1"],
                &[],
                Exec,
                "/usr/bin/train",
                &["--lr", "1"],
                "train",
            ),
            (&["./prog", "a"], &[], Exec, "./prog", &["a"], "./prog"),
            (&["localbin"], &[], Exec, "./localbin", &[], "localbin"),
            (
                &["script", "a"],
                &[],
                PythonScript,
                "/usr/bin/python3",
                &["-u", "script", "a"],
                "script",
            ),
            (
                &["--run-path", "-m", "t.py", "a"],
                &[],
                RunPath,
                "/usr/bin/python3",
                &["-u", "-c", RUN_PATH_BOOTSTRAP, "t.py", "a"],
                "run_script_path",
            ),
            (
                &["--run-path", "--no-python", "t.py"],
                &[],
                RunPath,
                "/usr/bin/python3",
                &["-u", "-c", RUN_PATH_BOOTSTRAP, "t.py"],
                "run_script_path",
            ),
        ];
        for (argv, env, kind, program, a, name) in cases {
            let c = command(argv, env).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(c.kind, *kind, "{argv:?}");
            assert_eq!(c.program, PathBuf::from(program), "{argv:?}");
            assert_eq!(c.args, s(a), "{argv:?}");
            assert_eq!(c.display_name, *name, "{argv:?}");
        }
    }

    #[test]
    fn worker_command_errors() {
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, i32);
        let cases: &[Case] = &[
            (&["missing.py"], &[], "training script not found: missing.py", 1),
            (&["--run-path", "missing.py"], &[], "training script not found: missing.py", 1),
            (&["nothing-here"], &[], "training script not found: nothing-here", 1),
            (&["./nothing"], &[], "training script not found: ./nothing", 1),
            (&["--no-python", "nope"], &[], "program not found: nope (no such file, and not an executable on PATH)", 1),
            (&["--no-python", "./data.txt"], &[], "program is not executable: ./data.txt", 1),
            (
                &["--no-python", "-m", "x"],
                &[],
                "don't use both the '--no-python' flag and the '--module' flag at the same time",
                2,
            ),
            (&["t.py"], &[("PYTHON_EXEC", "/missing/python")], "python interpreter not found: PYTHON_EXEC=/missing/python", 1),
            (&["t.py"], &[("PYTHON_EXEC", "./data.txt")], "python interpreter not found: PYTHON_EXEC=./data.txt", 1),
            (
                &["t.py"],
                &[("PATH", "/nowhere")],
                "python interpreter not found: no python3 or python on PATH (set PYTHON_EXEC or activate a virtualenv)",
                1,
            ),
        ];
        for (argv, env, msg, code) in cases {
            let e = command(argv, env).unwrap_err();
            assert_eq!(e.to_string(), *msg, "{argv:?}");
            assert_eq!(e.exit_code(), *code, "{argv:?}");
        }
        // A missing virtualenv python falls through to PATH.
        let c = command(&["t.py"], &[("VIRTUAL_ENV", "/gone")]).unwrap();
        assert_eq!(c.program, PathBuf::from("/usr/bin/python3"));
    }

    #[test]
    fn full_resolution_keeps_every_field() {
        let c = ok(&[
            "--nproc-per-node",
            "3",
            "--max-restarts",
            "2",
            "--role",
            "trainer",
            "--virtual-local-rank",
            "--report-json",
            "/tmp/r.json",
            "--shutdown-timeout",
            "4",
            "t.py",
            "x",
        ]);
        assert_eq!(c.nproc_per_node, 3);
        assert_eq!(c.nnodes, NodeRange { min: 1, max: 1 });
        assert_eq!(c.node_rank, 0);
        assert_eq!(c.max_restarts, 2);
        assert_eq!(c.role, "trainer");
        assert!(c.virtual_local_rank);
        assert_eq!(c.report_json, Some(PathBuf::from("/tmp/r.json")));
        assert_eq!(c.shutdown_timeout, Duration::from_secs(4));
        assert_eq!(c.command.args, vec!["-u", "t.py", "x"]);
        assert_eq!(c.local_addr, None);
    }

    /// The `--run-path` bootstrap writes torch's error-file JSON; needs a python3 on PATH.
    #[test]
    fn run_path_bootstrap_writes_error_file() {
        let Some(python) = find_program("python3", &crate::cli::process_env, &RealHost) else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let dir = std::env::temp_dir().join(format!("rdrun-bootstrap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let script = dir.join("boom.py");
        std::fs::write(&script, "import sys\nassert sys.argv[1:] == ['a', 'b'], sys.argv\nraise ValueError('bad ' + __name__)\n")
            .expect("write script");
        let err_file = dir.join("error.json");
        let out = std::process::Command::new(python)
            .args(["-u", "-c", RUN_PATH_BOOTSTRAP])
            .arg(&script)
            .args(["a", "b"])
            .env("TORCHELASTIC_ERROR_FILE", &err_file)
            .output()
            .expect("run python3");
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&err_file).expect("error file"))
                .expect("json");
        assert_eq!(json["message"]["message"], "ValueError: bad __main__");
        let tb = json["message"]["extraInfo"]["py_callstack"]
            .as_str()
            .expect("callstack");
        assert!(tb.contains("Traceback") && tb.contains("boom.py"), "{tb}");
        let ts = json["message"]["extraInfo"]["timestamp"]
            .as_str()
            .expect("timestamp");
        assert!(ts.parse::<u64>().is_ok(), "{ts}");
        // SystemExit passes through without an error file.
        std::fs::remove_file(&err_file).expect("rm");
        std::fs::write(&script, "import sys\nsys.exit(3)\n").expect("write script");
        let out = std::process::Command::new("python3")
            .args(["-u", "-c", RUN_PATH_BOOTSTRAP])
            .arg(&script)
            .env("TORCHELASTIC_ERROR_FILE", &err_file)
            .output()
            .expect("run python3");
        assert_eq!(out.status.code(), Some(3));
        assert!(!err_file.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
