//! Health-check programs contained like workers (issue 38 item 11): whatever a check's program
//! starts — a `setsid` child, out of its process group — ends when the check does (passed,
//! failed, killed at its bound, under `--dry-run`), and a check still running when rdrun is
//! SIGKILLed dies with it (`warn` and `on`). Pids are read from files the checks write and
//! checked (and killed, if a test fails) by PID.

use std::time::Duration;

use crate::util::{Rdrun, TempDir};

/// Hard bound on one rdrun.
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether rdrun can contain processes in a cgroup here (root with a writable cgroup v2 or v1
/// freezer hierarchy, as CI); without one only a check's own process group is guaranteed to end
/// with it (docs/containment.md), and its `setsid` child is not checked.
fn cgroups_usable() -> bool {
    use rdrun::supervisor::group::contain;
    // SAFETY: geteuid(2) has no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && std::env::var(contain::ENV).map_or(true, |v| v != "off")
        && contain::parents(contain::Mode::Auto).iter().any(|p| {
            let probe = p.join(format!("rdrun-health-probe-{}", std::process::id()));
            let made = std::fs::create_dir(&probe).is_ok();
            let _ = std::fs::remove_dir(&probe);
            made
        });
    if !ok {
        eprintln!("note: no cgroup rdrun may create here; a check's setsid child is not checked");
    }
    ok
}

/// A check command that starts a `setsid` child (its own session: out of the check's process
/// group) writing its pid to `DIR/gpid`, waits until that file is there, writes its own pid to
/// `DIR/pid`, then runs `then`.
fn escaping_check(dir: &TempDir, then: &str) -> String {
    let d = dir.path().display();
    format!(
        "setsid sh -c 'echo $$ > {d}/gpid.tmp && mv {d}/gpid.tmp {d}/gpid && exec sleep 600' & \
         while [ ! -e {d}/gpid ]; do sleep 0.01; done; echo $$ > {d}/pid; {then}"
    )
}

/// The pids a check wrote (`DIR/pid`, and `DIR/gpid` when `setsid_too`).
fn check_pids(dir: &TempDir, setsid_too: bool) -> Vec<i32> {
    let mut names = vec!["pid"];
    if setsid_too {
        names.push("gpid");
    }
    names
        .iter()
        .map(|n| crate::util::read_pid(&dir.join(n)))
        .collect()
}

/// Issue 38.11: what a check starts ends with the check, whether it passed, failed or was
/// killed at `--health-check-timeout`, and under `--dry-run`: its `setsid` child (out of its
/// process group) is gone before the workers start or rdrun exits. Before, it lived on.
#[test]
fn what_a_check_starts_ends_with_the_check() {
    let setsid_too = cgroups_usable();
    // (what the check does after starting its child, mode flags, expected exit code)
    let cases: [(&str, &[&str], i32); 4] = [
        ("exit 0", &["--health-check=on"], 0),
        ("exit 1", &["--health-check=on"], 75),
        (
            "exec sleep 600",
            &["--health-check=on", "--health-check-timeout=2"],
            75,
        ),
        ("exit 0", &["--dry-run"], 0),
    ];
    for (then, flags, code) in cases {
        let dir = TempDir::new("health_check_children");
        let gpid = dir.join("gpid");
        // The worker says whether the check's setsid child is still there when it runs.
        let probe = format!(
            "if kill -0 \"$(cat {})\" 2>/dev/null; then echo child-alive; else echo child-gone; fi",
            gpid.display()
        );
        let out = Rdrun::new()
            .timeout(AGENT_TIMEOUT)
            .arg("--standalone")
            .args(flags)
            .arg("--health-check-cmd")
            .arg(escaping_check(&dir, then))
            .args(["--no-python", "sh", "-c", &probe])
            .run();
        let pids = check_pids(&dir, setsid_too);
        crate::util::assert_no_leak(&pids, Duration::from_secs(15));
        out.assert_code(code);
        if code == 0 && flags != ["--dry-run"] && setsid_too {
            assert!(out.stdout.contains("child-gone"), "{then}: {out:?}");
        }
    }
}

/// Issue 38.11: a check still running when rdrun is SIGKILLed dies with it, under `warn` (the
/// checks beside the workers) and `on` (before them), its `setsid` child too. Before, both
/// lived on.
#[test]
fn a_check_running_when_rdrun_is_killed_dies_with_it() {
    let setsid_too = cgroups_usable();
    for mode in ["warn", "on"] {
        let dir = TempDir::new("health_check_killed");
        let run = Rdrun::new()
            .timeout(AGENT_TIMEOUT)
            .args(["--standalone", "--health-check-timeout=600"])
            .arg(format!("--health-check={mode}"))
            .arg("--health-check-cmd")
            .arg(escaping_check(&dir, "exec sleep 600"))
            .args(["--no-python", "sleep", "600"])
            .spawn();
        assert!(
            crate::util::wait_for_file(&dir.join("pid"), Duration::from_secs(60)),
            "the check never started ({mode})"
        );
        run.signal(libc::SIGKILL);
        let out = run.wait();
        assert_eq!(out.signal, Some(libc::SIGKILL), "{out:?}");
        let pids = check_pids(&dir, setsid_too);
        crate::util::assert_no_leak(&pids, Duration::from_secs(15));
    }
}
