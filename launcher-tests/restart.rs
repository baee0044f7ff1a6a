//! Failures, exit statuses and restarts: the root cause's own status becomes rdrun's (its code,
//! or 128+N for signal N), the first observed failure is the root cause, `--max-restarts` is
//! honoured with TORCHELASTIC_RESTART_COUNT reaching the workers, and a program that cannot be
//! started is a launcher failure (exit 1) naming the program.

use crate::util::{parse_env0, worker, Rdrun, TempDir};

fn launch(nproc: usize) -> Rdrun {
    Rdrun::new()
        .arg("--standalone")
        .arg(format!("--nproc_per_node={nproc}"))
        .arg("--no-python")
}

#[test]
fn success_is_zero() {
    launch(4).arg("true").run().assert_code(0);
}

#[test]
fn worker_exit_code_is_propagated() {
    // (code of the failing worker, rdrun's exit code); 256 wraps to 0 in the kernel and must
    // still be a failure... but a shell cannot exit 256, so the table stays within 1..=255.
    for (code, want) in [(3, 3), (1, 1), (255, 255)] {
        let out = launch(2)
            .arg(worker("exit_with"))
            .arg(code.to_string())
            .run();
        out.assert_code(want);
    }
}

#[test]
fn death_by_signal_is_128_plus_n() {
    for (sig, want) in [("KILL", 137), ("TERM", 143), ("SEGV", 139)] {
        let out = launch(2).arg(worker("exit_with")).arg(sig).arg("1").run();
        out.assert_code(want);
    }
}

#[test]
fn root_cause_is_the_first_failure() {
    // Rank 2 exits 5 at once; the others exit 3 only when rdrun stops them, so they fail later
    // and rdrun must exit with the root cause's 5, not the later 3s.
    let sync = TempDir::new("root_cause_sync");
    let out = launch(4)
        .env("SYNC_DIR", sync.path())
        .arg(worker("exit_with"))
        .args(["5", "2", "3"])
        .run();
    out.assert_code(5);
    let root = out
        .stderr
        .split("Root Cause (first observed failure):")
        .nth(1)
        .unwrap_or_else(|| panic!("no root cause block: {out:?}"));
    assert!(root.contains("rank      : 2 (local_rank: 2)"), "{out:?}");
    assert!(root.contains("exitcode  : 5 (pid: "), "{out:?}");
    // The stopped peers are listed as failures too (they exit 3 from their SIGTERM trap).
    let others = out.stderr.split("Failures:").nth(1).unwrap_or_default();
    let others = others.split("Root Cause").next().unwrap_or_default();
    assert_eq!(others.matches("exitcode  : 3 (pid: ").count(), 3, "{out:?}");
}

#[test]
fn missing_program_is_a_launcher_failure() {
    let dir = TempDir::new("missing_program");
    let missing = dir.join("no-such-program");
    let out = launch(2).arg(&missing).run();
    out.assert_code(1);
    assert!(
        out.stderr.contains("no-such-program"),
        "the error must name the program: {out:?}"
    );
}

#[test]
fn exec_failure_at_spawn_is_a_launcher_failure() {
    // An executable file whose interpreter does not exist passes every check before the spawn;
    // execve itself fails (ENOENT). No worker may be left and no restart is attempted.
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("exec_failure");
    let prog = dir.join("bad-interpreter");
    std::fs::write(&prog, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = launch(2).arg("--max-restarts=3").arg(&prog).run();
    out.assert_code(1);
    assert!(out.stderr.contains("bad-interpreter"), "{out:?}");
    assert!(
        out.stderr.contains("cannot start worker program"),
        "{out:?}"
    );
}

#[test]
fn restart_count_reaches_workers() {
    let dir = TempDir::new("restart_counts");
    // Two same failures in a row: the stop verdict (issue 28.5) is off to see every restart.
    let out = launch(3)
        .arg("--max-restarts=2")
        .arg("--max-same-failures=0")
        .arg(worker("fail_until_restart"))
        .arg("2")
        .arg(dir.path())
        .run();
    out.assert_code(0);
    let mut ports = Vec::new();
    for attempt in 0..3 {
        for lr in 0..3 {
            let path = dir.join(format!("attempt.{lr}.{attempt}"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}: {out:?}", path.display()));
            let env: std::collections::BTreeMap<String, String> = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], attempt.to_string());
            assert_eq!(env["TORCHELASTIC_MAX_RESTARTS"], "2");
            ports.push(env["MASTER_PORT"].clone());
        }
    }
    // One store for the whole run, as torchrun's agent store: the same port every attempt.
    assert!(ports.windows(2).all(|w| w[0] == w[1]), "{ports:?}");
    assert!(!dir.join("attempt.0.3").exists());
}

#[test]
fn restarts_exhausted_fails_with_the_worker_status() {
    let dir = TempDir::new("restarts_exhausted");
    // The same failure twice would be the stop verdict's (its own tests below): off here.
    let out = launch(2)
        .arg("--max-restarts=1")
        .arg("--max-same-failures=0")
        .arg(worker("fail_until_restart"))
        .arg("5")
        .arg(dir.path())
        .run();
    out.assert_code(1);
    for lr in 0..2 {
        assert!(dir.join(format!("attempt.{lr}.0")).exists(), "{out:?}");
        assert!(dir.join(format!("attempt.{lr}.1")).exists(), "{out:?}");
        assert!(!dir.join(format!("attempt.{lr}.2")).exists(), "{out:?}");
    }
}

#[test]
fn no_restart_without_max_restarts() {
    let dir = TempDir::new("no_restart");
    let out = launch(2)
        .arg(worker("fail_until_restart"))
        .arg("1")
        .arg(dir.path())
        .run();
    out.assert_code(1);
    assert!(!dir.join("attempt.0.1").exists(), "{out:?}");
}

#[test]
fn restarted_workers_see_a_fresh_environment() {
    let dir = TempDir::new("restart_env");
    launch(2)
        .arg("--max-restarts=1")
        .arg(worker("fail_until_restart"))
        .arg("1")
        .arg(dir.path())
        .run()
        .assert_code(0);
    let first = std::fs::read_to_string(dir.join("attempt.0.0")).unwrap();
    let second = std::fs::read_to_string(dir.join("attempt.0.1")).unwrap();
    let env = |t: &str| parse_env0(&t.replace('\n', "\0"));
    assert_eq!(
        env(&first)["TORCHELASTIC_RUN_ID"],
        env(&second)["TORCHELASTIC_RUN_ID"]
    );
    assert_eq!(env(&second)["TORCHELASTIC_RESTART_COUNT"], "1");
}

/// Issue 37 item 4: each restart's cost, shown: one line at the default level naming its
/// phases, a `restart_cost` event with them, and the restart's `seconds` in `--report-json`.
#[test]
fn each_restart_shows_what_it_cost() {
    let dir = TempDir::new("restart_cost");
    let events = dir.join("events.jsonl");
    let json = dir.join("report.json");
    let out = with_cost_outputs(&events, &json)
        .arg(worker("fail_until_restart"))
        .arg("1")
        .arg(dir.path())
        .run();
    out.assert_code(0);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" restart 1: ") && !l.contains("back in user code"))
        .collect();
    assert_eq!(lines.len(), 1, "{out:?}");
    let line = lines[0];
    for part in ["s (noticed ", ", stopped ", ", round ", ", started cold "] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(line.contains(" WARN "), "the default level: {line}");
    let (text, cost) = events_named(&events, "restart_cost");
    assert_eq!(cost.len(), 1, "{text}");
    let total = cost[0]["total_s"].as_f64().expect("total_s");
    let parts: f64 = ["noticed_s", "stopped_s", "round_s", "started_s"]
        .iter()
        .map(|k| cost[0][k].as_f64().unwrap_or(f64::NAN))
        .sum();
    assert!((total - parts).abs() < 1e-6 && total > 0.0, "{}", cost[0]);
    assert_eq!(cost[0]["started_cold"], 2, "{}", cost[0]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(
        v["restarts"][0]["seconds"]["total_s"], cost[0]["total_s"],
        "{v}"
    );
}

/// Issue 37 item 4: the failure → every rank of the new attempt back in user code (its first
/// output), one more line at the default level, the `restart_back` event and
/// `--report-json`'s `back_in_user_code_s`, never before the restart's own cost.
#[test]
fn a_restart_says_when_every_rank_is_back_in_user_code() {
    let dir = TempDir::new("restart_back");
    let events = dir.join("events.jsonl");
    let json = dir.join("report.json");
    let script = dir.join("job.sh");
    // Attempt 0: rank 1 fails once both ranks started; attempt 1: every rank prints.
    std::fs::write(
        &script,
        "d=$1; c=$TORCHELASTIC_RESTART_COUNT\n\
         touch \"$d/up.$LOCAL_RANK.$c\"\n\
         if [ \"$c\" = 0 ]; then\n\
           if [ \"$LOCAL_RANK\" = 1 ]; then\n\
             while [ ! -e \"$d/up.0.0\" ]; do sleep 0.02; done\n\
             exit 1\n\
           fi\n\
           sleep 60\n\
         fi\n\
         echo \"back $RANK\"\n",
    )
    .unwrap();
    let out = with_cost_outputs(&events, &json)
        .arg("sh")
        .arg(&script)
        .arg(dir.path())
        .run();
    out.assert_code(0);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" restart 1: back in user code "))
        .collect();
    assert_eq!(lines.len(), 1, "{out:?}");
    assert!(
        lines[0].contains(" WARN "),
        "the default level: {}",
        lines[0]
    );
    let (text, back) = events_named(&events, "restart_back");
    let (_, cost) = events_named(&events, "restart_cost");
    assert_eq!((back.len(), cost.len()), (1, 1), "{text}");
    let secs = back[0]["back_in_user_code_s"].as_f64().expect("seconds");
    assert!(secs >= cost[0]["total_s"].as_f64().unwrap(), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    assert_eq!(
        v["restarts"][0]["seconds"]["back_in_user_code_s"].as_f64(),
        Some(secs),
        "{v}"
    );
}

/// The events file's text and its events named `name`.
fn events_named(path: &std::path::Path, name: &str) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(path).expect("events");
    let found = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == name)
        .collect();
    (text, found)
}

/// Two local ranks, one restart, the events file and the JSON report where the restart's cost
/// shows.
fn with_cost_outputs(events: &std::path::Path, json: &std::path::Path) -> Rdrun {
    launch(2)
        .arg("--max-restarts=1")
        .arg("--events")
        .arg(events)
        .arg("--report-json")
        .arg(json)
}
