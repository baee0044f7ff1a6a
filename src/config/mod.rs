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

use std::time::Duration;

use crate::cli::{EnvFn, LaunchArgs};
use flags::resolve_logs;

pub mod chaos;
mod cluster;
mod command;
pub mod console;
mod dryrun;
mod endpoint;
mod error;
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
mod spec;
pub mod torchenv;
mod types;
pub mod warm;

pub use command::{
    find_program, find_python, resolve_command, EntrypointKind, WorkerCommand, RUN_PATH_BOOTSTRAP,
};
pub use endpoint::{parse_endpoint, parse_rdzv_conf, uuid4};
pub(crate) use error::invalid;
pub use error::ConfigError;
pub use flags::{
    parse_local_ranks_filter, parse_nnodes, parse_signals, parse_std_spec, resolve_nproc,
    resolve_shutdown_timeout, MAX_NPROC_PER_NODE,
};
pub use host::{canonical_name, FileKind, Host, RealHost};
pub use layout::parse_backend;
pub use spec::*;
pub use types::*;

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
    let (max_restarts, exit_barrier_timeout) = resolve_restart_numbers(&args)?;
    let resilience = resolve_resilience(&args, env)?;
    let leftovers = resolve_leftovers(&args, env)?;
    let run_env = runenv::RunEnv::resolve(env)?;
    let mut hang = resolve_hang(&args, env)?;
    hang.search_path = run_env.path.clone();
    let observe = resolve_observe(&args, env)?;
    let warm = warm::resolve(&args, env)?;
    let conf = parse_rdzv_conf(&args.rdzv_conf)?;
    let node_rank = layout.node_rank.value;
    note_ignored_flags(&args);

    let (standalone, rdzv, master_addr, master_port) =
        endpoint::resolve_rendezvous(&layout, args.local_addr.as_deref(), conf, host)?;

    let mut rdzv = rdzv;
    let rounds = uses_rendezvous(standalone, &rdzv, nnodes);
    if rounds {
        // Typed now, so that a bad value stops the run before anything starts.
        rdzv.settings = Some(rdzv.type_settings(nnodes)?);
    }
    let chaos = resolve_chaos(
        &args,
        env,
        hang.mode == hang::HangMode::Kill,
        rounds && nnodes.max > 1,
    )?;

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
    let console = resolve_console(&args, nproc_per_node, nnodes, env, host)?;
    log.collapse = console.collapse_for(nproc_per_node, log.local_ranks_filter.as_deref());
    log.progress = console.progress_for(nproc_per_node, log.local_ranks_filter.as_deref());
    if args.virtual_local_rank {
        check_virtual_devices(nproc_per_node, env)?;
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
        exit_barrier_timeout,
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
        chaos,
    };
    cfg.cluster = cluster::plan(detected, &args, &layout, &cfg)?;
    if cfg.cluster.dry_run.is_some() {
        add_dry_run_preview(&mut cfg, &layout);
    }
    Ok(cfg)
}

/// `--max-restarts` (as a count) and `--exit-barrier-timeout`, with `--monitor-interval`
/// checked on the way: the numbers of the restart loop, each a usage error when out of range.
fn resolve_restart_numbers(args: &LaunchArgs) -> Result<(u32, Duration), ConfigError> {
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
    Ok((
        max_restarts,
        Duration::from_secs_f64(args.exit_barrier_timeout),
    ))
}

/// The stop verdict, health checks, failure memory and node exclusion flags.
fn resolve_resilience(
    args: &LaunchArgs,
    env: EnvFn<'_>,
) -> Result<resilience::Resilience, ConfigError> {
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
    resilience::resolve_nodes(&mut resilience, args)?;
    Ok(resilience)
}

/// `--leftovers` (or RDRUN_LEFTOVERS): what to do with processes that outlive the workers.
fn resolve_leftovers(args: &LaunchArgs, env: EnvFn<'_>) -> Result<LeftoverPolicy, ConfigError> {
    match args.leftovers.clone().or_else(|| env("RDRUN_LEFTOVERS")) {
        None => Ok(LeftoverPolicy::default()),
        Some(text) => LeftoverPolicy::parse(&text).ok_or_else(|| {
            invalid(
                "--leftovers",
                text.clone(),
                "must be kill, wait or leave (also RDRUN_LEFTOVERS)",
            )
        }),
    }
}

/// torchrun flags rdrun accepts but has no use for: said once, never an error.
fn note_ignored_flags(args: &LaunchArgs) {
    if args.start_method != "spawn" {
        tracing::info!(
            "--start-method {} is ignored: rdrun starts every worker as a new process",
            args.start_method
        );
    }
    if args.run_path && args.module {
        tracing::warn!("--module is ignored with --run-path (as torchrun)");
    }
}

/// The console's flags (`--wrap`, `--stdin`, `--output`, `--progress`, `--debug-rank`), checked
/// against the whole job's rank count.
fn resolve_console(
    args: &LaunchArgs,
    nproc_per_node: usize,
    nnodes: NodeRange,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<console::ConsoleSettings, ConfigError> {
    console::resolve(
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
    )
}

/// `--virtual-local-rank`: every local rank's device list is checked before any worker starts,
/// not when the first surplus rank is spawned.
fn check_virtual_devices(nproc_per_node: usize, env: EnvFn<'_>) -> Result<(), ConfigError> {
    for local_rank in 0..nproc_per_node {
        crate::workerenv::virtual_local_rank_devices(
            local_rank,
            env("HIP_VISIBLE_DEVICES").as_deref(),
            env("CUDA_VISIBLE_DEVICES").as_deref(),
        )?;
    }
    Ok(())
}

/// A dry run's "what the run would do" rows. Standalone, or no `--rdzv-id` elsewhere: the real
/// run makes its own id up at launch, so the one made up here is not shown as if it were the
/// run's.
fn add_dry_run_preview(cfg: &mut LaunchConfig, layout: &layout::Layout) {
    let fresh = cfg.standalone || layout.run_id.value.is_empty();
    if fresh {
        cfg.cluster.topology.fields.run_id = None;
    }
    cfg.cluster.run = Some(dryrun::preview(cfg, fresh));
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
/// `--chaos`, else `RDRUN_CHAOS` (an empty value is unset); `--chaos-progress` alone is kept
/// so that the run can refuse it without `--chaos`.
///
/// Checked here, so that a bad spec is a usage error (exit 2) before anything starts: the
/// grammar, the regular expression, and what the spec asks of the run (`hang_kills`: hang
/// detection stops a hung group; `multi_node`: the run holds a multi-node rendezvous).
fn resolve_chaos(
    args: &LaunchArgs,
    env: EnvFn<'_>,
    hang_kills: bool,
    multi_node: bool,
) -> Result<Option<ChaosSettings>, ConfigError> {
    let given = |flag: &Option<String>, var: &str| {
        flag.clone()
            .or_else(|| env(var))
            .filter(|v| !v.trim().is_empty())
    };
    let spec = given(&args.chaos, "RDRUN_CHAOS");
    let progress = given(&args.chaos_progress, "RDRUN_CHAOS_PROGRESS");
    if spec.is_none() && progress.is_none() {
        return Ok(None);
    }
    let typed = chaos::parse(spec.as_deref().unwrap_or("")).map_err(ConfigError::Chaos)?;
    if let Some(p) = &progress {
        if let Err(e) = regex::Regex::new(p) {
            let text = e.to_string();
            let last = text.lines().last().unwrap_or("").trim().to_string();
            return Err(ConfigError::Chaos(format!(
                "--chaos-progress {p:?}: not a regular expression ({last})"
            )));
        }
    }
    chaos::check_plan(&typed, progress.is_some(), hang_kills, multi_node)
        .map_err(ConfigError::Chaos)?;
    Ok(Some(ChaosSettings {
        spec: typed,
        progress,
    }))
}

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
