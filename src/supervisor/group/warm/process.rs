//! The template interpreter as a process rdrun owns: how it is started (its own session, the
//! run's cgroup, the watchdog's list, PR_SET_PDEATHSIG, one end of a SOCK_SEQPACKET socket pair),
//! the wire protocol of its requests (NUL-separated fields, the worker's stdio passed with
//! SCM_RIGHTS; the protocol's other half is `template.py`), whether it still lives (a pidfd, so
//! that a reused pid is never signalled), and its end.

use std::ffi::OsString;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};

/// The template program (embedded: rdrun is one file). It is sent as the socket's first
/// message, so that the template's command line stays short (each worker overwrites it).
pub const TEMPLATE_PY: &str = concat!(
    include_str!("topframe.py"),
    include_str!("pace.py"),
    include_str!("learn.py"),
    include_str!("template.py")
);

/// The template's `-c` program: reads the loader from the socket and runs it.
const BOOTSTRAP: &str = "import os,sys;exec(os.read(int(sys.argv[1]),1<<22))#rdrun warm template";

/// The socket's first message: reads the template program (the second message) and runs it,
/// compiled from its source or, where a code cache is given, from the code object a template
/// of the same program and Python version compiled before (`marshal`; compiling the ~60 KB
/// program took 8 ms of a bare template's ~30 ms start on the way to the first fork). `CACHE`
/// is replaced by the hex of the cache file's path prefix, or is empty.
const LOADER: &str = r#"import marshal
_src = os.read(int(sys.argv[1]), 1 << 22)
_cache = os.fsdecode(bytes.fromhex("CACHE")) if "CACHE" else ""
_code = None
if _cache:
    _cache += sys.implementation.cache_tag + ".bin"
    try:
        with open(_cache, "rb") as _f:
            _code = marshal.loads(_f.read())
    except Exception:
        _code = None
if _code is None:
    _code = compile(_src, "<string>", "exec", dont_inherit=True)
    if _cache:
        _tmp = "%s.%d" % (_cache, os.getpid())
        try:
            os.makedirs(os.path.dirname(_cache), mode=0o700, exist_ok=True)
            with open(_tmp, "wb") as _f:
                _f.write(marshal.dumps(_code))
            os.replace(_tmp, _cache)
        except OSError:
            pass
del _src, _cache
exec(_code)
"#;

/// The loader for a code cache under `dir` (none when `None`): the file is named after a hash
/// of the template program, so that another rdrun build never loads this one's code.
fn loader(dir: Option<&Path>) -> String {
    let hex = dir
        .map(|d| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            TEMPLATE_PY.hash(&mut h);
            let prefix = d.join(format!("template-{:016x}.", h.finish()));
            prefix
                .as_os_str()
                .as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        })
        .unwrap_or_default();
    LOADER.replace("CACHE", &hex)
}

/// The largest message the template reads (environment and argv included).
const MAX_REQUEST: usize = 1 << 22;

/// What the template needs to know at start besides its environment.
#[derive(Debug, Clone)]
pub struct TemplateStart {
    pub python: PathBuf,
    /// The environment overlay on rdrun's own (the first worker's, per-rank variables removed).
    pub env: Vec<(String, String)>,
    /// The workers' `sys.path[0]` (their script's directory, cwd for `-m`, empty for `-c`).
    pub path0: OsString,
    /// Modules to import besides torch.
    pub preload: Vec<String>,
    /// Options for the template, sent as `=NAME=VALUE` fields after the modules (template.py
    /// reads them: `bare`, `learn`, `memory`, `script`).
    pub options: Vec<(&'static str, OsString)>,
    /// Where the template program's compiled code is kept between runs (`LOADER`).
    pub code_cache: Option<PathBuf>,
    /// The first worker's command line (program and arguments): the template's command line is
    /// padded to its length, so that a worker can show its own in the same area.
    pub worker_cmdline: Vec<OsString>,
    pub cgroup_fd: Option<RawFd>,
    pub watchdog_fd: Option<RawFd>,
}

/// A running template: its pid, a pidfd for it, and rdrun's end of the socket.
#[derive(Debug)]
pub struct Template {
    pub pid: i32,
    pidfd: Option<OwnedFd>,
    sock: OwnedFd,
    /// The overlay it was started with (the import-time variables are compared against it).
    pub env: Vec<(String, String)>,
    /// What it says it holds once ready: its Python version and what it imported ("Python
    /// 3.11.7, torch 2.15.0, torch._dynamo"); empty before.
    pub holds: String,
}

/// A fork request: everything the worker would get from a cold exec.
pub struct Request<'a> {
    pub cwd: &'a Path,
    pub cpus: Option<&'a [usize]>,
    /// The interpreter's arguments (`-u script args`, `-u -m mod args`, `-u -c code args`).
    pub args: &'a [OsString],
    pub env: &'a [(OsString, OsString)],
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// The worker's stdin (rdrun's, or `/dev/null` for a rank that does not read it).
    pub stdin: Option<RawFd>,
    /// Another request follows at once (the rest of a group's local ranks): the template's
    /// intermediate process stays to fork that worker too (`fork+`; template.py `_serve`).
    pub more: bool,
}

/// The template's answer to a fork request.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Pid(i32),
    /// It will not fork now (a thread not known to be fork-safe): spawn cold.
    Cold(String),
}

/// Why the template cannot be used (it is then ended and not asked again).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot start the template interpreter: {0}")]
    Start(io::Error),
    #[error("preload failed: {0}")]
    Preload(String),
    #[error("the template interpreter exited during its start-up")]
    DiedAtStart,
    #[error("the template interpreter did not finish its imports within {0:?}")]
    StartTimeout(Duration),
    #[error("the template interpreter is gone ({0})")]
    Gone(String),
    #[error("the template interpreter answered {0:?}")]
    Protocol(String),
}

impl Template {
    /// Starts a template interpreter (its imports then run on their own; see
    /// [`Template::await_ready`], [`Template::ready_now`]).
    ///
    /// Call it on the main thread (PR_SET_PDEATHSIG follows the thread that forked).
    pub fn launch(s: &TemplateStart) -> Result<Template, TemplateError> {
        let (ours, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| TemplateError::Start(e.into()))?;
        let their_fd = theirs.as_raw_fd();
        let mut cmd = Command::new(&s.python);
        let fd_arg = their_fd.to_string();
        let pad = pad_len(
            &s.worker_cmdline,
            &[
                s.python.as_os_str(),
                "-u".as_ref(),
                "-c".as_ref(),
                BOOTSTRAP.as_ref(),
                fd_arg.as_ref(),
            ],
        );
        cmd.arg("-u")
            .arg("-c")
            .arg(BOOTSTRAP)
            .arg(&fd_arg)
            .arg("#".repeat(pad))
            .envs(s.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let parent = std::process::id() as libc::pid_t;
        let (cgroup_fd, watchdog_fd) = (s.cgroup_fd, s.watchdog_fd);
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, setsid, write,
        // send, prctl, getppid, getpid, raise) on copied integers; nothing is allocated.
        unsafe {
            cmd.pre_exec(move || {
                // Its end of the socket survives exec (it was made close-on-exec for every
                // other child).
                if libc::fcntl(their_fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                // In the run's cgroup: its workers inherit it, and the run's end kills it.
                if let Some(fd) = cgroup_fd {
                    crate::supervisor::group::contain::join(fd)?;
                }
                if let Some(fd) = watchdog_fd {
                    crate::supervisor::group::deadman::register(fd, libc::getpid());
                }
                crate::supervisor::group::signals::die_with_parent(parent)
            });
        }
        let child = cmd.spawn().map_err(TemplateError::Start)?;
        drop(theirs);
        // The program itself (the bootstrap reads it as the first message), then its
        // configuration: the workers' sys.path[0] and the modules to preload.
        let mut config = s.path0.as_bytes().to_vec();
        for m in &s.preload {
            config.push(0);
            config.extend_from_slice(m.as_bytes());
        }
        for (name, value) in &s.options {
            config.push(0);
            config.push(b'=');
            config.extend_from_slice(name.as_bytes());
            config.push(b'=');
            config.extend_from_slice(value.as_bytes());
        }
        let loader = loader(s.code_cache.as_deref());
        for msg in [loader.as_bytes(), TEMPLATE_PY.as_bytes(), &config] {
            if let Err(e) = socket::send(ours.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL) {
                // It died at once: the wait for "ready" below says so.
                tracing::debug!("cannot send the template its program: {e}");
            }
        }
        let pid = child.id() as i32;
        // Dropping `child` neither kills nor waits (the agent's waitpid(-1) may reap it).
        drop(child);
        let pidfd = pidfd_open(pid);
        Ok(Template {
            pid,
            pidfd,
            sock: ours,
            env: s.env.clone(),
            holds: String::new(),
        })
    }

    /// Starts a template and waits up to `timeout` for its imports.
    pub fn start(s: &TemplateStart, timeout: Duration) -> Result<Template, TemplateError> {
        let mut t = Template::launch(s)?;
        t.await_ready(timeout)?;
        Ok(t)
    }

    /// Whether a launched template has finished its imports, without waiting: `None` while it
    /// imports; `Some(Err)`: it failed (and was ended).
    pub fn ready_now(&mut self) -> Option<Result<(), TemplateError>> {
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: poll(2) on one valid pollfd, no wait.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            if n == 0 {
                return None;
            }
            if !self.take_note() {
                return Some(self.await_ready(Duration::ZERO));
            }
        }
    }

    /// Logs the template's notes that wait on the socket (learn.py: what it learned or skipped),
    /// without waiting; the notes that come before an answer are read with it anyway.
    pub fn drain_notes(&mut self) {
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, no wait.
        while unsafe { libc::poll(&mut p, 1, 0) } == 1 && self.take_note() {}
    }

    /// Whether the next message is a note (then read and logged); false when it is anything
    /// else, left unread.
    fn take_note(&mut self) -> bool {
        let mut buf = [0u8; 5];
        // SAFETY: recv(2) with MSG_PEEK into a buffer of the given length.
        let got = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if got != 5 || &buf != b"note " {
            return false;
        }
        match self.receive_one(Duration::ZERO) {
            Ok(Some(note)) => log_note(&note),
            _ => return false,
        }
        true
    }

    /// Waits up to `timeout` for the template's "ready"; on anything else it is ended.
    pub fn await_ready(&mut self, timeout: Duration) -> Result<(), TemplateError> {
        let t = self;
        match t.receive(timeout) {
            Ok(Some(msg)) if msg.starts_with("ready") => {
                t.holds = ready_holds(&msg);
                Ok(())
            }
            Ok(Some(msg)) => {
                t.end();
                Err(match msg.strip_prefix("failed ") {
                    Some(why) => TemplateError::Preload(why.to_string()),
                    None => TemplateError::Protocol(msg),
                })
            }
            Ok(None) => {
                t.end();
                Err(TemplateError::DiedAtStart)
            }
            Err(TemplateError::Gone(_)) => {
                t.end();
                Err(TemplateError::StartTimeout(timeout))
            }
            Err(e) => {
                t.end();
                Err(e)
            }
        }
    }

    /// Whether the process has exited (its pidfd is readable then).
    pub fn alive(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            // No pidfd (kernel < 5.3): signal 0 would be unsafe after a reap, so trust the
            // socket (a request to a dead template fails and ends it).
            return true;
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }

    /// Asks for one worker; `Err` means the template is unusable (it is ended by the caller).
    pub fn fork(&mut self, req: &Request<'_>, timeout: Duration) -> Result<Reply, TemplateError> {
        let msg = encode(req);
        if msg.len() > MAX_REQUEST {
            return Ok(Reply::Cold(format!(
                "the worker's environment and arguments take {} bytes (the template reads at most {MAX_REQUEST})",
                msg.len()
            )));
        }
        let mut fds = vec![req.stdout, req.stderr];
        fds.extend(req.stdin);
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let iov = [IoSlice::new(&msg)];
        socket::sendmsg::<()>(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| TemplateError::Gone(format!("send: {e}")))?;
        let answer = match self.receive(timeout)? {
            Some(a) => a,
            None => return Err(TemplateError::Gone("it closed the socket".into())),
        };
        parse_reply(&answer)
    }

    /// Ends a burst whose next request will not come (the next worker starts cold): the
    /// intermediate waiting for it exits now rather than at its idle bound, and its workers
    /// run. No answer comes; the template itself ignores the message when no burst is open.
    pub fn end_burst(&mut self) {
        match socket::send(self.sock.as_raw_fd(), b"end", MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => tracing::debug!("warm start: the template's burst ended early"),
            Err(e) => tracing::debug!("warm start: could not end the template's burst: {e}"),
        }
    }

    /// One message that is not a note (notes are logged on the way), or `None` at EOF; `Gone`
    /// when nothing came within `timeout`.
    fn receive(&mut self, timeout: Duration) -> Result<Option<String>, TemplateError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.receive_one(deadline.saturating_duration_since(Instant::now()))? {
                Some(msg) if msg.starts_with("note ") => log_note(&msg),
                other => return Ok(other),
            }
        }
    }

    /// One message, or `None` at EOF; `Gone` when nothing came within `timeout`.
    fn receive_one(&mut self, timeout: Duration) -> Result<Option<String>, TemplateError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: poll(2) on one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(TemplateError::Gone(format!("poll: {e}")));
            }
            if n == 0 {
                return Err(TemplateError::Gone(format!("no answer within {timeout:?}")));
            }
            let mut buf = vec![0u8; 65536];
            // SAFETY: recv(2) into a buffer of the given length.
            let got =
                unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if got < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.raw_os_error() == Some(libc::ECONNRESET) {
                    return Ok(None);
                }
                return Err(TemplateError::Gone(format!("recv: {e}")));
            }
            if got == 0 {
                return Ok(None);
            }
            buf.truncate(got as usize);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
    }

    /// SIGKILL (through the pidfd: never another process that got the pid) and reap it.
    pub fn end(&mut self) {
        let Some(fd) = self.pidfd.take() else {
            return;
        };
        // SAFETY: pidfd_send_signal(2) on our pidfd; no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
        // Reap it unless the agent's waitpid(-1) did: waitid on the pidfd, bounded.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            // SAFETY: zeroed siginfo is a valid out-parameter for waitid(2).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid(2) on our pidfd (P_PIDFD) with a valid out-pointer.
            let r = unsafe {
                libc::waitid(
                    libc::P_PIDFD,
                    fd.as_raw_fd() as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG,
                )
            };
            // SAFETY: reading si_pid of the siginfo waitid filled (0 when nothing exited).
            let reaped = r == 0 && unsafe { info.si_pid() } != 0;
            if r != 0 || reaped || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The length of the padding argument that makes the template's command-line area (NUL after
/// each word) as long as `worker`'s; 0 when the worker's is shorter.
fn pad_len(worker: &[OsString], fixed: &[&std::ffi::OsStr]) -> usize {
    let want: usize = worker.iter().map(|a| a.len() + 1).sum();
    let have: usize = fixed.iter().map(|a| a.len() + 1).sum::<usize>() + 1;
    want.saturating_sub(have)
}

/// pidfd_open(2); `None` on kernels without it.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) on our own unreaped child; the returned fd is owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The request's bytes (the template's `_serve` reads them back).
pub fn encode(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut field = |b: &[u8]| {
        out.extend_from_slice(b);
        out.push(0);
    };
    field(if req.more { b"fork+" } else { b"fork" });
    field(std::process::id().to_string().as_bytes());
    field(req.cwd.as_os_str().as_bytes());
    let cpus = req
        .cpus
        .unwrap_or(&[])
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    field(cpus.as_bytes());
    field(req.args.len().to_string().as_bytes());
    for a in req.args {
        field(a.as_bytes());
    }
    for (k, v) in req.env {
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        field(&kv);
    }
    out.pop(); // no terminator after the last field
    out
}

/// A template's `note LEVEL TEXT` in rdrun's log (`warn`: a warning; anything else: INFO).
fn log_note(msg: &str) {
    let rest = msg.strip_prefix("note ").unwrap_or(msg);
    let (level, text) = rest.split_once(' ').unwrap_or(("info", rest));
    if level == "warn" {
        tracing::warn!("warm start: {text}");
    } else {
        tracing::info!("warm start: {text}");
    }
}

/// What a `ready PID WHAT` message says the template holds (WHAT; empty when absent).
fn ready_holds(msg: &str) -> String {
    let mut words = msg.splitn(3, ' ');
    words.nth(2).unwrap_or_default().trim().to_string()
}

fn parse_reply(answer: &str) -> Result<Reply, TemplateError> {
    if let Some(pid) = answer.strip_prefix("pid ") {
        return match pid.trim().parse::<i32>() {
            Ok(p) if p > 0 => Ok(Reply::Pid(p)),
            _ => Err(TemplateError::Protocol(answer.to_string())),
        };
    }
    if let Some(why) = answer.strip_prefix("cold ") {
        return Ok(Reply::Cold(why.to_string()));
    }
    if let Some(why) = answer.strip_prefix("error ") {
        return Ok(Reply::Cold(format!("the template could not fork: {why}")));
    }
    Err(TemplateError::Protocol(answer.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_names_its_cache_by_the_program() {
        assert!(loader(None).contains(r#"bytes.fromhex("")) if """#));
        let with = loader(Some(Path::new("/c")));
        let hex: String = "/c/template-".bytes().map(|b| format!("{b:02x}")).collect();
        assert!(with.contains(&format!(r#"bytes.fromhex("{hex}"#)), "{with}");
        assert_eq!(with, loader(Some(Path::new("/c"))));
    }

    #[test]
    fn requests_and_replies() {
        let args = [OsString::from("-u"), OsString::from("t.py")];
        let env = [(OsString::from("A"), OsString::from("b=c"))];
        let req = Request {
            cwd: Path::new("/w"),
            cpus: Some(&[1, 3]),
            args: &args,
            env: &env,
            stdout: 1,
            stderr: 2,
            stdin: None,
            more: false,
        };
        let bytes = encode(&req);
        let fields: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
        let me = std::process::id().to_string();
        assert_eq!(
            fields,
            vec![
                &b"fork"[..],
                me.as_bytes(),
                b"/w",
                b"1,3",
                b"2",
                b"-u",
                b"t.py",
                b"A=b=c"
            ]
        );
        // A request with another right behind it (a group's next local rank) says so.
        let more = encode(&Request { more: true, ..req });
        assert!(more.starts_with(b"fork+\0"), "{more:?}");
        assert_eq!(parse_reply("pid 42").unwrap(), Reply::Pid(42));
        assert_eq!(
            parse_reply("cold thread 7").unwrap(),
            Reply::Cold("thread 7".into())
        );
        assert!(parse_reply("pid x").is_err());
        let w = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        // python\0-u\0t.py\0 (15) against py\0-c\0 (6) + the pad's NUL: 8 bytes of pad.
        let fixed: [&std::ffi::OsStr; 2] = ["py".as_ref(), "-c".as_ref()];
        assert_eq!(pad_len(&w(&["python", "-u", "t.py"]), &fixed), 8);
        assert_eq!(pad_len(&w(&["p"]), &fixed), 0);
        assert!(parse_reply("what").is_err());
        assert_eq!(
            ready_holds("ready 42 Python 3.11.7, torch 2.15.0"),
            "Python 3.11.7, torch 2.15.0"
        );
        assert_eq!(ready_holds("ready 42"), "");
        assert_eq!(
            parse_reply("error fork: EAGAIN").unwrap(),
            Reply::Cold("the template could not fork: fork: EAGAIN".into())
        );
    }
}
