//! The console rdrun writes to: prompts through a pseudo-terminal (a prompt without a newline
//! reaches the terminal before the input is read, pdb's prompt after `breakpoint()`), a console
//! that is a closed pipe (`rdrun … | head -1` ends with the worker's status), and a full device
//! (output dropped, the status kept).

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Worker, BOUND};

/// rdrun running on a pseudo-terminal (stdin, stdout and stderr), echo and output processing
/// off so that the master side reads exactly what rdrun wrote.
struct PtyRun {
    child: Worker,
    master: fs::File,
    seen: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PtyRun {
    fn start(args: &[&str]) -> PtyRun {
        use nix::sys::termios::{self, LocalFlags, OutputFlags, SetArg};
        use std::io::Read;
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let mut t = termios::tcgetattr(&pty.slave).expect("tcgetattr");
        t.local_flags.remove(LocalFlags::ECHO);
        t.output_flags.remove(OutputFlags::OPOST);
        termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t).expect("tcsetattr");
        let slave = fs::File::from(pty.slave);
        let mut cmd = Command::new(crate::util::rdrun_bin());
        cmd.args(args)
            .stdin(slave.try_clone().expect("dup"))
            .stdout(slave.try_clone().expect("dup"))
            .stderr(slave);
        for k in [
            "TORCHELASTIC_ERROR_FILE",
            "RUST_LOG",
            "LOGLEVEL",
            "PYTHONBREAKPOINT",
        ] {
            cmd.env_remove(k);
        }
        let child = Worker(cmd.spawn().expect("spawn rdrun"));
        drop(cmd); // our copies of the slave side: EOF/EIO on the master once rdrun is gone
        let master = fs::File::from(pty.master);
        let mut rd = master.try_clone().expect("dup");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            // EIO once every slave fd is closed.
            while let Ok(n) = rd.read(&mut b) {
                if n == 0 {
                    break;
                }
                s.lock().expect("lock").extend_from_slice(&b[..n]);
            }
        });
        PtyRun {
            child,
            master,
            seen,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("lock")).into_owned()
    }

    /// Waits (bounded) until the terminal shows `want`.
    fn wait_for(&self, want: &str) {
        let deadline = std::time::Instant::now() + BOUND;
        while !self.text().contains(want) {
            assert!(
                std::time::Instant::now() < deadline,
                "terminal never showed {want:?}; it shows {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn type_line(&mut self, line: &str) {
        self.master
            .write_all(line.as_bytes())
            .expect("write to pty");
    }

    /// Waits (bounded) for rdrun to exit; returns its exit code and everything it wrote.
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = std::time::Instant::now() + BOUND;
        let status = loop {
            if let Some(s) = self.child.0.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "rdrun ran past {BOUND:?}: {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(r) = self.reader.take() {
            r.join().expect("pty reader");
        }
        (status.code(), self.text())
    }
}

#[test]
fn prompt_without_newline_reaches_the_terminal_before_input() {
    let mut run = PtyRun::start(&[
        "--standalone",
        "--nproc_per_node=1",
        "--no-python",
        "sh",
        "-c",
        "echo ready; printf 'Name? '; read name; echo \"hello $name\"",
    ]);
    // No input sent yet: the prompt must be on the terminal already.
    run.wait_for("ready\nName? ");
    run.type_line("bob\n");
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text:?}");
    // The rest of the line continues the prompt, as on a terminal.
    assert!(text.contains("ready\nName? hello bob\n"), "{text:?}");
}

#[test]
fn breakpoint_prompt_through_a_pty() {
    if !have_python() {
        eprintln!("skipped: no python3 on PATH");
        return;
    }
    let mut run = PtyRun::start(&[
        "--standalone",
        "--nproc_per_node=1",
        "--tee=3",
        "--no-python",
        "python3",
        "-c",
        "x = 41\nbreakpoint()\nprint('after', x)",
    ]);
    // Tee'd: the prompt starts a prefixed line and waits there for input.
    run.wait_for("[default0]:(Pdb) ");
    run.type_line("p x + 1\n");
    // The answer continues the prompt's line as the worker wrote it (unprefixed: on a terminal
    // the user's echoed input and Enter come in between); the next prompt starts a new line.
    run.wait_for("[default0]:(Pdb) 42\n[default0]:(Pdb) ");
    run.type_line("c\n");
    let (code, text) = run.finish();
    assert_eq!(code, Some(0), "{text:?}");
    assert!(text.ends_with("[default0]:(Pdb) after 41\n"), "{text:?}");
}

fn have_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("pass")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `rdrun … | head -1`: reads one line of rdrun's stdout, closes it, and returns rdrun's exit
/// code and stderr.
fn head_one(script: &str) -> (String, Option<i32>, String) {
    use std::io::{BufRead, BufReader, Read};
    let mut cmd = Command::new(crate::util::rdrun_bin());
    cmd.args([
        "--standalone",
        "--nproc_per_node=1",
        "--no-python",
        "sh",
        "-c",
        script,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for k in ["TORCHELASTIC_ERROR_FILE", "RUST_LOG", "LOGLEVEL"] {
        cmd.env_remove(k);
    }
    let mut child = Worker(cmd.spawn().expect("spawn rdrun"));
    let mut stderr = child.0.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read a line");
    // The BufReader is dropped: rdrun's stdout is now a closed pipe.
    let deadline = std::time::Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rdrun | head -1 did not end"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    (first, status.code(), err.join().expect("stderr reader"))
}

#[test]
fn head_one_ends_the_pipeline_with_the_workers_status() {
    // A worker that keeps writing dies of SIGPIPE, as under torchrun: rdrun exits 128+13.
    let (first, code, stderr) = head_one("i=0; while :; do echo line$i; i=$((i+1)); done");
    assert_eq!(first, "line0\n");
    assert_eq!(code, Some(128 + libc::SIGPIPE), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("SIGPIPE"), "{stderr}");
    // A worker that ignores SIGPIPE sees EPIPE and exits as it chooses: rdrun exits with that.
    let (first, code, stderr) = head_one("trap '' PIPE; while echo more; do :; done; exit 7");
    assert_eq!(first, "more\n");
    assert_eq!(code, Some(7), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn full_console_drops_output_and_keeps_the_status() {
    use std::io::Read;
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full");
        return;
    }
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let sync = std::env::temp_dir().join(format!("rdrun-full-console-{}", std::process::id()));
    fs::create_dir_all(&sync).expect("sync dir");
    let mut cmd = Command::new(crate::util::rdrun_bin());
    cmd.args([
        "--standalone",
        "--nproc_per_node=2",
        "--no-python",
        "sh",
        "-c",
        // Each rank exits only once both have written their stderr line: otherwise the first
        // exit makes rdrun stop the other before its line exists (a race, not the behaviour
        // under test). The wait is bounded (about 30 s), so a broken run still ends.
        "for i in 1 2 3; do echo out$i; done; echo err$LOCAL_RANK >&2; : > \"$SYNC/done$LOCAL_RANK\"; \
         n=0; while [ ! -e \"$SYNC/done0\" ] || [ ! -e \"$SYNC/done1\" ]; do \
         n=$((n+1)); [ $n -gt 3000 ] && break; sleep 0.01; done; exit 3",
    ])
    .env("SYNC", &sync)
    .stdin(Stdio::null())
    .stdout(full)
    .stderr(Stdio::piped());
    for k in ["TORCHELASTIC_ERROR_FILE", "RUST_LOG", "LOGLEVEL"] {
        cmd.env_remove(k);
    }
    let mut child = Worker(cmd.spawn().expect("spawn rdrun"));
    let mut stderr = child.0.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + BOUND;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rdrun >/dev/full hung"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = err.join().expect("stderr reader");
    let _ = fs::remove_dir_all(&sync);
    // The workers' real status, their stderr still on the console, one warning, no panic.
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("err0") && stderr.contains("err1"),
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("cannot write worker output to rdrun's console")
            .count(),
        1,
        "{stderr}"
    );
}
