//! Worker output through the library API with real worker processes: no lost last line when a
//! worker is SIGKILLed, tee/redirect files in the `attempt_<n>` tree, rank filter, and no
//! mid-line interleaving between processes that write long lines in small pieces.
//!
//! These drive `rdrun::supervisor::output` directly with an in-memory console, so they check
//! byte-exact console output; the binary-level tests live with the supervisor.

use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdrun::config::{LogConfig, StdSelect, StdSpec};
use rdrun::supervisor::output::{
    forward_to, Console, OutputSummary, RankIdentity, RankSink, RunLogs,
};

/// Hard bound for any one wait in these tests.
const BOUND: Duration = Duration::from_secs(120);

pub struct Scratch(pub PathBuf);
impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rdrun-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An in-memory console stream.
#[derive(Clone, Default)]
pub struct Buf(Arc<Mutex<Vec<u8>>>);
impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Buf {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

pub fn console() -> (Console, Buf, Buf) {
    let (out, err) = (Buf::default(), Buf::default());
    let c = Console::new(Box::new(out.clone()), Box::new(err.clone())).expect("console");
    (c, out, err)
}

pub fn ident(local_rank: usize) -> RankIdentity {
    RankIdentity {
        role: "default".into(),
        rank: local_rank,
        local_rank,
        hostname: "host".into(),
    }
}

/// A child process killed (by PID) when dropped, so that a failing test leaves nothing behind.
pub struct Worker(pub Child);
impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `program args` with piped stdout/stderr and extra env; returns it and the read ends.
pub fn spawn(program: &str, args: &[&str], env: &[(&str, &str)]) -> (Worker, OwnedFd, OwnedFd) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn worker");
    let out = OwnedFd::from(child.stdout.take().expect("stdout"));
    let err = OwnedFd::from(child.stderr.take().expect("stderr"));
    (Worker(child), out, err)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Forwards each (worker, sink) pair and waits for all of them, bounded.
pub fn forward_all(
    console: &Console,
    workers: Vec<(RankIdentity, RankSink, OwnedFd, OwnedFd)>,
) -> Vec<OutputSummary> {
    runtime().block_on(async {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|(id, sink, o, e)| forward_to(console.clone(), id, sink, o, e, None))
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(
                tokio::time::timeout(BOUND, h)
                    .await
                    .expect("forwarding ended in time")
                    .expect("forward task"),
            );
        }
        out
    })
}

fn plain_sink() -> RankSink {
    RankSink {
        stdout_console: true,
        stderr_console: true,
        prefix: Some("[default0]:".into()),
        ..RankSink::default()
    }
}

#[test]
fn sigkilled_worker_loses_no_line() {
    let s = Scratch::new("kill");
    let file = s.0.join("stdout.log");
    fs::File::create(&file).expect("create");
    let (c, out, err) = console();
    let (mut w, o, e) = spawn(
        "sh",
        &[
            "-c",
            "printf 'one\\ntwo\\nthr'; printf 'last words' >&2; kill -9 $$",
        ],
        &[],
    );
    let sink = RankSink {
        stdout_file: Some(file.clone()),
        ..plain_sink()
    };
    let summary = forward_all(&c, vec![(ident(0), sink, o, e)]);
    let status = w.0.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert_eq!(
        out.text(),
        "[default0]:one\n[default0]:two\n[default0]:thr\n"
    );
    assert_eq!(err.text(), "last words\n");
    assert_eq!(fs::read(&file).expect("read"), b"one\ntwo\nthr");
    assert_eq!(summary[0].stderr_tail, vec!["last words"]);
}

fn list(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).expect("prefix").display().to_string();
            if p.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn attempt_tree_tee_redirect_and_filter() {
    let s = Scratch::new("tree");
    let log = LogConfig {
        log_dir: Some(s.0.clone()),
        // -t 0:3,1:3 -r 2:1 --local-ranks-filter 0,2
        tee: StdSpec {
            all: StdSelect::None,
            per_rank: [(0, StdSelect::All), (1, StdSelect::All)].into(),
        },
        redirects: StdSpec {
            all: StdSelect::None,
            per_rank: [(2, StdSelect::Out)].into(),
        },
        local_ranks_filter: Some(vec![0, 2]),
        prefix_template: Some("[${rank}|${hostname}]".into()),
        duplicate_stdout_filters: vec!["keep".into()],
        ..LogConfig::default()
    };
    let mut logs = RunLogs::new(&log, "job");
    let ids: Vec<RankIdentity> = (0..3).map(ident).collect();
    let (c, out, err) = console();
    for attempt in 0..2u32 {
        let a = logs.attempt(attempt, &ids).expect("attempt");
        let mut children = Vec::new();
        let workers = a
            .ranks
            .iter()
            .zip(&ids)
            .map(|(r, id)| {
                let script = format!(
                    "echo out{lr}-a{attempt}; echo keep{lr}; echo err{lr} >&2",
                    lr = id.local_rank
                );
                let (w, o, e) = spawn("sh", &["-c", &script], &[]);
                children.push(w);
                (id.clone(), r.sink.clone(), o, e)
            })
            .collect();
        forward_all(&c, workers);
        for mut w in children {
            assert!(w.0.wait().expect("wait").success());
        }
    }
    let run_dir = logs.run_dir().expect("run dir").to_path_buf();
    logs.finish();
    let name = run_dir
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("job_") && name.len() == 12, "{name}");
    let mut want: Vec<String> = Vec::new();
    for a in 0..2 {
        want.extend([
            format!("attempt_{a}/"),
            format!("attempt_{a}/filtered_stdout.log"),
            format!("attempt_{a}/0/"),
            format!("attempt_{a}/0/stdout.log"),
            format!("attempt_{a}/0/stderr.log"),
            format!("attempt_{a}/1/"),
            format!("attempt_{a}/1/stdout.log"),
            format!("attempt_{a}/1/stderr.log"),
            format!("attempt_{a}/2/"),
            format!("attempt_{a}/2/stdout.log"),
        ]);
    }
    want.sort();
    assert_eq!(list(&run_dir), want);
    let read = |p: &str| fs::read_to_string(run_dir.join(p)).expect("read");
    assert_eq!(read("attempt_1/1/stdout.log"), "out1-a1\nkeep1\n");
    assert_eq!(read("attempt_1/1/stderr.log"), "err1\n");
    assert_eq!(read("attempt_0/2/stdout.log"), "out2-a0\nkeep2\n");
    // Only rank 0 is tee'd and visible; rank 1 is filtered out; rank 2's stdout is redirected.
    assert_eq!(read("attempt_0/filtered_stdout.log"), "[0|host]keep0\n");
    let stdout = out.text();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "[0|host]keep0",
            "[0|host]keep0",
            "[0|host]out0-a0",
            "[0|host]out0-a1"
        ]
    );
    let stderr = err.text();
    let mut lines: Vec<&str> = stderr.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["[0|host]err0", "[0|host]err0", "err2", "err2"]);
}

#[test]
fn processes_never_interleave_mid_line() {
    const RANKS: usize = 4;
    const LINES: usize = 300;
    let (c, out, _) = console();
    let mut children = Vec::new();
    let awk = format!(
        "BEGIN {{ x = \"x\"; while (length(x) < 10000) x = x x; \
         for (i = 0; i < {LINES}; i++) {{ s = sprintf(\"rank%d-%d-\", R, i); \
         print s substr(x, 1, 9000 + i - length(s)) }} }}"
    );
    let workers = (0..RANKS)
        .map(|r| {
            let (w, o, e) = spawn("awk", &["-v", &format!("R={r}"), &awk], &[]);
            children.push(w);
            let sink = RankSink {
                prefix: Some(format!("[default{r}]:")),
                ..plain_sink()
            };
            (ident(r), sink, o, e)
        })
        .collect();
    forward_all(&c, workers);
    for mut w in children {
        assert!(w.0.wait().expect("wait").success());
    }
    let text = out.text();
    crate::util::assert_burst_lines_whole(&text, RANKS, LINES);
}

// ---------------------------------------------------------------------------------------------
// Through the real binary (needs the supervisor).

/// What one bounded run of the rdrun binary produced.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the rdrun binary with `args` and extra `env`, SIGKILLing it (by PID) after [`BOUND`].
pub fn rdrun(args: &[&str], env: &[(&str, &str)]) -> Run {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for k in [
        "TORCHELASTIC_ERROR_FILE",
        "RUST_LOG",
        "LOGLEVEL",
        "OMP_NUM_THREADS",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = Worker(cmd.spawn().expect("spawn rdrun"));
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let out = read(Box::new(child.0.stdout.take().expect("stdout")));
    let err = read(Box::new(child.0.stderr.take().expect("stderr")));
    let deadline = std::time::Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rdrun {args:?} ran past {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code(),
        signal: status.signal(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

fn sorted_lines(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text.lines().collect();
    v.sort();
    v
}

/// rdrun's own log lines (tracing) are not worker output.
fn worker_lines(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("WARN") && !l.contains("INFO") && !l.contains("ERROR"))
        .collect();
    v.sort();
    v
}

#[test]
fn cli_tee_prefix_rank_filter_and_files() {
    let s = Scratch::new("cli-tee");
    let dir = s.0.to_string_lossy().into_owned();
    let script = "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2";
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=3",
            "--tee=3",
            "--local-ranks-filter=0,2",
            "--log-dir",
            &dir,
            "--no-python",
            "sh",
            "-c",
            script,
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(
        sorted_lines(&r.stdout),
        vec!["[default0]:out0", "[default2]:out2"],
        "{r:?}"
    );
    assert_eq!(
        worker_lines(&r.stderr),
        vec!["[default0]:err0", "[default2]:err2"],
        "{r:?}"
    );
    let runs: Vec<_> = fs::read_dir(&s.0).expect("log dir").flatten().collect();
    assert_eq!(runs.len(), 1, "one run directory");
    let run_dir = runs[0].path();
    // Rank 1 is filtered from the console, not from its files.
    let read = |p: &str| fs::read_to_string(run_dir.join(p)).expect(p);
    assert_eq!(read("attempt_0/1/stdout.log"), "out1\n");
    assert_eq!(read("attempt_0/1/stderr.log"), "err1\n");
    assert_eq!(read("attempt_0/0/stdout.log"), "out0\n");
}

#[test]
fn cli_prefix_template_and_plain_console() {
    let s = Scratch::new("cli-template");
    let tmp = s.0.to_string_lossy().into_owned();
    let script = "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2";
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--tee=1",
            "--log-line-prefix-template=[${rank}|${role_name}]",
            "--no-python",
            "sh",
            "-c",
            script,
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    // stdout tee'd with the template; stderr not tee'd: unprefixed.
    assert_eq!(
        sorted_lines(&r.stdout),
        vec!["[0|default]out0", "[1|default]out1"],
        "{r:?}"
    );
    assert_eq!(worker_lines(&r.stderr), vec!["err0", "err1"], "{r:?}");
    // Tee'd logs without --log-dir repeat the console: nothing is left behind.
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
}

#[test]
fn cli_no_lost_last_line_when_worker_is_killed() {
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=1",
            "--no-python",
            "sh",
            "-c",
            "printf 'first\\nlast words'; kill -9 $$",
        ],
        &[],
    );
    assert_eq!(r.stdout, "first\nlast words\n", "{r:?}");
    assert_eq!((r.code, r.signal), (Some(128 + 9), None), "{r:?}");
}

#[test]
fn cli_no_temp_dir_left_and_dev_null() {
    let s = Scratch::new("cli-tmp");
    let tmp = s.0.to_string_lossy().into_owned();
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--no-python",
            "sh",
            "-c",
            "test -d \"$(dirname \"$TORCHELASTIC_ERROR_FILE\")\" && echo ok$LOCAL_RANK",
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(sorted_lines(&r.stdout), vec!["ok0", "ok1"], "{r:?}");
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
    // --log-dir /dev/null: empty error file, tee ignored (plain console).
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=1",
            "--log-dir=/dev/null",
            "--tee=3",
            "--no-python",
            "sh",
            "-c",
            "echo \"ef=[$TORCHELASTIC_ERROR_FILE]\"",
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(r.stdout, "ef=[]\n", "{r:?}");
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
}

#[test]
fn cli_ranks_never_interleave_mid_line() {
    ranks_never_interleave(&[]);
}

/// The same through the collapse stage (issue 29; every line is one rank's).
#[test]
fn cli_ranks_never_interleave_mid_line_under_collapse() {
    ranks_never_interleave(&["--output", "collapse"]);
}

fn ranks_never_interleave(extra: &[&str]) {
    const LINES: usize = 200;
    let awk = format!(
        "BEGIN {{ x = \"x\"; while (length(x) < 10000) x = x x; \
         for (i = 0; i < {LINES}; i++) {{ s = sprintf(\"rank%d-%d-\", ENVIRON[\"LOCAL_RANK\"], i); \
         print s substr(x, 1, 9000 + i - length(s)) }} }}"
    );
    let mut args = vec!["--standalone", "--nproc_per_node=4"];
    args.extend_from_slice(extra);
    args.extend(["--no-python", "awk", &awk]);
    let r = rdrun(&args, &[]);
    assert_eq!(r.code, Some(0), "{:?}", r.stderr);
    crate::util::assert_burst_lines_whole(&r.stdout, 4, LINES);
}

// ---------------------------------------------------------------------------------------------
// Prompts through a pseudo-terminal, and a console that is a closed pipe.

/// rdrun running on a pseudo-terminal (stdin, stdout and stderr), echo and output processing
/// off so that the master side reads exactly what rdrun wrote.
struct PtyRun {
    child: Worker,
    master: fs::File,
    seen: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PtyRun {
    fn start(args: &[&str]) -> PtyRun {
        use nix::sys::termios::{self, LocalFlags, OutputFlags, SetArg};
        use std::io::Read;
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let mut t = termios::tcgetattr(&pty.slave).expect("tcgetattr");
        t.local_flags.remove(LocalFlags::ECHO);
        t.output_flags.remove(OutputFlags::OPOST);
        termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t).expect("tcsetattr");
        let slave = fs::File::from(pty.slave);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
        cmd.args(args)
            .stdin(slave.try_clone().expect("dup"))
            .stdout(slave.try_clone().expect("dup"))
            .stderr(slave);
        for k in [
            "TORCHELASTIC_ERROR_FILE",
            "RUST_LOG",
            "LOGLEVEL",
            "PYTHONBREAKPOINT",
        ] {
            cmd.env_remove(k);
        }
        let child = Worker(cmd.spawn().expect("spawn rdrun"));
        drop(cmd); // our copies of the slave side: EOF/EIO on the master once rdrun is gone
        let master = fs::File::from(pty.master);
        let mut rd = master.try_clone().expect("dup");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            // EIO once every slave fd is closed.
            while let Ok(n) = rd.read(&mut b) {
                if n == 0 {
                    break;
                }
                s.lock().expect("lock").extend_from_slice(&b[..n]);
            }
        });
        PtyRun {
            child,
            master,
            seen,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("lock")).into_owned()
    }

    /// Waits (bounded) until the terminal shows `want`.
    fn wait_for(&self, want: &str) {
        let deadline = std::time::Instant::now() + BOUND;
        while !self.text().contains(want) {
            assert!(
                std::time::Instant::now() < deadline,
                "terminal never showed {want:?}; it shows {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn type_line(&mut self, line: &str) {
        self.master
            .write_all(line.as_bytes())
            .expect("write to pty");
    }

    /// Waits (bounded) for rdrun to exit; returns its exit code and everything it wrote.
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = std::time::Instant::now() + BOUND;
        let status = loop {
            if let Some(s) = self.child.0.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "rdrun ran past {BOUND:?}: {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(r) = self.reader.take() {
            r.join().expect("pty reader");
        }
        (status.code(), self.text())
    }
}

#[test]
fn prompt_without_newline_reaches_the_terminal_before_input() {
    let mut run = PtyRun::start(&[
        "--standalone",
        "--nproc_per_node=1",
        "--no-python",
        "sh",
        "-c",
        "echo ready; printf 'Name? '; read name; echo \"hello $name\"",
    ]);
    // No input sent yet: the prompt must be on the terminal already.
    run.wait_for("ready\nName? ");
    run.type_line("bob\n");
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text:?}");
    // The rest of the line continues the prompt, as on a terminal.
    assert!(text.contains("ready\nName? hello bob\n"), "{text:?}");
}

#[test]
fn breakpoint_prompt_through_a_pty() {
    if !have_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let mut run = PtyRun::start(&[
        "--standalone",
        "--nproc_per_node=1",
        "--tee=3",
        "--no-python",
        "python3",
        "-c",
        "x = 41\nbreakpoint()\nprint('after', x)",
    ]);
    // Tee'd: the prompt starts a prefixed line and waits there for input.
    run.wait_for("[default0]:(Pdb) ");
    run.type_line("p x + 1\n");
    // The answer continues the prompt's line as the worker wrote it (unprefixed: on a terminal
    // the user's echoed input and Enter come in between); the next prompt starts a new line.
    run.wait_for("[default0]:(Pdb) 42\n[default0]:(Pdb) ");
    run.type_line("c\n");
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text:?}");
    assert!(text.ends_with("[default0]:(Pdb) after 41\n"), "{text:?}");
}

fn have_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("pass")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `rdrun … | head -1`: reads one line of rdrun's stdout, closes it, and returns rdrun's exit
/// code and stderr.
fn head_one(script: &str) -> (String, Option<i32>, String) {
    use std::io::{BufRead, BufReader, Read};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
    cmd.args([
        "--standalone",
        "--nproc_per_node=1",
        "--no-python",
        "sh",
        "-c",
        script,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for k in ["TORCHELASTIC_ERROR_FILE", "RUST_LOG", "LOGLEVEL"] {
        cmd.env_remove(k);
    }
    let mut child = Worker(cmd.spawn().expect("spawn rdrun"));
    let mut stderr = child.0.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read a line");
    // The BufReader is dropped: rdrun's stdout is now a closed pipe.
    let deadline = std::time::Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rdrun | head -1 did not end"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    (first, status.code(), err.join().expect("stderr reader"))
}

#[test]
fn head_one_ends_the_pipeline_with_the_workers_status() {
    // A worker that keeps writing dies of SIGPIPE, as under torchrun: rdrun exits 128+13.
    let (first, code, stderr) = head_one("i=0; while :; do echo line$i; i=$((i+1)); done");
    assert_eq!(first, "line0\n");
    assert_eq!(code, Some(128 + libc::SIGPIPE), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("SIGPIPE"), "{stderr}");
    // A worker that ignores SIGPIPE sees EPIPE and exits as it chooses: rdrun exits with that.
    let (first, code, stderr) = head_one("trap '' PIPE; while echo more; do :; done; exit 7");
    assert_eq!(first, "more\n");
    assert_eq!(code, Some(7), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn full_console_drops_output_and_keeps_the_status() {
    use std::io::Read;
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full");
        return;
    }
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let sync = std::env::temp_dir().join(format!("rdrun-full-console-{}", std::process::id()));
    fs::create_dir_all(&sync).expect("sync dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
    cmd.args([
        "--standalone",
        "--nproc_per_node=2",
        "--no-python",
        "sh",
        "-c",
        // Each rank exits only once both have written their stderr line: otherwise the first
        // exit makes rdrun stop the other before its line exists (a race, not the behaviour
        // under test). The wait is bounded (about 30 s), so a broken run still ends.
        "for i in 1 2 3; do echo out$i; done; echo err$LOCAL_RANK >&2; : > \"$SYNC/done$LOCAL_RANK\"; \
         n=0; while [ ! -e \"$SYNC/done0\" ] || [ ! -e \"$SYNC/done1\" ]; do \
         n=$((n+1)); [ $n -gt 3000 ] && break; sleep 0.01; done; exit 3",
    ])
    .env("SYNC", &sync)
    .stdin(Stdio::null())
    .stdout(full)
    .stderr(Stdio::piped());
    for k in ["TORCHELASTIC_ERROR_FILE", "RUST_LOG", "LOGLEVEL"] {
        cmd.env_remove(k);
    }
    let mut child = Worker(cmd.spawn().expect("spawn rdrun"));
    let mut stderr = child.0.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rdrun >/dev/full hung"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = err.join().expect("stderr reader");
    let _ = fs::remove_dir_all(&sync);
    // The workers' real status, their stderr still on the console, one warning, no panic.
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("err0") && stderr.contains("err1"),
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("cannot write worker output to rdrun's console")
            .count(),
        1,
        "{stderr}"
    );
}
