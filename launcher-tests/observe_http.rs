//! The HTTP side of watching a run (issue 25): `/metrics` in the format the request's `Accept`
//! asks for (read back by Python's prometheus_client parsers, both of them, where the torch venv
//! has them), every counter at 0 from the first scrape, `HEAD` with the real length, and the
//! health port on IPv6 and IPv4 with the rule for a worker that exited 0 while others run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{free_port, Rdrun, Running, TempDir};

/// Every wait of these tests gives up after this (the machine may be loaded).
const BOUND: Duration = Duration::from_secs(60);

/// A worker: local rank 0 exits 0 at once (with `QUICK`), every other rank (and rank 0 without
/// it) waits for `$DIR/done`, at most about 60 s, then exits 0.
const WORKER: &str = r#"
[ -n "$QUICK" ] && [ "$LOCAL_RANK" = 0 ] && exit 0
i=0; while [ ! -e "$DIR/done" ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
"#;

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One request to `addr`; `None` while nothing listens there.
fn request(addr: SocketAddr, method: &str, path: &str, accept: Option<&str>) -> Option<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{accept}\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let (line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    Some(Reply {
        status: line.split(' ').nth(1)?.parse().ok()?,
        headers: headers.to_string(),
        body: body.to_string(),
    })
}

/// Polls `addr` until `path` answers `status` (bounded).
fn wait_status(addr: SocketAddr, path: &str, status: u16) -> Reply {
    let deadline = Instant::now() + BOUND;
    loop {
        match request(addr, "GET", path, None) {
            Some(r) if r.status == status => return r,
            got => assert!(
                Instant::now() < deadline,
                "{addr}{path} never answered {status}; last {:?}",
                got.map(|r| (r.status, r.body))
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(dir: &TempDir, nproc: usize, env: &[(&str, String)], extra: &[String]) -> Running {
    let mut r = Rdrun::new()
        .args(["--standalone", &format!("--nproc-per-node={nproc}")])
        .args(extra)
        .args(["--no-python", "sh", "-c", WORKER])
        .env("DIR", dir.path())
        .env_remove("RDRUN_METRICS_ADDR")
        .env_remove("TORCHELASTIC_HEALTH_CHECK_PORT")
        .timeout(Duration::from_secs(120));
    for (k, v) in env {
        r = r.env(k, v);
    }
    r.spawn()
}

/// The torch venv's python, if installed (scripts/torch-venv.sh).
fn venv_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/python");
    p.exists().then_some(p)
}

/// The families as prometheus_client's parser for `format` (`text` or `openmetrics`) reads
/// them: one `name type has_help` line per family, then `sample{labels} value` lines.
fn python_families(py: &Path, format: &str, text: &str) -> String {
    let module = match format {
        "openmetrics" => "prometheus_client.openmetrics.parser",
        _ => "prometheus_client.parser",
    };
    let script = format!(
        r#"
import sys, warnings
warnings.simplefilter("error")
from {module} import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    print("family", fam.name, fam.type, bool(fam.documentation))
    for s in fam.samples:
        labels = ",".join(f'{{k}}="{{v}}"' for k, v in sorted(s.labels.items()))
        print(f"{{s.name}}{{{{{{labels}}}}}} {{s.value}}")
"#
    );
    let mut child = Command::new(py)
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the {format} parser rejected:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of sample `key` (`name{labels}`) in [`python_families`]' output.
fn value(fams: &str, key: &str) -> Option<f64> {
    fams.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
}

/// Prometheus 2.x's scrape `Accept`.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/\
    openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn metrics_follow_accept_counters_start_at_zero_and_head_has_the_length() {
    let dir = TempDir::new("obs_accept");
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let run = start(
        &dir,
        1,
        &[],
        &["--metrics-addr".into(), format!("127.0.0.1:{port}")],
    );
    wait_status(addr, "/healthz", 200);
    let py = venv_python();
    if py.is_none() {
        eprintln!("SKIP (python parse): no torch venv with prometheus_client");
    }
    // No Accept, `*/*`, `text/plain`: the classic format.
    for accept in [None, Some("*/*"), Some("text/plain;version=0.0.4")] {
        let r = request(addr, "GET", "/metrics", accept).expect("GET /metrics");
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8"),
            "{accept:?}"
        );
        assert!(!r.body.contains("# EOF"), "{}", r.body);
        assert!(
            r.body.contains("# TYPE rdrun_restarts_total counter\n"),
            "{}",
            r.body
        );
        if let Some(py) = &py {
            let fams = python_families(py, "text", &r.body);
            // Typed and documented, not "untyped, no help", and at 0 before any restart.
            assert!(
                fams.contains("family rdrun_restarts counter True"),
                "{fams}"
            );
            assert!(
                fams.contains("family rdrun_store_operations counter True"),
                "{fams}"
            );
            assert!(fams.contains("family rdrun_attempt gauge True"), "{fams}");
            for c in ["true", "false"] {
                let key = format!("rdrun_restarts_total{{charged=\"{c}\"}}");
                assert_eq!(value(&fams, &key), Some(0.0), "{key}: {fams}");
            }
        }
    }
    // A scraper that asks for OpenMetrics gets it.
    for accept in [PROMETHEUS_ACCEPT, "application/openmetrics-text"] {
        let r = request(addr, "GET", "/metrics", Some(accept)).expect("GET /metrics");
        assert_eq!(
            r.header("content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
        if let Some(py) = &py {
            let fams = python_families(py, "openmetrics", &r.body);
            assert!(
                fams.contains("family rdrun_restarts counter True"),
                "{fams}"
            );
            let key = "rdrun_restarts_total{charged=\"false\"}";
            assert_eq!(value(&fams, key), Some(0.0), "{fams}");
        }
    }
    // HEAD: the length GET sends, no body.
    let h = request(addr, "HEAD", "/metrics", None).expect("HEAD /metrics");
    assert_eq!(h.status, 200);
    let len: usize = h
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(len > 100, "HEAD Content-Length {len}: {}", h.headers);
    assert!(h.body.is_empty(), "{}", h.body);
    let h = request(addr, "HEAD", "/healthz", None).expect("HEAD /healthz");
    assert_eq!(h.header("content-length"), Some("8"), "{}", h.headers);
    std::fs::write(dir.join("done"), "").unwrap();
    run.wait().assert_code(0);
}

/// Whether this host can listen on IPv6 loopback.
fn have_ipv6() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[test]
fn health_port_answers_on_ipv6_and_ipv4_and_stays_up_after_a_clean_exit() {
    let dir = TempDir::new("obs_health6");
    let port = free_port();
    let events = dir.join("events.jsonl");
    let run = start(
        &dir,
        2,
        &[
            ("TORCHELASTIC_HEALTH_CHECK_PORT", port.to_string()),
            ("QUICK", "1".into()),
        ],
        &["--events".into(), events.to_str().unwrap().into()],
    );
    let v4: SocketAddr = ([127, 0, 0, 1], port).into();
    // Local rank 0 exits 0 at once; rank 1 still runs: the group is still healthy (the rule,
    // docs/events.md: 200 while no worker failed and one still runs).
    let deadline = Instant::now() + BOUND;
    while !std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"worker_exit\"") && l.contains("\"local_rank\":0"))
    {
        assert!(Instant::now() < deadline, "rank 0 never exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(wait_status(v4, "/", 200).body, "running\n");
    if have_ipv6() {
        let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, port).into();
        assert_eq!(wait_status(v6, "/healthz", 200).body, "running\n");
    } else {
        eprintln!("SKIP (IPv6 part): no IPv6 loopback on this host");
    }
    std::fs::write(dir.join("done"), "").unwrap();
    run.wait().assert_code(0);
}
