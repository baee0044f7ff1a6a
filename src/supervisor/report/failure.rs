//! The failure report: torchrun's ChildFailedError summary layout plus rdrun's extras (stderr
//! tail, Python traceback taken from stderr), `--report-json`, and the nested error-file copy.
//!
//! Two steps. [`FailureReport::resolve`] reads every worker's error file (TORCHELASTIC_ERROR_FILE,
//! spec torchrun-compat.md §3.9) exactly once and chooses the root cause, giving a
//! [`ResolvedReport`]; the agent resolves before [`crate::supervisor::output::RunLogs::finish`] may remove the
//! files. Everything after that is a pure function of the resolved value: [`render`], [`to_json`],
//! [`parent_error_json`] and [`ResolvedReport::exit_code`], so that the exit status and the
//! rendered root cause can never disagree. This file never decides whether to stop or restart.
//!
//! Root cause (issue 11): the first failure rdrun observed that it did not cause itself. A worker
//! that exited after rdrun had begun stopping the group ([`Failure::stop_sent_at`]) is a
//! bystander, unless its error file was written a whole second before that stop (timestamps have
//! whole-second resolution, so only an earlier second proves it). Among the workers that failed
//! on their own, one whose error is a real one comes before one whose error only says that a
//! peer went away (gloo's "Connection closed by peer", NCCL's remote errors: [`is_peer_error`]);
//! then the order is (whole second, observation time, detection order), where the whole
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
//!   [`crate::supervisor::output::OutputSummary::traceback`]) gets that traceback in the `traceback :` field,
//!   laid out as `@record`'s would be: no `@record` needed. (1 is Python's status for an uncaught
//!   exception; another code means the program chose its status, so an earlier, handled
//!   traceback is not blamed.)
//! - An error file that is not valid JSON (torchrun crashes on it) is named in the block as
//!   `error_file: <path> (invalid: <why>)`, and the failure is shown as if there were none.
//! - After torchrun's block, the root cause's last stderr lines (up to 20), unless they are just
//!   the end of the traceback already shown.
//! - A group rdrun stopped because it hung ([`ResolvedReport::with_hang`]): the suspect's failure
//!   is the root cause and its message is `hang: <summary>`.
//! - `host` is the fully qualified name (torchrun's `socket.getfqdn()`), see [`fqdn_of`](crate::supervisor::setup::fqdn_of).
//!
//! Its unit tests (layouts against torchrun's output) are in `report_tests.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::exit::{signal_name, WorkerStatus};

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
    /// ([`crate::supervisor::output::OutputSummary::traceback`]).
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
    pub fn set_output(&mut self, summary: &crate::supervisor::output::OutputSummary) {
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
            verdict: None,
            node_failures: None,
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
    /// Why rdrun stopped restarting although the failure was its to retry (issue 28.5, the
    /// same failure in a row; `verdict.rs`): then the run exits "do not requeue".
    verdict: Option<String>,
    /// This node's failures in the run by root cause (`verdict::NodeFailures::to_json`, issue 28
    /// item 4): the JSON's `node_failures`.
    node_failures: Option<serde_json::Value>,
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

    /// Records rdrun's verdict that restarting cannot help (`verdict.rs`'s one line): the exit
    /// status becomes [`crate::exit::Exit::DoNotRequeue`], the line ends the printed report and
    /// is the JSON's `verdict`.
    pub fn with_verdict(mut self, line: String) -> ResolvedReport {
        self.verdict = Some(line);
        self
    }

    /// Records this node's failure counts for the JSON's `node_failures`.
    pub fn with_node_failures(mut self, counts: serde_json::Value) -> ResolvedReport {
        self.node_failures = Some(counts);
        self
    }

    /// The verdict, if any ([`ResolvedReport::with_verdict`]).
    pub fn verdict(&self) -> Option<&str> {
        self.verdict.as_deref()
    }

    /// The root cause's traceback (from its error file or its stderr), if it has one.
    pub fn root_traceback(&self) -> Option<&[String]> {
        self.root
            .and_then(|i| self.resolved[i].traceback.as_deref())
    }

    /// The traceback the root cause printed on stderr before it died of a signal (a rank that
    /// raised, then aborted in teardown: issue 38 item 2). Not for a chosen exit status other
    /// than 1: then the program decided its status, and an earlier traceback was handled.
    pub fn root_printed_traceback(&self) -> Option<&[String]> {
        let i = self.root?;
        matches!(self.status_of(i), WorkerStatus::Signaled(_))
            .then(|| self.failures[i].traceback.as_deref())
            .flatten()
    }

    /// The one line that says the root cause aborted in native code after its last output
    /// ([`teardown_abort`]), when it did.
    pub fn teardown_note(&self) -> Option<String> {
        let f = &self.failures[self.root?];
        teardown_abort(f).then(|| {
            format!(
                "rdrun: rank {} aborted in native code after its last output (std::terminate with no \
                 exception, no Python traceback): this is how torch's gloo teardown race at interpreter \
                 shutdown ends, not the training code (docs/compat.md, \"torch's teardown abort\")",
                f.rank
            )
        })
    }

    /// Whether the root cause only reports that a peer went away ([`is_peer_error`]): every
    /// failure of this report was such a consequence.
    pub fn root_is_peer_error(&self) -> bool {
        self.root
            .is_some_and(|i| is_peer_error(&self.resolved[i].short))
    }

    /// When rdrun observed the root cause's exit.
    pub fn root_observed_at(&self) -> Option<SystemTime> {
        self.root.map(|i| self.failures[i].observed_at)
    }

    /// The status the root cause stands for ([`Self::status_of`]); `None` without failures.
    pub fn root_status(&self) -> Option<WorkerStatus> {
        self.root.map(|i| self.status_of(i))
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
        self.exit().code()
    }

    /// [`Self::exit_code`] as an [`crate::exit::Exit`].
    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        if self.verdict.is_some() {
            return Exit::DoNotRequeue;
        }
        self.root
            .map(|i| Exit::Worker(self.status_of(i)))
            .filter(|e| e.code() != 0 || self.hang.is_none())
            .unwrap_or(Exit::LauncherFailure)
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
/// none did); among those, one whose error is not a peer's loss ([`is_peer_error`]) before one
/// that only reports that a peer went away; then by (whole second, observation time, detection
/// order); the whole second is the error file's timestamp where one was read, but never later
/// than the observation's. The peer-error rule matters when several exits are reaped together
/// (one batch, one observation time): the rank that raised is the cause, not the ranks whose
/// collective broke because it died.
fn root_of(failures: &[Failure], resolved: &[Resolved]) -> Option<usize> {
    failures
        .iter()
        .zip(resolved)
        .enumerate()
        .min_by_key(|(i, (f, r))| {
            let seen = epoch_secs(f.observed_at);
            let second = r.written_at.map_or(seen, |ts| ts.min(seen));
            (
                !failed_on_its_own(f, r),
                is_peer_error(&r.short),
                second,
                f.observed_at,
                *i,
            )
        })
        .map(|(i, _)| i)
}

/// What libstdc++ prints when `std::terminate` runs with no exception in flight: a joinable
/// `std::thread` destroyed, or a thread unwound by `pthread_exit` through a `noexcept` frame,
/// which is how CPython < 3.14 ends a native thread that asks for the GIL during interpreter
/// finalisation (issue 38 item 0: torch 2.15's gloo worker thread dropping its last work).
const TERMINATE_NO_EXCEPTION: &str = "terminate called without an active exception";

/// A worker that died of SIGABRT right after printing [`TERMINATE_NO_EXCEPTION`] as its last
/// line, with no Python traceback: an abort in native code after the script's last output, not
/// a failure of the training code (issue 38 item 3). The exit status stays the worker's own.
pub fn teardown_abort(f: &Failure) -> bool {
    matches!(f.status, WorkerStatus::Signaled(6))
        && f.traceback.is_none()
        && f.stderr_tail
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.trim_end().ends_with(TERMINATE_NO_EXCEPTION))
}

/// What a collective library says when a peer process or node went away (gloo, NCCL, torch's
/// distributed errors), lower case: such a failure is usually another rank's consequence.
const PEER_ERRORS: &[&str] = &[
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "distbackenderror",
    "distnetworkerror",
    "ncclremoteerror",
    "remote process exited",
    "communicator was aborted",
];

/// Whether a failure's one-line summary is a collective's report that a peer went away.
pub(in crate::supervisor) fn is_peer_error(short: &str) -> bool {
    let lower = short.to_ascii_lowercase();
    PEER_ERRORS.iter().any(|p| lower.contains(p))
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
    let mut out = render_block(report, time);
    if let Some(line) = report.teardown_note() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line);
    }
    if let Some(line) = &report.verdict {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "rdrun: {line} (exit {}: do not requeue)",
            crate::exit::Exit::DoNotRequeue.code()
        ));
    }
    out
}

fn render_block(report: &ResolvedReport, time: &dyn Fn(i64) -> String) -> String {
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

#[path = "failure_json.rs"]
mod json_out;
#[cfg(test)]
use json_out::to_json_with;
pub use json_out::{copy_to_parent_error_file, parent_error_json, to_json, write_json_doc};

#[cfg(test)]
#[path = "failure_tests.rs"]
mod tests;
