//! Per-rank control (issue 29): `--wrap`/`--wrap-ranks` with a wrapper that records what it
//! was given and with strace as a real wrapper (argv, environment, process group, exit status,
//! report, signals); `--stdin` to one rank, piped and at a terminal with pdb (tmux).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{
    assert_no_leak, parse_env0, rdrun_bin, read_pid, wait_for_file, worker, Rdrun, TempDir,
};

const NPROC: usize = 4;
/// Every wait for a state gives up after this.
const BOUND: Duration = Duration::from_secs(60);

fn quote(p: &Path) -> String {
    shlex::try_quote(&p.to_string_lossy())
        .expect("quotable path")
        .into_owned()
}

/// `--wrap` text running `record_wrap DIR EXIT tag_%r_%l_%n`.
fn record_wrap(dir: &TempDir, exit: &str) -> String {
    format!(
        "{} {} {exit} tag_%r_%l_%n",
        quote(&worker("record_wrap")),
        quote(dir.path())
    )
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Fields 1.. of /proc/PID/stat after the command name: state, ppid, pgrp, session.
fn stat_ids(stat: &str) -> (i32, i32, i32, i32) {
    let pid = stat
        .split_whitespace()
        .next()
        .expect("pid")
        .parse()
        .expect("pid");
    let rest: Vec<i32> = stat[stat.rfind(')').expect(")") + 1..]
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|f| f.parse().expect("number"))
        .collect();
    (pid, rest[0], rest[1], rest[2])
}

#[test]
fn wrap_runs_only_the_chosen_ranks_under_the_wrapper() {
    let dir = TempDir::new("wrap_record");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "4", "--wrap"])
        .arg(record_wrap(&dir, "-"))
        .args(["--wrap-ranks", "0,2", "--no-python"])
        .arg(worker("print_env"))
        .arg(dir.path())
        .args(["a b", "%r"])
        .run();
    out.assert_code(0);
    for rank in 0..NPROC {
        let wrapped = rank == 0 || rank == 2;
        assert_eq!(
            dir.join(format!("wrap.{rank}")).exists(),
            wrapped,
            "rank {rank}: {out:?}"
        );
        // The worker itself ran either way, with its arguments untouched (`%r` is the
        // wrapper's, not the script's).
        assert_eq!(
            read(dir.join(format!("args.{rank}.0"))),
            "a b\n%r\n",
            "rank {rank}"
        );
        let env = parse_env0(&read(dir.join(format!("env.{rank}.0"))));
        assert_eq!(env["RANK"], rank.to_string());
        let (pid, ppid, pgrp, session) = stat_ids(&read(dir.join(format!("stat.{rank}.0"))));
        if !wrapped {
            // rdrun's own child: its own session and group.
            assert_eq!((pgrp, session), (pid, pid), "rank {rank}");
            continue;
        }
        // argv: the expanded tag, then the worker command exactly as without a wrapper.
        let argv = read(dir.join(format!("wrap.{rank}")));
        let want = format!(
            "tag_{rank}_{rank}_0\n{}\n{}\na b\n%r\n",
            worker("print_env").display(),
            dir.path().display()
        );
        assert_eq!(argv, want, "rank {rank}");
        // The wrapper got the worker's environment (RANK, the rendezvous, the error file...),
        // and its child has it too.
        let wenv = parse_env0(&read(dir.join(format!("wrapenv.{rank}"))));
        for key in [
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_ERROR_FILE",
            "OMP_NUM_THREADS",
        ] {
            assert_eq!(wenv.get(key), env.get(key), "rank {rank}: {key}");
        }
        // The wrapper is rdrun's child, in a session of its own; the worker is the wrapper's
        // child in that session and process group (so rdrun's stop signals reach both).
        let wpid = read_pid(&dir.join(format!("wpid.{rank}")));
        assert_eq!(
            ppid, wpid,
            "rank {rank}: the worker's parent is the wrapper"
        );
        assert_eq!((pgrp, session), (wpid, wpid), "rank {rank}");
        assert_eq!(read(dir.join(format!("wrapst.{rank}"))).trim(), "0");
    }
}

#[test]
fn wrap_exit_status_is_the_ranks_and_the_report_names_it() {
    // A wrapped worker that fails: its status passes through the wrapper to rdrun and the report.
    let dir = TempDir::new("wrap_fail");
    let json = dir.join("report.json");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "4", "--wrap"])
        .arg(record_wrap(&dir, "-"))
        .args(["--wrap-ranks", "2", "--report-json"])
        .arg(&json)
        .arg("--no-python")
        .arg(worker("exit_with"))
        .args(["7", "2"])
        .run();
    out.assert_code(7);
    assert!(
        out.stderr
            .contains("  rank      : 2 (local_rank: 2)\n  exitcode  : 7 (pid: "),
        "{out:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&read(json)).expect("json");
    assert_eq!(v["exit_code"], 7, "{v}");
    let root = &v["failures"][v["root_cause"].as_u64().expect("root") as usize];
    assert_eq!(
        (root["rank"].as_u64(), root["exitcode"].as_i64()),
        (Some(2), Some(7)),
        "{v}"
    );
    // The pid reported is the wrapper's: the process rdrun started for the rank.
    assert_eq!(
        root["pid"].as_i64(),
        Some(i64::from(read_pid(&dir.join("wpid.2")))),
        "{v}"
    );

    // The wrapper's own status wins over its child's: the worker exits 0, the wrapper 5.
    let dir = TempDir::new("wrap_own_status");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "2", "--wrap"])
        .arg(record_wrap(&dir, "5"))
        .args(["--wrap-ranks", "1", "--no-python"])
        .arg(worker("exit_with"))
        .arg("0")
        .run();
    out.assert_code(5);
    assert!(
        out.stderr
            .contains("  rank      : 1 (local_rank: 1)\n  exitcode  : 5 (pid: "),
        "{out:?}"
    );
    assert_eq!(read(dir.join("wrapst.1")).trim(), "0");
}

/// A wrapper rdrun knows to hide the rank's status (`py-spy record` exits 0 whatever the rank
/// did) is named once at start: the rank's failure then reads as success (issue 38 item 18).
/// A stand-in named `py-spy` behaves as py-spy record does (runs the command, exits 0).
#[test]
fn a_wrapper_known_to_swallow_the_exit_status_is_named_at_start() {
    let dir = TempDir::new("wrap_swallow");
    let fake = dir.join("py-spy");
    std::fs::write(&fake, "#!/bin/sh\nshift 4\n\"$@\" && exit 9\nexit 0\n").expect("write");
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let wrap = format!("{} record -o x.svg --", quote(&fake));
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "2", "--wrap", &wrap])
        .args(["--no-python", "sh", "-c", "exit 3"])
        .run();
    // Every rank failed (exit 3; the stand-in exits 9 were the command to succeed), and rdrun
    // sees the wrapper's 0: why it says so at start.
    out.assert_code(0);
    let named: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("--wrap: py-spy record exits 0 whatever the profiled rank did"))
        .collect();
    assert_eq!(named.len(), 1, "{out:?}");
    // Without a known wrapper: no such line.
    let out = Rdrun::new()
        .args([
            "--standalone",
            "--nproc-per-node",
            "1",
            "--wrap",
            "env",
            "--no-python",
            "true",
        ])
        .run();
    out.assert_code(0);
    assert!(!out.stderr.contains("--wrap: "), "{out:?}");
}

#[test]
fn wrap_stop_signal_reaches_the_wrapper_and_its_worker() {
    let dir = TempDir::new("wrap_sigterm");
    let run = Rdrun::new()
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "5",
            "--wrap",
        ])
        .arg(record_wrap(&dir, "-"))
        .arg("--no-python")
        .arg(worker("hold_until_stop"))
        .arg(dir.path())
        .spawn();
    let mut pids = Vec::new();
    for rank in 0..2 {
        for f in [format!("env.{rank}"), format!("cpid.{rank}")] {
            assert!(wait_for_file(&dir.join(&f), BOUND), "{f} never written");
        }
        pids.push(read_pid(&dir.join(format!("wpid.{rank}"))));
        pids.push(read_pid(&dir.join(format!("cpid.{rank}"))));
    }
    run.signal(libc::SIGTERM);
    run.wait().assert_code(128 + libc::SIGTERM);
    assert_no_leak(&pids, Duration::from_secs(10));
}

fn strace_works() -> bool {
    Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn wrap_with_strace_as_a_real_wrapper() {
    if !strace_works() {
        eprintln!("SKIP: strace is not installed or cannot trace here (ptrace refused)");
        return;
    }
    let dir = TempDir::new("wrap_strace");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "4", "--wrap"])
        .arg(format!(
            "strace -f -e trace=execve -o {}",
            quote(&dir.join("st.%r"))
        ))
        .args(["--wrap-ranks", "0,2", "--no-python"])
        .arg(worker("print_env"))
        .arg(dir.path())
        .run();
    out.assert_code(0);
    for rank in 0..NPROC {
        let trace = dir.join(format!("st.{rank}"));
        if rank == 0 || rank == 2 {
            let t = read(trace);
            assert!(
                t.contains(&format!("execve(\"{}\"", worker("print_env").display())),
                "rank {rank}: {t}"
            );
        } else {
            assert!(!trace.exists(), "rank {rank} traced: {out:?}");
        }
        // Every rank ran the worker with its own RANK.
        let env = parse_env0(&read(dir.join(format!("env.{rank}.0"))));
        assert_eq!(env["RANK"], rank.to_string());
    }
}

/// A worker that echoes its stdin: rank `reader` prints `echo:<line>` per line, the others how
/// many bytes they could read (0: `/dev/null`).
const ECHO_PY: &str = r#"
import os, sys
rank = int(os.environ["RANK"])
if rank == 1:
    for line in sys.stdin:
        print(f"echo:{line.rstrip()}", flush=True)
    print("rank 1 eof", flush=True)
else:
    print(f"rank {rank} read {len(sys.stdin.read())}", flush=True)
"#;

#[test]
fn stdin_goes_to_one_rank_the_others_get_dev_null() {
    let dir = TempDir::new("stdin_one_rank");
    let script = dir.join("echo.py");
    std::fs::write(&script, ECHO_PY).expect("write script");
    let out = crate::util::output_with_stdin(
        Command::new(rdrun_bin())
            .args(["--standalone", "--nproc-per-node", "4", "--stdin", "1"])
            .arg(&script)
            .env_remove("PYTHON_EXEC"),
        b"hello\nworld\n",
        BOUND,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "echo:hello",
            "echo:world",
            "rank 0 read 0",
            "rank 1 eof",
            "rank 2 read 0",
            "rank 3 read 0"
        ],
        "{stdout}"
    );
}

/// `sh -c CMD` at a terminal (`term::Tmux`).
struct Term(crate::term::Tmux);

impl Term {
    /// Runs `sh -c CMD` in a 200x50 terminal.
    fn start(dir: &TempDir, cmd: &str, env: &[(&str, String)]) -> Term {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Term(crate::term::Tmux::start(
            dir.path(),
            200,
            None,
            &env,
            &["sh", "-c", cmd],
        ))
    }

    fn type_line(&self, text: &str) {
        self.0.type_line(text);
    }

    /// Waits (bounded) until the screen satisfies `want`; returns the screen.
    fn wait_screen(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        self.0.wait_screen(BOUND, what, want)
    }
}

/// Rank 1 stops in pdb; the others wait for the file it writes after `continue`.
const PDB_PY: &str = r#"
import os, sys, time
rank = int(os.environ["RANK"])
done = os.path.join(os.path.dirname(os.path.abspath(__file__)), "done")
if rank == 1:
    secret = 41
    import pdb; pdb.set_trace()
    print(f"rank 1 after pdb: {secret}", flush=True)
    open(done, "w").close()
else:
    deadline = time.time() + 90
    while not os.path.exists(done) and time.time() < deadline:
        time.sleep(0.05)
    print(f"rank {rank} done", flush=True)
"#;

#[test]
fn pdb_on_one_rank_at_a_terminal() {
    pdb_session("");
}

/// The same with the collapse stage on: the prompt still shows, the lines around it are whole.
#[test]
fn pdb_on_one_rank_at_a_terminal_under_collapse() {
    pdb_session("--output collapse");
}

fn pdb_session(extra: &str) {
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
    let dir = TempDir::new("stdin_pdb");
    let script = dir.join("pdb_rank1.py");
    std::fs::write(&script, PDB_PY).expect("write script");
    let cmd = format!(
        "{} --standalone --nproc-per-node 4 --stdin 1 {extra} {}; echo \"RDRUN-STATUS=$?\"; exec sleep 300",
        quote(&rdrun_bin()),
        quote(&script)
    );
    let path = std::env::var("PATH").unwrap_or_default();
    let term = Term::start(&dir, &cmd, &[("PATH", path)]);
    // The prompt has no newline: it must be on the screen anyway.
    term.wait_screen("pdb's prompt", |s| {
        s.lines().any(|l| l.trim_end() == "(Pdb)")
    });
    term.type_line("p secret + 1");
    // The answer, then the next prompt (typed before it shows, `c` would be echoed after the
    // old prompt and the new one would hold the next line open).
    term.wait_screen("the answer to p and the next prompt", |s| {
        let lines: Vec<&str> = s.lines().map(str::trim_end).collect();
        lines
            .iter()
            .position(|l| *l == "42")
            .is_some_and(|i| lines[i + 1..].contains(&"(Pdb)"))
    });
    term.type_line("c");
    let screen = term.wait_screen("rdrun's exit", |s| s.contains("RDRUN-STATUS="));
    assert!(screen.contains("RDRUN-STATUS=0"), "{screen}");
    for want in [
        "rank 1 after pdb: 41",
        "rank 0 done",
        "rank 2 done",
        "rank 3 done",
    ] {
        assert!(
            screen.lines().any(|l| l.trim_end() == want),
            "{want}:\n{screen}"
        );
    }
}
