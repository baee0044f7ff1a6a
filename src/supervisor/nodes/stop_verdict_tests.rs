//! Unit tests of `stop_verdict.rs`: signatures and the count in a row, on tracebacks parsed by
//! `report/traceback.rs`.

use super::*;
use crate::supervisor::report::failure::FailureReport;
use crate::supervisor::report::traceback::{unprefixed, verdict_in};

fn lines(text: &str) -> Vec<String> {
    text.lines().map(String::from).collect()
}

const SIMPLE: &str = r#"Traceback (most recent call last):
  File "/home/u/train.py", line 120, in <module>
    main()
  File "/home/u/train.py", line 88, in main
    raise ValueError(f"bad batch {step}")
ValueError: bad batch 17"#;

#[test]
fn innermost_frame_and_type() {
    assert_eq!(
        parse_traceback(&lines(SIMPLE)),
        Some(("ValueError".into(), "/home/u/train.py".into(), 88))
    );
}

/// torch.distributed's exception hook prefixes every line with `[rankN]: ` once a process group
/// is up: the signature is the same as without it (before, every DDP exception read as `exit
/// code 1`, and two different ones were "the same failure").
#[test]
fn a_rank_prefixed_traceback_parses_as_the_plain_one() {
    let prefixed: Vec<String> = SIMPLE.lines().map(|l| format!("[rank12]: {l}")).collect();
    assert_eq!(parse_traceback(&prefixed), parse_traceback(&lines(SIMPLE)));
    // Not torch's prefix: left as is.
    assert_eq!(unprefixed("[rank]: x"), "[rank]: x");
    assert_eq!(unprefixed("[rank3] x"), "[rank3] x");
    assert_eq!(unprefixed("[rank3]: ValueError: v"), "ValueError: v");
}

#[test]
fn chained_exception_takes_the_last_traceback() {
    let text = r#"Traceback (most recent call last):
  File "a.py", line 3, in f
    x = d["k"]
        ~^^^^^
KeyError: 'k'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "b.py", line 9, in <module>
    raise RuntimeError("wrapped")
torch.distributed.DistBackendError: wrapped: the store is gone"#;
    assert_eq!(
        parse_traceback(&lines(text)),
        Some((
            "torch.distributed.DistBackendError".into(),
            "b.py".into(),
            9
        ))
    );
}

/// Issue 38 item 14: a traceback whose position marker (`^^^`) starts at column 0 (Python shows
/// a line that is not the one the offsets belong to) is captured whole from stderr and gives
/// the exception's signature: two different exceptions are two failures, not both `exit code 1`.
#[test]
fn a_marker_at_column_0_is_captured_and_parsed() {
    use crate::supervisor::output::lines::End;
    let tb = |kind: &str, line: u32| {
        format!(
            "Traceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\n    \
             main()\n  File \"/w/model.py\", line {line}, in main\n    x = 1\n^^^^^^^^^^^^\n\
             {kind}: boom\nteardown warning\n"
        )
    };
    let captured = |stderr: &str| {
        let mut t = crate::supervisor::output::tail::StderrTracker::default();
        for l in stderr.split_inclusive('\n') {
            t.segment(l.as_bytes(), End::Newline);
        }
        t.summary().traceback
    };
    let sig = |kind: &str, line: u32| {
        let text = tb(kind, line);
        let mut f = failure(0, WorkerStatus::Exited(1), None);
        f.traceback = captured(&text);
        of_report(&report(vec![f])).map(|s| s.to_string())
    };
    assert_eq!(
        sig("ValueError", 4),
        Some("ValueError at model.py:4".into())
    );
    assert_eq!(sig("KeyError", 5), Some("KeyError at model.py:5".into()));
    assert_eq!(
        parse_traceback(&lines(&tb("ValueError", 4))),
        Some(("ValueError".into(), "/w/model.py".into(), 4))
    );
}

#[test]
fn exception_without_message_and_garbage() {
    let kb = "Traceback (most recent call last):\n  File \"t.py\", line 5, in <module>\n    time.sleep(9)\nKeyboardInterrupt";
    assert_eq!(
        parse_traceback(&lines(kb)),
        Some(("KeyboardInterrupt".into(), "t.py".into(), 5))
    );
    // No frame, or no exception line: no exception signature.
    assert_eq!(parse_traceback(&lines("ValueError: x")), None);
    assert_eq!(
        parse_traceback(&lines("  File \"t.py\", line 5, in f\n    g()\n")),
        None
    );
    assert_eq!(parse_traceback(&[]), None);
}

#[test]
fn display_is_short() {
    let s = Signature::Exception {
        kind: "ValueError".into(),
        file: "/home/u/train.py".into(),
        line: 88,
    };
    assert_eq!(s.to_string(), "ValueError at train.py:88");
    assert_eq!(
        Signature::Status(WorkerStatus::Exited(3)).to_string(),
        "exit code 3"
    );
    assert_eq!(
        Signature::Status(WorkerStatus::Signaled(9)).to_string(),
        "signal 9 (SIGKILL)"
    );
}

fn exc(kind: &str, line: u32) -> Option<Signature> {
    Some(Signature::Exception {
        kind: kind.into(),
        file: "train.py".into(),
        line,
    })
}

#[test]
fn count_in_a_row_resets_on_a_different_failure_or_another_end() {
    let mut s = SameFailure::default();
    assert_eq!(s.record_signature(exc("ValueError", 88)), 1);
    assert_eq!(s.record_signature(exc("ValueError", 88)), 2);
    assert_eq!(
        s.verdict(),
        "the same failure 2 attempts in a row: ValueError at train.py:88; not restarting"
    );
    assert_eq!(s.record_signature(exc("ValueError", 88)), 3);
    // Another line of the same type is another failure.
    assert_eq!(s.record_signature(exc("ValueError", 89)), 1);
    // Another type at the same line too.
    assert_eq!(s.record_signature(exc("KeyError", 89)), 1);
    assert_eq!(s.record_signature(exc("KeyError", 89)), 2);
    // A regroup, a hang, a success in between: no longer in a row.
    assert_eq!(s.record_signature(None), 0);
    assert_eq!(s.record_signature(exc("KeyError", 89)), 1);
    // Exit statuses without a traceback.
    let st = |c| Some(Signature::Status(WorkerStatus::Exited(c)));
    assert_eq!(s.record_signature(st(3)), 1);
    assert_eq!(s.record_signature(st(3)), 2);
    assert_eq!(s.record_signature(st(4)), 1);
}

/// Issue 38 item 7: whether the next failure could be the verdict decides whether a node with
/// no restart left may close the job before the others' word is in.
#[test]
fn whether_the_next_failure_could_reach_the_verdict() {
    let mut s = SameFailure::default();
    // Nothing in a row yet: only where one failure is enough.
    assert!(!s.could_reach(2));
    assert!(s.could_reach(1));
    assert!(!s.could_reach(0));
    s.record_signature(exc("ValueError", 88));
    assert!(s.could_reach(2));
    assert!(!s.could_reach(3));
    assert!(!s.could_reach(0));
    s.record_signature(None);
    assert!(!s.could_reach(2));
}

fn failure(
    rank: usize,
    status: WorkerStatus,
    tb: Option<&str>,
) -> crate::supervisor::report::failure::Failure {
    crate::supervisor::report::failure::Failure {
        local_rank: rank,
        rank,
        pid: 100 + rank as u32,
        status,
        observed_at: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + rank as u64),
        error_file: None,
        stderr_tail: Vec::new(),
        traceback: tb.map(lines),
        abandoned: false,
        stop_sent_at: None,
    }
}

fn report(failures: Vec<crate::supervisor::report::failure::Failure>) -> ResolvedReport {
    FailureReport {
        name: "train.py".into(),
        host: "h".into(),
        failures,
    }
    .resolve()
}

#[test]
fn signature_of_the_root_cause() {
    // The first failure is the root cause; its stderr traceback gives the signature.
    let r = report(vec![
        failure(0, WorkerStatus::Exited(1), Some(SIMPLE)),
        failure(1, WorkerStatus::Signaled(15), None),
    ]);
    assert_eq!(
        of_report(&r).map(|s| s.to_string()),
        Some("ValueError at train.py:88".into())
    );
    // No traceback: the status.
    let r = report(vec![failure(0, WorkerStatus::Exited(7), None)]);
    assert_eq!(
        of_report(&r),
        Some(Signature::Status(WorkerStatus::Exited(7)))
    );
    // A traceback printed before a chosen exit status is not the cause (report.rs's rule).
    let r = report(vec![failure(0, WorkerStatus::Exited(7), Some(SIMPLE))]);
    assert_eq!(
        of_report(&r),
        Some(Signature::Status(WorkerStatus::Exited(7)))
    );
    // A rank that printed a traceback and then died of SIGABRT in teardown (issue 38 item 2):
    // the traceback decides, so it is the same failure as the plain exit 1 with that traceback.
    let r = report(vec![failure(0, WorkerStatus::Signaled(6), Some(SIMPLE))]);
    assert_eq!(
        of_report(&r).map(|s| s.to_string()),
        Some("ValueError at train.py:88".into())
    );
    // A hang rdrun stopped has no signature.
    let r =
        report(vec![failure(0, WorkerStatus::Signaled(9), None)]).with_hang(Some(0), "x".into());
    assert_eq!(of_report(&r), None);
    assert_eq!(of_report(&report(Vec::new())), None);
}

#[test]
fn signature_from_the_error_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("error.json");
    let doc = serde_json::json!({"message": {"message": "ValueError: boom",
        "extraInfo": {"py_callstack": SIMPLE, "timestamp": "1000"}}});
    std::fs::write(&path, doc.to_string()).unwrap();
    let mut f = failure(0, WorkerStatus::Exited(1), None);
    f.error_file = Some(path);
    assert_eq!(
        of_report(&report(vec![f])).map(|s| s.to_string()),
        Some("ValueError at train.py:88".into())
    );
}

#[test]
fn node_failures_count_own_failures_by_cause_only() {
    let mut n = NodeFailures::default();
    let failed = Outcome::Failed {
        failures: Vec::new(),
        peer_loss: None,
        hang: None,
    };
    let sig = Signature::Status(WorkerStatus::Exited(3));
    assert_eq!(n.record(&failed, Some(&sig)), 1);
    // A failure charged to a lost peer, a success, a regroup: not this node's.
    let lost = Outcome::Failed {
        failures: Vec::new(),
        peer_loss: Some((crate::rendezvous::RoundReason::PeerLost, vec!["n2".into()])),
        hang: None,
    };
    assert_eq!(n.record(&lost, None), 1);
    assert_eq!(n.record(&Outcome::Succeeded, None), 1);
    let other = Signature::Exception {
        kind: "ValueError".into(),
        file: "/x/train.py".into(),
        line: 88,
    };
    assert_eq!(n.record(&failed, Some(&other)), 2);
    assert_eq!(n.record(&failed, Some(&sig)), 3);
    assert_eq!(
        n.summary(),
        "3 (ValueError at train.py:88 ×1, exit code 3 ×2)"
    );
    let j = n.to_json("h1");
    assert_eq!(j["node"], "h1");
    assert_eq!(j["count"], 3);
    assert_eq!(j["causes"][1]["cause"], "exit code 3");
    assert_eq!(j["causes"][1]["count"], 2);
}

/// Another node's close reason carries its verdict: this node then exits "do not requeue" too;
/// a plain failure elsewhere does not.
#[test]
fn a_close_with_a_verdict_is_recognised() {
    let mut s = SameFailure::default();
    s.record_signature(exc("ValueError", 88));
    s.record_signature(exc("ValueError", 88));
    let why = format!(
        "the job failed on host1: {}; its agent closed the rendezvous",
        s.verdict()
    );
    assert_eq!(verdict_in(&why), Some(s.verdict().as_str()), "{why}");
    assert_eq!(
        verdict_in("the job failed on host1; its agent closed the rendezvous"),
        None
    );
}
