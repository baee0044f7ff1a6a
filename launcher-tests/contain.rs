//! Containment (issue 10): nothing a worker starts outlives rdrun's death — not a plain
//! background child, nor one that called `setsid`, nor a double-forked (re-parented) one, nor
//! both — whether rdrun alone or its whole process group is SIGKILLed, in steady state, during
//! start-up or during a restart loop; the watchdog exits and removes the run's cgroup and
//! shared-memory segments; after an ordinary run nothing of rdrun's is left, zombies included.
//!
//! Every rdrun runs in its own process group (so that the group can be killed without the test)
//! with a unique `RDRUN_TEST_TAG` in its environment: survivors are found by that tag in
//! `/proc/<pid>/environ` (every descendant inherits it, the watchdog too), killed by PID, and
//! counted. The reduced CI counts are below; `scripts/orphan-loop.sh` runs 100 tries per kind.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdrun::supervisor::group::contain;

use crate::util::{alive, rdrun_bin, worker, TempDir};

const KINDS: [&str; 4] = ["plain", "setsid", "double", "double-setsid"];
/// Tries per kind and scenario in CI (the full loop is the script's).
const TRIES: usize = 20;
/// Generous bound for survivors (and the watchdog) to be gone after rdrun died.
const GONE_WITHIN: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kill {
    /// SIGKILL of rdrun's pid.
    Rdrun,
    /// SIGKILL of rdrun's whole process group (`timeout -s KILL`, a job kill).
    Group,
}

/// Whether this machine lets rdrun contain its workers in a cgroup (root with a writable
/// cgroup v2 or v1 freezer hierarchy: what CI runs). The tests of start-up and restart races
/// need it; without it they say so and pass vacuously, as the fallback only promises what
/// `fallback_without_cgroup_*` checks.
fn cgroups_usable() -> bool {
    // SAFETY: geteuid(2) has no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && contain::parents(contain::Mode::Auto).iter().any(|p| {
            let probe = p.join(format!("rdrun-probe-{}-{}", std::process::id(), next()));
            let made = std::fs::create_dir(&probe).is_ok();
            let _ = std::fs::remove_dir(&probe);
            made
        });
    if !ok {
        eprintln!("note: no cgroup rdrun may create here; containment races are not checked");
    }
    ok
}

fn next() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// One rdrun running `spawn_escapee` on two local ranks, in its own process group.
struct Job {
    child: Child,
    pid: i32,
    dir: TempDir,
    tag: String,
}

fn start(kind: &str, fail: bool, cgroup: Option<&str>) -> Job {
    let dir = TempDir::new(&format!("contain-{kind}"));
    let tag = format!("{}-{}", std::process::id(), next());
    let mut cmd = Command::new(rdrun_bin());
    cmd.args(["--standalone", "--nproc-per-node=2", "--no-python"]);
    if fail {
        // A grandchild forked just after the stop's SIGTERM sweep never gets it: the grace,
        // not containment, then decides when the restart comes.
        // The same failure every attempt: the stop verdict (issue 28.5) is off, so the
        // restarts go on until the test ends the job.
        cmd.args([
            "--max-restarts=100000",
            "--shutdown-timeout=1",
            "--max-same-failures=0",
        ]);
    }
    cmd.arg(worker("spawn_escapee")).arg(dir.path()).arg(kind);
    if fail {
        cmd.arg("fail");
    }
    cmd.env("RDRUN_TEST_TAG", &tag)
        .env("RUST_LOG", "warn,rdrun::supervisor::group::deadman=debug")
        .env("OMP_NUM_THREADS", "1")
        .env_remove("TORCHELASTIC_ERROR_FILE");
    match cgroup {
        Some(v) => cmd.env(contain::ENV, v),
        None => cmd.env_remove(contain::ENV),
    };
    let stderr = File::create(dir.join("stderr")).expect("stderr file");
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let child = cmd.spawn().expect("spawn rdrun");
    let pid = child.id() as i32;
    Job {
        child,
        pid,
        dir,
        tag,
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Waits until `file` in the job's directory has `n` lines; false (after printing rdrun's
/// stderr) after 30 s.
fn wait_lines(job: &Job, file: &str, n: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if lines(&job.dir.join(file)) >= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let stderr = std::fs::read_to_string(job.dir.join("stderr")).unwrap_or_default();
    eprintln!("{file} has fewer than {n} lines after 30 s; rdrun's stderr:\n{stderr}");
    false
}

/// Live processes (zombies are dead) whose environment holds `RDRUN_TEST_TAG=tag`.
fn tagged(tag: &str) -> Vec<i32> {
    let needle = format!("RDRUN_TEST_TAG={tag}\0");
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.windows(needle.len()).any(|w| w == needle.as_bytes()) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// The run's cgroup directories still present (`rdrun-<pid>-*` below this process's cgroups,
/// which rdrun inherits).
fn cgroups_of(pid: i32) -> Vec<PathBuf> {
    let prefix = format!("rdrun-{pid}-");
    contain::parents(contain::Mode::Auto)
        .into_iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|d| d.filter_map(Result::ok))
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

impl Drop for Job {
    fn drop(&mut self) {
        // A try that panicked (a bound expired) must not leave its rdrun running.
        if let Ok(None) = self.child.try_wait() {
            self.kill(Kill::Group);
            let _ = self.child.wait();
        }
    }
}

impl Job {
    fn kill(&self, how: Kill) {
        let target = match how {
            Kill::Rdrun => self.pid,
            Kill::Group => -self.pid,
        };
        // SAFETY: kill(2) of our own child, or of the process group it leads (created for it).
        unsafe {
            libc::kill(target, libc::SIGKILL);
        }
    }

    /// Reaps rdrun, then waits for everything tagged (workers, grandchildren, the watchdog)
    /// and the run's cgroup to be gone. Returns what was left after the bound (then killed by
    /// PID and removed, so that a failing test still cleans up).
    fn leftovers(self) -> (Vec<i32>, Vec<PathBuf>) {
        let mut this = self;
        this.sweep()
    }

    fn sweep(&mut self) -> (Vec<i32>, Vec<PathBuf>) {
        let _ = self.child.wait();
        let deadline = Instant::now() + GONE_WITHIN;
        loop {
            let procs = tagged(&self.tag);
            let groups = cgroups_of(self.pid);
            if procs.is_empty() && groups.is_empty() {
                return (procs, groups);
            }
            if Instant::now() >= deadline {
                for &pid in &procs {
                    // SAFETY: kill(2) by PID of a process carrying this test's unique tag.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                for g in &groups {
                    contain::kill_and_remove(g, Duration::from_secs(5));
                }
                let stderr = std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
                eprintln!("left behind: {procs:?} {groups:?}\nrdrun's stderr:\n{stderr}");
                return (procs, groups);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs `tries` tries of `scenario` per kind and asserts that none left anything behind.
fn check(name: &str, kinds: &[&str], tries: usize, mut scenario: impl FnMut(&str, usize) -> Job) {
    let mut bad = Vec::new();
    for kind in kinds {
        let mut survivors = 0;
        for i in 0..tries {
            let (procs, groups) = scenario(kind, i).leftovers();
            if !procs.is_empty() || !groups.is_empty() {
                survivors += 1;
            }
        }
        if survivors > 0 {
            bad.push(format!("{kind}: {survivors}/{tries}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: tries that left processes or cgroups: {}",
        bad.join(", ")
    );
}

/// Steady state: every grandchild exists, then the kill.
fn steady(kind: &str, how: Kill, cgroup: Option<&str>) -> Job {
    let job = start(kind, false, cgroup);
    assert!(wait_lines(&job, "gpids", 2), "grandchildren never started");
    if cgroup == Some("off") {
        // The fallback tracks rdrun's tree every 100 ms: what it promises covers processes
        // that lived that long (generously more here).
        std::thread::sleep(Duration::from_millis(600));
    }
    job.kill(how);
    job
}

#[test]
fn sigkill_of_rdrun_leaves_nothing() {
    check("SIGKILL rdrun", &KINDS, TRIES, |kind, _| {
        steady(kind, Kill::Rdrun, None)
    });
}

#[test]
fn sigkill_of_rdruns_process_group_leaves_nothing() {
    check("SIGKILL process group", &KINDS, TRIES, |kind, _| {
        steady(kind, Kill::Group, None)
    });
}

#[test]
fn sigkill_during_startup_leaves_nothing() {
    if !cgroups_usable() {
        return;
    }
    // Kill times spread over rdrun's first 40 ms (before, during and after the spawns).
    check("SIGKILL during start-up", &KINDS, TRIES, |kind, i| {
        let job = start(kind, false, None);
        std::thread::sleep(Duration::from_micros((i as u64 * 4_111) % 40_000));
        job.kill(if i % 2 == 0 { Kill::Rdrun } else { Kill::Group });
        job
    });
}

#[test]
fn sigkill_during_restart_leaves_nothing() {
    if !cgroups_usable() {
        return;
    }
    // Workers fail 0.1 s after leaving a grandchild; rdrun restarts them without end. Killed
    // once a restart happened, at times spread over an attempt.
    check(
        "SIGKILL during restart",
        &["setsid", "double-setsid"],
        TRIES,
        |kind, i| {
            let job = start(kind, true, None);
            assert!(wait_lines(&job, "pids", 4), "no restart happened");
            std::thread::sleep(Duration::from_micros((i as u64 * 13_007) % 130_000));
            job.kill(if i % 2 == 0 { Kill::Rdrun } else { Kill::Group });
            job
        },
    );
}

#[test]
fn fallback_without_cgroup_kills_tracked_escapees() {
    // RDRUN_CGROUP=off: the watchdog's own session and its tracking of rdrun's tree.
    check("no cgroup", &["setsid", "double-setsid"], 4, |kind, i| {
        let how = if i % 2 == 0 { Kill::Rdrun } else { Kill::Group };
        steady(kind, how, Some("off"))
    });
}

#[test]
fn cgroup_v1_freezer_contains_too() {
    if !cgroups_usable() || contain::parents(contain::Mode::V1).is_empty() {
        return;
    }
    check("v1 freezer", &["double-setsid"], 4, |kind, i| {
        let how = if i % 2 == 0 { Kill::Rdrun } else { Kill::Group };
        steady(kind, how, Some("v1"))
    });
}

/// The pid the watchdog logged at debug level (`watchdog started pid=N`).
fn watchdog_pid(stderr: &str) -> Option<i32> {
    let line = stderr.lines().find(|l| l.contains("watchdog started"))?;
    line.rsplit("pid=").next()?.trim().parse().ok()
}

#[test]
fn watchdog_lives_in_its_own_session_and_is_reaped_by_rdrun() {
    let job = start("plain", false, None);
    assert!(wait_lines(&job, "gpids", 2), "grandchildren never started");
    let stderr = std::fs::read_to_string(job.dir.join("stderr")).unwrap_or_default();
    let wd = watchdog_pid(&stderr).unwrap_or_else(|| panic!("no watchdog pid in {stderr}"));
    let stat = std::fs::read_to_string(format!("/proc/{wd}/stat")).expect("watchdog runs");
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .collect();
    // pgrp and session (fields 5 and 6): its own, not rdrun's.
    assert_eq!(
        fields[2],
        wd.to_string(),
        "watchdog's process group: {stat}"
    );
    assert_eq!(fields[3], wd.to_string(), "watchdog's session: {stat}");
    job.kill(Kill::Rdrun);
    let (procs, groups) = job.leftovers();
    assert!(procs.is_empty() && groups.is_empty());

    // An ordinary run: once rdrun has exited, its watchdog is gone, not even a zombie.
    let dir = TempDir::new("contain-ordinary");
    let out = Command::new(rdrun_bin())
        .args(["--standalone", "--nproc-per-node=2", "--no-python", "true"])
        .env("RUST_LOG", "warn,rdrun::supervisor::group::deadman=debug")
        .process_group(0)
        .stdin(Stdio::null())
        .output()
        .expect("run rdrun");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let wd = watchdog_pid(&stderr).unwrap_or_else(|| panic!("no watchdog pid in {stderr}"));
    assert!(
        !Path::new(&format!("/proc/{wd}")).exists(),
        "the watchdog {wd} outlived rdrun: {:?}",
        std::fs::read_to_string(format!("/proc/{wd}/stat"))
    );
    drop(dir);
}

#[test]
fn watchdog_removes_the_runs_shared_memory_segments() {
    // A segment as a rank 0 leaves it when killed between creating it and every rank mapping
    // it (the runtime unlinks it then): named after the run id, which the worker reports.
    let job = start("plain", false, None);
    assert!(wait_lines(&job, "gpids", 2), "grandchildren never started");
    // Standalone: rdrun generated the run id; the worker sees it as TORCHELASTIC_RUN_ID.
    let worker_pid: i32 = std::fs::read_to_string(job.dir.join("pids"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let wenv = std::fs::read(format!("/proc/{worker_pid}/environ")).expect("worker environ");
    let run_id = wenv
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"TORCHELASTIC_RUN_ID="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("TORCHELASTIC_RUN_ID");
    let seg = Path::new(rdrun::workerenv::SHM_DIR).join(format!(
        "{}0.{:016x}",
        rdrun::workerenv::run_shm_prefix(&run_id),
        next()
    ));
    std::fs::write(&seg, b"segment").expect("create segment");
    job.kill(Kill::Rdrun);
    let (procs, groups) = job.leftovers();
    let left = seg.exists();
    let _ = std::fs::remove_file(&seg);
    assert!(procs.is_empty() && groups.is_empty());
    assert!(!left, "{} outlived the run", seg.display());
}
