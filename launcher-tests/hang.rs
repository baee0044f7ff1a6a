//! Hang detection wired into the agent (issue 13), with small test budgets: a job whose ranks
//! all go silent is detected, captured (`attempt_<n>/hang/rank<R>.txt`), named in one block with
//! a suspect, stopped and restarted (the second attempt succeeds); a CPU-busy silent worker and
//! a worker printing periodically are never flagged; `off` never fires; `observe` reports but
//! leaves the workers running; bad values are usage errors naming the flag or variable.
//! Multi-node, two static agents in network namespaces (skipped where not root): every node
//! quiet gives one verdict that every agent captures and acts on, naming the other node's
//! suspect; a busy rank on one node keeps the quiet node from a verdict.
//!
//! Correctness never depends on timing: a false-alarm test's workers stay active the whole
//! time (a quiet spell never reaches the budget), and a hang test's workers stay silent until
//! rdrun stops them, however slowly the machine runs. Every run has rdrun's hard timeout.

use std::time::Duration;

use crate::util::{Rdrun, TempDir};

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

/// One static agent of a 2-node job in network namespace `node` of `net`, with the small
/// budgets of [`launch_budget`] (2 s), its own log directory, `--max-restarts`, and
/// `sh -c script`.
fn netns_agent(
    net: &crate::netns::Netns,
    node: usize,
    nproc: usize,
    dir: &TempDir,
    max_restarts: u32,
    script: &str,
) -> Rdrun {
    netns_agent_on(net, node, nproc, dir, max_restarts, script, false)
}

/// As [`netns_agent`]; `c10d`: the c10d backend (endpoint on node 0, no `--node-rank`: the
/// group ranks are the rendezvous' choice) instead of static.
fn netns_agent_on(
    net: &crate::netns::Netns,
    node: usize,
    nproc: usize,
    dir: &TempDir,
    max_restarts: u32,
    script: &str,
    c10d: bool,
) -> Rdrun {
    let rdzv: Vec<String> = if c10d {
        [
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &format!("{}:29400", net.addr(0)),
            "--rdzv-id",
            "hangjob",
        ]
        .map(String::from)
        .to_vec()
    } else {
        [
            "--nnodes",
            "2",
            "--node-rank",
            &node.to_string(),
            "--master-addr",
            &net.addr(0),
            "--master-port",
            "29500",
        ]
        .map(String::from)
        .to_vec()
    };
    Rdrun::new()
        .args(rdzv)
        .arg(format!("--max-restarts={max_restarts}"))
        .arg(format!("--nproc-per-node={nproc}"))
        .args(["--hang-timeout", "2", "--hang-startup-timeout", "2"])
        .args(["--hang-poll-interval", "0.25"])
        .env_remove("RDRUN_HANG_DETECT")
        .env_remove("RDRUN_HANG_TIMEOUT")
        .env_remove("RDRUN_HANG_STARTUP_TIMEOUT")
        .env_remove("RDRUN_HANG_POLL_INTERVAL")
        .env_remove("RDRUN_PY_SPY")
        .arg(format!(
            "--log-dir={}",
            dir.join(format!("logs{node}")).display()
        ))
        .args(["--tee", "3"])
        .env("D", dir.path())
        .timeout(Duration::from_secs(150))
        .netns(&net.name(node))
        .args(["--no-python", "sh", "-c", script])
}

/// The pids the workers of [`netns_agent`] scripts recorded (`pid.<rank>.<attempt>`).
fn recorded_worker_pids(dir: &std::path::Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("pid.").then_some(())?;
            std::fs::read_to_string(e.path()).ok()?.trim().parse().ok()
        })
        .collect()
}

/// Attempt 0: every rank of both nodes goes silent after one line; rank 4 (node 1) blocks
/// opening a FIFO nobody writes — on its node the odd kernel wait among 3 ranks, hence the
/// suspect — while the others sleep (on node 0 there is no odd one out). Attempt 1: every rank
/// prints and exits 0.
const TWO_NODE_HANG: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  echo "before the hang $RANK"
  if [ "$RANK" = 4 ]; then exec cat "$D/never"; fi
  exec sleep 300
fi
echo "ok rank $RANK attempt $TORCHELASTIC_RESTART_COUNT"
"#;

/// Multi-node (issue 13): every node quiet → one verdict for the job, taken by every agent:
/// each captures its own ranks and prints one block naming the same declaring node, node 0's
/// block names the suspect on node 1, both stop their workers and the job restarts once.
#[test]
fn netns_two_nodes_one_hung_rank_every_agent_captures_and_restarts() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns");
        let fifo = dir.join("never");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: plain mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 3, &dir, 1, TWO_NODE_HANG).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        for o in &outs {
            o.assert_code(0);
            assert_eq!(o.stderr.matches("[rdrun] HANG (").count(), 1, "{o:?}");
            assert!(o.stderr.contains("no activity on any of 2 nodes"), "{o:?}");
            assert!(o.stderr.contains("stopping the worker group"), "{o:?}");
            // The job's suspect, in every node's block (node 1 found it, node 0 read it).
            assert!(o.stderr.contains("job suspect: rank 4 on node 1"), "{o:?}");
        }
        // One verdict: both blocks name the same declaring node.
        let by = |o: &crate::util::Output| {
            let i = o.stderr.find("declared by node ").expect("declared by") + 17;
            o.stderr[i..i + 1].to_string()
        };
        assert_eq!(by(&outs[0]), by(&outs[1]));
        // Node 0's block lists node 1's findings; node 1 marks rank 4 itself.
        assert!(
            outs[0]
                .stderr
                .contains("node 1 ranks [3, 4, 5]: suspect rank 4"),
            "{:?}",
            outs[0]
        );
        let line = outs[1]
            .stderr
            .lines()
            .find(|l| l.contains("<- suspect"))
            .unwrap_or_else(|| panic!("node 1 names no suspect: {:?}", outs[1]));
        assert!(line.contains("rank 4 pid"), "{line}");
        // Every node captured its own ranks, then restarted with one count.
        for (n, ranks) in [(0usize, 0..3u32), (1, 3..6)] {
            let hang = find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                .expect("attempt_0")
                .join("hang");
            for r in ranks.clone() {
                assert!(
                    hang.join(format!("rank{r}.txt")).is_file(),
                    "node {n} rank {r} not captured in {hang:?}"
                );
                assert!(
                    outs[n].stdout.contains(&format!("ok rank {r} attempt 1")),
                    "{:?}",
                    outs[n]
                );
            }
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// The same over the c10d backend (its store on node 0's agent): one verdict, every agent
/// captures and restarts, the suspect named in both blocks. Which agent gets group rank 1 is
/// the rendezvous' choice, so the checks do not depend on the agent's index.
#[test]
fn netns_c10d_two_nodes_one_hung_rank_one_verdict() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_c10d");
        let fifo = dir.join("never");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: plain mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent_on(&net, n, 3, &dir, 1, TWO_NODE_HANG, true).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        let mut declared = Vec::new();
        for o in &outs {
            o.assert_code(0);
            assert_eq!(o.stderr.matches("[rdrun] HANG (").count(), 1, "{o:?}");
            assert!(o.stderr.contains("no activity on any of 2 nodes"), "{o:?}");
            assert!(o.stderr.contains("job suspect: rank 4 on node 1"), "{o:?}");
            let i = o.stderr.find("declared by node ").expect("declared by") + 17;
            declared.push(o.stderr[i..i + 1].to_string());
        }
        assert_eq!(declared[0], declared[1], "one verdict for the job");
        let stdout: String = outs.iter().map(|o| o.stdout.as_str()).collect();
        for r in 0..6 {
            assert!(
                stdout.contains(&format!("ok rank {r} attempt 1")),
                "rank {r} did not restart: {outs:?}"
            );
            let captured = (0..2).any(|n| {
                find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                    .is_some_and(|d| d.join("hang").join(format!("rank{r}.txt")).is_file())
            });
            assert!(captured, "rank {r} not captured");
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Attempt-less: ranks 0, 1 (node 0) and 2 (node 1) block silently on their own FIFO; rank 3
/// (node 1) burns CPU for 12 s (6x the budget, 3x the fallback budget), then opens each FIFO
/// and exits; every rank exits 0.
const ONE_BUSY_NODE: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
if [ "$RANK" = 3 ]; then
  end=$(( $(date +%s) + 12 ))
  while [ "$(date +%s)" -lt "$end" ]; do :; done
  touch "$D/busy_done"
  for r in 0 1 2; do echo go > "$D/f$r"; done
  exit 0
fi
exec cat "$D/f$RANK"
"#;

/// Multi-node: a node with an active rank keeps the quiet node from a verdict. Node 0's ranks
/// are silent far past the 2 s budget (the local rule alone fires there), but node 1's rank 3
/// burns CPU the whole time; the run then ends normally with no hang reported anywhere.
#[test]
fn netns_active_rank_on_one_node_prevents_the_verdict_on_the_other() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_busy");
        for r in 0..3 {
            let c = std::ffi::CString::new(dir.join(format!("f{r}")).to_str().unwrap()).unwrap();
            // SAFETY: plain mkfifo(3) on a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 2, &dir, 0, ONE_BUSY_NODE).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        for o in &outs {
            assert!(!o.stderr.contains("HANG"), "{o:?}");
            o.assert_code(0);
        }
        assert!(dir.join("busy_done").exists(), "rank 3 did not finish");
        for r in 0..3 {
            let n = usize::from(r >= 2);
            assert!(
                outs[n].stdout.contains("go"),
                "rank {r} never got its go: {:?}",
                outs[n]
            );
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Every rank prints a line every 0.2 s (activity: no verdict is possible) until `$D/quiet`
/// exists, then goes silent.
const TICK_THEN_QUIET: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
while [ ! -e "$D/quiet" ]; do echo "tick $RANK"; sleep 0.2; done
exec sleep 300
"#;

/// Multi-node with the store lost (issue 13): node 1's cable is pulled while every rank is
/// still active, then every rank goes quiet. Node 1 cannot read the other nodes' state, so it
/// judges alone at twice the budget and says so in its block; node 0 (the store's host) sees
/// node 1's report stop changing, counts it quiet since last seen, and declares the job hung.
/// Both capture their own ranks and stop their workers (no restarts left). The order is made
/// by the files, not by timing: nothing can be judged before `$D/quiet` exists.
#[test]
fn netns_store_lost_node_falls_back_to_the_local_rule() {
    crate::netns::bounded(Duration::from_secs(300), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_lost");
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 2, &dir, 0, TICK_THEN_QUIET).spawn())
            .collect();
        // Every rank of both nodes is running (and ticking) before the cut.
        let started = std::time::Instant::now();
        while (0..4).any(|r| !dir.join(format!("pid.{r}.0")).exists()) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "workers did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let node 1 publish a few reports first (it is then a node node 0 has seen).
        std::thread::sleep(Duration::from_secs(1));
        net.cut(1);
        std::fs::write(dir.join("quiet"), "").unwrap();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        // Node 1: the local rule at 2x the budget, named in its one block.
        let o1 = &outs[1];
        assert_eq!(o1.stderr.matches("[rdrun] HANG (").count(), 1, "{o1:?}");
        assert!(
            o1.stderr
                .contains("the other nodes' state is unknown (the rendezvous store is unreachable"),
            "{o1:?}"
        );
        assert!(
            o1.stderr.contains("(budget 4s)"),
            "twice the 2 s budget: {o1:?}"
        );
        assert!(o1.stderr.contains("stopping the worker group"), "{o1:?}");
        assert_ne!(o1.code, Some(0), "{o1:?}");
        // Node 0: every node quiet (node 1's report stale), the job's verdict.
        let o0 = &outs[0];
        assert_eq!(o0.stderr.matches("[rdrun] HANG (").count(), 1, "{o0:?}");
        assert!(
            o0.stderr.contains("no activity on any of 2 nodes"),
            "{o0:?}"
        );
        assert_ne!(o0.code, Some(0), "{o0:?}");
        for (n, ranks) in [(0usize, 0..2u32), (1, 2..4)] {
            let hang = find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                .expect("attempt_0")
                .join("hang");
            for r in ranks {
                assert!(
                    hang.join(format!("rank{r}.txt")).is_file(),
                    "node {n} rank {r} not captured in {hang:?}"
                );
            }
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}
