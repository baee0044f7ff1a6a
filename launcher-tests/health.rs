//! Node health checks before a node joins (issue 28 items 1–2), with real agents on loopback:
//! under `--health-check on` a static job with an unhealthy node ends before any worker starts,
//! on every node, the bad node exiting 75 and named (also in `--report-json`); `warn` only
//! warns; a hanging `--health-check-cmd` is killed at its bound; an unhealthy elastic node does
//! not join and the others run without it.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{alive, free_port, Output, Rdrun, TempDir};

/// Hard bound on one agent.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The worker: records that it started (`started.<RANK>`, holding GROUP_WORLD_SIZE).
const WORKER: &str = r#"echo "$GROUP_WORLD_SIZE" > "$1/started.$RANK""#;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

fn started(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("started."))
        .collect();
    v.sort();
    v
}

/// A broken venv's interpreter: a script whose own interpreter does not exist.
fn broken_python(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("python");
    std::fs::write(&p, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The check command whose pid is in `pidfile` is gone (bounded wait).
fn assert_gone(pidfile: &Path) {
    let pid: i32 = std::fs::read_to_string(pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the check command {pid} survived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Static two-node job on loopback; node 1 gets `bad` (args and env) and a report file.
fn static_pair(
    dir: &TempDir,
    bad_args: &[&str],
    bad_env: &[(&str, &Path)],
    python: bool,
) -> [Output; 2] {
    let port = free_port();
    let script = dir.join("w.py");
    std::fs::write(
        &script,
        "import os, sys\nopen(os.path.join(sys.argv[1], 'started.' + os.environ['RANK']), 'w').close()\n",
    )
    .unwrap();
    let agent = |rank: usize| {
        let mut r = Rdrun::new().timeout(AGENT_TIMEOUT).args([
            "--nnodes",
            "2",
            "--node-rank",
            &rank.to_string(),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port.to_string(),
            "--health-check",
            "on",
        ]);
        if rank == 1 {
            r = r
                .args(bad_args)
                .arg("--report-json")
                .arg(dir.join("report1.json"));
            for (k, v) in bad_env {
                r = r.env(k, v);
            }
        }
        match python {
            true => r.arg(&script).arg(dir.path()),
            false => r
                .args(["--no-python", "sh", "-c", WORKER, "sh"])
                .arg(dir.path()),
        }
        .spawn()
    };
    let (a, b) = (agent(0), agent(1));
    [a.wait(), b.wait()]
}

fn assert_bad_node_pair(dir: &TempDir, outs: &[Output; 2], check: &str, took: Duration) {
    let host = hostname();
    // The bad node: 75, one line naming the node and the check.
    outs[1].assert_code(75);
    let line = format!(
        "rdrun: error: {} failed the health check: {check}: ",
        rdrun::health::node_phrase(&host)
    );
    assert!(outs[1].stderr.contains(&line), "{outs:?}");
    assert!(
        outs[1]
            .stderr
            .contains("no worker started (exit 75: bad node, requeue elsewhere)"),
        "{outs:?}"
    );
    // The healthy node ends too, naming the bad one, without waiting for its timeout.
    outs[0].assert_code(1);
    assert!(
        outs[0].stderr.contains(&format!(
            "the job ended: {} failed the health check: {check}",
            rdrun::health::node_phrase(&host)
        )),
        "{outs:?}"
    );
    assert!(took < Duration::from_secs(60), "took {took:?}: {outs:?}");
    assert_eq!(started(dir.path()), Vec::<String>::new(), "{outs:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report1.json")).unwrap()).unwrap();
    assert_eq!(json["exit_code"], 75, "{json}");
    assert_eq!(json["root_cause_kind"], "bad_node", "{json}");
    assert_eq!(json["bad_node"]["node"], host.as_str(), "{json}");
    assert_eq!(
        json["bad_node"]["failed_checks"][0]["check"], check,
        "{json}"
    );
}

#[test]
fn static_job_with_a_failing_check_command_fails_fast_naming_the_node() {
    let dir = TempDir::new("health_static_cmd");
    let t0 = Instant::now();
    let outs = static_pair(
        &dir,
        &[
            "--health-check-cmd",
            "echo 'GPU 3 fell off the bus'; exit 1",
        ],
        &[],
        false,
    );
    assert_bad_node_pair(&dir, &outs, "command", t0.elapsed());
    assert!(
        outs[1].stderr.contains("GPU 3 fell off the bus"),
        "{outs:?}"
    );
}

#[test]
fn static_job_with_a_broken_interpreter_fails_fast_naming_the_node() {
    let dir = TempDir::new("health_static_python");
    let py = broken_python(dir.path());
    let t0 = Instant::now();
    let outs = static_pair(&dir, &[], &[("PYTHON_EXEC", &py)], true);
    assert_bad_node_pair(&dir, &outs, "interpreter", t0.elapsed());
    assert!(outs[1].stderr.contains("does not start"), "{outs:?}");
}

#[test]
fn a_broken_interpreter_on_one_node_fails_before_any_worker() {
    let dir = TempDir::new("health_single_python");
    let py = broken_python(dir.path());
    let script = dir.join("t.py");
    std::fs::write(&script, "print('ran')\n").unwrap();
    let run = |mode: &str| {
        Rdrun::new()
            .env("PYTHON_EXEC", &py)
            .args(["--standalone", "--nproc-per-node=2", "--health-check", mode])
            .arg(&script)
            .run()
    };
    let out = run("on");
    out.assert_code(75);
    assert!(
        out.stderr
            .contains("failed the health check: interpreter: "),
        "{out:?}"
    );
    // The contrast: without the check, every rank fails to start (a launcher failure).
    let out = run("off");
    out.assert_code(1);
    assert!(!out.stderr.contains("health check"), "{out:?}");
}

#[test]
fn warn_only_warns() {
    let dir = TempDir::new("health_warn");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=2"])
        .args(["--health-check-cmd", "echo flaky; exit 2"])
        .args(["--no-python", "sh", "-c", WORKER, "sh"])
        .arg(dir.path())
        .run();
    out.assert_code(0);
    assert!(
        out.stderr.contains(
            "failed the health check: command: \"echo flaky; exit 2\" failed (exit 2: flaky) (--health-check warn: going on)"
        ),
        "{out:?}"
    );
    assert_eq!(started(dir.path()), ["started.0", "started.1"]);
    // off: the command does not even run.
    let marker = dir.join("ran");
    Rdrun::new()
        .args(["--standalone", "--health-check=off", "--health-check-cmd"])
        .arg(format!("touch {}", marker.display()))
        .args(["--no-python", "true"])
        .run()
        .assert_code(0);
    assert!(!marker.exists());
}

/// Under `warn` the checks run beside the workers instead of before them: the check command
/// sees the marker a worker writes, and the worker sees the check's answer. Run one after the
/// other, the check would give up waiting (exit 0: no warning) before any worker started.
#[test]
fn warn_checks_run_beside_the_workers() {
    let dir = TempDir::new("health_beside");
    let (marker, seen) = (dir.join("worker-started"), dir.join("check-saw-it"));
    let check = format!(
        "for i in $(seq 600); do [ -e {m} ] && {{ touch {s}; exit 3; }}; sleep 0.05; done; exit 0",
        m = marker.display(),
        s = seen.display()
    );
    let worker = format!(
        "touch {m}; for i in $(seq 600); do [ -e {s} ] && exit 0; sleep 0.05; done; exit 1",
        m = marker.display(),
        s = seen.display()
    );
    let out = Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--health-check-timeout=60",
        ])
        .arg("--health-check-cmd")
        .arg(&check)
        .args(["--no-python", "sh", "-c"])
        .arg(&worker)
        .run();
    out.assert_code(0);
    assert!(out.stderr.contains("failed (exit 3"), "{out:?}");
    assert!(
        out.stderr.contains("(--health-check warn: going on)"),
        "{out:?}"
    );
}

/// Under `--health-check on` with warm start, the interpreter check imports the preload list:
/// a node whose interpreter cannot is a bad node (exit 75) before any worker starts, the module
/// named once; under the default `warn` the check does not import it (warm start names it).
#[test]
fn a_preload_the_interpreter_cannot_import_is_a_bad_node_under_on() {
    let dir = TempDir::new("health_preload");
    let script = dir.join("w.py");
    std::fs::write(&script, "import os, sys\nopen(os.path.join(sys.argv[1], 'started.' + os.environ['RANK']), 'w').close()\n").unwrap();
    let out = Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .args(["--standalone", "--health-check=on", "--warm-start=on"])
        .args(["--preload", "no_such_module_xyz"])
        .arg(&script)
        .arg(dir.path())
        .run();
    out.assert_code(75);
    assert!(
        out.stderr.contains("cannot import no_such_module_xyz:"),
        "{out:?}"
    );
    assert_eq!(started(dir.path()), Vec::<String>::new());
}

/// A `warn` check still running when the job ends is waited for a few seconds, then cancelled:
/// rdrun exits with the job's status and the check's processes are gone.
#[test]
fn a_warn_check_outlived_by_the_job_is_cancelled_and_leaves_nothing() {
    let dir = TempDir::new("health_outlived");
    let pidfile = dir.join("pid");
    let out = Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .args(["--standalone", "--health-check-timeout=600"])
        .arg("--health-check-cmd")
        .arg(format!("echo $$ > {}; exec sleep 600", pidfile.display()))
        .args(["--no-python", "sh", "-c", "exit 4"])
        .run();
    out.assert_code(4);
    assert_gone(&pidfile);
}

/// A node whose clock is 30 s ahead of the store host's (libfaketime preloaded into that agent
/// only) fails the `clock` check: a bad node before any worker, the offset named; the store
/// host's node ends too, naming it.
#[test]
fn a_node_whose_clock_is_off_is_a_bad_node() {
    let Some(lib) = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists()) else {
        eprintln!("skipped: libfaketime is not installed (scripts/ensure-deps.sh installs it)");
        return;
    };
    let dir = TempDir::new("health_clock");
    let t0 = Instant::now();
    let outs = static_pair(
        &dir,
        &[],
        &[("LD_PRELOAD", lib), ("FAKETIME", Path::new("+30s"))],
        false,
    );
    assert_bad_node_pair(&dir, &outs, "clock", t0.elapsed());
    assert!(
        outs[1].stderr.contains("ahead of the store host")
            && outs[1].stderr.contains("more than 1s"),
        "{outs:?}"
    );
}

#[test]
fn a_hanging_check_command_is_killed_at_its_bound_and_counts_as_unhealthy() {
    let dir = TempDir::new("health_hang");
    let pidfile = dir.join("pid");
    let t0 = Instant::now();
    let out = Rdrun::new()
        .args([
            "--standalone",
            "--health-check=on",
            "--health-check-timeout=1",
        ])
        .arg("--health-check-cmd")
        .arg(format!("echo $$ > {}; exec sleep 600", pidfile.display()))
        .args(["--no-python", "sh", "-c", WORKER, "sh"])
        .arg(dir.path())
        .run();
    out.assert_code(75);
    assert!(
        out.stderr.contains("no answer within 1.0 s (killed)"),
        "{out:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{out:?}");
    assert_gone(&pidfile);
    assert_eq!(started(dir.path()), Vec::<String>::new());
}

#[test]
fn an_unhealthy_elastic_node_does_not_join_and_the_others_run() {
    let dir = TempDir::new("health_elastic");
    let port = free_port();
    let agent = |h: usize| {
        let mut r = Rdrun::new().timeout(AGENT_TIMEOUT).args([
            "--nnodes",
            "2:3",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &format!("127.0.0.1:{port}"),
            "--rdzv-id",
            "healthjob",
            "--rdzv-conf",
            &format!("last_call_timeout=3,join_timeout=6,is_host={}", h == 1),
            "--local-addr",
            &format!("127.0.0.{h}"),
            "--nproc-per-node",
            "1",
            "--health-check",
            "on",
        ]);
        if h == 3 {
            r = r.args(["--health-check-cmd", "echo not today; exit 1"]);
        }
        r.args(["--no-python", "sh", "-c", WORKER, "sh"])
            .arg(dir.path())
            .spawn()
    };
    let runs: Vec<_> = (1..=3).map(agent).collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    outs[0].assert_code(0);
    outs[1].assert_code(0);
    // The unhealthy node kept checking after a back-off, then gave up at the join timeout.
    outs[2].assert_code(75);
    assert!(
        outs[2]
            .stderr
            .contains("not joining, checking again in 1 s"),
        "{outs:?}"
    );
    assert!(
        outs[2]
            .stderr
            .contains("not joining, checking again in 2 s"),
        "{outs:?}"
    );
    // The job ran on two nodes.
    assert_eq!(started(dir.path()), ["started.0", "started.1"], "{outs:?}");
    let gws = std::fs::read_to_string(dir.join("started.0")).unwrap();
    assert_eq!(gws.trim(), "2");
}

/// A small tmpfs mounted by the test (root only; skipped otherwise), unmounted on drop.
struct SmallTmpfs(std::path::PathBuf);

impl SmallTmpfs {
    fn mount(at: std::path::PathBuf, size: &str) -> Option<SmallTmpfs> {
        std::fs::create_dir_all(&at).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallTmpfs(at))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_log_dir_is_a_bad_node() {
    let dir = TempDir::new("health_full_log_dir");
    let Some(fs) = SmallTmpfs::mount(dir.join("small"), "4m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let logs = fs.0.join("logs");
    let run = |mode: &str| {
        Rdrun::new()
            .args(["--standalone", "--nproc-per-node=2", "--health-check", mode])
            .arg("--log-dir")
            .arg(&logs)
            .args(["--no-python", "sh", "-c", WORKER, "sh"])
            .arg(dir.path())
            .run()
    };
    let out = run("on");
    out.assert_code(75);
    let want = format!("log-dir: 4 MiB free in {} (need 100 MiB)", fs.0.display());
    assert!(out.stderr.contains(&want), "{out:?}");
    assert_eq!(started(dir.path()), Vec::<String>::new());
    // warn: the same finding, the job runs (its logs fit). The checks run beside the workers,
    // whose log files may already take a MiB of the 4.
    let out = run("warn");
    out.assert_code(0);
    // (the nearest existing directory of the log dir: the mount, or the log dir once made).
    let finding = out
        .stderr
        .split("log-dir: ")
        .nth(1)
        .and_then(|rest| rest.split_once(" MiB free in "))
        .map(|(n, rest)| (n.parse::<u64>().ok(), rest.lines().next().unwrap_or("")));
    let Some((free, rest)) = finding else {
        panic!("no log-dir finding: {out:?}");
    };
    assert!(matches!(free, Some(0..=4)), "{out:?}");
    assert!(rest.starts_with(&fs.0.display().to_string()), "{out:?}");
    assert!(rest.contains(" (need 100 MiB)"), "{out:?}");
    drop(fs);
}

/// A `--checkpoint-dir` on a file system without 1 GiB free makes the node bad under `on`
/// (before any worker), naming the check and the directory.
#[test]
fn a_full_checkpoint_dir_is_a_bad_node() {
    let dir = TempDir::new("health_full_ckpt");
    let Some(fs) = SmallTmpfs::mount(dir.join("small"), "4m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=2", "--health-check", "on"])
        .arg("--checkpoint-dir")
        .arg(fs.0.join("ckpt"))
        .args(["--no-python", "sh", "-c", WORKER, "sh"])
        .arg(dir.path())
        .run();
    out.assert_code(75);
    let want = format!(
        "checkpoint-dir: 4 MiB free in {} (need 1024 MiB)",
        fs.0.display()
    );
    assert!(out.stderr.contains(&want), "{out:?}");
    assert_eq!(started(dir.path()), Vec::<String>::new());
    drop(fs);
}

/// Whether this test may give rdrun a host name of its own (`unshare --uts`: root).
fn can_set_hostname() -> bool {
    std::process::Command::new("unshare")
        .args(["--uts", "hostname", "rdrun-probe"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The failure memory through a file, across two jobs (issue 28 item 4, the file part): job 1's
/// bad node writes its name to `--bad-nodes-file`; job 2 reads it with `--exclude-nodes-from`:
/// that node stays out (exit 75, even under the default warn, without its failing check), any
/// other node runs.
#[test]
fn a_bad_node_is_remembered_into_the_next_job() {
    if !can_set_hostname() {
        eprintln!("skipped: a host name of rdrun's own needs unshare --uts (root)");
        return;
    }
    let dir = TempDir::new("health_memory");
    let bad_file = dir.join("bad-nodes");
    // Job 1: a static pair; node 1 (host "rdrun-bad-1") fails its check.
    let port = free_port();
    let agent = |rank: usize, host: &str, extra: &[&str]| {
        Rdrun::new()
            .timeout(AGENT_TIMEOUT)
            .hostname(host)
            .args([
                "--nnodes",
                "2",
                "--node-rank",
                &rank.to_string(),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port.to_string(),
                "--health-check",
                "on",
            ])
            .arg("--bad-nodes-file")
            .arg(&bad_file)
            .args(extra)
            .args(["--no-python", "sh", "-c", WORKER, "sh"])
            .arg(dir.path())
            .spawn()
    };
    let a = agent(0, "rdrun-good-0", &[]);
    let b = agent(1, "rdrun-bad-1", &["--health-check-cmd", "exit 1"]);
    let outs = [a.wait(), b.wait()];
    outs[1].assert_code(75);
    assert!(
        outs[1]
            .stderr
            .contains("node rdrun-bad-1 failed the health check: command"),
        "{outs:?}"
    );
    outs[0].assert_code(1);
    // Only the bad node is remembered, once.
    assert_eq!(
        std::fs::read_to_string(&bad_file).unwrap(),
        "rdrun-bad-1\n",
        "{outs:?}"
    );
    // Job 2 reads the file: the remembered node stays out before any check runs...
    let job2 = |host: &str| {
        Rdrun::new()
            .hostname(host)
            .args(["--standalone", "--nproc-per-node=1"])
            .arg("--exclude-nodes-from")
            .arg(&bad_file)
            .arg("--bad-nodes-file")
            .arg(&bad_file)
            .args(["--no-python", "sh", "-c", WORKER, "sh"])
            .arg(dir.path())
            .run()
    };
    let out = job2("rdrun-bad-1");
    out.assert_code(75);
    let want = format!(
        "node rdrun-bad-1 failed the health check: excluded: listed in {}",
        bad_file.display()
    );
    assert!(out.stderr.contains(&want), "{out:?}");
    assert_eq!(started(dir.path()), Vec::<String>::new());
    // ...and a node not on it runs.
    job2("rdrun-good-0").assert_code(0);
    assert_eq!(started(dir.path()), ["started.0"]);
    assert_eq!(std::fs::read_to_string(&bad_file).unwrap(), "rdrun-bad-1\n");
}

/// `--print-topology=json` carries a `health` member: the settings of issue 28 and this node's
/// verdicts (none under `--health-check off`), so a tool reads them without parsing text.
#[test]
fn json_topology_has_a_health_block() {
    let out = Rdrun::new()
        .args(["--print-topology=json", "--nproc-per-node", "2"])
        .args(["--health-check-cmd", "echo site check; exit 4"])
        .args(["--network-check", "on", "--max-node-failures", "3"])
        .args(["--no-python", "true"])
        .run();
    out.assert_code(0);
    let j: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON document");
    let h = &j["health"];
    assert_eq!(h["mode"], "warn", "{h}");
    assert_eq!(h["healthy"], false, "{h}");
    assert_eq!(h["network_check"], true, "{h}");
    assert_eq!(h["max_node_failures"], 3, "{h}");
    let cmd = h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "command")
        .unwrap_or_else(|| panic!("no command check in {h}"));
    assert_eq!(cmd["status"], "failed", "{h}");
    assert!(
        cmd["detail"].as_str().unwrap().contains("site check"),
        "{h}"
    );
    // The topology is still there.
    assert!(j["run"].is_object(), "{j}");
    let off = Rdrun::new()
        .args([
            "--print-topology=json",
            "--health-check",
            "off",
            "--no-python",
            "true",
        ])
        .run();
    off.assert_code(0);
    let j: serde_json::Value = serde_json::from_str(off.stdout.trim()).unwrap();
    assert_eq!(j["health"]["mode"], "off");
    assert!(j["health"]["checks"].is_null(), "{j}");
    assert_eq!(j["health"]["network_check"], false);
}

/// rdrun with `args` under a 512 MiB data limit (`ulimit -d`), so that a read without end fails
/// in a moment instead of taking the machine's memory; stdin closed, hard-bounded.
fn run_with_data_limit(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "ulimit -d 524288 && exec \"$0\" \"$@\""])
        .arg(crate::util::rdrun_bin())
        .args(args)
        .env_remove("RUST_LOG");
    crate::util::output_with_stdin(&mut cmd, b"", AGENT_TIMEOUT)
}

/// Issue 38.12: a node-list file is read within a bound. `--exclude-nodes-from /dev/zero` (a
/// file without end) fails at once with one line naming the flag and the file (exit 2), and a
/// `--bad-nodes-file` that reads without end (`/dev/full`) costs the bad node one error line
/// naming it, not its memory: the run still ends as a bad node (75). Before, both read until
/// memory ran out.
#[test]
fn node_list_files_are_read_within_a_bound() {
    let out = run_with_data_limit(&["--exclude-nodes-from", "/dev/zero", "--no-python", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "rdrun: error: --exclude-nodes-from '/dev/zero': longer than 16 MiB, more than a list of 65536 hosts holds\n"
    );
    let out = run_with_data_limit(&[
        "--standalone",
        "--health-check=on",
        "--health-check-cmd",
        "exit 1",
        "--bad-nodes-file",
        "/dev/full",
        "--no-python",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--bad-nodes-file"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].ends_with(&format!(
            "ERROR --bad-nodes-file: cannot add {} to /dev/full: longer than 16 MiB, more than a list of 65536 hosts holds",
            hostname()
        )),
        "{stderr}"
    );
}

/// Issue 38 item 17: hosts named `node1` and `node2` (as many clusters name them): the bad node
/// says `node2 failed the health check`, the other `the job ended: node2 failed …` (they said
/// `node node2 failed …` and `the job node node2 failed …`).
#[test]
fn a_host_named_node2_is_not_called_node_node2() {
    if !can_set_hostname() {
        eprintln!("skipped: a host name of rdrun's own needs unshare --uts (root)");
        return;
    }
    let dir = TempDir::new("health_node2");
    let port = free_port();
    let agent = |rank: usize, host: &str, extra: &[&str]| {
        Rdrun::new()
            .timeout(AGENT_TIMEOUT)
            .hostname(host)
            .args(["--nnodes", "2", "--node-rank", &rank.to_string()])
            .args([
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port.to_string(),
            ])
            .args(["--health-check", "on"])
            .args(extra)
            .args(["--no-python", "sh", "-c", WORKER, "sh"])
            .arg(dir.path())
            .spawn()
    };
    let a = agent(0, "node1", &[]);
    let b = agent(1, "node2", &["--health-check-cmd", "exit 1"]);
    let outs = [a.wait(), b.wait()];
    outs[1].assert_code(75);
    assert!(
        outs[1]
            .stderr
            .contains("rdrun: error: node2 failed the health check: command"),
        "{outs:?}"
    );
    outs[0].assert_code(1);
    assert!(
        outs[0]
            .stderr
            .contains("the job ended: node2 failed the health check: command"),
        "{outs:?}"
    );
    for out in &outs {
        assert!(!out.stderr.contains("node node2"), "{outs:?}");
        assert!(!out.stderr.contains("job node"), "{outs:?}");
    }
}
