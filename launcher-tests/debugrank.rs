//! `--debug-rank R` (issue 29) with the real binary: without debugpy (hidden from the worker's
//! interpreter by a `debugpy` module that fails to import) the rank starts normally, rdrun
//! prints how to attach py-spy or gdb to its pid, and the rank reads rdrun's stdin; with
//! debugpy (the PyTorch venv, `scripts/torch-venv.sh`) the rank waits for a client on the port
//! rdrun names and runs once a real DAP handshake (initialize, attach, configurationDone) is
//! done, and a run whose debug rank still waits ends cleanly on SIGTERM (nothing left of the
//! rank or debugpy's adapter); the hang detector does not count the debug rank's pause, while
//! the other ranks' quiet still is a hang.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{rdrun_bin, torch_python, Rdrun, TempDir};

const BOUND: Duration = Duration::from_secs(90);

/// Rank 1 prints its pid and what it read from stdin, then writes `done`; rank 0 waits for
/// `done` (bounded) so that both are alive together.
const SCRIPT: &str = r#"
import os, sys, time
rank = int(os.environ["RANK"])
done = os.path.join(os.path.dirname(os.path.abspath(__file__)), "done")
if rank == 1:
    data = sys.stdin.read()
    print(f"rank 1 pid {os.getpid()} read {data!r}", flush=True)
    open(done, "w").close()
else:
    data = sys.stdin.read()
    print(f"rank 0 read {data!r}", flush=True)
    deadline = time.time() + 80
    while not os.path.exists(done) and time.time() < deadline:
        time.sleep(0.05)
    print("rank 0 done", flush=True)
"#;

/// Waits (bounded) until `path` holds a line starting with `prefix`; returns that line.
fn wait_line(path: &Path, prefix: &str) -> String {
    let deadline = Instant::now() + BOUND;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with(prefix)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no line {prefix:?} in {}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// rdrun with stdout and stderr to files in `dir` (read while it runs).
fn spawn_to_files(run: Rdrun, dir: &TempDir) -> (crate::util::Running, PathBuf, PathBuf) {
    let (out, err) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    let running = run.spawn_with(
        Stdio::from(File::create(&out).expect("stdout file")),
        Stdio::from(File::create(&err).expect("stderr file")),
    );
    (running, out, err)
}

/// The pids of every process in session `sid` (a worker is its session's leader).
fn session_members(sid: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state ppid pgrp session ...
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        if fields.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(sid) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn without_debugpy_the_rank_runs_and_rdrun_says_how_to_attach() {
    let dir = TempDir::new("debug_rank_hint");
    let script = dir.join("ranks.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    // A `debugpy` module first on the path that cannot be imported: debugpy is "absent"
    // whatever this machine's interpreter has installed.
    let shadow = dir.join("shadow");
    std::fs::create_dir(&shadow).expect("mkdir");
    std::fs::write(
        shadow.join("debugpy.py"),
        "raise ImportError('hidden by the test')\n",
    )
    .expect("write shadow");
    let out = crate::util::output_with_stdin(
        Command::new(rdrun_bin())
            .args(["--standalone", "--nproc-per-node", "2", "--debug-rank", "1"])
            .arg(&script)
            .env_remove("PYTHON_EXEC")
            .env("PYTHONPATH", &shadow),
        b"hello\n",
        BOUND,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // The debug rank got the terminal's stdin (as --stdin 1), the other /dev/null.
    let line = stdout
        .lines()
        .find(|l| l.starts_with("rank 1 pid "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.ends_with("read 'hello\\n'"), "{line}");
    assert!(stdout.lines().any(|l| l == "rank 0 read ''"), "{stdout}");
    let worker_pid: i32 = line
        .trim_start_matches("rank 1 pid ")
        .split(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    let hint: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rdrun: rank 1 "))
        .collect();
    assert_eq!(hint.len(), 1, "one line: {stderr}");
    assert!(
        hint[0].starts_with(&format!(
            "rdrun: rank 1 (pid {worker_pid}) runs without a debugger (debugpy is not importable by "
        )) && hint[0].ends_with(&format!(
            "(pip install debugpy)); to look inside it: py-spy dump --pid {worker_pid}, or gdb -p {worker_pid}"
        )),
        "{}",
        hint[0]
    );
}

/// One DAP message: `Content-Length` framing around JSON.
fn dap_send(s: &mut TcpStream, msg: &serde_json::Value) {
    let body = msg.to_string();
    write!(s, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("send");
}

fn dap_recv(s: &mut TcpStream, buf: &mut Vec<u8>) -> serde_json::Value {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_string();
            let n: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("Content-Length");
            if buf.len() >= i + 4 + n {
                let v = serde_json::from_slice(&buf[i + 4..i + 4 + n]).expect("json");
                buf.drain(..i + 4 + n);
                return v;
            }
        }
        let mut chunk = [0u8; 65536];
        let k = s.read(&mut chunk).expect("read from debugpy");
        assert!(k > 0, "debugpy closed the connection");
        buf.extend_from_slice(&chunk[..k]);
    }
}

/// Starts 2 ranks with `--debug-rank 1` under the venv's python; returns rdrun, its output
/// files, the debug rank's pid, the port it listens on and a connection to it.
fn start_debugpy_run(
    dir: &TempDir,
    python: &Path,
) -> (crate::util::Running, PathBuf, i32, u16, TcpStream) {
    let script = dir.join("ranks.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let run = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "2", "--debug-rank", "1"])
        .args(["--stdin", "none"])
        .env("PYTHON_EXEC", python)
        .timeout(BOUND)
        .arg(&script);
    let (running, out, err) = spawn_to_files(run, dir);
    let line = wait_line(&err, "rdrun: rank 1 ");
    // rdrun: rank 1 (pid P) waits for a debugger: attach debugpy to 127.0.0.1:PORT (...)
    let pid: i32 = line
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let port: u16 = line
        .split("attach debugpy to 127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // The first connection is debugpy's client (it serves one): kept for the handshake.
    let deadline = Instant::now() + BOUND;
    let conn = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => break c,
            Err(e) => assert!(
                Instant::now() < deadline,
                "nothing listens on port {port}: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (running, out, pid, port, conn)
}

#[test]
fn with_debugpy_the_rank_waits_for_a_client_and_runs_after_the_handshake() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("debug_rank_dap");
    let (running, out, _pid, _port, mut s) = start_debugpy_run(&dir, &python);
    // Rank 0 runs; the debug rank has not started the script.
    wait_line(&out, "rank 0 read ''");
    assert!(
        !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("rank 1 pid"),
        "the debug rank ran before a debugger attached"
    );
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut buf = Vec::new();
    dap_send(
        &mut s,
        &serde_json::json!({"seq": 1, "type": "request", "command": "initialize",
            "arguments": {"adapterID": "debugpy", "clientID": "rdrun-test"}}),
    );
    dap_send(
        &mut s,
        &serde_json::json!({"seq": 2, "type": "request", "command": "attach",
            "arguments": {"name": "rdrun test", "type": "debugpy", "request": "attach",
                          "justMyCode": false}}),
    );
    let mut initialized = false;
    let attached = loop {
        let m = dap_recv(&mut s, &mut buf);
        if m["type"] == "event" && m["event"] == "initialized" && !initialized {
            initialized = true;
            dap_send(
                &mut s,
                &serde_json::json!({"seq": 3, "type": "request",
                    "command": "configurationDone", "arguments": {}}),
            );
        }
        if m["type"] == "response" && m["command"] == "initialize" {
            assert_eq!(m["success"], true, "{m}");
        }
        if m["type"] == "response" && m["command"] == "attach" {
            break m;
        }
    };
    assert_eq!(attached["success"], true, "{attached}");
    assert!(initialized);
    let res = running.wait();
    res.assert_code(0);
    let stdout = std::fs::read_to_string(&out).expect("stdout");
    assert!(
        stdout.lines().any(|l| l.starts_with("rank 1 pid ")),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l == "rank 0 done"), "{stdout}");
}

#[test]
fn a_run_whose_debug_rank_waits_ends_cleanly_on_sigterm() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("debug_rank_term");
    let (running, _out, pid, port, conn) = start_debugpy_run(&dir, &python);
    // The rank's session, and debugpy's adapter: it detaches itself (a session of its own)
    // and ends once its debuggee is gone.
    let members = session_members(pid);
    assert!(members.contains(&pid), "{members:?}");
    let adapters = adapter_pids(port);
    assert!(
        !adapters.is_empty(),
        "debugpy's adapter for port {port} not found"
    );
    running.signal(libc::SIGTERM);
    let res = running.wait();
    assert!(
        res.code.is_some_and(|c| c != 0),
        "a stopped run is no success: {res:?}"
    );
    drop(conn);
    let all: Vec<i32> = members.iter().chain(&adapters).copied().collect();
    crate::util::assert_no_leak(&all, Duration::from_secs(15));
    assert!(
        session_members(pid).is_empty(),
        "left: {:?}",
        session_members(pid)
    );
}

/// The debug rank (1) pauses while rank 0 has finished: no hang with `--debug-rank 1` (the
/// same run without it is an exit-skew hang); with `--debug-rank 1` a quiet rank 0 is still a
/// hang.
#[test]
fn the_debug_ranks_pause_is_no_hang_the_others_quiet_still_is() {
    let run = |debug: bool, script: &str| {
        let mut r = Rdrun::new()
            .args(["--standalone", "--nproc-per-node", "2"])
            .args(["--hang-timeout", "2", "--hang-startup-timeout", "2"])
            .args(["--hang-poll-interval", "0.25"])
            .env_remove("RDRUN_HANG_DETECT")
            .env_remove("RDRUN_HANG_TIMEOUT")
            .env_remove("RDRUN_HANG_STARTUP_TIMEOUT")
            .env_remove("RDRUN_HANG_POLL_INTERVAL")
            .env_remove("RDRUN_PY_SPY")
            .timeout(BOUND);
        if debug {
            r = r.args(["--debug-rank", "1"]);
        }
        r.args(["--no-python", "sh", "-c", script]).run()
    };
    // Rank 0 prints and exits 0; rank 1 pauses 6 s (3 budgets) without a sign of life.
    let pause =
        r#"if [ "$RANK" = 1 ]; then sleep 6; echo "rank 1 resumed"; else echo "rank 0 ok"; fi"#;
    let out = run(true, pause);
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
    assert!(out.stdout.contains("rank 1 resumed"), "{out:?}");
    // A shell command is no Python launch: the hint line, not debugpy.
    assert!(
        out.stderr
            .contains("runs without a debugger (the command is not a Python launch)"),
        "{out:?}"
    );
    let control = run(false, pause);
    assert!(
        control.stderr.contains("HANG") && control.code != Some(0),
        "without --debug-rank the pause is a hang: {control:?}"
    );
    // Rank 0 goes quiet for good: that is still a hang.
    let quiet = r#"echo "rank $RANK up"; exec sleep 300"#;
    let out = run(true, quiet);
    assert!(
        out.stderr.contains("HANG") && out.code != Some(0),
        "{out:?}"
    );
}

/// debugpy's adapter processes serving `port` (`.../debugpy/adapter ... --port PORT ...`).
fn adapter_pids(port: u16) -> Vec<i32> {
    let want = format!("--port\0{port}\0");
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("debugpy/adapter") && cmd.contains(&want) {
            pids.push(pid);
        }
    }
    pids
}
