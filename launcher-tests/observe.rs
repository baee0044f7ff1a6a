//! Watching a run (issue 15; issue 12's waiting line): the lifecycle events of a run with a
//! failure and a restart (events.jsonl, `--events`, the console handler), the health endpoint
//! and `/metrics` through a failure and a restart (parsed by Python's prometheus_client where
//! the torch venv exists), and the status line while rdrun waits for nodes and for workers to
//! stop, with pipes and through a pseudo-terminal.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{free_port, worker, Rdrun, TempDir};

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
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
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

/// The torch venv's python, if it is installed (scripts/torch-venv.sh).
fn venv_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("rdrun")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/python");
    p.exists().then_some(p)
}

/// Samples of an exposition as Python's prometheus_client OpenMetrics parser reads them:
/// `name{labels} value` lines, sorted.
fn python_parse(text: &str) -> Option<Vec<String>> {
    let py = venv_python()?;
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out.append(f"{s.name}{{{labels}}} {s.value}")
print("\n".join(sorted(out)))
"#;
    let mut child = Command::new(py)
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(text.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    assert!(
        out.status.success(),
        "prometheus_client rejected the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

/// The value of sample `name{labels}` (labels as `k="v"`, sorted, comma-separated).
fn sample(samples: &[String], key: &str) -> Option<f64> {
    samples
        .iter()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
}

/// Parses with Python where it can (else a minimal parse of the same lines, said so).
fn parsed(text: &str) -> Vec<String> {
    if let Some(s) = python_parse(text) {
        return s;
    }
    eprintln!("SKIP (python parse): no torch venv with prometheus_client; parsing in Rust");
    assert!(text.ends_with("# EOF\n"), "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            let v: f64 = value.parse().unwrap();
            let name = if name.contains('{') {
                name.to_string()
            } else {
                format!("{name}{{}}")
            };
            format!("{name} {v:?}")
        })
        .collect()
}

#[test]
fn health_and_metrics_through_a_failure_and_a_restart() {
    let dir = TempDir::new("obs_health");
    let work = dir.join("work");
    fs::create_dir(&work).unwrap();
    let (hport, mport) = (free_port(), free_port());
    let args = strings(&[
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--shutdown-timeout=50",
        "--metrics-addr",
        &format!("127.0.0.1:{mport}"),
        "--no-python",
        worker("observe_phases").to_str().unwrap(),
        work.to_str().unwrap(),
    ]);
    let run = Live::start(
        &args,
        &[
            ("TORCHELASTIC_HEALTH_CHECK_PORT", hport.to_string()),
            ("RDRUN_STATUS_INTERVAL", "0.3".to_string()),
        ],
        dir.join("rdrun.log"),
    );
    // Attempt 0 runs: healthy on any path of the health port and on /healthz.
    wait_file(&work.join("up.0.0"));
    wait_file(&work.join("up.1.0"));
    assert_eq!(wait_http(hport, "/", 200), "running\n");
    assert_eq!(wait_http(hport, "/any/path", 200), "running\n");
    assert_eq!(wait_http(mport, "/healthz", 200), "running\n");
    // Every worker has written its first line: /metrics while the group runs.
    run.wait_for_text("rank 1 up in attempt 0");
    run.wait_for_text("rank 0 up in attempt 0");
    let m = parsed(&wait_http(mport, "/metrics", 200));
    assert_eq!(
        sample(&m, r#"rdrun_workers_up{local_rank="0"}"#),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(
        sample(&m, r#"rdrun_workers_up{local_rank="1"}"#),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(sample(&m, "rdrun_attempt{}"), Some(0.0), "{m:#?}");
    assert_eq!(sample(&m, "rdrun_healthy{}"), Some(1.0), "{m:#?}");
    assert!(
        sample(&m, "rdrun_spawn_duration_seconds{}").is_some_and(|v| v >= 0.0),
        "{m:#?}"
    );
    for lr in 0..2 {
        let first = sample(
            &m,
            &format!(r#"rdrun_first_output_seconds{{local_rank="{lr}"}}"#),
        );
        assert!(first.is_some_and(|v| v >= 0.0), "{m:#?}");
        let age = sample(
            &m,
            &format!(r#"rdrun_last_output_age_seconds{{local_rank="{lr}"}}"#),
        );
        assert!(age.is_some_and(|v| v >= 0.0), "{m:#?}");
    }
    // The store series exist (their values: store_metrics_count_connections_...).
    assert!(sample(&m, "rdrun_store_connections{}").is_some(), "{m:#?}");
    assert!(
        sample(&m, r#"rdrun_store_operations_total{op="get"}"#).is_some(),
        "{m:#?}"
    );
    assert!(
        sample(&m, "rdrun_store_waits_pending{}").is_some(),
        "{m:#?}"
    );
    assert!(
        sample(&m, "rdrun_store_connections_accepted_total{}").is_some(),
        "{m:#?}"
    );
    // Local rank 1 fails; local rank 0 ignores SIGTERM: the group is stopping, 503, and the
    // status line says what rdrun waits for.
    fs::write(work.join("fail"), "").unwrap();
    assert_eq!(wait_http(hport, "/", 503), "stopping\n");
    assert_eq!(wait_http(mport, "/healthz", 503), "stopping\n");
    run.wait_for_text("rdrun: stopping: waiting for 1 worker(s) to exit; SIGKILL in");
    let m = parsed(&wait_http(mport, "/metrics", 200));
    assert_eq!(
        sample(&m, r#"rdrun_workers_up{local_rank="1"}"#),
        Some(0.0),
        "{m:#?}"
    );
    assert_eq!(sample(&m, "rdrun_healthy{}"), Some(0.0), "{m:#?}");
    // Released: the restart, then attempt 1 runs healthily.
    fs::write(work.join("release"), "").unwrap();
    wait_file(&work.join("up.0.1"));
    wait_file(&work.join("up.1.1"));
    assert_eq!(wait_http(hport, "/", 200), "running\n");
    let m = parsed(&wait_http(mport, "/metrics", 200));
    assert_eq!(sample(&m, "rdrun_attempt{}"), Some(1.0), "{m:#?}");
    assert_eq!(
        sample(&m, r#"rdrun_restarts_total{charged="true"}"#),
        Some(1.0),
        "{m:#?}"
    );
    assert!(
        sample(&m, "rdrun_stop_duration_seconds{}").is_some_and(|v| v > 0.0),
        "{m:#?}"
    );
    assert_eq!(
        sample(&m, r#"rdrun_workers_up{local_rank="0"}"#),
        Some(1.0),
        "{m:#?}"
    );
    fs::write(work.join("done"), "").unwrap();
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text}");
    // After the run: nothing listens any more.
    assert!(http_get(hport, "/").is_none());
    assert!(http_get(mport, "/metrics").is_none());
}

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

/// rdrun on a pseudo-terminal (stdin, stdout, stderr), as in output.rs.
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
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdrun"));
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

/// A worker that speaks the TCPStore wire by hand: VALIDATE, then a WAIT on a key nobody sets;
/// later it closes the connection. `/metrics` counts the connection, the operations and the
/// pending wait, and both go back to 0 when the connection closes.
const STORE_WAITER: &str = r#"
d=$1
exec 3<>"/dev/tcp/$MASTER_ADDR/$MASTER_PORT" || exit 7
printf '\x00\xce\xf7\x85\x3c\x06\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00k' >&3
: > "$d/waiting"
i=0; while [ ! -e "$d/close" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done
exec 3>&-
: > "$d/closed"
i=0; while [ ! -e "$d/done" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done
"#;

#[test]
fn store_metrics_count_connections_operations_and_pending_waits() {
    let dir = TempDir::new("obs_store");
    let mport = free_port();
    let args = strings(&[
        "--standalone",
        "--nproc-per-node=1",
        &format!("--metrics-addr={mport}"),
        "--no-python",
        "bash",
        "-c",
        STORE_WAITER,
        "store_waiter",
        dir.path().to_str().unwrap(),
    ]);
    let run = Live::start(&args, &[], dir.join("rdrun.log"));
    wait_file(&dir.join("waiting"));
    let scrape = || parsed(&wait_http(mport, "/metrics", 200));
    let deadline = Instant::now() + BOUND;
    let m = loop {
        let m = scrape();
        if sample(&m, "rdrun_store_waits_pending{}") == Some(1.0) {
            break m;
        }
        assert!(Instant::now() < deadline, "the wait never showed: {m:#?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(sample(&m, "rdrun_store_connections{}"), Some(1.0), "{m:#?}");
    assert_eq!(
        sample(&m, "rdrun_store_connections_accepted_total{}"),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(
        sample(&m, r#"rdrun_store_operations_total{op="validate"}"#),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(
        sample(&m, r#"rdrun_store_operations_total{op="wait"}"#),
        Some(1.0),
        "{m:#?}"
    );
    fs::write(dir.join("close"), "").unwrap();
    wait_file(&dir.join("closed"));
    let deadline = Instant::now() + BOUND;
    let m = loop {
        let m = scrape();
        if sample(&m, "rdrun_store_connections{}") == Some(0.0) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the connection never closed: {m:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        sample(&m, "rdrun_store_waits_pending{}"),
        Some(0.0),
        "{m:#?}"
    );
    assert_eq!(
        sample(&m, "rdrun_store_connections_accepted_total{}"),
        Some(1.0),
        "{m:#?}"
    );
    fs::write(dir.join("done"), "").unwrap();
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text}");
}
