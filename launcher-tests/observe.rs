//! Watching a run (issue 15; issue 12's waiting line): the lifecycle events of a run with a
//! failure and a restart (events.jsonl, `--events`, the console handler), the health endpoint
//! and `/metrics` through a failure and a restart (parsed by Python's prometheus_client where
//! the torch venv exists), and the status line while rdrun waits for nodes and for workers to
//! stop, with pipes and through a pseudo-terminal.
//!
//! This file: the shared helpers (a live rdrun whose log the test reads while it runs, HTTP
//! polls of the observability port, JSON lines) and the lifecycle events: a run with a failure
//! and a restart, `--events -` and bad observability values, a signal in the exit barrier and a
//! hang verdict as events. The children:
//! - `metrics`: the health endpoint and `/metrics` through a failure and a restart, and the
//!   store's connection, operation and pending-wait counts.
//! - `waiting`: never silent while waiting: the status line for missing nodes (logs and a
//!   terminal), a lone c10d agent ended by SIGTERM, the store and the exit barrier.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{free_port, worker, Rdrun, TempDir};

mod metrics;
mod waiting;

/// Every wait of these tests gives up after this (the machine may be loaded).
const BOUND: Duration = Duration::from_secs(60);

/// rdrun started with stderr (and stdout) in a file, so the test can read it while it runs;
/// SIGKILLed by pid on drop.
struct Live {
    child: Child,
    log: PathBuf,
}

impl Live {
    fn start(args: &[String], env: &[(&str, String)], log: PathBuf) -> Live {
        let file = fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(crate::util::rdrun_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("dup"))
            .stderr(file);
        for k in [
            "TORCHELASTIC_ERROR_FILE",
            "RUST_LOG",
            "LOGLEVEL",
            "RDRUN_METRICS_ADDR",
            "TORCHELASTIC_HEALTH_CHECK_PORT",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Live {
            child: cmd.spawn().expect("spawn rdrun"),
            log,
        }
    }

    fn text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` to this rdrun (by pid).
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    fn wait_for_text(&self, want: &str) {
        let deadline = Instant::now() + BOUND;
        while !self.text().contains(want) {
            assert!(
                Instant::now() < deadline,
                "rdrun never printed {want:?}:\n{}",
                self.text()
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
                "rdrun ran past {BOUND:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        (status.code(), self.text())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET `path` on 127.0.0.1:`port`: (status, body); `None` while nothing listens. Asks for
/// OpenMetrics, as Prometheus does (the classic format: `observe_http`).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n")
            .as_bytes(),
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Polls until `path` answers `status` (bounded); returns the body.
fn wait_http(port: u16, path: &str, status: u16) -> String {
    let deadline = Instant::now() + BOUND;
    loop {
        let got = http_get(port, path);
        if let Some((s, body)) = &got {
            if *s == status {
                return body.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {status}; last {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_file(p: &Path) {
    let deadline = Instant::now() + BOUND;
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn parse_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn events_of_a_run_with_one_failure_and_a_restart() {
    let dir = TempDir::new("obs_events");
    let logs = dir.join("logs");
    let work = dir.join("work");
    fs::create_dir(&work).unwrap();
    let extra = dir.join("extra.jsonl");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=2", "--max-restarts=1"])
        .arg("--log-dir")
        .arg(&logs)
        .arg("--events")
        .arg(&extra)
        .args(["--event-log-handler", "console", "--no-python"])
        .arg(worker("fail_until_restart"))
        .arg("1")
        .arg(&work)
        .run();
    out.assert_code(0);
    // <log-dir>/<run>/events.jsonl, the same lines as --events.
    let run_dir = fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("events.jsonl").exists())
        .unwrap_or_else(|| panic!("no events.jsonl under {}: {out:?}", logs.display()));
    let text = fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert_eq!(text, fs::read_to_string(&extra).unwrap());
    let ev = parse_lines(&text);
    let names: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    // Every event carries the common fields.
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let mut last_ts = String::new();
    let run_id = ev[0]["config"]["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    assert!(!run_id.is_empty());
    for e in &ev {
        assert_eq!(e["v"], 1, "{e}");
        assert_eq!(e["run_id"], run_id.as_str(), "{e}");
        assert_eq!(e["node_rank"], 0, "{e}");
        assert_eq!(e["host"], host.as_str(), "{e}");
        let ts = e["ts"].as_str().unwrap();
        assert!(
            humantime::parse_rfc3339(ts).is_ok() && ts.ends_with('Z'),
            "{ts}"
        );
        assert!(
            ts >= last_ts.as_str(),
            "timestamps go back: {ts} after {last_ts}"
        );
        last_ts = ts.to_string();
    }
    // Event by event.
    assert_eq!(names.first(), Some(&"run_start"), "{names:?}");
    assert_eq!(ev[0]["attempt"], 0);
    assert_eq!(ev[0]["config"]["nproc_per_node"], 2);
    assert_eq!(ev[0]["config"]["max_restarts"], 1);
    assert_eq!(names.last(), Some(&"run_end"), "{names:?}");
    let end = ev.last().unwrap();
    assert_eq!(
        (end["outcome"].as_str(), end["exit_code"].as_i64()),
        (Some("succeeded"), Some(0))
    );
    assert_eq!(end["attempt"], 1);
    let of = |attempt: u64, name: &str| -> Vec<&Value> {
        ev.iter()
            .filter(|e| e["attempt"] == attempt && e["event"] == name)
            .collect()
    };
    for attempt in 0..2u64 {
        let spawns = of(attempt, "worker_spawn");
        let exits = of(attempt, "worker_exit");
        assert_eq!(spawns.len(), 2, "attempt {attempt}: {names:?}");
        assert_eq!(exits.len(), 2, "attempt {attempt}: {names:?}");
        for lr in 0..2u64 {
            let s = spawns
                .iter()
                .find(|e| e["local_rank"] == lr)
                .expect("spawn");
            let x = exits.iter().find(|e| e["local_rank"] == lr).expect("exit");
            assert_eq!(s["rank"], lr);
            assert!(s["pid"].as_i64().unwrap() > 1);
            assert_eq!(x["pid"], s["pid"], "exit pairs with its spawn");
            assert!(x["duration_s"].as_f64().unwrap() >= 0.0);
            let failed = attempt == 0 && lr == 1;
            if attempt == 0 && lr == 0 && x["signal"] == "SIGTERM" {
                // Local rank 0 exits 0 right after its record; on a loaded machine rdrun's
                // SIGTERM after rank 1's failure may come first.
                assert_eq!(
                    (&x["status"], &x["exit_code"]),
                    (&Value::from("failed"), &Value::Null),
                    "{x}"
                );
                continue;
            }
            assert_eq!(
                x["status"],
                if failed { "failed" } else { "succeeded" },
                "{x}"
            );
            assert_eq!(x["exit_code"], if failed { 1 } else { 0 }, "{x}");
            assert_eq!(x["signal"], Value::Null);
        }
    }
    // The failure's stop: begun for a worker failure with SIGTERM, finished, then the charged
    // restart into attempt 1; the successful attempt has no stop.
    let begin = of(0, "stop_begin");
    assert_eq!(begin.len(), 1, "{names:?}");
    assert_eq!(begin[0]["reason"], "worker_failed");
    assert_eq!(begin[0]["signal"], "SIGTERM");
    let stop_end = of(0, "stop_end");
    assert_eq!(stop_end.len(), 1, "{names:?}");
    assert_eq!(stop_end[0]["killed"], false);
    assert!(stop_end[0]["grace_used_s"].as_f64().unwrap() >= 0.0);
    let restart = of(0, "restart");
    assert_eq!(restart.len(), 1, "{names:?}");
    assert_eq!(restart[0]["charged"], true);
    assert_eq!(restart[0]["next_attempt"], 1);
    assert!(of(1, "stop_begin").is_empty(), "{names:?}");
    // Order: the failure's exit before the stop, the stop before the restart, the restart
    // before attempt 1's spawns.
    let pos = |pred: &dyn Fn(&Value) -> bool| ev.iter().position(pred).expect("event");
    let fail_at = pos(&|e| e["event"] == "worker_exit" && e["status"] == "failed");
    let begin_at = pos(&|e| e["event"] == "stop_begin");
    let end_at = pos(&|e| e["event"] == "stop_end");
    let restart_at = pos(&|e| e["event"] == "restart");
    let respawn_at = pos(&|e| e["event"] == "worker_spawn" && e["attempt"] == 1);
    assert!(
        fail_at < begin_at && begin_at < end_at && end_at < restart_at && restart_at < respawn_at,
        "{names:?}"
    );
    // No rendezvous on a single-node run; no hang; no signal.
    for absent in ["rendezvous_start", "hang", "signal"] {
        assert!(!names.contains(&absent), "{names:?}");
    }
    // The console handler printed the same events as text.
    for want in [
        "rdrun event run_start attempt=0",
        "rdrun event worker_exit attempt=0 node_rank=0",
        "rdrun event restart attempt=0",
        "rdrun event run_end attempt=1",
    ] {
        assert!(out.stderr.contains(want), "{want:?} missing: {out:?}");
    }
}

#[test]
fn events_to_stderr_and_bad_observability_values() {
    let out = Rdrun::new()
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--events",
            "-",
            "--no-python",
            "true",
        ])
        .run();
    out.assert_code(0);
    let lines: Vec<Value> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = lines.iter().map(|e| e["event"].as_str().unwrap()).collect();
    // health_check: the default --health-check warn's one run of the checks (issue 28).
    assert_eq!(
        names,
        [
            "run_start",
            "health_check",
            "worker_spawn",
            "worker_exit",
            "run_end"
        ],
        "{out:?}"
    );
    let health = &lines[1];
    assert_eq!(health["healthy"], true, "{health}");
    let checks: Vec<&str> = health["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        [
            "interpreter",
            "log-dir",
            "checkpoint-dir",
            "shm",
            "memory",
            "nofile",
            "nics",
            "gpus"
        ],
        "{health}"
    );
    // Bad values: one line naming the flag or variable, exit 2, nothing started.
    let out = Rdrun::new()
        .args([
            "--standalone",
            "--metrics-addr",
            "127.0.0.1:http",
            "--no-python",
            "true",
        ])
        .run();
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("--metrics-addr"), "{out:?}");
    let out = Rdrun::new()
        .env("TORCHELASTIC_HEALTH_CHECK_PORT", "nope")
        .args(["--standalone", "--no-python", "true"])
        .run();
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("TORCHELASTIC_HEALTH_CHECK_PORT='nope'"),
        "{out:?}"
    );
    let out = Rdrun::new()
        .args([
            "--standalone",
            "--events",
            "/nonexistent-dir/e.jsonl",
            "--no-python",
            "true",
        ])
        .run();
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("--events /nonexistent-dir/e.jsonl"),
        "{out:?}"
    );
}

/// A shutdown signal that ends the exit barrier early is a `signal` event before `run_end`.
#[test]
fn a_signal_in_the_exit_barrier_is_an_event() {
    let dir = TempDir::new("obs_barrier_sig");
    let port = free_port();
    let events = dir.join("events.jsonl");
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
    let mut n0_args = node(0, &["true"]);
    n0_args.splice(0..0, strings(&["--events", &events.display().to_string()]));
    let n0 = Live::start(
        &n0_args,
        &[("RDRUN_STATUS_INTERVAL", "0.3".to_string())],
        dir.join("n0.log"),
    );
    // Node 1's worker runs until it is stopped: node 0 waits in the barrier.
    let n1 = Live::start(&node(1, &["sleep", "120"]), &[], dir.join("n1.log"));
    n0.wait_for_text("rdrun: exit barrier: this node's workers succeeded");
    n0.signal(libc::SIGTERM);
    let (_, text) = n0.finish();
    let evs: Vec<Value> = fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = evs.iter().map(|e| e["event"].as_str().unwrap()).collect();
    let sig = names.iter().position(|n| *n == "signal");
    let end = names.iter().position(|n| *n == "run_end");
    assert!(
        sig.is_some() && end.is_some() && sig < end,
        "{names:?}\n{text}"
    );
    assert_eq!(evs[sig.unwrap()]["signal"], "SIGTERM", "{names:?}");
    n1.signal(libc::SIGTERM);
    let _ = n1.finish();
}

/// A hung worker (kill mode, small budgets): the `hang` event, then the stop and the run's end.
#[test]
fn a_hang_verdict_is_an_event() {
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=1", "--events", "-"])
        .args([
            "--hang-detect",
            "kill",
            "--hang-timeout",
            "2",
            "--hang-startup-timeout",
            "2",
        ])
        .args([
            "--hang-poll-interval",
            "0.25",
            "--hang-capture-timeout",
            "5",
        ])
        .env_remove("RDRUN_HANG_DETECT")
        .env("RDRUN_PY_SPY", "/nonexistent/py-spy")
        .timeout(Duration::from_secs(90))
        .args(["--no-python", "sh", "-c", "echo start; exec sleep 300"])
        .run();
    assert_ne!(out.code, Some(0), "{out:?}");
    let ev: Vec<Value> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    let hang = ev
        .iter()
        .find(|e| e["event"] == "hang")
        .unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(hang["action"], "kill");
    assert!(
        hang["summary"].as_str().unwrap().contains("no activity"),
        "{hang}"
    );
    let at = |n: &str| {
        names
            .iter()
            .position(|x| *x == n)
            .unwrap_or_else(|| panic!("{n}: {names:?}"))
    };
    assert!(
        at("hang") < at("stop_begin") && at("stop_begin") < at("stop_end"),
        "{names:?}"
    );
    assert_eq!(ev.last().unwrap()["outcome"], "workers_failed", "{names:?}");
}
