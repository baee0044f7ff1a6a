//! The watchdog: a small forked helper that cleans up after rdrun when rdrun dies without doing
//! it itself (SIGKILL of rdrun or of its whole process group, OOM kill, abort).
//!
//! PR_SET_PDEATHSIG kills each worker when rdrun dies, but not the worker's own children (the
//! flag is cleared on fork, prctl(2)), and processes that call `setsid` (daemons, double forks)
//! leave every process group rdrun knows. The watchdog closes that gap:
//!
//! - it runs in its own session (`setsid` first thing), so a SIGKILL of rdrun's process group
//!   or a terminal's job kill does not take it along;
//! - it notices rdrun's death as EOF on a unix socket whose only other end rdrun holds (workers
//!   hold it only between fork and exec: it is close-on-exec);
//! - then it kills the run's cgroup ([`contain`]: every worker joined it before exec, so it holds
//!   everything they ever started), every registered worker process group, and — where there
//!   is no cgroup — every process it saw in rdrun's tree (it polls that tree while rdrun lives;
//!   see [`TRACK_EVERY`]), then removes the run's shared-memory segments (names from
//!   `workerenv::run_shm_prefix`), the cgroup directory, rdrun's private log directory and the
//!   run's temporary directories (the warm start's learned-imports directory), and exits.
//!
//! rdrun waits for it at its own end ([`Watchdog`]'s `Drop`), so the watchdog never lingers as a
//! zombie (its parent is rdrun).
//!
//! Messages (8 bytes: native-endian i32 kind, i32 value; a path's bytes follow its header):
//! `GROUP pgid`, `FORGET_GROUPS`, `DIR len` + bytes, `FORGET_DIR`, `CONTAINED` (rdrun created
//! the cgroup: no tree tracking needed), `FORGET_CGROUPS` (rdrun removed it at its end),
//! `TEMP_DIR len` + bytes (one more directory to remove: they add up, and one rdrun removed
//! itself is simply gone). A unix stream socket pair rather than a pipe: writers
//! use `send(MSG_NOSIGNAL)`, so a dead watchdog costs an EPIPE, never a SIGPIPE that would kill
//! a worker before its exec.
//!
//! The child is forked while rdrun has a single thread, so it is an ordinary single-threaded
//! process: it may allocate and use std (no lock can be held by a thread that does not exist).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::supervisor::group::contain::{self, Cgroup, Mode};

/// Longest directory path the watchdog accepts (PATH_MAX without the NUL).
const PATH_CAP: usize = 4095;
/// How often the watchdog records rdrun's process tree where there is no cgroup: processes
/// that lived at least this long are killed if rdrun dies.
pub const TRACK_EVERY: Duration = Duration::from_millis(100);
/// How long the watchdog waits for the cgroup to empty after SIGKILL.
const CGROUP_WAIT: Duration = Duration::from_secs(10);
/// How long rdrun waits for it at its own end: it has already waited for every process it
/// could see after SIGKILL (the agent's KILL_WAIT), so only a short extra bound.
const FINAL_CGROUP_WAIT: Duration = Duration::from_secs(1);
/// How long rdrun waits for the watchdog to exit at rdrun's end.
const EXIT_WAIT: Duration = Duration::from_secs(5);

const GROUP: i32 = 1;
const FORGET_GROUPS: i32 = 2;
const DIR: i32 = 3;
const FORGET_DIR: i32 = 4;
const CONTAINED: i32 = 5;
const FORGET_CGROUPS: i32 = 6;
const TEMP_DIR: i32 = 7;

/// Handle to the watchdog process (and the run's cgroup), held by rdrun for its whole life.
/// Dropping it removes the cgroup (killing what is left in it), ends the watchdog and reaps it.
#[derive(Debug)]
pub struct Watchdog {
    write: Option<OwnedFd>,
    pid: i32,
    cgroup: Option<Cgroup>,
}

/// What the watchdog cleans when rdrun dies.
struct Plan {
    rdrun: i32,
    cgroups: Vec<PathBuf>,
    shm_run_id: Option<String>,
}

impl Watchdog {
    /// Forks the watchdog, then creates the run's cgroup (`mode`, from `RDRUN_CGROUP`, chooses,
    /// see [`contain`]). Call before any thread or runtime exists. `run_id` names the shared-memory
    /// segments to remove if rdrun dies (not for the shared default id "none", which a
    /// concurrent job may use).
    pub fn start(run_id: &str, mode: Mode) -> io::Result<Watchdog> {
        let plan = Plan {
            rdrun: std::process::id() as i32,
            cgroups: contain::plan(mode),
            shm_run_id: (run_id != "none").then(|| run_id.to_string()),
        };
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: valid out-array of two ints; SOCK_CLOEXEC keeps the write end out of workers
        // (they write through it between fork and exec only).
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair just returned these two fresh descriptors; we own them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fork(2) while single-threaded (the caller's contract).
        let pid = unsafe { libc::fork() };
        if pid == -1 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            child_main(read.as_raw_fd(), write.as_raw_fd(), &plan);
        }
        drop(read);
        // Wait until the watchdog has its own session: before that a SIGKILL of rdrun's process
        // group would take it too, and nothing may be created for it to clean up meanwhile.
        let mut ack = [0u8; 1];
        let mut pfd = libc::pollfd {
            fd: write.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, then recv(2) of one byte into a local.
        let acked = unsafe {
            libc::poll(&mut pfd, 1, EXIT_WAIT.as_millis() as i32) == 1
                && libc::recv(write.as_raw_fd(), ack.as_mut_ptr().cast(), 1, 0) == 1
        };
        if !acked {
            tracing::warn!(pid, "the watchdog did not report in; a SIGKILL of rdrun's process group may take it along");
        }
        tracing::debug!(pid, "watchdog started");
        let mut w = Watchdog {
            write: Some(write),
            pid,
            cgroup: None,
        };
        if !plan.cgroups.is_empty() {
            match Cgroup::create(&plan.cgroups) {
                Ok(cg) => {
                    tracing::debug!(dir = %cg.dir().display(), "workers contained in a cgroup");
                    w.send(&msg(CONTAINED, 0));
                    w.cgroup = Some(cg);
                }
                Err(err) if mode == Mode::Auto => tracing::debug!(
                    "no cgroup for the workers ({err}); the watchdog tracks rdrun's process tree instead"
                ),
                Err(err) => tracing::warn!(
                    "cannot create a cgroup for the workers ({err}); the watchdog tracks rdrun's process tree instead"
                ),
            }
        }
        Ok(w)
    }

    /// The write end workers register into (see `worker::SpawnSpec::watchdog_fd`).
    pub fn fd(&self) -> RawFd {
        self.write.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The run's cgroup's `cgroup.procs`, which workers join before exec
    /// (`worker::SpawnSpec::cgroup_fd`); `None` without a cgroup.
    pub fn cgroup_fd(&self) -> Option<RawFd> {
        self.cgroup.as_ref().map(Cgroup::procs_fd)
    }

    /// The watchdog's pid (a child of rdrun, not part of any worker group or of the cgroup).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The run's cgroup directory, for the stop sequence's kill (`None` without a cgroup).
    pub fn cgroup_dir(&self) -> Option<std::path::PathBuf> {
        self.cgroup.as_ref().map(|cg| cg.dir().to_path_buf())
    }

    /// Forgets every registered group: rdrun has stopped them itself.
    pub fn disarm(&self) {
        self.send(&msg(FORGET_GROUPS, 0));
    }

    /// Registers the directory to remove if rdrun dies without cleaning up (replaces any
    /// earlier one). Paths longer than PATH_MAX are not registered.
    pub fn set_dir(&self, dir: &Path) {
        self.send_path(DIR, dir);
    }

    /// Registers one more of the run's temporary directories to remove if rdrun dies (the warm
    /// start's learned-imports directory; rdrun removes it itself at a normal end).
    pub fn remove_on_death(&self, dir: &Path) {
        self.send_path(TEMP_DIR, dir);
    }

    /// A message of `kind` carrying `dir` (not sent when empty, longer than PATH_MAX, or
    /// holding a NUL).
    fn send_path(&self, kind: i32, dir: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let bytes = dir.as_os_str().as_bytes();
        if bytes.is_empty() || bytes.len() > PATH_CAP || bytes.contains(&0) {
            return;
        }
        let mut m = msg(kind, bytes.len() as i32).to_vec();
        m.extend_from_slice(bytes);
        self.send(&m);
    }

    /// Forgets the registered directory (rdrun removed or kept it itself).
    pub fn forget_dir(&self) {
        self.send(&msg(FORGET_DIR, 0));
    }

    fn send(&self, m: &[u8]) {
        let fd = self.fd();
        let mut sent = 0;
        while sent < m.len() {
            // SAFETY: send(2) from a valid buffer slice.
            let n = unsafe {
                libc::send(
                    fd,
                    m[sent..].as_ptr().cast(),
                    m.len() - sent,
                    libc::MSG_NOSIGNAL,
                )
            };
            if n <= 0 {
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            sent += n as usize;
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let mut wait = EXIT_WAIT;
        if let Some(cg) = self.cgroup.take() {
            let dir = cg.dir().to_path_buf();
            if cg.destroy(FINAL_CGROUP_WAIT) {
                // Removed: the watchdog need not look at it again.
                self.send(&msg(FORGET_CGROUPS, 0));
            } else {
                // The watchdog goes on killing and removes it once it empties (within its
                // own bound); rdrun does not wait for that.
                tracing::error!(
                    "processes of the run are still alive after SIGKILL (uninterruptible sleep?); the watchdog keeps trying to remove their cgroup {}",
                    dir.display()
                );
                wait = Duration::ZERO;
            }
        }
        // EOF: the watchdog does what is left (nothing after a clean run) and exits.
        drop(self.write.take());
        let deadline = Instant::now() + wait;
        loop {
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            // The pid, or ECHILD: the agent's waitpid(-1) reaped it already.
            if r == self.pid
                || (r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
            {
                return;
            }
            if Instant::now() >= deadline {
                tracing::debug!(
                    pid = self.pid,
                    "the watchdog is still cleaning up; not waiting for it"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn msg(kind: i32, value: i32) -> [u8; 8] {
    let mut m = [0u8; 8];
    m[..4].copy_from_slice(&kind.to_ne_bytes());
    m[4..].copy_from_slice(&value.to_ne_bytes());
    m
}

/// Registers a worker's process group. Async-signal-safe: called between fork and exec.
/// Errors are ignored (a watchdog that died cannot be helped; MSG_NOSIGNAL keeps that from
/// killing the caller). An 8-byte message on a unix stream socket is not split in practice.
pub fn register(fd: RawFd, pgid: libc::pid_t) {
    let m = msg(GROUP, pgid);
    // SAFETY: send(2) of 8 bytes from a valid local.
    let _ = unsafe { libc::send(fd, m.as_ptr().cast(), m.len(), libc::MSG_NOSIGNAL) };
}

/// What the watchdog has learnt while rdrun lived.
#[derive(Default)]
struct State {
    groups: Vec<i32>,
    dir: Option<Vec<u8>>,
    /// The run's temporary directories (`TEMP_DIR`).
    temp_dirs: Vec<Vec<u8>>,
    contained: bool,
    /// rdrun removed (or gave up on) the cgroup itself at its end.
    cgroups_done: bool,
    /// Processes seen in rdrun's tree: pid → start time (field 22 of /proc/<pid>/stat), so that
    /// a reused pid is never killed.
    tracked: HashMap<i32, u64>,
}

/// Decodes the message stream; keeps an incomplete message in `buf`.
fn decode(buf: &mut Vec<u8>, st: &mut State) {
    let mut at = 0;
    while buf.len() - at >= 8 {
        let kind = i32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let value = i32::from_ne_bytes(buf[at + 4..at + 8].try_into().expect("4 bytes"));
        match kind {
            GROUP if value > 0 && !st.groups.contains(&value) => st.groups.push(value),
            FORGET_GROUPS => {
                st.groups.clear();
                st.tracked.clear();
            }
            FORGET_DIR => st.dir = None,
            FORGET_CGROUPS => st.cgroups_done = true,
            CONTAINED => {
                st.contained = true;
                st.tracked.clear();
            }
            DIR | TEMP_DIR => {
                let len = (value.max(0) as usize).min(PATH_CAP);
                if buf.len() - at - 8 < len {
                    break;
                }
                let path = buf[at + 8..at + 8 + len].to_vec();
                match kind {
                    DIR => st.dir = Some(path),
                    _ => st.temp_dirs.push(path),
                }
                at += len;
            }
            _ => {}
        }
        at += 8;
    }
    buf.drain(..at);
}

/// Start time of `pid` in clock ticks since boot (proc(5) field 22), `None` once it is gone or
/// a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `rest` starts at field 3 (state); field 22 is 19 further.
    fields.nth(18)?.parse().ok()
}

fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.filter_map(Result::ok) {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(
                    text.split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    out
}

/// Records every live process below `rdrun` that rdrun started (the watchdog itself excluded).
fn track(rdrun: i32, me: i32, st: &mut State) {
    st.tracked
        .retain(|&pid, &mut start| start_time(pid) == Some(start));
    // Only what rdrun started: never what it inherited (noted before this process was forked).
    for p in crate::supervisor::group::proctree::own_tree(
        rdrun,
        crate::supervisor::group::proctree::note_inherited(),
    ) {
        if p.pid == me || p.zombie || st.tracked.contains_key(&p.pid) {
            continue;
        }
        if let Some(start) = start_time(p.pid) {
            st.tracked.insert(p.pid, start);
        }
    }
}

/// The fallback without a cgroup: stops every tracked process that is still the same process,
/// and their descendants (found while they are stopped, so none can fork meanwhile), then
/// SIGKILLs them all.
fn kill_tracked(st: &State) {
    let mut stopped: Vec<i32> = Vec::new();
    let mut frontier: Vec<i32> = st
        .tracked
        .iter()
        .filter(|(&pid, &start)| start_time(pid) == Some(start))
        .map(|(&pid, _)| pid)
        .collect();
    while let Some(pid) = frontier.pop() {
        if stopped.contains(&pid) {
            continue;
        }
        // SAFETY: kill(2) of a process seen in rdrun's tree (start time checked) or a child of one.
        unsafe {
            libc::kill(pid, libc::SIGSTOP);
        }
        stopped.push(pid);
        frontier.extend(children(pid));
    }
    for &pid in &stopped {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The watchdog's whole life. Never returns.
fn child_main(read: RawFd, write: RawFd, plan: &Plan) -> ! {
    detach(read, write);
    let mut st = State::default();
    follow_rdrun(plan, &mut st);
    // rdrun is gone (or ended and let go of us).
    clean_up(plan, st);
    // SAFETY: ends the watchdog without running rdrun's destructors or atexit handlers.
    unsafe { libc::_exit(0) }
}

/// The forked child made a watchdog of its own: a session of its own (told to rdrun), the
/// terminal and job-control signals ignored, stdio on /dev/null, rdrun's socket as fd 3 and
/// every other inherited descriptor closed.
fn detach(read: RawFd, write: RawFd) {
    // SAFETY: plain syscalls in the freshly forked, single-threaded child.
    unsafe {
        // Own session and process group: a signal to rdrun's group must not reach it. rdrun
        // waits for the byte that says so.
        libc::setsid();
        libc::send(read, b"!".as_ptr().cast(), 1, libc::MSG_NOSIGNAL);
        // Terminal and job-control signals go to sessions and groups; ignore them anyway.
        for sig in [
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::close(write);
        // Do not hold rdrun's stdout/stderr open: whoever reads them waits for EOF.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
        }
        if read != 3 {
            libc::dup2(read, 3);
        }
        // Drop every other inherited descriptor (write ends of other pipes rdrun's parent gave
        // it, the cgroup's files).
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
    }
}

/// Reads rdrun's messages on fd 3 into `st` until rdrun is gone (EOF or an error), tracking
/// rdrun's process tree meanwhile while nothing contains it.
fn follow_rdrun(plan: &Plan, st: &mut State) {
    let read: RawFd = 3;
    let me = std::process::id() as i32;
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut chunk = [0u8; 4096];
    loop {
        let timeout = if st.contained {
            -1
        } else {
            TRACK_EVERY.as_millis() as i32
        };
        let mut pfd = libc::pollfd {
            fd: read,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if r > 0 {
            // SAFETY: read(2) into a local buffer.
            let n = unsafe { libc::read(read, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n as usize]);
            decode(&mut buf, st);
        }
        if !st.contained {
            track(plan.rdrun, me, st);
        }
    }
}

/// What rdrun left: its worker groups and cgroups killed, its tracked processes too when no
/// cgroup held them, its shared-memory segments and its run directory removed.
fn clean_up(plan: &Plan, st: State) {
    for &pgid in &st.groups {
        // SAFETY: kill(2) of a worker process group rdrun registered.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    if !st.cgroups_done {
        for dir in &plan.cgroups {
            contain::kill_and_remove(dir, CGROUP_WAIT);
        }
    }
    if !st.contained {
        kill_tracked(&st);
    }
    if let Some(run_id) = &plan.shm_run_id {
        let _ = crate::workerenv::cleanup_run_shm(run_id);
    }
    use std::os::unix::ffi::OsStrExt;
    for dir in st.dir.iter().chain(&st.temp_dirs).filter(|d| !d.is_empty()) {
        let _ = std::fs::remove_dir_all(std::ffi::OsStr::from_bytes(dir));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_stream() {
        let mut st = State::default();
        let mut buf = Vec::new();
        buf.extend_from_slice(&msg(GROUP, 10));
        buf.extend_from_slice(&msg(GROUP, 11));
        buf.extend_from_slice(&msg(GROUP, 10));
        let mut d = msg(DIR, 4).to_vec();
        d.extend_from_slice(b"/tmp");
        // The directory message split across two reads.
        buf.extend_from_slice(&d[..6]);
        decode(&mut buf, &mut st);
        assert_eq!(st.groups, vec![10, 11]);
        assert_eq!(st.dir, None);
        assert_eq!(buf.len(), 6);
        buf.extend_from_slice(&d[6..]);
        buf.extend_from_slice(&msg(CONTAINED, 0));
        decode(&mut buf, &mut st);
        assert_eq!(st.dir.as_deref(), Some(&b"/tmp"[..]));
        assert!(st.contained && buf.is_empty());
        buf.extend_from_slice(&msg(FORGET_GROUPS, 0));
        buf.extend_from_slice(&msg(FORGET_DIR, 0));
        buf.extend_from_slice(&msg(FORGET_CGROUPS, 0));
        for path in [&b"/tmp/a"[..], &b"/tmp/b"[..]] {
            buf.extend_from_slice(&msg(TEMP_DIR, path.len() as i32));
            buf.extend_from_slice(path);
        }
        decode(&mut buf, &mut st);
        assert!(st.groups.is_empty() && st.dir.is_none() && st.cgroups_done);
        assert_eq!(st.temp_dirs, [b"/tmp/a".to_vec(), b"/tmp/b".to_vec()]);
    }

    #[test]
    fn start_time_of_self_and_of_the_gone() {
        let me = std::process::id() as i32;
        let t = start_time(me).expect("own start time");
        assert_eq!(start_time(me), Some(t));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id() as i32;
        child.wait().expect("wait");
        assert_eq!(start_time(pid), None);
    }
}
