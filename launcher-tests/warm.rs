//! Warm starts (issue 27, docs/warm-start.md) with the real PyTorch venv: workers forked from the
//! template interpreter get what a cold worker gets (per-rank environment, argv, cwd,
//! `sys.path[0]`, `-m`, exit codes and tracebacks, signal handlers, own session, rdrun as
//! parent, distinct random draws, DataLoader workers), a restart is served by the same
//! template, and every fallback (a preload import error, a thread not known to be fork-safe, a
//! dead template, a program that is not Python) spawns cold with one line saying why.
//! Containment: a SIGKILL of rdrun leaves neither template nor workers.
//!
//! "Forked warm" is observed from inside the worker: `torch` is already in `sys.modules`
//! before the script imports anything (only the template imports it for the worker).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{alive, assert_no_leak, torch_python, Rdrun, TempDir};

/// Hard bound on one run: a template import of torch plus workers on a loaded 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(300);

/// Writes `r<rank>.a<attempt>.json` into argv[1] with what the worker sees, then does what
/// argv[2] says (`ok`, `exit3@1`: rank 1 exits 3, `kill@1`: rank 1 SIGKILLs itself on attempt 0,
/// `raise@1`, `sysexit-msg@1`, `os_exit5@1`, `loader`, `sigterm@0`: rank 0 waits for SIGTERM in
/// a handler while rank 1 fails).
const PROBE: &str = r#"
import os, sys, json, random, signal
preloaded = "torch" in sys.modules
import numpy
out_dir, action = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
info = dict(
    rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), attempt=attempt,
    argv=sys.argv, cwd=os.getcwd(), path0=sys.path[0], ppid=os.getppid(), pid=os.getpid(),
    pgid=os.getpgid(0), sid=os.getsid(0), preloaded=preloaded, rand=random.random(),
    nrand=float(numpy.random.rand()), file=__file__, name=__name__,
    unbuffered=int(sys.stdout.write_through and sys.stderr.write_through), env_rank=os.environ.get("RANK"),
    c_env_rank=os.popen("echo $RANK").read().strip(),
    sigint=str(signal.getsignal(signal.SIGINT)), sigterm=str(signal.getsignal(signal.SIGTERM)),
    sigpipe=str(signal.getsignal(signal.SIGPIPE)),
    blocked=sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    cmdline=[a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0")],
)
path = os.path.join(out_dir, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(info, f)
os.rename(path + ".tmp", path)  # whole or absent, whenever rdrun stops this rank
what, _, who = action.partition("@")
me = who != "" and int(who) == rank
if me and what in ("exit3", "raise", "sysexit-msg", "os_exit5") or (me and what == "kill" and attempt == 0):
    # Fail only once every rank has written its record: rdrun stops the others at the failure.
    # (Warm workers of a burst all start at once: without this wait a rank killed at once could
    # end the attempt before another rank wrote its record.)
    import time
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.time() + 120
    while time.time() < deadline and not all(
        os.path.exists(os.path.join(out_dir, "r%d.a%d.json" % (r, attempt))) for r in range(world)
    ):
        time.sleep(0.02)
if what == "exit3" and me:
    sys.exit(3)
if what == "kill" and me and attempt == 0:
    os.kill(os.getpid(), signal.SIGKILL)
if what == "raise" and me:
    raise ValueError("boom from rank %d" % rank)
if what == "sysexit-msg" and me:
    sys.exit("leaving with a message")
if what == "os_exit5" and me:
    os._exit(5)
if what == "loader":
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(torch.arange(64, dtype=torch.float32))
    total = sum(float(b[0].sum()) for b in DataLoader(ds, batch_size=8, num_workers=2))
    print("loader total %d rank %d" % (total, rank), flush=True)
if what == "sigterm":
    if me:
        def on_term(sig, frame):
            with open(os.path.join(out_dir, "sigterm.%d" % rank), "w") as f:
                f.write("handled")
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(out_dir, "armed.%d" % rank), "w").close()
        import time
        time.sleep(120)
    else:
        import time
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(out_dir, "armed.0")) and time.time() < deadline:
            time.sleep(0.05)
        sys.exit(1)
"#;

pub fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// An rdrun invocation with the torch venv's python, in `dir`, with INFO logs (the template's
/// "ready" line) and `--warm-start on`.
pub fn warm_rdrun(py: &Path, dir: &Path) -> Rdrun {
    Rdrun::new()
        .timeout(TIMEOUT)
        .env("PYTHON_EXEC", py)
        .env("RUST_LOG", "rdrun=info")
        .current_dir(dir)
        .args(["--warm-start", "on"])
}

/// The probe's record of every (rank, attempt).
pub fn records(dir: &Path) -> BTreeMap<(u64, u64), serde_json::Value> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('r') && name.ends_with(".json") {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            out.insert(
                (v["rank"].as_u64().unwrap(), v["attempt"].as_u64().unwrap()),
                v,
            );
        }
    }
    out
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

#[test]
fn warm_workers_look_like_cold_ones() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_basics");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    write(dir.path(), "sub/probe.py", PROBE);
    let run = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "sub/probe.py"])
        .arg(&out)
        .arg("exit3@1")
        .spawn();
    let rdrun_pid = run.pid;
    let o = run.wait();
    // rdrun exits with the failed worker's code.
    o.assert_code(3);
    assert!(o.stderr.contains("exitcode  : 3"), "{o:?}");
    assert_eq!(count(&o.stderr, "template interpreter pid"), 1, "{o:?}");
    let recs = records(&out);
    let cold_out = dir.join("cold");
    std::fs::create_dir_all(&cold_out).unwrap();
    warm_rdrun(&py, dir.path())
        .args([
            "--warm-start",
            "off",
            "--nproc-per-node",
            "2",
            "sub/probe.py",
        ])
        .arg(&cold_out)
        .arg("exit3@1")
        .run()
        .assert_code(3);
    let cold = records(&cold_out);
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    let mut rands = Vec::new();
    let mut nrands = Vec::new();
    for rank in 0..2u64 {
        let r = &recs[&(rank, 0)];
        assert_eq!(r["preloaded"], true, "rank {rank} was not forked warm: {r}");
        assert_eq!(r["local_rank"], rank);
        assert_eq!(r["env_rank"], rank.to_string());
        // The C environment too (a child process reads it).
        assert_eq!(r["c_env_rank"], rank.to_string());
        assert_eq!(r["ppid"], rdrun_pid, "{r}");
        // Its own session and process group, as a cold worker.
        assert_eq!(r["pgid"], r["pid"]);
        assert_eq!(r["sid"], r["pid"]);
        assert_eq!(r["cwd"], cwd.to_str().unwrap());
        assert_eq!(r["path0"], cwd.join("sub").to_str().unwrap());
        assert_eq!(r["file"], cwd.join("sub/probe.py").to_str().unwrap());
        assert_eq!(r["name"], "__main__");
        assert_eq!(r["argv"][0], "sub/probe.py");
        assert_eq!(r["argv"][2], "exit3@1");
        assert_eq!(r["unbuffered"], 1);
        // What ps shows: the worker's command line (NUL padding after it when it is shorter
        // than the template's own, docs/warm-start.md).
        let words: Vec<&str> = r["cmdline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap())
            .collect();
        let end = words
            .iter()
            .rposition(|w| !w.is_empty())
            .map_or(0, |i| i + 1);
        assert_eq!(
            words[..end],
            [
                py.to_str().unwrap(),
                "-u",
                "sub/probe.py",
                out.to_str().unwrap(),
                "exit3@1"
            ],
            "{r}"
        );
        // Signal dispositions and mask as a fresh interpreter has them (a cold run's).
        let c = &cold[&(rank, 0)];
        for key in [
            "sigint",
            "sigterm",
            "sigpipe",
            "blocked",
            "unbuffered",
            "path0",
            "file",
            "name",
            "cwd",
            "c_env_rank",
        ] {
            assert_eq!(r[key], c[key], "rank {rank}: {key}: warm {r} cold {c}");
        }
        assert_eq!(c["preloaded"], false, "{c}");
        assert_eq!(r["blocked"], serde_json::json!([]));
        rands.push(r["rand"].as_f64().unwrap());
        nrands.push(r["nrand"].as_f64().unwrap());
    }
    assert_ne!(rands[0], rands[1], "random.random() repeats across ranks");
    assert_ne!(
        nrands[0], nrands[1],
        "numpy.random.rand() repeats across ranks"
    );
    assert!(!o.stderr.contains("left behind"), "{o:?}");
}

#[test]
fn warm_module_entry_point() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_module");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    write(dir.path(), "pkg/__init__.py", "");
    write(dir.path(), "pkg/mod.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "-m", "pkg.mod"])
        .arg(&out)
        .arg("ok")
        .run();
    o.assert_code(0);
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    for rank in 0..2u64 {
        let r = &records(&out)[&(rank, 0)];
        assert_eq!(r["preloaded"], true, "{r}");
        assert_eq!(r["name"], "__main__");
        assert_eq!(r["argv"][0], cwd.join("pkg/mod.py").to_str().unwrap());
        assert_eq!(r["path0"], cwd.to_str().unwrap());
    }
}

/// The exit code and the traceback a cold worker gives (the template's frames never show).
#[test]
fn warm_exit_codes_and_tracebacks_match_cold() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_exits");
    write(dir.path(), "probe.py", PROBE);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    for (action, code, text) in [
        ("raise@1", 1, "ValueError: boom from rank 1"),
        ("sysexit-msg@1", 1, "leaving with a message"),
        ("os_exit5@1", 5, ""),
    ] {
        let mut errs = Vec::new();
        for mode in ["off", "on"] {
            let o = warm_rdrun(&py, dir.path())
                .args(["--warm-start", mode, "--nproc-per-node", "2", "probe.py"])
                .arg(&out)
                .arg(action)
                .run();
            o.assert_code(code);
            assert!(
                o.stderr.contains(&format!("exitcode  : {code}")),
                "{action} {mode}: {o:?}"
            );
            assert!(o.stderr.contains(text), "{action} {mode}: {o:?}");
            let preloaded = records(&out)[&(1, 0)]["preloaded"].as_bool().unwrap();
            assert_eq!(preloaded, mode == "on", "{action} {mode}");
            // The worker's own lines (rdrun's log lines start with a timestamp).
            let own: Vec<String> = o
                .stderr
                .lines()
                .filter(|l| !l.starts_with("20") && !l.contains("rdrun warm start"))
                .take_while(|l| !l.starts_with("====="))
                .map(str::to_string)
                .collect();
            errs.push(own);
        }
        assert_eq!(errs[0], errs[1], "{action}: cold vs warm stderr differ");
        assert!(!errs[1].iter().any(|l| l.contains("<string>")), "{errs:?}");
    }
}

/// A SIGTERM handler installed by user code runs when rdrun stops the group.
#[test]
fn warm_sigterm_handler_runs() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_sigterm");
    write(dir.path(), "probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "probe.py"])
        .arg(dir.path())
        .arg("sigterm@0")
        .run();
    o.assert_code(1);
    assert_eq!(
        std::fs::read_to_string(dir.join("sigterm.0"))
            .ok()
            .as_deref(),
        Some("handled"),
        "{o:?}"
    );
    assert_eq!(records(dir.path())[&(0, 0)]["preloaded"], true);
}

/// DataLoader workers fork inside a forked worker.
#[test]
fn warm_dataloader_with_two_workers() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_loader");
    write(dir.path(), "probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "probe.py"])
        .arg(dir.path())
        .arg("loader")
        .run();
    o.assert_code(0);
    for rank in 0..2 {
        assert!(
            o.stdout.contains(&format!("loader total 2016 rank {rank}")),
            "{o:?}"
        );
        assert_eq!(records(dir.path())[&(rank, 0)]["preloaded"], true);
    }
}

/// A restart is served by the same template: one "ready" line, both attempts warm, the
/// random draws differ between attempts.
#[test]
fn warm_restart_is_served_by_the_same_template() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_restart");
    write(dir.path(), "probe.py", PROBE);
    let run = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "--max-restarts", "1", "probe.py"])
        .arg(dir.path())
        .arg("kill@1")
        .spawn();
    let rdrun_pid = run.pid;
    let o = run.wait();
    o.assert_code(0);
    assert_eq!(count(&o.stderr, "template interpreter pid"), 1, "{o:?}");
    let recs = records(dir.path());
    for attempt in 0..2 {
        for rank in 0..2 {
            let r = &recs[&(rank, attempt)];
            assert_eq!(r["preloaded"], true, "{r}");
            assert_eq!(r["ppid"], rdrun_pid, "{r}");
        }
    }
    assert_ne!(recs[&(0, 0)]["rand"], recs[&(0, 1)]["rand"]);
    assert_ne!(recs[&(0, 0)]["nrand"], recs[&(0, 1)]["nrand"]);
}

/// A preload module that fails to import: one line naming it, every worker cold, the run works.
#[test]
fn warm_preload_import_error_spawns_cold() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_badpreload");
    write(dir.path(), "probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args([
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--preload",
            "no_such_module_xyz",
            "probe.py",
        ])
        .arg(dir.path())
        .arg("kill@1")
        .run();
    o.assert_code(0);
    let lines = o
        .stderr
        .lines()
        .filter(|l| l.contains("no_such_module_xyz"));
    assert_eq!(lines.count(), 1, "{o:?}");
    assert_eq!(count(&o.stderr, "workers start cold"), 1, "{o:?}");
    for (key, r) in records(dir.path()) {
        assert_eq!(r["preloaded"], false, "{key:?} {r}");
    }
}

/// A preload module that starts a thread: the template refuses to fork, says which thread,
/// once, and the workers start cold.
#[test]
fn warm_thread_in_template_spawns_cold() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_thread");
    write(dir.path(), "probe.py", PROBE);
    write(
        dir.path(),
        "threadmod.py",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
    );
    let o = warm_rdrun(&py, dir.path())
        .args([
            "--nproc-per-node",
            "2",
            "--preload",
            "threadmod",
            "probe.py",
        ])
        .arg(dir.path())
        .arg("ok")
        .run();
    o.assert_code(0);
    assert_eq!(count(&o.stderr, "not known to be fork-safe"), 1, "{o:?}");
    for (key, r) in records(dir.path()) {
        assert_eq!(r["preloaded"], false, "{key:?} {r}");
    }
}

/// `--no-python` with `--warm-start on`: one line, cold.
#[test]
fn warm_start_of_a_program_that_is_not_python_is_cold() {
    let dir = TempDir::new("warm_nopython");
    let o = Rdrun::new()
        .current_dir(dir.path())
        .args([
            "--warm-start",
            "on",
            "--nproc-per-node",
            "2",
            "--no-python",
            "true",
        ])
        .run();
    o.assert_code(0);
    assert_eq!(count(&o.stderr, "is not run by python"), 1, "{o:?}");
}

/// The children of `pid` (from /proc).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(i) = stat.rfind(')') else { continue };
        let ppid = stat[i + 2..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// rdrun's child that runs the template (its command line holds the template program).
pub fn template_of(rdrun: i32) -> Option<i32> {
    children(rdrun).into_iter().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains("#rdrun warm template"))
            .unwrap_or(false)
    })
}

/// Waits (bounded) for the probe records `keys` to exist.
pub fn wait_records(dir: &Path, keys: &[(u64, u64)], bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        let recs = records(dir);
        if keys.iter().all(|k| recs.contains_key(k)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

const SLEEPER: &str = r#"
import os, sys, time, json
preloaded = "torch" in sys.modules
rank = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
d = sys.argv[1]
# Atomically: the test reads the records while the ranks write them.
path = os.path.join(d, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(dict(rank=rank, attempt=attempt, pid=os.getpid(), preloaded=preloaded), f)
os.replace(path + ".tmp", path)
if attempt == 0 and rank == 1:
    # Fail once the test has killed the template.
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(d, "go")) and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(1)
if len(sys.argv) > 2 and sys.argv[2] == "forever":
    time.sleep(300)
"#;

/// The template SIGKILLed mid-run: the restart is served by a new template (one line says the
/// old one died) and the run goes on.
#[test]
fn warm_template_killed_mid_run_is_replaced() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_killtemplate");
    write(dir.path(), "sleeper.py", SLEEPER);
    let run = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "--max-restarts", "1", "sleeper.py"])
        .arg(dir.path())
        .spawn();
    assert!(
        wait_records(dir.path(), &[(0, 0), (1, 0)], Duration::from_secs(240)),
        "attempt 0 never started"
    );
    let template = template_of(run.pid).expect("rdrun has a template child");
    // SAFETY: kill(2) of the template this test found among rdrun's children.
    unsafe { libc::kill(template, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(template) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(dir.join("go"), "").unwrap();
    let o = run.wait();
    o.assert_code(0);
    assert!(o.stderr.contains("died; starting a new one"), "{o:?}");
    assert_eq!(count(&o.stderr, "template interpreter pid"), 2, "{o:?}");
    let recs = records(dir.path());
    for rank in 0..2 {
        assert_eq!(recs[&(rank, 1)]["preloaded"], true, "{o:?}");
    }
}

/// SIGKILL of rdrun with a template and warm workers: nothing is left.
#[test]
fn warm_sigkill_of_rdrun_leaves_nothing() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_sigkill");
    write(dir.path(), "sleeper.py", SLEEPER);
    // rdrun's temp dir, to see that its warm-start directory goes with it too.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let warm_dirs = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rdrun-warm-"))
            .collect()
    };
    let run = warm_rdrun(&py, dir.path())
        .env("TMPDIR", &tmp)
        .args(["--nproc-per-node", "2", "sleeper.py"])
        .arg(dir.path())
        .arg("forever")
        .spawn();
    assert!(
        wait_records(dir.path(), &[(0, 0), (1, 0)], Duration::from_secs(240)),
        "workers never started"
    );
    let template = template_of(run.pid).expect("rdrun has a template child");
    let recs = records(dir.path());
    let mut pids: Vec<i32> = recs
        .values()
        .map(|r| r["pid"].as_i64().unwrap() as i32)
        .collect();
    assert!(recs.values().all(|r| r["preloaded"] == true), "{recs:?}");
    pids.push(template);
    assert_eq!(warm_dirs().len(), 1, "the learned-imports directory");
    run.signal(libc::SIGKILL);
    let o = run.wait();
    assert_eq!(o.signal, Some(libc::SIGKILL), "{o:?}");
    assert_no_leak(&pids, Duration::from_secs(20));
    // The watchdog removes it (it ran to the end above: every process is gone).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !warm_dirs().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(warm_dirs(), Vec::<String>::new(), "{o:?}");
}

/// `--run-path` (a `-c` bootstrap) is forked warm too.
#[test]
fn warm_run_path_entry_point() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_runpath");
    write(dir.path(), "sub/probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "--run-path", "sub/probe.py"])
        .arg(dir.path())
        .arg("exit3@1")
        .run();
    o.assert_code(3);
    let recs = records(dir.path());
    for rank in 0..2 {
        let r = &recs[&(rank, 0)];
        assert_eq!(r["preloaded"], true, "{r}");
        assert_eq!(r["argv"][0], "sub/probe.py");
        assert_eq!(r["name"], "__main__");
    }
}

/// A variable read at import time that differs per rank (`--virtual-local-rank` gives each
/// rank its own CUDA_VISIBLE_DEVICES): the ranks whose value is not the template's start cold,
/// with one line naming the variable.
#[test]
fn warm_import_time_variable_differing_per_rank_spawns_cold() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_importenv");
    write(dir.path(), "probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .args(["--nproc-per-node", "2", "--virtual-local-rank", "probe.py"])
        .arg(dir.path())
        .arg("ok")
        .run();
    o.assert_code(0);
    let lines = o
        .stderr
        .lines()
        .filter(|l| l.contains("CUDA_VISIBLE_DEVICES differs"));
    assert_eq!(lines.count(), 1, "{o:?}");
    let recs = records(dir.path());
    // The template has rank 0's value (it was started for rank 0).
    assert_eq!(recs[&(0, 0)]["preloaded"], true, "{o:?}");
    assert_eq!(recs[&(1, 0)]["preloaded"], false, "{o:?}");
}

/// One intermediate process forks a group's warm workers in a burst (each request says whether
/// another follows). When the burst's next worker starts cold after all (here: its
/// CUDA_VISIBLE_DEVICES differs from the template's), rdrun ends the burst, so the warm
/// worker runs without waiting for the intermediate's idle bound, and the template's protocol
/// stays in step: the restart forks rank 0 again from the same template.
#[test]
fn warm_burst_cut_short_by_a_cold_rank_stays_in_step() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_burst");
    write(dir.path(), "probe.py", PROBE);
    let o = warm_rdrun(&py, dir.path())
        .env("RUST_LOG", "rdrun=debug")
        .args([
            "--nproc-per-node",
            "3",
            "--virtual-local-rank",
            "--max-restarts",
            "1",
            "probe.py",
        ])
        .arg(dir.path())
        .arg("kill@2")
        .run();
    o.assert_code(0);
    let recs = records(dir.path());
    for attempt in 0..2 {
        assert_eq!(recs[&(0, attempt)]["preloaded"], true, "{o:?}");
        assert_eq!(recs[&(1, attempt)]["preloaded"], false, "{o:?}");
        assert_eq!(recs[&(2, attempt)]["preloaded"], false, "{o:?}");
    }
    assert_eq!(
        count(&o.stderr, "the template's burst ended early"),
        2,
        "one burst per attempt, each ended by the cold rank after rank 0: {o:?}"
    );
    assert_eq!(count(&o.stderr, "template interpreter pid"), 1, "{o:?}");
}

/// Issue 38 item 17: a `scancel` while the template imports (SIGTERM to rdrun and to the
/// template, as Slurm signals every process of the step) ends the run with the signal's status
/// and says nothing about warm start: the template died of the shutdown, not of a fault (it
/// used to say "the template interpreter exited during its start-up; workers start cold for the
/// rest of the run"). Plain python3: the preload is a module of the test's own that sleeps.
#[test]
fn a_shutdown_during_the_template_import_says_nothing_of_warm_start() {
    let dir = TempDir::new("warm_scancel");
    write(
        dir.path(),
        "slowmod.py",
        "import os, time\nopen(os.environ['IMPORTING'], 'w').close()\ntime.sleep(60)\n",
    );
    write(dir.path(), "s.py", "import time\ntime.sleep(60)\n");
    let importing = dir.join("importing");
    let run = Rdrun::new()
        .timeout(Duration::from_secs(60))
        .env("PYTHON_EXEC", "python3")
        .env("IMPORTING", &importing)
        .current_dir(dir.path())
        .args(["--warm-start", "on", "--preload", "slowmod"])
        .args(["--nproc-per-node", "2", "s.py"])
        .spawn();
    assert!(
        crate::util::wait_for_file(&importing, Duration::from_secs(30)),
        "the template never imported"
    );
    let template = template_of(run.pid).expect("the template");
    run.signal(libc::SIGTERM);
    // SAFETY: kill(2) of the template the test just found.
    unsafe { libc::kill(template, libc::SIGTERM) };
    let out = run.wait();
    out.assert_code(143);
    assert!(!out.stderr.contains("warm start"), "{out:?}");
    assert!(!out.stderr.contains("start cold"), "{out:?}");
}

/// A shutdown signal that arrives while the template imports is handled once it is ready, right
/// after the workers are forked: the stop must reach every one of them, also a worker that has
/// not yet made its own process group (issue 38.10: the last one was missed and ran until the
/// grace's SIGKILL). The preload's at-fork hook holds each new worker before that point, so that
/// a pid answered before the worker leads its group would be stopped too early every time.
#[test]
fn a_shutdown_during_the_template_import_stops_every_worker_at_once() {
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let dir = TempDir::new("warm_stop_forking");
        write(
            dir.path(),
            "slowmod.py",
            "import os, time\nopen(os.environ['IMPORTING'], 'w').close()\n\
             os.register_at_fork(after_in_child=lambda: time.sleep(0.5))\ntime.sleep(2)\n",
        );
        write(
            dir.path(),
            "s.py",
            "import os, time\nopen(os.path.join('pids', str(os.getpid())), 'w').close()\n\
             time.sleep(60)\n",
        );
        std::fs::create_dir(dir.join("pids")).unwrap();
        let importing = dir.join("importing");
        let run = Rdrun::new()
            .timeout(Duration::from_secs(90))
            .env("PYTHON_EXEC", "python3")
            .env("IMPORTING", &importing)
            .current_dir(dir.path())
            .args(["--warm-start", "on", "--preload", "slowmod"])
            .args(["--shutdown-timeout", "30", "--nproc-per-node", "3", "s.py"])
            .spawn();
        assert!(
            crate::util::wait_for_file(&importing, Duration::from_secs(30)),
            "the template never imported"
        );
        let began = Instant::now();
        run.signal(sig);
        let out = run.wait();
        let took = began.elapsed();
        out.assert_code(code);
        // Well below the 30 s grace: a missed worker holds the run until its SIGKILL.
        assert!(took < Duration::from_secs(15), "took {took:?}: {out:?}");
        assert!(!out.stderr.contains("did not stop within"), "{out:?}");
        for entry in std::fs::read_dir(dir.join("pids")).unwrap() {
            let pid: i32 = entry
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                !(alive(pid) && String::from_utf8_lossy(&cmdline).contains("s.py")),
                "worker {pid} outlived the run"
            );
        }
    }
}
