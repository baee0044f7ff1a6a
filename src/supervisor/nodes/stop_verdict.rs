//! The stop verdict for deterministic crashes (issue 28 item 5): what "the same failure" means,
//! and the count of same failures in a row that [`crate::supervisor::group::restart::decide`] reads.
//!
//! A failed attempt's signature is its root cause's (the rank [`crate::supervisor::report::failure`] chose): the
//! exception type and the innermost frame (file and line) of its Python traceback, from the
//! error file's `py_callstack` or from stderr; without a traceback, its exit status. The
//! exception's message is not part of it (it often carries a step number or a tensor value that
//! differs between two runs of the same bug). An attempt that did not end with a plain worker
//! failure (success, a regroup, a peer loss, a hang, a signal to rdrun, a launcher error) has no
//! signature and resets the count: only failures that follow each other directly are "in a row".
//! On a multi-node run the signature counted is the run's root cause, agreed between the nodes
//! (`nodes/root_cause.rs`), not what one node's workers saw: a node whose workers only lost their peer
//! counts the failure that killed the peer.

use std::fmt;

use crate::exit::WorkerStatus;

use crate::exit::signal_name;
use crate::supervisor::group::outcome::Outcome;
use crate::supervisor::report::failure::ResolvedReport;
use crate::supervisor::report::traceback::{parse_traceback, NOT_RESTARTING, VERDICT_HEAD};

/// What identifies a root cause across attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// A Python exception: its type (as printed, `torch.OutOfMemoryError`) and innermost frame.
    Exception {
        kind: String,
        file: String,
        line: u32,
    },
    /// No traceback: the worker's exit status.
    Status(WorkerStatus),
}

impl fmt::Display for Signature {
    /// `ValueError at train.py:88` (the file's last path component), `exit code 3`,
    /// `signal 9 (SIGKILL)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signature::Exception { kind, file, line } => {
                let base = file.rsplit('/').next().unwrap_or(file);
                write!(f, "{kind} at {base}:{line}")
            }
            Signature::Status(WorkerStatus::Exited(code)) => write!(f, "exit code {code}"),
            Signature::Status(WorkerStatus::Signaled(n)) => match signal_name(*n) {
                Some(name) => write!(f, "signal {n} ({name})"),
                None => write!(f, "signal {n}"),
            },
        }
    }
}

/// The signature of a resolved report's root cause; `None` without a root cause or for a hang
/// (rdrun stopped the group: not the program's own failure).
pub fn of_report(report: &ResolvedReport) -> Option<Signature> {
    if report.hang().is_some() {
        return None;
    }
    let status = report.root_status()?;
    // Where the rank printed a traceback, it decides, whatever status the rank then died with
    // (a SIGABRT in teardown after the traceback is not a different failure: issue 38 item 2).
    let parsed = report
        .root_traceback()
        .and_then(parse_traceback)
        .or_else(|| report.root_printed_traceback().and_then(parse_traceback));
    Some(match parsed {
        Some((kind, file, line)) => Signature::Exception { kind, file, line },
        None => Signature::Status(status),
    })
}

/// This node's worker failures in this run, by root cause (issue 28 item 4, `--max-node-failures`):
/// every attempt that ended with a failure of this node's own workers counts (a hang that rdrun
/// stopped too, as `hang`); one charged to a lost peer does not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NodeFailures {
    pub count: u32,
    /// Root cause (a [`Signature`]'s text, or `hang`) and how many times it ended an attempt.
    pub causes: std::collections::BTreeMap<String, u32>,
}

impl NodeFailures {
    /// Counts `outcome` if it was this node's failure (`sig`: its signature, from
    /// [`SameFailure::last`] after recording it); returns the count so far.
    pub(in crate::supervisor) fn record(
        &mut self,
        outcome: &Outcome,
        sig: Option<&Signature>,
    ) -> u32 {
        let cause = match outcome {
            Outcome::Failed {
                peer_loss: None,
                hang: Some(_),
                ..
            } => "hang".to_string(),
            Outcome::Failed {
                peer_loss: None, ..
            } => sig.map_or_else(|| "unknown".to_string(), ToString::to_string),
            _ => return self.count,
        };
        self.count += 1;
        *self.causes.entry(cause).or_default() += 1;
        self.count
    }

    /// `2 (ValueError at train.py:88 ×1, exit code 3 ×1)`.
    pub fn summary(&self) -> String {
        let causes: Vec<String> = self
            .causes
            .iter()
            .map(|(c, n)| format!("{c} ×{n}"))
            .collect();
        format!("{} ({})", self.count, causes.join(", "))
    }

    /// The report's `node_failures`: `{"node", "count", "causes": [{"cause", "count"}]}`.
    pub fn to_json(&self, node: &str) -> serde_json::Value {
        let causes: Vec<serde_json::Value> = self
            .causes
            .iter()
            .map(|(c, n)| serde_json::json!({"cause": c, "count": n}))
            .collect();
        serde_json::json!({"node": node, "count": self.count, "causes": causes})
    }
}

/// The count of same failures in a row, updated once per attempt.
#[derive(Debug, Default)]
pub struct SameFailure {
    last: Option<Signature>,
    in_a_row: u32,
}

impl SameFailure {
    /// Records the signature of an attempt's end (`None`: not a plain worker failure) and
    /// returns how many attempts in a row ended with it (0 without one).
    pub fn record_signature(&mut self, sig: Option<Signature>) -> u32 {
        match sig {
            Some(s) if self.last.as_ref() == Some(&s) => {
                self.in_a_row = self.in_a_row.saturating_add(1)
            }
            Some(s) => {
                self.last = Some(s);
                self.in_a_row = 1;
            }
            None => {
                self.last = None;
                self.in_a_row = 0;
            }
        }
        self.in_a_row
    }

    /// Whether the next attempt's failure could reach the stop verdict of `max_same_failures`
    /// (0: off): the same failure once more, or a first one where a single one is enough.
    pub fn could_reach(&self, max_same_failures: u32) -> bool {
        max_same_failures > 0 && self.in_a_row.saturating_add(1) >= max_same_failures
    }

    /// The signature of the last attempt recorded, if it was a plain worker failure.
    pub fn last(&self) -> Option<&Signature> {
        self.last.as_ref()
    }

    /// The one line that says why rdrun stops: `the same failure 2 attempts in a row:
    /// ValueError at train.py:88; not restarting`.
    pub fn verdict(&self) -> String {
        let what = self
            .last
            .as_ref()
            .map_or_else(|| "unknown".to_string(), ToString::to_string);
        format!(
            "{VERDICT_HEAD}{} attempts in a row: {what}{NOT_RESTARTING}",
            self.in_a_row
        )
    }
}

#[cfg(test)]
#[path = "stop_verdict_tests.rs"]
mod tests;
