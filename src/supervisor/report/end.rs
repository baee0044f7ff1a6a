//! How a run ended: the value [`crate::supervisor::run`] returns ([`Ended`]: the [`RunEnd`] and the restarts
//! the run took). [`RunEnd::exit`] names its process status in `crate::exit`'s terms; the binary
//! prints it (the error chain, or the failure report) once. Nothing in the supervisor prints an
//! error itself. Also the `--report-json` document of every end ([`end_json`], one schema built
//! by `report/failure_json.rs`) and its write.

use std::fmt;
use std::path::Path;

use crate::exit::Exit;
use crate::supervisor::report::failure::{self, ResolvedReport};
use crate::supervisor::report::schema::{BadNodeDoc, CheckDoc, EndKind, ReportDoc, RestartDoc};

/// A run's end and what led to it: what the binary prints, exits with and writes.
#[derive(Debug)]
pub struct Ended {
    pub end: RunEnd,
    /// The restarts and regroups the run took before it ended, in order.
    pub restarts: Vec<Restart>,
    /// This node's workers in the last attempt, as (local rank, global rank) by rank: the test
    /// cases of `--report-junit` (`ci/junit.rs`).
    pub ranks: Vec<(usize, usize)>,
    /// `--chaos`: `--report-json`'s `chaos` section (`supervisor/chaos/table.rs`).
    pub chaos: Option<serde_json::Value>,
}

impl From<RunEnd> for Ended {
    /// An end before any attempt could restart.
    fn from(end: RunEnd) -> Ended {
        Ended {
            end,
            restarts: Vec::new(),
            ranks: Vec::new(),
            chaos: None,
        }
    }
}

/// One restart or regroup the run took: `--report-json`'s `restarts` lists them, so that a run
/// that recovered still says what it recovered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// TORCHELASTIC_RESTART_COUNT of the attempt that ended (a free regroup does not raise it).
    pub restart_count: u32,
    /// Whether it used one of `--max-restarts`.
    pub charged: bool,
    /// What ended the attempt: the run's root cause (`ValueError at train.py:88`, `exit code
    /// 3`), `hang`, `node(s) lost: …`, `membership change`.
    pub cause: String,
    /// What the restart cost, phase by phase (`report/restart_cost.rs`), once the next attempt's
    /// workers were spawned; `None` when none followed.
    pub cost: Option<serde_json::Value>,
}

/// The end of one launch.
#[derive(Debug)]
pub enum RunEnd {
    /// Every worker exited 0 (or the job was over before this node could join it).
    Succeeded,
    /// Workers failed and no restart was left: the report, error files read once.
    WorkersFailed(ResolvedReport),
    /// A shutdown signal reached rdrun; the workers that failed while being stopped, if any.
    Interrupted {
        signal: i32,
        report: Option<ResolvedReport>,
    },
    /// rdrun itself failed: a worker could not be started, a bind failed, a rendezvous timed out.
    LauncherError(LaunchError),
    /// The rendezvous was closed elsewhere or its store was lost: the run cannot go on. With
    /// every node's failure counts (`nodes::failure_counts::report_json`) when any node failed.
    RendezvousLost(String, Option<serde_json::Value>),
    /// This node failed its health check under `--health-check on` (issue 28): no worker
    /// started; requeue the job elsewhere.
    BadNode(BadNode),
}

/// A node that failed its health check: what `--report-json` and the error line name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadNode {
    pub node: String,
    /// `node n1 failed the health check: command: ...` (every failed check).
    pub line: String,
    /// (check, detail) of each failed check.
    pub failed: Vec<(String, String)>,
    /// Workers ran on this node before it left (a node that failed `--max-node-failures`
    /// times, or one found slow after a round): the message does not say "no worker started".
    pub workers_ran: bool,
    /// This node's failure counts (`verdict::NodeFailures::to_json`), when it had any.
    pub node_failures: Option<serde_json::Value>,
}

impl BadNode {
    pub fn of(report: &crate::health::HealthReport, line: String) -> BadNode {
        BadNode {
            node: report.node.clone(),
            line,
            failed: report
                .failed()
                .map(|v| (v.check.to_string(), v.detail.clone()))
                .collect(),
            workers_ran: false,
            node_failures: None,
        }
    }

    /// A bad node found by a check of its own (`check`: `network`, `failures`), not the health
    /// checks.
    pub fn found(node: String, check: &str, detail: String, line: String) -> BadNode {
        BadNode {
            node,
            line,
            failed: vec![(check.to_string(), detail)],
            workers_ran: false,
            node_failures: None,
        }
    }

    /// `bad_node` of `--report-json`: the node and its failed checks, so that a requeue script
    /// can add it to `--exclude`.
    pub fn doc(&self) -> BadNodeDoc {
        BadNodeDoc {
            node: self.node.clone(),
            message: self.line.clone(),
            failed_checks: self
                .failed
                .iter()
                .map(|(check, detail)| CheckDoc {
                    check: check.clone(),
                    detail: detail.clone(),
                })
                .collect(),
        }
    }
}

impl RunEnd {
    /// The status of a run that ended so: success, the root cause's own status for a worker
    /// failure, the signal's after a signal, a launcher failure for a launcher error or a lost
    /// rendezvous.
    pub fn exit(&self) -> Exit {
        match self {
            RunEnd::Succeeded => Exit::Success,
            RunEnd::WorkersFailed(report) => report.exit(),
            RunEnd::Interrupted { signal, .. } => Exit::Signal(*signal),
            RunEnd::RendezvousLost(why, _)
                if crate::supervisor::report::traceback::verdict_in(why).is_some() =>
            {
                Exit::DoNotRequeue
            }
            RunEnd::LauncherError(_) | RunEnd::RendezvousLost(..) => Exit::LauncherFailure,
            RunEnd::BadNode(_) => Exit::BadNode,
        }
    }

    /// A launcher error from a message.
    pub fn error(msg: impl Into<String>) -> RunEnd {
        RunEnd::LauncherError(LaunchError::Message(msg.into()))
    }

    /// A launcher error from an error value (its whole source chain is printed).
    pub fn from_error(err: impl std::error::Error + Send + Sync + 'static) -> RunEnd {
        RunEnd::LauncherError(LaunchError::Error(Box::new(err)))
    }

    /// The end with rdrun's verdict that restarting cannot help (the same failure in a row,
    /// `verdict.rs`): a worker failure's report carries it and exits "do not requeue".
    pub fn with_verdict(self, line: String) -> RunEnd {
        match self {
            RunEnd::WorkersFailed(r) => RunEnd::WorkersFailed(r.with_verdict(line)),
            other => other,
        }
    }

    /// The failure report of this end, if it has one.
    pub fn report(&self) -> Option<&ResolvedReport> {
        match self {
            RunEnd::WorkersFailed(r) => Some(r),
            RunEnd::Interrupted { report, .. } => report.as_ref(),
            _ => None,
        }
    }

    /// What the binary prints on stderr at the end (`None`: nothing): the report block, or
    /// `rdrun: error: <chain>`.
    pub fn message(&self) -> Option<String> {
        match self {
            RunEnd::Succeeded => None,
            RunEnd::WorkersFailed(r) => Some(failure::render(r)),
            RunEnd::Interrupted { report, .. } => report.as_ref().map(failure::render),
            RunEnd::LauncherError(e) => Some(format!("rdrun: error: {e}")),
            RunEnd::RendezvousLost(msg, _) => Some(format!("rdrun: error: {msg}")),
            RunEnd::BadNode(b) => Some(format!(
                "rdrun: error: {}{} (exit {}: bad node, requeue elsewhere)",
                b.line,
                if b.workers_ran {
                    ""
                } else {
                    "; no worker started"
                },
                Exit::BadNode.code()
            )),
        }
    }
}

/// Why rdrun itself failed.
#[derive(Debug)]
pub enum LaunchError {
    Message(String),
    Error(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for LaunchError {
    /// The message with its source chain on one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::Message(m) => f.write_str(m),
            LaunchError::Error(e) => f.write_str(&error_chain(e.as_ref())),
        }
    }
}

/// An error and its sources on one line (`a: b: c`). A source whose text the line already ends
/// with (an error that prints its source, `#[error("…: {source}")]`) is not repeated; any other
/// source is kept, even when its text occurs elsewhere in the line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !msg.ends_with(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// The `--report-json` document of any end ([`ReportDoc`], `docs/report-json.md`), success
/// included: a stale report of an earlier failed run must never outlive a rerun. `exit_code` is
/// always rdrun's own status for this end; `restarts` lists what the run recovered from.
/// `root_cause_kind`: null for a success, `failure`/`hang` with a failure report, `signal` for a
/// shutdown signal (with any failures of the stop), `launcher` for rdrun's own error,
/// `rendezvous` (the rendezvous was closed elsewhere or lost: `message` says why,
/// `node_failures` which node failed how often; when the other node stopped with the stop
/// verdict, `verdict` is its line and `exit_code` 93, as this node's own status), `bad_node`.
pub fn end_json(ended: &Ended) -> ReportDoc {
    let end = &ended.end;
    let code = end.exit().code();
    let mut doc = match end {
        RunEnd::WorkersFailed(r) => failure::to_json(r),
        RunEnd::Interrupted { signal, report } => ReportDoc {
            root_cause_kind: Some(EndKind::Signal),
            message: Some(format!("received {}", crate::exit::signal_label(*signal))),
            ..match report {
                Some(r) => failure::to_json(r),
                None => ReportDoc::new(code, None),
            }
        },
        RunEnd::BadNode(bad) => ReportDoc {
            bad_node: Some(bad.doc()),
            node_failures: bad.node_failures.clone(),
            ..ReportDoc::new(code, Some(EndKind::BadNode))
        },
        RunEnd::RendezvousLost(msg, counts) => ReportDoc {
            message: Some(msg.clone()),
            verdict: crate::supervisor::report::traceback::verdict_in(msg).map(String::from),
            node_failures: counts.clone(),
            ..ReportDoc::new(code, Some(EndKind::Rendezvous))
        },
        RunEnd::LauncherError(e) => ReportDoc {
            message: Some(e.to_string()),
            ..ReportDoc::new(code, Some(EndKind::Launcher))
        },
        RunEnd::Succeeded => ReportDoc::new(code, None),
    };
    // A report's own exit code is its root cause's; the end's is what rdrun exits with (a
    // signal to rdrun, the stop verdict).
    doc.exit_code = code;
    doc.chaos = ended.chaos.clone();
    doc.restarts = ended
        .restarts
        .iter()
        .map(|r| RestartDoc {
            restart_count: r.restart_count,
            charged: r.charged,
            cause: r.cause.clone(),
            seconds: r.cost.clone(),
        })
        .collect();
    doc
}

/// Writes `--report-json` ([`end_json`]) for every end, atomically (a reader never sees half a
/// report, nor the previous run's once this one has ended); errors are logged.
pub fn write_end_json(ended: &Ended, json: Option<&Path>) {
    let Some(path) = json else {
        return;
    };
    if let Err(err) = failure::write_json_doc(path, &end_json(ended)) {
        tracing::error!("--report-json: {err}");
    }
}

/// Copies the root cause into a parent scheduler's TORCHELASTIC_ERROR_FILE (`parent`), as
/// torchrun's `@record`-wrapped main does (spec torchrun-compat §3.9). Errors are logged: the
/// report on stderr stays the output.
pub fn write_parent_error_file(report: &ResolvedReport, parent: Option<&Path>) {
    match parent {
        Some(parent) => {
            if let Err(err) = failure::copy_to_parent_error_file(parent, report) {
                tracing::error!("cannot copy the root cause to TORCHELASTIC_ERROR_FILE: {err}");
            }
        }
        None => tracing::debug!("no error file defined for parent, to copy child error file"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{msg}")]
    struct E {
        msg: String,
        #[source]
        source: Option<Box<E>>,
    }

    fn e(msg: &str, source: Option<E>) -> E {
        E {
            msg: msg.into(),
            source: source.map(Box::new),
        }
    }

    #[test]
    fn error_chain_is_one_line_without_repeats() {
        // An error that prints its source: not repeated.
        let err = e(
            "cannot serve the rendezvous store at h:1: connection refused",
            Some(e("connection refused", None)),
        );
        assert_eq!(
            error_chain(&err),
            "cannot serve the rendezvous store at h:1: connection refused"
        );
        // Issue 9: a distinct cause whose text occurs inside the message is kept.
        let err = e(
            "connection refused twice, giving up",
            Some(e("refused", None)),
        );
        assert_eq!(
            error_chain(&err),
            "connection refused twice, giving up: refused"
        );
        // Three levels, the middle one printing its source.
        let err = e(
            "join failed",
            Some(e("store: timed out", Some(e("timed out", None)))),
        );
        assert_eq!(error_chain(&err), "join failed: store: timed out");
    }

    #[test]
    fn messages() {
        assert_eq!(RunEnd::Succeeded.message(), None);
        assert_eq!(
            RunEnd::error("bad").message().as_deref(),
            Some("rdrun: error: bad")
        );
        let err = e("outer", Some(e("inner", None)));
        assert_eq!(
            RunEnd::from_error(err).message().as_deref(),
            Some("rdrun: error: outer: inner")
        );
        assert_eq!(
            RunEnd::Interrupted {
                signal: 15,
                report: None
            }
            .message(),
            None
        );
    }

    #[test]
    fn run_ends() {
        use crate::exit::{WorkerStatus, LAUNCHER_FAILURE, SUCCESS};
        use crate::supervisor::report::failure::{Failure, FailureReport};
        let failed = |status| {
            RunEnd::WorkersFailed(
                FailureReport {
                    name: "x".into(),
                    host: "h".into(),
                    failures: vec![Failure {
                        local_rank: 0,
                        rank: 0,
                        pid: 1,
                        status,
                        observed_at: std::time::SystemTime::now(),
                        error_file: None,
                        stderr_tail: Vec::new(),
                        traceback: None,
                        abandoned: false,
                        stop_sent_at: None,
                    }],
                }
                .resolve(),
            )
        };
        let table = [
            (RunEnd::Succeeded, SUCCESS),
            (failed(WorkerStatus::Exited(3)), 3),
            (failed(WorkerStatus::Signaled(9)), 137),
            (
                RunEnd::Interrupted {
                    signal: 2,
                    report: None,
                },
                130,
            ),
            (RunEnd::error("x"), LAUNCHER_FAILURE),
            (
                RunEnd::RendezvousLost("gone".into(), None),
                LAUNCHER_FAILURE,
            ),
        ];
        for (end, want) in table {
            assert_eq!(end.exit().code(), want, "{end:?}");
        }
    }

    /// A node told by another's close that the stop verdict ended the job: exit 93, and its
    /// `--report-json` says the same (exit code and verdict line); a plain failure elsewhere: 1.
    #[test]
    fn a_job_closed_with_a_verdict_elsewhere_exits_do_not_requeue() {
        use crate::exit::{DO_NOT_REQUEUE, LAUNCHER_FAILURE};
        let line = "the same failure 2 attempts in a row: exit code 3; not restarting";
        let why = format!("the job failed on node 1 (h1): {line}; its agent closed the rendezvous");
        let end = RunEnd::RendezvousLost(why.clone(), None);
        assert_eq!(end.exit().code(), DO_NOT_REQUEUE);
        let v = end_json(&Ended::from(end)).to_value();
        assert_eq!(v["exit_code"], DO_NOT_REQUEUE);
        assert_eq!(v["verdict"], line);
        let plain = "the job failed on node 1 (h1); its agent closed the rendezvous";
        let end = RunEnd::RendezvousLost(plain.into(), None);
        assert_eq!(end.exit().code(), LAUNCHER_FAILURE);
        let v = end_json(&Ended::from(end)).to_value();
        assert_eq!(v["exit_code"], LAUNCHER_FAILURE);
        assert!(v["verdict"].is_null(), "{v}");
    }

    /// Issue 38 item 1: every end has a `--report-json` document of the one schema, with the
    /// end's own exit code and the restarts the run took (a success that recovered included).
    #[test]
    fn every_end_has_a_report_json_of_one_schema() {
        let restarts = vec![Restart {
            restart_count: 0,
            charged: true,
            cause: "exit code 3".into(),
            cost: None,
        }];
        let ends = [
            (RunEnd::Succeeded, 0, serde_json::Value::Null),
            (
                RunEnd::Interrupted {
                    signal: 15,
                    report: None,
                },
                143,
                "signal".into(),
            ),
            (RunEnd::error("bind failed"), 1, "launcher".into()),
            (
                RunEnd::RendezvousLost("gone".into(), None),
                1,
                "rendezvous".into(),
            ),
            (
                RunEnd::BadNode(BadNode::found(
                    "n1".into(),
                    "network",
                    "slow".into(),
                    "node n1 is slow".into(),
                )),
                75,
                "bad_node".into(),
            ),
        ];
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
            k.retain(|k| k != "message" && k != "bad_node");
            k.sort();
            k
        };
        let want = keys(&end_json(&Ended::from(RunEnd::Succeeded)).to_value());
        for (end, code, kind) in ends {
            let ended = Ended {
                end,
                restarts: restarts.clone(),
                ranks: Vec::new(),
                chaos: None,
            };
            let v = end_json(&ended).to_value();
            assert_eq!(v["schema"], "rdrun.failure-report/1", "{v}");
            assert_eq!(v["exit_code"], code, "{v}");
            assert_eq!(v["root_cause_kind"], kind, "{v}");
            assert_eq!(
                v["restarts"],
                serde_json::json!([{"restart_count": 0, "charged": true, "cause": "exit code 3"}]),
                "{v}"
            );
            assert_eq!(keys(&v), want, "{v}");
        }
        let v = end_json(&Ended::from(RunEnd::Interrupted {
            signal: 15,
            report: None,
        }))
        .to_value();
        assert_eq!(v["message"], "received SIGTERM", "{v}");
    }
}
