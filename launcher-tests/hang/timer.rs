//! Hang detection through torch's FileTimer (issue 13): rdrun serves the timer FIFO when
//! `TORCHELASTIC_ENABLE_FILE_TIMER=1` (an expired timer kills only that worker and the job
//! restarts; without restarts left the capture is the root cause; without the variable nothing
//! is served), and heartbeats sent as timer acquires with an `rdrun/` scope (a missed one names
//! its rank even while the rank is busy, regular ones keep a silent job alive, the `train`
//! binary beats once per step).

// Only the `train` binary's test needs these.
#[cfg(feature = "train")]
use std::time::Duration;

#[cfg(feature = "train")]
use crate::util::Rdrun;
use crate::util::TempDir;

use super::{find_dir, launch, launch_budget};

/// Attempt 0: rank 1 arms a FileTimer (torch's wire format, as `FileTimerClient` writes it)
/// that expires in about a second with SIGKILL, then sleeps; rank 0 just sleeps. Attempt 1:
/// every rank prints where the FIFO is and exits 0.
const FILE_TIMER: &str = r#"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then
    printf '{"version": 1, "pid": %d, "scope_id": "test#1", "expiration_time": %d, "signal": 9}\n' \
      $$ $(( $(date +%s) + 1 )) > "$TORCHELASTIC_TIMER_FILE"
  fi
  exec sleep 300
fi
echo "timer file $TORCHELASTIC_TIMER_FILE"
"#;

#[test]
fn file_timer_expiry_kills_only_that_worker_and_restarts() {
    let dir = TempDir::new("hang_file_timer");
    let logs = dir.join("logs");
    let out = launch(2)
        .args(["--hang-detect", "off", "--max-restarts=1"])
        .arg(format!("--log-dir={}", logs.display()))
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env_remove("TORCHELASTIC_TIMER_FILE")
        .args(["sh", "-c", FILE_TIMER])
        .run();
    // rdrun survived the expiry (torchrun SIGKILLs itself: 137) and restarted the group.
    out.assert_code(0);
    let lines: Vec<&str> = out.stderr.lines().collect();
    let signalled = lines
        .iter()
        .position(|l| l.contains("FileTimer expired: sending SIGKILL to that worker process only"))
        .unwrap_or_else(|| panic!("no expiry line: {out:?}"));
    let line = lines[signalled];
    assert!(line.contains("rank=1"), "{line}");
    assert!(line.contains("test#1"), "{line}");
    // The expired rank was captured first (detection is off: the FileTimer's own capture), in
    // one block naming the timer, then signalled.
    let block = lines
        .iter()
        .position(|l| {
            l.starts_with("[rdrun] HANG (FileTimer): torch FileTimer expired (rank 1 pid ")
        })
        .unwrap_or_else(|| panic!("no capture block: {out:?}"));
    assert!(block < signalled, "captured after the signal: {out:?}");
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
    assert!(
        lines[block].contains("scope \"test#1\""),
        "{}",
        lines[block]
    );
    assert!(
        out.stderr.contains("sending SIGKILL to rank 1 pid "),
        "the block names the action: {out:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("<- suspect: its FileTimer expired") && l.contains("rank 1 pid")),
        "{out:?}"
    );
    // Its file, taken while the process was alive: state and threads (a sleeping `sleep`).
    let hang_dir = find_dir(&logs, "attempt_0")
        .map(|d| d.join("hang"))
        .unwrap_or_else(|| panic!("no attempt_0 under {logs:?}: {out:?}"));
    let text = std::fs::read_to_string(hang_dir.join("rank1.txt"))
        .unwrap_or_else(|e| panic!("rank1.txt: {e}: {out:?}"));
    assert!(text.starts_with("rank 1 pid "), "{text}");
    assert!(
        text.contains(" state S"),
        "captured alive and asleep: {text}"
    );
    assert!(
        !hang_dir.join("rank0.txt").exists(),
        "only the expired rank is captured"
    );
    // Rank 1 was the root of the failure (killed by the timer's signal), rank 0 a bystander.
    assert!(
        out.stderr.contains("failed (exitcode: -9) local_rank: 1"),
        "{out:?}"
    );
    assert!(out.stderr.contains("restarts left"), "{out:?}");
    // The same private FIFO in both attempts, gone with its directory after the run.
    let paths: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split("timer file ").nth(1))
        .collect();
    assert_eq!(paths.len(), 2, "{out:?}");
    assert_eq!(paths[0], paths[1]);
    let fifo = std::path::Path::new(paths[0]);
    assert!(
        fifo.parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("rdrun-timer-"),
        "{fifo:?}"
    );
    assert!(!fifo.exists(), "FIFO left behind: {fifo:?}");
    assert!(!fifo.parent().unwrap().exists(), "dir left: {fifo:?}");
}

/// Without restarts left the FileTimer capture is the run's root cause, in the report and the
/// JSON, and rdrun exits with the killed worker's status (128 + 9), not its own SIGKILL.
#[test]
fn file_timer_expiry_is_the_root_cause_without_restarts() {
    let dir = TempDir::new("hang_file_timer_root");
    let report = dir.join("report.json");
    let out = launch(2)
        .args(["--hang-detect", "off", "--max-restarts=0"])
        .arg(format!("--report-json={}", report.display()))
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env_remove("TORCHELASTIC_TIMER_FILE")
        .args(["sh", "-c", FILE_TIMER])
        .run();
    out.assert_code(137);
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("report: {e}: {out:?}")),
    )
    .unwrap();
    assert_eq!(v["root_cause_kind"], "hang", "{v}");
    let root = &v["failures"][v["root_cause"].as_u64().unwrap() as usize];
    assert_eq!(root["rank"], 1, "the expired rank is the root cause: {v}");
    let msg = root["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("hang: torch FileTimer expired: rank 1 scope \"test#1\" (SIGKILL)"),
        "{v}"
    );
    assert!(msg.contains("; stacks in "), "{v}");
}

#[test]
fn file_timer_off_without_enable() {
    // As torchrun: without TORCHELASTIC_ENABLE_FILE_TIMER=1 nothing is served and no
    // TORCHELASTIC_TIMER_FILE is invented.
    let out = launch(1)
        .env_remove("TORCHELASTIC_ENABLE_FILE_TIMER")
        .env_remove("TORCHELASTIC_TIMER_FILE")
        .args([
            "sh",
            "-c",
            "echo \"file=[${TORCHELASTIC_TIMER_FILE-unset}]\"",
        ])
        .run();
    out.assert_code(0);
    assert!(out.stdout.contains("file=[unset]"), "{out:?}");
}

/// One heartbeat line as rdrun's runtime watchdog (or torch's `FileTimerClient(path, signal=0)`
/// with scope `rdrun/heartbeat`) writes it, budget `$1` seconds, sent by the shell itself.
const BEAT_FN: &str = r#"beat() {
  printf '{"version": 1, "pid": %d, "scope_id": "rdrun/heartbeat", "expiration_time": %d, "signal": 0, "rank": %d, "step": %d}\n' \
    $$ $(( $(date +%s) + $1 )) "$RANK" "$2" > "$TORCHELASTIC_TIMER_FILE"
}
"#;

#[test]
fn missed_heartbeat_names_the_rank_even_while_it_is_busy() {
    // Attempt 0: rank 1 beats once (budget 2 s) and then spins on the CPU without beating:
    // the quiet rule (budget 60 s) cannot fire, only the heartbeat rule. Signal 0: the
    // FileTimer itself must never kill it. Attempt 1: both exit 0.
    let script = format!(
        r#"{BEAT_FN}
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then beat 2 5; while :; do :; done; fi
  exec sleep 300
fi
echo "ok rank $RANK attempt $TORCHELASTIC_RESTART_COUNT""#
    );
    let out = launch_budget(2, "60")
        .arg("--max-restarts=1")
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env_remove("TORCHELASTIC_TIMER_FILE")
        .args(["sh", "-c", &script])
        .run();
    out.assert_code(0);
    assert_eq!(out.stderr.matches("[rdrun] HANG (").count(), 1, "{out:?}");
    assert!(
        out.stderr.contains("rank 1 sent no heartbeat for"),
        "{out:?}"
    );
    let suspect = out
        .stderr
        .lines()
        .find(|l| l.contains("<- suspect"))
        .unwrap_or_else(|| panic!("no suspect: {out:?}"));
    assert!(
        suspect.contains("rank 1 pid") && suspect.contains("heartbeat past its budget"),
        "{suspect}"
    );
    assert!(!out.stderr.contains("FileTimer expired"), "{out:?}");
    assert!(out.stderr.contains("restarts left"), "{out:?}");
    for r in 0..2 {
        assert!(
            out.stdout.contains(&format!("ok rank {r} attempt 1")),
            "{out:?}"
        );
    }
}

#[test]
fn regular_heartbeats_keep_a_silent_job_alive() {
    // No output, no CPU, no I/O for 8 s (4 quiet budgets), but a heartbeat (budget 3 s)
    // every 0.5 s: heartbeats are activity and renewals keep their budget.
    let script = format!(
        r#"{BEAT_FN}
i=0; while [ $i -lt 16 ]; do beat 3 $i; sleep 0.5; i=$((i+1)); done"#
    );
    let out = launch(2)
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env_remove("TORCHELASTIC_TIMER_FILE")
        .args(["sh", "-c", &script])
        .run();
    out.assert_code(0);
    assert!(!out.stderr.contains("HANG"), "{out:?}");
    assert!(!out.stderr.contains("FileTimer"), "{out:?}");
}

/// The `train` binary beats once per step through `runtime::Watchdog`: a user-set
/// `TORCHELASTIC_TIMER_FILE` without `TORCHELASTIC_ENABLE_FILE_TIMER=1` passes through unserved
/// (as torchrun), so the test serves the FIFO itself and reads the beats.
#[cfg(feature = "train")]
#[test]
fn train_beats_on_the_timer_fifo() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = TempDir::new("hang_train_beats");
    let fifo = dir.join("timer");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let out = Rdrun::new()
        .arg("--standalone")
        .arg("--nproc_per_node=1")
        .env_remove("TORCHELASTIC_ENABLE_FILE_TIMER")
        .env("TORCHELASTIC_TIMER_FILE", &fifo)
        .env("RDRUN_HEARTBEAT_TIMEOUT", "120")
        .timeout(Duration::from_secs(180))
        .arg(env!("CARGO_BIN_EXE_train"))
        .args(["--epochs", "2", "--samples", "256"])
        .run();
    out.assert_code(0);
    let mut buf = vec![0u8; 1 << 16];
    let n = reader.read(&mut buf).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    let beats: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(!beats.is_empty(), "no heartbeat: {out:?}");
    let mut last = 0;
    for b in &beats {
        assert_eq!(b["scope_id"], "rdrun/heartbeat", "{b}");
        assert_eq!(
            (b["signal"].as_i64(), b["rank"].as_i64()),
            (Some(0), Some(0)),
            "{b}"
        );
        let step = b["step"].as_u64().unwrap();
        assert!(step > last, "steps must grow: {text}");
        last = step;
        let exp = b["expiration_time"].as_f64().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(exp > now + 60.0, "budget from RDRUN_HEARTBEAT_TIMEOUT: {b}");
    }
}
