//! The failure report as JSON (`report.rs`'s [`super::ResolvedReport`], kept apart by job): the
//! `--report-json` document and the nested error-file copy a parent launcher reads
//! (TORCHELASTIC_ERROR_FILE of an outer torchrun/rdrun). Pure functions of the resolved report,
//! plus the two writes. The document is `schema.rs`'s [`ReportDoc`], the one type every end's
//! `--report-json` is (a failure report's here, the other ends' in `end.rs`).

use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use crate::supervisor::report::schema::{EndKind, FailureDoc, ReportDoc};

use super::*;

/// The report as the `--report-json` document ([`ReportDoc`], schema `rdrun.failure-report/1`,
/// `docs/report-json.md`): every failure with its resolved error file, message and traceback.
/// `exitcode` is torchrun's (negative for a signal); `stopped_by_rdrun`: the signal came from
/// rdrun's stop; `stopped_after_failing`: it did, after the worker's error file recorded its
/// failure (the worker then counts as exit 1, [`ResolvedReport::status_of`]); `exit_code` is
/// rdrun's; `root_cause_kind` is `hang` when rdrun stopped the group for a hang (then `hang` is
/// its one-line summary), otherwise `failure`; `verdict`: why rdrun stopped restarting a failure
/// it could have retried (then `exit_code` is the do-not-requeue code).
pub fn to_json(report: &ResolvedReport) -> ReportDoc {
    to_json_with(report, &format_local_time)
}

pub(super) fn to_json_with(report: &ResolvedReport, time: &dyn Fn(i64) -> String) -> ReportDoc {
    let failures = report
        .failures
        .iter()
        .zip(&report.resolved)
        .enumerate()
        .map(|(index, (f, r))| FailureDoc {
            index,
            rank: f.rank,
            local_rank: f.local_rank,
            pid: f.pid,
            exitcode: f.status.torchrun_code(),
            signal: match f.status {
                WorkerStatus::Signaled(n) => signal_name(n).map(String::from),
                WorkerStatus::Exited(_) => None,
            },
            time: time(r.time),
            timestamp: r.time,
            error_file: r.error_file_path.clone(),
            error_file_error: r.error_file_problem.clone(),
            message: r.short.clone(),
            traceback: r.traceback.clone(),
            stderr_tail: f.stderr_tail.clone(),
            stopped_by_rdrun: f.stop_sent_at.is_some()
                && matches!(f.status, WorkerStatus::Signaled(_)),
            stopped_after_failing: r.stopped_after_failing,
        })
        .collect();
    let kind = if report.hang.is_some() {
        EndKind::Hang
    } else {
        EndKind::Failure
    };
    ReportDoc {
        name: Some(report.name.clone()),
        host: Some(report.host.clone()),
        root_cause: report.root,
        hang: report.hang.clone(),
        verdict: report.verdict.clone(),
        node_failures: report.node_failures.clone(),
        failures,
        ..ReportDoc::new(report.exit_code(), Some(kind))
    }
}

/// Writes `doc` (pretty, with a final newline) to `path` atomically: into a temporary file in
/// the same directory, then renamed over `path`, so that a reader sees the old document or the
/// new one, never a mix or an empty file (a script may poll the file while rdrun ends). A
/// symbolic link is followed (the file it names is replaced, not the link); a path that is not
/// a regular file (`/dev/stdout`, a FIFO) is written in place, as rename cannot replace it.
pub fn write_json_doc(path: &Path, doc: &impl Serialize) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(doc).map_err(io::Error::other)?;
    text.push('\n');
    let named =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()));
    let target = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
        return fs::write(&target, text).map_err(named);
    }
    let Some(file) = target.file_name() else {
        return Err(named(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        )));
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, &target));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(named)
}

/// The JSON rdrun writes to its own TORCHELASTIC_ERROR_FILE when nested under a scheduler:
/// the root cause's error file with `message.errorCode = <exitcode>` (torchrun's exit code,
/// negative for a signal; dict-form messages only, as torchrun). Without a usable error file,
/// rdrun synthesizes the dict form: `{"message": {"message": <exception line, signal line or
/// hint>, "extraInfo": {"py_callstack": <captured traceback, else the last stderr lines, else
/// the message>, "timestamp": "<secs>"}, "errorCode": <exitcode>}}`. `None` without failures.
pub fn parent_error_json(report: &ResolvedReport) -> Option<Value> {
    let root = report.root?;
    let f = &report.failures[root];
    let r = &report.resolved[root];
    let code = report.status_of(root).torchrun_code();
    if let Some(mut data) = r.data.clone() {
        if code != 0 {
            if let Some(m) = data.get_mut("message").and_then(Value::as_object_mut) {
                m.insert("errorCode".into(), json!(code));
            }
        }
        return Some(data);
    }
    let callstack = match &r.traceback {
        Some(tb) => tb.join("\n") + "\n",
        None if !f.stderr_tail.is_empty() => f.stderr_tail.join("\n") + "\n",
        None => r.short.clone(),
    };
    Some(json!({
        "message": {
            "message": r.short,
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": r.time.to_string(),
            },
            "errorCode": code,
        }
    }))
}

/// Writes [`parent_error_json`] to `parent_path` (replacing any file there, as torchrun does).
pub fn copy_to_parent_error_file(parent_path: &Path, report: &ResolvedReport) -> io::Result<()> {
    let Some(data) = parent_error_json(report) else {
        return Ok(());
    };
    match fs::remove_file(parent_path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot replace {}: {e}", parent_path.display()),
            ))
        }
    }
    let text = serde_json::to_string(&data).map_err(io::Error::other)?;
    fs::write(parent_path, text).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot write {}: {e}", parent_path.display()),
        )
    })
}
