//! Hang detection wired into the agent (issue 13), with small test budgets.
//!
//! Correctness never depends on timing: a false-alarm test's workers stay active the whole
//! time (a quiet spell never reaches the budget), and a hang test's workers stay silent until
//! rdrun stops them, however slowly the machine runs. Every run has rdrun's hard timeout.
//!
//! This file: the shared launchers and one node's silence rule: a job whose ranks all go silent
//! is detected, captured (`attempt_<n>/hang/rank<R>.txt`), named in one block with a suspect,
//! stopped and restarted (the second attempt succeeds), or is the root cause without restarts
//! left; a CPU-busy silent worker, a worker printing periodically, an I/O-only worker and
//! stopped workers are never flagged; `off` never fires; `observe` reports but leaves the
//! workers running; bad values are usage errors naming the flag or variable. The children:
//! - `timer`: torch's FileTimer served by rdrun (an expiry kills only that worker) and
//!   heartbeats through the timer (a missed one names its rank, regular ones keep a silent job
//!   alive, the `train` binary's beats).
//! - `nodes`: multi-node, two agents in network namespaces (skipped where not root): every node
//!   quiet gives one verdict that every agent captures and acts on (static and c10d), naming the
//!   other node's suspect; a busy rank on one node keeps the quiet node from a verdict; a node
//!   that lost the store falls back to the local rule.
//! - `torch`: real PyTorch DDP jobs: whom the suspect rules name (issue 24).

use std::time::Duration;

use crate::util::{Rdrun, TempDir};

/// Multi-node: one verdict for the job, across network namespaces.
mod nodes;
/// torch's FileTimer and heartbeats through it.
mod timer;
/// Real PyTorch DDP jobs: whom the suspect rules name (issue 24).
mod torch;

/// Small budgets: 2 s quiet (startup and steady), polled every 0.25 s.
fn launch(nproc: usize) -> Rdrun {
    launch_budget(nproc, "2")
}

/// As [`launch`] with another quiet budget (seconds, startup and steady).
fn launch_budget(nproc: usize, budget: &str) -> Rdrun {
    Rdrun::new()
        .arg("--standalone")
        .arg(format!("--nproc_per_node={nproc}"))
        .args(["--hang-timeout", budget, "--hang-startup-timeout", budget])
        .args(["--hang-poll-interval", "0.25"])
        .env_remove("RDRUN_HANG_DETECT")
        .env_remove("RDRUN_HANG_TIMEOUT")
        .env_remove("RDRUN_HANG_STARTUP_TIMEOUT")
        .env_remove("RDRUN_HANG_POLL_INTERVAL")
        .env_remove("RDRUN_PY_SPY")
        .timeout(Duration::from_secs(90))
        .arg("--no-python")
}

/// Attempt 0: ranks 0 and 2 sleep, rank 1 blocks opening a FIFO nobody writes (a different
/// kernel wait: the odd one out, hence the suspect), each after one line of output (kept as its
/// last output). Attempt 1: every rank prints and exits 0.
const HANG_THEN_OK: &str = r#"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  echo "before the hang $RANK"
  if [ "$RANK" = 1 ]; then exec cat "$FIFO"; fi
  exec sleep 300
fi
echo "ok rank $RANK attempt $TORCHELASTIC_RESTART_COUNT"
"#;

#[test]
fn silent_job_is_captured_stopped_and_restarted() {
    let dir = TempDir::new("hang_restart");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let logs = dir.join("logs");
    let out = launch(3)
        .arg("--max-restarts=1")
        .arg(format!("--log-dir={}", logs.display()))
        .args(["--tee", "3"])
        .env("FIFO", &fifo)
        .args(["sh", "-c", HANG_THEN_OK])
        .run();
    out.assert_code(0);
    // One block, naming the hang, the budget and the suspect.
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
    assert!(
        out.stderr.contains("no activity on any of 3 ranks"),
        "{out:?}"
    );
    assert!(out.stderr.contains("(budget 2s)"), "{out:?}");
    let suspect_line = out
        .stderr
        .lines()
        .find(|l| l.contains("<- suspect"))
        .unwrap_or_else(|| panic!("no suspect named: {out:?}"));
    assert!(suspect_line.contains("rank 1 pid"), "{suspect_line}");
    assert!(out.stderr.contains("stopping the worker group"), "{out:?}");
    // The files: one per rank, with the process and thread facts.
    // The run directory is named after the (generated) run id: find attempt_0 under it.
    let hang_dir = find_dir(&logs, "attempt_0")
        .map(|d| d.join("hang"))
        .unwrap_or_else(|| panic!("no attempt_0 under {logs:?}: {out:?}"));
    assert!(
        out.stderr
            .contains(&format!("{}/rank<R>.txt", hang_dir.display())),
        "the block names the files: {out:?}"
    );
    for r in 0..3 {
        let text = std::fs::read_to_string(hang_dir.join(format!("rank{r}.txt")))
            .unwrap_or_else(|e| panic!("rank{r}.txt: {e}: {out:?}"));
        assert!(text.starts_with(&format!("rank {r} pid ")), "{text}");
        assert!(
            text.contains("threads (tid, name, state, wchan, syscall):"),
            "{text}"
        );
        assert!(text.contains("python stack: "), "{text}");
        let last = text.split("\nlast output:\n").nth(1).unwrap_or_default();
        assert!(last.contains(&format!("before the hang {r}")), "{text}");
    }
    assert!(
        out.stderr
            .contains("[rdrun]   rank 1 last output: \"before the hang 1\""),
        "{out:?}"
    );
    // The hang counted as a failure: attempt 1 ran (and succeeded).
    for r in 0..3 {
        assert!(
            out.stdout.contains(&format!("ok rank {r} attempt 1")),
            "{out:?}"
        );
    }
    assert!(out.stderr.contains("restarts left"), "{out:?}");
}

#[test]
fn hang_without_restarts_left_names_hang_as_root_cause() {
    let dir = TempDir::new("hang_root");
    let report = dir.join("report.json");
    let out = launch(2)
        .arg(format!("--report-json={}", report.display()))
        .args(["sh", "-c", "exec sleep 300"])
        .run();
    // Both workers died of rdrun's SIGTERM: the root cause's own status (128+15).
    out.assert_code(143);
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
    let root = out
        .stderr
        .split("Root Cause (first observed failure):")
        .nth(1)
        .unwrap_or_else(|| panic!("no root cause block: {out:?}"));
    assert!(
        root.contains("traceback : hang: no activity on any of 2 ranks"),
        "{out:?}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["root_cause_kind"], "hang", "{json}");
    let idx = json["root_cause"].as_u64().unwrap() as usize;
    let msg = json["failures"][idx]["message"].as_str().unwrap();
    assert!(msg.starts_with("hang: no activity"), "{msg}");
}

#[test]
fn cpu_busy_silent_worker_is_not_a_hang() {
    // Busy for 8 s (4 budgets) without a byte of output.
    let script = r#"end=$(( $(date +%s) + 8 ))
while [ "$(date +%s)" -lt "$end" ]; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; done"#;
    let out = launch(2).args(["sh", "-c", script]).run();
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
}

#[test]
fn periodically_printing_worker_is_not_a_hang() {
    // One line every 0.5 s for 8 s; nothing else (sleep uses no CPU).
    let script = "i=0; while [ $i -lt 16 ]; do echo tick $i; sleep 0.5; i=$((i+1)); done";
    let out = launch(2).args(["sh", "-c", script]).run();
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
    assert_eq!(out.stdout.matches("tick 15").count(), 2, "{out:?}");
}

#[test]
fn off_never_fires() {
    let out = launch(2)
        .args(["--hang-detect", "off"])
        .args(["sh", "-c", "sleep 6"])
        .run();
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
}

#[test]
fn observe_reports_once_and_never_kills() {
    // The mode from the environment (RDRUN_HANG_DETECT) this time.
    let dir = TempDir::new("hang_observe");
    let out = launch(2)
        .env("RDRUN_HANG_DETECT", "observe")
        .arg(format!("--log-dir={}", dir.join("logs").display()))
        .args(["sh", "-c", "sleep 7; echo done $RANK"])
        .run();
    out.assert_code(0);
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
    assert!(
        out.stderr.contains("observe mode: workers left running"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("done 0") && out.stdout.contains("done 1"),
        "{out:?}"
    );
}

#[test]
fn bad_values_are_usage_errors() {
    let out = launch(1).args(["--hang-timeout", "soon"]).arg("true").run();
    out.assert_code(2);
    assert!(out.stderr.contains("--hang-timeout"), "{out:?}");
    let out = Rdrun::new()
        .arg("--standalone")
        .env("RDRUN_HANG_DETECT", "sometimes")
        .args(["--no-python", "true"])
        .run();
    out.assert_code(2);
    assert!(out.stderr.contains("RDRUN_HANG_DETECT"), "{out:?}");
}

fn find_dir(root: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == name) {
                return Some(p);
            }
            if let Some(f) = find_dir(&p, name) {
                return Some(f);
            }
        }
    }
    None
}

#[test]
fn stopped_workers_are_exempt() {
    // Each worker stops itself (no quiet spell before the stop that timing could stretch),
    // stays stopped for 3 budgets, and prints as soon as it is continued.
    let dir = TempDir::new("hang_stopped");
    let script = r#"echo $$ > "$D/pid.$LOCAL_RANK.tmp"; mv "$D/pid.$LOCAL_RANK.tmp" "$D/pid.$LOCAL_RANK"
kill -STOP $$
echo "resumed $LOCAL_RANK""#;
    let run = launch(2)
        .env("D", dir.path())
        .args(["sh", "-c", script])
        .spawn();
    let mut pids = Vec::new();
    for lr in 0..2 {
        let p = dir.join(format!("pid.{lr}"));
        assert!(crate::util::wait_for_file(&p, Duration::from_secs(30)));
        pids.push(crate::util::read_pid(&p));
    }
    let stopped = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !pids.iter().all(|&p| stopped(p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_stopped = pids.iter().all(|&p| stopped(p));
    if all_stopped {
        std::thread::sleep(Duration::from_secs(6));
    }
    for &p in &pids {
        // SAFETY: plain kill(2) on our workers' pids (still alive: rdrun has not reaped them).
        unsafe { libc::kill(p, libc::SIGCONT) };
    }
    let out = run.wait();
    assert!(all_stopped, "workers never stopped: {out:?}");
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
    assert!(
        out.stdout.contains("resumed 0") && out.stdout.contains("resumed 1"),
        "{out:?}"
    );
}

#[test]
fn io_only_worker_is_not_a_hang() {
    // CPU never counts here (threshold far above any real use) and there is no output: the
    // shell's own writes (printf is a builtin: the worker process itself does the I/O,
    // 128 KiB every 0.1 s) are the only activity, for 8 s (4 budgets).
    let script = r#"exec 3>"$D/io.$LOCAL_RANK"
end=$(( $(date +%s) + 8 ))
while [ "$(date +%s)" -lt "$end" ]; do printf '%131072s' '' >&3; sleep 0.1; done"#;
    let dir = TempDir::new("hang_io_only");
    let out = launch(2)
        .args(["--hang-cpu-idle", "100000"])
        .env("D", dir.path())
        .args(["sh", "-c", script])
        .run();
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
    // The control: the same worker with I/O not counting either is a hang (so the run above
    // passed because of its I/O, not because nothing was judged).
    let out = launch(2)
        .args([
            "--hang-cpu-idle",
            "100000",
            "--hang-io-idle",
            "1000000000000",
        ])
        .args(["--hang-detect", "observe"])
        .env("D", dir.path())
        .args(["sh", "-c", script])
        .run();
    out.assert_code(0);
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
}
