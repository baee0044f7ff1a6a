//! The completion scripts in the real shells, typed at a terminal (issue 25): bash, zsh and fish
//! run inside a tmux session; the test types `rdrun FLAG PREFIX`, presses Tab and reads the line
//! back from the screen. Every flag of the option table is tried: a flag with a closed set of
//! values completes each value, a path flag completes file (or directory) names, any other flag
//! completes nothing — not even the file name that matches.
//!
//! Why the line and not the listing: after Tab the test types `END`; the shell handles keys in
//! order, so once `END` shows, the completion is done and the line says what it inserted. A
//! negative ("nothing offered") is then as certain as a positive, with no waiting for a silence.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdrun::cli::{flag_table, FlagValue};

use crate::util::{Rdrun, TempDir};

/// Every wait gives up after this (a loaded machine starts shells slowly).
const BOUND: Duration = Duration::from_secs(60);
const PROMPT: &str = "PROMPT> ";

/// One interactive shell at a terminal (`term::Tmux`).
struct Term(crate::term::Tmux);

impl Term {
    fn tmux(&self, args: &[&str]) -> String {
        self.0.run(args)
    }

    /// Starts `shell` (a command line) in `cwd` with `env`, 250 columns wide (no line wraps).
    fn start(dir: &Path, cwd: &Path, shell: &str, env: &[(&str, &str)]) -> Term {
        Term(crate::term::Tmux::start(dir, 250, Some(cwd), env, &[shell]))
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    fn literal(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "0", "-l", text]);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "0"])
    }

    /// Waits (bounded) until a screen line satisfies `want`; returns that line.
    fn wait_line(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + BOUND;
        loop {
            let screen = self.screen();
            if let Some(l) = screen.lines().rev().find(|l| want(l)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what} on the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An empty prompt on a cleared screen.
    fn fresh_prompt(&self) {
        self.keys(&["C-u"]);
        self.keys(&["C-l"]);
        let deadline = Instant::now() + BOUND;
        loop {
            let screen = self.screen();
            let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
            if lines.len() == 1 && lines[0].trim_end() == PROMPT.trim_end() {
                return;
            }
            assert!(Instant::now() < deadline, "no fresh prompt:\n{screen}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types `rdrun WORDS`, presses Tab, types `END`: the line as completion left it (between
    /// `rdrun ` and `END`, trailing blanks dropped).
    fn complete(&self, words: &str) -> String {
        self.fresh_prompt();
        self.literal(&format!("rdrun {words}"));
        self.keys(&["Tab"]);
        self.literal("END");
        let line = self.wait_line(&format!("the completed line of {words:?}"), |l| {
            l.starts_with(&format!("{PROMPT}rdrun ")) && l.trim_end().ends_with("END")
        });
        let line = line.trim_end();
        line[PROMPT.len() + "rdrun ".len()..line.len() - "END".len()]
            .trim_end()
            .to_string()
    }

    /// Types `rdrun WORDS`, presses Tab twice: waits until every one of `values` is listed.
    fn lists(&self, words: &str, values: &[&str]) {
        self.fresh_prompt();
        self.literal(&format!("rdrun {words}"));
        self.keys(&["Tab"]);
        self.keys(&["Tab"]);
        let deadline = Instant::now() + BOUND;
        loop {
            let screen = self.screen();
            let below: String = screen
                .lines()
                .filter(|l| !l.starts_with(PROMPT))
                .collect::<Vec<_>>()
                .join("\n");
            if values
                .iter()
                .all(|v| below.split_whitespace().any(|w| w == *v))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{words:?}: not every one of {values:?} listed:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // No C-c to leave: the terminal turns it into a SIGINT at once, out of order with the
        // keys before it; the next `fresh_prompt` clears the line in order.
    }
}

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn script(dir: &Path, shell: &str, path: &str) -> PathBuf {
    let out = Rdrun::new().args(["--print-completion", shell]).run();
    out.assert_code(0);
    let p = dir.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, &out.stdout).unwrap();
    p
}

/// The shortest prefix of `v` that no other of `all` starts with (None: `v` is a prefix of
/// another value, so Tab alone cannot pick it).
fn unique_prefix(v: &str, all: &[&str]) -> Option<String> {
    (1..=v.len())
        .map(|n| &v[..n])
        .find(|p| all.iter().all(|o| *o == v || !o.starts_with(p)))
        .map(str::to_string)
}

/// A working directory with one file and one directory whose names start alike, so that a file
/// completion of `zz-f` or `zz-d` is unique.
fn workdir(dir: &Path) -> PathBuf {
    let cwd = dir.join("cwd");
    std::fs::create_dir_all(cwd.join("zz-dir")).unwrap();
    std::fs::write(cwd.join("zz-file-only"), "").unwrap();
    cwd
}

/// Every flag of the table in `term`: (typed, completed) pairs compared against the rule.
fn every_flag(term: &Term, shell: &str) {
    let mut failures = Vec::new();
    let mut check = |typed: String, want: String| {
        let got = term.complete(&typed);
        if got != want {
            failures.push(format!("{typed:?}: got {got:?}, want {want:?}"));
        }
    };
    for f in flag_table() {
        let name = f.names[0];
        match f.value {
            FlagValue::None => {}
            FlagValue::Choice(values) => {
                for v in values {
                    if let Some(p) = unique_prefix(v, values) {
                        check(format!("{name} {p}"), format!("{name} {v}"));
                    }
                }
            }
            FlagValue::OptionalChoice(values) => {
                for v in values {
                    if let Some(p) = unique_prefix(v, values) {
                        check(format!("{name}={p}"), format!("{name}={v}"));
                    }
                }
            }
            FlagValue::Path { metavar: "DIR" } => {
                check(format!("{name} zz"), format!("{name} zz-dir/"));
            }
            FlagValue::Path { .. } => {
                check(format!("{name} zz-f"), format!("{name} zz-file-only"));
                check(format!("{name} zz-d"), format!("{name} zz-dir/"));
            }
            FlagValue::Text { .. } => check(format!("{name} zz-f"), format!("{name} zz-f")),
        }
    }
    // `--flag=value` spelling, and the training script (a file) after the flags.
    check("--hang-detect=ob".into(), "--hang-detect=observe".into());
    check(
        "--rdzv-backend c10d zz-f".into(),
        "--rdzv-backend c10d zz-file-only".into(),
    );
    assert!(failures.is_empty(), "{shell}:\n{}", failures.join("\n"));
    term.lists("--rdzv-backend ", &["static", "c10d", "etcd-v3"]);
    term.lists("--hang-detect ", &["off", "observe", "kill"]);
}

#[test]
fn bash_completes_values_paths_and_nothing_else_at_a_terminal() {
    if !have("bash") || !have("tmux") {
        eprintln!("skipped: needs bash and tmux");
        return;
    }
    let tmp = TempDir::new("complete_bash");
    let dir = tmp.path();
    let cwd = workdir(dir);
    let s = script(dir, "bash", "rdrun.bash");
    let term = Term::start(
        dir,
        &cwd,
        "bash --norc --noprofile -i",
        &[("HISTFILE", "/dev/null"), ("INPUTRC", "/dev/null")],
    );
    term.literal(&format!(
        "PS1='{PROMPT}'; bind 'set bell-style none'; source '{}'; complete -p rdrun",
        s.display()
    ));
    term.keys(&["Enter"]);
    term.wait_line("complete -F _rdrun rdrun", |l| {
        l.trim() == "complete -F _rdrun rdrun"
    });
    every_flag(&term, "bash");
}

#[test]
fn zsh_completes_values_paths_and_nothing_else_at_a_terminal() {
    if !have("zsh") || !have("tmux") {
        eprintln!("skipped: needs zsh and tmux");
        return;
    }
    let tmp = TempDir::new("complete_zsh");
    let dir = tmp.path();
    let cwd = workdir(dir);
    let s = script(dir, "zsh", "fpath/_rdrun");
    let zdot = dir.join("zdot");
    std::fs::create_dir_all(&zdot).unwrap();
    let term = Term::start(
        dir,
        &cwd,
        "zsh -f -i",
        &[("ZDOTDIR", zdot.to_str().unwrap())],
    );
    // compinit finds `_rdrun` through its #compdef line in fpath, as an installed one.
    term.literal(&format!(
        "PS1='{PROMPT}'; setopt nobeep; fpath=('{}' $fpath); autoload -U compinit; \
         compinit -u -d '{}/.zcompdump'; print -r -- reg=$_comps[rdrun]",
        s.parent().unwrap().display(),
        zdot.display()
    ));
    term.keys(&["Enter"]);
    term.wait_line("reg=_rdrun", |l| l.trim() == "reg=_rdrun");
    every_flag(&term, "zsh");
}

#[test]
fn fish_completes_values_paths_and_nothing_else_at_a_terminal() {
    if !have("fish") || !have("tmux") {
        eprintln!("skipped: needs fish and tmux");
        return;
    }
    let tmp = TempDir::new("complete_fish");
    let dir = tmp.path();
    let cwd = workdir(dir);
    let s = script(dir, "fish", "rdrun.fish");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let h = home.to_str().unwrap();
    let term = Term::start(
        dir,
        &cwd,
        "fish --no-config -i",
        &[("XDG_CONFIG_HOME", h), ("XDG_DATA_HOME", h), ("HOME", h)],
    );
    term.literal(&format!(
        "function fish_prompt; echo -n '{PROMPT}'; end; set -g fish_greeting; \
         set -g fish_autosuggestion_enabled 0; source '{}'; echo loaded=(count (complete -c rdrun))",
        s.display()
    ));
    term.keys(&["Enter"]);
    term.wait_line("loaded=N", |l| {
        l.trim().starts_with("loaded=") && !l.contains("count")
    });
    every_flag(&term, "fish");
}
