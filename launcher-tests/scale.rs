//! Small-size smokes of the scale benchmarks (issue 16), with correctness assertions only: the
//! benchmarks themselves (`scripts/bench-scale.sh`) run the big sizes, and no test here asserts
//! a time.
//!
//! - PyTorch's start-up pattern for 2,000 store clients spread over two generator processes
//!   (`rdrun-store-bench startup`) against rdrun's server in a child process: every client
//!   finishes every phase; once more with `--gen-nice 10` (every share in a niced child).
//! - 300 simulated c10d nodes (`rdrun-rdzv-sim`) join one round (more than 256: each node builds
//!   its assignment from the round's summary and its own notice, not the roster); a dropped node
//!   is reported to every survivor.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed by PID when dropped (no leak if an assertion fails).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` at most `limit`; `None` (and the child killed) when it ran over.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// One `rdrun-store-bench startup` of 2,000 clients over two generator processes against the
/// server at `port` (pid `pid`), with `extra` arguments; asserts every client through every
/// phase and returns the result line.
fn startup_2000(bench: &str, port: &str, pid: &str, extra: &[&str]) -> String {
    let out = std::env::temp_dir().join(format!(
        "rdrun-scale-{}-{}.out",
        std::process::id(),
        extra.len()
    ));
    let mut gen = Killed(
        Command::new(bench)
            .args([
                "startup",
                "--port",
                port,
                "--clients",
                "2000",
                "--procs",
                "2",
            ])
            .args(["--server-pid", pid, "--timeout-secs", "240"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create output file"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn rdrun-store-bench startup"),
    );
    let status = wait_bounded(&mut gen.0, Duration::from_secs(300));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let status = status.unwrap_or_else(|| panic!("startup ran over 300 s; output {text:?}"));
    assert!(status.success(), "startup failed ({status}): {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("clients="))
        .unwrap_or_else(|| panic!("no result line in {text:?}"));
    assert_eq!(field(line, "clients"), "2000", "{line}");
    assert_eq!(field(line, "ok"), "2000", "{line}");
    assert_eq!(field(line, "failed"), "0", "{line}");
    assert_eq!(field(line, "procs"), "2", "{line}");
    // Every phase was reached by everyone, in order (cumulative times never go backwards).
    let done: Vec<f64> = ["connect", "init", "own_set", "shared_get", "barrier"]
        .iter()
        .map(|p| field(line, &format!("{p}_done_s")).parse().expect("number"))
        .collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{line}");
    // The fresh-client probe (connect, VALIDATE + PING, SET of its own key, WAIT + GET of it,
    // the value checked) ran at least once during the storm and never failed.
    let probes: u64 = field(line, "probes").parse().expect("number");
    assert!(probes >= 1, "{line}");
    assert_eq!(field(line, "probe_failed"), "0", "{line}");
    // The server process was measured with every connection open.
    let rss: u64 = field(line, "server_rss_kib").parse().expect("number");
    assert!(rss > 0, "{line}");
    line.to_string()
}

#[test]
fn store_startup_pattern_2000_clients_over_two_processes() {
    let bench = env!("CARGO_BIN_EXE_rdrun-store-bench");
    let mut server = Killed(
        Command::new(bench)
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rdrun-store-bench serve"),
    );
    let mut first = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("port line");
    let port = first
        .trim()
        .strip_prefix("port=")
        .expect("port=N")
        .to_string();
    let pid = server.0.id().to_string();
    startup_2000(bench, &port, &pid, &[]);
    // The same with the generators niced: every share in a child, the probe in the parent.
    let line = startup_2000(bench, &port, &pid, &["--gen-nice", "10"]);
    assert_eq!(field(&line, "gen_nice"), "10", "{line}");
    if let Some(st) = server.0.try_wait().expect("try_wait") {
        panic!("store server exited during the run: {st}");
    }
}

/// 300 simulated c10d nodes (`rdrun-rdzv-sim`, one process, each node with its own store
/// connection and heartbeat keeper) join one round against rdrun's store in a child process
/// the simulator starts (which reports its socket byte counters); one node is then dropped and
/// every survivor must hear of it (the simulator exits non-zero if a node fails to join, gets a
/// wrong world, or sees anything else).
#[test]
fn rendezvous_sim_300_nodes_join_and_detect_a_lost_node() {
    let out = std::env::temp_dir().join(format!("rdrun-sim-{}.out", std::process::id()));
    let mut sim = Killed(
        Command::new(env!("CARGO_BIN_EXE_rdrun-rdzv-sim"))
            .args(["--nodes", "300", "--steady-secs", "0", "--kill-one"])
            .args(["--timeout-secs", "240"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create output file"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn rdrun-rdzv-sim"),
    );
    let status = wait_bounded(&mut sim.0, Duration::from_secs(300));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let status = status.unwrap_or_else(|| panic!("rdrun-rdzv-sim ran over 300 s; output {text:?}"));
    assert!(status.success(), "rdrun-rdzv-sim failed ({status}): {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("nodes="))
        .unwrap_or_else(|| panic!("no result line in {text:?}"));
    assert_eq!(field(line, "nodes"), "300", "{line}");
    let join: f64 = field(line, "join_s").parse().expect("join_s is a number");
    let all: f64 = field(line, "detect_all_s")
        .parse()
        .expect("detect_all_s is a number");
    assert!(join >= 0.0 && all >= 0.0, "{line}");
    // The store's byte counters were read: every node at least sent its join and read its
    // assignment, which takes more than a few bytes.
    let per_join: u64 = field(line, "bytes_per_join")
        .parse()
        .expect("bytes_per_join is a number");
    let total: u64 = field(line, "join_bytes").parse().expect("join_bytes");
    assert!(per_join >= 100 && total >= 100 * per_join, "{line}");
}
