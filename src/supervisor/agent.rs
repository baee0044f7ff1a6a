//! The agent: the one owner of the run's state (signals, the worker store, the rendezvous, the
//! FileTimer FIFO, the watchdog), the restart loop, and the select loop of each attempt. It
//! hosts the worker store, runs attempts, asks [`restart::decide`] what follows each one, and
//! returns how the run ended as a [`RunEnd`] (the binary prints it and `exit` maps it to a
//! status).
//!
//! The select loop (`agent_attempt.rs`) is a dispatcher: everything reaches it as an `Event` — SIGCHLD (then
//! `waitpid(-1)` reaps every descendant, as rdrun is a child subreaper; rdrun spawns no other
//! `std::process` child it would wait for, see `worker::reap`), handled signals, stop deadlines,
//! rendezvous changes and the worker store's end — and the attempt's `Group` (`attempt.rs`)
//! has one method per event kind, which records it and begins the stop when it must. The loop
//! also wakes for `--leftovers=wait` (once a second), for hang polls (`HangLink`, every
//! `--hang-poll-interval` while the group runs), FileTimer messages and D-state samples. The
//! others do the work: `worker` builds each worker's spawn spec and spawns it, `stop` owns the
//! stop sequence, `output` forwards output, `report` resolves and renders failures, `restart`
//! decides, `setup` picks and binds the worker store.
//!
//! Multi-node ([`LaunchConfig::uses_rendezvous`]): every attempt starts with a rendezvous round
//! ([`Rendezvous::next_round`]) whose [`Assignment`] gives the ranks, and the attempt also
//! watches the rendezvous: a membership change (late joiner, lost peer, another node's restart)
//! stops the workers and joins the next round; what it costs is [`restart::decide`]'s, with the
//! job-wide `asg.restart_count` as the budget used. Static jobs give the workers the rendezvous
//! store itself (MASTER_ADDR:PORT = the endpoint); c10d agents serve one worker store on their
//! advertised address and publish its port each round.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::config::LaunchConfig;
use crate::rendezvous::{Assignment, NodeSpec, Rendezvous, RoundReason};
use crate::store::server::{self, ServerExit, StoreServer};

use crate::supervisor::group::attempt::Outcome;
use crate::supervisor::group::checkcells::CheckCells;
use crate::supervisor::group::deadman::Watchdog;
use crate::supervisor::group::restart::{self, Decision};
use crate::supervisor::group::signals::Signals;
use crate::supervisor::group::worker::{self, RunWorkerEnv};
use crate::supervisor::nodes::join::until_shutdown;
use crate::supervisor::nodes::network_check::{NetOutcome, NetSettings};
use crate::supervisor::observe::{Observer, RunEvent};
use crate::supervisor::output::{Console, RunLogs};
use crate::supervisor::report::end::{Ended, RunEnd};
use crate::supervisor::report::failure::{Failure, FailureReport};
use crate::supervisor::setup::{self, single_node_master_addr, ReportHost};
use crate::supervisor::watch::task::Watch;
use crate::supervisor::watch::timers::FileTimerServe;

#[path = "agent_attempt.rs"]
mod attempt;
#[path = "agent_between.rs"]
mod between;
#[path = "agent_chaos.rs"]
mod chaos_acts;
#[path = "agent_rounds.rs"]
mod rounds;

/// Beyond `--hang-capture-timeout`: how long a capture's verdict may still take (the other
/// nodes' findings are waited for up to 10 s after a multi-node verdict, plus a few polls).
const CAPTURE_VERDICT_SLACK: Duration = Duration::from_secs(20);

/// Runs one launch to the end and says how it ended and what restarts it took (see
/// [`RunEnd::exit`]).
///
/// Call it from the main thread: workers are spawned on the calling thread (a current-thread
/// tokio runtime), and their PR_SET_PDEATHSIG fires when that thread ends.
pub fn run(config: LaunchConfig) -> Ended {
    if config.nproc_per_node == 0 {
        return RunEnd::error("--nproc-per-node must be at least 1").into();
    }
    // SAFETY: plain syscalls without arguments.
    if unsafe { libc::gettid() != libc::getpid() } {
        tracing::warn!(
            "supervisor::run is not on the main thread: workers get SIGKILL when this thread ends"
        );
    }
    // Before anything is spawned: the children rdrun inherited are never its to signal.
    let inherited = crate::supervisor::group::proctree::note_inherited();
    if !inherited.is_empty() {
        tracing::debug!(
            ?inherited,
            "children inherited from the parent; never signalled"
        );
    }
    // Forked first, while the process has a single thread.
    // Containment hook: the watchdog creates the run's cgroup; dropping it removes the cgroup.
    let watchdog = match Watchdog::start(&config.rdzv.run_id, config.run_env.cgroup) {
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
    // The terminal's one writer from here on (after the watchdog's fork: it needs a single
    // thread): worker output, rdrun's own text and the status line are messages to it.
    let console = match Console::terminal() {
        Ok(c) => c,
        Err(err) => {
            return RunEnd::error(format!("cannot start the console writer thread: {err}")).into()
        }
    };
    crate::supervisor::output::own::attach(console.clone());
    // The store server may live on this runtime: new connections first (issue 16).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .global_queue_interval(crate::store::server::STORE_GLOBAL_QUEUE_INTERVAL)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => return RunEnd::error(format!("cannot start the async runtime: {err}")).into(),
    };
    let obs = match runtime.block_on(Observer::start(
        setup::observer_settings(&config),
        console.clone(),
    )) {
        Ok(o) => o,
        Err(msg) => return RunEnd::error(msg).into(),
    };
    let mut chaos = None;
    let end = runtime.block_on(Agent::run(
        config,
        watchdog,
        (obs.clone(), console),
        &mut chaos,
    ));
    obs.emit(RunEvent::RunEnd(&end));
    // The report's parts the observer rendered from the run's events.
    let (ranks, restarts) = (obs.last_ranks(), obs.restarts());
    // Signal-forwarding tasks never end on their own.
    runtime.shutdown_background();
    Ended {
        end,
        restarts,
        ranks,
        chaos,
    }
}

struct Agent {
    config: LaunchConfig,
    watchdog: Option<Watchdog>,
    signals: Signals,
    sigchld: Signal,
    /// `gethostname()`: the `${hostname}` of log prefixes (up to the first dot).
    host: String,
    /// The fully qualified name the failure report shows (torchrun's `socket.getfqdn()`).
    report_host: ReportHost,
    master_addr: String,
    master_port: u16,
    /// What every worker's spawn spec shares.
    worker_env: RunWorkerEnv,
    /// The warm-start template manager (`--warm-start`), owned here and lent to each attempt's
    /// spawner.
    warm: Option<std::sync::Arc<crate::supervisor::group::warm::WarmStart>>,
    /// The worker store (TCPStore-compatible), for the whole run; taken at shutdown.
    store: Option<StoreServer>,
    /// Resolves if the store stops serving on its own (then the run cannot go on).
    store_closed: Pin<Box<dyn Future<Output = ServerExit> + Send>>,
    /// Why the store stopped, once it did.
    store_failed: Option<String>,
    /// The rendezvous of a multi-node run (`None`: single node, no rounds).
    rdzv: Option<Rendezvous>,
    /// Hang detection, the D-state check and torch's FileTimer FIFO (served for the whole run
    /// with `TORCHELASTIC_ENABLE_FILE_TIMER=1`): the watch task, which sends verdicts.
    watch: Option<Watch>,
    /// Whether the FileTimer FIFO is served (its expiries are captured into the hang dir).
    file_timer: bool,
    /// Events, health, metrics, status line (issue 15): one [`RunEvent`] where things happen.
    obs: Observer,
    /// The terminal's console: the workers' output goes there (`workers.rs`).
    console: Console,
    /// A worker stayed in D state past TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: no more
    /// restarts (as torch; `watch/dstate.rs`).
    restarts_disabled: bool,
    /// How many restarts and regroups the run took so far (the observer's report renderer
    /// lists them for `--report-json`).
    restarts_taken: u32,
    /// The marks of the restart under way (`report/restart_cost.rs`).
    restart_clock: crate::supervisor::report::restart_cost::RestartClock,
    /// A restarted attempt whose ranks are not all back in user code yet (`check_back`).
    back_watch: Option<crate::supervisor::report::restart_cost::BackWatch>,
    /// `--chaos` (issue 41): what to inject and what it cost (`agent_chaos.rs`).
    chaos: Option<crate::supervisor::chaos::Chaos>,
}

/// Joins the rendezvous when the run holds one (`None` otherwise); a shutdown signal during the
/// join ends the run.
async fn start_rendezvous(
    config: &LaunchConfig,
    signals: &mut Signals,
    obs: &Observer,
) -> Result<Option<Rendezvous>, RunEnd> {
    if !config.uses_rendezvous() {
        return Ok(None);
    }
    obs.emit(RunEvent::connecting(&config.rdzv));
    // What the rendezvous reads of the launch: its resolved settings and this node.
    let node = NodeSpec {
        nnodes: config.nnodes,
        node_rank: config.node_rank,
        nproc_per_node: config.nproc_per_node,
        local_addr: config.local_addr.clone(),
    };
    let started = until_shutdown(signals, Rendezvous::start(&config.rdzv, node)).await;
    obs.emit(RunEvent::Connected);
    match started {
        Ok(Ok(r)) => Ok(Some(r)),
        Ok(Err(err)) => Err(RunEnd::from_error(err)),
        Err(signal) => Err(crate::supervisor::nodes::join::interrupted_in_rendezvous(
            signal,
        )),
    }
}

/// Issue 28: a node that fails its health check does not join (`nodes/health_gate.rs`). Under
/// `warn` the checks run beside the join and the workers; the returned guard waits for their
/// verdict when the run ends. Their programs live in cgroups below the run's
/// (`group/checkcells.rs`); each report is told as an event.
async fn gate_health(
    config: &LaunchConfig,
    watchdog: Option<&Watchdog>,
    obs: &Observer,
    signals: &mut Signals,
    rdzv: &mut Option<Rendezvous>,
) -> Result<Option<crate::supervisor::nodes::health_gate::Background>, RunEnd> {
    let contain = CheckCells::of(
        watchdog.and_then(Watchdog::cgroup_dir),
        watchdog.map(Watchdog::fd),
    );
    let seen = {
        let obs = obs.clone();
        std::sync::Arc::new(move |r: &crate::health::HealthReport| {
            obs.emit(RunEvent::HealthChecks(r));
        })
    };
    let inputs = setup::health_inputs(config, contain);
    crate::supervisor::nodes::health_gate::gate(
        &config.resilience,
        &config.rdzv,
        inputs,
        seen,
        signals,
        rdzv.as_mut(),
    )
    .await
}

/// What resolves if the worker store stops serving on its own (never without one); says where
/// it serves.
fn watch_store(
    store: &Option<StoreServer>,
    rdzv: Option<&Rendezvous>,
    master_addr: &str,
    master_port: u16,
) -> Pin<Box<dyn Future<Output = ServerExit> + Send>> {
    match (store, rdzv) {
        // Single node: workers get this address and port.
        (Some(_), None) => tracing::debug!(%master_addr, master_port, "worker store serving"),
        // c10d: the store listens on the advertised address; each round says who hosts.
        (Some(s), Some(_)) => tracing::debug!(addr = %s.local_addr(), "worker store serving"),
        (None, _) => {}
    }
    match store {
        Some(s) => Box::pin(s.closed()),
        None => Box::pin(std::future::pending()),
    }
}

/// What every worker's spawn spec shares, and torch's FileTimer server: started before any
/// worker, so that a FileTimer client never finds the FIFO unread.
fn worker_env_and_timers(
    config: &LaunchConfig,
    watchdog: Option<&Watchdog>,
) -> Result<(RunWorkerEnv, Option<FileTimerServe>), String> {
    let mut worker_env = setup::run_worker_env(
        config,
        watchdog.map(Watchdog::fd),
        watchdog.and_then(Watchdog::cgroup_fd),
    );
    let timers = match FileTimerServe::start(|k| config.run_env.var(k), &config.run_env.temp_dir())?
    {
        Some((t, path)) => {
            if let Some(p) = path {
                worker_env
                    .extra
                    .push(("TORCHELASTIC_TIMER_FILE".to_string(), p));
            }
            Some(t)
        }
        None => None,
    };
    Ok((worker_env, timers))
}

impl Agent {
    /// The run; `chaos_json` receives `--report-json`'s `chaos` section, whichever way it ends.
    async fn run(
        config: LaunchConfig,
        watchdog: Option<Watchdog>,
        (obs, console): (Observer, Console),
        chaos_json: &mut Option<serde_json::Value>,
    ) -> RunEnd {
        // A bad --chaos spec ends the run before anything starts.
        let chaos = match Agent::chaos_of(&config) {
            Ok(c) => c,
            Err(msg) => return RunEnd::error(msg),
        };
        // Handlers first: from here on no handled signal can kill rdrun with workers left behind.
        let mut signals = Signals::install(&config.signals_to_handle);
        let sigchld = match signal(SignalKind::child()) {
            Ok(s) => s,
            Err(err) => {
                return RunEnd::error(format!("cannot watch child processes (SIGCHLD): {err}"))
            }
        };
        // Every worker holds one store connection (one descriptor here).
        if let Err(err) = server::raise_nofile_limit() {
            tracing::debug!("cannot raise the open-file limit: {err}");
        }
        let mut rdzv = match start_rendezvous(&config, &mut signals, &obs).await {
            Ok(r) => r,
            Err(end) => return end,
        };
        let health =
            match gate_health(&config, watchdog.as_ref(), &obs, &mut signals, &mut rdzv).await {
                Ok(background) => background,
                Err(end) => return end,
            };
        let (store, master_port) = match setup::worker_store(&config, rdzv.as_ref()).await {
            Ok(s) => s,
            Err(msg) => return RunEnd::error(msg),
        };
        let master_addr = single_node_master_addr(&config);
        let store_closed = watch_store(&store, rdzv.as_ref(), &master_addr, master_port);
        let host = setup::host_name();
        let report_host = ReportHost::lookup(&host);
        setup::log_worker_env(&config);
        let (worker_env, timers) = match worker_env_and_timers(&config, watchdog.as_ref()) {
            Ok(both) => both,
            Err(msg) => return RunEnd::error(msg),
        };
        let warm = crate::supervisor::group::warm::WarmStart::for_run(
            &config.warm,
            &config.command,
            &config.run_env.temp_dir(),
            config.uses_rendezvous(),
        );
        // A SIGKILL of rdrun (or `--chaos node-loss`) drops nothing: the watchdog removes it.
        if let (Some(w), Some(dir)) = (&watchdog, warm.as_ref().and_then(|w| w.learn_dir())) {
            w.remove_on_death(&dir);
        }
        let mut agent = Agent {
            warm,
            config,
            watchdog,
            signals,
            sigchld,
            host,
            report_host,
            master_addr,
            master_port,
            worker_env,
            store,
            store_closed,
            store_failed: None,
            rdzv,
            file_timer: timers.is_some(),
            watch: Some(Watch::start(timers)),
            obs,
            console,
            restarts_disabled: false,
            restarts_taken: 0,
            restart_clock: Default::default(),
            back_watch: None,
            chaos,
        };
        let end = agent.attempts().await;
        let (end, chaos) = agent.chaos_end(end);
        *chaos_json = chaos;
        // The `warn` checks' verdict (or their cancel) while the run's cgroup, where their
        // programs are, and the watchdog they registered with still exist.
        drop(health);
        agent.shutdown().await;
        end
    }

    /// After the last attempt: shared memory the workers left, the stores, the watchdog (and
    /// the cgroup), the FileTimer FIFO.
    async fn shutdown(mut self) {
        // The runtime unlinks its shared-memory segments once every rank has opened them; a
        // crash during that setup leaves one behind. The shared default id "none" may belong to
        // a concurrent job, so only a run-specific id is swept.
        if self.config.rdzv.run_id != "none" {
            match crate::workerenv::cleanup_run_shm(&self.config.rdzv.run_id) {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} shared-memory segment(s) left by workers"),
                Err(err) => tracing::debug!("shared-memory cleanup skipped: {err}"),
            }
        }
        if let Some(store) = self.store.take() {
            store.shutdown().await;
        }
        if let Some(server) = self.rdzv.take().and_then(|r| r.server) {
            server.shutdown().await;
        }
        if let Some(w) = self.watchdog.take() {
            w.disarm();
            // Containment hook: removes the cgroup, ends and reaps the watchdog.
            drop(w);
        }
        // Ending the watch task drops the FileTimer server: the FIFO (and its private
        // directory) is removed.
        if let Some(watch) = self.watch.take() {
            watch.end().await;
        }
    }

    /// The restart loop (one rendezvous round per attempt when multi-node).
    async fn attempts(&mut self) -> RunEnd {
        let mut logs = RunLogs::new(
            &self.config.log,
            &self.config.rdzv.run_id,
            self.config.run_env.temp_dir(),
        );
        logs.show_on(&self.console);
        let mut restart_count = 0u32;
        let mut reason = RoundReason::Initial;
        let mut same = crate::supervisor::nodes::stop_verdict::SameFailure::default();
        let mut tally = rounds::Tally::default();
        let end = loop {
            // A shutdown signal that arrived between attempts ends the run before a new spawn.
            if let Some(signal) = self.queued_shutdown() {
                tracing::warn!(
                    "received {} before the workers started, exiting",
                    crate::exit::signal_label(signal)
                );
                break RunEnd::Interrupted {
                    signal,
                    report: None,
                };
            }
            if restart_count == 0 && matches!(reason, RoundReason::Initial) {
                self.prestart_warm();
            }
            let asg = match self.rdzv.is_some() {
                true => match self.join_round(reason).await {
                    Ok(asg) => asg,
                    Err(end) => break end,
                },
                false => self.single_node_assignment(restart_count, reason),
            };
            // Issue 28: the network pre-check may leave slow nodes out of the next round.
            match self.network_check(&asg).await {
                Ok(NetOutcome::Go) => {}
                Ok(NetOutcome::Rejoin) => {
                    reason = RoundReason::Membership;
                    continue;
                }
                Err(end) => break end,
            }
            // Every node's failure counts so far, for the metrics (each node published its own
            // before it joined this round).
            if asg.restart_count > 0 || !matches!(reason, RoundReason::Initial) {
                self.refresh_run_counts(&tally).await;
            }
            restart_count = asg.restart_count;
            self.clear_torch_dump_keys();
            let outcome = self.attempt(&mut logs, &asg).await;
            let outcome = self.attribute_failure(outcome).await;
            // Issue 38 item 7: with no restart left, a failure ends the job on every node now.
            let flow = self.end_everywhere(&asg, outcome, &mut same, &mut tally);
            let outcome = match flow.await {
                std::ops::ControlFlow::Break(end) => break end,
                std::ops::ControlFlow::Continue(outcome) => outcome,
            };
            let (outcome, repeats, cause) = self
                .count_failure(&asg, outcome, &mut same, &mut tally)
                .await;
            let decision = restart::decide(
                outcome.attempt_end(),
                restart_count,
                self.config.max_restarts,
                self.restarts_disabled,
                repeats,
            );
            // Issue 28 item 4: a node that failed too often leaves while spares exist (before
            // the same-failure stop: without the bad node the job may go on).
            let restarting = matches!(decision, Decision::Restart { .. } | Decision::SameFailure);
            if restarting && self.fails_too_often(&tally.own, &asg) {
                if let Some(end) = self.leave_failing(&tally).await {
                    break end;
                }
            }
            let next = self
                .act_on(decision, &asg, outcome, restart_count, cause, &same, &tally)
                .await;
            match next {
                std::ops::ControlFlow::Break(end) => break end,
                std::ops::ControlFlow::Continue((count, why)) => {
                    restart_count = count;
                    reason = why;
                }
            }
        };
        // Before finish: what finish keeps (error files the report named) must stay even if
        // rdrun is killed right after. The report was resolved (error files read) above.
        self.forget_dir();
        logs.finish();
        end
    }

    /// The network pre-check after a multi-node round (`nodes/network_check.rs`), its result
    /// told as an event; `Go` without a rendezvous.
    async fn network_check(&mut self, asg: &Assignment) -> Result<NetOutcome, RunEnd> {
        let Some(rdzv) = self.rdzv.as_mut() else {
            return Ok(NetOutcome::Go);
        };
        let obs = &self.obs;
        let settings = NetSettings {
            resilience: &self.config.resilience,
            min_nodes: self.config.nnodes.min,
            local_addr: self.config.local_addr.as_deref(),
            endpoint: self.config.rdzv.endpoint.as_ref(),
        };
        crate::supervisor::nodes::network_check::check(
            &settings,
            |n| {
                obs.emit(RunEvent::NetworkCheck {
                    verdict: n.verdict,
                    peers: n.peers,
                    leaving: n.leaving,
                    took: n.took,
                })
            },
            rdzv,
            asg,
            &mut self.signals,
        )
        .await
    }

    /// What a failed attempt counts as: the stop verdict counts the run's root cause (agreed
    /// between nodes), the node's failure memory its own. Issue 41: an injected failure is none
    /// of the job's, so neither sees it; the node that injected it tells the others through
    /// its root-cause entry, so that every node knows, whatever its own chaos clock reached. Returns the outcome, the repeats the restart decision
    /// weighs and the restart's cause.
    async fn count_failure(
        &mut self,
        asg: &Assignment,
        outcome: Outcome,
        same: &mut crate::supervisor::nodes::stop_verdict::SameFailure,
        tally: &mut rounds::Tally,
    ) -> (Outcome, restart::Repeats, String) {
        let (entry, own_fault) = self.own_entry(&outcome);
        let (outcome, run_root, run_fault) = self.run_root(asg, outcome, &entry).await;
        let injected = self.chaos_label(own_fault, run_fault);
        let repeats = restart::Repeats {
            in_a_row: match injected {
                Some(_) => 0,
                None => same.record_signature(run_root),
            },
            max_same_failures: self.config.resilience.max_same_failures,
        };
        if injected.is_none() {
            self.record_failure(tally, &outcome, entry.sig.as_ref())
                .await;
        }
        let cause = match &injected {
            Some(label) => format!("{label}: {}", outcome.cause(entry.sig.as_ref())),
            None => outcome.cause(same.last()),
        };
        (outcome, repeats, cause)
    }

    /// Carries out the restart decision: the run's end (`Break`), or the next round's restart
    /// count and reason (`Continue`).
    #[allow(clippy::too_many_arguments)] // the loop's state, lent for one step
    async fn act_on(
        &mut self,
        decision: Decision,
        asg: &Assignment,
        outcome: Outcome,
        restart_count: u32,
        cause: String,
        same: &crate::supervisor::nodes::stop_verdict::SameFailure,
        tally: &rounds::Tally,
    ) -> std::ops::ControlFlow<RunEnd, (u32, RoundReason)> {
        use std::ops::ControlFlow::{Break, Continue};
        match decision {
            Decision::Finish => {
                self.finish_rdzv(asg).await;
                Break(RunEnd::Succeeded)
            }
            Decision::Restart {
                restart_count: next,
            } => {
                self.restarts_taken += 1;
                tracing::warn!(
                    "worker group failed; {}/{} restarts left, restarting (attempt {next})",
                    self.config.max_restarts - restart_count,
                    self.config.max_restarts
                );
                self.obs.emit(RunEvent::Restart {
                    next,
                    charged: true,
                    kind: "restart",
                    ended: restart_count,
                    cause: &cause,
                });
                self.between_attempts();
                Continue((next, RoundReason::WorkerFailure))
            }
            Decision::Regroup { charged } => {
                self.restarts_taken += 1;
                outcome.log_regroup();
                self.obs.emit(RunEvent::Restart {
                    next: restart_count + u32::from(charged),
                    charged,
                    kind: "regroup",
                    ended: restart_count,
                    cause: &cause,
                });
                self.between_attempts();
                let reason = if charged {
                    RoundReason::PeerLost
                } else {
                    RoundReason::Membership
                };
                Continue((restart_count, reason))
            }
            Decision::GiveUp => {
                let end = self.give_up(outcome, restart_count, None).await;
                Break(self.with_counts(end, tally).await)
            }
            Decision::SameFailure => {
                let verdict = same.verdict();
                let end = self.give_up(outcome, restart_count, Some(&verdict)).await;
                Break(self.with_counts(end.with_verdict(verdict), tally).await)
            }
        }
    }

    /// The end of the run after an attempt that is not followed by another one (`verdict`: the
    /// stop verdict's line, which the other nodes are told with the close).
    async fn give_up(
        &mut self,
        outcome: Outcome,
        restart_count: u32,
        verdict: Option<&str>,
    ) -> RunEnd {
        match outcome {
            Outcome::Succeeded => RunEnd::Succeeded,
            Outcome::Failed { failures, hang, .. } => {
                self.close_rdzv_failed(verdict).await;
                self.failed_end(failures, hang).await
            }
            Outcome::Interrupted { signal, failures } => {
                // As torchrun: a signalled agent leaves the rendezvous open, so that the node can
                // come back (preemption) and the others carry on (c10d).
                tracing::warn!(
                    "stopped the workers after {}",
                    crate::exit::signal_label(signal)
                );
                let report = if failures.is_empty() {
                    None
                } else {
                    Some(self.resolve(failures).await)
                };
                RunEnd::Interrupted { signal, report }
            }
            Outcome::LauncherError(msg) => {
                self.close_rdzv().await;
                RunEnd::error(msg)
            }
            Outcome::Regroup { lost, .. } => {
                self.close_rdzv().await;
                RunEnd::error(format!(
                    "node(s) {} of the static job stopped heartbeating and no restarts are left ({restart_count} used)",
                    lost.join(", ")
                ))
            }
            Outcome::RendezvousLost(msg) => RunEnd::RendezvousLost(msg, None),
        }
    }

    /// The report of `failures`, error files read now (once).
    async fn resolve(
        &mut self,
        failures: Vec<Failure>,
    ) -> crate::supervisor::report::failure::ResolvedReport {
        let host = self.report_host.get().await;
        FailureReport {
            name: self.config.command.display_name.clone(),
            host,
            failures,
        }
        .resolve()
    }

    /// Warm start: the template imports before the first rendezvous, not at the first spawn,
    /// where a multi-node agent blocked for the import would miss its round's heartbeats
    /// (docs/warm-start.md). Its environment is local rank 0's in a placeholder assignment:
    /// the per-rank variables are left out of it anyway, and a real worker whose import-time
    /// variables differ from it still starts cold.
    fn prestart_warm(&self) {
        let Some(warm) = &self.warm else {
            return;
        };
        let asg = self.single_node_assignment(0, RoundReason::Initial);
        let settings = setup::worker_settings(&self.config, &self.worker_env);
        if let Ok(spec) = worker::spawn_spec(&settings, &asg, 0, "") {
            worker::prestart_warm(&spec, warm);
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
            uniform_nproc: true,
        }
    }

    fn forget_dir(&self) {
        if let Some(w) = &self.watchdog {
            w.forget_dir();
        }
    }
}
