//! `--debug-rank R` (issue 29): the one rank a user wants to step through starts under
//! `python -m debugpy --listen 127.0.0.1:PORT --wait-for-client` and rdrun prints one line
//! saying where to attach; where the worker's interpreter cannot import debugpy (or the command
//! is not a Python launch) the rank starts normally and the line says how to look inside it
//! with `py-spy dump --pid` or `gdb -p` instead. The hang detector exempts the rank (config
//! `HangSettings::debug_rank`) and it reads rdrun's stdin unless `--stdin` says otherwise
//! (`config::console`).
//!
//! Why 127.0.0.1: a debugpy client can run any code in the worker; a node's other users (or
//! the network) must not get that. A remote node is reached with `ssh -L PORT:127.0.0.1:PORT`.
//! Why port 5678 + local rank: 5678 is debugpy's and VS Code's default, so rank 0 needs no
//! setting, and the port is the same at every restart; if it is taken (another job on the
//! node), a free port chosen by the kernel is used and the line names it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::EntrypointKind;

/// debugpy's default port (VS Code's "Python: Remote Attach" uses it).
pub const DEBUGPY_PORT: u16 = 5678;
/// Longest wait for the interpreter to say whether it can import debugpy.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// How the debug rank can be attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// It waits under debugpy, listening here.
    Debugpy { host: String, port: u16 },
    /// It runs without debugpy, for this reason.
    Hint { why: String },
}

/// The debug rank's command: `program args` turned into a debugpy launch when the interpreter
/// has debugpy. `args` are the worker's, after the interpreter (`-u script ...`, `-u -m mod
/// ...`, `-u -c bootstrap script ...`): debugpy takes the same forms after its own options.
pub fn command(
    kind: EntrypointKind,
    program: &Path,
    args: Vec<OsString>,
    local_rank: usize,
    env: &[(String, String)],
) -> (PathBuf, Vec<OsString>, Attach) {
    if kind == EntrypointKind::Exec {
        let why = "the command is not a Python launch".to_string();
        return (program.to_path_buf(), args, Attach::Hint { why });
    }
    if let Err(why) = importable(program, env) {
        return (program.to_path_buf(), args, Attach::Hint { why });
    }
    let host = "127.0.0.1".to_string();
    let port = pick_port(&host, local_rank);
    let mut a: Vec<OsString> = Vec::with_capacity(args.len() + 6);
    let mut rest = args.into_iter().peekable();
    // The interpreter's own `-u` stays before `-m debugpy`.
    if rest.peek().is_some_and(|a| a == "-u") {
        a.extend(rest.next());
    }
    for w in ["-m", "debugpy", "--listen"] {
        a.push(w.into());
    }
    a.push(format!("{host}:{port}").into());
    a.push("--wait-for-client".into());
    a.extend(rest);
    (program.to_path_buf(), a, Attach::Debugpy { host, port })
}

/// Whether `python` imports debugpy with the worker's environment overlay (`Err`: why not).
fn importable(python: &Path, env: &[(String, String)]) -> Result<(), String> {
    let child = Command::new(python)
        .args(["-c", "import debugpy"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Err(format!("cannot run {}: {e}", python.display())),
    };
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(_)) => {
                return Err(format!(
                    "debugpy is not importable by {} (pip install debugpy)",
                    python.display()
                ))
            }
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not say within {}s whether it can import debugpy",
                    python.display(),
                    PROBE_TIMEOUT.as_secs()
                ));
            }
        }
    }
}

/// [`DEBUGPY_PORT`] + `local_rank` when it is free on `host`, else one the kernel picks (there
/// is a moment between this probe and debugpy's own bind; another program taking the port in
/// it makes debugpy fail, which the rank's exit status and report show).
fn pick_port(host: &str, local_rank: usize) -> u16 {
    let preferred = u16::try_from(local_rank)
        .ok()
        .and_then(|l| DEBUGPY_PORT.checked_add(l));
    if let Some(p) = preferred {
        if std::net::TcpListener::bind((host, p)).is_ok() {
            return p;
        }
    }
    std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(DEBUGPY_PORT)
}

/// The one line rdrun prints once the debug rank started.
pub fn announcement(rank: usize, pid: i32, attach: &Attach) -> String {
    match attach {
        Attach::Debugpy { host, port } => format!(
            "rdrun: rank {rank} (pid {pid}) waits for a debugger: attach debugpy to {host}:{port} \
             (VS Code: \"Python Debugger: Remote Attach\", host {host}, port {port}; from another \
             machine: ssh -L {port}:{host}:{port} to this node first)"
        ),
        Attach::Hint { why } => format!(
            "rdrun: rank {rank} (pid {pid}) runs without a debugger ({why}); to look inside it: \
             py-spy dump --pid {pid}, or gdb -p {pid}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debugpy_goes_after_the_interpreters_own_flag() {
        // /bin/true "imports" anything: the debugpy form is built.
        let args: Vec<OsString> = ["-u", "-m", "pkg.train", "--lr", "1"]
            .map(OsString::from)
            .to_vec();
        let (p, a, attach) = command(
            EntrypointKind::PythonModule,
            Path::new("/bin/true"),
            args,
            0,
            &[],
        );
        assert_eq!(p, PathBuf::from("/bin/true"));
        let Attach::Debugpy { host, port } = attach else {
            panic!("{attach:?}");
        };
        assert_eq!(host, "127.0.0.1");
        let listen = format!("127.0.0.1:{port}");
        assert_eq!(
            a,
            [
                "-u",
                "-m",
                "debugpy",
                "--listen",
                &listen,
                "--wait-for-client",
                "-m",
                "pkg.train",
                "--lr",
                "1"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn without_debugpy_the_command_is_unchanged_and_says_why() {
        let args: Vec<OsString> = ["-u", "t.py"].map(OsString::from).to_vec();
        // /bin/false "cannot import" debugpy.
        let (_, a, attach) = command(
            EntrypointKind::PythonScript,
            Path::new("/bin/false"),
            args.clone(),
            1,
            &[],
        );
        assert_eq!(a, args);
        assert_eq!(
            attach,
            Attach::Hint {
                why: "debugpy is not importable by /bin/false (pip install debugpy)".into()
            }
        );
        let (_, _, attach) = command(EntrypointKind::Exec, Path::new("/bin/sh"), vec![], 0, &[]);
        assert!(
            matches!(&attach, Attach::Hint { why } if why.contains("not a Python launch")),
            "{attach:?}"
        );
        assert_eq!(
            announcement(2, 77, &attach),
            "rdrun: rank 2 (pid 77) runs without a debugger (the command is not a Python launch); \
             to look inside it: py-spy dump --pid 77, or gdb -p 77"
        );
    }

    /// A taken preferred port gives another, free one.
    #[test]
    fn a_taken_port_is_not_used() {
        let held = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let taken = held.local_addr().expect("addr").port();
        if let Some(lr) = taken.checked_sub(DEBUGPY_PORT) {
            assert_ne!(pick_port("127.0.0.1", usize::from(lr)), taken);
        }
        let p = pick_port("127.0.0.1", 40000);
        assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
    }
}
