//! The stop verdict for deterministic crashes (issue 28 item 5): the same root cause
//! `--max-same-failures` attempts in a row stops the restarts with exit 93 (do not requeue),
//! restarts left or not; a failure that differs resets the count.

use std::path::Path;

use crate::util::{Rdrun, TempDir};

fn has_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .is_ok_and(|s| s.success())
}

/// Each attempt writes `<dir>/attempt.<restart count>`, then raises: always the same
/// `ValueError` at the same line (its message differs: a step number), or by attempt the
/// exceptions of `plan` (`ok` ends the job).
const SCRIPT: &str = r#"import os, sys
d, plan = sys.argv[1], sys.argv[2].split(",")
c = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
open(os.path.join(d, f"attempt.{c}"), "w").close()
what = plan[min(c, len(plan) - 1)]
def fail(kind):
    raise {"value": ValueError, "key": KeyError}[kind](f"step {c * 17}")
if what == "abortvalue":
    # The traceback is printed, then the interpreter aborts at exit (SIGABRT), as torch's
    # teardown abort does after a real exception (issue 38 item 2).
    import atexit
    atexit.register(os.abort)
    what = "value"
if what != "ok":
    fail(what)
"#;

fn launch(dir: &Path, plan: &str, extra: &[&str]) -> crate::util::Output {
    let script = dir.join("same.py");
    std::fs::write(&script, SCRIPT).unwrap();
    Rdrun::new()
        .args(["--standalone", "--nproc-per-node=2", "--max-restarts=5"])
        .args(extra)
        .arg("--no-python")
        .arg("python3")
        .arg(&script)
        .arg(dir)
        .arg(plan)
        .run()
}

fn attempts(dir: &Path) -> usize {
    (0..10)
        .take_while(|c| dir.join(format!("attempt.{c}")).exists())
        .count()
}

#[test]
fn the_same_value_error_twice_stops_with_do_not_requeue() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let dir = TempDir::new("verdict_same");
    let report = dir.join("report.json");
    let events = dir.join("events.jsonl");
    let out = launch(
        dir.path(),
        "value",
        &[
            "--report-json",
            report.to_str().unwrap(),
            "--events",
            events.to_str().unwrap(),
        ],
    );
    out.assert_code(93);
    assert_eq!(attempts(dir.path()), 2, "{out:?}");
    let line = "rdrun: the same failure 2 attempts in a row: ValueError at same.py:7; not restarting (exit 93: do not requeue)";
    assert!(out.stderr.contains(line), "{out:?}");
    // Once, and after the failure block.
    assert_eq!(out.stderr.matches("the same failure").count(), 1, "{out:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["exit_code"], 93, "{json}");
    assert_eq!(
        json["verdict"],
        "the same failure 2 attempts in a row: ValueError at same.py:7; not restarting"
    );
    // The run_end event says it too; one restart happened, none after the second failure.
    let text = std::fs::read_to_string(&events).unwrap();
    let ev: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = ev.last().unwrap();
    assert_eq!(end["event"], "run_end", "{text}");
    assert_eq!(end["exit_code"], 93, "{text}");
    assert_eq!(end["verdict"], json["verdict"], "{text}");
    assert_eq!(
        ev.iter().filter(|e| e["event"] == "restart").count(),
        1,
        "{text}"
    );
}

#[test]
fn different_failures_keep_restarting() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let dir = TempDir::new("verdict_differ");
    // ValueError, KeyError, ValueError, KeyError, then success: never twice in a row.
    let out = launch(dir.path(), "value,key,value,key,ok", &[]);
    out.assert_code(0);
    assert_eq!(attempts(dir.path()), 5, "{out:?}");
    assert!(!out.stderr.contains("the same failure"), "{out:?}");
}

#[test]
fn max_same_failures_counts_and_zero_turns_it_off() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    // Three in a row needed: a different failure in between resets the count.
    let dir = TempDir::new("verdict_three");
    let out = launch(
        dir.path(),
        "value,value,key,key,key",
        &["--max-same-failures=3"],
    );
    out.assert_code(93);
    assert_eq!(attempts(dir.path()), 5, "{out:?}");
    assert!(
        out.stderr
            .contains("the same failure 3 attempts in a row: KeyError at same.py:7"),
        "{out:?}"
    );
    // Off: every restart is used, and the exit is the worker's own (Python's 1).
    let dir = TempDir::new("verdict_off");
    let out = launch(dir.path(), "value", &["--max-same-failures=0"]);
    out.assert_code(1);
    assert_eq!(attempts(dir.path()), 6, "{out:?}");
}

#[test]
fn the_same_exit_status_without_a_traceback() {
    let dir = TempDir::new("verdict_status");
    // Exit 3 every attempt, no traceback: the verdict names the status.
    let script = r#"c=$TORCHELASTIC_RESTART_COUNT; : > "$1/attempt.$c"; exit 3"#;
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=1", "--max-restarts=5"])
        .args(["--no-python", "sh", "-c", script, "sh"])
        .arg(dir.path())
        .run();
    out.assert_code(93);
    assert_eq!(attempts(dir.path()), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("the same failure 2 attempts in a row: exit code 3; not restarting"),
        "{out:?}"
    );
    assert!(Rdrun::new()
        .args(["--max-same-failures=-1", "--no-python", "true"])
        .run()
        .assert_code(2)
        .stderr
        .contains("--max-same-failures"));
}

/// Issue 38 item 2: a rank that printed a traceback and then died of SIGABRT at exit failed the
/// same way as one that exits 1 with that traceback: the traceback decides, so the verdict
/// comes after 2 attempts, not 3.
#[test]
fn a_traceback_then_an_abort_at_exit_is_the_same_failure() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let dir = TempDir::new("verdict_abort");
    let out = launch(dir.path(), "abortvalue,value", &[]);
    out.assert_code(93);
    assert_eq!(attempts(dir.path()), 2, "{out:?}");
    assert!(
        out.stderr
            .contains("the same failure 2 attempts in a row: ValueError at "),
        "{out:?}"
    );
}
