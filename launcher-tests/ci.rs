//! CI output of a run's end (issue 40), through the real binary: a real failing 2-rank DDP job
//! (gloo; rank 1 raises a ValueError in a function of the script) under a fake GitHub Actions
//! environment with `--report-junit`: the `::error` annotation on stdout, the step summary and
//! the JUnit XML (parsed by Python's `xml.etree`) are read back. Without `GITHUB_ACTIONS=true`
//! none of it appears; `--report-junit` is written on success too.

use std::path::Path;
use std::process::Command;

use crate::util::*;

/// Rank 1 raises in `check` (the line holding `raise`); rank 0 waits in a barrier until its
/// peer is gone or rdrun stops it.
const DDP_SCRIPT: &str = r#"import torch
import torch.distributed as dist


def check(lr):
    if lr < 0:
        raise ValueError(f"lr must be positive, got {lr}")


dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    check(-1)
dist.barrier()
dist.destroy_process_group()
"#;

/// The test cases of a JUnit file as JSON lines, read by a real XML parser.
const JUNIT_READER: &str = r#"import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
for suite in root:
    assert suite.tag == "testsuite", suite.tag
    print(json.dumps({"suite": dict(suite.attrib)}))
    for case in suite:
        out = {"name": case.get("name"), "classname": case.get("classname")}
        for child in case:
            out[child.tag] = {"message": child.get("message"), "type": child.get("type"),
                              "text": child.text or ""}
        print(json.dumps(out))
"#;

fn read_junit(python: &Path, path: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(python)
        .args(["-c", JUNIT_READER])
        .arg(path)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn annotations(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| l.starts_with("::")).collect()
}

#[test]
fn failing_ddp_job_annotated_summarised_and_junit() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("ci_ddp");
    std::fs::write(dir.join("train.py"), DDP_SCRIPT).unwrap();
    let raise_line = DDP_SCRIPT
        .lines()
        .position(|l| l.contains("raise ValueError"))
        .unwrap()
        + 1;
    let summary = dir.join("summary.md");
    std::fs::write(&summary, "earlier step\n").unwrap();
    let junit = dir.join("junit.xml");
    let out = Rdrun::new()
        .current_dir(dir.path())
        .env("PYTHON_EXEC", &py)
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_WORKSPACE", dir.path())
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["--nproc-per-node", "2", "--report-junit"])
        .arg(&junit)
        .arg("train.py")
        .timeout(std::time::Duration::from_secs(120))
        .run();
    // 134: rank 1 raised, then hit torch 2.15's teardown abort (launcher-tests/torch/README.md);
    // its printed traceback still places the annotation.
    assert!(matches!(out.code, Some(1 | 134)), "{out:?}");
    let exit = out.code.unwrap_or(0);
    assert_eq!(
        annotations(&out.stdout),
        [format!(
            "::error file=train.py,line={raise_line},title=rank 1%3A ValueError::ValueError: lr must be positive, got -1"
        )],
        "{out:?}"
    );

    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(
        md.starts_with(&format!(
            "earlier step\n### rdrun: `train.py` failed (exit {exit})\n"
        )),
        "{md}"
    );
    assert!(md.contains("**Root cause:** rank 1 (local rank 1"), "{md}");
    assert!(md.contains(&format!("train.py:{raise_line}`")), "{md}");
    assert!(md.contains("| 1 | 1 |"), "{md}");
    assert!(
        md.contains("<summary>Traceback of rank 1</summary>"),
        "{md}"
    );
    assert!(md.contains("in check"), "{md}");

    let cases = read_junit(&py, &junit);
    assert_eq!(cases[0]["suite"]["tests"], "2", "{cases:?}");
    assert_eq!(cases[0]["suite"]["name"], "rdrun train.py", "{cases:?}");
    let names: Vec<&str> = cases[1..]
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["rank 0", "rank 1"], "{cases:?}");
    let failure = &cases[2]["failure"];
    assert_eq!(failure["type"], "ValueError", "{cases:?}");
    assert_eq!(
        failure["message"], "ValueError: lr must be positive, got -1",
        "{cases:?}"
    );
    let text = failure["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("Traceback (most recent call last):"),
        "{text}"
    );
    assert!(
        text.contains(&format!("at train.py:{raise_line}"))
            || text.contains(&format!("train.py:{raise_line}\n")),
        "{text}"
    );
}

#[test]
fn nothing_outside_github_and_junit_on_success() {
    let dir = TempDir::new("ci_plain");
    // A failure without GITHUB_ACTIONS: no workflow command, no summary.
    let summary = dir.join("summary.md");
    let out = Rdrun::new()
        .env_remove("GITHUB_ACTIONS")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["--nproc-per-node", "2", "false"])
        .run();
    out.assert_code(1);
    assert!(annotations(&out.stdout).is_empty(), "{out:?}");
    assert!(!summary.exists());

    // Under GitHub, a failure without a traceback: the title names the status; no file.
    let out = Rdrun::new()
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["--nproc-per-node", "2"])
        .arg(worker("exit_with"))
        .args(["3", "1"])
        .run();
    out.assert_code(3);
    let a = annotations(&out.stdout);
    assert_eq!(a.len(), 1, "{out:?}");
    assert!(
        a[0].starts_with("::error title=rank 1%3A exit code 3::"),
        "{out:?}"
    );
    assert!(std::fs::read_to_string(&summary)
        .unwrap()
        .contains("failed (exit 3)"));

    // A success: JUnit written, one passing case per rank; GitHub gets nothing.
    let junit = dir.join("ok.xml");
    let before = std::fs::read_to_string(&summary).unwrap();
    let out = Rdrun::new()
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["--nproc-per-node", "2", "--report-junit"])
        .arg(&junit)
        .arg("true")
        .run();
    out.assert_code(0);
    assert!(annotations(&out.stdout).is_empty(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), before);
    let cases = read_junit(Path::new("python3"), &junit);
    assert_eq!(cases[0]["suite"]["tests"], "2", "{cases:?}");
    assert_eq!(cases[0]["suite"]["failures"], "0", "{cases:?}");
    assert!(
        cases[1..].iter().all(|c| c.get("failure").is_none()),
        "{cases:?}"
    );
}
