//! A program run within a time bound, for the checks that need one (the interpreter,
//! `nvidia-smi`, the site's `--health-check-cmd`): its own process group, stdout and stderr
//! captured (the last lines kept), killed with its whole group at the bound. Reaped here before
//! the function returns, so no check leaves a child for the agent's `waitpid(-1)`.

use std::ffi::OsStr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// How a bounded run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It exited with this code (`None`: killed by a signal), and printed these last lines.
    Exited {
        code: Option<i32>,
        tail: Vec<String>,
    },
    /// Still running at the bound: its process group was killed.
    TimedOut { tail: Vec<String> },
    /// It could not be started: why.
    NotStarted(String),
}

/// Lines kept of a program's output.
const TAIL_LINES: usize = 5;
/// Bytes read of a program's output (the rest is drained and dropped).
const MAX_OUTPUT: usize = 64 * 1024;
/// After the program ended, how long its output pipes may stay open (a grandchild that left
/// the group can hold them): the output read so far is kept.
const PIPE_GRACE: Duration = Duration::from_millis(500);

/// Runs `program args` with stdin closed, within `bound`.
pub async fn run_bounded(program: impl AsRef<OsStr>, args: &[&str], bound: Duration) -> Ran {
    let mut cmd = tokio::process::Command::new(program.as_ref());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl(2) only, async-signal-safe. The check dies with the thread that started it
    // (checks may run on a thread of their own, `supervisor/healthlink.rs`) and with rdrun.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(e.to_string()),
    };
    let pid = child.id();
    // A run dropped before its end (the checks cancelled) kills the group it created.
    let mut group = GroupGuard(pid);
    let out = child.stdout.take().map(|s| tokio::spawn(read_some(s)));
    let err = child.stderr.take().map(|s| tokio::spawn(read_some(s)));
    let waited = tokio::time::timeout(bound, child.wait()).await;
    let timed_out = waited.is_err();
    let code = match waited {
        Ok(Ok(status)) => status.code(),
        Ok(Err(_)) => None,
        Err(_) => {
            // The group is the one this call created: nothing else is signalled.
            if let Some(pid) = pid {
                // SAFETY: plain kill(2) of the process group this call created.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            let _ = child.wait().await;
            None
        }
    };
    group.0 = None;
    let mut text = Vec::new();
    for task in [out, err].into_iter().flatten() {
        if let Ok(Ok(bytes)) = tokio::time::timeout(PIPE_GRACE, task).await {
            text.extend(bytes);
        }
    }
    let tail = tail_lines(&String::from_utf8_lossy(&text));
    match timed_out {
        true => Ran::TimedOut { tail },
        false => Ran::Exited { code, tail },
    }
}

/// Kills the process group `run_bounded` created unless the run reached its end.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // SAFETY: plain kill(2) of the process group this call created.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    }
}

async fn read_some(mut r: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return buf,
            Ok(n) if buf.len() < MAX_OUTPUT => buf.extend_from_slice(&chunk[..n]),
            Ok(_) => {}
        }
    }
}

/// The last [`TAIL_LINES`] non-empty lines.
fn tail_lines(text: &str) -> Vec<String> {
    let lines: Vec<String> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].to_vec()
}

/// `exit 3: last | lines`, `killed by signal`, `no answer within 2.0 s (killed): ...`.
pub fn describe(ran: &Ran, bound: Duration) -> String {
    let with = |head: String, tail: &[String]| match tail.is_empty() {
        true => head,
        false => format!("{head}: {}", tail.join(" | ")),
    };
    match ran {
        Ran::Exited {
            code: Some(c),
            tail,
        } => with(format!("exit {c}"), tail),
        Ran::Exited { code: None, tail } => with("killed by a signal".into(), tail),
        Ran::TimedOut { tail } => with(
            format!("no answer within {:.1} s (killed)", bound.as_secs_f64()),
            tail,
        ),
        Ran::NotStarted(why) => format!("cannot start: {why}"),
    }
}

impl Ran {
    pub fn succeeded(&self) -> bool {
        matches!(self, Ran::Exited { code: Some(0), .. })
    }
}
