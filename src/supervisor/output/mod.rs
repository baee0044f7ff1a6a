//! Worker output: every worker's stdout/stderr pipes pass through rdrun, which writes the
//! `--log-dir` files, the console (line-atomic, prefixed when tee'd) and keeps what the failure
//! report needs (spec torchrun-compat.md §5).
//!
//! Contract (the agent calls only these items):
//! - [`RunLogs::new`] once per run, [`RunLogs::attempt`] before each spawn round, [`RunLogs::finish`]
//!   at the end, *after* the failure report was rendered (it removes directories rdrun created that
//!   hold nothing; dropping a [`RunLogs`] does the same).
//! - [`forward_until`] once per worker with the read ends of its stdout and stderr pipes; the
//!   returned task ends when both reach EOF (or the stop is requested) *and* every line it
//!   produced is on the console, and yields the last stderr lines and the last Python traceback
//!   for the failure report.
//!
//! Files, one job each:
//! - [`logdir`]: the log-dir layout, where each stream goes, clean-up at the end.
//! - [`prefix`]: console prefixes of tee'd lines (`--log-line-prefix-template`).
//! - [`lines`]: splitting a byte stream into console segments (`\n`, `\r`, the 1 MiB cap).
//! - [`tail`]: the stderr tail and the Python traceback scanner for the report.
//! - [`console`]: the console writer thread (one write per run of whole lines, a byte budget).
//! - [`ticker`]: its alarm thread (the writer waits for messages without a timeout).
//! - [`chunk`]: the message a forwarder sends the console writer.
//! - [`collapse`]: the writer's `--output collapse` stage (identical lines of several ranks once).
//! - [`progress`]: the writer's `--progress` stage (the `\r` bars of several ranks as one line).
//! - [`pump`]: the forwarding task per worker that ties the others together.
//! - [`own`]: rdrun's own text on its stdout and stderr (log lines, report, events, status, hang
//!   block): never a panic on a closed or full stream, never glued onto a worker's open line.
//!
//! Every stream passes through rdrun, so lines are never split or interleaved mid-line (torchrun
//! passes untee'd streams through raw, and its tail threads split partial lines); a prompt left
//! without newline is shown after a short idle time and keeps the terminal to itself while open
//! ([`console`] states the rule). Log files receive the bytes exactly as the worker wrote them,
//! written as soon as they are read. Writing to rdrun's console never panics ([`console`]).

pub mod chunk;
pub mod collapse;
pub mod console;
pub mod lines;
pub mod logdir;
pub mod own;
pub mod prefix;
pub mod progress;
pub mod pump;
pub mod tail;
pub mod ticker;

pub use console::{Console, CONSOLE_BUDGET};
pub use lines::MAX_LINE;
pub use logdir::{AttemptLogs, RankLogs, RankSink, RunLogs};
pub use own::Stream;
pub use prefix::{line_prefix, substitute_template, RankIdentity};
pub use pump::{forward_to, forward_until, Activity, LastLines};
pub use tail::{
    OutputSummary, KEPT_LINE_MAX, TAIL_LINES, TRACEBACK_MAX_LINES, TRACEBACK_RECENT_LINES,
};

/// Helpers shared by the unit tests of the files above.
#[cfg(test)]
mod testutil {
    use super::RankIdentity;
    use std::fs;
    use std::path::{Path, PathBuf};

    pub fn id(local_rank: usize) -> RankIdentity {
        RankIdentity {
            role: "default".into(),
            rank: local_rank + 4,
            local_rank,
            hostname: "vm".into(),
        }
    }

    /// A scratch directory removed on drop (`tempfile`: unique name, removed even when the test
    /// panics); `.0` is its path.
    pub struct Scratch(pub PathBuf, #[allow(dead_code)] tempfile::TempDir);
    impl Scratch {
        pub fn new() -> Scratch {
            let dir = tempfile::Builder::new()
                .prefix("rdrun-output-test-")
                .tempdir()
                .expect("scratch dir");
            Scratch(dir.path().to_path_buf(), dir)
        }
    }

    pub fn list(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).expect("read_dir").flatten() {
                let p = e.path();
                let rel = p.strip_prefix(base).expect("prefix").display().to_string();
                if p.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &p, out);
                } else {
                    out.push(rel);
                }
            }
        }
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    pub const TB: &str = "Traceback (most recent call last):
  File \"/tmp/fail.py\", line 9, in <module>
    main()
  File \"/tmp/fail.py\", line 6, in main
    raise ValueError(\"bad value\")
ValueError: bad value
";
}
