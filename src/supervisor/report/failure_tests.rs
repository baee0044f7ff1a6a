//! Unit tests of the failure report (`report.rs`): root-cause choice, block layout against torchrun's, JSON, the parent error file.
use super::*;
use serde_json::json;
use std::time::Duration;

/// A scratch directory, removed when dropped.
struct Scratch(tempfile::TempDir);
impl Scratch {
    fn new() -> Scratch {
        Scratch(
            tempfile::Builder::new()
                .prefix("rdrun-report-test-")
                .tempdir()
                .expect("scratch dir"),
        )
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.path().join(name);
        fs::write(&p, text).expect("write");
        p
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// 2026-11-29_17:21:43 UTC.
const T: u64 = 1_795_972_903;

fn failure(rank: usize, pid: u32, status: WorkerStatus, secs: u64) -> Failure {
    Failure {
        local_rank: rank,
        rank,
        pid,
        status,
        observed_at: at(secs),
        error_file: None,
        stderr_tail: Vec::new(),
        traceback: None,
        abandoned: false,
        stop_sent_at: None,
    }
}

fn report(name: &str, failures: Vec<Failure>) -> ResolvedReport {
    FailureReport {
        name: name.into(),
        host: "localhost".into(),
        failures,
    }
    .resolve()
}

fn root_cause(failures: &[Failure]) -> Option<usize> {
    report("x", failures.to_vec()).root_cause()
}

fn message(r: &ResolvedReport) -> String {
    torchrun_message_with(r, &format_utc_time).0
}

#[test]
fn hang_is_the_root_cause_and_never_exit_zero() {
    // Both stopped by rdrun (bystanders); rank 1 is the hang's suspect; rank 0 exited 0 on
    // the stop signal.
    let mut a = failure(0, 10, WorkerStatus::Exited(0), 5);
    let mut b = failure(1, 11, WorkerStatus::Signaled(libc::SIGTERM), 6);
    a.stop_sent_at = Some(at(4));
    b.stop_sent_at = Some(at(4));
    let plain = report("x", vec![a.clone(), b.clone()]);
    assert_eq!(plain.root_cause(), Some(0));
    assert!(plain.hang().is_none());
    let r = report("x", vec![a.clone(), b]).with_hang(Some(1), "quiet 3s".into());
    assert_eq!(r.root_cause(), Some(1));
    assert_eq!(r.hang(), Some("quiet 3s"));
    assert_eq!(r.exit_code(), 128 + libc::SIGTERM);
    let msg = message(&r);
    let root = msg.split("Root Cause").nth(1).unwrap();
    assert!(root.contains("traceback : hang: quiet 3s"), "{msg}");
    let v = to_json_with(&r, &format_utc_time).to_value();
    assert_eq!(v["root_cause_kind"], "hang");
    assert_eq!(v["failures"][1]["message"], "hang: quiet 3s");
    assert_eq!(
        to_json_with(&plain, &format_utc_time).to_value()["root_cause_kind"],
        "failure"
    );
    // No suspect, and the chosen root exited 0: still a failure status.
    let r = report("x", vec![a]).with_hang(None, "quiet".into());
    assert_eq!(r.root_cause(), Some(0));
    assert_eq!(r.exit_code(), crate::exit::LAUNCHER_FAILURE);
}

#[test]
fn utc_time_format() {
    assert_eq!(format_utc_time(T as i64), "2026-11-29_17:21:43");
    assert_eq!(format_utc_time(0), "1970-01-01_00:00:00");
    assert_eq!(format_utc_time(951_782_400), "2000-02-29_00:00:00");
    assert_eq!(format_utc_time(-1), "1969-12-31_23:59:59");
    let local = format_local_time(T as i64);
    assert_eq!(local.len(), 19, "{local}");
    assert_eq!(&local[10..11], "_");
}

#[test]
fn signal_names_as_python() {
    let cases = [
        (15, Some("SIGTERM")),
        (9, Some("SIGKILL")),
        (6, Some("SIGABRT")),
        (17, Some("SIGCHLD")),
        (29, Some("SIGIO")),
        (34, Some("SIGRTMIN")),
        (40, None),
        (64, Some("SIGRTMAX")),
        (0, None),
    ];
    for (n, want) in cases {
        assert_eq!(signal_name(n), want, "signal {n}");
    }
}

/// spec §3.8 example [verified]: rank 1 exits 3, rank 0 exits 7 from its SIGTERM handler.
#[test]
fn spec_example_exit_codes() {
    let r = report(
        "fail.py",
        vec![
            failure(1, 5261, WorkerStatus::Exited(3), T),
            failure(0, 5260, WorkerStatus::Exited(7), T),
        ],
    );
    let want = "
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_17:21:43
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 7 (pid: 5260) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_17:21:43
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 5261) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================";
    assert_eq!(message(&r), want);
    // render: the same block without the leading empty line.
    assert_eq!(render_with(&r, &format_utc_time), &want[1..]);
    assert_eq!(r.root_cause(), Some(0));
    assert_eq!(r.exit_code(), 3);
}

const CALLSTACK: &str = "Traceback (most recent call last):\n  File \"/root/.cache/rdrun/torch-venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py\", line 384, in wrapper\n    result = f(*args, **kwargs)\n             ^^^^^^^^^^^^^^^^^^\n  File \"/tmp/rdrun-scn/rec.py\", line 6, in main\n    raise ValueError(\"bad value\")\nValueError: bad value\n";

fn record_json(ts: &str) -> String {
    json!({"message": {"message": "ValueError: bad value",
            "extraInfo": {"py_callstack": CALLSTACK, "timestamp": ts}}})
    .to_string()
}

/// Recorded from torchrun 2.15.0: `@record` ValueError on rank 1, rank 0 SIGTERM'd.
#[test]
fn torchrun_record_and_sigterm() {
    let s = Scratch::new();
    let ef = s.file("error.json", &record_json("1795977433"));
    let mut root = failure(1, 3832, WorkerStatus::Exited(1), 1_795_977_436);
    root.error_file = Some(ef.clone());
    let mut peer = failure(0, 3831, WorkerStatus::Signaled(15), 1_795_977_436);
    peer.error_file = Some(s.0.path().join("missing.json"));
    let r = report("rec.py", vec![root, peer]);
    let want = format!(
            "
============================================================
rec.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_18:37:16
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3831)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 3831
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_18:37:13
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 3832) 
  error_file: {}
  traceback : Traceback (most recent call last):
    File \"/root/.cache/rdrun/torch-venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py\", line 384, in wrapper
      result = f(*args, **kwargs)
               ^^^^^^^^^^^^^^^^^^
    File \"/tmp/rdrun-scn/rec.py\", line 6, in main
      raise ValueError(\"bad value\")
  ValueError: bad value
  
============================================================",
            ef.display()
        );
    assert_eq!(message(&r), want);
}

#[test]
fn narrow_block_and_string_message() {
    let s = Scratch::new();
    let ef = s.file("e.json", r#"{"message": "boom", "timestamp": 1795972900}"#);
    let mut f = failure(2, 42, WorkerStatus::Exited(5), T);
    f.error_file = Some(ef.clone());
    f.local_rank = 0;
    let r = report("x", vec![f]);
    let path = ef.display().to_string();
    let w = (path.chars().count() + 14).clamp(33, 60);
    let want = format!(
        "
{eq}
x FAILED
{dash}
Failures:
  <NO_OTHER_FAILURES>
{dash}
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_17:21:40
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : 5 (pid: 42) 
  error_file: {path}
  traceback : boom
{eq}",
        eq = "=".repeat(w),
        dash = "-".repeat(w),
    );
    assert_eq!(message(&r), want);
}

#[test]
fn error_file_forms() {
    let s = Scratch::new();
    let cases: Vec<(&str, Result<i64, &str>)> = vec![
        (r#"{"message": "m", "timestamp": 12}"#, Ok(12)),
        (r#"{"message": "m"}"#, Ok(0)),
        (r#"{"message": "m", "timestamp": "13"}"#, Ok(13)),
        (r#"{"message": {"extraInfo": {"timestamp": "14"}}}"#, Ok(14)),
        (r#"{"message": {"extraInfo": {"timestamp": 15.9}}}"#, Ok(15)),
        ("{not json", Err("not valid JSON")),
        (r#"{"msg": "m"}"#, Err("no \"message\" field")),
        (
            r#"{"message": {"message": "m"}}"#,
            Err("no \"message.extraInfo.timestamp\""),
        ),
        (
            r#"{"message": "m", "timestamp": "soon"}"#,
            Err("bad \"timestamp\""),
        ),
        (r#"{"message": 3}"#, Err("neither a string nor an object")),
    ];
    for (i, (text, want)) in cases.into_iter().enumerate() {
        let p = s.file(&format!("{i}.json"), text);
        match (read_error_file(Some(&p)), want) {
            (ErrorFile::Valid { timestamp, .. }, Ok(ts)) => assert_eq!(timestamp, ts, "{text}"),
            (ErrorFile::Invalid(why), Err(w)) => assert!(why.contains(w), "{text}: {why}"),
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }
    assert_eq!(read_error_file(None), ErrorFile::Missing);
    assert_eq!(
        read_error_file(Some(&s.0.path().join("none"))),
        ErrorFile::Missing
    );
    assert_eq!(read_error_file(Some(s.0.path())), ErrorFile::Missing);
}

#[test]
fn invalid_error_file_is_reported_not_fatal() {
    let s = Scratch::new();
    let ef = s.file("error.json", "{\"message\": ");
    let mut f = failure(0, 7, WorkerStatus::Exited(2), T);
    f.error_file = Some(ef.clone());
    let msg = message(&report("t.py", vec![f]));
    assert!(
        msg.contains(&format!(
            "  error_file: {} (invalid: not valid JSON: ",
            ef.display()
        )),
        "{msg}"
    );
    assert!(msg.contains(&format!("  traceback : {HINT}\n")), "{msg}");
    assert!(msg.contains("  time      : 2026-11-29_17:21:43\n"), "{msg}");
}

fn tb() -> Vec<String> {
    CALLSTACK.lines().map(String::from).collect()
}

#[test]
fn captured_traceback_without_record() {
    let mut f = failure(0, 9, WorkerStatus::Exited(1), T);
    f.traceback = Some(tb());
    f.stderr_tail = vec!["loading".into()];
    f.stderr_tail.extend(tb());
    let r = report("t.py", vec![f.clone()]);
    let msg = message(&r);
    let want_tb = format!("  traceback : {}", CALLSTACK.replace('\n', "\n  "));
    assert!(msg.contains(&format!("{want_tb}\n====")), "{msg}");
    // The tail is not only the traceback: it is shown after the block.
    let out = render_with(&r, &format_utc_time);
    assert!(
            out.ends_with(&format!(
                "=\nRoot cause stderr (last 1 line before the traceback, rank 0, local_rank 0, pid 9):\n  loading\n{}",
                "=".repeat(60)
            )),
            "{out}"
        );
    // A tail that is only the traceback is not repeated.
    let mut g = f.clone();
    g.stderr_tail = tb();
    let out = render_with(&report("t.py", vec![g]), &format_utc_time);
    assert!(!out.contains("Root cause stderr"), "{out}");
    // Another exit code: the program chose it; the traceback is not blamed.
    let mut h = f.clone();
    h.status = WorkerStatus::Exited(3);
    let msg = message(&report("t.py", vec![h]));
    assert!(msg.contains(&format!("  traceback : {HINT}\n")), "{msg}");
    let out = render_with(
        &report(
            "t.py",
            vec![{
                let mut h = f.clone();
                h.status = WorkerStatus::Exited(3);
                h
            }],
        ),
        &format_utc_time,
    );
    assert!(out.contains("Root cause stderr (last 8 lines"), "{out}");
    // A signal keeps torchrun's line.
    let mut k = f;
    k.status = WorkerStatus::Signaled(2);
    let msg = message(&report("t.py", vec![k]));
    assert!(
        msg.contains("  exitcode  : -2 (pid: 9)  (SIGINT)\n"),
        "{msg}"
    );
    assert!(
        msg.contains("  traceback : Signal 2 (SIGINT) received by PID 9\n"),
        "{msg}"
    );
    // A worker that outlived SIGKILL is not said to have received it.
    let mut a = failure(0, 9, WorkerStatus::Signaled(libc::SIGKILL), T);
    a.abandoned = true;
    let msg = message(&report("t.py", vec![a]));
    assert!(
            msg.contains("  traceback : SIGKILL sent to PID 9, which did not exit (uninterruptible sleep?); rdrun left it behind\n"),
            "{msg}"
        );
    assert!(!msg.contains("received by PID"), "{msg}");
}

#[test]
fn root_cause_choice() {
    let s = Scratch::new();
    // Ties: detection order.
    let fs = vec![
        failure(3, 1, WorkerStatus::Exited(1), T),
        failure(0, 2, WorkerStatus::Exited(1), T),
    ];
    assert_eq!(root_cause(&fs), Some(0));
    // Earliest observation wins.
    let fs = vec![
        failure(3, 1, WorkerStatus::Exited(1), T + 1),
        failure(0, 2, WorkerStatus::Signaled(9), T),
    ];
    assert_eq!(root_cause(&fs), Some(1));
    // An error file's timestamp is the failure's time.
    let mut late = failure(2, 3, WorkerStatus::Exited(1), T + 5);
    late.error_file = Some(s.file("e.json", &record_json(&(T - 1).to_string())));
    let fs = vec![failure(0, 2, WorkerStatus::Signaled(15), T), late];
    assert_eq!(root_cause(&fs), Some(1));
    assert_eq!(root_cause(&[]), None);
    assert_eq!(render(&report("x", vec![])), "");
    // Sub-second order counts (torchrun rounds to seconds and would tie).
    let a = Failure {
        observed_at: at(T) + Duration::from_millis(900),
        ..failure(0, 1, WorkerStatus::Exited(1), T)
    };
    let b = Failure {
        observed_at: at(T) + Duration::from_millis(100),
        ..failure(1, 2, WorkerStatus::Exited(1), T)
    };
    assert_eq!(root_cause(&[a, b]), Some(1));
}

/// Issue 28: two ranks reaped in one batch (one observation time): rank 0's gloo error only
/// says that its peer went away; rank 1 raised. Rank 1 is the cause, though rank 0 is first in
/// detection order; when every failure is a peer's loss, the usual order applies.
#[test]
fn a_peer_error_is_not_the_root_cause_when_a_real_one_is_there() {
    let tb = |last: &str| {
        Some(vec![
            "Traceback (most recent call last):".to_string(),
            "  File \"/w/train.py\", line 9, in <module>".to_string(),
            last.to_string(),
        ])
    };
    let mut gloo = failure(0, 1, WorkerStatus::Exited(1), T);
    gloo.traceback = tb("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500");
    let mut real = failure(1, 2, WorkerStatus::Exited(1), T);
    real.traceback = tb("ValueError: bad batch");
    let r = report("x", vec![gloo.clone(), real]);
    assert_eq!(r.root_cause(), Some(1));
    assert!(!r.root_is_peer_error());
    let mut nccl = failure(1, 2, WorkerStatus::Exited(1), T);
    nccl.traceback = tb("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error");
    let r = report("x", vec![gloo, nccl]);
    assert_eq!(r.root_cause(), Some(0));
    assert!(r.root_is_peer_error());
    for (text, peer) in [
        ("RuntimeError: Connection reset by peer", true),
        ("BrokenPipeError: [Errno 32] Broken pipe", true),
        ("torch.distributed.DistNetworkError: failed to recv", true),
        ("ValueError: bad value", false),
        ("RuntimeError: CUDA out of memory", false),
    ] {
        assert_eq!(super::is_peer_error(text), peer, "{text}");
    }
}

/// Issue 11: rank 1 dies on its own; rank 0, stopped by rdrun, writes its error file on
/// SIGTERM within the same second. The bystander's whole-second timestamp must not win.
#[test]
fn bystander_error_file_is_not_the_root_cause() {
    let s = Scratch::new();
    let died = at(T) + Duration::from_millis(300);
    let stop = died;
    let root = Failure {
        observed_at: died,
        ..failure(1, 11, WorkerStatus::Signaled(9), T)
    };
    let mut bystander = Failure {
        observed_at: died + Duration::from_millis(40),
        stop_sent_at: Some(stop),
        ..failure(0, 10, WorkerStatus::Exited(1), T)
    };
    bystander.error_file = Some(s.file("b.json", &record_json(&T.to_string())));
    let r = report("t.py", vec![root.clone(), bystander.clone()]);
    assert_eq!(r.root_cause(), Some(0));
    assert_eq!(r.exit_code(), 137);
    // The rendered root cause and the JSON agree with the exit status.
    let out = render_with(&r, &format_utc_time);
    let block = out.split("Root Cause").nth(1).expect("root block");
    assert!(block.contains("rank      : 1 (local_rank: 1)"), "{out}");
    assert_eq!(
        to_json_with(&r, &format_utc_time).to_value()["exit_code"],
        137
    );
    // Detection order does not matter either.
    let r = report("t.py", vec![bystander.clone(), root.clone()]);
    assert_eq!(r.root_cause(), Some(1));
    // An error file written a whole second before the stop proves an own failure: it
    // refines the order (it failed before rank 1 was seen).
    let mut early = bystander.clone();
    early.error_file = Some(s.file("e.json", &record_json(&(T - 1).to_string())));
    let r = report("t.py", vec![root.clone(), early]);
    assert_eq!(r.root_cause(), Some(1));
    assert_eq!(r.exit_code(), 1);
    // Among own failures of one batch, an earlier second on file wins; the same second
    // keeps the observation order.
    let mut a = failure(0, 1, WorkerStatus::Exited(2), T);
    a.error_file = Some(s.file("a.json", &record_json(&T.to_string())));
    let mut b = failure(1, 2, WorkerStatus::Exited(3), T);
    b.error_file = Some(s.file("b2.json", &record_json(&(T - 2).to_string())));
    assert_eq!(root_cause(&[a.clone(), b]), Some(1));
    let c = failure(1, 2, WorkerStatus::Exited(3), T);
    assert_eq!(root_cause(&[a.clone(), c.clone()]), Some(0));
    assert_eq!(root_cause(&[c, a]), Some(0));
    // Every failure caused by rdrun (a shutdown signal): the same order among all of them.
    let x = Failure {
        stop_sent_at: Some(at(T)),
        observed_at: at(T) + Duration::from_millis(20),
        ..failure(0, 1, WorkerStatus::Signaled(15), T)
    };
    let y = Failure {
        stop_sent_at: Some(at(T)),
        observed_at: at(T) + Duration::from_millis(10),
        ..failure(1, 2, WorkerStatus::Signaled(15), T)
    };
    assert_eq!(root_cause(&[x, y]), Some(1));
}

/// Issue 24.5: rank 0 raised (its error file names second T) and was slow to exit; rank 1
/// failed on its own at T+2; rdrun's stop then SIGTERMed rank 0. Rank 0 is the root cause,
/// and the status is its failure's (1), not rdrun's SIGTERM (143); the report says whose
/// signal it was.
#[test]
fn a_failed_worker_that_rdruns_stop_then_signalled_counts_as_its_failure() {
    let s = Scratch::new();
    let second = failure(1, 11, WorkerStatus::Exited(1), T + 2);
    let mut first = Failure {
        observed_at: at(T + 2) + Duration::from_millis(30),
        stop_sent_at: Some(at(T + 2)),
        ..failure(0, 10, WorkerStatus::Signaled(libc::SIGTERM), T + 2)
    };
    first.error_file = Some(s.file("f.json", &record_json(&T.to_string())));
    let r = report("teardown.py", vec![second.clone(), first.clone()]);
    assert_eq!(r.root_cause(), Some(1));
    assert_eq!(r.exit_code(), 1);
    let out = render_with(&r, &format_utc_time);
    let root = out.split("Root Cause").nth(1).unwrap();
    assert!(
            root.contains("exitcode  : -15 (pid: 10)  (SIGTERM) sent by rdrun's stop after this worker had failed (counted as exit 1)"),
            "{out}"
        );
    let v = to_json_with(&r, &format_utc_time).to_value();
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["failures"][1]["stopped_by_rdrun"], true);
    assert_eq!(v["failures"][1]["stopped_after_failing"], true);
    assert_eq!(v["failures"][0]["stopped_after_failing"], false);
    assert_eq!(parent_error_json(&r).unwrap()["message"]["errorCode"], 1);
    // The same worker without an error file is a bystander of rank 1's failure.
    first.error_file = None;
    let r = report("teardown.py", vec![second.clone(), first.clone()]);
    assert_eq!((r.root_cause(), r.exit_code()), (Some(0), 1));
    // An error file of the stop's own second proves nothing (it may be the SIGTERM's).
    first.error_file = Some(s.file("g.json", &record_json(&(T + 2).to_string())));
    let r = report("teardown.py", vec![second, first]);
    assert_eq!(r.root_cause(), Some(0));
    assert!(
        !to_json_with(&r, &format_utc_time).to_value()["failures"][1]["stopped_after_failing"]
            .as_bool()
            .unwrap()
    );
}

#[test]
fn json_report() {
    let s = Scratch::new();
    let ef = s.file("e.json", &record_json(&T.to_string()));
    let mut root = failure(1, 11, WorkerStatus::Exited(1), T + 2);
    root.error_file = Some(ef.clone());
    root.stderr_tail = vec!["a".into()];
    let peer = failure(0, 10, WorkerStatus::Signaled(15), T + 3);
    let r = report("rec.py", vec![peer, root]);
    let v = to_json_with(&r, &format_utc_time).to_value();
    assert_eq!(v["schema"], "rdrun.failure-report/1");
    assert_eq!(v["name"], "rec.py");
    assert_eq!(v["host"], "localhost");
    assert_eq!(v["root_cause"], 1);
    assert_eq!(v["exit_code"], 1);
    let f0 = &v["failures"][0];
    assert_eq!(f0["exitcode"], -15);
    assert_eq!(f0["signal"], "SIGTERM");
    assert_eq!(f0["error_file"], Value::Null);
    assert_eq!(f0["message"], "Signal 15 (SIGTERM) received by PID 10");
    assert_eq!(f0["traceback"], Value::Null);
    assert_eq!(f0["time"], "2026-11-29_17:21:46");
    let f1 = &v["failures"][1];
    assert_eq!(f1["index"], 1);
    assert_eq!(f1["rank"], 1);
    assert_eq!(f1["local_rank"], 1);
    assert_eq!(f1["pid"], 11);
    assert_eq!(f1["timestamp"], T);
    assert_eq!(f1["error_file"], ef.display().to_string());
    assert_eq!(f1["message"], "ValueError: bad value");
    assert_eq!(f1["traceback"], json!(tb()));
    assert_eq!(f1["stderr_tail"], json!(["a"]));
    let out = s.0.path().join("report.json");
    write_json_doc(&out, &to_json(&r)).expect("write");
    let back: Value = serde_json::from_str(&fs::read_to_string(&out).expect("read")).expect("json");
    assert_eq!(back["root_cause"], 1);
    let err =
        write_json_doc(&s.0.path().join("no/such/dir.json"), &to_json(&r)).expect_err("bad path");
    assert!(err.to_string().contains("cannot write"), "{err}");
    // rdrun's exit code for a signal root cause: 128+N.
    let v = to_json(&report(
        "x",
        vec![failure(0, 1, WorkerStatus::Signaled(9), T)],
    ))
    .to_value();
    assert_eq!(v["exit_code"], 137);
}

/// Issue 38 item 1: `--report-json` replaces an earlier report by rename (no temporary file
/// left beside it), writes through a symbolic link to the file it names (the link stays), and
/// writes a path that is no regular file in place.
#[test]
fn report_json_is_replaced_atomically() {
    let s = Scratch::new();
    let out = s.file("r.json", "{\"exit_code\":75}");
    write_json_doc(&out, &json!({"exit_code": 0})).expect("write");
    let back: Value = serde_json::from_str(&fs::read_to_string(&out).expect("read")).expect("json");
    assert_eq!(back["exit_code"], 0);
    let names: Vec<_> = fs::read_dir(s.0.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("r.json")]);
    let link = s.0.path().join("link.json");
    std::os::unix::fs::symlink(&out, &link).expect("symlink");
    write_json_doc(&link, &json!({"exit_code": 3})).expect("write through the link");
    assert!(fs::symlink_metadata(&link).expect("link").is_symlink());
    assert!(fs::read_to_string(&out)
        .expect("read")
        .contains("\"exit_code\": 3"));
    write_json_doc(Path::new("/dev/null"), &json!({})).expect("in place");
    assert!(Path::new("/dev/null").exists());
}

#[test]
fn parent_error_file() {
    let s = Scratch::new();
    // Copy of the root cause's error file with errorCode.
    let ef = s.file("e.json", &record_json("100"));
    let mut root = failure(1, 11, WorkerStatus::Exited(3), T);
    root.error_file = Some(ef);
    let parent = s.file("parent.json", "old contents");
    copy_to_parent_error_file(&parent, &report("x", vec![root])).expect("copy");
    let v: Value = serde_json::from_str(&fs::read_to_string(&parent).expect("r")).expect("json");
    assert_eq!(v["message"]["errorCode"], 3);
    assert_eq!(v["message"]["message"], "ValueError: bad value");
    assert_eq!(v["message"]["extraInfo"]["timestamp"], "100");
    // String form: copied without errorCode (torchrun skips it).
    let ef = s.file("s.json", r#"{"message": "m", "timestamp": 5}"#);
    let mut f = failure(0, 1, WorkerStatus::Exited(3), T);
    f.error_file = Some(ef);
    let v = parent_error_json(&report("x", vec![f])).expect("json");
    assert_eq!(v, json!({"message": "m", "timestamp": 5}));
    // No error file, captured traceback: synthesized dict form.
    let mut f = failure(0, 1, WorkerStatus::Exited(1), T);
    f.traceback = Some(tb());
    let v = parent_error_json(&report("x", vec![f])).expect("json");
    assert_eq!(v["message"]["message"], "ValueError: bad value");
    assert_eq!(v["message"]["extraInfo"]["py_callstack"], CALLSTACK);
    assert_eq!(v["message"]["extraInfo"]["timestamp"], T.to_string());
    assert_eq!(v["message"]["errorCode"], 1);
    // A signal, with a stderr tail.
    let mut f = failure(0, 77, WorkerStatus::Signaled(11), T);
    f.stderr_tail = vec!["Fatal Python error: Segmentation fault".into()];
    let v = parent_error_json(&report("x", vec![f])).expect("json");
    assert_eq!(
        v["message"]["message"],
        "Signal 11 (SIGSEGV) received by PID 77"
    );
    assert_eq!(
        v["message"]["extraInfo"]["py_callstack"],
        "Fatal Python error: Segmentation fault\n"
    );
    assert_eq!(v["message"]["errorCode"], -11);
    assert_eq!(parent_error_json(&report("x", vec![])), None);
}

#[test]
fn a_native_abort_after_the_last_output_is_named_in_one_line() {
    // Issue 38 item 3: SIGABRT right after libstdc++'s "terminate called without an active
    // exception" and no Python traceback: torch's teardown race, said once; the status stays.
    let mut f = failure(1, 11, WorkerStatus::Signaled(6), T);
    f.stderr_tail = vec![
        "step 5 done".into(),
        "terminate called without an active exception".into(),
    ];
    let r = report("train.py", vec![f.clone()]);
    let out = render_with(&r, &format_utc_time);
    let notes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("aborted in native code after its last output"))
        .collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(notes[0].starts_with("rdrun: rank 1 "), "{out}");
    assert_eq!(r.exit_code(), 134);
    // Not for another signal, another last line, or a rank that printed a traceback.
    let mut other = f.clone();
    other.status = WorkerStatus::Signaled(11);
    let mut moved_on = f.clone();
    moved_on.stderr_tail.push("more output".into());
    let mut raised = f.clone();
    raised.traceback = Some(vec![
        "Traceback (most recent call last):".into(),
        "ValueError: x".into(),
    ]);
    for g in [other, moved_on, raised] {
        let out = render_with(&report("train.py", vec![g]), &format_utc_time);
        assert!(!out.contains("aborted in native code"), "{out}");
    }
}
