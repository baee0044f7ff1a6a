//! A program run within a time bound, for the checks that need one (the interpreter,
//! `nvidia-smi`, the site's `--health-check-cmd`): its own process group, stdout and stderr
//! captured (the last lines kept), reaped here before the function returns, so no check leaves
//! a child for the agent's `waitpid(-1)`.
//!
//! Contained like a worker (issue 38.11), through the [`Containment`] the supervisor hands in
//! (this module knows no cgroup): the program joins a cgroup of its own below the run's between
//! fork and exec, so whatever it starts — `setsid` and double forks included — is killed with
//! that cgroup when the program ends (passed, failed, timed out or cancelled) and with the run's
//! when rdrun dies (the watchdog kills the run's cgroup, sub-cgroups included). Its process
//! group is registered with the watchdog and killed at the program's end too: all there is
//! without a cgroup, with the parent-death signal.

use std::ffi::OsStr;
use std::os::fd::RawFd;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Where a checked program runs so that nothing it starts outlives it or rdrun: the run's
/// containment (`supervisor/group/contain.rs`), given to the checks by the supervisor.
pub trait Containment: Send + Sync + std::fmt::Debug {
    /// A cgroup of its own for one program, below the run's (a kill of the run's takes it);
    /// `None` where there is none.
    fn cell(&self) -> Option<Box<dyn Cell>>;
    /// Runs in the program's process between fork and exec, so async-signal-safe calls only:
    /// joins the cell whose `cgroup.procs` is `cell` (before the program can fork) and
    /// registers the process group with the watchdog (killed if rdrun dies). Failures are left
    /// out: the check still runs, in its process group, with the parent-death signal.
    fn enter(&self, cell: Option<RawFd>);
}

/// One program's cgroup (see [`Containment::cell`]).
pub trait Cell: Send {
    /// Its `cgroup.procs`, open for writing (for [`Containment::enter`]).
    fn procs_fd(&self) -> RawFd;
    /// Kills everything in it, waits (bounded) for it to empty and removes it.
    fn end(self: Box<Self>);
}

/// The containment the checks of a run share (`None`: process groups only).
pub type Contain = Option<Arc<dyn Containment>>;

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

/// Runs `program args` with stdin closed, within `bound`, contained by `contain`.
pub async fn run_bounded(
    program: impl AsRef<OsStr>,
    args: &[&str],
    bound: Duration,
    contain: &Contain,
) -> Ran {
    let cell = contain.as_ref().and_then(|c| c.cell());
    let procs = cell.as_ref().map(|c| c.procs_fd());
    let enter = contain.clone();
    // From here on the cell is ended whatever happens, a cancelled run included.
    let mut ends = Ends { group: None, cell };
    let mut cmd = tokio::process::Command::new(program.as_ref());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe calls: `Containment::enter`'s contract, and prctl.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(c) = &enter {
                c.enter(procs);
            }
            // The check dies with the thread that started it (checks may run on a thread of
            // their own, `supervisor/nodes/health_gate.rs`) and with rdrun.
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(e.to_string()),
    };
    ends.group = child.id();
    let out = child.stdout.take().map(|s| tokio::spawn(read_some(s)));
    let err = child.stderr.take().map(|s| tokio::spawn(read_some(s)));
    let waited = tokio::time::timeout(bound, child.wait()).await;
    let timed_out = waited.is_err();
    let code = match waited {
        Ok(Ok(status)) => status.code(),
        Ok(Err(_)) => None,
        Err(_) => {
            ends.kill_group();
            let _ = child.wait().await;
            None
        }
    };
    // Whatever it left running (a background job, a `setsid` daemon) ends with it: a check is
    // done when its program is. Then its output pipes, which such a process held, close too.
    drop(ends);
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

/// What `run_bounded` ends when it returns or is dropped: the process group it created (by
/// SIGKILL, also after the program exited: what it left in its group) and its cgroup.
struct Ends {
    group: Option<u32>,
    cell: Option<Box<dyn Cell>>,
}

impl Ends {
    fn kill_group(&self) {
        if let Some(pid) = self.group {
            // SAFETY: plain kill(2) of the process group this run created; its leader is not
            // reaped yet or was reaped just now, so the id is not another group's.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    }
}

impl Drop for Ends {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(cell) = self.cell.take() {
            cell.end();
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
