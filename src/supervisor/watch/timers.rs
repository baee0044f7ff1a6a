//! torch's FileTimer watchdog, served for the whole run: the FIFO and its table
//! ([`FileTimerServe`]), the capture of an expired process before its signal goes out
//! ([`capture_timer_expiry`]), and which worker's tree a process belongs to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};

use super::hang::filetimer::epoch_now;
use super::hang::{
    capture, CaptureOptions, CaptureTarget, HangMode, HangReason, HangSettings, TimerExpiry,
    TimerFifo, TimerMsg, TimerTable, Verdict,
};
use super::link::rank_store_waits;
use super::verdict::HangFinding;
use crate::store::state::Store;

/// A FileTimer expiry of a live worker's tree, as the agent found it: captured before the
/// signal goes out (issue 13: "capture that rank, then signal that worker only").
pub(crate) struct ExpiredTarget {
    pub expiry: TimerExpiry,
    /// The worker (the tree's root) the expired process belongs to: its output tail.
    pub last_output: Vec<String>,
    /// The earliest expired timer's expiration (seconds since the epoch, torch's clock).
    pub expired_at: f64,
}

/// Captures the processes whose FileTimers expired — Python stack, kernel waits, last output,
/// store waits — in parallel and bounded like a hang capture, writes `rank<R>.txt` into `dir`,
/// prints the one block and returns the finding for the failure report (`kill`: the signal is
/// the timer's to send; the caller sends it after this returns). Capture works whether hang
/// detection is on or off: the script opted into the watchdog, and its stack is the point.
pub(crate) async fn capture_timer_expiry(
    settings: &HangSettings,
    dir: &Path,
    expired: Vec<ExpiredTarget>,
    store: Option<&Store>,
) -> HangFinding {
    let now = epoch_now();
    let overdue = expired
        .iter()
        .map(|t| now - t.expired_at)
        .fold(0.0_f64, f64::max);
    let mut store_waits =
        rank_store_waits(store, expired.iter().map(|t| (t.expiry.rank, t.expiry.pid)));
    let targets: Vec<CaptureTarget> = expired
        .iter()
        .map(|t| CaptureTarget {
            rank: t.expiry.rank,
            pid: t.expiry.pid,
            last_output: t.last_output.clone(),
            store_waits: store_waits.remove(&t.expiry.rank).unwrap_or_default(),
        })
        .collect();
    let each: Vec<String> = expired
        .iter()
        .map(|t| {
            let e = &t.expiry;
            format!(
                "rank {} scope {:?} ({})",
                e.rank,
                e.scopes.join(","),
                e.signal
            )
        })
        .collect();
    let verdict = Verdict {
        reason: HangReason::FileTimer {
            expired: expired.into_iter().map(|t| t.expiry).collect(),
        },
        phase: super::hang::Phase::Steady,
        quiet_for: Duration::from_secs_f64(overdue.clamp(0.0, 1e9)),
        budget: Duration::ZERO,
        action: HangMode::Kill,
        ranks: Vec::new(),
    };
    let mut report = capture(&verdict, &targets, &CaptureOptions::from_settings(settings)).await;
    let files = match report.write_files(dir) {
        Ok(_) => Some(dir.to_path_buf()),
        Err(err) => {
            tracing::warn!(dir = %dir.display(), "cannot write the FileTimer capture: {err}");
            None
        }
    };
    let block = report.render();
    let mut summary = format!("torch FileTimer expired: {}", each.join("; "));
    if let Some(d) = files {
        summary.push_str(&format!("; stacks in {}", d.display()));
    }
    HangFinding {
        kill: true,
        suspect: report.suspects.first().copied(),
        summary,
        block,
    }
}

/// torch's FileTimer watchdog served the right way (issue 13): with
/// `TORCHELASTIC_ENABLE_FILE_TIMER=1` in rdrun's environment, as torchrun, the FIFO is created
/// before any worker starts (at `TORCHELASTIC_TIMER_FILE` if set, else in a private 0700
/// directory whose FIFO path every worker gets), kept across restarts and removed at the end.
/// An expired timer's signal goes to that process only, and only if it belongs to a worker's
/// process tree — never to rdrun (torchrun SIGKILLs itself) — and the worker's death takes the
/// normal failure path.
pub(crate) struct FileTimerServe {
    fifo: TimerFifo,
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<TimerMsg, String>>,
    table: TimerTable,
    /// The private directory rdrun made for the FIFO (removed at the end).
    private_dir: Option<PathBuf>,
    interval: Interval,
}

/// What woke the FileTimer arm.
pub(crate) enum TimerWake {
    Msg(Result<TimerMsg, String>),
    /// Time to look for expired timers.
    Check,
}

/// How often armed timers are checked (torch's server: `max_interval` 0.1 s).
const TIMER_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl FileTimerServe {
    /// `None` unless `TORCHELASTIC_ENABLE_FILE_TIMER` is `"1"`; else the server and, when rdrun
    /// chose the path, the `TORCHELASTIC_TIMER_FILE` value every worker must get. Must run
    /// inside the tokio runtime.
    pub fn start(
        env: impl Fn(&str) -> Option<String>,
        temp: &Path,
    ) -> Result<Option<(FileTimerServe, Option<String>)>, String> {
        if env("TORCHELASTIC_ENABLE_FILE_TIMER").as_deref() != Some("1") {
            return Ok(None);
        }
        let (path, private_dir) = match env("TORCHELASTIC_TIMER_FILE").filter(|p| !p.is_empty()) {
            Some(p) => (PathBuf::from(p), None),
            None => {
                let dir = private_dir(temp).map_err(|e| {
                    format!("cannot create a private directory for the FileTimer FIFO: {e}")
                })?;
                (dir.join("watchdog_timer"), Some(dir))
            }
        };
        let cleanup = |d: &Option<PathBuf>| {
            if let Some(d) = d {
                let _ = std::fs::remove_dir(d);
            }
        };
        let fifo = TimerFifo::create(&path).map_err(|e| {
            cleanup(&private_dir);
            format!(
                "cannot create the FileTimer FIFO {} (TORCHELASTIC_ENABLE_FILE_TIMER=1): {e}",
                path.display()
            )
        })?;
        let rx = fifo.serve().map_err(|e| {
            format!(
                "cannot open the FileTimer FIFO {}: {e}",
                fifo.path().display()
            )
        })?;
        let mut interval = tokio::time::interval(TIMER_CHECK);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let worker_path = private_dir
            .is_some()
            .then(|| fifo.path().to_string_lossy().into_owned());
        tracing::info!(path = %fifo.path().display(), "serving torch's FileTimer watchdog");
        Ok(Some((
            FileTimerServe {
                fifo,
                rx,
                table: TimerTable::default(),
                private_dir,
                interval,
            },
            worker_path,
        )))
    }

    /// The next message, or the next check while some timer is armed.
    pub async fn next(&mut self) -> TimerWake {
        let armed = !self.table.is_empty();
        tokio::select! {
            m = self.rx.recv() => match m {
                Some(m) => TimerWake::Msg(m),
                // The reader task ended (the FIFO failed): nothing more will come.
                None => std::future::pending().await,
            },
            _ = self.interval.tick(), if armed => TimerWake::Check,
        }
    }

    pub fn apply(&mut self, msg: TimerMsg) {
        self.table.apply(msg);
    }

    /// Takes the timers expired by now (wall clock, as torch's client sets them).
    pub fn expired(&mut self) -> Vec<super::hang::filetimer::Expired> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.table.take_expired(now)
    }

    /// A new attempt: the previous workers' timers are void.
    pub fn clear(&mut self) {
        self.table.clear();
    }
}

impl Drop for FileTimerServe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.fifo.path());
        if let Some(d) = &self.private_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A fresh 0700 directory `rdrun-timer-<pid>-<n>` under `base` (the config's temporary
/// directory).
fn private_dir(base: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = None;
    for i in 0..16u32 {
        let d = base.join(format!(
            "rdrun-timer-{}-{:08x}",
            std::process::id(),
            seed.wrapping_add(i.wrapping_mul(0x9e37_79b9))
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

/// The worker (of `workers`, live main pids) whose process tree holds `pid`: `pid` itself or
/// an ancestor, found by walking `/proc/<pid>/stat` parents.
pub(crate) fn owning_worker(pid: i32, workers: &[i32]) -> Option<i32> {
    let mut p = pid;
    for _ in 0..64 {
        if p <= 1 {
            return None;
        }
        if workers.contains(&p) {
            return Some(p);
        }
        let text = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        p = super::hang::sample::parse_stat(&text)?.ppid;
    }
    None
}
