//! `--progress` (issue 29) with the real binary and real tqdm bars on 4 ranks: at a terminal
//! (tmux, no flag: the default) the screen shows one live bar line for all ranks, never one per
//! rank, and at the end each rank's final bar state as a line and no intermediate state; on a
//! pipe (`--progress one`) at most one progress line per interval, no `\r` on the console, each
//! rank's final state once, and the `--tee` log files byte-exact (every `\r` state in them).
//! tqdm comes from the PyTorch venv (`scripts/torch-venv.sh`); without it the tests say SKIP.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{rdrun_bin, torch_python, Rdrun, TempDir};

/// A tqdm loop per rank (rank 3 the slowest), its bar on stderr; with `$SIDE` set every byte
/// tqdm writes is also copied to `$SIDE.<rank>` (to compare with rdrun's log file).
const TQDM_PY: &str = r#"
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
side = os.environ.get("SIDE")
class Tee:
    def __init__(self):
        self.copy = open(f"{side}.{rank}", "wb") if side else None
    def write(self, s):
        sys.__stderr__.write(s)
        sys.__stderr__.flush()
        if self.copy:
            self.copy.write(s.encode())
            self.copy.flush()
        return len(s)
    def flush(self):
        sys.__stderr__.flush()
out = Tee()
out.write(f"rank {rank} starts\n")
steps = int(os.environ.get("STEPS", "60"))
for i in tqdm(range(steps), file=out, desc=f"r{rank}", mininterval=0.05, ascii=True):
    time.sleep(0.04 + 0.01 * rank)
out.write(f"rank {rank} done\n")
"#;

fn have_tmux() -> bool {
    Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn quote(p: &std::path::Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// A line of a tqdm bar (`r2:  45%|####...`), wherever it starts.
fn is_bar(line: &str) -> bool {
    line.contains("%|")
}

/// A rank's final bar line (`r2: 100%|##########| 60/60 [...]`), unprefixed.
fn is_final(line: &str) -> bool {
    line.starts_with('r') && line.contains(": 100%|")
}

#[test]
fn tqdm_on_four_ranks_is_one_bar_at_a_terminal() {
    if !have_tmux() {
        eprintln!("SKIP: needs tmux");
        return;
    }
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("progress_tty");
    let script = dir.join("bars.py");
    std::fs::write(&script, TQDM_PY).expect("write script");
    let cmd = format!(
        "{} --standalone --nproc-per-node 4 {}; echo \"RDRUN-STATUS=$?\"; exec sleep 300",
        quote(&rdrun_bin()),
        quote(&script)
    );
    let path = std::env::var("PATH").unwrap_or_default();
    let py = python.display().to_string();
    let term = crate::term::Tmux::start(
        dir.path(),
        200,
        None,
        &[("PATH", &path), ("PYTHON_EXEC", &py)],
        &["sh", "-c", &cmd],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut merged_seen = false;
    let mut samples = 0;
    let screen = loop {
        let screen = term.run(&["capture-pane", "-p", "-t", "0"]);
        samples += 1;
        // At any moment: at most one bar line that is not a rank's final line.
        let live: Vec<&str> = screen
            .lines()
            .filter(|l| is_bar(l) && !is_final(l))
            .collect();
        assert!(live.len() <= 1, "more than one live bar:\n{screen}");
        merged_seen |= live
            .iter()
            .any(|l| l.starts_with("[0-3] r") && l.contains("(slowest rank"));
        if screen.contains("RDRUN-STATUS=") {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "rdrun did not end in time:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(screen.contains("RDRUN-STATUS=0"), "{screen}");
    assert!(
        merged_seen,
        "never saw the one bar of ranks 0-3 ({samples} samples):\n{screen}"
    );
    let lines: Vec<&str> = screen.lines().map(str::trim_end).collect();
    for r in 0..4 {
        let finals = lines
            .iter()
            .filter(|l| l.starts_with(&format!("r{r}: 100%|")))
            .count();
        assert_eq!(finals, 1, "rank {r}'s final bar line:\n{screen}");
        for want in [format!("rank {r} starts"), format!("rank {r} done")] {
            assert!(lines.contains(&want.as_str()), "{want}:\n{screen}");
        }
    }
    // No intermediate state is left on the screen.
    assert!(
        lines.iter().all(|l| !is_bar(l) || is_final(l)),
        "an intermediate bar state stayed on the screen:\n{screen}"
    );
}

#[test]
fn tqdm_on_a_pipe_is_one_line_per_interval() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("progress_pipe");
    let script = dir.join("bars.py");
    std::fs::write(&script, TQDM_PY).expect("write script");
    let logs = dir.join("logs");
    let interval = 0.5;
    let started = Instant::now();
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "4"])
        .args(["--progress", "one", "--progress-interval", "0.5"])
        .args(["--tee", "2", "--log-dir"])
        .arg(&logs)
        .env("PYTHON_EXEC", &python)
        .env("SIDE", dir.join("side"))
        .timeout(Duration::from_secs(120))
        .arg(&script)
        .run();
    let elapsed = started.elapsed().as_secs_f64();
    out.assert_code(0);
    assert!(
        !out.stderr.contains('\r'),
        "a \\r reached the pipe: {out:?}"
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    // Each rank's final state: its last bar line, prefixed as its tee'd lines are, at 100 %
    // and before its last line. (The stage's line for one bar left is that bar as written,
    // prefix included: it may show 100 % too, just before the final line.)
    let mut finals = Vec::new();
    for r in 0..4 {
        let bar = format!("[default{r}]:r{r}: ");
        let done = format!("[default{r}]:rank {r} done");
        let last = lines
            .iter()
            .rposition(|l| l.starts_with(&bar))
            .unwrap_or_else(|| panic!("no bar line of rank {r}: {}", out.stderr));
        assert!(lines[last].contains(": 100%|"), "{}", lines[last]);
        let at_done = lines.iter().position(|l| *l == done);
        assert!(at_done.is_some_and(|d| d > last), "{done}: {}", out.stderr);
        assert!(
            lines.contains(&format!("[default{r}]:rank {r} starts").as_str()),
            "{}",
            out.stderr
        );
        finals.push(last);
    }
    // The stage's lines: every other bar line. At most one per interval over the run.
    let progress: Vec<&str> = lines
        .iter()
        .enumerate()
        .filter(|(i, l)| is_bar(l) && !finals.contains(i))
        .map(|(_, l)| *l)
        .collect();
    let most = (elapsed / interval).floor() as usize + 1;
    assert!(
        !progress.is_empty() && progress.len() <= most,
        "{} progress lines in {elapsed:.1}s (at most {most}): {progress:#?}",
        progress.len()
    );
    assert!(
        progress
            .iter()
            .any(|l| l.starts_with("[0-3] r") && l.contains("(slowest rank")),
        "{progress:#?}"
    );
    // The log files: every byte tqdm wrote, each rank its own.
    let runs: Vec<_> = std::fs::read_dir(&logs)
        .expect("log dir")
        .flatten()
        .collect();
    assert_eq!(runs.len(), 1, "one run directory");
    for r in 0..4 {
        let log = runs[0].path().join(format!("attempt_0/{r}/stderr.log"));
        let side = dir.join(format!("side.{r}"));
        let got = std::fs::read(&log).expect("stderr.log");
        assert_eq!(got, std::fs::read(&side).expect("side copy"), "rank {r}");
        assert!(
            got.iter().filter(|b| **b == b'\r').count() > 10,
            "rank {r}'s log lacks its \\r states"
        );
    }
}
