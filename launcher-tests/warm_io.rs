//! Warm workers (issue 27, docs/warm-start.md) at the edges of their process: output bursts from
//! forked workers reach the console whole (the checks of `output::cli::ranks_never_interleave` with
//! Python workers forked from the template), a prompt (`input()`) on the one rank that reads a
//! terminal through `--stdin 0` while the other rank reads `/dev/null` as a cold one would, and
//! `torch.multiprocessing` spawn (fresh interpreters started from inside a forked worker), and
//! what a preloaded module prints at import shown by every worker, as cold.
//! Every worker records whether it was forked warm (`torch` already imported before the script
//! imported anything); each test asserts it, so a silent cold fallback fails.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{rdrun_bin, torch_python, TempDir};
use crate::warm::{records, warm_rdrun, write};

/// The record every script below writes first: `r<rank>.a<attempt>.json` in argv[1], with
/// whether it was forked warm and what its stdin is.
const RECORD: &str = r#"
import os, sys, json
preloaded = "torch" in sys.modules
rank = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if __name__ == "__main__":  # not in a multiprocessing child (`__mp_main__`)
    # Atomically: the test reads the records while the ranks write them.
    path = os.path.join(sys.argv[1], "r%d.a%d.json" % (rank, attempt))
    with open(path + ".tmp", "w") as f:
        fd0 = os.readlink("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else None
        json.dump(dict(rank=rank, attempt=attempt, preloaded=preloaded, stdin=fd0), f)
    os.replace(path + ".tmp", path)
"#;

fn assert_all_warm(dir: &Path, nproc: u64) {
    let recs = records(dir);
    for rank in 0..nproc {
        let r = recs
            .get(&(rank, 0))
            .unwrap_or_else(|| panic!("rank {rank} wrote no record: {recs:?}"));
        assert_eq!(r["preloaded"], true, "rank {rank} was not forked warm: {r}");
    }
}

/// 4 forked ranks write 200 lines each of 9,000+ bytes (over the 4 KiB atomic pipe write) as
/// fast as they can: every console line is one rank's, whole, in that rank's order.
#[test]
fn warm_ranks_never_interleave_mid_line() {
    const LINES: usize = 200;
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_burst");
    let script = format!(
        "{RECORD}\nlocal = os.environ['LOCAL_RANK']\n\
         for i in range({LINES}):\n    s = 'rank%s-%d-' % (local, i)\n    \
         sys.stdout.write(s + 'x' * (9000 + i - len(s)) + '\\n')\n"
    );
    write(dir.path(), "burst.py", &script);
    let o = warm_rdrun(&py, dir.path())
        .args(["--standalone", "--nproc_per_node=4", "burst.py"])
        .arg(dir.path())
        .run();
    o.assert_code(0);
    assert_all_warm(dir.path(), 4);
    crate::util::assert_burst_lines_whole(&o.stdout, 4, LINES);
}

/// `input()` on rank 0 at a real terminal (tmux) through `--stdin 0`: the prompt shows, the
/// answer reaches the forked worker; rank 1 reads `/dev/null` (EOF at once), as a cold worker
/// that does not read rdrun's stdin.
#[test]
fn warm_prompt_at_a_terminal_with_stdin_to_one_rank() {
    let Some(py) = torch_python() else { return };
    let have_tmux = Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_tmux {
        eprintln!("SKIP: needs tmux");
        return;
    }
    let dir = TempDir::new("warm_prompt");
    let script = format!(
        "{RECORD}\nif rank == 0:\n    name = input('Name? ')\n    print('hello %s' % name, flush=True)\n\
         else:\n    data = sys.stdin.read()\n    print('rank 1 read %d bytes' % len(data), flush=True)\n"
    );
    write(dir.path(), "prompt.py", &script);
    let q = |p: &Path| {
        shlex::try_quote(&p.to_string_lossy())
            .expect("quotable path")
            .into_owned()
    };
    let cmd = format!(
        "{} --standalone --nproc-per-node 2 --warm-start on --stdin 0 prompt.py {}; \
         echo \"RDRUN-STATUS=$?\"; exec sleep 300",
        q(&rdrun_bin()),
        q(dir.path())
    );
    let path = std::env::var("PATH").unwrap_or_default();
    let py_s = py.to_string_lossy().into_owned();
    let term = crate::term::Tmux::start(
        dir.path(),
        200,
        Some(dir.path()),
        &[("PATH", &path), ("PYTHON_EXEC", &py_s)],
        &["sh", "-c", &cmd],
    );
    let bound = Duration::from_secs(240);
    let wait_screen = |what: &str, want: &dyn Fn(&str) -> bool| term.wait_screen(bound, what, want);
    // The prompt has no newline: it must be on the screen before any input.
    wait_screen("the prompt", &|s| {
        s.lines().any(|l| l.trim_end() == "Name?")
    });
    term.type_line("bob");
    let screen = wait_screen("rdrun's exit", &|s| s.contains("RDRUN-STATUS="));
    assert!(screen.contains("RDRUN-STATUS=0"), "{screen}");
    for want in ["hello bob", "rank 1 read 0 bytes"] {
        assert!(
            screen.lines().any(|l| l.trim_end() == want),
            "{want}:\n{screen}"
        );
    }
    assert_all_warm(dir.path(), 2);
    let recs = records(dir.path());
    assert_eq!(recs[&(1, 0)]["stdin"], "/dev/null", "{recs:?}");
    assert_ne!(recs[&(0, 0)]["stdin"], "/dev/null", "{recs:?}");
}

/// `torch.multiprocessing.spawn` inside a forked worker: its children are fresh interpreters
/// (the spawn start method re-imports the script as `__mp_main__`) and report back.
#[test]
fn warm_torch_multiprocessing_spawn() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_mpspawn");
    let script = format!(
        "{RECORD}\nimport torch.multiprocessing as mp\n\n\
         def child(i, out, parent_rank):\n    \
         import torch\n    \
         with open(os.path.join(out, 'child.%d.%d' % (parent_rank, i)), 'w') as f:\n        \
         f.write(str(int(torch.ones(3).sum()) + i))\n\n\
         if __name__ == '__main__':\n    \
         mp.spawn(child, args=(sys.argv[1], rank), nprocs=2, join=True)\n    \
         print('rank %d spawned' % rank, flush=True)\n"
    );
    write(dir.path(), "mpspawn.py", &script);
    let o = warm_rdrun(&py, dir.path())
        .args(["--standalone", "--nproc-per-node", "2", "mpspawn.py"])
        .arg(dir.path())
        .run();
    o.assert_code(0);
    assert_all_warm(dir.path(), 2);
    for rank in 0..2 {
        assert!(o.stdout.contains(&format!("rank {rank} spawned")), "{o:?}");
        for i in 0..2 {
            let got = std::fs::read_to_string(dir.join(format!("child.{rank}.{i}")));
            assert_eq!(got.ok().as_deref(), Some(&*(3 + i).to_string()), "{o:?}");
        }
    }
}

/// What a preloaded module prints while it is imported (a banner on stdout, a warning on stderr)
/// reaches every warm worker's own output, as it does when a cold worker imports the module.
#[test]
fn warm_import_time_output_is_shown_per_worker_as_cold() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_importout");
    write(
        dir.path(),
        "noisy.py",
        "import warnings\nprint('noisy banner', flush=True)\nwarnings.warn('noisy import warning')\n",
    );
    let script =
        format!("{RECORD}\nimport noisy\nprint('rank %d after import' % rank, flush=True)\n");
    write(dir.path(), "imports.py", &script);
    // The worker's own lines: rdrun's log lines start with their time stamp, its line saying
    // that workers are forked warm with "rdrun warm start".
    let own = |text: &str| {
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with("20") && !l.starts_with("rdrun warm start"))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let mut seen = Vec::new();
    for mode in ["off", "on"] {
        let out = dir.join(mode);
        std::fs::create_dir_all(&out).unwrap();
        let o = warm_rdrun(&py, dir.path())
            .args(["--warm-start", mode, "--preload", "noisy"])
            .args(["--nproc-per-node", "2", "imports.py"])
            .arg(&out)
            .run();
        o.assert_code(0);
        for rank in 0..2u64 {
            assert_eq!(
                records(&out)[&(rank, 0)]["preloaded"],
                mode == "on",
                "{o:?}"
            );
        }
        assert_eq!(o.stdout.matches("noisy banner").count(), 2, "{mode}: {o:?}");
        assert_eq!(
            o.stderr
                .matches("UserWarning: noisy import warning")
                .count(),
            2,
            "{mode}: {o:?}"
        );
        seen.push((own(&o.stdout), own(&o.stderr)));
    }
    assert_eq!(seen[0], seen[1], "cold vs warm output differ");
}

/// One warm agent of a two-node static job on loopback (one worker per node).
fn static_node(py: &Path, dir: &Path, port: &str, rank: &str) -> crate::util::Rdrun {
    warm_rdrun(py, dir)
        .args([
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            rank,
        ])
        .args(["--master-addr", "127.0.0.1", "--master-port", port])
}

/// Two static nodes on loopback whose template import takes longer than the rendezvous
/// heartbeat budget (5 s): the template imports before the first rendezvous, so no node is
/// dropped for missing heartbeats while it waits, and every worker is forked warm.
#[test]
fn warm_slow_template_import_does_not_starve_multi_node_heartbeats() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_slowimport");
    write(dir.path(), "slowmod.py", "import time\ntime.sleep(8)\n");
    write(dir.path(), "node.py", RECORD);
    let port = crate::util::free_port().to_string();
    let node = |rank: &str| {
        static_node(&py, dir.path(), &port, rank)
            .args(["--preload", "slowmod", "node.py"])
            .arg(dir.path())
            .spawn()
    };
    let (a, b) = (node("0"), node("1"));
    let (a, b) = (a.wait(), b.wait());
    a.assert_code(0);
    b.assert_code(0);
    for o in [&a, &b] {
        assert!(!o.stderr.contains("heartbeat"), "{o:?}");
    }
    assert_all_warm(dir.path(), 2);
}

/// Two static nodes whose template import takes longer than the heartbeat budget (5 s), and
/// node 1's template SIGKILLed mid-run: at the restart node 1 does not wait inside the round for
/// a new template's import (its agent would miss the round's heartbeats); its worker starts cold
/// while the new template imports in the background, node 0's stays warm, and the run ends well.
#[test]
fn warm_replacement_template_imports_beside_a_multi_node_round() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("warm_replace_rounds");
    write(dir.path(), "slowmod.py", "import time\ntime.sleep(8)\n");
    // Attempt 0: both ranks record, rank 1 fails once the test killed its node's template and
    // rank 0 stays up until the restart stops it; attempt 1: both record and end.
    write(
        dir.path(),
        "sleeper.py",
        r#"
import os, sys, time, json
preloaded = "torch" in sys.modules
rank = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
d = sys.argv[1]
# Atomically: the test reads the records while the ranks write them.
path = os.path.join(d, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(dict(rank=rank, attempt=attempt, pid=os.getpid(), preloaded=preloaded), f)
os.replace(path + ".tmp", path)
if attempt == 0:
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(d, "go")) and time.time() < deadline:
        time.sleep(0.05)
    if rank == 1:
        sys.exit(1)
    time.sleep(120)
"#,
    );
    let port = crate::util::free_port().to_string();
    let node = |rank: &str| {
        static_node(&py, dir.path(), &port, rank)
            .args(["--max-restarts", "1", "--preload", "slowmod", "sleeper.py"])
            .arg(dir.path())
            .spawn()
    };
    let (a, b) = (node("0"), node("1"));
    assert!(
        crate::warm::wait_records(dir.path(), &[(0, 0), (1, 0)], Duration::from_secs(240)),
        "attempt 0 never started"
    );
    let template = crate::warm::template_of(b.pid).expect("node 1 has a template child");
    // SAFETY: kill(2) of the template this test found among node 1's rdrun's children.
    unsafe { libc::kill(template, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::util::alive(template) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(dir.join("go"), "").unwrap();
    let (a, b) = (a.wait(), b.wait());
    a.assert_code(0);
    b.assert_code(0);
    for o in [&a, &b] {
        assert!(!o.stderr.contains("heartbeat"), "{o:?}");
    }
    assert!(
        b.stderr.contains(
            "a new template interpreter is importing; workers start cold until it is ready"
        ),
        "{b:?}"
    );
    let recs = records(dir.path());
    assert_eq!(recs[&(0, 1)]["preloaded"], true, "{recs:?}");
    assert_eq!(recs[&(1, 1)]["preloaded"], false, "{recs:?}");
}
