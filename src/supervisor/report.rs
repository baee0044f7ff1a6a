//! The failure report: torchrun's ChildFailedError summary layout plus rdrun's extras (stderr
//! tail, Python traceback taken from stderr), `--report-json`, and the nested error-file copy.
//!
//! Two steps. [`FailureReport::resolve`] reads every worker's error file (TORCHELASTIC_ERROR_FILE,
//! spec torchrun-compat.md §3.9) exactly once and chooses the root cause, giving a
//! [`ResolvedReport`]; the agent resolves before [`super::output::RunLogs::finish`] may remove the
//! files. Everything after that is a pure function of the resolved value: [`render`], [`to_json`],
//! [`parent_error_json`] and [`ResolvedReport::exit_code`], so that the exit status and the
//! rendered root cause can never disagree. This file never decides whether to stop or restart.
//!
//! Root cause (issue 11): the first failure rdrun observed that it did not cause itself. A worker
//! that exited after rdrun had begun stopping the group ([`Failure::stop_sent_at`]) is a
//! bystander, unless its error file was written a whole second before that stop (timestamps have
//! whole-second resolution, so only an earlier second proves it). Among the workers that failed
//! on their own, the order is (whole second, observation time, detection order), where the whole
//! second is the error file's timestamp when there is one: a timestamp refines the order only
//! when it names an earlier second than the observation. Only when every failure was caused by
//! rdrun (a shutdown signal, a regroup) is the same order applied to all of them. torchrun orders
//! by the error file's timestamp alone, so a bystander that writes its file on SIGTERM in the same
//! second can become its root cause.
//!
//! Block layout (spec §3.8, torch `ChildFailedError.format_msg`): W = min(60, max(len(title),
//! longest line of any failure block)); `[idx]` = detection order. Each failure's time, message
//! and error_file follow torchrun:
//! - error file with a dict message: time = `message.extraInfo.timestamp`, traceback =
//!   `extraInfo.py_callstack` (else `message.message`, else `<N/A>`) with every "\n" indented by 2;
//!   a string message is shown as is, time = top-level `timestamp` (0 if absent).
//! - no error file: time = when the agent saw the exit; traceback = `Signal N (NAME) received by
//!   PID p` for a signal, else the "To enable traceback" hint.
//!
//! rdrun's differences (docs/compat.md):
//! - A worker that exited 1 without an error file but printed a Python traceback on stderr (see
//!   [`super::output::OutputSummary::traceback`]) gets that traceback in the `traceback :` field,
//!   laid out as `@record`'s would be: no `@record` needed. (1 is Python's status for an uncaught
//!   exception; another code means the program chose its status, so an earlier, handled
//!   traceback is not blamed.)
//! - An error file that is not valid JSON (torchrun crashes on it) is named in the block as
//!   `error_file: <path> (invalid: <why>)`, and the failure is shown as if there were none.
//! - After torchrun's block, the root cause's last stderr lines (up to 20), unless they are just
//!   the end of the traceback already shown.
//! - A group rdrun stopped because it hung ([`ResolvedReport::with_hang`]): the suspect's failure
//!   is the root cause and its message is `hang: <summary>`.
//! - `host` is the fully qualified name (torchrun's `socket.getfqdn()`), see [`fqdn`].
//!
//! Length: about 700 lines of code (resolution, text and JSON rendering, the error-file copy); the
//! rest are layout tests against torchrun's output.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::exit::WorkerStatus;

/// One failed worker, as observed by the agent.
#[derive(Debug, Clone)]
pub struct Failure {
    pub local_rank: usize,
    pub rank: usize,
    pub pid: u32,
    pub status: WorkerStatus,
    /// When the agent observed the failure.
    pub observed_at: SystemTime,
    /// TORCHELASTIC_ERROR_FILE given to the worker (the file may not exist).
    pub error_file: Option<PathBuf>,
    /// Last stderr lines of the worker.
    pub stderr_tail: Vec<String>,
    /// Python traceback captured from the worker's stderr
    /// ([`super::output::OutputSummary::traceback`]).
    pub traceback: Option<Vec<String>>,
    /// rdrun sent SIGKILL but the worker never exited (uninterruptible sleep) and was left
    /// behind; the report must not claim that it died of the signal.
    pub abandoned: bool,
    /// When rdrun began stopping the group (its first stop signal), if it had before it observed
    /// this failure: then the worker is presumed a bystander that rdrun stopped, not a cause.
    pub stop_sent_at: Option<SystemTime>,
}

impl Failure {
    /// Takes the stderr tail and traceback that the worker's output forwarder yielded.
    pub fn set_output(&mut self, summary: &super::output::OutputSummary) {
        self.stderr_tail = summary.stderr_tail.clone();
        self.traceback = summary.traceback.clone();
    }
}

/// Everything the report needs.
#[derive(Debug, Clone)]
pub struct FailureReport {
    /// Title name: script as typed, module, or binary.
    pub name: String,
    /// Host name shown in each block.
    pub host: String,
    /// Failures in detection order (first-observed first).
    pub failures: Vec<Failure>,
}

impl FailureReport {
    /// Reads every error file once and chooses the root cause (module doc).
    pub fn resolve(self) -> ResolvedReport {
        let resolved: Vec<Resolved> = self.failures.iter().map(resolve).collect();
        let root = root_of(&self.failures, &resolved);
        ResolvedReport {
            name: self.name,
            host: self.host,
            failures: self.failures,
            resolved,
            root,
            hang: None,
        }
    }
}

/// A [`FailureReport`] whose error files were read and whose root cause was chosen; every
/// output (the printed block, `--report-json`, the parent error file, the exit status) derives
/// from it without touching the file system again.
#[derive(Debug, Clone)]
pub struct ResolvedReport {
    name: String,
    host: String,
    failures: Vec<Failure>,
    resolved: Vec<Resolved>,
    root: Option<usize>,
    /// The hang that made rdrun stop the group (issue 13), when it did: the root cause.
    hang: Option<String>,
}

impl ResolvedReport {
    /// Index of the root cause in detection order; `None` without failures.
    pub fn root_cause(&self) -> Option<usize> {
        self.root
    }

    /// Makes a hang the root cause (rdrun stopped the group because every rank was quiet): the
    /// suspect `rank`'s failure (else the one already chosen) shows `hang: <summary>` as its
    /// message in the block, the JSON and the parent error file. The exit status stays that
    /// worker's own, but never 0 (a worker that exited 0 on the stop signal still failed).
    pub fn with_hang(mut self, rank: Option<usize>, summary: String) -> ResolvedReport {
        let root = rank
            .and_then(|r| self.failures.iter().position(|f| f.rank == r))
            .or(self.root)
            .or((!self.failures.is_empty()).then_some(0));
        if let Some(i) = root {
            let r = &mut self.resolved[i];
            let text = format!("hang: {summary}");
            r.message = text.clone();
            r.block_message = text.clone();
            r.short = text;
            r.traceback = None;
            r.data = None;
        }
        self.root = root;
        self.hang = Some(summary);
        self
    }

    /// The status failure `i` stands for (issue 24.5): its own, except for a worker that had
    /// failed (its error file was written before rdrun began stopping the group) and was then
    /// ended by that stop's signal. The signal is rdrun's, not the failure: such a worker counts
    /// as `Exited(1)`, Python's status for the uncaught exception its error file records (a
    /// scheduler reads 143 as a preemption, and the status would depend on how fast the
    /// worker's teardown ran).
    fn status_of(&self, i: usize) -> WorkerStatus {
        match self.resolved[i].stopped_after_failing {
            true => WorkerStatus::Exited(1),
            false => self.failures[i].status,
        }
    }

    /// The hang that is the root cause, if any ([`ResolvedReport::with_hang`]).
    pub fn hang(&self) -> Option<&str> {
        self.hang.as_deref()
    }

    /// The failures in detection order.
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// rdrun's exit status for this report: the root cause's own (see
    /// [`WorkerStatus::launcher_exit_code`]), or a launcher failure when there is none.
    pub fn exit_code(&self) -> i32 {
        self.root
            .map(|i| self.status_of(i).launcher_exit_code())
            .filter(|&c| c != 0 || self.hang.is_none())
            .unwrap_or(crate::exit::LAUNCHER_FAILURE)
    }
}

/// What a worker's error file holds (spec §3.9).
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorFile {
    /// No error file was given, or the worker did not write it.
    Missing,
    /// The whole JSON document, its `message` and the timestamp torchrun takes from it.
    Valid { data: Value, timestamp: i64 },
    /// The file exists but cannot be used (torchrun raises here); why.
    Invalid(String),
}

/// Reads and checks an error file as torchrun's `ProcessFailure` does.
pub fn read_error_file(path: Option<&Path>) -> ErrorFile {
    let Some(path) = path else {
        return ErrorFile::Missing;
    };
    if !path.is_file() {
        return ErrorFile::Missing;
    }
    let text = match fs::read(path) {
        Ok(t) => t,
        Err(e) => return ErrorFile::Invalid(format!("cannot read: {e}")),
    };
    let data: Value = match serde_json::from_slice(&text) {
        Ok(v) => v,
        Err(e) => return ErrorFile::Invalid(format!("not valid JSON: {e}")),
    };
    match parse_error_data(&data) {
        Ok(timestamp) => ErrorFile::Valid { data, timestamp },
        Err(why) => ErrorFile::Invalid(why),
    }
}

/// torchrun's `_get_error_data`: the timestamp of a valid document, or why it is not one.
fn parse_error_data(data: &Value) -> Result<i64, String> {
    let message = data
        .get("message")
        .ok_or_else(|| "no \"message\" field".to_string())?;
    match message {
        Value::String(_) => match data.get("timestamp") {
            None => Ok(0),
            Some(ts) => python_int(ts).ok_or_else(|| format!("bad \"timestamp\": {ts}")),
        },
        Value::Object(m) => {
            let ts = m
                .get("extraInfo")
                .and_then(|e| e.get("timestamp"))
                .ok_or_else(|| "no \"message.extraInfo.timestamp\" field".to_string())?;
            python_int(ts).ok_or_else(|| format!("bad \"message.extraInfo.timestamp\": {ts}"))
        }
        other => Err(format!(
            "\"message\" is neither a string nor an object: {other}"
        )),
    }
}

/// Python's `int(x)` for the JSON values it accepts.
fn python_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f.trunc() as i64)),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

/// `SIGTERM` etc. as Python's `signal.Signals(n).name`; `None` where Python has no name.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    match signal {
        34 => Some("SIGRTMIN"),
        64 => Some("SIGRTMAX"),
        n => nix::sys::signal::Signal::try_from(n)
            .ok()
            .map(|s| s.as_str()),
    }
}

const NOT_AVAILABLE: &str = "<N/A>";
const HINT: &str = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

/// Everything derived from one failure, computed once.
#[derive(Debug, Clone)]
struct Resolved {
    /// Whole seconds shown as `time`.
    time: i64,
    /// The error file's timestamp (whole seconds), when a valid one was read.
    written_at: Option<i64>,
    /// `error_file:` value.
    error_file: String,
    error_file_path: Option<String>,
    error_file_problem: Option<String>,
    /// The `traceback :` value before indentation.
    message: String,
    /// The value as the block shows it.
    block_message: String,
    /// One-line summary (exception line, signal, or hint) for JSON and the parent error file.
    short: String,
    /// Traceback lines, from the error file or captured from stderr.
    traceback: Option<Vec<String>>,
    data: Option<Value>,
    /// The worker died of a signal rdrun's stop sent after its error file recorded a failure
    /// (see [`ResolvedReport::status_of`]).
    stopped_after_failing: bool,
}

fn epoch_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn resolve(f: &Failure) -> Resolved {
    let ef = read_error_file(f.error_file.as_deref());
    let path_text = f.error_file.as_ref().map(|p| p.display().to_string());
    let mut r = Resolved {
        time: epoch_secs(f.observed_at),
        written_at: None,
        error_file: NOT_AVAILABLE.to_string(),
        error_file_path: None,
        error_file_problem: None,
        message: String::new(),
        block_message: String::new(),
        short: String::new(),
        traceback: None,
        data: None,
        stopped_after_failing: false,
    };
    match ef {
        ErrorFile::Missing => {}
        ErrorFile::Invalid(why) => {
            let path = path_text.clone().unwrap_or_default();
            r.error_file = format!("{path} (invalid: {why})");
            r.error_file_path = path_text;
            r.error_file_problem = Some(why);
        }
        ErrorFile::Valid { data, timestamp } => {
            r.time = timestamp;
            r.written_at = Some(timestamp);
            r.error_file = path_text.clone().unwrap_or_default();
            r.error_file_path = path_text;
            match &data["message"] {
                Value::Object(m) => {
                    let short = m.get("message").map(value_text);
                    let text = match m.get("extraInfo").and_then(|e| e.get("py_callstack")) {
                        Some(cs) => value_text(cs),
                        None => short.clone().unwrap_or_else(|| NOT_AVAILABLE.to_string()),
                    };
                    r.block_message = text.replace('\n', "\n  ");
                    r.traceback = m
                        .get("extraInfo")
                        .and_then(|e| e.get("py_callstack"))
                        .map(|cs| value_text(cs).lines().map(String::from).collect());
                    r.short = short.unwrap_or_else(|| {
                        text.lines()
                            .rev()
                            .find(|l| !l.trim().is_empty())
                            .unwrap_or(NOT_AVAILABLE)
                            .to_string()
                    });
                    r.message = text;
                }
                Value::String(s) => {
                    r.message = s.clone();
                    r.block_message = s.clone();
                    r.short = s.clone();
                }
                _ => {}
            }
            r.data = Some(data);
        }
    }
    if r.message.is_empty() {
        // torchrun: no (usable) message → a signal line or the hint. rdrun: or the traceback.
        let (message, short) = match f.status {
            _ if f.abandoned => {
                let m = format!(
                    "SIGKILL sent to PID {}, which did not exit (uninterruptible sleep?); rdrun left it behind",
                    f.pid
                );
                (m.clone(), m)
            }
            WorkerStatus::Signaled(n) => {
                let m = format!(
                    "Signal {n} ({}) received by PID {}",
                    signal_name(n).unwrap_or(NOT_AVAILABLE),
                    f.pid
                );
                (m.clone(), m)
            }
            WorkerStatus::Exited(1) if f.traceback.is_some() => {
                let lines = f.traceback.clone().unwrap_or_default();
                r.traceback = Some(lines.clone());
                let short = lines.last().cloned().unwrap_or_default();
                (lines.join("\n") + "\n", short)
            }
            _ => (HINT.to_string(), HINT.to_string()),
        };
        r.block_message = message.replace('\n', "\n  ");
        r.message = message;
        r.short = short;
    }
    r.stopped_after_failing = signalled_after_failing(f, &r);
    r
}

/// True when the worker failed on its own: rdrun had not begun stopping the group when it saw
/// the exit, or the worker's error file names a second before that stop began.
fn failed_on_its_own(f: &Failure, r: &Resolved) -> bool {
    match f.stop_sent_at {
        None => true,
        Some(stop) => r.written_at.is_some_and(|ts| ts < epoch_secs(stop)),
    }
}

/// A signal that rdrun's stop sent ended a worker whose error file shows it had failed before
/// that stop began.
fn signalled_after_failing(f: &Failure, r: &Resolved) -> bool {
    matches!(f.status, WorkerStatus::Signaled(_))
        && f.stop_sent_at.is_some()
        && failed_on_its_own(f, r)
}

/// The root cause (module doc): the workers that failed on their own first (all of them when
/// none did), then by (whole second, observation time, detection order); the whole second is the
/// error file's timestamp where one was read, but never later than the observation's.
fn root_of(failures: &[Failure], resolved: &[Resolved]) -> Option<usize> {
    let own: Vec<bool> = failures
        .iter()
        .zip(resolved)
        .map(|(f, r)| failed_on_its_own(f, r))
        .collect();
    let any_own = own.iter().any(|&o| o);
    failures
        .iter()
        .zip(resolved)
        .enumerate()
        .filter(|(i, _)| own[*i] || !any_own)
        .min_by_key(|(i, (f, r))| {
            let seen = epoch_secs(f.observed_at);
            let second = r.written_at.map_or(seen, |ts| ts.min(seen));
            (second, f.observed_at, *i)
        })
        .map(|(i, _)| i)
}

/// `YYYY-MM-DD_HH:MM:SS` in local time, as Python's `datetime.fromtimestamp(t).isoformat("_")`.
pub fn format_local_time(secs: i64) -> String {
    let t = secs as libc::time_t;
    // SAFETY: `tm` is plain data; an all-zero value is valid (and fully overwritten on success).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe variant.
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if !ok {
        return format_utc_time(secs);
    }
    format!(
        "{:04}-{:02}-{:02}_{:02}:{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// `YYYY-MM-DD_HH:MM:SS` in UTC (fallback and tests).
pub fn format_utc_time(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}_{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn block(
    idx: usize,
    f: &Failure,
    r: &Resolved,
    host: &str,
    time: &dyn Fn(i64) -> String,
) -> String {
    let code = f.status.torchrun_code();
    let mut sig = match f.status {
        WorkerStatus::Signaled(n) => signal_name(n)
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        WorkerStatus::Exited(_) => String::new(),
    };
    if r.stopped_after_failing {
        // rdrun's difference (issue 24.5): the signal is rdrun's stop, not the failure.
        sig.push_str(" sent by rdrun's stop after this worker had failed (counted as exit 1)");
    }
    format!(
        "[{idx}]:\n  time      : {}\n  host      : {host}\n  rank      : {} (local_rank: {})\n  exitcode  : {code} (pid: {}) {sig}\n  error_file: {}\n  traceback : {}",
        time(r.time),
        f.rank,
        f.local_rank,
        f.pid,
        r.error_file,
        r.block_message
    )
}

/// The ChildFailedError message exactly as torchrun builds it (starts with "\n", lines joined by
/// "\n", no trailing newline; empty when there is no failure) and its width W.
fn torchrun_message_with(report: &ResolvedReport, time: &dyn Fn(i64) -> String) -> (String, usize) {
    let Some(root) = report.root else {
        return (String::new(), 0);
    };
    let title = format!("{} FAILED", report.name);
    let mut width = title.chars().count();
    let mut root_block = String::new();
    let mut others = Vec::new();
    for (i, (f, r)) in report.failures.iter().zip(&report.resolved).enumerate() {
        let b = block(i, f, r, &report.host, time);
        width = width.max(b.split('\n').map(|l| l.chars().count()).max().unwrap_or(0));
        if i == root {
            root_block = b;
        } else {
            others.push(b);
        }
    }
    let width = width.min(60);
    let border = "=".repeat(width);
    let section = "-".repeat(width);
    let others = if others.is_empty() {
        "  <NO_OTHER_FAILURES>".to_string()
    } else {
        others.join("\n")
    };
    let msg = format!(
        "\n{border}\n{title}\n{section}\nFailures:\n{others}\n{section}\nRoot Cause (first observed failure):\n{root_block}\n{border}"
    );
    (msg, width)
}

/// Renders the summary block printed on stderr at the end of a failed run: torchrun's block
/// (without its leading empty line) then rdrun's stderr section; lines joined by "\n", no final
/// newline (print it with `eprintln!`). Empty when there is no failure.
pub fn render(report: &ResolvedReport) -> String {
    render_with(report, &format_local_time)
}

fn render_with(report: &ResolvedReport, time: &dyn Fn(i64) -> String) -> String {
    let (msg, width) = torchrun_message_with(report, time);
    if msg.is_empty() {
        return msg;
    }
    let mut out = msg.trim_start_matches('\n').to_string();
    let Some(root) = report.root else {
        return out;
    };
    let f = &report.failures[root];
    let r = &report.resolved[root];
    let mut tail = &f.stderr_tail[f.stderr_tail.len().saturating_sub(20)..];
    // Lines that end the traceback the block already shows (from stderr, or the printed twin of
    // the error file's callstack) are not repeated: only what came before them is.
    let mut before_traceback = false;
    if r.traceback.is_some() {
        let overlap = [r.traceback.as_ref(), f.traceback.as_ref()]
            .into_iter()
            .flatten()
            .map(|tb| suffix_overlap(tail, tb))
            .max()
            .unwrap_or(0);
        if overlap > 0 {
            tail = &tail[..tail.len() - overlap];
            before_traceback = true;
        }
    }
    if !tail.is_empty() {
        out.push_str(&format!(
            "\nRoot cause stderr (last {} line{}{}, rank {}, local_rank {}, pid {}):\n",
            tail.len(),
            if tail.len() == 1 { "" } else { "s" },
            if before_traceback {
                " before the traceback"
            } else {
                ""
            },
            f.rank,
            f.local_rank,
            f.pid
        ));
        for line in tail {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&"=".repeat(width));
    }
    out
}

/// The largest k such that the last k lines of `tail` are the last k lines of `tb`.
fn suffix_overlap(tail: &[String], tb: &[String]) -> usize {
    tail.iter()
        .rev()
        .zip(tb.iter().rev())
        .take_while(|(a, b)| a == b)
        .count()
}

/// The report as JSON for `--report-json` (schema `rdrun.failure-report/1`, see docs/compat.md):
/// `{schema, name, host, exit_code, root_cause, failures: [{index, rank, local_rank, pid,
/// exitcode, signal, time, timestamp, error_file, error_file_error, message, traceback,
/// stderr_tail, stopped_by_rdrun, stopped_after_failing}], root_cause_kind, hang}`. `exitcode`
/// is torchrun's (negative for a signal); `stopped_by_rdrun`: the signal came from rdrun's stop;
/// `stopped_after_failing`: it did, after the worker's error file recorded its failure (the
/// worker then counts as exit 1, [`ResolvedReport::status_of`]); `exit_code` is rdrun's; `root_cause_kind` is `"hang"` when rdrun stopped the group for a
/// hang (then `hang` is its one-line summary, else null), otherwise `"failure"`.
pub fn to_json(report: &ResolvedReport) -> Value {
    to_json_with(report, &format_local_time)
}

fn to_json_with(report: &ResolvedReport, time: &dyn Fn(i64) -> String) -> Value {
    let root = report.root;
    let failures: Vec<Value> = report
        .failures
        .iter()
        .zip(&report.resolved)
        .enumerate()
        .map(|(i, (f, r))| {
            let signal = match f.status {
                WorkerStatus::Signaled(n) => signal_name(n).map(String::from),
                WorkerStatus::Exited(_) => None,
            };
            json!({
                "index": i,
                "rank": f.rank,
                "local_rank": f.local_rank,
                "pid": f.pid,
                "exitcode": f.status.torchrun_code(),
                "signal": signal,
                "time": time(r.time),
                "timestamp": r.time,
                "error_file": r.error_file_path,
                "error_file_error": r.error_file_problem,
                "message": r.short,
                "traceback": r.traceback,
                "stderr_tail": f.stderr_tail,
                "stopped_by_rdrun": f.stop_sent_at.is_some()
                    && matches!(f.status, WorkerStatus::Signaled(_)),
                "stopped_after_failing": r.stopped_after_failing,
            })
        })
        .collect();
    json!({
        "schema": "rdrun.failure-report/1",
        "name": report.name,
        "host": report.host,
        "exit_code": root.map(|_| report.exit_code()),
        "root_cause": root,
        "root_cause_kind": if report.hang.is_some() { "hang" } else { "failure" },
        "hang": report.hang,
        "failures": failures,
    })
}

/// Writes [`to_json`] (pretty, with a final newline) to `path`.
pub fn write_json(path: &Path, report: &ResolvedReport) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(&to_json(report)).map_err(io::Error::other)?;
    text.push('\n');
    fs::write(path, text)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A scratch directory, removed when dropped.
    struct Scratch(tempfile::TempDir);
    impl Scratch {
        fn new() -> Scratch {
            Scratch(
                tempfile::Builder::new()
                    .prefix("rdrun-report-test-")
                    .tempdir()
                    .expect("scratch dir"),
            )
        }
        fn file(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.path().join(name);
            fs::write(&p, text).expect("write");
            p
        }
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// 2026-11-29_17:21:43 UTC.
    const T: u64 = 1_795_972_903;

    fn failure(rank: usize, pid: u32, status: WorkerStatus, secs: u64) -> Failure {
        Failure {
            local_rank: rank,
            rank,
            pid,
            status,
            observed_at: at(secs),
            error_file: None,
            stderr_tail: Vec::new(),
            traceback: None,
            abandoned: false,
            stop_sent_at: None,
        }
    }

    fn report(name: &str, failures: Vec<Failure>) -> ResolvedReport {
        FailureReport {
            name: name.into(),
            host: "localhost".into(),
            failures,
        }
        .resolve()
    }

    fn root_cause(failures: &[Failure]) -> Option<usize> {
        report("x", failures.to_vec()).root_cause()
    }

    fn message(r: &ResolvedReport) -> String {
        torchrun_message_with(r, &format_utc_time).0
    }

    #[test]
    fn hang_is_the_root_cause_and_never_exit_zero() {
        // Both stopped by rdrun (bystanders); rank 1 is the hang's suspect; rank 0 exited 0 on
        // the stop signal.
        let mut a = failure(0, 10, WorkerStatus::Exited(0), 5);
        let mut b = failure(1, 11, WorkerStatus::Signaled(libc::SIGTERM), 6);
        a.stop_sent_at = Some(at(4));
        b.stop_sent_at = Some(at(4));
        let plain = report("x", vec![a.clone(), b.clone()]);
        assert_eq!(plain.root_cause(), Some(0));
        assert!(plain.hang().is_none());
        let r = report("x", vec![a.clone(), b]).with_hang(Some(1), "quiet 3s".into());
        assert_eq!(r.root_cause(), Some(1));
        assert_eq!(r.hang(), Some("quiet 3s"));
        assert_eq!(r.exit_code(), 128 + libc::SIGTERM);
        let msg = message(&r);
        let root = msg.split("Root Cause").nth(1).unwrap();
        assert!(root.contains("traceback : hang: quiet 3s"), "{msg}");
        let v = to_json_with(&r, &format_utc_time);
        assert_eq!(v["root_cause_kind"], "hang");
        assert_eq!(v["failures"][1]["message"], "hang: quiet 3s");
        assert_eq!(
            to_json_with(&plain, &format_utc_time)["root_cause_kind"],
            "failure"
        );
        // No suspect, and the chosen root exited 0: still a failure status.
        let r = report("x", vec![a]).with_hang(None, "quiet".into());
        assert_eq!(r.root_cause(), Some(0));
        assert_eq!(r.exit_code(), crate::exit::LAUNCHER_FAILURE);
    }

    #[test]
    fn utc_time_format() {
        assert_eq!(format_utc_time(T as i64), "2026-11-29_17:21:43");
        assert_eq!(format_utc_time(0), "1970-01-01_00:00:00");
        assert_eq!(format_utc_time(951_782_400), "2000-02-29_00:00:00");
        assert_eq!(format_utc_time(-1), "1969-12-31_23:59:59");
        let local = format_local_time(T as i64);
        assert_eq!(local.len(), 19, "{local}");
        assert_eq!(&local[10..11], "_");
    }

    #[test]
    fn signal_names_as_python() {
        let cases = [
            (15, Some("SIGTERM")),
            (9, Some("SIGKILL")),
            (6, Some("SIGABRT")),
            (17, Some("SIGCHLD")),
            (29, Some("SIGIO")),
            (34, Some("SIGRTMIN")),
            (40, None),
            (64, Some("SIGRTMAX")),
            (0, None),
        ];
        for (n, want) in cases {
            assert_eq!(signal_name(n), want, "signal {n}");
        }
    }

    /// spec §3.8 example [verified]: rank 1 exits 3, rank 0 exits 7 from its SIGTERM handler.
    #[test]
    fn spec_example_exit_codes() {
        let r = report(
            "fail.py",
            vec![
                failure(1, 5261, WorkerStatus::Exited(3), T),
                failure(0, 5260, WorkerStatus::Exited(7), T),
            ],
        );
        let want = "
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_17:21:43
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 7 (pid: 5260) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_17:21:43
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 5261) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================";
        assert_eq!(message(&r), want);
        // render: the same block without the leading empty line.
        assert_eq!(render_with(&r, &format_utc_time), &want[1..]);
        assert_eq!(r.root_cause(), Some(0));
        assert_eq!(r.exit_code(), 3);
    }

    const CALLSTACK: &str = "Traceback (most recent call last):\n  File \"/root/.cache/rdrun/torch-venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py\", line 384, in wrapper\n    result = f(*args, **kwargs)\n             ^^^^^^^^^^^^^^^^^^\n  File \"/tmp/rdrun-scn/rec.py\", line 6, in main\n    raise ValueError(\"bad value\")\nValueError: bad value\n";

    fn record_json(ts: &str) -> String {
        json!({"message": {"message": "ValueError: bad value",
            "extraInfo": {"py_callstack": CALLSTACK, "timestamp": ts}}})
        .to_string()
    }

    /// Recorded from torchrun 2.15.0: `@record` ValueError on rank 1, rank 0 SIGTERM'd.
    #[test]
    fn torchrun_record_and_sigterm() {
        let s = Scratch::new();
        let ef = s.file("error.json", &record_json("1795977433"));
        let mut root = failure(1, 3832, WorkerStatus::Exited(1), 1_795_977_436);
        root.error_file = Some(ef.clone());
        let mut peer = failure(0, 3831, WorkerStatus::Signaled(15), 1_795_977_436);
        peer.error_file = Some(s.0.path().join("missing.json"));
        let r = report("rec.py", vec![root, peer]);
        let want = format!(
            "
============================================================
rec.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_18:37:16
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3831)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 3831
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_18:37:13
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 3832) 
  error_file: {}
  traceback : Traceback (most recent call last):
    File \"/root/.cache/rdrun/torch-venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py\", line 384, in wrapper
      result = f(*args, **kwargs)
               ^^^^^^^^^^^^^^^^^^
    File \"/tmp/rdrun-scn/rec.py\", line 6, in main
      raise ValueError(\"bad value\")
  ValueError: bad value
  
============================================================",
            ef.display()
        );
        assert_eq!(message(&r), want);
    }

    #[test]
    fn narrow_block_and_string_message() {
        let s = Scratch::new();
        let ef = s.file("e.json", r#"{"message": "boom", "timestamp": 1795972900}"#);
        let mut f = failure(2, 42, WorkerStatus::Exited(5), T);
        f.error_file = Some(ef.clone());
        f.local_rank = 0;
        let r = report("x", vec![f]);
        let path = ef.display().to_string();
        let w = (path.chars().count() + 14).clamp(33, 60);
        let want = format!(
            "
{eq}
x FAILED
{dash}
Failures:
  <NO_OTHER_FAILURES>
{dash}
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_17:21:40
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : 5 (pid: 42) 
  error_file: {path}
  traceback : boom
{eq}",
            eq = "=".repeat(w),
            dash = "-".repeat(w),
        );
        assert_eq!(message(&r), want);
    }

    #[test]
    fn error_file_forms() {
        let s = Scratch::new();
        let cases: Vec<(&str, Result<i64, &str>)> = vec![
            (r#"{"message": "m", "timestamp": 12}"#, Ok(12)),
            (r#"{"message": "m"}"#, Ok(0)),
            (r#"{"message": "m", "timestamp": "13"}"#, Ok(13)),
            (r#"{"message": {"extraInfo": {"timestamp": "14"}}}"#, Ok(14)),
            (r#"{"message": {"extraInfo": {"timestamp": 15.9}}}"#, Ok(15)),
            ("{not json", Err("not valid JSON")),
            (r#"{"msg": "m"}"#, Err("no \"message\" field")),
            (
                r#"{"message": {"message": "m"}}"#,
                Err("no \"message.extraInfo.timestamp\""),
            ),
            (
                r#"{"message": "m", "timestamp": "soon"}"#,
                Err("bad \"timestamp\""),
            ),
            (r#"{"message": 3}"#, Err("neither a string nor an object")),
        ];
        for (i, (text, want)) in cases.into_iter().enumerate() {
            let p = s.file(&format!("{i}.json"), text);
            match (read_error_file(Some(&p)), want) {
                (ErrorFile::Valid { timestamp, .. }, Ok(ts)) => assert_eq!(timestamp, ts, "{text}"),
                (ErrorFile::Invalid(why), Err(w)) => assert!(why.contains(w), "{text}: {why}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(read_error_file(None), ErrorFile::Missing);
        assert_eq!(
            read_error_file(Some(&s.0.path().join("none"))),
            ErrorFile::Missing
        );
        assert_eq!(read_error_file(Some(s.0.path())), ErrorFile::Missing);
    }

    #[test]
    fn invalid_error_file_is_reported_not_fatal() {
        let s = Scratch::new();
        let ef = s.file("error.json", "{\"message\": ");
        let mut f = failure(0, 7, WorkerStatus::Exited(2), T);
        f.error_file = Some(ef.clone());
        let msg = message(&report("t.py", vec![f]));
        assert!(
            msg.contains(&format!(
                "  error_file: {} (invalid: not valid JSON: ",
                ef.display()
            )),
            "{msg}"
        );
        assert!(msg.contains(&format!("  traceback : {HINT}\n")), "{msg}");
        assert!(msg.contains("  time      : 2026-11-29_17:21:43\n"), "{msg}");
    }

    fn tb() -> Vec<String> {
        CALLSTACK.lines().map(String::from).collect()
    }

    #[test]
    fn captured_traceback_without_record() {
        let mut f = failure(0, 9, WorkerStatus::Exited(1), T);
        f.traceback = Some(tb());
        f.stderr_tail = vec!["loading".into()];
        f.stderr_tail.extend(tb());
        let r = report("t.py", vec![f.clone()]);
        let msg = message(&r);
        let want_tb = format!("  traceback : {}", CALLSTACK.replace('\n', "\n  "));
        assert!(msg.contains(&format!("{want_tb}\n====")), "{msg}");
        // The tail is not only the traceback: it is shown after the block.
        let out = render_with(&r, &format_utc_time);
        assert!(
            out.ends_with(&format!(
                "=\nRoot cause stderr (last 1 line before the traceback, rank 0, local_rank 0, pid 9):\n  loading\n{}",
                "=".repeat(60)
            )),
            "{out}"
        );
        // A tail that is only the traceback is not repeated.
        let mut g = f.clone();
        g.stderr_tail = tb();
        let out = render_with(&report("t.py", vec![g]), &format_utc_time);
        assert!(!out.contains("Root cause stderr"), "{out}");
        // Another exit code: the program chose it; the traceback is not blamed.
        let mut h = f.clone();
        h.status = WorkerStatus::Exited(3);
        let msg = message(&report("t.py", vec![h]));
        assert!(msg.contains(&format!("  traceback : {HINT}\n")), "{msg}");
        let out = render_with(
            &report(
                "t.py",
                vec![{
                    let mut h = f.clone();
                    h.status = WorkerStatus::Exited(3);
                    h
                }],
            ),
            &format_utc_time,
        );
        assert!(out.contains("Root cause stderr (last 8 lines"), "{out}");
        // A signal keeps torchrun's line.
        let mut k = f;
        k.status = WorkerStatus::Signaled(2);
        let msg = message(&report("t.py", vec![k]));
        assert!(
            msg.contains("  exitcode  : -2 (pid: 9)  (SIGINT)\n"),
            "{msg}"
        );
        assert!(
            msg.contains("  traceback : Signal 2 (SIGINT) received by PID 9\n"),
            "{msg}"
        );
        // A worker that outlived SIGKILL is not said to have received it.
        let mut a = failure(0, 9, WorkerStatus::Signaled(libc::SIGKILL), T);
        a.abandoned = true;
        let msg = message(&report("t.py", vec![a]));
        assert!(
            msg.contains("  traceback : SIGKILL sent to PID 9, which did not exit (uninterruptible sleep?); rdrun left it behind\n"),
            "{msg}"
        );
        assert!(!msg.contains("received by PID"), "{msg}");
    }

    #[test]
    fn root_cause_choice() {
        let s = Scratch::new();
        // Ties: detection order.
        let fs = vec![
            failure(3, 1, WorkerStatus::Exited(1), T),
            failure(0, 2, WorkerStatus::Exited(1), T),
        ];
        assert_eq!(root_cause(&fs), Some(0));
        // Earliest observation wins.
        let fs = vec![
            failure(3, 1, WorkerStatus::Exited(1), T + 1),
            failure(0, 2, WorkerStatus::Signaled(9), T),
        ];
        assert_eq!(root_cause(&fs), Some(1));
        // An error file's timestamp is the failure's time.
        let mut late = failure(2, 3, WorkerStatus::Exited(1), T + 5);
        late.error_file = Some(s.file("e.json", &record_json(&(T - 1).to_string())));
        let fs = vec![failure(0, 2, WorkerStatus::Signaled(15), T), late];
        assert_eq!(root_cause(&fs), Some(1));
        assert_eq!(root_cause(&[]), None);
        assert_eq!(render(&report("x", vec![])), "");
        // Sub-second order counts (torchrun rounds to seconds and would tie).
        let a = Failure {
            observed_at: at(T) + Duration::from_millis(900),
            ..failure(0, 1, WorkerStatus::Exited(1), T)
        };
        let b = Failure {
            observed_at: at(T) + Duration::from_millis(100),
            ..failure(1, 2, WorkerStatus::Exited(1), T)
        };
        assert_eq!(root_cause(&[a, b]), Some(1));
    }

    /// Issue 11: rank 1 dies on its own; rank 0, stopped by rdrun, writes its error file on
    /// SIGTERM within the same second. The bystander's whole-second timestamp must not win.
    #[test]
    fn bystander_error_file_is_not_the_root_cause() {
        let s = Scratch::new();
        let died = at(T) + Duration::from_millis(300);
        let stop = died;
        let root = Failure {
            observed_at: died,
            ..failure(1, 11, WorkerStatus::Signaled(9), T)
        };
        let mut bystander = Failure {
            observed_at: died + Duration::from_millis(40),
            stop_sent_at: Some(stop),
            ..failure(0, 10, WorkerStatus::Exited(1), T)
        };
        bystander.error_file = Some(s.file("b.json", &record_json(&T.to_string())));
        let r = report("t.py", vec![root.clone(), bystander.clone()]);
        assert_eq!(r.root_cause(), Some(0));
        assert_eq!(r.exit_code(), 137);
        // The rendered root cause and the JSON agree with the exit status.
        let out = render_with(&r, &format_utc_time);
        let block = out.split("Root Cause").nth(1).expect("root block");
        assert!(block.contains("rank      : 1 (local_rank: 1)"), "{out}");
        assert_eq!(to_json_with(&r, &format_utc_time)["exit_code"], 137);
        // Detection order does not matter either.
        let r = report("t.py", vec![bystander.clone(), root.clone()]);
        assert_eq!(r.root_cause(), Some(1));
        // An error file written a whole second before the stop proves an own failure: it
        // refines the order (it failed before rank 1 was seen).
        let mut early = bystander.clone();
        early.error_file = Some(s.file("e.json", &record_json(&(T - 1).to_string())));
        let r = report("t.py", vec![root.clone(), early]);
        assert_eq!(r.root_cause(), Some(1));
        assert_eq!(r.exit_code(), 1);
        // Among own failures of one batch, an earlier second on file wins; the same second
        // keeps the observation order.
        let mut a = failure(0, 1, WorkerStatus::Exited(2), T);
        a.error_file = Some(s.file("a.json", &record_json(&T.to_string())));
        let mut b = failure(1, 2, WorkerStatus::Exited(3), T);
        b.error_file = Some(s.file("b2.json", &record_json(&(T - 2).to_string())));
        assert_eq!(root_cause(&[a.clone(), b]), Some(1));
        let c = failure(1, 2, WorkerStatus::Exited(3), T);
        assert_eq!(root_cause(&[a.clone(), c.clone()]), Some(0));
        assert_eq!(root_cause(&[c, a]), Some(0));
        // Every failure caused by rdrun (a shutdown signal): the same order among all of them.
        let x = Failure {
            stop_sent_at: Some(at(T)),
            observed_at: at(T) + Duration::from_millis(20),
            ..failure(0, 1, WorkerStatus::Signaled(15), T)
        };
        let y = Failure {
            stop_sent_at: Some(at(T)),
            observed_at: at(T) + Duration::from_millis(10),
            ..failure(1, 2, WorkerStatus::Signaled(15), T)
        };
        assert_eq!(root_cause(&[x, y]), Some(1));
    }

    /// Issue 24.5: rank 0 raised (its error file names second T) and was slow to exit; rank 1
    /// failed on its own at T+2; rdrun's stop then SIGTERMed rank 0. Rank 0 is the root cause,
    /// and the status is its failure's (1), not rdrun's SIGTERM (143); the report says whose
    /// signal it was.
    #[test]
    fn a_failed_worker_that_rdruns_stop_then_signalled_counts_as_its_failure() {
        let s = Scratch::new();
        let second = failure(1, 11, WorkerStatus::Exited(1), T + 2);
        let mut first = Failure {
            observed_at: at(T + 2) + Duration::from_millis(30),
            stop_sent_at: Some(at(T + 2)),
            ..failure(0, 10, WorkerStatus::Signaled(libc::SIGTERM), T + 2)
        };
        first.error_file = Some(s.file("f.json", &record_json(&T.to_string())));
        let r = report("teardown.py", vec![second.clone(), first.clone()]);
        assert_eq!(r.root_cause(), Some(1));
        assert_eq!(r.exit_code(), 1);
        let out = render_with(&r, &format_utc_time);
        let root = out.split("Root Cause").nth(1).unwrap();
        assert!(
            root.contains("exitcode  : -15 (pid: 10)  (SIGTERM) sent by rdrun's stop after this worker had failed (counted as exit 1)"),
            "{out}"
        );
        let v = to_json_with(&r, &format_utc_time);
        assert_eq!(v["exit_code"], 1);
        assert_eq!(v["failures"][1]["stopped_by_rdrun"], true);
        assert_eq!(v["failures"][1]["stopped_after_failing"], true);
        assert_eq!(v["failures"][0]["stopped_after_failing"], false);
        assert_eq!(parent_error_json(&r).unwrap()["message"]["errorCode"], 1);
        // The same worker without an error file is a bystander of rank 1's failure.
        first.error_file = None;
        let r = report("teardown.py", vec![second.clone(), first.clone()]);
        assert_eq!((r.root_cause(), r.exit_code()), (Some(0), 1));
        // An error file of the stop's own second proves nothing (it may be the SIGTERM's).
        first.error_file = Some(s.file("g.json", &record_json(&(T + 2).to_string())));
        let r = report("teardown.py", vec![second, first]);
        assert_eq!(r.root_cause(), Some(0));
        assert!(
            !to_json_with(&r, &format_utc_time)["failures"][1]["stopped_after_failing"]
                .as_bool()
                .unwrap()
        );
    }

    #[test]
    fn json_report() {
        let s = Scratch::new();
        let ef = s.file("e.json", &record_json(&T.to_string()));
        let mut root = failure(1, 11, WorkerStatus::Exited(1), T + 2);
        root.error_file = Some(ef.clone());
        root.stderr_tail = vec!["a".into()];
        let peer = failure(0, 10, WorkerStatus::Signaled(15), T + 3);
        let r = report("rec.py", vec![peer, root]);
        let v = to_json_with(&r, &format_utc_time);
        assert_eq!(v["schema"], "rdrun.failure-report/1");
        assert_eq!(v["name"], "rec.py");
        assert_eq!(v["host"], "localhost");
        assert_eq!(v["root_cause"], 1);
        assert_eq!(v["exit_code"], 1);
        let f0 = &v["failures"][0];
        assert_eq!(f0["exitcode"], -15);
        assert_eq!(f0["signal"], "SIGTERM");
        assert_eq!(f0["error_file"], Value::Null);
        assert_eq!(f0["message"], "Signal 15 (SIGTERM) received by PID 10");
        assert_eq!(f0["traceback"], Value::Null);
        assert_eq!(f0["time"], "2026-11-29_17:21:46");
        let f1 = &v["failures"][1];
        assert_eq!(f1["index"], 1);
        assert_eq!(f1["rank"], 1);
        assert_eq!(f1["local_rank"], 1);
        assert_eq!(f1["pid"], 11);
        assert_eq!(f1["timestamp"], T);
        assert_eq!(f1["error_file"], ef.display().to_string());
        assert_eq!(f1["message"], "ValueError: bad value");
        assert_eq!(f1["traceback"], json!(tb()));
        assert_eq!(f1["stderr_tail"], json!(["a"]));
        let out = s.0.path().join("report.json");
        write_json(&out, &r).expect("write");
        let back: Value =
            serde_json::from_str(&fs::read_to_string(&out).expect("read")).expect("json");
        assert_eq!(back["root_cause"], 1);
        let err = write_json(&s.0.path().join("no/such/dir.json"), &r).expect_err("bad path");
        assert!(err.to_string().contains("cannot write"), "{err}");
        // rdrun's exit code for a signal root cause: 128+N.
        let v = to_json(&report(
            "x",
            vec![failure(0, 1, WorkerStatus::Signaled(9), T)],
        ));
        assert_eq!(v["exit_code"], 137);
    }

    #[test]
    fn parent_error_file() {
        let s = Scratch::new();
        // Copy of the root cause's error file with errorCode.
        let ef = s.file("e.json", &record_json("100"));
        let mut root = failure(1, 11, WorkerStatus::Exited(3), T);
        root.error_file = Some(ef);
        let parent = s.file("parent.json", "old contents");
        copy_to_parent_error_file(&parent, &report("x", vec![root])).expect("copy");
        let v: Value =
            serde_json::from_str(&fs::read_to_string(&parent).expect("r")).expect("json");
        assert_eq!(v["message"]["errorCode"], 3);
        assert_eq!(v["message"]["message"], "ValueError: bad value");
        assert_eq!(v["message"]["extraInfo"]["timestamp"], "100");
        // String form: copied without errorCode (torchrun skips it).
        let ef = s.file("s.json", r#"{"message": "m", "timestamp": 5}"#);
        let mut f = failure(0, 1, WorkerStatus::Exited(3), T);
        f.error_file = Some(ef);
        let v = parent_error_json(&report("x", vec![f])).expect("json");
        assert_eq!(v, json!({"message": "m", "timestamp": 5}));
        // No error file, captured traceback: synthesized dict form.
        let mut f = failure(0, 1, WorkerStatus::Exited(1), T);
        f.traceback = Some(tb());
        let v = parent_error_json(&report("x", vec![f])).expect("json");
        assert_eq!(v["message"]["message"], "ValueError: bad value");
        assert_eq!(v["message"]["extraInfo"]["py_callstack"], CALLSTACK);
        assert_eq!(v["message"]["extraInfo"]["timestamp"], T.to_string());
        assert_eq!(v["message"]["errorCode"], 1);
        // A signal, with a stderr tail.
        let mut f = failure(0, 77, WorkerStatus::Signaled(11), T);
        f.stderr_tail = vec!["Fatal Python error: Segmentation fault".into()];
        let v = parent_error_json(&report("x", vec![f])).expect("json");
        assert_eq!(
            v["message"]["message"],
            "Signal 11 (SIGSEGV) received by PID 77"
        );
        assert_eq!(
            v["message"]["extraInfo"]["py_callstack"],
            "Fatal Python error: Segmentation fault\n"
        );
        assert_eq!(v["message"]["errorCode"], -11);
        assert_eq!(parent_error_json(&report("x", vec![])), None);
    }
}
