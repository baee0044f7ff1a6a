//! Unit tests of the CI renderers on `--report-json` documents; a real failing job's annotation,
//! step summary and JUnit file are checked in `launcher-tests/ci.rs`.

use serde_json::{json, Value};

use crate::supervisor::report::schema::ReportDoc;

use super::*;

fn failed_doc() -> Value {
    json!({
        "schema": "rdrun.failure-report/1",
        "name": "train.py",
        "host": "node1",
        "exit_code": 1,
        "root_cause": 1,
        "root_cause_kind": "failure",
        "hang": null,
        "verdict": null,
        "failures": [
            {"index": 0, "rank": 0, "local_rank": 0, "pid": 10, "exitcode": -15,
             "signal": "SIGTERM", "message": "Signal 15 (SIGTERM) received by PID 10",
             "traceback": null, "stderr_tail": [], "stopped_by_rdrun": true},
            {"index": 1, "rank": 1, "local_rank": 1, "pid": 11, "exitcode": 1, "signal": null,
             "message": "[rank1]: ValueError: bad, lr: 50% <x>",
             "traceback": [
                "[rank1]: Traceback (most recent call last):",
                "[rank1]:   File \"/ws/train.py\", line 88, in <module>",
                "[rank1]:     step()",
                "[rank1]:   File \"/ws/lib/model.py\", line 7, in step",
                "[rank1]:     torch.foo()",
                "[rank1]:   File \"/venv/lib/python3.11/site-packages/torch/x.py\", line 3, in foo",
                "[rank1]: ValueError: bad, lr: 50% <x>"
             ],
             "stderr_tail": ["warn \u{1b}[0m"], "stopped_by_rdrun": false}
        ],
        "restarts": [{"restart_count": 0, "charged": true, "cause": "ValueError at model.py:7"}],
    })
}

/// A document as the tests write it: members left out take their defaults, as a reader's would.
fn parse(v: Value) -> ReportDoc {
    serde_json::from_value(v).expect("a report document")
}

fn gh() -> GitHub {
    GitHub {
        step_summary: None,
        workspace: Some(PathBuf::from("/ws")),
        cwd: Some(PathBuf::from("/ws")),
    }
}

#[test]
fn annotation_at_the_innermost_user_frame_escaped() {
    let run = Run::of(&parse(failed_doc()), &[(0, 0), (1, 1)], "train.py");
    let a = github::annotation(&run, &gh());
    assert_eq!(
        a,
        "::error file=lib/model.py,line=7,title=rank 1%3A ValueError::ValueError: bad, lr: 50%25 <x>\n"
    );
    assert_eq!(github::data("a%b\r\nc"), "a%25b%0D%0Ac");
    assert_eq!(github::property("x:y,z"), "x%3Ay%2Cz");
}

#[test]
fn frames_outside_the_workspace_and_library_only_tracebacks() {
    let tb: Vec<String> = [
        "Traceback (most recent call last):",
        "  File \"<frozen runpy>\", line 198, in _run_module_as_main",
        "  File \"/usr/lib/python3.11/threading.py\", line 5, in run",
        "ValueError: x",
    ]
    .map(String::from)
    .to_vec();
    // No user frame: the innermost one.
    assert_eq!(
        user_frame(&tb),
        Some(("/usr/lib/python3.11/threading.py".into(), 5))
    );
    let other = GitHub {
        workspace: Some(PathBuf::from("/elsewhere")),
        ..gh()
    };
    let run = Run::of(&parse(failed_doc()), &[], "train.py");
    assert!(github::annotation(&run, &other).starts_with("::error file=/ws/lib/model.py,line=7,"));
}

#[test]
fn summary_has_the_root_cause_table_and_traceback() {
    let run = Run::of(&parse(failed_doc()), &[(0, 0), (1, 1)], "train.py");
    let md = github::summary(&run);
    assert!(
        md.starts_with("### rdrun: `train.py` failed (exit 1)\n"),
        "{md}"
    );
    assert!(
        md.contains("**Root cause:** rank 1 (local rank 1, host `node1`, pid 11)"),
        "{md}"
    );
    assert!(md.contains("at `/ws/lib/model.py:7`"), "{md}");
    assert!(
        md.contains("| 0 | 0 | 10 | signal 15 (SIGTERM) (stopped by rdrun) |"),
        "{md}"
    );
    assert!(
        md.contains("| ValueError: bad, lr: 50% &lt;x&gt; |"),
        "{md}"
    );
    assert!(
        md.contains("<details open><summary>Traceback of rank 1</summary>"),
        "{md}"
    );
    assert!(
        md.contains("Restarts before this end: 1 (ValueError at model.py:7)"),
        "{md}"
    );
}

#[test]
fn junit_one_case_per_rank() {
    let run = Run::of(&parse(failed_doc()), &[(0, 0), (1, 1), (2, 2)], "train.py");
    let x = junit::render(&run);
    assert!(x.contains("tests=\"3\" failures=\"2\" errors=\"0\""), "{x}");
    assert!(
        x.contains("<failure message=\"ValueError: bad, lr: 50% &lt;x&gt;\" type=\"ValueError\">"),
        "{x}"
    );
    assert!(x.contains("type=\"stopped by rdrun\""), "{x}");
    assert!(
        x.contains("<testcase name=\"rank 2\" classname=\"train.py\">"),
        "{x}"
    );
    assert!(x.contains("warn \u{FFFD}[0m"), "{x}");
    assert!(!x.contains('\u{1b}'));
    assert_eq!(junit::text("a&<>"), "a&amp;&lt;&gt;");
}

#[test]
fn ends_without_a_rank_and_successes() {
    let doc = json!({"exit_code": 1, "root_cause_kind": "launcher", "name": null,
                     "message": "cannot start worker: no such file", "failures": []});
    let run = Run::of(&parse(doc), &[], "t.py");
    let a = github::annotation(&run, &gh());
    assert_eq!(
        a,
        "::error title=rdrun%3A launcher::cannot start worker: no such file\n"
    );
    let x = junit::render(&run);
    assert!(
        x.contains("<testcase name=\"rdrun\" classname=\"t.py\">"),
        "{x}"
    );
    assert!(x.contains("errors=\"1\""), "{x}");
    let ok = Run::of(
        &parse(json!({"exit_code": 0, "failures": []})),
        &[(0, 0), (1, 1)],
        "t.py",
    );
    let x = junit::render(&ok);
    assert!(x.contains("tests=\"2\" failures=\"0\" errors=\"0\""), "{x}");
}

#[test]
fn detect_needs_github_actions_true() {
    let vars = |set: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            set.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    };
    assert_eq!(GitHub::detect(&vars(&[]), None), None);
    assert_eq!(
        GitHub::detect(&vars(&[("GITHUB_ACTIONS", "1")]), None),
        None
    );
    let g = GitHub::detect(
        &vars(&[("GITHUB_ACTIONS", "true"), ("GITHUB_STEP_SUMMARY", "/s.md")]),
        None,
    )
    .unwrap();
    assert_eq!(g.step_summary, Some(PathBuf::from("/s.md")));
    assert_eq!(g.workspace, None);
}

/// A rank that raised and then aborted in torch's teardown: the JSON has no traceback (the status
/// is a signal), its stderr has the printed one.
#[test]
fn printed_traceback_of_a_rank_that_aborted_after_raising() {
    let mut doc = failed_doc();
    let f = &mut doc["failures"][1];
    f["stderr_tail"] = f["traceback"].clone();
    f["traceback"] = Value::Null;
    f["exitcode"] = json!(-6);
    f["signal"] = json!("SIGABRT");
    f["message"] = json!("Signal 6 (SIGABRT) received by PID 11");
    let run = Run::of(&parse(doc), &[], "train.py");
    let a = github::annotation(&run, &gh());
    assert!(
        a.starts_with("::error file=lib/model.py,line=7,title=rank 1%3A ValueError::"),
        "{a}"
    );
}
