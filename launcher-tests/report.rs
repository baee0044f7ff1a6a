//! The failure report from real worker processes through the library API: a Python traceback
//! taken from stderr without `@record`, and an error file written by the worker at the path
//! `RunLogs` gave it, reported, copied to a parent error file, and kept by `finish`.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::SystemTime;

use rdrun::config::LogConfig;
use rdrun::exit::WorkerStatus;
use rdrun::supervisor::output::{RankSink, RunLogs};
use rdrun::supervisor::report::failure::{
    copy_to_parent_error_file, render, to_json, Failure, FailureReport,
};

use crate::output::{console, forward_all, ident, spawn, Scratch};

fn status_of(s: std::process::ExitStatus) -> WorkerStatus {
    match s.signal() {
        Some(n) => WorkerStatus::Signaled(n),
        None => WorkerStatus::Exited(s.code().expect("code")),
    }
}

fn has_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn python_traceback_from_stderr_without_record() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let (c, _out, err) = console();
    let script = "import sys\nprint('loading', file=sys.stderr)\ndef main():\n    raise ValueError('boom')\nmain()\n";
    let (mut w, o, e) = spawn("python3", &["-u", "-c", script], &[]);
    let sink = RankSink {
        stdout_console: true,
        stderr_console: true,
        ..RankSink::default()
    };
    let summary = forward_all(&c, vec![(ident(0), sink, o, e)]).remove(0);
    let status = status_of(w.0.wait().expect("wait"));
    assert_eq!(status, WorkerStatus::Exited(1));
    let tb = summary.traceback.clone().expect("traceback captured");
    assert_eq!(
        tb.first().map(String::as_str),
        Some("Traceback (most recent call last):")
    );
    assert_eq!(tb.last().map(String::as_str), Some("ValueError: boom"));
    assert!(err
        .text()
        .starts_with("loading\nTraceback (most recent call last):\n"));
    let report = FailureReport {
        name: "train.py".into(),
        host: "host".into(),
        failures: vec![Failure {
            local_rank: 0,
            rank: 0,
            pid: w.0.id(),
            status,
            observed_at: SystemTime::now(),
            error_file: None,
            stderr_tail: summary.stderr_tail.clone(),
            traceback: summary.traceback.clone(),
            abandoned: false,
            stop_sent_at: None,
        }],
    }
    .resolve();
    let text = render(&report);
    // W = the longest block line (the traceback's `File "<string>"` line) here, under 60.
    let width = text
        .lines()
        .map(|l| l.chars().count())
        .take(1)
        .sum::<usize>();
    assert!((40..60).contains(&width), "{text}");
    assert!(
        text.starts_with(&format!("{}\ntrain.py FAILED\n", "=".repeat(width))),
        "{text}"
    );
    assert!(
        text.contains("  traceback : Traceback (most recent call last):\n    File \"<string>\", line 5, in <module>\n"),
        "{text}"
    );
    assert!(text.contains("\n  ValueError: boom\n  \n====="), "{text}");
    // The tail holds one more line than the traceback, so it is shown after the block.
    assert!(text.contains("Root cause stderr (last "), "{text}");
    assert!(text.contains("\n  loading\n"), "{text}");
    assert_eq!(to_json(&report).failures[0].message, "ValueError: boom");
}

#[test]
fn error_file_written_by_worker_is_reported_copied_and_kept() {
    let s = Scratch::new("errfile");
    let mut logs = RunLogs::with_temp_root(&LogConfig::default(), "run9", s.0.clone());
    let a = logs.attempt(0, &[ident(0), ident(1)]).expect("attempt");
    let (c, _out, _err) = console();
    // Worker 1 writes the error file as torch's ErrorHandler does, then exits 1; worker 0 exits 0.
    let json = r#"{"message": {"message": "RuntimeError: nccl", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 1\nRuntimeError: nccl\n", "timestamp": "1795972903"}}}"#;
    let mut children = Vec::new();
    let mut workers = Vec::new();
    for (lr, r) in a.ranks.iter().enumerate() {
        let script = if lr == 1 {
            format!("printf '%s' '{json}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1")
        } else {
            "exit 0".to_string()
        };
        let (w, o, e) = spawn(
            "sh",
            &["-c", &script],
            &[("TORCHELASTIC_ERROR_FILE", r.error_file.as_str())],
        );
        children.push(w);
        workers.push((ident(lr), r.sink.clone(), o, e));
    }
    let summaries = forward_all(&c, workers);
    let mut failures = Vec::new();
    for (lr, w) in children.iter_mut().enumerate() {
        let status = status_of(w.0.wait().expect("wait"));
        if !status.success() {
            failures.push(Failure {
                local_rank: lr,
                rank: lr,
                pid: w.0.id(),
                status,
                observed_at: SystemTime::now(),
                error_file: Some(a.ranks[lr].error_file.clone().into()),
                stderr_tail: summaries[lr].stderr_tail.clone(),
                traceback: summaries[lr].traceback.clone(),
                abandoned: false,
                stop_sent_at: None,
            });
        }
    }
    let report = FailureReport {
        name: "t.py".into(),
        host: "host".into(),
        failures,
    }
    .resolve();
    assert_eq!(report.root_cause(), Some(0));
    let text = render(&report);
    let ef = &a.ranks[1].error_file;
    assert!(text.contains(&format!("  error_file: {ef}\n")), "{text}");
    assert!(
        text.contains("  traceback : Traceback (most recent call last):\n    File \"t.py\", line 1\n  RuntimeError: nccl\n  \n"),
        "{text}"
    );
    let parent = s.0.join("parent.json");
    copy_to_parent_error_file(&parent, &report).expect("copy");
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&parent).expect("read")).expect("json");
    assert_eq!(v["message"]["errorCode"], 1);
    assert_eq!(v["message"]["message"], "RuntimeError: nccl");
    // finish keeps the temporary directory only for the error file the report names.
    let run_dir = logs.run_dir().expect("run dir").to_path_buf();
    logs.finish();
    assert!(Path::new(ef).is_file());
    assert!(!run_dir.join("attempt_0/0").exists());
    fs::remove_dir_all(&run_dir).expect("cleanup");
}

#[test]
fn nothing_left_behind_without_log_dir() {
    let s = Scratch::new("noleft");
    let mut logs = RunLogs::with_temp_root(&LogConfig::default(), "run", s.0.clone());
    let a = logs.attempt(0, &[ident(0)]).expect("attempt");
    let (c, out, _) = console();
    let (mut w, o, e) = spawn("sh", &["-c", "echo hi"], &[]);
    forward_all(&c, vec![(ident(0), a.ranks[0].sink.clone(), o, e)]);
    assert!(w.0.wait().expect("wait").success());
    assert_eq!(out.text(), "hi\n");
    logs.finish();
    assert_eq!(fs::read_dir(&s.0).expect("read_dir").count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Through the real binary (needs the supervisor).

use crate::output::rdrun;

#[test]
fn cli_report_block_for_exit_codes() {
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--no-python",
            "sh",
            "-c",
            "echo before >&2; if [ $LOCAL_RANK = 1 ]; then echo dying >&2; exit 3; fi; sleep 30",
        ],
        &[],
    );
    assert_eq!(r.code, Some(3), "{r:?}");
    let e = &r.stderr;
    let eq = "=".repeat(60);
    assert!(
        e.contains(&format!(
            "{eq}\nsh FAILED\n{}\nFailures:\n[1]:\n",
            "-".repeat(60)
        )),
        "{e}"
    );
    assert!(e.contains("  exitcode  : -15 ("), "{e}");
    assert!(
        e.contains(
            ")  (SIGTERM)\n  error_file: <N/A>\n  traceback : Signal 15 (SIGTERM) received by PID "
        ),
        "{e}"
    );
    assert!(
        e.contains("Root Cause (first observed failure):\n[0]:\n"),
        "{e}"
    );
    assert!(
        e.contains("  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: "),
        "{e}"
    );
    assert!(
        e.contains("  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"),
        "{e}"
    );
    assert!(
        e.contains("Root cause stderr (last 2 lines, rank 1, local_rank 1, pid ")
            && e.contains("):\n  before\n  dying\n"),
        "{e}"
    );
}

#[test]
fn cli_python_traceback_without_record() {
    if !has_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let s = Scratch::new("cli-py");
    let script = s.0.join("boom.py");
    fs::write(
        &script,
        "def main():\n    raise ValueError('boom')\n\nmain()\n",
    )
    .expect("write");
    let script = script.to_string_lossy().into_owned();
    let r = rdrun(
        &["--standalone", "--nproc_per_node=1", &script],
        &[("PYTHON_EXEC", "python3")],
    );
    assert_eq!(r.code, Some(1), "{r:?}");
    let e = &r.stderr;
    assert!(e.contains(&format!("{script} FAILED\n")), "{e}");
    assert!(
        e.contains("  traceback : Traceback (most recent call last):\n    File \""),
        "{e}"
    );
    assert!(
        e.contains("\n      raise ValueError('boom')\n  ValueError: boom\n  \n==="),
        "{e}"
    );
    assert!(
        !e.contains("Root cause stderr"),
        "the tail is the traceback itself: {e}"
    );
}

/// Issue 11: rank 1 is SIGKILLed; rank 0, stopped by rdrun, writes an `@record`-style error file
/// from its SIGTERM handler (whole-second timestamp, as torch's) and exits 1. The bystander's file
/// used to win the root cause whenever it was written in the same second as rank 1's death
/// (nearly always), giving exit 1 and "Connection reset by peer". Rank 1 dies only once rank 0's
/// handler is installed, so every try has the race; 5 tries.
#[test]
fn cli_bystander_error_file_on_sigterm_is_not_the_root_cause() {
    let sync = crate::util::TempDir::new("bystander");
    let script = r#"if [ "$LOCAL_RANK" = 1 ]; then
  while [ ! -e "$SYNC_DIR/ready" ]; do sleep 0.02; done
  kill -9 $$
fi
trap 'printf "{\"message\": {\"message\": \"ConnectionResetError: Connection reset by peer\", \"extraInfo\": {\"py_callstack\": \"ConnectionResetError: Connection reset by peer\", \"timestamp\": \"%s\"}}}" "$(date +%s)" > "$TORCHELASTIC_ERROR_FILE"; exit 1' TERM
touch "$SYNC_DIR/ready"
sleep 30 &
wait"#;
    let sync_dir = sync.path().display().to_string();
    for attempt in 0..5 {
        let _ = fs::remove_file(sync.path().join("ready"));
        let r = rdrun(
            &[
                "--standalone",
                "--nproc_per_node=2",
                "--no-python",
                "sh",
                "-c",
                script,
            ],
            &[("SYNC_DIR", &sync_dir)],
        );
        let e = &r.stderr;
        // The bystander really wrote its file (the race happened), and is listed, not blamed.
        assert!(e.contains("ConnectionResetError"), "try {attempt}: {e}");
        assert_eq!(r.code, Some(137), "try {attempt}: {r:?}");
        let root = e
            .split("Root Cause (first observed failure):")
            .nth(1)
            .unwrap_or_else(|| panic!("try {attempt}: no root cause block: {e}"));
        assert!(
            root.contains("  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: "),
            "try {attempt}: {e}"
        );
        assert!(!root.contains("ConnectionResetError"), "try {attempt}: {e}");
    }
}

/// Issue 24.5 with real torch `@record`: rank 0 fails first and is slow to exit, rank 1 fails
/// 2.2 s later, rdrun's stop SIGTERMs rank 0. rdrun exits 1 (the failure), not 143 (its own
/// SIGTERM); the report names rank 0 with its own traceback and says whose the -15 was.
#[test]
fn a_failed_worker_slow_to_exit_is_reported_by_its_failure_not_rdruns_sigterm() {
    let Some(py) = crate::util::torch_python() else {
        return;
    };
    let dir = crate::util::TempDir::new("slow_teardown");
    let json = dir.join("report.json");
    let out = crate::util::Rdrun::new()
        .timeout(std::time::Duration::from_secs(180))
        .env("PYTHON_EXEC", &py)
        .args(["--standalone", "--nproc-per-node", "2", "--report-json"])
        .arg(&json)
        .arg(crate::util::torch_script("slow_teardown.py"))
        .run();
    out.assert_code(1);
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).expect("report json")).expect("json");
    assert_eq!(v["exit_code"], 1, "{v}");
    let root = &v["failures"][v["root_cause"].as_u64().expect("root") as usize];
    assert_eq!(root["rank"], 0, "{v}");
    assert!(
        root["message"]
            .as_str()
            .is_some_and(|m| m.contains("rank 0 failed first")),
        "{v}"
    );
    // Rank 0 sleeps 60 s in atexit: rdrun's stop always finds it alive and SIGTERMs it.
    assert_eq!(root["exitcode"], -15, "{v}");
    assert_eq!(root["stopped_after_failing"], true, "{v}");
    assert!(
        out.stderr
            .contains("sent by rdrun's stop after this worker had failed"),
        "{out:?}"
    );
}

/// Issue 38 item 1: `--report-json` is written on every end, success included: a report left by
/// an earlier failed run is replaced (exit code 0, no failures), not left for a script to read
/// as this run's.
#[test]
fn a_successful_run_replaces_an_earlier_report_json() {
    let dir = crate::util::TempDir::new("report_json_success");
    let json = dir.join("r.json");
    fs::write(&json, "{\"exit_code\":75}\n").expect("stale report");
    crate::util::Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "2", "--report-json"])
        .arg(&json)
        .args(["--no-python", "true"])
        .run()
        .assert_code(0);
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).expect("report json")).expect("json");
    assert_eq!(v["schema"], "rdrun.failure-report/1", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(v["root_cause"].is_null(), "{v}");
    assert_eq!(v["failures"], serde_json::json!([]), "{v}");
    assert_eq!(v["restarts"], serde_json::json!([]), "{v}");
}

/// Issue 38 item 1: a run that recovered through a restart reports exit code 0 and the restart
/// it took with its cause.
#[test]
fn a_recovered_run_reports_its_restarts_and_their_causes() {
    let dir = crate::util::TempDir::new("report_json_restarts");
    let json = dir.join("r.json");
    crate::util::Rdrun::new()
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
        ])
        .arg("--report-json")
        .arg(&json)
        .args(["--no-python", "sh", "-c"])
        .arg(r#"[ "$TORCHELASTIC_RESTART_COUNT" != 0 ] || [ "$LOCAL_RANK" != 1 ] || exit 3"#)
        .run()
        .assert_code(0);
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).expect("report json")).expect("json");
    assert_eq!(v["exit_code"], 0, "{v}");
    let restarts = v["restarts"].as_array().expect("restarts");
    assert_eq!(restarts.len(), 1, "{v}");
    assert_eq!(restarts[0]["restart_count"], 0, "{v}");
    assert_eq!(restarts[0]["charged"], true, "{v}");
    assert_eq!(restarts[0]["cause"], "exit code 3", "{v}");
}
