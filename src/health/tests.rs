//! Unit tests of `health/`: each check's verdict against made-up inputs, and every program
//! check's time bound.

use std::time::{Duration, Instant};

use super::checks::{self, Thresholds};
use super::command::{describe, run_bounded, Ran};
use super::*;

fn inputs() -> Inputs {
    Inputs {
        preload: Vec::new(),
        python: None,
        log_dir: None,
        checkpoint_dir: None,
        nproc: 2,
        nics: Vec::new(),
        cuda_visible: None,
        path: None,
        command: None,
        timeout: Duration::from_secs(10),
        thresholds: Thresholds::default(),
        contain: None,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_hanging_command_is_killed_at_its_bound_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut i = inputs();
    i.timeout = Duration::from_millis(500);
    // The command and a grandchild it forks: both are in the killed process group.
    i.command = Some(format!(
        "echo starting; sleep 100 & echo $! > {}; wait",
        pidfile.display()
    ));
    let t0 = Instant::now();
    let v = rt().block_on(checks::command(&i)).unwrap();
    let took = t0.elapsed();
    assert_eq!(v.status, Status::Failed, "{v}");
    assert!(v.detail.contains("no answer within 0.5 s (killed)"), "{v}");
    assert!(v.detail.contains("starting"), "{v}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild got SIGKILL with the group; it is gone once reaped by its parent (the test
    // process is no subreaper, so init reaps it: wait with a bound).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        assert!(Instant::now() < deadline, "grandchild {pid} survived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 38.11: what a check left in its process group (a background job) is killed when the
/// check ends, also when it passed: a check is done when its program is. (A `setsid` child, out
/// of the group, is its cgroup's: `launcher-tests/health.rs`.)
#[test]
fn a_passing_check_leaves_nothing_in_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut i = inputs();
    i.command = Some(format!(
        "sleep 600 & echo $! > {}; exit 0",
        pidfile.display()
    ));
    let v = rt().block_on(checks::command(&i)).unwrap();
    assert_eq!(v.status, Status::Ok, "{v}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        if Instant::now() >= deadline {
            // SAFETY: kill(2) of the pid the check wrote, so that a failing test cleans up.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the check's background job {pid} survived");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn command_verdicts_show_the_exit_and_the_output() {
    let mut i = inputs();
    i.command = Some("echo ok-line; exit 0".into());
    let v = rt().block_on(checks::command(&i)).unwrap();
    assert_eq!(v.status, Status::Ok, "{v}");
    i.command = Some("echo 'GPU 3 lost' >&2; exit 4".into());
    let v = rt().block_on(checks::command(&i)).unwrap();
    assert_eq!(v.status, Status::Failed, "{v}");
    assert!(v.detail.contains("exit 4: GPU 3 lost"), "{v}");
    i.command = None;
    assert!(rt().block_on(checks::command(&i)).is_none());
}

#[test]
fn runner_outcomes() {
    let b = Duration::from_secs(5);
    let ran = rt().block_on(run_bounded("/nonexistent/prog", &[], b, &None));
    assert!(matches!(ran, Ran::NotStarted(_)), "{ran:?}");
    assert!(describe(&ran, b).starts_with("cannot start: "));
    let ran = rt().block_on(run_bounded("/bin/sh", &["-c", "kill -9 $$"], b, &None));
    assert_eq!(describe(&ran, b), "killed by a signal");
    // Only the last lines are kept.
    let ran = rt().block_on(run_bounded(
        "/bin/sh",
        &["-c", "seq 1 100; exit 2"],
        b,
        &None,
    ));
    assert_eq!(describe(&ran, b), "exit 2: 96 | 97 | 98 | 99 | 100");
}

#[test]
fn interpreter_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut i = inputs();
    let v = rt().block_on(checks::interpreter(&i));
    assert_eq!(v.status, Status::Skipped);
    // A venv whose interpreter is broken: a script whose own interpreter is missing.
    use std::os::unix::fs::PermissionsExt;
    let broken = dir.path().join("python");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    i.python = Some(broken);
    let v = rt().block_on(checks::interpreter(&i));
    assert_eq!(v.status, Status::Failed, "{v}");
    assert!(v.detail.contains("does not start: cannot start"), "{v}");
    // One that starts (a stand-in that exits 0 whatever its arguments).
    let good = dir.path().join("good");
    std::fs::write(&good, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o755)).unwrap();
    i.python = Some(good);
    assert_eq!(rt().block_on(checks::interpreter(&i)).status, Status::Ok);
}

#[test]
fn memory_and_space_floors() {
    let mut i = inputs();
    i.nproc = 4;
    let v = checks::memory(&i, "MemTotal: 1 kB\nMemAvailable:    2097152 kB\n");
    assert_eq!(v.status, Status::Ok, "{v}"); // 2 GiB >= 4 x 64 MiB
    i.nproc = 64;
    let v = checks::memory(&i, "MemAvailable:    2097152 kB\n");
    assert_eq!(v.status, Status::Failed, "{v}");
    assert!(
        v.detail
            .contains("2048 MiB available (need 4096 MiB for 64 workers)"),
        "{v}"
    );
    assert_eq!(checks::memory(&i, "").status, Status::Skipped);
    // Space: a floor above any disk fails, zero passes; the nearest existing parent is read.
    let dir = tempfile::tempdir().unwrap();
    i.log_dir = Some(dir.path().join("not/yet/made"));
    i.thresholds.log_dir_free = 0;
    assert_eq!(checks::log_dir(&i).status, Status::Ok);
    i.thresholds.log_dir_free = u64::MAX;
    let v = checks::log_dir(&i);
    assert_eq!(v.status, Status::Failed, "{v}");
    assert!(v.detail.contains(&dir.path().display().to_string()), "{v}");
    // --checkpoint-dir: the same rule with its own floor; skipped without the flag.
    assert_eq!(checks::checkpoint_dir(&i).status, Status::Skipped);
    i.checkpoint_dir = Some(dir.path().join("ckpt"));
    i.thresholds.checkpoint_dir_free = 0;
    assert_eq!(checks::checkpoint_dir(&i).status, Status::Ok);
    i.thresholds.checkpoint_dir_free = u64::MAX;
    let v = checks::checkpoint_dir(&i);
    assert_eq!(
        (v.check, v.status),
        ("checkpoint-dir", Status::Failed),
        "{v}"
    );
    assert!(v.detail.contains(&dir.path().display().to_string()), "{v}");
    i.thresholds.shm_per_worker = u64::MAX / 64;
    assert_eq!(checks::shm(&i, dir.path()).status, Status::Failed);
    i.thresholds.shm_per_worker = 0;
    assert_eq!(checks::shm(&i, dir.path()).status, Status::Ok);
    assert_eq!(
        checks::shm(&i, &dir.path().join("missing")).status,
        Status::Failed
    );
}

#[test]
fn nic_names_follow_nccl_syntax() {
    let sys = tempfile::tempdir().unwrap();
    for (name, state) in [
        ("lo", "unknown"),
        ("eth0", "up"),
        ("eth1", "down"),
        ("ib0", "down"),
    ] {
        std::fs::create_dir(sys.path().join(name)).unwrap();
        std::fs::write(
            sys.path().join(name).join("operstate"),
            format!("{state}\n"),
        )
        .unwrap();
    }
    let check = |value: &str| {
        let mut i = inputs();
        i.nics = vec![("NCCL_SOCKET_IFNAME", value.to_string())];
        checks::nics(&i, sys.path())
    };
    assert_eq!(check("eth").status, Status::Ok); // a prefix: eth0 is up
    assert_eq!(check("lo").status, Status::Ok);
    assert_eq!(check("=eth0").status, Status::Ok);
    let v = check("=eth1");
    assert_eq!(v.status, Status::Failed);
    assert!(v.detail.contains("=eth1 is eth1 down"), "{v}");
    let v = check("eth0,ib");
    assert_eq!(v.status, Status::Failed);
    assert!(
        v.detail.contains("NCCL_SOCKET_IFNAME: ib is ib0 down"),
        "{v}"
    );
    let v = check("=wlan0");
    assert!(v.detail.contains("no interface =wlan0"), "{v}");
    assert_eq!(check("^docker,lo").status, Status::Skipped);
    assert_eq!(checks::nics(&inputs(), sys.path()).status, Status::Skipped);
}

#[test]
fn gpus_without_nvidia_smi_are_skipped_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let mut i = inputs();
    i.path = Some(dir.path().as_os_str().to_owned());
    let v = rt().block_on(checks::gpus(&i));
    assert_eq!(v.status, Status::Skipped);
    assert!(v.detail.contains("no nvidia-smi"), "{v}");
    // A fake nvidia-smi listing 2 GPUs: enough for 2 workers, not for 4; one that fails.
    use std::os::unix::fs::PermissionsExt;
    let smi = dir.path().join("nvidia-smi");
    let write = |body: &str| {
        std::fs::write(&smi, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write("echo 0; echo 1");
    assert_eq!(rt().block_on(checks::gpus(&i)).status, Status::Ok);
    i.nproc = 4;
    let v = rt().block_on(checks::gpus(&i));
    assert_eq!(v.status, Status::Failed);
    assert!(v.detail.contains("2 visible, --nproc-per-node 4"), "{v}");
    i.nproc = 1;
    i.cuda_visible = Some("".into());
    assert_eq!(rt().block_on(checks::gpus(&i)).status, Status::Ok);
    write("echo 'Unable to determine the device handle for GPU1: Unknown Error'; exit 255");
    let v = rt().block_on(checks::gpus(&i));
    assert_eq!(v.status, Status::Failed);
    assert!(v.detail.contains("exit 255: Unable to determine"), "{v}");
}

#[test]
fn report_lines() {
    let r = HealthReport {
        node: "n1".into(),
        verdicts: vec![
            Verdict {
                check: "nofile",
                status: Status::Ok,
                detail: "open-file limit 4096 (need 1024)".into(),
                took: Duration::ZERO,
            },
            Verdict {
                check: "command",
                status: Status::Failed,
                detail: "\"x\" failed (exit 1)".into(),
                took: Duration::from_millis(3),
            },
        ],
        took: Duration::from_millis(4),
    };
    assert!(!r.healthy());
    assert_eq!(
        r.failure_line().unwrap(),
        "node n1 failed the health check: command: \"x\" failed (exit 1)"
    );
    let text = r.render();
    assert!(text.starts_with("Health checks on n1 (4 ms):\n"), "{text}");
    assert!(
        text.contains("  FAILED  command: \"x\" failed (exit 1) (3 ms)\n"),
        "{text}"
    );
    assert!(text.contains("  ok      nofile: "), "{text}");
}

/// Issue 38 item 17: a host name that already says it is a node is not called `node node2`.
#[test]
fn a_node_named_like_a_node_is_not_named_twice() {
    assert_eq!(node_phrase("n1"), "node n1");
    assert_eq!(node_phrase("gpu-a7"), "node gpu-a7");
    assert_eq!(node_phrase("node2"), "node2");
    assert_eq!(node_phrase("Node-07.cluster"), "Node-07.cluster");
    assert_eq!(node_phrase("nod"), "node nod");
    let r = HealthReport {
        node: "node2".into(),
        verdicts: vec![Verdict {
            check: "command",
            status: Status::Failed,
            detail: "exit 1".into(),
            took: Duration::from_millis(1),
        }],
        took: Duration::from_millis(1),
    };
    assert_eq!(
        r.failure_line().unwrap(),
        "node2 failed the health check: command: exit 1"
    );
}
