//! The lifecycle events' renderer: each event the outside is told about becomes one record
//! (its name and fields, schema `docs/events.md`) written to every sink of the event log
//! (`lifecycle.rs`): `<run dir>/events.jsonl`, `--events PATH|-`, and the
//! `--event-log-handler console` text line.
//!
//! The console text is a sink of this renderer, not a renderer of its own: it is the same
//! record in another form, written at the same moment, so that with `--events -` an event's
//! JSON line and its text line stay next to each other on stderr, event after event.

use serde_json::{json, Map, Value};

use super::event::RunEvent;
use super::facts::{Facts, Renderer};
use super::lifecycle::{Common, EventLog};
use super::settings::Settings;
use crate::exit::{signal_label, WorkerStatus};
use crate::health::network::{NetVerdict, Peer};
use crate::rendezvous::Assignment;
use crate::supervisor::group::stop::StopReason;
use crate::supervisor::report::end::RunEnd;

/// Writes the lifecycle events (see the module docs).
pub struct EventsRenderer {
    log: EventLog,
    /// A `signal` event was written (else `run_end` of an interrupted run writes one first).
    signal_seen: bool,
}

impl EventsRenderer {
    /// Opens the sinks (an `--events` file that cannot be opened: one line, the launch fails).
    pub fn open(settings: &Settings) -> Result<EventsRenderer, String> {
        let log = EventLog::new(
            settings.sinks.events.as_ref(),
            settings.sinks.console,
            settings.events_in_log_dir(),
        )
        .map_err(|e| e.to_string())?;
        Ok(EventsRenderer {
            log,
            signal_seen: false,
        })
    }

    /// The first event: `run_start`, with the configuration.
    pub fn run_start(&mut self, common: &Common, settings: &Settings) {
        let mut f = Map::new();
        f.insert("config".into(), settings.config_json());
        f.insert("pid".into(), std::process::id().into());
        f.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        self.log.emit(common, "run_start", f);
    }

    /// `fields` must be a JSON object (each builder below makes one).
    fn emit(&mut self, facts: &Facts, event: &str, fields: Value) {
        self.log.emit(&facts.common, event, obj(fields));
    }
}

impl Renderer for EventsRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, facts: &Facts) {
        let now = &facts.now;
        match ev {
            RunEvent::RendezvousBegins(reason) => {
                self.emit(
                    facts,
                    "rendezvous_start",
                    json!({ "reason": reason.name() }),
                );
            }
            RunEvent::RendezvousEnded(Ok(asg)) => {
                self.emit(facts, "rendezvous_complete", round(asg, now.round_s));
            }
            RunEvent::RendezvousEnded(Err(end)) => {
                let why = end.message().unwrap_or_else(|| "finished".into());
                let f = json!({ "error": why, "duration_s": now.round_s });
                self.emit(facts, "rendezvous_failed", f);
            }
            RunEvent::AttemptBegins { run_dir, .. } => self.log.run_dir(*run_dir),
            RunEvent::Spawned {
                local_rank,
                rank,
                pid,
                ..
            } => {
                let f = json!({"local_rank": local_rank, "rank": rank, "pid": pid});
                self.emit(facts, "worker_spawn", f);
            }
            RunEvent::Reaped { pid, status } => {
                if let Some(w) = now.exited {
                    let f = worker_exit(w, *pid, *status);
                    self.emit(facts, "worker_exit", f);
                }
            }
            RunEvent::Signal(sig) => self.signal(facts, *sig),
            RunEvent::StopProgress { .. } => {
                if let Some(s) = now.stop_began {
                    let f = json!({
                        "reason": s.reason.map_or("unknown", stop_reason_name),
                        "signal": signal_label(s.signal),
                        "grace_s": s.grace.as_secs_f64(),
                    });
                    self.emit(facts, "stop_begin", f);
                }
            }
            RunEvent::AttemptOver => {
                if let Some(s) = now.stop_ended {
                    let f = json!({
                        "duration_s": s.took.as_secs_f64(),
                        "grace_used_s": s.grace_used.as_secs_f64(),
                        "killed": s.killed,
                    });
                    self.emit(facts, "stop_end", f);
                }
            }
            _ => self.on_rest(ev, facts),
        }
    }
}

impl EventsRenderer {
    /// The events after an attempt's own: restarts, checks, verdicts, chaos, the run's end.
    fn on_rest(&mut self, ev: &RunEvent<'_>, facts: &Facts) {
        match ev {
            RunEvent::Restart {
                next,
                charged,
                kind,
                ..
            } => {
                let f = json!({"next_attempt": next, "charged": charged, "kind": kind});
                self.emit(facts, "restart", f);
            }
            RunEvent::RestartCost { fields, .. } => {
                self.emit(facts, "restart_cost", (*fields).clone());
            }
            RunEvent::RestartBack { restart, secs } => {
                let f = json!({"restart": restart, "back_in_user_code_s": secs});
                self.emit(facts, "restart_back", f);
            }
            RunEvent::HealthChecks(report) => {
                let f = json!({
                    "node": report.node,
                    "healthy": report.healthy(),
                    "ms": report.took.as_millis() as u64,
                    "checks": report.checks_json(),
                });
                self.emit(facts, "health_check", f);
            }
            RunEvent::NetworkCheck {
                verdict,
                peers,
                leaving,
                took,
            } => {
                let f = network_check(verdict, peers, leaving, *took);
                self.emit(facts, "network_check", f);
            }
            RunEvent::Hang(found) => {
                let f = json!({
                    "action": if found.kill { "kill" } else { "observe" },
                    "suspect_rank": found.suspect,
                    "summary": found.summary,
                });
                self.emit(facts, "hang", f);
            }
            RunEvent::ChaosInject { fields } => {
                self.emit(facts, "chaos_inject", (*fields).clone());
            }
            RunEvent::ChaosRecovered { fields, .. } => {
                self.emit(facts, "chaos_recovered", (*fields).clone());
            }
            RunEvent::RunEnd(end) => self.run_end(facts, end),
            _ => {}
        }
    }

    /// A handled signal reached rdrun.
    fn signal(&mut self, facts: &Facts, sig: i32) {
        self.signal_seen = true;
        self.emit(facts, "signal", json!({ "signal": signal_label(sig) }));
    }

    /// The run is over: `run_end` (an interrupted run's `signal` first, when none was written).
    fn run_end(&mut self, facts: &Facts, end: &RunEnd) {
        let outcome = match end {
            RunEnd::Succeeded => "succeeded",
            RunEnd::WorkersFailed(_) => "workers_failed",
            RunEnd::Interrupted { .. } => "interrupted",
            RunEnd::LauncherError(_) => "launcher_error",
            RunEnd::RendezvousLost(..) => "rendezvous_lost",
            RunEnd::BadNode(_) => "bad_node",
        };
        let mut f = obj(json!({
            "outcome": outcome,
            "exit_code": end.exit().code(),
        }));
        if let RunEnd::Interrupted { signal, .. } = end {
            // A signal outside an attempt (rendezvous, between attempts) got no event yet.
            if !self.signal_seen {
                self.signal(facts, *signal);
            }
            f.insert("signal".into(), signal_label(*signal).into());
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
        self.log.emit(&facts.common, "run_end", f);
    }
}

/// `rendezvous_complete`'s fields: the round's assignment and how long it took.
fn round(asg: &Assignment, took: f64) -> Value {
    let members: Vec<Value> = asg
        .nodes
        .iter()
        .enumerate()
        .map(|(i, (addr, n))| json!({"node_rank": i, "addr": addr, "nproc": n}))
        .collect();
    json!({
        "round": asg.round,
        "group_rank": asg.group_rank,
        "group_world_size": asg.group_world_size,
        "world_size": asg.world_size,
        "restart_count": asg.restart_count,
        "members": members,
        // c10d rounds above 256 nodes do not read every node's entry.
        "members_listed": members.len() == asg.group_world_size,
        "duration_s": took,
    })
}

/// `worker_exit`'s fields.
fn worker_exit(w: super::facts::Exited, pid: i32, status: WorkerStatus) -> Value {
    let (code, signal) = match status {
        WorkerStatus::Exited(c) => (Value::from(c), Value::Null),
        WorkerStatus::Signaled(s) => (Value::Null, Value::from(signal_label(s))),
    };
    json!({
        "local_rank": w.local_rank,
        "rank": w.rank,
        "pid": pid,
        "status": if status.success() { "succeeded" } else { "failed" },
        "exit_code": code,
        "signal": signal,
        "torchrun_code": status.torchrun_code(),
        "duration_s": w.ran_s,
    })
}

/// `network_check`'s fields: every node's score and the slow ones.
fn network_check(
    v: &NetVerdict,
    peers: &[Peer],
    leaving: &[usize],
    took: std::time::Duration,
) -> Value {
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
    json!({
        "ms": took.as_millis() as u64,
        "median_bytes_per_second": v.median_bps,
        "median_latency_ms": v.median_latency.as_secs_f64() * 1e3,
        "nodes": nodes,
        "slow": slow,
        "left_out": leaving,
    })
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
