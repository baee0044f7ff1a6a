//! Hang detection with real PyTorch DDP (gloo, 2 ranks; issue 24): who is named the suspect
//! when the healthy rank waits in DDP's backward. Rank 1 waiting on a `threading.Event` in its
//! own step, or whose DataLoader worker process is stuck in the dataset, is the suspect, not
//! rank 0 waiting for it in autograd's engine; the stuck worker's stack is captured under rank
//! 1, and each rank's line in the block shows the library call and the user's own frame.
//!
//! Needs the torch venv (`scripts/torch-venv.sh`, with py-spy); skipped, saying so, without it
//! or where py-spy may not read the workers (ptrace denied). Every run has rdrun's hard
//! timeout; no assertion is about time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::find_dir;
use crate::util::{Output, Rdrun, TempDir};

/// The torch venv's python (`scripts/torch-venv.sh` builds it), if present.
fn torch_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/python");
    p.exists().then_some(p)
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("launcher-tests/torch/scripts")
        .join(name)
}

/// Two ranks of `script` under the venv's python (py-spy is found beside it), one restart, a
/// 5 s steady budget (every rank prints before it hangs) and a long startup one (torch's import
/// on a loaded machine is never mistaken for a hang).
fn run_job(python: &Path, name: &str, dir: &TempDir) -> (Output, PathBuf) {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let logs = dir.join("logs");
    let o = Rdrun::new()
        .args(["--standalone", "--nproc_per_node=2", "--max-restarts=1"])
        .args(["--hang-timeout", "5", "--hang-startup-timeout", "300"])
        .args(["--hang-poll-interval", "0.5"])
        .arg(format!("--log-dir={}", logs.display()))
        .env_remove("RDRUN_HANG_DETECT")
        .env_remove("RDRUN_HANG_TIMEOUT")
        .env_remove("RDRUN_HANG_STARTUP_TIMEOUT")
        .env_remove("RDRUN_HANG_POLL_INTERVAL")
        .env_remove("RDRUN_PY_SPY")
        .env("PYTHONUNBUFFERED", "1")
        .timeout(Duration::from_secs(400))
        .arg("--no-python")
        .arg(python)
        .arg(script(name))
        .arg("--out")
        .arg(&out)
        .run();
    (o, out)
}

/// The block's line of `rank` (`[rdrun]   rank R pid ...`).
fn rank_line(o: &Output, rank: u32) -> String {
    let head = format!("[rdrun]   rank {rank} pid ");
    o.stderr
        .lines()
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no line for rank {rank}: {o:?}"))
        .to_string()
}

/// The capture's file of `rank`, or None (with a SKIP line) when py-spy could not read it.
fn rank_file(o: &Output, logs: &Path, rank: u32) -> Option<String> {
    let dir = find_dir(logs, "attempt_0")
        .unwrap_or_else(|| panic!("no attempt_0 under {logs:?}: {o:?}"))
        .join("hang");
    let text = std::fs::read_to_string(dir.join(format!("rank{rank}.txt")))
        .unwrap_or_else(|e| panic!("rank{rank}.txt: {e}: {o:?}"));
    if !text.contains("python stack: ok") {
        eprintln!("SKIPPED stack assertions: py-spy could not read rank {rank}:\n{text}");
        return None;
    }
    Some(text)
}

/// Both ranks finished attempt 1 after the hang's restart.
fn assert_restarted(o: &Output, out: &Path) {
    o.assert_code(0);
    assert_eq!(o.stderr.matches("[rdrun] HANG (").count(), 1, "{o:?}");
    for r in 0..2 {
        let done = std::fs::read_to_string(out.join(format!("done_rank{r}.txt")))
            .unwrap_or_else(|e| panic!("done_rank{r}.txt: {e}: {o:?}"));
        assert_eq!(done.trim(), "1", "{o:?}");
    }
}

#[test]
fn ddp_threading_event_wait_names_that_rank_not_the_one_in_backward() {
    let Some(python) = torch_python() else {
        eprintln!("SKIPPED: no torch venv (scripts/torch-venv.sh builds it)");
        return;
    };
    let dir = TempDir::new("hang_ddp_event");
    let (o, out) = run_job(&python, "hang_ddp_event.py", &dir);
    assert_restarted(&o, &out);
    if rank_file(&o, &dir.join("logs"), 1).is_none()
        || rank_file(&o, &dir.join("logs"), 0).is_none()
    {
        return;
    }
    let (l0, l1) = (rank_line(&o, 0), rank_line(&o, 1));
    assert!(
        !l0.contains("<- suspect"),
        "rank 0 waits in DDP's backward: {o:?}"
    );
    assert!(
        l1.contains(
            "<- suspect: not in a collective: waits in Event.wait from its own code \
             wait_for_the_signal (hang_ddp_event.py:"
        ),
        "{o:?}"
    );
    // The library call, then the user's innermost frame.
    assert!(
        l0.contains("  _engine_run_backward ← step (hang_ddp_event.py:"),
        "{l0}"
    );
    assert!(
        l1.contains("  Condition.wait ← wait_for_the_signal (hang_ddp_event.py:"),
        "{l1}"
    );
    assert!(
        o.stderr.contains("suspect rank 1 (not in a collective"),
        "the root cause names rank 1: {o:?}"
    );
}

#[test]
fn ddp_stuck_dataloader_worker_names_its_rank_and_captures_the_worker() {
    let Some(python) = torch_python() else {
        eprintln!("SKIPPED: no torch venv (scripts/torch-venv.sh builds it)");
        return;
    };
    let dir = TempDir::new("hang_ddp_loader");
    let (o, out) = run_job(&python, "hang_ddp_loader.py", &dir);
    assert_restarted(&o, &out);
    let stuck: i32 = std::fs::read_to_string(out.join("stuck_pid.txt"))
        .unwrap_or_else(|e| panic!("stuck_pid.txt: {e}: {o:?}"))
        .trim()
        .parse()
        .unwrap();
    let Some(file1) = rank_file(&o, &dir.join("logs"), 1) else {
        return;
    };
    if rank_file(&o, &dir.join("logs"), 0).is_none() {
        return;
    }
    let (l0, l1) = (rank_line(&o, 0), rank_line(&o, 1));
    assert!(
        !l0.contains("<- suspect"),
        "rank 0 waits in DDP's backward: {o:?}"
    );
    assert!(
        l1.contains(&format!(
            "<- suspect: not in a collective: waits on its DataLoader; its DataLoader worker \
             pid {stuck} is stuck in stuck_forever (hang_ddp_loader.py:"
        )),
        "{o:?}"
    );
    assert!(
        o.stderr.contains(&format!(
            "[rdrun]   rank 1 child pid {stuck} stuck in stuck_forever (hang_ddp_loader.py:"
        )),
        "{o:?}"
    );
    // The stuck worker's own stack is in rank 1's file, with the dataset frame that called it.
    let section = file1
        .split(&format!("\nchild process {stuck} (parent "))
        .nth(1)
        .unwrap_or_else(|| panic!("no stack of child {stuck} in rank1.txt:\n{file1}"));
    assert!(
        section.contains("python stack: ok (stuck in user code)"),
        "{section}"
    );
    let stack = section.split("\nchild process ").next().unwrap_or(section);
    assert!(
        stack.contains("stuck_forever (") && stack.contains("Samples.__getitem__ ("),
        "{stack}"
    );
}
