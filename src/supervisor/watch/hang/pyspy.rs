//! py-spy: running `py-spy dump --nonblocking --full-filenames` on one process within a bound,
//! what came of it ([`StackStatus`]), and the main thread's frames read from its text.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Outcome of the stack capture of one rank.
#[derive(Debug, Clone, PartialEq)]
pub enum StackStatus {
    /// py-spy ran; its text output is in `RankCapture::stack`.
    Ok,
    /// No py-spy binary found (where we looked).
    Unavailable(String),
    /// py-spy ran and failed (exit status and the first stderr line: permission hints live there).
    Failed(String),
    /// py-spy did not finish within the bound and was killed.
    Timeout,
}

impl StackStatus {
    pub fn name(&self) -> &'static str {
        match self {
            StackStatus::Ok => "ok",
            StackStatus::Unavailable(_) => "unavailable",
            StackStatus::Failed(_) => "failed",
            StackStatus::Timeout => "timeout",
        }
    }
}

/// The main thread's frames of a `py-spy dump` text, innermost first.
pub fn parse_py_spy_main_frames(text: &str) -> Vec<String> {
    let mut threads: Vec<(bool, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if line.starts_with("Thread ") {
            threads.push((line.contains("\"MainThread\""), Vec::new()));
        } else if let Some((_, frames)) = threads.last_mut() {
            let t = line.trim();
            if line.starts_with(char::is_whitespace) && !t.is_empty() && !t.starts_with("Locals:") {
                frames.push(t.to_string());
            }
        }
    }
    let pick = threads.iter().position(|t| t.0).unwrap_or(0);
    threads
        .into_iter()
        .nth(pick)
        .map(|t| t.1)
        .unwrap_or_default()
}

/// Runs py-spy on `pid` within `bound`. py-spy is started and waited for on a thread of its
/// own, so that it is that thread's child: the agent reaps its workers and orphans with
/// `waitpid(-1, __WNOTHREAD)` on the main thread (`worker::reap`), which can then never take
/// py-spy's exit status from under this wait, however the capture and the agent interleave.
pub(crate) async fn run_py_spy(bin: &Path, pid: i32, bound: Duration) -> (StackStatus, String) {
    let mut cmd = std::process::Command::new(bin);
    // Full file names: what tells the user's own code from the standard library and
    // site-packages (shortened, both are bare `name.py`).
    cmd.args([
        "dump",
        "--nonblocking",
        "--pid",
        &pid.to_string(),
        "--full-filenames",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("rdrun-py-spy".into())
        .spawn(move || {
            let child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let _ = started_tx.send(Ok(child.id() as i32));
            let _ = done_tx.send(child.wait_with_output());
        });
    if let Err(e) = spawned {
        return (
            StackStatus::Failed(format!("cannot start a thread for py-spy: {e}")),
            String::new(),
        );
    }
    let child_pid = match started_rx.recv() {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            return (
                StackStatus::Failed(format!("cannot run {}: {e}", bin.display())),
                String::new(),
            )
        }
        Err(_) => {
            return (
                StackStatus::Failed("the py-spy thread ended early".into()),
                String::new(),
            )
        }
    };
    let out = match tokio::time::timeout(bound, done_rx).await {
        Err(_) => {
            // SAFETY: kill(2) of the py-spy process this function started, not yet waited for
            // (its thread is still in wait, so the pid cannot have been reused).
            unsafe { libc::kill(child_pid, libc::SIGKILL) };
            return (StackStatus::Timeout, String::new());
        }
        Ok(Err(_)) => {
            return (
                StackStatus::Failed("the py-spy thread ended early".into()),
                String::new(),
            )
        }
        Ok(Ok(Err(e))) => return (StackStatus::Failed(e.to_string()), String::new()),
        Ok(Ok(Ok(out))) => out,
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        (StackStatus::Ok, text)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        (
            StackStatus::Failed(format!("{}: {first}", out.status)),
            text,
        )
    }
}
