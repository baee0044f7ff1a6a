//! A terminal for the tests that drive real interactive programs (shells completing rdrun's
//! flags, pdb on one rank): one tmux server on a private socket, running one command in a
//! detached session of a given width; killed (the server, by the pid it reported) on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct Tmux {
    socket: PathBuf,
    server_pid: Option<i32>,
}

impl Tmux {
    /// Starts `command` (tmux's own argument list: one word is run by the shell) in a `cols` x 50
    /// terminal whose socket lives in `dir`; `cwd` and `env` for the command.
    pub fn start(
        dir: &Path,
        cols: u32,
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        command: &[&str],
    ) -> Tmux {
        let mut t = Tmux {
            socket: dir.join("tmux.sock"),
            server_pid: None,
        };
        let mut cmd = Command::new("tmux");
        cmd.arg("-S").arg(&t.socket).args(["-f", "/dev/null"]);
        cmd.args(["new-session", "-d", "-x", &cols.to_string(), "-y", "50"]);
        if let Some(cwd) = cwd {
            cmd.arg("-c").arg(cwd);
        }
        for (k, v) in env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.args(command);
        let st = cmd.stdin(Stdio::null()).status().expect("tmux new-session");
        assert!(st.success(), "tmux new-session: {st:?}");
        t.server_pid = t
            .run(&["display-message", "-p", "#{pid}"])
            .trim()
            .parse()
            .ok();
        t
    }

    /// One tmux command against this server; its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
        if let Some(pid) = self.server_pid {
            // SAFETY: kill(2) on the pid tmux reported for its own server, started by this test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
