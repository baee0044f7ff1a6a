//! Shared runner for the launcher tests: an `Rdrun` builder around the real binary
//! (`CARGO_BIN_EXE_rdrun`), a per-test temporary directory, a hard wall-clock bound on every run
//! (the run is SIGKILLed by PID when it expires), an [`Output`] whose `Debug` shows command, exit
//! code, stdout and stderr, and process-leak checks that work by PID.
//!
//! Tests never kill by name and never rely on timing for correctness: waits are generous bounds.

#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default hard bound on one rdrun run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "rdrun-test-{}-{n}-{}",
            std::process::id(),
            name.replace(['/', ':'], "_")
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create test temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Path of a worker fixture in `launcher-tests/workers/`.
pub fn worker(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launcher-tests/workers")
        .join(name)
}

/// Path of the rdrun binary under test. Every way a test starts rdrun asks for it (the
/// `Rdrun` builder, tmux terminals, srun, mpirun, shell scripts), so this is where the test
/// process's own environment turns off what would outlive the test: the warm-start template's
/// remembered lists in the user's cache (`RDRUN_WARM_MEMORY=off`, inherited by every child; a
/// test of the memory sets a directory of its own).
pub fn rdrun_bin() -> PathBuf {
    static ISOLATED: std::sync::Once = std::sync::Once::new();
    // std serialises environment reads and writes (Command spawns included) with one lock.
    ISOLATED.call_once(|| std::env::set_var("RDRUN_WARM_MEMORY", "off"));
    PathBuf::from(env!("CARGO_BIN_EXE_rdrun"))
}

/// Builder for one rdrun invocation.
#[derive(Debug, Clone)]
pub struct Rdrun {
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    timeout: Duration,
    cwd: Option<PathBuf>,
    /// Network namespace (`ip netns` name) to run rdrun in.
    netns: Option<String>,
    /// Host name rdrun sees (a UTS namespace of its own, through `unshare`; root only).
    hostname: Option<String>,
}

impl Default for Rdrun {
    fn default() -> Self {
        Self::new()
    }
}

impl Rdrun {
    pub fn new() -> Rdrun {
        Rdrun {
            args: Vec::new(),
            // The learned warm-start list is remembered in the user's cache otherwise: every
            // test would leave a file there, and a launch would depend on an earlier test's.
            // The tests of the memory set a directory of their own.
            env: vec![("RDRUN_WARM_MEMORY".into(), "off".into())],
            // Variables rdrun reads or workers would inherit that could skew a test.
            env_remove: [
                "OMP_NUM_THREADS",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "TORCHELASTIC_ERROR_FILE",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                "CUDA_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES",
                "RUST_LOG",
                "LOGLEVEL",
                "RDRUN_WARM_START",
                "RDRUN_PRELOAD",
            ]
            .iter()
            .map(OsString::from)
            .collect(),
            timeout: RUN_TIMEOUT,
            cwd: None,
            netns: None,
            hostname: None,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Rdrun {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Rdrun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Rdrun {
        let key = key.as_ref().to_owned();
        self.env_remove.retain(|k| *k != key);
        self.env.push((key, value.as_ref().to_owned()));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Rdrun {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Rdrun {
        self.timeout = timeout;
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Rdrun {
        self.cwd = Some(dir.as_ref().to_owned());
        self
    }

    /// Runs rdrun inside network namespace `name` (`ip netns exec` execs it in place, so the
    /// pid is still rdrun's).
    pub fn netns(mut self, name: &str) -> Rdrun {
        self.netns = Some(name.to_string());
        self
    }

    /// Runs rdrun with host name `name` in a UTS namespace of its own (`unshare --uts`, then
    /// `hostname`, then rdrun exec'd in place: the spawned pid is rdrun's); root only.
    pub fn hostname(mut self, name: &str) -> Rdrun {
        self.hostname = Some(name.to_string());
        self
    }

    fn command(&self) -> Command {
        let mut cmd = match (&self.netns, &self.hostname) {
            (Some(ns), None) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(rdrun_bin());
                c
            }
            // A simulated host with a name of its own: both namespaces, rdrun exec'd in place.
            (Some(ns), Some(h)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "unshare", "--uts", "sh", "-c"])
                    .args(["hostname \"$0\" && exec \"$@\"", h])
                    .arg(rdrun_bin());
                c
            }
            (None, Some(h)) => {
                let mut c = Command::new("unshare");
                c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", h])
                    .arg(rdrun_bin());
                c
            }
            (None, None) => Command::new(rdrun_bin()),
        };
        cmd.args(&self.args);
        // PET_* variables are flag fallbacks: one left in the test's environment would change
        // what the command line means.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PET_") {
                cmd.env_remove(k);
            }
        }
        for k in &self.env_remove {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn describe(&self) -> String {
        let mut s = String::from("rdrun");
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }

    /// Starts rdrun and returns while it runs (for signal tests).
    pub fn spawn(&self) -> Running {
        let mut child = self.command().spawn().expect("spawn rdrun");
        let stdout = reader(child.stdout.take().expect("piped"));
        let stderr = reader(child.stderr.take().expect("piped"));
        Running {
            cmd: self.describe(),
            pid: child.id() as i32,
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            deadline: Instant::now() + self.timeout,
        }
    }

    /// Runs rdrun to the end (or to the hard bound, where it is SIGKILLed and the test fails).
    pub fn run(&self) -> Output {
        self.spawn().wait()
    }

    /// Starts rdrun with stdout and stderr given by the test (a closed pipe, `/dev/full`, a pipe
    /// the test reads slowly); the [`Output`] then has empty `stdout` and `stderr`.
    pub fn spawn_with(&self, stdout: Stdio, stderr: Stdio) -> Running {
        let mut cmd = self.command();
        cmd.stdout(stdout).stderr(stderr);
        let child = cmd.spawn().expect("spawn rdrun");
        Running {
            cmd: self.describe(),
            pid: child.id() as i32,
            child,
            stdout: None,
            stderr: None,
            deadline: Instant::now() + self.timeout,
        }
    }
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// An rdrun process that is running.
#[derive(Debug)]
pub struct Running {
    cmd: String,
    pub pid: i32,
    child: Child,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    deadline: Instant,
}

impl Running {
    /// Sends `sig` to rdrun (by PID).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on the pid of our own child, which we have not reaped yet.
        unsafe {
            libc::kill(self.pid, sig);
        }
    }

    /// Waits for rdrun to exit, within the run's hard bound (SIGKILL by PID after it).
    pub fn wait(mut self) -> Output {
        let start = Instant::now();
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= self.deadline {
                timed_out = true;
                let _ = self.child.kill();
                break self.child.wait().expect("wait after kill");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Output pipes close once rdrun and its workers are gone; bound that too.
        let stdout = self.stdout.take().map(join_bounded).unwrap_or_default();
        let stderr = self.stderr.take().map(join_bounded).unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        let out = Output {
            cmd: std::mem::take(&mut self.cmd),
            code: status.code(),
            signal: status.signal(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            waited: start.elapsed(),
            timed_out,
        };
        assert!(
            !out.timed_out,
            "rdrun exceeded its hard time bound: {out:?}"
        );
        out
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that panicked mid-run must not leave rdrun behind (its watchdog and the
        // workers' parent-death signal then take the workers down).
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn join_bounded(handle: JoinHandle<Vec<u8>>) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return b"<output still open 10 s after rdrun exited>".to_vec();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    handle.join().unwrap_or_default()
}

/// What one rdrun run produced.
pub struct Output {
    pub cmd: String,
    /// Exit code (None when rdrun itself died of a signal).
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Time from the wait start to rdrun's exit.
    pub waited: Duration,
    pub timed_out: bool,
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\ncommand: {}", self.cmd)?;
        writeln!(
            f,
            "exit: code {:?}, signal {:?}, after {:?}{}",
            self.code,
            self.signal,
            self.waited,
            if self.timed_out { " (TIMED OUT)" } else { "" }
        )?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        writeln!(f, "--- stderr ---\n{}", self.stderr)
    }
}

impl Output {
    /// Asserts the exit code, showing everything when it differs.
    #[track_caller]
    pub fn assert_code(&self, code: i32) -> &Output {
        assert_eq!(self.code, Some(code), "unexpected exit: {self:?}");
        self
    }
}

/// True while `pid` exists and is not a zombie (a zombie is dead, only not yet reaped by its
/// parent, which outside rdrun may be a slow init).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].split_whitespace().next(), Some("Z" | "X")),
            None => false,
        },
        Err(_) => false,
    }
}

/// Waits until `path` exists; false after `timeout`.
pub fn wait_for_file(path: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    path.exists()
}

/// Waits until every `ready.<lr>` file of `nproc` workers exists in `dir`; panics after 30 s.
#[track_caller]
pub fn wait_ready(dir: &Path, nproc: usize) {
    for lr in 0..nproc {
        let path = dir.join(format!("ready.{lr}"));
        assert!(
            wait_for_file(&path, Duration::from_secs(30)),
            "worker {lr} never became ready ({} missing)",
            path.display()
        );
    }
}

/// Reads a pid file written by a fixture.
#[track_caller]
pub fn read_pid(path: &Path) -> i32 {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad pid {text:?} in {}", path.display()))
}

/// The worker and grandchild pids (`pid.<lr>`, `gpid.<lr>`) fixtures wrote in `dir`.
pub fn fixture_pids(dir: &Path, nproc: usize) -> Vec<i32> {
    let mut pids = Vec::new();
    for lr in 0..nproc {
        for prefix in ["pid", "gpid"] {
            let path = dir.join(format!("{prefix}.{lr}"));
            if path.exists() {
                pids.push(read_pid(&path));
            }
        }
    }
    pids
}

/// Asserts that none of `pids` is alive, allowing `grace` for them to go; SIGKILLs survivors
/// (by PID) so that a failing test still cleans up.
#[track_caller]
pub fn assert_no_leak(pids: &[i32], grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for &pid in &left {
                // SAFETY: plain kill(2) of a pid a fixture of this test reported.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            panic!("processes left behind: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `KEY=VALUE` pairs of an `env -0` dump.
pub fn parse_env0(text: &str) -> std::collections::BTreeMap<String, String> {
    text.split('\0')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A loopback port that was free a moment ago (for `--master-port` tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// The torch venv's python (`scripts/torch-venv.sh` caches it), or `None` after a SKIP line.
pub fn torch_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/python");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: no torch venv (scripts/torch-venv.sh makes it)");
        None
    }
}

/// A script of the PyTorch suite (`launcher-tests/torch/scripts/<name>`).
pub fn torch_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launcher-tests/torch/scripts")
        .join(name)
}

/// Runs `cmd` with `input` written to its stdin (then closed), stdout and stderr captured; a
/// run past `bound` is SIGKILLed (by its pid, not yet reaped) and the test fails.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8], bound: Duration) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdrun");
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).expect("write stdin");
    drop(stdin);
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let deadline = Instant::now() + bound;
    while !waiter.is_finished() {
        if Instant::now() >= deadline {
            // SAFETY: kill(2) of the process this test started (not yet reaped: the waiter runs).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("rdrun did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().expect("join").expect("output")
}

/// Checks the burst pattern the line-integrity tests print: each rank R writes `lines` lines
/// `rank<R>-<i>-xxx…` of 9000 + i bytes. Every line must arrive whole (neither split nor merged
/// with another rank's) and each rank's lines in order.
pub fn assert_burst_lines_whole(stdout: &str, ranks: usize, lines: usize) {
    let mut next = vec![0usize; ranks];
    for line in stdout.lines() {
        let rest = line
            .strip_prefix("rank")
            .unwrap_or_else(|| panic!("mangled: {line:.60}"));
        let mut parts = rest.splitn(3, '-');
        let rank: usize = parts.next().and_then(|p| p.parse().ok()).expect("rank");
        let i: usize = parts.next().and_then(|p| p.parse().ok()).expect("index");
        assert_eq!(i, next[rank], "rank {rank} out of order");
        assert_eq!(line.len(), 9000 + i, "rank {rank} line {i} split or merged");
        next[rank] += 1;
    }
    assert_eq!(next, vec![lines; ranks]);
}
