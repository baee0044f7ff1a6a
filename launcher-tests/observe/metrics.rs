//! The health endpoint and `/metrics` of a real run: through a failure and a restart (samples
//! parsed by Python's prometheus_client OpenMetrics parser where the torch venv exists, else a
//! minimal parse of the same lines, said so), and the store's counts of connections, operations
//! and pending waits from a worker that speaks the TCPStore wire by hand.

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{free_port, worker, TempDir};

use super::{http_get, strings, wait_file, wait_http, Live, BOUND};

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
