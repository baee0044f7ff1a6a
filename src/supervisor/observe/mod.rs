//! Watching a run from outside (issue 15): the lifecycle event log ([`lifecycle`]), the health
//! state and endpoint ([`health`]), the Prometheus metrics ([`metrics`]; OpenMetrics or classic
//! text as the request's `Accept` asks, [`exposition`]) over a minimal HTTP responder
//! ([`http`]), and the status line while rdrun waits ([`status`]).
//!
//! The agent owns one [`Observer`] and emits a [`RunEvent`] ([`event`]) where things happen
//! (one line each); the observer's renderers turn each into an event line, a health state,
//! metric values and the status line, so the agent's select loop never formats JSON or touches
//! a registry. Only the agent emits (`import_rules.rs`). Nothing here can fail the run once it
//! started: a sink that breaks is dropped with one warning. Only binding the ports and opening
//! `--events` fail the launch, before anything starts.

pub mod event;
pub mod exposition;
pub mod health;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod status;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::LaunchConfig;
use crate::exit::WorkerStatus;
use crate::rendezvous::{Assignment, RoundReason};

use crate::supervisor::group::stop::{GroupStop, Phase, StopReason};
use crate::supervisor::output::Console;
use crate::supervisor::report::end::RunEnd;
use crate::supervisor::watch::hang::OutputCounter;
use crate::supervisor::watch::verdict::HangFinding;
pub use event::RunEvent;
use health::{Health, State};
use lifecycle::{Common, EventLog};
use metrics::Metrics;
use status::{Status, Waiting};

/// A worker of the current attempt, for its exit event.
struct Spawned {
    local_rank: usize,
    rank: usize,
    at: Instant,
    exited: bool,
}

/// The stop under way, for its "finished" event.
struct StopSeen {
    began: Instant,
    killed: bool,
}

/// The agent's observer (see the module docs): a shared handle, so that the run's end is
/// recorded whichever way the agent returns.
#[derive(Clone)]
pub struct Observer(Arc<std::sync::Mutex<Inner>>);

impl Observer {
    /// Opens the sinks, binds the servers and emits `run_start` (see [`Inner::start`]);
    /// `console`: the terminal's, which draws the status line on a terminal.
    pub async fn start(config: &LaunchConfig, console: Console) -> Result<Observer, String> {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_string());
        let inner = Inner::start(config, &host, Some(console)).await?;
        Ok(Observer(Arc::new(std::sync::Mutex::new(inner))))
    }

    /// Hands `ev` to the renderers (the lock is never held across an await).
    pub fn emit(&self, ev: RunEvent<'_>) {
        self.lock().on(ev);
    }

    /// Where the round about to be joined publishes what it waits for (the status line's);
    /// join it in [`crate::rendezvous::progress::Board::scope`].
    pub fn join_progress(&self) -> crate::rendezvous::progress::Board {
        self.lock().status.board()
    }

    /// The workers of the last attempt as (local rank, global rank), by rank.
    pub fn last_ranks(&self) -> Vec<(usize, usize)> {
        self.lock().last_ranks()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The observer's state; each kind of [`RunEvent`] is rendered by one method.
struct Inner {
    common: Common,
    log: EventLog,
    health: Health,
    metrics: Option<Arc<Metrics>>,
    status: Status,
    servers: Vec<JoinHandle<()>>,
    nproc: usize,
    grace: Duration,
    rdzv_began: Option<Instant>,
    spawn_began: Option<Instant>,
    workers: HashMap<i32, Spawned>,
    stop: Option<StopSeen>,
    /// A `signal` event was written (else `run_end` of an interrupted run writes one first).
    signal_seen: bool,
}

impl Inner {
    /// Opens the sinks and binds the servers (errors: one line, the launch fails), then emits
    /// `run_start`.
    async fn start(
        config: &LaunchConfig,
        host: &str,
        console: Option<Console>,
    ) -> Result<Inner, String> {
        let o = &config.observe;
        let log_dir = config
            .log
            .log_dir
            .as_deref()
            .is_some_and(|d| d != Path::new("/dev/null"));
        let log =
            EventLog::new(o.events.as_ref(), o.console, log_dir).map_err(|e| e.to_string())?;
        let health = Health::default();
        let mut servers = Vec::new();
        let mut metrics = None;
        if let Some(addr) = o.metrics_addr {
            let m = Arc::new(Metrics::new());
            let (mm, hh) = (m.clone(), health.clone());
            let handler: http::Handler = Arc::new(move |req: &http::Request| match &*req.path {
                "/metrics" => {
                    let open = exposition::wants_openmetrics(req.accept.as_deref());
                    http::Response {
                        status: 200,
                        content_type: if open {
                            exposition::OPENMETRICS
                        } else {
                            exposition::CLASSIC
                        },
                        body: mm.render(open),
                    }
                }
                "/healthz" => hh.response(),
                _ => http::text(404, "not found: try /metrics or /healthz\n"),
            });
            let (bound, task) = http::serve(addr, handler)
                .await
                .map_err(|e| format!("--metrics-addr {addr}: cannot listen: {e}"))?;
            tracing::info!("serving metrics at http://{bound}/metrics");
            servers.push(task);
            let sampler = m.clone();
            servers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(metrics::SAMPLE);
                loop {
                    tick.tick().await;
                    sampler.sample_outputs();
                }
            }));
            metrics = Some(m);
        }
        if let Some(port) = o.health_port {
            // Every address, IPv6 too: a health probe (a kubelet) comes over the pod's address,
            // which may be IPv6. `[::]` is dual-stack (IPv4 clients arrive as mapped addresses);
            // a host without IPv6 gets the IPv4 wildcard.
            let hh = health.clone();
            let handler: http::Handler = Arc::new(move |_: &http::Request| hh.response());
            let any6 = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
            let served = match http::serve(any6, handler.clone()).await {
                Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                    let any4 = std::net::SocketAddr::from(([0, 0, 0, 0], port));
                    http::serve(any4, handler).await
                }
                r => r,
            };
            let (bound, task) = served.map_err(|e| {
                format!("TORCHELASTIC_HEALTH_CHECK_PORT={port}: cannot listen: {e}")
            })?;
            tracing::info!("serving the health check on port {}", bound.port());
            servers.push(task);
        }
        let mut obs = Inner {
            common: Common {
                run_id: config.rdzv.run_id.clone(),
                attempt: 0,
                node_rank: (!config.uses_rendezvous()
                    || config.rdzv.backend == crate::config::RdzvBackend::Static)
                    .then_some(config.node_rank),
                host: host.to_string(),
            },
            log,
            health,
            metrics,
            status: Status::new(config.run_env.status_interval, console),
            servers,
            nproc: config.nproc_per_node,
            grace: config.shutdown_timeout,
            rdzv_began: None,
            spawn_began: None,
            workers: HashMap::new(),
            stop: None,
            signal_seen: false,
        };
        let mut f = Map::new();
        f.insert("config".into(), config_json(config));
        f.insert("pid".into(), std::process::id().into());
        f.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        obs.emit("run_start", f);
        Ok(obs)
    }

    fn emit(&mut self, event: &str, fields: Map<String, Value>) {
        self.log.emit(&self.common, event, fields);
    }

    fn set_health(&self, s: State) {
        self.health.set(s);
        if let Some(m) = &self.metrics {
            m.healthy(s == State::Running);
        }
    }

    /// Connecting to (or hosting) the rendezvous store, before the first round.
    fn connecting(&mut self, endpoint: String) {
        self.set_health(State::Rendezvous);
        self.status.set(Some(Waiting::connect(endpoint)));
    }

    /// The rendezvous store is reachable (or the attempt to reach it ended).
    fn connected(&mut self) {
        self.status.set(None);
    }

    /// A rendezvous round begins (`reason`: why).
    fn rendezvous_begins(&mut self, reason: RoundReason) {
        self.set_health(State::Rendezvous);
        self.rdzv_began = Some(Instant::now());
        self.status.set(Some(Waiting::rendezvous()));
        self.emit("rendezvous_start", obj(json!({ "reason": reason.name() })));
    }

    /// The round ended: its assignment, or why it failed.
    fn rendezvous_ended(&mut self, res: Result<&Assignment, &RunEnd>) {
        self.status.set(None);
        let took = self
            .rdzv_began
            .take()
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        if let Some(m) = &self.metrics {
            m.rendezvous_took(Duration::from_secs_f64(took));
        }
        match res {
            Ok(asg) => {
                self.common.node_rank = Some(asg.group_rank);
                // The round's job-wide restart count is the attempt its workers run
                // (TORCHELASTIC_RESTART_COUNT); a node joining late learns it only here.
                self.common.attempt = asg.restart_count;
                let members: Vec<Value> = asg
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, (addr, n))| json!({"node_rank": i, "addr": addr, "nproc": n}))
                    .collect();
                self.emit(
                    "rendezvous_complete",
                    obj(json!({
                        "round": asg.round,
                        "group_rank": asg.group_rank,
                        "group_world_size": asg.group_world_size,
                        "world_size": asg.world_size,
                        "restart_count": asg.restart_count,
                        "members": members,
                        // c10d rounds above 256 nodes do not read every node's entry.
                        "members_listed": members.len() == asg.group_world_size,
                        "duration_s": took,
                    })),
                );
            }
            Err(end) => {
                let why = end.message().unwrap_or_else(|| "finished".into());
                self.emit(
                    "rendezvous_failed",
                    obj(json!({ "error": why, "duration_s": took })),
                );
            }
        }
    }

    /// An attempt begins: its number, the run directory (for `events.jsonl`).
    fn attempt_begins(&mut self, attempt: u32, run_dir: Option<&Path>) {
        self.common.attempt = attempt;
        self.log.run_dir(run_dir);
        self.workers.clear();
        self.stop = None;
        self.spawn_began = Some(Instant::now());
        self.set_health(State::Spawning);
        if let Some(m) = &self.metrics {
            m.attempt_begins(attempt);
        }
    }

    /// A worker was started.
    fn spawned(&mut self, local_rank: usize, rank: usize, pid: i32, output: &OutputCounter) {
        self.workers.insert(
            pid,
            Spawned {
                local_rank,
                rank,
                at: Instant::now(),
                exited: false,
            },
        );
        if let Some(m) = &self.metrics {
            m.spawned(local_rank, output.clone());
        }
        self.emit(
            "worker_spawn",
            obj(json!({"local_rank": local_rank, "rank": rank, "pid": pid})),
        );
        if self.workers.len() == self.nproc {
            let took = self
                .spawn_began
                .take()
                .map_or(Duration::ZERO, |t| t.elapsed());
            if let Some(m) = &self.metrics {
                m.spawn_took(took);
            }
            if self.stop.is_none() {
                self.set_health(State::Running);
            }
        }
    }

    /// A child was reaped (only workers of this attempt make an event).
    fn reaped(&mut self, pid: i32, status: WorkerStatus) {
        let Some(w) = self.workers.get_mut(&pid) else {
            return;
        };
        w.exited = true;
        let (lr, rank, took) = (w.local_rank, w.rank, w.at.elapsed().as_secs_f64());
        if let Some(m) = &self.metrics {
            m.exited(lr);
        }
        let (code, signal) = match status {
            WorkerStatus::Exited(c) => (Value::from(c), Value::Null),
            WorkerStatus::Signaled(s) => (Value::Null, Value::from(crate::exit::signal_label(s))),
        };
        self.emit(
            "worker_exit",
            obj(json!({
                "local_rank": lr,
                "rank": rank,
                "pid": pid,
                "status": if status.success() { "succeeded" } else { "failed" },
                "exit_code": code,
                "signal": signal,
                "torchrun_code": status.torchrun_code(),
                "duration_s": took,
            })),
        );
        if !status.success() && self.health.get() == State::Running {
            self.set_health(State::Stopping);
        }
        // Every worker exited 0: the group no longer runs (what follows is the run's end).
        let all_done = self.workers.len() == self.nproc && self.workers.values().all(|w| w.exited);
        if all_done && self.health.get() == State::Running {
            self.set_health(State::Succeeded);
        }
    }

    /// A handled signal reached rdrun.
    fn signal(&mut self, sig: i32) {
        self.signal_seen = true;
        self.emit(
            "signal",
            obj(json!({ "signal": crate::exit::signal_label(sig) })),
        );
    }

    /// Called on every turn of the agent's loop: notices when a stop begins and when it
    /// escalates to SIGKILL (the status line then shows the grace left).
    fn watch_stop(&mut self, stop: &GroupStop, live: usize) {
        match stop.phase() {
            Phase::Running => {}
            Phase::Grace(deadline) => {
                if self.stop.is_none() {
                    let reason = stop.reason();
                    let sig = match reason {
                        Some(StopReason::Signal(s)) => s,
                        _ => libc::SIGTERM,
                    };
                    self.stop = Some(StopSeen {
                        began: Instant::now(),
                        killed: false,
                    });
                    self.set_health(State::Stopping);
                    self.emit(
                        "stop_begin",
                        obj(json!({
                            "reason": reason.map_or("unknown", stop_reason_name),
                            "signal": crate::exit::signal_label(sig),
                            "grace_s": self.grace.as_secs_f64(),
                        })),
                    );
                }
                if live > 0 {
                    self.status.set(Some(Waiting::grace(deadline, live)));
                } else {
                    self.status.set(None);
                }
            }
            Phase::Killed(_) => {
                if let Some(s) = self.stop.as_mut() {
                    s.killed = true;
                } else {
                    self.stop = Some(StopSeen {
                        began: Instant::now(),
                        killed: true,
                    });
                    self.set_health(State::Stopping);
                    self.emit(
                        "stop_begin",
                        obj(json!({"reason": stop.reason().map_or("unknown", stop_reason_name), "signal": "SIGKILL", "grace_s": 0.0})),
                    );
                }
                self.status.set(None);
            }
        }
    }

    /// The attempt's processes are gone: a stop under way is finished.
    fn attempt_over(&mut self) {
        self.status.set(None);
        let Some(s) = self.stop.take() else {
            return;
        };
        let took = s.began.elapsed();
        if let Some(m) = &self.metrics {
            m.stop_took(took);
        }
        self.emit(
            "stop_end",
            obj(json!({
                "duration_s": took.as_secs_f64(),
                "grace_used_s": took.min(self.grace).as_secs_f64(),
                "killed": s.killed,
            })),
        );
    }

    /// A new attempt follows: `next` is its number, `charged` whether it used a restart.
    fn restart(&mut self, next: u32, charged: bool, kind: &str) {
        self.set_health(State::Restarting);
        if let Some(m) = &self.metrics {
            m.restarted(charged);
        }
        self.emit(
            "restart",
            obj(json!({"next_attempt": next, "charged": charged, "kind": kind})),
        );
        // What follows (the next round's rendezvous events) belongs to the next attempt.
        self.common.attempt = next;
    }

    /// The next attempt's workers were spawned after a restart: one `restart_cost` event with
    /// its phases (`report/restart_cost.rs`) and `rdrun_restart_seconds` observes the total.
    fn restart_cost(&mut self, fields: &serde_json::Value, total: Duration) {
        if let Some(m) = &self.metrics {
            m.restart_took(total);
        }
        self.emit("restart_cost", obj(fields.clone()));
    }

    /// `--chaos` (issue 41): a `chaos_inject` or `chaos_recovered` event with the fault's
    /// record; a recovery also goes to the `rdrun_chaos_*_seconds` histograms.
    fn chaos(
        &mut self,
        event: &str,
        fields: &serde_json::Value,
        measured: Option<(&str, Option<f64>, Option<f64>)>,
    ) {
        if let (Some(m), Some((kind, detect, recover))) = (&self.metrics, measured) {
            m.chaos_recovered(kind, detect, recover);
        }
        self.emit(event, obj(fields.clone()));
    }

    /// A restarted attempt's ranks are all back in user code (their first output): one
    /// `restart_back` event.
    fn restart_back(&mut self, restart: u32, secs: f64) {
        self.emit(
            "restart_back",
            obj(json!({"restart": restart, "back_in_user_code_s": secs})),
        );
    }

    /// One run of the node's health checks (issue 28): one `health_check` event with every
    /// verdict, and `rdrun_node_check_failed{check}` set to 1 / 0.
    fn health_checks(&mut self, report: &crate::health::HealthReport) {
        if let Some(m) = &self.metrics {
            for v in &report.verdicts {
                m.node_check(v.check, v.status == crate::health::Status::Failed);
            }
        }
        let checks = report.checks_json();
        self.emit(
            "health_check",
            obj(json!({
                "node": report.node,
                "healthy": report.healthy(),
                "ms": report.took.as_millis() as u64,
                "checks": checks,
            })),
        );
    }

    /// One network pre-check after a round (issue 28 item 3): a `network_check` event with
    /// every node's score and the slow ones, and the metrics.
    fn network_check(
        &mut self,
        v: &crate::health::network::NetVerdict,
        peers: &[crate::health::network::Peer],
        leaving: &[usize],
        took: std::time::Duration,
    ) {
        if let Some(m) = &self.metrics {
            m.network_check(v, took);
        }
        let node = |rank: usize, bps: f64, lat: Option<std::time::Duration>| {
            let p = peers.get(rank);
            json!({
                "node": rank,
                "addr": p.map(|p| p.addr.clone()),
                "host": p.map(|p| p.host.clone()),
                "bytes_per_second": bps,
                "latency_ms": lat.map(|l| l.as_secs_f64() * 1e3),
            })
        };
        let nodes: Vec<Value> = v
            .scores
            .iter()
            .map(|s| node(s.node, s.bps, s.latency))
            .collect();
        let slow: Vec<Value> = v
            .slow
            .iter()
            .map(|s| {
                let mut n = node(s.node, s.score.bps, s.score.latency);
                n["why"] = json!(s.why());
                n
            })
            .collect();
        self.emit(
            "network_check",
            obj(json!({
                "ms": took.as_millis() as u64,
                "median_bytes_per_second": v.median_bps,
                "median_latency_ms": v.median_latency.as_secs_f64() * 1e3,
                "nodes": nodes,
                "slow": slow,
                "left_out": leaving,
            })),
        );
    }

    /// This node's worker failures in the run so far (issue 28 item 4).
    fn node_failures(&mut self, count: u32) {
        if let Some(m) = &self.metrics {
            m.node_failures(count);
        }
    }

    /// Every node's failure counts in the run as last read (issue 28 item 4).
    fn run_node_failures(&mut self, nodes: &[(&str, u32)]) {
        if let Some(m) = &self.metrics {
            m.run_node_failures(nodes.iter().copied());
        }
    }

    /// The hang detector's verdict.
    fn hang(&mut self, found: &HangFinding) {
        // The capture's block: the watch task rendered it, the observer prints it.
        if !found.block.is_empty() {
            crate::supervisor::output::own::stderr(&found.block);
        }
        self.emit(
            "hang",
            obj(json!({
                "action": if found.kill { "kill" } else { "observe" },
                "suspect_rank": found.suspect,
                "summary": found.summary,
            })),
        );
    }

    /// The exit barrier begins (multi-node, after local success).
    fn barrier_begins(&mut self, timeout: Duration) {
        self.set_health(State::Succeeded);
        self.status
            .set(Some(Waiting::barrier(std::time::Instant::now() + timeout)));
    }

    /// The exit barrier ended.
    fn barrier_ended(&mut self) {
        self.status.set(None);
    }

    /// The workers of the last attempt as (local rank, global rank), by rank.
    fn last_ranks(&self) -> Vec<(usize, usize)> {
        let mut ranks: Vec<(usize, usize)> = self
            .workers
            .values()
            .map(|w| (w.local_rank, w.rank))
            .collect();
        ranks.sort_by_key(|&(local, rank)| (rank, local));
        ranks.dedup();
        ranks
    }

    /// The run is over: `run_end`, the final health state; the servers stop.
    fn run_end(&mut self, end: &RunEnd) {
        self.status.set(None);
        let outcome = match end {
            RunEnd::Succeeded => "succeeded",
            RunEnd::WorkersFailed(_) => "workers_failed",
            RunEnd::Interrupted { .. } => "interrupted",
            RunEnd::LauncherError(_) => "launcher_error",
            RunEnd::RendezvousLost(..) => "rendezvous_lost",
            RunEnd::BadNode(_) => "bad_node",
        };
        self.set_health(match end {
            RunEnd::Succeeded => State::Succeeded,
            _ => State::Failed,
        });
        let mut f = obj(json!({
            "outcome": outcome,
            "exit_code": end.exit().code(),
        }));
        if let RunEnd::Interrupted { signal, .. } = end {
            // A signal outside an attempt (rendezvous, between attempts) got no event yet.
            if !self.signal_seen {
                self.signal(*signal);
            }
            f.insert("signal".into(), crate::exit::signal_label(*signal).into());
        }
        if let RunEnd::LauncherError(e) = end {
            f.insert("error".into(), e.to_string().into());
        }
        if let RunEnd::RendezvousLost(e, _) = end {
            f.insert("error".into(), e.clone().into());
        }
        if let Some(line) = end.report().and_then(|r| r.verdict()) {
            // The stop verdict (issue 28.5): why a failure rdrun could retry was not.
            f.insert("verdict".into(), line.into());
        }
        if let RunEnd::BadNode(b) = end {
            f.insert("error".into(), b.line.clone().into());
            f.insert("node".into(), b.node.clone().into());
        }
        self.emit("run_end", f);
        self.status.stop();
        // Stays up until the agent returns: the servers' last answer is the final state.
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.servers {
            t.abort();
        }
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn stop_reason_name(r: StopReason) -> &'static str {
    match r {
        StopReason::WorkerFailed => "worker_failed",
        StopReason::Signal(_) => "signal",
        StopReason::Rendezvous => "rendezvous",
        StopReason::StoreStopped => "store_stopped",
        StopReason::LaunchError => "launch_error",
        StopReason::Leftovers => "leftovers",
    }
}

/// The resolved configuration, as `run_start` shows it.
fn config_json(c: &LaunchConfig) -> Value {
    json!({
        "nproc_per_node": c.nproc_per_node,
        "nnodes": format!("{}:{}", c.nnodes.min, c.nnodes.max),
        "node_rank": c.node_rank,
        "rdzv_backend": format!("{:?}", c.rdzv.backend).to_lowercase(),
        "rdzv_endpoint": c.rdzv.endpoint.as_ref().map(|e| format!("{}:{}", e.host, e.port)),
        "run_id": c.rdzv.run_id,
        "standalone": c.standalone,
        "master_addr": c.master_addr,
        "master_port": c.master_port,
        "max_restarts": c.max_restarts,
        "role": c.role,
        "program": c.command.program.display().to_string(),
        "args": c.command.args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
        "log_dir": c.log.log_dir.as_ref().map(|d| d.display().to_string()),
        "shutdown_timeout_s": c.shutdown_timeout.as_secs_f64(),
        "exit_barrier_timeout_s": c.exit_barrier_timeout.as_secs_f64(),
        "leftovers": format!("{:?}", c.leftovers).to_lowercase(),
        "hang_detect": format!("{:?}", c.hang.mode).to_lowercase(),
    })
}

impl Inner {
    /// Hands one event to the renderers (`event.rs`'s module doc): the one place that knows
    /// which renderer each event reaches.
    fn on(&mut self, ev: RunEvent<'_>) {
        match ev {
            RunEvent::Connecting { endpoint } => self.connecting(endpoint),
            RunEvent::Connected => self.connected(),
            RunEvent::RendezvousBegins(reason) => self.rendezvous_begins(reason),
            RunEvent::RendezvousEnded(res) => self.rendezvous_ended(res),
            RunEvent::AttemptBegins { attempt, run_dir } => self.attempt_begins(attempt, run_dir),
            RunEvent::Spawned {
                local_rank,
                rank,
                pid,
                output,
            } => self.spawned(local_rank, rank, pid, output),
            RunEvent::Reaped { pid, status } => self.reaped(pid, status),
            RunEvent::Signal(sig) => self.signal(sig),
            RunEvent::StopProgress { stop, live } => self.watch_stop(stop, live),
            RunEvent::AttemptOver => self.attempt_over(),
            RunEvent::Restart {
                next,
                charged,
                kind,
            } => self.restart(next, charged, kind),
            RunEvent::RestartCost { fields, total } => self.restart_cost(fields, total),
            RunEvent::RestartBack { restart, secs } => self.restart_back(restart, secs),
            RunEvent::HealthChecks(report) => self.health_checks(report),
            RunEvent::NetworkCheck {
                verdict,
                peers,
                leaving,
                took,
            } => self.network_check(verdict, peers, leaving, took),
            RunEvent::NodeFailures(count) => self.node_failures(count),
            RunEvent::RunNodeFailures(nodes) => self.run_node_failures(nodes),
            RunEvent::Hang(found) => self.hang(found),
            RunEvent::BarrierBegins { timeout } => self.barrier_begins(timeout),
            RunEvent::BarrierEnded => self.barrier_ended(),
            RunEvent::ChaosInject { fields } => self.chaos("chaos_inject", fields, None),
            RunEvent::ChaosRecovered {
                kind,
                detect,
                recover,
                fields,
            } => self.chaos("chaos_recovered", fields, Some((kind, detect, recover))),
            RunEvent::RunEnd(end) => self.run_end(end),
        }
    }
}

#[cfg(test)]
mod tests;
