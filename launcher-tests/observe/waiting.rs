//! rdrun is never silent while it waits (issue 12): static node 0 waiting for node 1 names who
//! is missing and the time left, in logs and as one status line on a pseudo-terminal; a lone
//! c10d agent gives the count, health says `rendezvous`, and SIGTERM is recorded in `run_end`; a
//! node waiting for the store says so, and a finished node in the exit barrier says that it
//! waits for the other nodes (health `succeeded`) until they finish.

use std::fs;
use std::io::Read;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{free_port, TempDir};

use super::{parse_lines, strings, wait_http, Live, BOUND};

/// Static node 0 of 2 waits for node 1: the status line names who is missing and the time
/// left; the health endpoint says `rendezvous`; node 1 comes, the job runs.
fn wait_for_nodes(tty: bool) {
    let dir = TempDir::new(if tty { "obs_wait_tty" } else { "obs_wait" });
    let port = free_port();
    let hport = free_port();
    let node = |rank: usize| {
        strings(&[
            "--nnodes=2",
            &format!("--node-rank={rank}"),
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            &format!("--master-port={port}"),
            "--events",
            dir.join(format!("events.{rank}.jsonl")).to_str().unwrap(),
            "--no-python",
            "true",
        ])
    };
    let env = [
        ("RDRUN_STATUS_INTERVAL", "0.3".to_string()),
        ("TORCHELASTIC_HEALTH_CHECK_PORT", hport.to_string()),
    ];
    let want = "waiting for nodes (round 0): 1 of 2 joined, missing: node rank 1;";
    let text0 = if tty {
        let pty = PtyRun::start(&node(0), &env);
        pty.wait_for(want);
        assert_eq!(wait_http(hport, "/", 503), "rendezvous\n");
        // A single line redrawn in place: the text repeats without a newline between.
        pty.wait_for_redraws(want, 2);
        let n1 = Live::start(&node(1), &[], dir.join("n1.log"));
        let (code, text) = pty.finish();
        assert_eq!(code, Some(0), "{text:?}");
        assert_eq!(n1.finish().0, Some(0));
        // The plain form is not used on a terminal.
        assert!(!text.contains(&format!("rdrun: {want}")), "{text:?}");
        text
    } else {
        let n0 = Live::start(&node(0), &env, dir.join("n0.log"));
        n0.wait_for_text(&format!("rdrun: {want}"));
        assert_eq!(wait_http(hport, "/", 503), "rendezvous\n");
        let n1 = Live::start(&node(1), &[], dir.join("n1.log"));
        let (code, text) = n0.finish();
        assert_eq!(code, Some(0), "{text}");
        assert_eq!(n1.finish().0, Some(0));
        // Plain lines, every interval, each on its own line with the time left.
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(want)).collect();
        assert!(!lines.is_empty(), "{text}");
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with("rdrun: ") && l.contains("s left")),
            "{text}"
        );
        text
    };
    assert!(!text0.contains("panicked"), "{text0}");
    // The rendezvous events: start, then complete with both members and a duration.
    let ev = parse_lines(&fs::read_to_string(dir.join("events.0.jsonl")).unwrap());
    let names: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    let start = names
        .iter()
        .position(|n| *n == "rendezvous_start")
        .expect("start");
    let done = names
        .iter()
        .position(|n| *n == "rendezvous_complete")
        .expect("complete");
    assert!(start < done, "{names:?}");
    let c = &ev[done];
    assert_eq!(c["round"], 0);
    assert_eq!(c["group_world_size"], 2);
    assert_eq!(c["members"].as_array().map(Vec::len), Some(2), "{c}");
    assert_eq!(c["members_listed"], true, "{c}");
    assert!(c["duration_s"].as_f64().unwrap() > 0.3, "{c}");
    assert_eq!(ev.last().unwrap()["event"], "run_end");
}

#[test]
fn waiting_for_nodes_is_never_silent_in_logs() {
    wait_for_nodes(false);
}

#[test]
fn waiting_for_nodes_shows_one_status_line_on_a_terminal() {
    wait_for_nodes(true);
}

/// rdrun on a pseudo-terminal (stdin, stdout, stderr), as in output/terminal.rs.
struct PtyRun {
    child: Child,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    _master: fs::File,
}

impl PtyRun {
    fn start(args: &[String], env: &[(&str, String)]) -> PtyRun {
        use nix::sys::termios::{self, LocalFlags, SetArg};
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let mut t = termios::tcgetattr(&pty.slave).expect("tcgetattr");
        t.local_flags.remove(LocalFlags::ECHO);
        termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t).expect("tcsetattr");
        let slave = fs::File::from(pty.slave);
        let mut cmd = Command::new(crate::util::rdrun_bin());
        cmd.args(args)
            .stdin(slave.try_clone().expect("dup"))
            .stdout(slave.try_clone().expect("dup"))
            .stderr(slave)
            .env("TERM", "xterm");
        for k in ["TORCHELASTIC_ERROR_FILE", "RUST_LOG", "LOGLEVEL"] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn rdrun");
        drop(cmd);
        let master = fs::File::from(pty.master);
        let mut rd = master.try_clone().expect("dup");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n) = rd.read(&mut b) {
                if n == 0 {
                    break;
                }
                s.lock().expect("lock").extend_from_slice(&b[..n]);
            }
        });
        PtyRun {
            child,
            seen,
            reader: Some(reader),
            _master: master,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("lock")).into_owned()
    }

    fn wait_for(&self, want: &str) {
        let deadline = Instant::now() + BOUND;
        while !self.text().contains(want) {
            assert!(
                Instant::now() < deadline,
                "terminal never showed {want:?}: {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `want` was drawn `n` times on one terminal line (redrawn after a carriage
    /// return or a cursor move, never after a newline).
    fn wait_for_redraws(&self, want: &str, n: usize) {
        let deadline = Instant::now() + BOUND;
        loop {
            let text = self.text();
            let mut draws = 0;
            let mut newline_between = false;
            let mut rest = text.as_str();
            while let Some(i) = rest.find(want) {
                if draws > 0 && rest[..i].contains('\n') {
                    newline_between = true;
                }
                draws += 1;
                rest = &rest[i + want.len()..];
            }
            assert!(
                !newline_between,
                "the status line was not redrawn in place: {text:?}"
            );
            if draws >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "status line drawn {draws} times: {text:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "rdrun ran past {BOUND:?}: {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(r) = self.reader.take() {
            // The reader ends with EIO once every slave descriptor is closed.
            let _ = r.join();
        }
        (status.code(), self.text())
    }
}

impl Drop for PtyRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A c10d agent alone of 2: the count (any node may join, so none is named), health
/// `rendezvous`, node_rank null until assigned; SIGTERM ends it, recorded in run_end.
#[test]
fn c10d_wait_then_sigterm_is_recorded() {
    let dir = TempDir::new("obs_c10d");
    let port = free_port();
    let events = dir.join("events.jsonl");
    let hport = free_port();
    let args = strings(&[
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        &format!("--rdzv-endpoint=127.0.0.1:{port}"),
        "--rdzv-id=obsc10d",
        "--events",
        events.to_str().unwrap(),
        "--no-python",
        "true",
    ]);
    let run = Live::start(
        &args,
        &[
            ("RDRUN_STATUS_INTERVAL", "0.3".to_string()),
            ("TORCHELASTIC_HEALTH_CHECK_PORT", hport.to_string()),
        ],
        dir.join("rdrun.log"),
    );
    run.wait_for_text("rdrun: waiting for nodes (round 0): 1 of 2 joined; ");
    assert_eq!(wait_http(hport, "/healthz", 503), "rendezvous\n");
    // SAFETY: plain kill(2) on our own unreaped child.
    unsafe { libc::kill(run.child.id() as i32, libc::SIGTERM) };
    let (code, text) = run.finish();
    assert_eq!(code, Some(143), "{text}");
    let all = parse_lines(&fs::read_to_string(&events).unwrap());
    // The `warn` health checks run beside the join (their thread): their one event comes at any
    // point before run_end; the rest keep their order.
    let health = all
        .iter()
        .position(|e| e["event"] == "health_check")
        .expect("one health_check event");
    assert!(health < all.len() - 1, "{text}");
    let ev: Vec<&Value> = all
        .iter()
        .filter(|e| e["event"] != "health_check")
        .collect();
    assert_eq!(all.len() - ev.len(), 1, "{text}");
    let names: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "run_start",
            "rendezvous_start",
            "rendezvous_failed",
            "signal",
            "run_end"
        ],
        "{text}"
    );
    assert_eq!(ev[1]["node_rank"], Value::Null);
    assert_eq!(ev[1]["reason"], "initial");
    assert_eq!(ev[0]["config"]["rdzv_backend"], "c10d");
    assert_eq!(ev[3]["signal"], "SIGTERM");
    let end = &ev[4];
    assert_eq!(end["outcome"], "interrupted");
    assert_eq!(end["signal"], "SIGTERM");
    assert_eq!(end["exit_code"], 143);
}

/// Node 1 waits for node 0's store and says so; then node 0 finishes first: the exit barrier
/// says so (and health is `succeeded`, 503) until node 1's worker ends.
#[test]
fn the_exit_barrier_is_never_silent() {
    let dir = TempDir::new("obs_barrier");
    let port = free_port();
    let hport = free_port();
    let go = dir.join("go");
    let node = |rank: usize, cmd: &[&str]| {
        let mut a = strings(&[
            "--nnodes=2",
            &format!("--node-rank={rank}"),
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            &format!("--master-port={port}"),
            "--no-python",
        ]);
        a.extend(strings(cmd));
        a
    };
    let wait_go = format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done",
        go.display()
    );
    // Node 1 first: it waits for node 0's store, and says so.
    let n1 = Live::start(
        &node(1, &["sh", "-c", &wait_go]),
        &[("RDRUN_STATUS_INTERVAL", "0.3".to_string())],
        dir.join("n1.log"),
    );
    n1.wait_for_text(&format!(
        "rdrun: waiting for the rendezvous store at 127.0.0.1:{port}; waited"
    ));
    let n0 = Live::start(
        &node(0, &["true"]),
        &[
            ("RDRUN_STATUS_INTERVAL", "0.3".to_string()),
            ("TORCHELASTIC_HEALTH_CHECK_PORT", hport.to_string()),
        ],
        dir.join("n0.log"),
    );
    n0.wait_for_text(
        "rdrun: exit barrier: this node's workers succeeded, waiting for the other nodes to finish; ",
    );
    assert_eq!(wait_http(hport, "/", 503), "succeeded\n");
    fs::write(&go, "").unwrap();
    let (code, text) = n0.finish();
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(n1.finish().0, Some(0));
}
