//! rdrun's default warm start (`--warm-start auto`, issue 37, docs/warm-start.md "Default" and
//! "Learned preload"): a Python job's workers are forked from a template that starts bare and
//! learns what they import, with no flag; every switch turns it off; a program that is not
//! Python is cold without a word. The learned preload with real workers: a DDP job's second
//! attempt is forked with `torch._dynamo` already imported (no `--preload`), the next run of the
//! same script starts with it, an edit of the script forgets it; the rules: the user's own
//! module is never preloaded (and is seen new after an edit), a module that starts a thread or
//! fails to import in the template is named and skipped.
//!
//! Each run waits for the state it needs (the remembered list naming a module), bounded, never
//! for a time.

use std::path::Path;
use std::time::Duration;

use crate::util::{torch_python, Rdrun, TempDir};
use crate::warm::{records, write};

const TIMEOUT: Duration = Duration::from_secs(300);
const READY_LINE: &str = "rdrun warm start: workers are forked from a template interpreter";
const FORKED: &str = "worker forked from the template";

/// Prints `ok <rank>` (nothing else to see: whether it was forked warm is rdrun's to say).
const TRIVIAL: &str = "import os\nprint('ok', os.environ['RANK'])\n";

fn rdrun_in(dir: &Path) -> Rdrun {
    Rdrun::new()
        .timeout(TIMEOUT)
        .current_dir(dir)
        .env("RUST_LOG", "warn,rdrun::supervisor::group::warm=debug")
}

#[test]
fn the_default_forks_warm_and_every_switch_turns_it_off() {
    let dir = TempDir::new("warm_default");
    write(dir.path(), "job.py", TRIVIAL);
    let o = rdrun_in(dir.path())
        .args(["--nproc-per-node", "2", "job.py"])
        .run();
    o.assert_code(0);
    assert_eq!(o.stderr.matches(READY_LINE).count(), 1, "{o:?}");
    assert_eq!(o.stderr.matches(FORKED).count(), 2, "{o:?}");
    assert!(
        o.stdout.contains("ok 0") && o.stdout.contains("ok 1"),
        "{o:?}"
    );
    // At the default log level the line is there too (rdrun's own line, not a log record).
    let o = Rdrun::new()
        .current_dir(dir.path())
        .args(["--nproc-per-node", "2", "job.py"])
        .run();
    o.assert_code(0);
    assert_eq!(o.stderr.matches(READY_LINE).count(), 1, "{o:?}");

    type Switch<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>);
    let off: [Switch; 4] = [
        (&["--warm-start", "off"], None),
        (&["--warm-start=off"], None),
        (&[], Some(("RDRUN_WARM_START", "off"))),
        (&[], Some(("PET_WARM_START", "off"))),
    ];
    for (flags, var) in off {
        let mut r = rdrun_in(dir.path()).args(flags);
        if let Some((k, v)) = var {
            r = r.env(k, v);
        }
        let o = r.args(["--nproc-per-node", "2", "job.py"]).run();
        o.assert_code(0);
        assert!(
            !o.stderr.contains("warm start") && !o.stderr.contains(FORKED),
            "{flags:?} {var:?}: {o:?}"
        );
        assert!(
            o.stdout.contains("ok 0") && o.stdout.contains("ok 1"),
            "{o:?}"
        );
    }
}

#[test]
fn a_program_that_is_not_python_is_cold_without_a_word() {
    let dir = TempDir::new("warm_default_nopython");
    write(dir.path(), "job.sh", "echo ok $RANK\n");
    for program in [&["true"][..], &["sh", "job.sh"][..]] {
        let o = Rdrun::new()
            .current_dir(dir.path())
            .args(["--nproc-per-node", "2", "--no-python"])
            .args(program)
            .run();
        o.assert_code(0);
        assert!(!o.stderr.contains("warm start"), "{program:?}: {o:?}");
    }
}

/// The names in the remembered lists under `memory` (template.py `_remember`).
fn remembered(memory: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(memory).into_iter().flatten().flatten() {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                for m in v["modules"].as_array().into_iter().flatten() {
                    names.extend(m.as_str().map(str::to_string));
                }
            }
        }
    }
    names
}

/// Python for the jobs below: waits (bounded) until the remembered lists in `memory` (template.py
/// `_remember`) satisfy `done(names)`.
const WAIT_LEARNED: &str = r#"
def wait_learned(memory, done):
    import json, os, time
    deadline = time.time() + 200
    while time.time() < deadline:
        names = []
        for p in os.listdir(memory) if os.path.isdir(memory) else []:
            try:
                with open(os.path.join(memory, p)) as f:
                    names += json.load(f)["modules"]
            except (OSError, ValueError, KeyError):
                pass
        if done(names):
            return
        time.sleep(0.05)
"#;

/// A DDP job: records whether `torch._dynamo` came with the process, then trains one step
/// (DDP's constructor imports torch._dynamo); on attempt 0 rank 1 fails once the remembered
/// list (argv[2]) names a module of torch._dynamo, or at once when argv[3] is `now`.
const DDP_JOB: &str = r#"
import os, sys, json, time
held = "torch._dynamo" in sys.modules
import torch
import torch.distributed as dist
out, memory, when = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
model(torch.randn(4, 8)).sum().backward()
# Atomically: the test reads the records while the ranks write them.
path = os.path.join(out, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(dict(rank=rank, attempt=attempt, held=held), f)
os.replace(path + ".tmp", path)
if attempt == 0 and rank == 1:
    if when != "now":
        wait_learned(memory, lambda names: any(n.startswith("torch._dynamo") for n in names))
    os._exit(1)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
"#;

#[test]
fn learned_preload_reaches_the_next_attempt_and_the_next_run() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_learn_ddp");
    let job = format!("{WAIT_LEARNED}{DDP_JOB}");
    write(dir.path(), "job.py", &job);
    let memory = dir.join("memory");
    let run = |tag: &str, when: &str| {
        let out = dir.join(tag);
        std::fs::create_dir_all(&out).unwrap();
        let o = rdrun_in(dir.path())
            .env("PYTHON_EXEC", &py)
            .env("RDRUN_WARM_MEMORY", &memory)
            .env("OMP_NUM_THREADS", "1")
            .args(["--nproc-per-node", "2", "--max-restarts", "1", "job.py"])
            .arg(&out)
            .arg(&memory)
            .arg(when)
            .run();
        o.assert_code(0);
        assert_eq!(o.stderr.matches(FORKED).count(), 4, "{tag}: {o:?}");
        let held: Vec<bool> = records(&out)
            .values()
            .map(|r| r["held"].as_bool().unwrap())
            .collect();
        (held, o)
    };
    // First run: attempt 0 imports torch._dynamo itself (no --preload); attempt 1 is forked
    // from the template that learned it meanwhile.
    let (held, o) = run("first", "learned");
    // Records in (rank, attempt) order: (0,0) (0,1) (1,0) (1,1).
    assert_eq!(held, [false, true, false, true], "{o:?}");
    assert!(
        remembered(&memory).iter().any(|n| n == "torch"),
        "{:?}",
        remembered(&memory)
    );
    // The next run of the same script starts with it.
    let (held, o) = run("second", "now");
    assert_eq!(held, [true, true, true, true], "{o:?}");
    assert!(o.stderr.contains("imported in an earlier run"), "{o:?}");
    // An edit of the script forgets the list: the next run is a first run again.
    write(dir.path(), "job.py", &format!("{job}\n# edited\n"));
    let (held, o) = run("edited", "now");
    assert!(!held[0] && !held[2], "{held:?} {o:?}");
}

/// The rule cases, without torch (the system python3): an installed module (a site-packages
/// directory on PYTHONPATH) is preloaded; one that starts a thread at import, one that fails
/// to import in the template (it needs the per-rank RANK), one after which CUDA reads as
/// initialised and the user's own module next to the script are named and never preloaded;
/// the user's module edited between attempts is seen new.
const RULES_JOB: &str = r#"
import os, sys, json, time
names = ["goodpkg", "threadpkg", "failpkg", "mylocal", "cudapkg"]
held = {n: n in sys.modules for n in names}
import threadpkg, failpkg, mylocal, cudapkg, goodpkg
out, memory = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# Atomically: the test reads the records while the ranks write them.
path = os.path.join(out, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(dict(rank=rank, attempt=attempt, held=held, value=mylocal.VALUE), f)
os.replace(path + ".tmp", path)
if attempt == 0 and rank == 0:
    # Edited once every rank read the first version.
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(out, "r1.a0.json")):
        time.sleep(0.02)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mylocal.py"), "w") as f:
        f.write("VALUE = 2\n")
    open(os.path.join(out, "edited"), "w").close()
if attempt == 0 and rank == 1:
    wait_learned(memory, lambda names: "goodpkg" in names)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(out, "edited")):
        time.sleep(0.02)
    sys.exit(1)
"#;

#[test]
fn learned_preload_rules() {
    let dir = TempDir::new("warm_learn_rules");
    let site = dir.join("lib/site-packages");
    write(&site, "goodpkg/__init__.py", "VALUE = 'good'\n");
    write(
        &site,
        "threadpkg.py",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n",
    );
    write(
        &site,
        "failpkg.py",
        "import os\nif 'RANK' not in os.environ:\n    raise RuntimeError('needs RANK')\n",
    );
    // Stands for a module that initialises CUDA at import (no GPU here): what the template's
    // check asks, `torch.cuda.is_initialized()`, says yes once it is imported.
    write(
        &site,
        "cudapkg.py",
        "import sys, types\nm = types.ModuleType('torch.cuda')\nm.is_initialized = lambda: True\nsys.modules['torch.cuda'] = m\n",
    );
    write(
        dir.path(),
        "job/job.py",
        &format!("{WAIT_LEARNED}{RULES_JOB}"),
    );
    write(dir.path(), "job/mylocal.py", "VALUE = 1\n");
    let memory = dir.join("memory");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let o = rdrun_in(dir.path())
        .env("RUST_LOG", "warn,rdrun::supervisor::group::warm=info")
        .env("RDRUN_WARM_MEMORY", &memory)
        .env("PYTHONPATH", &site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .args(["--nproc-per-node", "2", "--max-restarts", "1", "job/job.py"])
        .arg(&out)
        .arg(&memory)
        .run();
    o.assert_code(0);
    let recs = records(&out);
    for rank in 0..2u64 {
        let first = &recs[&(rank, 0)];
        let second = &recs[&(rank, 1)];
        for m in ["goodpkg", "threadpkg", "failpkg", "mylocal", "cudapkg"] {
            assert_eq!(first["held"][m], false, "rank {rank} attempt 0 {m}: {o:?}");
        }
        assert_eq!(second["held"]["goodpkg"], true, "rank {rank}: {o:?}");
        for m in ["threadpkg", "failpkg", "mylocal", "cudapkg"] {
            assert_eq!(second["held"][m], false, "rank {rank} attempt 1 {m}: {o:?}");
        }
        assert_eq!(first["value"], 1);
        assert_eq!(second["value"], 2, "the edited module, seen new: {o:?}");
    }
    for (module, why) in [
        ("threadpkg", "not known to be fork-safe"),
        ("failpkg", "needs RANK"),
        ("mylocal", "the user's code"),
        ("cudapkg", "CUDA is initialised"),
    ] {
        let line = o
            .stderr
            .lines()
            .find(|l| l.contains(&format!("warm start: {module} is not preloaded")));
        assert!(
            line.is_some_and(|l| l.contains(why)),
            "{module}: {line:?}\n{o:?}"
        );
        assert_eq!(
            o.stderr
                .matches(&format!("warm start: {module} is not preloaded"))
                .count(),
            1,
            "{module} named once: {o:?}"
        );
    }
    let names = remembered(&memory);
    assert!(names.iter().any(|n| n == "goodpkg"), "{names:?}");
    for m in ["threadpkg", "failpkg", "mylocal", "cudapkg"] {
        assert!(!names.iter().any(|n| n == m), "{m} remembered: {names:?}");
    }
}

/// The pace of learning (`pace.py`), on a simulated node: the pacer's clock and `/proc/stat`
/// are replaced, each "import" burns 10 ms of CPU, the other processes use `others` cores.
/// Busy node (1.9 of 2 cores): the learner keeps to about 5 % of a core. Idle node (0.2):
/// full speed, no sleep. A fork request waiting (the socket readable): full speed at once.
const PACE_SIM: &str = r#"
import socket, sys
ns = {"os": __import__("os"), "sys": sys}
exec(open(sys.argv[1]).read(), ns)

class Clock:
    def __init__(self): self.t = 0.0; self.cpu = 0.0
    def monotonic(self): return self.t
    def process_time(self): return self.cpu
    def sleep(self, d): self.t += d

def run(others, sock=None):
    clock = Clock()
    ns["_cpu_stat"] = lambda: (int((others * clock.t + clock.cpu) * 100), 0)
    p = ns["_Pacer"](sock)
    p.time, p.hz, p.ncpu, p.wall0, p.cpu0 = clock, 100, 2, 0.0, 0.0
    if sock is not None:
        p.select = lambda r, w, x, t: (r, [], [])
    for _ in range(300):
        clock.t += 0.01; clock.cpu += 0.01
        p.find_spec("m")
    return clock.cpu / clock.t

a, w = socket.socketpair()
print("%.3f %.3f %.3f" % (run(1.9), run(0.2), run(1.9, a)))
"#;

#[test]
fn learning_is_paced_on_a_busy_node_only() {
    let dir = TempDir::new("warm_pace");
    write(dir.path(), "sim.py", PACE_SIM);
    let pace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/supervisor/group/warm/pace.py"
    );
    let out = std::process::Command::new("python3")
        .arg(dir.join("sim.py"))
        .arg(pace)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let (busy, idle, hurried) = (v[0], v[1], v[2]);
    // Busy: at most 5 % of a core, give or take the first reading (paced from the start).
    assert!(busy <= 0.06, "busy node: learner used {busy} of a core");
    // Idle: full speed once the first reading (after 0.2 s, paced meanwhile) shows the idle core.
    assert!(idle > 0.85, "idle node: learner used {idle} of a core");
    assert!(
        hurried > 0.9,
        "fork request waiting: learner used {hurried} of a core"
    );
}
