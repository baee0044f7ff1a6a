//! The agent's side of hang detection (issue 13): one [`HangLink`] per attempt holds the
//! [`HangMonitor`] and its poll timer, feeds it worker exits, and on a verdict captures every
//! live rank, writes `rank<R>.txt` files and prints the one block on stderr. What follows the
//! verdict (stop the group, restart) is the agent's: [`HangFinding::kill`] says whether to.
//!
//! Where the files go: `<log-dir>/attempt_<n>/hang/` when `--log-dir` names a directory (it
//! outlives the run); otherwise a private directory `rdrun-hang-<run id>-<pid>/attempt_<n>/`
//! under the temporary directory, named in the block, which rdrun never removes (the temporary
//! log directory is cleaned at the end of the run, and the stacks must survive it).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio::time::{Interval, MissedTickBehavior};

use super::hang::{
    capture, CaptureOptions, CaptureTarget, HangMode, HangMonitor, HangSettings, RankProcs, Verdict,
};

/// What the agent does with a verdict.
#[derive(Debug, Clone)]
pub(crate) struct HangFinding {
    /// Stop the group and take the failure path (kill mode); else only report (observe).
    pub kill: bool,
    /// The suspect the capture named first (global rank), if any.
    pub suspect: Option<u32>,
    /// One line for the failure report's root cause, e.g. `no activity on any of 2 ranks for
    /// 3s (budget 3s), suspect rank 1; stacks in DIR`.
    pub summary: String,
}

/// Hang detection for one attempt; `None` from [`HangLink::new`] when it is off.
pub(crate) struct HangLink {
    monitor: HangMonitor,
    interval: Interval,
    settings: HangSettings,
    dir: PathBuf,
    /// A kill verdict was acted on: no more sampling in this attempt.
    done: bool,
}

impl HangLink {
    /// Starts detection for ranks spawned now; files of a verdict go to `dir`.
    pub fn new(settings: &HangSettings, dir: PathBuf) -> Option<HangLink> {
        let tty = std::io::stdin().is_terminal();
        let monitor = HangMonitor::new(settings, tty, Instant::now());
        if !monitor.enabled() {
            return None;
        }
        if tty && settings.mode == HangMode::Kill {
            tracing::info!("stdin is a terminal: hang detection observes only (never kills)");
        }
        let mut interval = tokio::time::interval(monitor.poll_interval());
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(HangLink {
            monitor,
            interval,
            settings: settings.clone(),
            dir,
            done: false,
        })
    }

    /// Whether the poll arm should run.
    pub fn active(&self) -> bool {
        !self.done
    }

    /// Resolves at the next poll tick.
    pub async fn tick(&mut self) {
        self.interval.tick().await;
    }

    /// A worker exited with torchrun's code (negative: killed by that signal).
    pub fn rank_exited(&mut self, rank: u32, code: i32) {
        self.monitor
            .detector()
            .rank_exited(rank, code, Instant::now());
    }

    /// Samples the live ranks; on a verdict captures them, writes the files, prints the block
    /// and says what to do.
    pub async fn poll(&mut self, live: &[RankProcs]) -> Option<HangFinding> {
        let verdict = self.monitor.sample(Instant::now(), live)?;
        Some(self.act(verdict, live).await)
    }

    async fn act(&mut self, verdict: Verdict, live: &[RankProcs]) -> HangFinding {
        let targets: Vec<CaptureTarget> = live
            .iter()
            .filter(|r| verdict.ranks.iter().any(|v| v.rank == r.rank && v.alive))
            .map(|r| CaptureTarget {
                rank: r.rank,
                pid: r.pid,
                last_output: Vec::new(),
            })
            .collect();
        let mut report = capture(
            &verdict,
            &targets,
            &CaptureOptions::from_settings(&self.settings),
        )
        .await;
        let files = match report.write_files(&self.dir) {
            Ok(_) => Some(self.dir.clone()),
            Err(err) => {
                tracing::warn!(dir = %self.dir.display(), "cannot write the hang capture: {err}");
                None
            }
        };
        let block = report.render();
        eprint!("{block}");
        let kill = verdict.action == HangMode::Kill;
        if kill {
            self.done = true;
        }
        let suspect = report.suspects.first().copied();
        let what = block
            .lines()
            .next()
            .and_then(|l| l.split_once("): "))
            .map(|(_, w)| w.split("; captured").next().unwrap_or(w).to_string())
            .unwrap_or_else(|| "the job stopped making progress".to_string());
        let mut summary = what;
        if let Some(s) = suspect {
            summary.push_str(&format!(", suspect rank {s} ({})", report.suspect_reason));
        }
        if let Some(d) = files {
            summary.push_str(&format!("; stacks in {}", d.display()));
        }
        HangFinding {
            kill,
            suspect,
            summary,
        }
    }
}

/// Where an attempt's hang files go (module doc).
pub(crate) fn hang_dir(
    log_dir: Option<&Path>,
    attempt_dir: Option<&Path>,
    run_id: &str,
    attempt: u32,
) -> PathBuf {
    match (log_dir, attempt_dir) {
        (Some(d), Some(a)) if d != Path::new("/dev/null") => a.join("hang"),
        _ => {
            let safe: String = run_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            std::env::temp_dir()
                .join(format!("rdrun-hang-{safe}-{}", std::process::id()))
                .join(format!("attempt_{attempt}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_go_under_the_log_dir_else_a_named_temp_dir() {
        let a = Path::new("/logs/run/attempt_1");
        assert_eq!(
            hang_dir(Some(Path::new("/logs")), Some(a), "x", 1),
            a.join("hang")
        );
        let t = hang_dir(None, Some(a), "a/b", 2);
        assert!(t.starts_with(std::env::temp_dir()), "{t:?}");
        assert!(t.ends_with("attempt_2"), "{t:?}");
        let name = t.parent().unwrap().file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("rdrun-hang-a_b-"), "{name}");
        let n = hang_dir(Some(Path::new("/dev/null")), None, "x", 0);
        assert!(n.starts_with(std::env::temp_dir()), "{n:?}");
    }
}
