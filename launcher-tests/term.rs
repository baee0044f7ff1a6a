//! A terminal for the tests that drive real interactive programs (shells completing rdrun's
//! flags, pdb on one rank): one tmux server on a private socket, running one command in a
//! detached session of a given width; killed (the server, by the pid it reported) on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

    /// What the terminal shows now.
    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    /// Types `text` and Enter.
    pub fn type_line(&self, text: &str) {
        self.run(&["send-keys", "-t", "0", "-l", text]);
        self.run(&["send-keys", "-t", "0", "Enter"]);
    }

    /// Waits until the screen satisfies `want` (failing the test past `bound`); returns it.
    pub fn wait_screen(&self, bound: Duration, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + bound;
        loop {
            let screen = self.screen();
            if want(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what} on the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
