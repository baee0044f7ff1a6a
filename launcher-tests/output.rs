//! Worker output with real worker processes.
//!
//! This file: the shared helpers (an in-memory console, scratch directories, workers killed on
//! drop, `rdrun` as one bounded run of the binary, also used by `report`) and the library API:
//! these drive `rdrun::supervisor::output` directly with an in-memory console, so they check
//! byte-exact console output: no lost last line when a worker is SIGKILLed, tee/redirect files
//! in the `attempt_<n>` tree, rank filter, and no mid-line interleaving between processes that
//! write long lines in small pieces. The children:
//! - `cli`: the same through the real binary: `--tee`, prefixes and templates, rank filters,
//!   log files, no temp dir left, whole lines (also under `--output collapse`).
//! - `terminal`: the console rdrun writes to: prompts through a pseudo-terminal (a shell `read`,
//!   pdb), a closed pipe (`| head -1`), a full device.

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

mod cli;
mod terminal;

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
    let mut logs = RunLogs::new(&log, "job", std::env::temp_dir());
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
    let mut cmd = Command::new(crate::util::rdrun_bin());
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
