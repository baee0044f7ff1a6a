//! The `rdrun` command line through the real binary: `--help`, usage errors (exit 2, one
//! `rdrun: error:` line naming the flag and value), launcher-side refusals (exit 1) and the
//! guarantee that none of them starts a worker. Every run has a hard wall-clock bound.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: machines are shared and slow; a hang shows up as a failure, not a stuck CI job.
const LIMIT: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs rdrun with `args` and extra `env`, without any inherited PET_*/log-level variables,
/// killing it (by its PID) if it outlives [`LIMIT`].
fn rdrun(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(crate::util::rdrun_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("PET_")
            || matches!(
                name.as_ref(),
                "RUST_LOG" | "LOGLEVEL" | "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
            )
        {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn rdrun");
    // Read both pipes on threads so that a full pipe can never block the child.
    let mut out = child.stdout.take().expect("stdout pipe");
    let mut err = child.stderr.take().expect("stderr pipe");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            // Child::kill signals exactly this PID.
            let _ = child.kill();
            let _ = child.wait();
            panic!("rdrun {args:?} did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code(),
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
    }
}

/// A fresh directory for one test's marker files.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rdrun-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// Asserts exit `code` and that stderr is exactly the one line `rdrun: error: <msg>`.
fn assert_error(run: &Run, code: i32, msg: &str) {
    assert_eq!(run.code, Some(code), "{run:?}");
    assert_eq!(run.stderr, format!("rdrun: error: {msg}\n"), "{run:?}");
    assert_eq!(run.stdout, "", "{run:?}");
}

#[test]
fn help_lists_every_flag_with_its_default() {
    for flag in ["--help", "-h", "--he"] {
        let run = rdrun(&[flag], &[]);
        assert_eq!(run.code, Some(0), "{run:?}");
        assert_eq!(run.stderr, "", "{run:?}");
        let h = &run.stdout;
        for name in [
            "--nnodes",
            "--nproc-per-node",
            "--nproc_per_node",
            "--rdzv-backend",
            "--rdzv_backend",
            "--rdzv-endpoint",
            "--rdzv-id",
            "--rdzv-conf",
            "--standalone",
            "--max-restarts",
            "--monitor-interval",
            "--start-method",
            "--event-log-handler",
            "--role",
            "-m, --module",
            "--no-python",
            "--run-path",
            "--log-dir",
            "-r, --redirects",
            "-t, --tee",
            "--log-line-prefix-template",
            "--local-ranks-filter",
            "--duplicate-stdout-filters",
            "--duplicate-stderr-filters",
            "--node-rank",
            "--master-addr",
            "--master-port",
            "--local-addr",
            "--logs-specs",
            "--numa-binding",
            "--signals-to-handle",
            "--shutdown-timeout",
            "--virtual-local-rank",
            "--print-completion",
            "--report-json",
            "--exit-barrier-timeout",
        ] {
            assert!(h.contains(name), "{name} missing from --help:\n{h}");
        }
        for default in [
            "[default: 1:1; env: PET_NNODES]",
            "[default: 1; env: PET_NPROC_PER_NODE]",
            "[default: static; env: PET_RDZV_BACKEND]",
            "[default: 0; env: PET_MAX_RESTARTS]",
            "[default: 0.1; env: PET_MONITOR_INTERVAL]",
            "[default: SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2; env: PET_SIGNALS_TO_HANDLE]",
            "[default: 300; env: PET_EXIT_BARRIER_TIMEOUT]",
        ] {
            assert!(h.contains(default), "{default} missing from --help:\n{h}");
        }
    }
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (
            &[],
            &[],
            "the following arguments are required: training_script, training_script_args",
        ),
        (&["--foo", "t.py"], &[], "unrecognized arguments: --foo"),
        (
            &["--nproc", "2", "t.py"],
            &[],
            "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node",
        ),
        (&["--nnodes"], &[], "argument --nnodes: expected one argument"),
        (
            &["--nnodes", "2:1", "/bin/true"],
            &[],
            "--nnodes '2:1': the node counts must satisfy 0 < MIN <= MAX",
        ),
        (
            &["--nnodes=a:b", "/bin/true"],
            &[],
            "--nnodes 'a:b': expected N or MIN:MAX with integers",
        ),
        (
            &["--max-restarts", "-1", "/bin/true"],
            &[],
            "--max-restarts '-1': must be >= 0",
        ),
        (
            &["--max_restarts=-1", "/bin/true"],
            &[],
            "--max-restarts '-1': must be >= 0",
        ),
        // A value from PET_* is named by its variable (issue 10), not by the flag.
        (
            &["/bin/true"],
            &[("PET_MAX_RESTARTS", "-3")],
            "PET_MAX_RESTARTS='-3': must be >= 0",
        ),
        (
            &["/bin/true"],
            &[("PET_NPROC_PER_NODE", "abc")],
            "PET_NPROC_PER_NODE='abc': expected a positive integer, cpu, gpu or auto",
        ),
        // Bounded at once (issue 10: 100000 created as many rank directories first).
        (
            &["--nproc-per-node", "100000", "/bin/true"],
            &[],
            "--nproc-per-node '100000': more workers than rdrun starts on one node (at most 4096)",
        ),
        (
            &["/bin/true"],
            &[("PET_NNODES", "2:1")],
            "PET_NNODES='2:1': the node counts must satisfy 0 < MIN <= MAX",
        ),
        (
            &["--nproc-per-node", "abc", "/bin/true"],
            &[("PET_NPROC_PER_NODE", "2")],
            "--nproc-per-node 'abc': expected a positive integer, cpu, gpu or auto",
        ),
        (
            &["--max-restarts", "many", "/bin/true"],
            &[],
            "argument --max-restarts/--max_restarts: invalid int value: 'many'",
        ),
        (
            &["/bin/true"],
            &[("PET_MAX_RESTARTS", "many")],
            "argument --max-restarts/--max_restarts: invalid int value: 'many' (from PET_MAX_RESTARTS)",
        ),
        (
            &["--nproc-per-node", "zero", "/bin/true"],
            &[],
            "--nproc-per-node 'zero': expected a positive integer, cpu, gpu or auto",
        ),
        (
            &["--nproc_per_node=0", "/bin/true"],
            &[],
            "--nproc-per-node '0': must be > 0",
        ),
        (
            &["/bin/true"],
            &[("PET_STANDALONE", "true")],
            "PET_STANDALONE=\"true\": a boolean flag read from the environment must be an integer (0 = off, non-zero = on)",
        ),
        (
            &["--standalone=1", "/bin/true"],
            &[],
            "argument --standalone: ignored explicit argument '1'",
        ),
        (
            &["--logs-specs", "mine", "/bin/true"],
            &[],
            "--logs-specs is not supported by rdrun: it loads a Python plugin (torchrun.logs_specs entry point)",
        ),
        (
            &["--numa-binding=node", "--cpu-binding", "/bin/true"],
            &[],
            "--cpu-binding with --numa-binding node is not supported by rdrun: choose one: --numa-binding binds to the accelerator's CPUs, --cpu-binding shares the affinity mask",
        ),
        (
            &["--event-log-handler", "dynamic_rendezvous", "/bin/true"],
            &[],
            "--event-log-handler dynamic_rendezvous is not supported by rdrun: only the null and console handlers exist outside Python",
        ),
        (
            &["--print-completion", "ksh"],
            &[],
            "argument --print-completion/--print_completion: invalid choice: 'ksh' (choose from 'bash', 'zsh', 'tcsh', 'fish')",
        ),
        (
            &["--no-python", "-m", "/bin/true"],
            &[],
            "don't use both the '--no-python' flag and the '--module' flag at the same time",
        ),
        (
            &["--rdzv-conf", "timeout", "/bin/true"],
            &[],
            "--rdzv-conf 'timeout': option 'timeout' must have a value",
        ),
        (
            &["-t", "0:5", "/bin/true"],
            &[],
            "--tee '0:5': expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a map like 0:1,1:2",
        ),
        (
            &["--shutdown-timeout", "-1", "/bin/true"],
            &[],
            "--shutdown-timeout '-1': must be >= 0",
        ),
    ];
    for (args, env, msg) in cases {
        let run = rdrun(args, env);
        assert_error(&run, 2, msg);
    }
}

#[test]
fn launcher_refusals_exit_1_before_any_worker_starts() {
    let dir = temp_dir("refusals");
    let marker = dir.join("started");
    let touch = format!("touch {}", marker.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["missing_script_for_rdrun_test.py", &touch],
            "training script not found: missing_script_for_rdrun_test.py",
        ),
        (
            vec!["--no-python", "no-such-program-for-rdrun-test"],
            "program not found: no-such-program-for-rdrun-test (no such file, and not an executable on PATH)",
        ),
        (
            vec!["./no/such/dir/prog"],
            "training script not found: ./no/such/dir/prog",
        ),
    ];
    for (args, msg) in &cases {
        let run = rdrun(args, &[]);
        assert_error(&run, 1, msg);
    }
    // A usage error stops everything too.
    let run = rdrun(&["--nnodes", "0", "/bin/sh", "-c", &touch], &[]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(!marker.exists(), "a worker ran despite the error");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_interpreter_is_reported_up_front() {
    let dir = temp_dir("interp");
    let script = dir.join("t.py");
    std::fs::write(&script, "print('hi')\n").expect("write script");
    let script = script.display().to_string();
    let run = rdrun(&[&script], &[("PYTHON_EXEC", "/no/such/python")]);
    assert_error(
        &run,
        1,
        "python interpreter not found: PYTHON_EXEC=/no/such/python",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loglevel_controls_rdrun_messages() {
    let args = ["--start-method", "fork", "missing_script_for_rdrun_test.py"];
    let quiet = rdrun(&args, &[]);
    assert_error(
        &quiet,
        1,
        "training script not found: missing_script_for_rdrun_test.py",
    );
    let info = rdrun(&args, &[("LOGLEVEL", "INFO")]);
    assert_eq!(info.code, Some(1), "{info:?}");
    assert!(
        info.stderr.contains("--start-method fork is ignored"),
        "{info:?}"
    );
    assert!(
        info.stderr.ends_with(
            "rdrun: error: training script not found: missing_script_for_rdrun_test.py\n"
        ),
        "{info:?}"
    );
    let info = rdrun(&args, &[("RUST_LOG", "info")]);
    assert!(
        info.stderr.contains("--start-method fork is ignored"),
        "{info:?}"
    );
}

/// The signal masks of `pid`'s main thread from /proc: (blocked, caught), bit N-1 = signal N.
fn signal_masks(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some((field("SigBlk:")?, field("SigCgt:")?))
}

/// Issue 10: a handled signal in rdrun's first milliseconds (before its handlers existed) killed
/// it by the default action (17/100 SIGTERM, 31/100 SIGUSR1). rdrun now blocks them from its
/// first instruction (an ELF constructor) until the handlers are installed.
///
/// Each try waits until rdrun's own code runs (the signals show as blocked, or as caught) and
/// sends SIGTERM or SIGUSR1 at once; rdrun must then never die by the default action. Sending
/// earlier would test the kernel and the dynamic loader, which run before any code of rdrun (on
/// a loaded machine the child may not even be scheduled for milliseconds after exec). The test
/// also requires that some signals really landed in the blocked start-up window: before the fix
/// that window did not exist (nothing was blocked), which is what the count catches.
#[test]
fn signals_right_after_start_never_kill_rdrun_by_default_action() {
    use std::os::unix::process::ExitStatusExt;
    const TRIES: u32 = 100;
    let bit = |sig: i32| 1u64 << (sig - 1);
    let both = bit(libc::SIGTERM) | bit(libc::SIGUSR1);
    let mut died = Vec::new();
    let mut in_window = 0;
    let mut term_lost = Vec::new();
    for i in 0..2 * TRIES {
        let sig = if i % 2 == 0 {
            libc::SIGTERM
        } else {
            libc::SIGUSR1
        };
        // SIGTERM ends any run at once, so its worker can be long (a lost SIGTERM then shows as
        // a run of 30 s with exit 0); a SIGUSR1 that lands before the spawn is dropped, so its
        // worker must end by itself.
        let worker: &[&str] = if sig == libc::SIGTERM {
            &["sleep", "30"]
        } else {
            &["true"]
        };
        let mut child = Command::new(crate::util::rdrun_bin())
            .args(["--standalone", "--no-python"])
            .args(worker)
            .env_remove("RUST_LOG")
            .env_remove("LOGLEVEL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rdrun");
        let pid = child.id();
        let deadline = Instant::now() + LIMIT;
        loop {
            match signal_masks(pid) {
                Some((blocked, _)) if blocked & both == both => {
                    in_window += 1;
                    break;
                }
                Some((_, caught)) if caught & both == both => break,
                // Gone already (or a zombie without status lines): nothing to send to.
                None => break,
                Some(_) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("rdrun never blocked nor caught SIGTERM/SIGUSR1 within {LIMIT:?}");
                }
                Some(_) => std::thread::yield_now(),
            }
        }
        // SAFETY: kill(2) of our own unreaped child, by PID.
        unsafe {
            libc::kill(pid as i32, sig);
        }
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("rdrun did not finish within {LIMIT:?} after signal {sig}");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        if let Some(s) = status.signal() {
            died.push((i, sig, s));
        }
        if sig == libc::SIGTERM && status.code() != Some(128 + libc::SIGTERM) {
            term_lost.push((i, status));
        }
    }
    assert!(
        died.is_empty(),
        "rdrun died by a signal's default action in {} of {} tries (try, sent, died of): {died:?}",
        died.len(),
        2 * TRIES
    );
    assert!(
        in_window > 0,
        "no signal of {} landed while rdrun held them blocked at start-up",
        2 * TRIES
    );
    // A held signal must reach the handler once it exists (not stay blocked for good).
    assert!(
        term_lost.is_empty(),
        "SIGTERM did not end these runs with 128+15: {term_lost:?}"
    );
    eprintln!(
        "{in_window} of {} signals landed in the blocked start-up window",
        2 * TRIES
    );
}

/// Issue 10: rdrun's own output must not panic when it cannot be written. `rdrun --help | true`
/// panicked (exit 101) 18/20 times, and a usage error with `2>/dev/full` exited 101, not 2.
/// The closed pipe is made deterministic: its read end is closed before rdrun starts.
#[test]
fn closed_or_full_output_is_not_a_panic() {
    use std::os::fd::{FromRawFd, OwnedFd};
    /// A pipe whose read end is already closed: every write gets EPIPE.
    fn broken_pipe() -> Stdio {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills two descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned here only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        Stdio::from(write)
    }
    fn full() -> Stdio {
        Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("open /dev/full"),
        )
    }
    fn code(args: &[&str], stdout: Stdio, stderr: Stdio) -> Option<i32> {
        let mut child = Command::new(crate::util::rdrun_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn rdrun");
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("rdrun {args:?} did not finish within {LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for _ in 0..5 {
        assert_eq!(code(&["--help"], broken_pipe(), Stdio::null()), Some(0));
        assert_eq!(code(&["--help"], full(), Stdio::null()), Some(0));
        // A panic would also try stderr: a broken stderr must not change the code either.
        assert_eq!(code(&["--help"], broken_pipe(), broken_pipe()), Some(0));
        let usage = ["--nproc-per-node", "0", "x"];
        assert_eq!(code(&usage, Stdio::null(), full()), Some(2));
        assert_eq!(code(&usage, Stdio::null(), broken_pipe()), Some(2));
        // A launcher refusal (exit 1) with its one line unwritable.
        let refusal = ["--no-python", "/definitely/missing"];
        assert_eq!(code(&refusal, Stdio::null(), full()), Some(1));
    }
}

/// True for `YYYY-MM-DDTHH:MM:SS[.frac]Z` or with a `+HH:MM`/`-HH:MM` offset (RFC 3339).
fn is_rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|s| s.len() == r.len() && s.iter().all(u8::is_ascii_digit))
    };
    if !(digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(b.get(10), Some(b'T' | b't'))
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19))
    {
        return false;
    }
    let mut rest = &t[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    rest == "Z" || {
        let o = rest.as_bytes();
        o.len() == 6
            && matches!(o[0], b'+' | b'-')
            && o[1..3].iter().all(u8::is_ascii_digit)
            && o[3] == b':'
            && o[4..6].iter().all(u8::is_ascii_digit)
    }
}

/// Issue 17 item 8: rdrun's log lines carry an RFC 3339 timestamp, as torchrun's carry their
/// time. The `rdrun: error:` line is not a log line and stays as it is.
#[test]
fn log_lines_carry_rfc3339_timestamps() {
    assert!(is_rfc3339("2026-12-01T11:37:17.123456Z"));
    assert!(is_rfc3339("2026-12-01T11:37:17+01:00"));
    assert!(!is_rfc3339("INFO"));
    assert!(!is_rfc3339("2026-12-01 11:37:17"));
    let args = ["--start-method", "fork", "missing_script_for_rdrun_test.py"];
    let run = rdrun(&args, &[("LOGLEVEL", "INFO")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    let logs: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.starts_with("rdrun: error: "))
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("--start-method fork is ignored")),
        "{run:?}"
    );
    for line in logs {
        let stamp = line.split_whitespace().next().unwrap_or("");
        assert!(is_rfc3339(stamp), "no RFC 3339 time first on {line:?}");
    }
}
