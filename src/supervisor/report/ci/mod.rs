//! A run's end as CI systems show it (issue 40): under GitHub Actions an error annotation at
//! the failing rank's innermost user frame and the failure report as Markdown in the job's step
//! summary (`github.rs`); `--report-junit` as JUnit XML, one test case per rank (`junit.rs`).
//!
//! Both are rendered from the end's `--report-json` document ([`crate::supervisor::end_json`]): the report's
//! resolved data read back from its one type (`schema.rs`), not a second report built by hand, so the root cause, the messages
//! and the tracebacks are the ones the printed report and the JSON show. Nothing here reads the
//! environment: the binary passes what it found ([`GitHub::detect`] takes the lookup).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::supervisor::report::end::{end_json, Ended};
use crate::supervisor::report::schema::{FailureDoc, ReportDoc};
use crate::supervisor::report::traceback;

mod github;
mod junit;

/// What GitHub Actions gave the step, when rdrun runs under it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitHub {
    /// `GITHUB_STEP_SUMMARY`: the Markdown file the step's summary is read from.
    pub step_summary: Option<PathBuf>,
    /// `GITHUB_WORKSPACE`: annotation paths are made relative to it (GitHub links them to the
    /// repository's file only then).
    pub workspace: Option<PathBuf>,
    /// rdrun's working directory: a relative frame path is relative to it.
    pub cwd: Option<PathBuf>,
}

impl GitHub {
    /// `Some` when `GITHUB_ACTIONS` is `true`, as GitHub sets it on every runner.
    pub fn detect(var: &dyn Fn(&str) -> Option<OsString>, cwd: Option<PathBuf>) -> Option<GitHub> {
        if var("GITHUB_ACTIONS")? != "true" {
            return None;
        }
        let path = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        Some(GitHub {
            step_summary: path("GITHUB_STEP_SUMMARY"),
            workspace: path("GITHUB_WORKSPACE"),
            cwd,
        })
    }
}

/// Where the end goes besides the console and `--report-json`.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub github: Option<GitHub>,
    /// `--report-junit PATH`.
    pub junit: Option<PathBuf>,
    /// The job's name when the report has none (a success): the script, module or program.
    pub job: String,
}

/// Writes the step summary and the JUnit file of `ended`; returns the workflow commands to print
/// on stdout (the annotation), if any. Errors are logged, one line each: the run's own report
/// and exit status stay what they are.
pub fn write(ended: &Ended, targets: &Targets) -> Option<String> {
    if targets.github.is_none() && targets.junit.is_none() {
        return None;
    }
    let run = Run::of(&end_json(ended), &ended.ranks, &targets.job);
    if let Some(path) = &targets.junit {
        if let Err(e) = write_file(path, &junit::render(&run)) {
            tracing::error!("--report-junit: cannot write {}: {e}", path.display());
        }
    }
    let gh = targets.github.as_ref()?;
    if run.exit_code == 0 {
        return None;
    }
    if let Some(path) = &gh.step_summary {
        if let Err(e) = append(path, &github::summary(&run)) {
            tracing::error!("GITHUB_STEP_SUMMARY: cannot write {}: {e}", path.display());
        }
    }
    Some(github::annotation(&run, gh))
}

/// The end, as the CI renderers read it from the report document.
#[derive(Debug)]
struct Run {
    job: String,
    host: Option<String>,
    exit_code: i64,
    /// `failure`, `hang`, `signal`, `launcher`, `rendezvous`, `bad_node`; `None`: success.
    kind: Option<String>,
    /// The end's one-line message where it has no failure report (launcher error, ...).
    message: Option<String>,
    hang: Option<String>,
    verdict: Option<String>,
    failures: Vec<Failed>,
    /// Index of the root cause in `failures`.
    root: Option<usize>,
    /// This node's workers of the last attempt (local rank, global rank).
    ranks: Vec<(usize, usize)>,
    restarts: Vec<String>,
}

/// One failed worker of the report.
#[derive(Debug)]
struct Failed {
    rank: usize,
    local_rank: usize,
    pid: u64,
    /// `exit code 3`, `signal 15 (SIGTERM)`.
    status: String,
    /// The exception line (without torch's `[rankN]: `), signal line or hint.
    message: String,
    traceback: Vec<String>,
    stderr_tail: Vec<String>,
    stopped_by_rdrun: bool,
    /// The exception's type, when the traceback has one.
    exception: Option<String>,
    /// The innermost frame in the user's code ([`user_frame`]).
    frame: Option<(String, u32)>,
}

impl Failed {
    fn of(f: &FailureDoc) -> Failed {
        let stderr_tail = f.stderr_tail.clone();
        let mut traceback = f.traceback.clone().unwrap_or_default();
        if traceback.is_empty() {
            // A rank that raised and then died of a signal (torch's teardown abort) has its
            // printed traceback only in its stderr: from its last header on.
            let header = stderr_tail
                .iter()
                .rposition(|l| l.contains("Traceback (most recent call last):"));
            if let Some(at) = header {
                if traceback::parse_traceback(&stderr_tail[at..]).is_some() {
                    traceback = stderr_tail[at..].to_vec();
                }
            }
        }
        let code = f.exitcode;
        let status = match &f.signal {
            Some(name) => format!("signal {} ({name})", -code),
            None if code < 0 => format!("signal {}", -code),
            None => format!("exit code {code}"),
        };
        Failed {
            rank: f.rank,
            local_rank: f.local_rank,
            pid: u64::from(f.pid),
            status,
            message: traceback::unprefixed(&f.message).to_string(),
            exception: traceback::parse_traceback(&traceback).map(|(kind, ..)| kind),
            frame: user_frame(&traceback),
            traceback,
            stderr_tail,
            stopped_by_rdrun: f.stopped_by_rdrun,
        }
    }
}

impl Run {
    fn of(doc: &ReportDoc, ranks: &[(usize, usize)], job: &str) -> Run {
        let failures = doc.failures.iter().map(Failed::of).collect::<Vec<_>>();
        let root = doc.root_cause.filter(|&i| i < failures.len());
        Run {
            job: doc.name.clone().unwrap_or_else(|| job.to_string()),
            host: doc.host.clone(),
            exit_code: i64::from(doc.exit_code),
            kind: doc.root_cause_kind.map(|k| k.name().to_string()),
            message: doc
                .message
                .clone()
                .or_else(|| doc.bad_node.as_ref().map(|b| b.message.clone())),
            hang: doc.hang.clone(),
            verdict: doc.verdict.clone(),
            failures,
            root,
            ranks: ranks.to_vec(),
            restarts: doc.restarts.iter().map(|r| r.cause.clone()).collect(),
        }
    }

    /// The root cause, when the end is a worker failure or a hang (not a signal to rdrun: then
    /// the failures are the stop's).
    fn root_failure(&self) -> Option<&Failed> {
        match self.kind.as_deref() {
            Some("failure" | "hang") => self.root.map(|i| &self.failures[i]),
            _ => None,
        }
    }

    /// `rank 3: ValueError`, `rank 3: hang`, `rank 3: exit code 3`; `rdrun: <kind>` without a
    /// root cause.
    fn title(&self) -> String {
        match self.root_failure() {
            Some(f) if self.hang.is_some() => format!("rank {}: hang", f.rank),
            Some(f) => format!(
                "rank {}: {}",
                f.rank,
                f.exception.as_deref().unwrap_or(&f.status)
            ),
            None => format!(
                "rdrun: {}",
                self.kind.as_deref().unwrap_or("failure").replace('_', " ")
            ),
        }
    }

    /// The one-line reason: the root cause's message, else the end's.
    fn reason(&self) -> String {
        match self.root_failure() {
            Some(f) => f.message.clone(),
            None => self
                .message
                .clone()
                .unwrap_or_else(|| format!("rdrun exited {}", self.exit_code)),
        }
    }
}

/// The innermost frame of `traceback` in the user's code: not the interpreter's standard
/// library or an installed package (`.../lib/pythonX.Y/...`, `site-packages`, `dist-packages`),
/// not `<frozen ...>` or `<string>`; the innermost frame of all when every frame is one of those.
/// A DDP error raised inside torch is annotated at the user's call into torch, not in torch.
fn user_frame(traceback: &[String]) -> Option<(String, u32)> {
    let frames = traceback::frames(traceback);
    let user = |file: &str| {
        !(file.starts_with('<')
            || file.contains("/site-packages/")
            || file.contains("/dist-packages/")
            || file.contains("/lib/python"))
    };
    frames
        .iter()
        .rev()
        .find(|(file, _)| user(file))
        .or(frames.last())
        .cloned()
}

/// `path` written whole: into a temporary file beside it, then renamed over it (a CI step that
/// reads it never sees half a file); a path that is not a regular file is written in place.
fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return std::fs::write(path, text);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Appends to `path` (the step summary collects every step's text).
fn append(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

#[cfg(test)]
mod tests;
