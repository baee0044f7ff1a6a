//! The agent: the one owner of the local worker group's state. It hosts the worker store, runs
//! attempts (spawn every local rank, watch, stop), decides restarts through [`restart::decide`],
//! and turns the end of the run into an exit code.
//!
//! Everything reaches it as an [`Event`]: SIGCHLD (then `waitpid(-1)` reaps every descendant, as
//! rdrun is a child subreaper), handled signals, and stop deadlines. It never polls. Worker output
//! goes through [`output::forward_until`]; failures are rendered by [`report`]; the agent only
//! decides. The worker store ([`StoreServer`]) lives as long as the run and is cleared between
//! attempts.
//!
//! Multi-node ([`uses_rendezvous`]): every attempt starts with a rendezvous round
//! ([`Rendezvous::next_round`]) whose [`Assignment`] gives the ranks, and the attempt also
//! watches the rendezvous: a membership change (late joiner, lost peer, another node's restart)
//! stops the workers and joins the next round without charging a restart; the restart budget is
//! the job-wide `asg.restart_count`. Static jobs give the workers the rendezvous store itself
//! (MASTER_ADDR:PORT = the endpoint); c10d agents serve one worker store on every interface and
//! publish its port each round.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{self, LaunchConfig, RdzvBackend};
use crate::exit::{self, WorkerStatus};
use crate::rendezvous::{
    Assignment, RdzvEvent, Rendezvous, RendezvousError, RoundReason, RoundRequest,
};
use crate::store::server::{self, ServerConfig, ServerExit, StoreServer};
use crate::workerenv::WorkerEnv;

use super::events::Event;
use super::ncclpath;
use super::output::{self, OutputSummary, RankIdentity, RunLogs};
use super::report::{self, Failure, FailureReport};
use super::restart::{self, AttemptEnd, Decision};
use super::signals::{self, SignalAction, SignalReaction, Signals};
use super::watchdog::Watchdog;
use super::worker::{self, SpawnSpec};

/// How long rdrun waits for processes to disappear after SIGKILL before it gives up on them
/// (a process in uninterruptible sleep cannot die until its I/O ends).
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a node that does not host the rendezvous store tries to close the rendezvous after
/// a successful exit barrier (the host closes it anyway and may be gone already).
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long rdrun waits for a worker's output pipes to close once its processes are gone (a
/// pipe may still be held by a process rdrun cannot kill).
const OUTPUT_WAIT: Duration = Duration::from_secs(2);

/// Runs one launch to the end and returns the process exit code (see [`crate::exit`]).
///
/// Call it from the main thread: workers are spawned on the calling thread (a current-thread
/// tokio runtime), and their PR_SET_PDEATHSIG fires when that thread ends.
pub fn run(config: LaunchConfig) -> i32 {
    if config.nproc_per_node == 0 {
        eprintln!("rdrun: error: --nproc-per-node must be at least 1");
        return exit::LAUNCHER_FAILURE;
    }
    // SAFETY: plain syscalls without arguments.
    if unsafe { libc::gettid() != libc::getpid() } {
        tracing::warn!(
            "supervisor::run is not on the main thread: workers get SIGKILL when this thread ends"
        );
    }
    // Forked first, while the process has a single thread.
    // Containment hook: the watchdog creates the run's cgroup; dropping it removes the cgroup.
    let watchdog = match Watchdog::start(&config.rdzv.run_id) {
        Ok(w) => Some(w),
        Err(err) => {
            tracing::warn!(
                "cannot start the watchdog, grandchildren may outlive a killed rdrun: {err}"
            );
            None
        }
    };
    // SAFETY: plain prctl(2) call. As child subreaper, rdrun inherits orphaned descendants of its
    // workers, so it can reap and kill them, and it is a correct PID 1 in a container.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == -1 {
        tracing::warn!(
            "cannot become child subreaper: {}",
            std::io::Error::last_os_error()
        );
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("rdrun: error: cannot start the async runtime: {err}");
            return exit::LAUNCHER_FAILURE;
        }
    };
    let code = runtime.block_on(Agent::run(config, watchdog));
    // Signal-forwarding tasks never end on their own.
    runtime.shutdown_background();
    code
}

/// One worker of the current attempt.
#[derive(Debug)]
struct Slot {
    local_rank: usize,
    rank: usize,
    /// Process id = process group id = session id.
    pid: i32,
    status: Option<WorkerStatus>,
    output: Option<JoinHandle<OutputSummary>>,
    error_file: Option<PathBuf>,
}

impl Slot {
    /// This worker's entry for the failure report (stderr tail and traceback come later, from
    /// its output task).
    fn failure(&self, status: WorkerStatus, observed_at: SystemTime, abandoned: bool) -> Failure {
        Failure {
            local_rank: self.local_rank,
            rank: self.rank,
            pid: self.pid as u32,
            status,
            observed_at,
            error_file: self.error_file.clone(),
            stderr_tail: Vec::new(),
            traceback: None,
            abandoned,
        }
    }
}

/// Where the current attempt's stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Workers run; nothing asked them to stop.
    None,
    /// The stop signal went out; SIGKILL at the deadline.
    Grace(Instant),
    /// SIGKILL went out; give up on what is left at the deadline.
    Killed(Instant),
}

impl Stop {
    fn deadline(self) -> Option<Instant> {
        match self {
            Stop::None => None,
            Stop::Grace(d) | Stop::Killed(d) => Some(d),
        }
    }
}

/// How one attempt ended, with what the report needs.
#[derive(Debug)]
enum Outcome {
    Succeeded,
    Failed(Vec<Failure>),
    Interrupted {
        signal: i32,
        failures: Vec<Failure>,
    },
    LauncherError(String),
    /// The rendezvous membership changed (multi-node): join the next round with `reason`.
    Regroup {
        reason: RoundReason,
        lost: Vec<String>,
    },
    /// The rendezvous was closed or its store became unreachable: the run cannot go on.
    RendezvousLost(String),
}

/// Kills every process group it holds when dropped while armed (a panic in the agent).
#[derive(Debug, Default)]
struct GroupGuard {
    pgids: Vec<i32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        for &pgid in &self.pgids {
            worker::signal_group(pgid, libc::SIGKILL);
        }
    }
}

struct Agent {
    config: LaunchConfig,
    watchdog: Option<Watchdog>,
    signals: Signals,
    sigchld: Signal,
    host: String,
    master_addr: String,
    master_port: u16,
    /// TORCHELASTIC_SIGNALS_TO_HANDLE for every worker.
    signals_env: String,
    /// Extra worker variables computed once per run (LD_LIBRARY_PATH for a pip NCCL).
    extra_env: Vec<(String, String)>,
    /// Grace between the stop signal and SIGKILL, for every kind of stop.
    grace: Duration,
    /// The worker store (TCPStore-compatible), for the whole run; taken at shutdown.
    store: Option<StoreServer>,
    /// Resolves if the store stops serving on its own (then the run cannot go on).
    store_closed: Pin<Box<dyn Future<Output = ServerExit> + Send>>,
    /// Why the store stopped, once it did.
    store_failed: Option<String>,
    /// The rendezvous of a multi-node run (`None`: single node, no rounds).
    rdzv: Option<Rendezvous>,
    /// How the rendezvous ended the current attempt (`Regroup` or `RendezvousLost`), if it did.
    rdzv_end: Option<Outcome>,
}

impl Agent {
    async fn run(config: LaunchConfig, watchdog: Option<Watchdog>) -> i32 {
        // Handlers first: from here on no handled signal can kill rdrun with workers left behind.
        let signals = Signals::install(&config.signals_to_handle);
        let sigchld = match signal(SignalKind::child()) {
            Ok(s) => s,
            Err(err) => {
                eprintln!("rdrun: error: cannot watch child processes (SIGCHLD): {err}");
                return exit::LAUNCHER_FAILURE;
            }
        };
        let mut signals = signals;
        // Every worker holds one store connection (one descriptor here).
        if let Err(err) = server::raise_nofile_limit() {
            tracing::debug!("cannot raise the open-file limit: {err}");
        }
        let mut rdzv = None;
        if uses_rendezvous(&config) {
            match until_shutdown(&mut signals, Rendezvous::start(&config)).await {
                Ok(Ok(r)) => rdzv = Some(r),
                Ok(Err(err)) => {
                    eprintln!("rdrun: error: {}", error_chain(&err));
                    return exit::LAUNCHER_FAILURE;
                }
                Err(sig) => {
                    tracing::warn!(
                        "received {} during the rendezvous, exiting",
                        signals::name(sig)
                    );
                    return exit::for_signal(sig);
                }
            }
        }
        let store = match &rdzv {
            // Static: workers use the rendezvous store on node 0 (TORCHELASTIC_USE_AGENT_STORE).
            Some(r) if r.uses_rendezvous_store() => None,
            // c10d: one worker store on every interface for the whole run; the agent that becomes
            // group rank 0 publishes its port as MASTER_PORT.
            Some(_) => match bind_worker_store_any(config.master_port.unwrap_or(0)) {
                Ok(store) => Some(store),
                Err(msg) => {
                    eprintln!("rdrun: error: {msg}");
                    return exit::LAUNCHER_FAILURE;
                }
            },
            None => {
                let (listener, _) = match bind_store(&config) {
                    Ok(v) => v,
                    Err(msg) => {
                        eprintln!("rdrun: error: {msg}");
                        return exit::LAUNCHER_FAILURE;
                    }
                };
                // The store serves the very socket bound above, for the whole run (torchrun's
                // agent store, spec torchrun-compat §2.3); workers connect as TCPStore clients.
                match StoreServer::start(listener, ServerConfig::default()) {
                    Ok(store) => Some(store),
                    Err(err) => {
                        eprintln!("rdrun: error: cannot start the worker store: {err}");
                        return exit::LAUNCHER_FAILURE;
                    }
                }
            }
        };
        let master_addr = if config.standalone || is_loopback(&config.master_addr) {
            "127.0.0.1".to_string()
        } else {
            config.master_addr.clone()
        };
        let master_port = store.as_ref().map_or(0, StoreServer::port);
        let store_closed: Pin<Box<dyn Future<Output = ServerExit> + Send>> = match &store {
            Some(s) => Box::pin(s.closed()),
            None => Box::pin(std::future::pending()),
        };
        tracing::debug!(%master_addr, master_port, "worker store serving");
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_string());
        if config::should_set_omp_num_threads(
            std::env::var("OMP_NUM_THREADS").ok().as_deref(),
            config.nproc_per_node,
        ) {
            tracing::warn!(
                "setting OMP_NUM_THREADS=1 for every worker (it is unset and nproc_per_node > 1); set it yourself to tune"
            );
        }
        let grace = config.shutdown_timeout;
        let signals_env = config::signal_names(&config.signals_to_handle);
        let extra_env = pip_nccl_env(&config);
        let mut agent = Agent {
            config,
            watchdog,
            signals,
            sigchld,
            host,
            master_addr,
            master_port,
            signals_env,
            extra_env,
            grace,
            store,
            store_closed,
            store_failed: None,
            rdzv,
            rdzv_end: None,
        };
        let code = agent.attempts().await;
        // The runtime unlinks its shared-memory segments once every rank has opened them; a
        // crash during that setup leaves one behind. The shared default id "none" may belong to
        // a concurrent job, so only a run-specific id is swept.
        if agent.config.rdzv.run_id != "none" {
            match crate::workerenv::cleanup_run_shm(&agent.config.rdzv.run_id) {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} shared-memory segment(s) left by workers"),
                Err(err) => tracing::debug!("shared-memory cleanup skipped: {err}"),
            }
        }
        if let Some(store) = agent.store.take() {
            store.shutdown().await;
        }
        if let Some(rdzv) = agent.rdzv.take() {
            if let Some(server) = rdzv.server {
                server.shutdown().await;
            }
        }
        if let Some(w) = agent.watchdog.take() {
            w.disarm();
            // Containment hook: removes the cgroup, ends and reaps the watchdog.
            drop(w);
        }
        code
    }

    /// The restart loop (one rendezvous round per attempt when multi-node).
    async fn attempts(&mut self) -> i32 {
        let mut logs = RunLogs::new(&self.config.log, &self.config.rdzv.run_id);
        let mut restart_count = 0u32;
        let mut reason = RoundReason::Initial;
        let code = loop {
            // A shutdown signal that arrived between attempts ends the run before a new spawn.
            while let Some(sig) = self.signals.try_recv() {
                if signals::action(sig) == SignalAction::Shutdown {
                    tracing::warn!(
                        "received {} before the workers started, exiting",
                        signals::name(sig)
                    );
                    self.forget_dir();
                    logs.finish();
                    return exit::for_signal(sig);
                }
            }
            let asg = match self.rdzv.is_some() {
                true => match self.join_round(reason).await {
                    Ok(asg) => asg,
                    Err(code) => break code,
                },
                false => self.single_node_assignment(restart_count, reason),
            };
            restart_count = asg.restart_count;
            let outcome = self.attempt(&mut logs, &asg).await;
            let end = match &outcome {
                Outcome::Succeeded => AttemptEnd::Succeeded,
                Outcome::Failed(_) => AttemptEnd::Failed,
                Outcome::Interrupted { .. } => AttemptEnd::Interrupted,
                Outcome::LauncherError(_) | Outcome::RendezvousLost(_) => AttemptEnd::LauncherError,
                Outcome::Regroup { .. } => AttemptEnd::Failed,
            };
            match (
                restart::decide(end, restart_count, self.config.max_restarts),
                outcome,
            ) {
                (_, Outcome::Regroup { reason: why, lost })
                    if why != RoundReason::PeerLost || restart_count < self.config.max_restarts =>
                {
                    if lost.is_empty() {
                        tracing::warn!("rendezvous membership changed; stopping the workers and joining the next round");
                    } else {
                        tracing::warn!(?lost, "peer node(s) stopped heartbeating; stopping the workers and joining the next round");
                    }
                    self.between_attempts();
                    reason = why;
                }
                (_, Outcome::Regroup { lost, .. }) => {
                    eprintln!(
                        "rdrun: error: node(s) {} of the static job stopped heartbeating and no restarts are left ({} used)",
                        lost.join(", "),
                        restart_count
                    );
                    self.close_rdzv().await;
                    break exit::LAUNCHER_FAILURE;
                }
                (_, Outcome::RendezvousLost(msg)) => {
                    eprintln!("rdrun: error: {msg}");
                    break exit::LAUNCHER_FAILURE;
                }
                (Decision::Finish, _) => {
                    self.finish_rdzv(&asg).await;
                    break exit::SUCCESS;
                }
                (
                    Decision::Restart {
                        restart_count: next,
                    },
                    _,
                ) => {
                    tracing::warn!(
                        "worker group failed; {}/{} restarts left, restarting (attempt {next})",
                        self.config.max_restarts - restart_count,
                        self.config.max_restarts
                    );
                    self.between_attempts();
                    restart_count = next;
                    reason = RoundReason::WorkerFailure;
                }
                (_, Outcome::LauncherError(msg)) => {
                    self.close_rdzv().await;
                    eprintln!("rdrun: error: {msg}");
                    break exit::LAUNCHER_FAILURE;
                }
                (_, Outcome::Interrupted { signal, failures }) => {
                    // As torchrun: a signalled agent leaves the rendezvous open, so that the
                    // node can come back (preemption) and the others carry on (c10d).
                    if !failures.is_empty() {
                        self.print_report(failures);
                    }
                    tracing::warn!("stopped the workers after {}", signals::name(signal));
                    break exit::for_signal(signal);
                }
                (_, Outcome::Failed(failures)) => {
                    self.close_rdzv().await;
                    break self.print_report(failures);
                }
                (_, Outcome::Succeeded) => break exit::SUCCESS,
            }
        };
        // Before finish: what finish keeps (error files the report named) must stay even if
        // rdrun is killed right after.
        self.forget_dir();
        logs.finish();
        code
    }

    /// Between two attempts: the new one must see none of the previous attempt's keys (torchrun
    /// bug pytorch/pytorch#135712: a stale NCCL unique id reused after a restart).
    fn between_attempts(&self) {
        if let Some(store) = &self.store {
            store.clear();
        }
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
    }

    /// The single-node "round": this node alone, counted locally.
    fn single_node_assignment(&self, restart_count: u32, reason: RoundReason) -> Assignment {
        let nproc = self.config.nproc_per_node;
        Assignment {
            round: u64::from(restart_count),
            group_rank: 0,
            group_world_size: 1,
            local_world_size: nproc,
            base_rank: 0,
            world_size: nproc,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            restart_count,
            reason,
            store_prefix: String::new(),
            nodes: Vec::new(),
        }
    }

    /// Joins the next rendezvous round; on failure prints why and returns the exit code.
    async fn join_round(&mut self, reason: RoundReason) -> Result<Assignment, i32> {
        let rdzv = self.rdzv.as_mut().expect("multi-node run has a rendezvous");
        let req = RoundRequest {
            reason,
            master_port: self.master_port,
        };
        match until_shutdown(&mut self.signals, rdzv.next_round(req)).await {
            Ok(Ok(asg)) => {
                tracing::info!(
                    round = asg.round,
                    group_rank = asg.group_rank,
                    group_world_size = asg.group_world_size,
                    world_size = asg.world_size,
                    restart_count = asg.restart_count,
                    master = %format!("{}:{}", asg.master_addr, asg.master_port),
                    "rendezvous round complete"
                );
                Ok(asg)
            }
            Ok(Err(RendezvousError::Closed { redundant: true })) => {
                tracing::warn!("the job finished while this node waited to join; nothing to do");
                Err(exit::SUCCESS)
            }
            Ok(Err(err)) => {
                eprintln!("rdrun: error: {}", error_chain(&err));
                Err(exit::LAUNCHER_FAILURE)
            }
            Err(sig) => {
                tracing::warn!(
                    "received {} during the rendezvous, exiting",
                    signals::name(sig)
                );
                Err(exit::for_signal(sig))
            }
        }
    }

    /// After local success: the exit barrier (errors are only logged, as torchrun), then close.
    async fn finish_rdzv(&mut self, asg: &Assignment) {
        let Some(rdzv) = self.rdzv.as_ref() else {
            return;
        };
        let timeout = self.config.exit_barrier_timeout;
        match until_shutdown(&mut self.signals, rdzv.exit_barrier(asg, timeout)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::error!("exit barrier: {}", error_chain(&err)),
            Err(sig) => {
                tracing::warn!("received {} in the exit barrier", signals::name(sig));
                return;
            }
        }
        // The store's host lingers in the barrier until every agent has departed, then closes
        // (for nodes still waiting to join). The others try briefly: the host may be gone.
        if rdzv.server.is_some() {
            self.close_rdzv().await;
        } else if tokio::time::timeout(CLOSE_WAIT, self.close_rdzv_quiet())
            .await
            .is_err()
        {
            tracing::debug!("rendezvous store gone after the exit barrier; not closing it");
        }
    }

    /// [`Agent::close_rdzv`] with failures at debug level (the store may be gone already).
    async fn close_rdzv_quiet(&mut self) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            if let Err(err) = rdzv.close().await {
                tracing::debug!("cannot close the rendezvous: {}", error_chain(&err));
            }
        }
    }

    /// Closes the rendezvous for every node (the job is over); errors are only logged.
    async fn close_rdzv(&mut self) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            if let Err(err) = rdzv.close().await {
                tracing::warn!("cannot close the rendezvous: {}", error_chain(&err));
            }
        }
    }

    fn forget_dir(&self) {
        if let Some(w) = &self.watchdog {
            w.forget_dir();
        }
    }

    /// Prints the failure summary and returns the root cause's exit code.
    fn print_report(&self, failures: Vec<Failure>) -> i32 {
        let report = FailureReport {
            name: self.config.command.display_name.clone(),
            host: self.host.clone(),
            failures,
        };
        let code = report::root_cause(&report.failures)
            .map(|i| report.failures[i].status.launcher_exit_code())
            .unwrap_or(exit::LAUNCHER_FAILURE);
        eprintln!("{}", report::render(&report));
        if let Some(path) = &self.config.report_json {
            if let Err(err) = report::write_json(path, &report) {
                tracing::error!("--report-json: {err}");
            }
        }
        // Nested under a scheduler that gave rdrun its own error file: copy the root cause there,
        // as torchrun's @record-wrapped main does (spec torchrun-compat §3.9).
        match std::env::var_os("TORCHELASTIC_ERROR_FILE").filter(|p| !p.is_empty()) {
            Some(parent) => {
                if let Err(err) = report::copy_to_parent_error_file(Path::new(&parent), &report) {
                    tracing::error!("cannot copy the root cause to TORCHELASTIC_ERROR_FILE: {err}");
                }
            }
            None => tracing::debug!("no error file defined for parent, to copy child error file"),
        }
        code
    }

    /// One attempt: spawn every local rank, supervise until the group is gone, collect failures.
    async fn attempt(&mut self, logs: &mut RunLogs, asg: &Assignment) -> Outcome {
        let nproc = self.config.nproc_per_node;
        let restart_count = asg.restart_count;
        let ids: Vec<RankIdentity> = (0..nproc)
            .map(|lr| RankIdentity {
                role: self.config.role.clone(),
                rank: asg.base_rank + lr,
                local_rank: lr,
                hostname: short_host(&self.host),
            })
            .collect();
        let attempt_logs = logs.attempt(restart_count, &ids);
        if let Some(w) = &self.watchdog {
            match logs.disposable_dir() {
                Some(dir) => w.set_dir(dir),
                None => w.forget_dir(),
            }
        }
        let attempt_logs = match attempt_logs {
            Ok(a) => a,
            Err(err) => {
                return Outcome::LauncherError(format!("cannot prepare the log directory: {err}"))
            }
        };
        let mut guard = GroupGuard::default();
        // Ends the output forwarders whose pipes stay open after every process rdrun can see is
        // gone (a descendant that escaped and outlived the stop).
        let (stop_output, _) = tokio::sync::watch::channel(false);
        let mut slots: Vec<Slot> = Vec::with_capacity(nproc);
        let mut launch_error = None;
        for (lr, id) in ids.iter().enumerate() {
            let rank_logs = &attempt_logs.ranks[lr];
            // ROLE_RANK/ROLE_WORLD_SIZE equal RANK/WORLD_SIZE: every node runs one role.
            let contract = WorkerEnv {
                rank: asg.base_rank + lr,
                local_rank: lr,
                world_size: asg.world_size,
                local_world_size: nproc,
                group_rank: asg.group_rank,
                group_world_size: asg.group_world_size,
                role_rank: asg.base_rank + lr,
                role_world_size: asg.world_size,
                role_name: self.config.role.clone(),
                master_addr: asg.master_addr.clone(),
                master_port: asg.master_port,
                restart_count,
                max_restarts: self.config.max_restarts,
                run_id: self.config.rdzv.run_id.clone(),
                use_agent_store: true,
                error_file: rank_logs.error_file.clone(),
            };
            let env = match worker::worker_env(
                &contract,
                nproc,
                &self.signals_env,
                self.config.virtual_local_rank,
                |k| std::env::var(k).ok(),
            ) {
                Ok(mut env) => {
                    env.extend(self.extra_env.iter().cloned());
                    env
                }
                Err(err) => {
                    launch_error = Some(err.to_string());
                    break;
                }
            };
            let spec = SpawnSpec {
                program: self.config.command.program.clone(),
                args: self
                    .config
                    .command
                    .args
                    .iter()
                    .map(|a| config::substitute_local_rank(a, lr))
                    .collect(),
                env,
                watchdog_fd: self.watchdog.as_ref().map(Watchdog::fd),
                cgroup_fd: self.watchdog.as_ref().and_then(Watchdog::cgroup_fd),
            };
            match worker::spawn(&spec) {
                Ok(spawned) => {
                    tracing::debug!(local_rank = lr, pid = spawned.pid, "worker started");
                    guard.pgids.push(spawned.pid);
                    let handle = output::forward_until(
                        id.clone(),
                        rank_logs.sink.clone(),
                        spawned.stdout,
                        spawned.stderr,
                        stop_output.subscribe(),
                    );
                    slots.push(Slot {
                        local_rank: lr,
                        rank: asg.base_rank + lr,
                        pid: spawned.pid,
                        status: None,
                        output: Some(handle),
                        error_file: Some(rank_logs.error_file.as_str())
                            .filter(|s| !s.is_empty())
                            .map(PathBuf::from),
                    });
                }
                Err(err) => {
                    let mut msg = match std::error::Error::source(&err) {
                        Some(src) => format!("{err}: {src}"),
                        None => err.to_string(),
                    };
                    // execve(2) says ENOENT also when the file exists but its `#!` interpreter
                    // (or dynamic loader) does not.
                    let worker::SpawnError::Exec { program, source } = &err;
                    if source.kind() == std::io::ErrorKind::NotFound && program.is_file() {
                        msg.push_str(" (the file exists: its interpreter or loader is missing)");
                    }
                    launch_error = Some(msg);
                    break;
                }
            }
        }
        let outcome = self.supervise(&mut slots, launch_error, &stop_output).await;
        // Everything is stopped (or abandoned after SIGKILL): the drop guard has nothing to do.
        guard.pgids.clear();
        outcome
    }

    /// Watches the attempt's workers until none is left, stopping the group on the first failure
    /// or on a shutdown signal.
    async fn supervise(
        &mut self,
        slots: &mut [Slot],
        mut launch_error: Option<String>,
        stop_output: &tokio::sync::watch::Sender<bool>,
    ) -> Outcome {
        let by_pid: HashMap<i32, usize> =
            slots.iter().enumerate().map(|(i, s)| (s.pid, i)).collect();
        let pgids: Vec<i32> = slots.iter().map(|s| s.pid).collect();
        let mut failures: Vec<Failure> = Vec::new();
        let mut failed_slots: Vec<usize> = Vec::new();
        let mut interrupted: Option<i32> = None;
        self.rdzv_end = None;
        let mut stop = Stop::None;
        if launch_error.is_some() {
            stop = self.begin_stop(&pgids, libc::SIGTERM);
        }
        // Exits that happened before the SIGCHLD stream saw them are picked up here.
        let mut pending: Vec<Event> = Vec::new();
        for (pid, status) in worker::reap() {
            pending.push(Event::Reaped { pid, status });
        }
        loop {
            for event in pending.drain(..) {
                match event {
                    Event::Reaped { pid, status } => {
                        let Some(&i) = by_pid.get(&pid) else {
                            tracing::debug!(pid, ?status, "reaped a descendant");
                            continue;
                        };
                        slots[i].status = Some(status);
                        if !status.success() {
                            failed_slots.push(i);
                        }
                    }
                    Event::Signal(sig) => {
                        let in_grace = matches!(stop, Stop::Grace(_));
                        match signals::react(sig, interrupted.is_some(), in_grace) {
                            SignalReaction::Forward => {
                                tracing::info!("forwarding {} to the workers", signals::name(sig));
                                self.signal_everything(&pgids, sig);
                            }
                            SignalReaction::Shutdown => {
                                tracing::warn!(
                                    "received {}, shutting down the workers",
                                    signals::name(sig)
                                );
                                interrupted = Some(sig);
                                self.signal_everything(&pgids, sig);
                                if stop == Stop::None {
                                    stop = Stop::Grace(Instant::now() + self.grace);
                                }
                            }
                            SignalReaction::KillNow => {
                                tracing::warn!(
                                    "received {} again, killing the workers now",
                                    signals::name(sig)
                                );
                                stop = self.kill_all(&pgids);
                            }
                        }
                    }
                    Event::Rendezvous(ev) => {
                        let end = rendezvous_end(
                            ev,
                            self.rdzv
                                .as_ref()
                                .is_some_and(Rendezvous::uses_rendezvous_store),
                        );
                        let lost = matches!(end, Outcome::RendezvousLost(_));
                        // After this node's own failure the failure decides: its restart joins
                        // whatever round the others started.
                        let own_failure = !failures.is_empty() || !failed_slots.is_empty();
                        if lost
                            || (!own_failure && interrupted.is_none() && self.rdzv_end.is_none())
                        {
                            tracing::info!(?end, "rendezvous event; stopping the workers");
                            self.rdzv_end = Some(end);
                            if stop == Stop::None {
                                stop = self.begin_stop(&pgids, libc::SIGTERM);
                            }
                        }
                    }
                    Event::StoreStopped(why) => {
                        tracing::error!("the worker store stopped ({why}); stopping the workers");
                        if launch_error.is_none() {
                            launch_error = Some(format!("the worker store stopped: {why}"));
                        }
                        if stop == Stop::None {
                            stop = self.begin_stop(&pgids, libc::SIGTERM);
                        }
                    }
                    Event::Deadline => match stop {
                        Stop::None => {}
                        Stop::Grace(_) => {
                            for s in slots.iter().filter(|s| s.status.is_none()) {
                                tracing::warn!(
                                    pid = s.pid,
                                    local_rank = s.local_rank,
                                    "worker did not stop within {:?}, sending SIGKILL",
                                    self.grace
                                );
                            }
                            stop = self.kill_all(&pgids);
                        }
                        Stop::Killed(_) => {
                            let left = describe_leftovers(&self.leftovers(), slots);
                            tracing::error!(
                                "processes still alive after SIGKILL and {:?} (uninterruptible sleep?), abandoning them: {left}",
                                KILL_WAIT
                            );
                            return self
                                .finish(
                                    slots,
                                    failures,
                                    failed_slots,
                                    interrupted,
                                    launch_error,
                                    stop_output,
                                )
                                .await;
                        }
                    },
                }
            }
            // Failures detected in this batch, in local-rank order, share one timestamp.
            if !failed_slots.is_empty() {
                failed_slots.sort_by_key(|&i| slots[i].local_rank);
                let now = SystemTime::now();
                for &i in &failed_slots {
                    let s = &slots[i];
                    let status = s.status.expect("failed slot has a status");
                    if failures.is_empty() && self.rdzv_end.is_none() {
                        tracing::error!(
                            "failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}",
                            status.torchrun_code(),
                            s.local_rank,
                            s.pid,
                            self.config.command.program.display()
                        );
                    }
                    failures.push(s.failure(status, now, false));
                }
                failed_slots.clear();
                if stop == Stop::None {
                    stop = self.begin_stop(&pgids, libc::SIGTERM);
                }
            }
            let all_exited = slots.iter().all(|s| s.status.is_some());
            if all_exited {
                if self.leftovers().is_empty() {
                    return self
                        .finish(
                            slots,
                            failures,
                            Vec::new(),
                            interrupted,
                            launch_error,
                            stop_output,
                        )
                        .await;
                }
                if stop == Stop::None {
                    // Every worker exited 0: stop whatever they left behind, with the same grace.
                    tracing::info!("workers exited, stopping the processes they left behind");
                    stop = self.begin_stop(&pgids, libc::SIGTERM);
                }
            }
            let deadline = stop.deadline();
            let watch_rdzv =
                self.rdzv.is_some() && !matches!(self.rdzv_end, Some(Outcome::RendezvousLost(_)));
            tokio::select! {
                ev = watch_opt(self.rdzv.as_mut()), if watch_rdzv => pending.push(Event::Rendezvous(ev)),
                _ = self.sigchld.recv() => {
                    for (pid, status) in worker::reap() {
                        pending.push(Event::Reaped { pid, status });
                    }
                }
                sig = self.signals.recv() => pending.push(Event::Signal(sig)),
                exit = &mut self.store_closed, if self.store_failed.is_none() => {
                    let why = match exit {
                        ServerExit::Shutdown => "shut down".to_string(),
                        ServerExit::Failed(msg) => msg,
                    };
                    self.store_failed = Some(why.clone());
                    pending.push(Event::StoreStopped(why));
                }
                _ = sleep_until_opt(deadline), if deadline.is_some() => pending.push(Event::Deadline),
            }
        }
    }

    /// Sends `sig` to every group and to every stray descendant, and starts the grace period.
    fn begin_stop(&self, pgids: &[i32], sig: i32) -> Stop {
        self.signal_everything(pgids, sig);
        Stop::Grace(Instant::now() + self.grace)
    }

    /// Sends `sig` to every worker group and to every descendant that left them (setsid).
    fn signal_everything(&self, pgids: &[i32], sig: i32) {
        for &pgid in pgids {
            tracing::info!(pgid, "sending {} to process group", signals::name(sig));
        }
        forward_to_all(pgids, sig);
        for pid in self.stray_descendants(pgids) {
            tracing::info!(pid, "sending {} to stray descendant", signals::name(sig));
            worker::signal_pid(pid, sig);
        }
    }

    /// SIGKILLs every group and every descendant of rdrun (except the watchdog).
    fn kill_all(&self, pgids: &[i32]) -> Stop {
        forward_to_all(pgids, libc::SIGKILL);
        // Containment hook: everything in the run's cgroup, whatever session it made.
        if let Some(w) = &self.watchdog {
            w.kill_contained();
        }
        for pid in self.descendants() {
            worker::signal_pid(pid, libc::SIGKILL);
        }
        Stop::Killed(Instant::now() + KILL_WAIT)
    }

    /// Live descendants of rdrun, the watchdog excluded. Every member of a worker group is one
    /// (a group only gains members by fork or by setpgid within its session), so this is also
    /// everything left of the attempt.
    fn tree(&self) -> Vec<worker::ProcEntry> {
        let me = std::process::id() as i32;
        let watchdog = self.watchdog.as_ref().map(Watchdog::pid);
        worker::scan_tree(me)
            .into_iter()
            .filter(|p| !p.zombie && Some(p.pid) != watchdog)
            .collect()
    }

    fn descendants(&self) -> Vec<i32> {
        self.tree().into_iter().map(|p| p.pid).collect()
    }

    /// Descendants outside every worker group (they called setsid themselves).
    fn stray_descendants(&self, pgids: &[i32]) -> Vec<i32> {
        self.tree()
            .into_iter()
            .filter(|p| !pgids.contains(&p.pgid))
            .map(|p| p.pid)
            .collect()
    }

    /// Live processes that still belong to the attempt.
    fn leftovers(&self) -> Vec<i32> {
        self.descendants()
    }

    /// Collects output summaries and turns the attempt into an [`Outcome`].
    async fn finish(
        &mut self,
        slots: &mut [Slot],
        mut failures: Vec<Failure>,
        unrecorded: Vec<usize>,
        interrupted: Option<i32>,
        launch_error: Option<String>,
        stop_output: &tokio::sync::watch::Sender<bool>,
    ) -> Outcome {
        // Workers whose exit came in the very last batch (after a deadline) are failures too.
        let now = SystemTime::now();
        for i in unrecorded {
            let s = &slots[i];
            if let Some(status) = s.status.filter(|st| !st.success()) {
                failures.push(s.failure(status, now, false));
            }
        }
        // A worker never reaped after SIGKILL is reported as killed.
        for s in slots.iter().filter(|s| s.status.is_none()) {
            tracing::error!(
                pid = s.pid,
                local_rank = s.local_rank,
                "worker could not be reaped"
            );
            if !failures.iter().any(|f| f.local_rank == s.local_rank) {
                failures.push(s.failure(WorkerStatus::Signaled(libc::SIGKILL), now, true));
            }
        }
        // Output: what is still in the pipes is forwarded; a pipe still held open after
        // OUTPUT_WAIT (by a process rdrun could not kill) is drained and closed on request.
        let deadline = Instant::now() + OUTPUT_WAIT;
        for s in slots.iter_mut() {
            let Some(mut handle) = s.output.take() else {
                continue;
            };
            let summary = tokio::select! {
                res = &mut handle => res.ok(),
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        local_rank = s.local_rank,
                        "output pipes of the worker still open {OUTPUT_WAIT:?} after it ended; closing them"
                    );
                    let _ = stop_output.send(true);
                    match tokio::time::timeout(OUTPUT_WAIT, &mut handle).await {
                        Ok(res) => res.ok(),
                        Err(_) => {
                            handle.abort();
                            None
                        }
                    }
                }
            };
            if let Some(summary) = summary {
                for f in failures.iter_mut().filter(|f| f.local_rank == s.local_rank) {
                    f.set_output(&summary);
                }
            }
        }
        if let Some(msg) = launch_error {
            return Outcome::LauncherError(msg);
        }
        match self.rdzv_end.take() {
            Some(end @ Outcome::RendezvousLost(_)) => return end,
            Some(end) if interrupted.is_none() => return end,
            _ => {}
        }
        if let Some(signal) = interrupted {
            return Outcome::Interrupted { signal, failures };
        }
        if failures.is_empty() {
            Outcome::Succeeded
        } else {
            Outcome::Failed(failures)
        }
    }
}

/// `sig` to every worker group (leaders that already exited included: their group lives on as
/// long as a grandchild is in it, kill(2)).
fn forward_to_all(pgids: &[i32], sig: i32) {
    for &pgid in pgids {
        worker::signal_group(pgid, sig);
    }
}

/// The next rendezvous event; pending forever without a rendezvous.
async fn watch_opt(rdzv: Option<&mut Rendezvous>) -> RdzvEvent {
    match rdzv {
        Some(r) => r.watch().await,
        None => std::future::pending().await,
    }
}

/// What a rendezvous event means for the running attempt. A static job cannot shrink: a lost
/// peer is a failure of the job (charged, `PeerLost`); a c10d job regroups without it.
fn rendezvous_end(ev: RdzvEvent, static_job: bool) -> Outcome {
    match ev {
        RdzvEvent::Closed => Outcome::RendezvousLost(
            "the rendezvous was closed by another node (the job finished or gave up there)".into(),
        ),
        RdzvEvent::StoreUnreachable(msg) => {
            Outcome::RendezvousLost(format!("lost the rendezvous store: {msg}"))
        }
        RdzvEvent::PeersLost(lost) => Outcome::Regroup {
            reason: if static_job {
                RoundReason::PeerLost
            } else {
                RoundReason::Membership
            },
            lost,
        },
        RdzvEvent::NodesWaiting(_) | RdzvEvent::RoundChanged { .. } => Outcome::Regroup {
            reason: RoundReason::Membership,
            lost: Vec::new(),
        },
    }
}

/// Runs `fut` unless a shutdown signal arrives first (then `Err(signal)`). Other handled
/// signals have no worker to go to while no attempt runs; they are logged and dropped.
async fn until_shutdown<T>(signals: &mut Signals, fut: impl Future<Output = T>) -> Result<T, i32> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            v = &mut fut => return Ok(v),
            sig = signals.recv() => {
                if signals::action(sig) == SignalAction::Shutdown {
                    return Err(sig);
                }
                tracing::info!("received {} while no worker runs; ignoring it", signals::name(sig));
            }
        }
    }
}

/// An error and its sources on one line (`a: b: c`).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// Whether this launch goes through a rendezvous: several nodes, or a c10d endpoint even for
/// one node (as torchrun). A one-node static launch with `--master-port` keeps the single-node
/// path (same ranks, same store, no rendezvous traffic), and so does a one-node etcd launch
/// (rdrun has no etcd backend; one node needs none).
pub fn uses_rendezvous(config: &LaunchConfig) -> bool {
    !config.standalone
        && config.rdzv.endpoint.is_some()
        && (config.nnodes.max > 1 || config.rdzv.backend == RdzvBackend::C10d)
}

/// The c10d worker store: every interface, dual-stack `[::]` (IPv4 peers too), else `0.0.0.0`
/// where IPv6 is disabled; on `port` (`--master-port`) or one the kernel picks.
fn bind_worker_store_any(port: u16) -> Result<StoreServer, String> {
    let v6 = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), port);
    match StoreServer::bind(v6, ServerConfig::default()) {
        Ok(s) => Ok(s),
        Err(e6) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            tracing::debug!("cannot bind the worker store on {v6}: {e6}; trying {v4}");
            StoreServer::bind(v4, ServerConfig::default())
                .map_err(|err| format!("cannot bind the worker store on {v4}: {err}"))
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// `gethostname` up to the first dot (torchrun's `${hostname}` is `socket.gethostname()`).
fn short_host(host: &str) -> String {
    host.split('.').next().unwrap_or(host).to_string()
}

/// Binds the worker store's listening socket and returns it with the MASTER_ADDR workers get.
///
/// Standalone (or a loopback master address): 127.0.0.1 only. The port is `--master-port` (the
/// config's resolved MASTER_PORT) or, when `None`, one the kernel picks; either way the socket
/// stays open from bind to use, so no other process can take it (no probe-then-bind race).
/// torchrun gives its FQDN as MASTER_ADDR in standalone; rdrun gives 127.0.0.1, the address it
/// actually listens on. Any other master address binds every interface, as torchrun's agent
/// store does (`*:port`, spec torchrun-compat §2.3).
fn bind_store(config: &LaunchConfig) -> Result<(TcpListener, String), String> {
    let loopback = config.standalone || is_loopback(&config.master_addr);
    let (ip, master_addr) = if loopback {
        (IpAddr::V4(Ipv4Addr::LOCALHOST), "127.0.0.1".to_string())
    } else {
        (
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            config.master_addr.clone(),
        )
    };
    let addr = SocketAddr::new(ip, config.master_port.unwrap_or(0));
    let listener = TcpListener::bind(addr)
        .map_err(|err| format!("cannot bind the worker store on {addr}: {err}"))?;
    Ok((listener, master_addr))
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// `LD_LIBRARY_PATH` for workers when their Python environment has a pip-installed NCCL, so that
/// cudarc (which only tries `libnccl.so`) can load it (issue #6, spec runtime.md §1.4).
///
/// The environment is the worker's interpreter for Python launches, else the Python that a
/// Python launch would use (`PYTHON_EXEC`, `$VIRTUAL_ENV`, `python3` on PATH): a Rust trainer
/// started directly typically shares the venv that holds torch and its NCCL wheel. Failures only
/// log: a missing shim must never stop a launch that may not use NCCL at all.
fn pip_nccl_env(config: &LaunchConfig) -> Vec<(String, String)> {
    let python = match config.command.kind {
        config::EntrypointKind::Exec => {
            match config::find_python(&crate::cli::process_env, &config::RealHost) {
                Ok(p) => p,
                Err(_) => return Vec::new(),
            }
        }
        _ => config.command.program.clone(),
    };
    let Some(cache) = ncclpath::default_cache_dir() else {
        return Vec::new();
    };
    let existing = std::env::var_os("LD_LIBRARY_PATH");
    match ncclpath::pip_nccl_ld_library_path(&python, &cache, existing.as_deref()) {
        Ok(Some(value)) => {
            tracing::debug!(
                ?value,
                "pip NCCL found; LD_LIBRARY_PATH extended for workers"
            );
            vec![(
                "LD_LIBRARY_PATH".to_string(),
                value.to_string_lossy().into_owned(),
            )]
        }
        Ok(None) => Vec::new(),
        Err(err) => {
            tracing::warn!("could not make the pip NCCL loadable for workers: {err}");
            Vec::new()
        }
    }
}

/// `pid 12 (local rank 0, rank 4), pid 13` for the error line about processes that outlived
/// SIGKILL: worker pids get their ranks so that the user knows which worker to look at.
fn describe_leftovers(pids: &[i32], slots: &[Slot]) -> String {
    if pids.is_empty() {
        return "none left by the time of this check".to_string();
    }
    pids.iter()
        .map(|&pid| match slots.iter().find(|s| s.pid == pid) {
            Some(s) => format!("pid {pid} (local rank {}, rank {})", s.local_rank, s.rank),
            None => format!("pid {pid}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        for (addr, want) in [
            ("127.0.0.1", true),
            ("127.1.2.3", true),
            ("localhost", true),
            ("::1", true),
            ("10.0.0.1", false),
            ("node1", false),
        ] {
            assert_eq!(is_loopback(addr), want, "{addr}");
        }
        assert_eq!(short_host("node1.cluster.local"), "node1");
        assert_eq!(short_host("vm"), "vm");
    }

    fn config(standalone: bool, master_addr: &str, master_port: Option<u16>) -> LaunchConfig {
        use crate::config::*;
        LaunchConfig {
            nproc_per_node: 1,
            nnodes: NodeRange { min: 1, max: 1 },
            node_rank: 0,
            rdzv: RdzvConfig {
                backend: RdzvBackend::Static,
                endpoint: None,
                run_id: "t".into(),
                conf: Default::default(),
            },
            standalone,
            master_addr: master_addr.into(),
            master_port,
            local_addr: None,
            max_restarts: 0,
            role: "default".into(),
            command: WorkerCommand {
                kind: EntrypointKind::Exec,
                program: "true".into(),
                args: Vec::new(),
                display_name: "true".into(),
            },
            log: LogConfig::default(),
            signals_to_handle: vec![libc::SIGTERM],
            shutdown_timeout: Duration::from_secs(1),
            virtual_local_rank: false,
            report_json: None,
            exit_barrier_timeout: Duration::from_secs(300),
        }
    }

    #[test]
    fn which_launches_use_the_rendezvous() {
        use crate::config::{Endpoint, NodeRange};
        let ep = Some(Endpoint {
            host: "h".into(),
            port: 1,
        });
        // (standalone, backend, endpoint, nnodes max, expected)
        let table = [
            (true, RdzvBackend::C10d, None, 1, false),
            (false, RdzvBackend::Static, ep.clone(), 1, false),
            (false, RdzvBackend::Static, ep.clone(), 2, true),
            (false, RdzvBackend::C10d, ep.clone(), 1, true),
            (false, RdzvBackend::C10d, ep.clone(), 4, true),
            (false, RdzvBackend::Etcd, ep.clone(), 1, false),
            (false, RdzvBackend::Etcd, ep.clone(), 2, true),
        ];
        for (standalone, backend, endpoint, max, want) in table {
            let mut c = config(standalone, "127.0.0.1", None);
            c.rdzv.backend = backend;
            c.rdzv.endpoint = endpoint;
            c.nnodes = NodeRange { min: 1, max };
            assert_eq!(uses_rendezvous(&c), want, "{standalone} {backend:?} {max}");
        }
    }

    #[test]
    fn rendezvous_events_to_outcomes() {
        let regroup = |o: Outcome| match o {
            Outcome::Regroup { reason, lost } => Some((reason, lost)),
            _ => None,
        };
        let lost = vec!["n2".to_string()];
        // A static job cannot shrink: a lost peer is charged; c10d regroups for free.
        assert_eq!(
            regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), true)),
            Some((RoundReason::PeerLost, lost.clone()))
        );
        assert_eq!(
            regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), false)),
            Some((RoundReason::Membership, lost))
        );
        for ev in [
            RdzvEvent::NodesWaiting(1),
            RdzvEvent::RoundChanged {
                round: 3,
                reason: RoundReason::WorkerFailure,
            },
        ] {
            assert_eq!(
                regroup(rendezvous_end(ev, false)),
                Some((RoundReason::Membership, Vec::new()))
            );
        }
        for (ev, want) in [
            (
                RdzvEvent::Closed,
                "the rendezvous was closed by another node",
            ),
            (
                RdzvEvent::StoreUnreachable("x:1 refused".into()),
                "lost the rendezvous store: x:1 refused",
            ),
        ] {
            match rendezvous_end(ev, true) {
                Outcome::RendezvousLost(msg) => assert!(msg.starts_with(want), "{msg}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn error_chain_is_one_line_without_repeats() {
        let inner = std::io::Error::other("connection refused");
        let err = RendezvousError::Host {
            endpoint: "h:1".into(),
            source: inner,
        };
        assert_eq!(
            error_chain(&err),
            "cannot serve the rendezvous store at h:1: connection refused"
        );
    }

    #[test]
    fn store_binding() {
        // Standalone: loopback, a kernel-picked port, kept bound.
        let (l, addr) = bind_store(&config(true, "node1", None)).unwrap();
        let local = l.local_addr().unwrap();
        assert_eq!(addr, "127.0.0.1");
        assert!(local.ip().is_loopback() && local.port() != 0);
        // The port stays ours until the listener is dropped.
        assert!(TcpListener::bind(local).is_err());
        // --master-port given: exactly that port.
        let port = local.port();
        drop(l);
        let (l, addr) = bind_store(&config(false, "127.0.0.1", Some(port))).unwrap();
        assert_eq!(
            (addr.as_str(), l.local_addr().unwrap().port()),
            ("127.0.0.1", port)
        );
        // A taken port is a clear error naming the address.
        let err = bind_store(&config(false, "127.0.0.1", Some(port))).unwrap_err();
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }
}
