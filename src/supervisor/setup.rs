//! What a run sets up once, before its first attempt: the worker store (where it listens, which
//! port, which MASTER_ADDR workers get), the host names (the `${hostname}` of
//! log prefixes, the fully qualified name of the failure report) and the one-time notices about
//! the workers' environment; and the narrow settings the agent builds from the config, so that
//! each subsystem's signature says what it reads: what every worker shares and what its spawn
//! spec reads (`worker::RunWorkerEnv`, `worker::WorkerSettings`), what the health checks read
//! (`health::Inputs`, for the gate and for `--dry-run`), and the observer's settings.

use std::os::fd::RawFd;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::resilience::HealthMode;
use crate::config::warm::WarmMode;
use crate::config::{EntrypointKind, LaunchConfig, RdzvBackend};
use crate::health;
use crate::rendezvous::{tcp, Rendezvous};
use crate::store::server::StoreServer;
use crate::supervisor::observe::{ConfigShown, Settings};

use crate::supervisor::group::checkcells::DryRunCells;
use crate::supervisor::group::worker::{self, RunWorkerEnv, WorkerSettings};

/// The worker store of the run and the MASTER_PORT workers get. `None` when workers use another
/// store: the static rendezvous store on node 0 (TORCHELASTIC_USE_AGENT_STORE), or their own
/// (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, dynamic rendezvous only: the rank-0 worker hosts
/// it on a port picked here, as torchrun).
pub(crate) async fn worker_store(
    config: &LaunchConfig,
    rdzv: Option<&Rendezvous>,
) -> Result<(Option<StoreServer>, u16), String> {
    let store = match rdzv {
        Some(r) if r.uses_rendezvous_store() => None,
        _ if config.torch_env.own_worker_store => {
            let host = rdzv.and_then(|r| r.advertised.as_deref());
            return Ok((None, free_port(host, config.master_port)?));
        }
        // c10d: one worker store for the whole run, where this agent's advertised address is;
        // the agent that becomes group rank 0 publishes its port as MASTER_PORT.
        Some(r) => {
            Some(bind_worker_store(r.advertised.as_deref(), config.master_port.unwrap_or(0)).await?)
        }
        // The store serves for the whole run (torchrun's agent store, spec torchrun-compat
        // §2.3); workers connect as TCPStore clients.
        None => Some(bind_store(config).await?),
    };
    let port = store.as_ref().map_or(0, StoreServer::port);
    Ok((store, port))
}

/// What the observer reads of the config (`observe/settings.rs`): its sinks and ports, what
/// every event carries, and what `run_start` shows.
pub(crate) fn observer_settings(config: &LaunchConfig) -> Settings {
    Settings {
        sinks: config.observe.clone(),
        run_id: config.rdzv.run_id.clone(),
        // A round assigns the node rank of a c10d or etcd node; the others know it now.
        known_node_rank: (!config.uses_rendezvous() || config.rdzv.backend == RdzvBackend::Static)
            .then_some(config.node_rank),
        nproc: config.nproc_per_node,
        grace: config.shutdown_timeout,
        log_dir: config.log.log_dir.clone(),
        status_interval: config.run_env.status_interval,
        shown: ConfigShown {
            nnodes: config.nnodes,
            node_rank: config.node_rank,
            rdzv_backend: config.rdzv.backend,
            rdzv_endpoint: config.rdzv.endpoint.clone(),
            standalone: config.standalone,
            master_addr: config.master_addr.clone(),
            master_port: config.master_port,
            max_restarts: config.max_restarts,
            role: config.role.clone(),
            program: config.command.program.clone(),
            args: config.command.args.clone(),
            exit_barrier_timeout: config.exit_barrier_timeout,
            leftovers: config.leftovers,
            hang_detect: config.hang.mode,
        },
    }
}

/// The one-time notices about the workers' environment: CPU binding, torchrun's
/// OMP_NUM_THREADS=1 default when it applies, and a `--wrap` program known to hide the exit
/// status of the rank it runs.
pub(crate) fn log_worker_env(config: &LaunchConfig) {
    worker::log_binding(&config.binding);
    if let Some(w) = &config.console.wrap {
        if let Some(why) = crate::config::console::swallows_exit_status(&w.program, &w.args) {
            tracing::warn!("--wrap: {why}: a wrapped rank that fails can look successful to rdrun (its failure report and restarts see the wrapper's status)");
        }
    }
    if config.binding.omp_threads.is_empty()
        && crate::workerenv::should_set_omp_num_threads(
            config.run_env.var("OMP_NUM_THREADS").as_deref(),
            config.nproc_per_node,
        )
    {
        tracing::warn!(
            "setting OMP_NUM_THREADS=1 for every worker (it is unset and nproc_per_node > 1); set it yourself to tune"
        );
    }
}

/// What the health checks read of the launch (`health::Inputs`), built here once so that the
/// checks never see the whole config; their programs contained by `contain`.
pub(crate) fn health_inputs(config: &LaunchConfig, contain: health::Contain) -> health::Inputs {
    let python = match config.command.kind {
        EntrypointKind::Exec => None,
        _ => Some(config.command.program.clone()),
    };
    let r = &config.resilience;
    let strict = r.health == HealthMode::On;
    // The preload list only under `on` with warm start on (`health::Inputs::preload`).
    let preload = match config.warm.mode {
        WarmMode::Off => Vec::new(),
        _ if !strict => Vec::new(),
        _ => config.warm.preload.clone(),
    };
    health::Inputs {
        python,
        preload,
        log_dir: config.log.log_dir.clone(),
        checkpoint_dir: r.checkpoint_dir.clone(),
        nproc: config.nproc_per_node,
        nics: r.socket_ifnames.clone(),
        cuda_visible: config.run_env.var("CUDA_VISIBLE_DEVICES"),
        path: config.run_env.path.clone(),
        command: r.health_cmd.clone(),
        timeout: r.health_timeout,
        thresholds: health::Thresholds::default(),
        contain,
    }
}

/// `--dry-run`'s health checks: `None` under `--health-check off`; their programs contained in
/// a cgroup made for them alone (`checkcells::DryRunCells`), removed after. Call before any
/// runtime or thread exists.
pub fn dry_run_health(config: &LaunchConfig) -> Option<health::HealthReport> {
    if !health::enabled(config.resilience.health) {
        return None;
    }
    let cells = DryRunCells::create(config.run_env.cgroup);
    let report = health::run_blocking(&health_inputs(config, cells.contain()));
    drop(cells);
    report
}

/// What every worker of the run shares: the signal names, the topology's variables (a hostfile
/// filter's devices), then the pip NCCL shim's, and the watchdog's and the cgroup's descriptors.
pub(crate) fn run_worker_env(
    config: &LaunchConfig,
    watchdog_fd: Option<RawFd>,
    cgroup_fd: Option<RawFd>,
) -> RunWorkerEnv {
    RunWorkerEnv {
        signals_env: crate::workerenv::signal_names(&config.signals_to_handle),
        extra: config
            .cluster
            .worker_env
            .iter()
            .cloned()
            .chain(worker::pip_nccl_env(
                config.command.python.as_deref(),
                &config.run_env,
            ))
            .collect(),
        watchdog_fd,
        cgroup_fd,
    }
}

/// What a worker's spawn spec reads of the launch (`worker::spawn_spec`), and `shared`.
pub(crate) fn worker_settings<'a>(
    config: &'a LaunchConfig,
    shared: &'a RunWorkerEnv,
) -> WorkerSettings<'a> {
    WorkerSettings {
        nproc_per_node: config.nproc_per_node,
        role: &config.role,
        max_restarts: config.max_restarts,
        run_id: &config.rdzv.run_id,
        in_place: config.cluster.in_place.as_ref(),
        virtual_local_rank: config.virtual_local_rank,
        torch_env: &config.torch_env,
        command: &config.command,
        console: &config.console,
        binding: &config.binding,
        run_env: &config.run_env,
        shared,
    }
}

/// This host's name (`gethostname`), or `localhost` when it has none.
pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The failure report's host name (FQDN): looked up in the background from the start, awaited
/// only when a failure report is built, so the lookup never delays the launch.
pub(crate) enum ReportHost {
    Pending(JoinHandle<String>, String),
    Known(String),
}

impl ReportHost {
    /// Starts the lookup of `host`'s FQDN (`host` itself is the fallback).
    pub(crate) fn lookup(host: &str) -> ReportHost {
        let name = host.to_string();
        ReportHost::Pending(
            tokio::spawn(async move { fqdn_of(&name).await }),
            host.to_string(),
        )
    }

    pub(crate) async fn get(&mut self) -> String {
        let name = match self {
            ReportHost::Known(name) => return name.clone(),
            ReportHost::Pending(task, fallback) => task.await.unwrap_or_else(|_| fallback.clone()),
        };
        *self = ReportHost::Known(name.clone());
        name
    }
}

/// The c10d worker store for the whole run, where this agent's advertised address is
/// (`tcp::serve_at`); on `port` (`--master-port`) or one the kernel picks.
pub(crate) async fn bind_worker_store(
    advertised: Option<&str>,
    port: u16,
) -> Result<StoreServer, String> {
    tcp::serve_at(advertised, port)
        .await
        .map_err(|err| format!("cannot bind the worker store: {err}"))
}

/// `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: the MASTER_PORT the rank-0 worker binds for its own
/// store: `--master-port` if given, else a port free on every interface now (torch's
/// `get_free_port`; the worker binds it later, so a race with another process is possible, as
/// under torchrun). `host` (the advertised address) only names the error.
pub(crate) fn free_port(host: Option<&str>, port: Option<u16>) -> Result<u16, String> {
    if let Some(p) = port.filter(|p| *p != 0) {
        return Ok(p);
    }
    std::net::TcpListener::bind("[::]:0")
        .or_else(|_| std::net::TcpListener::bind("0.0.0.0:0"))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|err| {
            format!(
                "cannot find a free port for the workers' own store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) on {}: {err}",
                host.unwrap_or("this host")
            )
        })
}

/// `gethostname` up to the first dot (torchrun's `${hostname}` is `socket.gethostname()`).
pub(crate) fn short_host(host: &str) -> String {
    host.split('.').next().unwrap_or(host).to_string()
}

/// The MASTER_ADDR of a single-node run: the user's `--master-addr` as given (torchrun passes
/// `localhost`, `127.0.0.2`, `::1` through, issue 11.2), or 127.0.0.1 for standalone, the
/// address rdrun then listens on (torchrun gives its FQDN, which may not resolve).
pub(crate) fn single_node_master_addr(config: &LaunchConfig) -> String {
    if config.standalone {
        "127.0.0.1".to_string()
    } else {
        config.master_addr.clone()
    }
}

/// Binds and serves the single-node worker store where its MASTER_ADDR says (`tcp::serve_at`:
/// loopback stays loopback, a specific address is bound alone). The port is `--master-port`
/// (the config's resolved MASTER_PORT) or, when `None`, one the kernel picks; either way the
/// socket stays open from bind to use, so no other process can take it (no probe-then-bind race).
pub(crate) async fn bind_store(config: &LaunchConfig) -> Result<StoreServer, String> {
    let host = (!config.standalone).then_some(config.master_addr.as_str());
    tcp::serve_at(host, config.master_port.unwrap_or(0))
        .await
        .map_err(|err| format!("cannot bind the worker store on {err}"))
}

/// The fully qualified name of `host` for the failure report, as torchrun's `socket.getfqdn()`:
/// the resolver's canonical name when it has a dot, else `host` itself. The lookup is blocking
/// (getaddrinfo), so it runs off the agent's thread and is given up after a short bound: a slow
/// resolver only costs the report its domain.
pub(crate) async fn fqdn_of(host: &str) -> String {
    let name = host.to_string();
    let lookup = tokio::task::spawn_blocking(move || crate::config::canonical_name(&name));
    match tokio::time::timeout(Duration::from_secs(2), lookup).await {
        Ok(Ok(Some(fqdn))) if fqdn.contains('.') || !host.contains('.') => fqdn,
        _ => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_master_addr_reaches_workers_as_given() {
        // Issue 11.2: it used to become 127.0.0.1 for every loopback spelling.
        for addr in ["127.0.0.1", "127.0.0.2", "localhost", "::1", "node1"] {
            assert_eq!(single_node_master_addr(&config(false, addr, Some(1))), addr);
        }
        assert_eq!(
            single_node_master_addr(&config(true, "node1", None)),
            "127.0.0.1"
        );
        assert_eq!(short_host("node1.cluster.local"), "node1");
        assert_eq!(short_host("vm"), "vm");
    }

    use crate::config::testkit::launch_config as config;

    #[test]
    fn report_host_name() {
        // The canonical name of a name the resolver knows (localhost), and the name itself for
        // one it does not.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let unknown = "no-such-host.invalid";
        assert_eq!(rt.block_on(fqdn_of(unknown)), unknown);
        assert!(!rt.block_on(fqdn_of("localhost")).is_empty());
    }
}
