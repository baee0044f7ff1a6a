//! The `--report-json` document as one type: [`ReportDoc`] and its parts, serialised by serde
//! (schema [`SCHEMA`], documented member by member in `docs/report-json.md`). Every kind of end
//! builds this struct (`end.rs`, `failure_json.rs`), so no end can miss a member a script reads,
//! and the CI outputs (`ci/`) read the same struct back rather than poking at JSON by name.
//!
//! Versioning: a member may be added under the same schema name (readers ignore what they do not
//! know); renaming, removing or retyping a member bumps the number after the slash.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The schema name every document carries in `schema`.
pub const SCHEMA: &str = "rdrun.failure-report/1";

/// One run's end, as `--report-json` writes it (success included). Read back, a member left out
/// takes its default, as a reader of a newer or older document expects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportDoc {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The failure report's job name (`--run_id`'s job, as torchrun's block prints it).
    pub name: Option<String>,
    /// The host the failures were seen on.
    pub host: Option<String>,
    /// rdrun's own exit status for this end.
    pub exit_code: i32,
    /// Index into `failures` of the root cause.
    pub root_cause: Option<usize>,
    /// What ended the run; null for a success.
    pub root_cause_kind: Option<EndKind>,
    /// One-line summary of the hang rdrun stopped the group for.
    pub hang: Option<String>,
    /// Why rdrun stopped restarting a failure it could have retried (the stop verdict's line).
    pub verdict: Option<String>,
    /// Every node's failure counts by root cause (`nodes::stop_verdict::NodeFailures::to_json`,
    /// the same document the nodes share through the store).
    pub node_failures: Option<Value>,
    /// The workers that failed, in the order rdrun saw them.
    pub failures: Vec<FailureDoc>,
    /// The restarts and regroups the run took before it ended.
    pub restarts: Vec<RestartDoc>,
    /// What ended the run, in words, for the ends without a failure report (signal, launcher
    /// error, lost rendezvous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The node that failed its checks, for `root_cause_kind` `bad_node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad_node: Option<BadNodeDoc>,
    /// `--chaos` (issue 41): the seed, every injected fault with its measures, the table by
    /// kind and whether every fault was survived (`supervisor/chaos/table.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chaos: Option<Value>,
}

/// `root_cause_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndKind {
    /// A worker failed (a failure report).
    Failure,
    /// rdrun stopped the group for a hang (a failure report with `hang`).
    Hang,
    /// A shutdown signal reached rdrun.
    Signal,
    /// rdrun itself failed.
    Launcher,
    /// The rendezvous was closed elsewhere or lost.
    Rendezvous,
    /// This node failed a check and left.
    BadNode,
}

impl EndKind {
    /// The name the document spells (`"bad_node"`).
    pub fn name(self) -> &'static str {
        match self {
            EndKind::Failure => "failure",
            EndKind::Hang => "hang",
            EndKind::Signal => "signal",
            EndKind::Launcher => "launcher",
            EndKind::Rendezvous => "rendezvous",
            EndKind::BadNode => "bad_node",
        }
    }
}

/// One failed worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FailureDoc {
    pub index: usize,
    pub rank: usize,
    pub local_rank: usize,
    pub pid: u32,
    /// torchrun's exit code: negative for a signal.
    pub exitcode: i32,
    /// The signal's name (`SIGKILL`), when it died of one.
    pub signal: Option<String>,
    /// `time` as torchrun's block prints it (local time).
    pub time: String,
    /// The same, in whole seconds since the epoch.
    pub timestamp: i64,
    pub error_file: Option<String>,
    /// Why the error file could not be used, when it could not.
    pub error_file_error: Option<String>,
    /// One-line summary: the exception line, the signal, or the hint.
    pub message: String,
    pub traceback: Option<Vec<String>>,
    pub stderr_tail: Vec<String>,
    /// The signal came from rdrun's own stop.
    pub stopped_by_rdrun: bool,
    /// It did, after the worker's error file recorded its failure.
    pub stopped_after_failing: bool,
}

/// One restart or regroup (`end::Restart`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestartDoc {
    /// TORCHELASTIC_RESTART_COUNT of the attempt that ended.
    pub restart_count: u32,
    /// Whether it used one of `--max-restarts`.
    pub charged: bool,
    /// What ended the attempt.
    pub cause: String,
    /// What the restart cost, phase by phase (`restart_cost.rs`), when a next attempt spawned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<Value>,
}

/// `bad_node`: a requeue script adds `node` to `--exclude`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BadNodeDoc {
    pub node: String,
    /// The one-line error rdrun printed.
    pub message: String,
    pub failed_checks: Vec<CheckDoc>,
}

/// One failed check of a bad node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckDoc {
    pub check: String,
    pub detail: String,
}

impl ReportDoc {
    /// A document with every member empty: what a kind of end does not know stays null.
    pub fn new(exit_code: i32, kind: Option<EndKind>) -> ReportDoc {
        ReportDoc {
            schema: SCHEMA.to_string(),
            name: None,
            host: None,
            exit_code,
            root_cause: None,
            root_cause_kind: kind,
            hang: None,
            verdict: None,
            node_failures: None,
            failures: Vec::new(),
            restarts: Vec::new(),
            message: None,
            bad_node: None,
            chaos: None,
        }
    }

    /// The document as a JSON value (for the tests and the readers that want one).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every member a full document serialises (nested ones too) is a row of
    /// `docs/report-json.md`: the page cannot fall behind the type.
    #[test]
    fn every_member_is_documented() {
        let page = include_str!("../../../docs/report-json.md");
        let doc = ReportDoc {
            name: Some("t.py".into()),
            message: Some("m".into()),
            bad_node: Some(BadNodeDoc {
                node: "n1".into(),
                message: "bad".into(),
                failed_checks: vec![CheckDoc {
                    check: "network".into(),
                    detail: "slow".into(),
                }],
            }),
            failures: vec![FailureDoc::default()],
            restarts: vec![RestartDoc {
                restart_count: 0,
                charged: true,
                cause: "exit code 3".into(),
                seconds: Some(Value::Null),
            }],
            ..ReportDoc::new(1, Some(EndKind::Failure))
        };
        let v = doc.to_value();
        let mut names: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for nested in [&v["failures"][0], &v["restarts"][0]] {
            names.extend(nested.as_object().unwrap().keys().map(String::as_str));
        }
        for name in names {
            assert!(
                page.contains(&format!("| `{name}` |")),
                "docs/report-json.md has no row for `{name}`"
            );
        }
        for key in ["node", "message", "failed_checks", "check", "detail"] {
            assert!(page.contains(&format!("`{key}`")), "{key}");
        }
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["root_cause_kind"], "failure");
    }

    /// A document survives a write and a read unchanged; a member left out reads as its default.
    #[test]
    fn round_trip_and_lenient_read() {
        let doc = ReportDoc::new(75, Some(EndKind::BadNode));
        let back: ReportDoc = serde_json::from_value(doc.to_value()).unwrap();
        assert_eq!(back, doc);
        let sparse: ReportDoc = serde_json::from_str(r#"{"exit_code": 3}"#).unwrap();
        assert_eq!(sparse.exit_code, 3);
        assert!(sparse.failures.is_empty());
        for kind in [
            EndKind::Failure,
            EndKind::Hang,
            EndKind::Signal,
            EndKind::Launcher,
            EndKind::Rendezvous,
            EndKind::BadNode,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
        }
    }
}
