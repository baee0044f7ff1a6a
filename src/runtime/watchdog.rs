//! The worker side of torch's FileTimer watchdog (issue 13, spec hang-detection §5.8): a Rust
//! worker heartbeats and arms timers on the FIFO its launcher serves
//! (`TORCHELASTIC_TIMER_FILE`), in torch's wire format, so it works under rdrun and torchrun.
//!
//! * [`Watchdog::from_env`] is `None` without `TORCHELASTIC_TIMER_FILE`: nothing to talk to.
//! * [`Watchdog::beat`] sends at most one line a second: a FileTimer acquire with scope
//!   `rdrun/heartbeat`, signal 0 and expiration now + `RDRUN_HEARTBEAT_TIMEOUT` (default
//!   [`DEFAULT_HEARTBEAT_TIMEOUT`]), plus the extra keys `rank` and `step`. rdrun treats any
//!   `rdrun/` scope with signal 0 as a heartbeat with that budget; torch's server ignores the
//!   extra keys and lets a signal-0 timer expire harmlessly ("Do not reap it").
//! * [`Watchdog::expires`] arms a timer (default signal SIGKILL, as torch's client) that the
//!   returned [`Guard`] releases when dropped.
//!
//! Each request opens the FIFO `O_WRONLY|O_NONBLOCK`, writes one line (≤ 4096 bytes, so the
//! write is atomic) and closes it, as torch's client does. Errors are never fatal: the first is
//! logged, later ones are dropped.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The heartbeat scope (rdrun applies heartbeat policy to every `rdrun/` scope with signal 0).
pub const HEARTBEAT_SCOPE: &str = "rdrun/heartbeat";
/// Heartbeat budget without `RDRUN_HEARTBEAT_TIMEOUT`: rdrun's default steady hang budget.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(900);
/// Fewest seconds between two heartbeat writes.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// torch's client refuses longer requests (`select.PIPE_BUF`).
const MAX_LINE: usize = 4096;

/// A handle on the launcher's FileTimer FIFO.
#[derive(Debug)]
pub struct Watchdog {
    path: PathBuf,
    rank: Option<u64>,
    heartbeat_timeout: Duration,
    last_beat: Mutex<Option<Instant>>,
    warned: AtomicBool,
}

/// Releases its timer when dropped.
#[must_use = "the timer is released when the guard is dropped"]
#[derive(Debug)]
pub struct Guard<'a> {
    wd: &'a Watchdog,
    scope: String,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.wd
            .send(&request(std::process::id(), &self.scope, -1.0, 0, None));
    }
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One request line, keys in torch's order (`json.dumps` of its request dict), extras after.
fn request(
    pid: u32,
    scope: &str,
    expiration: f64,
    signal: i32,
    extra: Option<(Option<u64>, Option<u64>)>,
) -> String {
    let scope = serde_json::to_string(scope).unwrap_or_else(|_| "\"\"".into());
    // A float, as Python's time.time() sum prints it; -1 for a release, as torch sends.
    let exp = if expiration < 0.0 {
        "-1".to_string()
    } else {
        format!("{expiration:.6}")
    };
    let mut line = format!(
        "{{\"version\": 1, \"pid\": {pid}, \"scope_id\": {scope}, \"expiration_time\": {exp}, \"signal\": {signal}"
    );
    if let Some((rank, step)) = extra {
        if let Some(r) = rank {
            line.push_str(&format!(", \"rank\": {r}"));
        }
        if let Some(s) = step {
            line.push_str(&format!(", \"step\": {s}"));
        }
    }
    line.push('}');
    line
}

impl Watchdog {
    /// The launcher's FIFO from `TORCHELASTIC_TIMER_FILE`; `None` when unset or empty. The
    /// heartbeat budget comes from `RDRUN_HEARTBEAT_TIMEOUT` (seconds), the rank from `RANK`.
    pub fn from_env() -> Option<Watchdog> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Option<Watchdog> {
        let path = env("TORCHELASTIC_TIMER_FILE").filter(|p| !p.is_empty())?;
        let timeout = env("RDRUN_HEARTBEAT_TIMEOUT")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0 && *v < 1e9)
            .map_or(DEFAULT_HEARTBEAT_TIMEOUT, Duration::from_secs_f64);
        let mut wd = Watchdog::new(path, timeout);
        wd.rank = env("RANK").and_then(|r| r.parse().ok());
        Some(wd)
    }

    /// A handle on the FIFO at `path` with the given heartbeat budget.
    pub fn new(path: impl Into<PathBuf>, heartbeat_timeout: Duration) -> Watchdog {
        Watchdog {
            path: path.into(),
            rank: None,
            heartbeat_timeout,
            last_beat: Mutex::new(None),
            warned: AtomicBool::new(false),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A heartbeat, `step` being the training step reached (at most one write per second;
    /// calls in between do nothing).
    pub fn beat(&self, step: Option<u64>) {
        let now = Instant::now();
        {
            let mut last = self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < BEAT_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let exp = epoch_now() + self.heartbeat_timeout.as_secs_f64();
        self.send(&request(
            std::process::id(),
            HEARTBEAT_SCOPE,
            exp,
            0,
            Some((self.rank, step)),
        ));
    }

    /// Arms a timer that kills this process with SIGKILL unless the guard is dropped within
    /// `after` (torch's `expires(after=..., scope=...)`).
    pub fn expires(&self, after: Duration, scope: &str) -> Guard<'_> {
        self.expires_with_signal(after, scope, libc::SIGKILL)
    }

    /// As [`Watchdog::expires`] with another signal (0: report only, never signalled).
    pub fn expires_with_signal(&self, after: Duration, scope: &str, signal: i32) -> Guard<'_> {
        let exp = epoch_now() + after.as_secs_f64();
        self.send(&request(std::process::id(), scope, exp, signal, None));
        Guard {
            wd: self,
            scope: scope.to_string(),
        }
    }

    fn send(&self, line: &str) {
        let res = if line.len() > MAX_LINE {
            Err(std::io::Error::other(format!(
                "timer request of {} bytes exceeds {MAX_LINE}",
                line.len()
            )))
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.path)
                .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        };
        if let Err(e) = res {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    path = %self.path.display(),
                    "watchdog: cannot write to the FileTimer FIFO (further errors not shown): {e}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A FIFO with a read-write reader (as rdrun serves it), in a fresh directory.
    struct Fifo {
        /// Removed (with the FIFO) when dropped.
        _dir: tempfile::TempDir,
        path: PathBuf,
        reader: std::fs::File,
    }

    impl Fifo {
        fn new(tag: &str) -> Fifo {
            let dir = tempfile::Builder::new()
                .prefix(&format!("rdrun-wd-{tag}-"))
                .tempdir()
                .unwrap();
            let path = dir.path().join("timer");
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
            let reader = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .unwrap();
            Fifo {
                _dir: dir,
                path,
                reader,
            }
        }

        fn lines(&mut self) -> Vec<serde_json::Value> {
            let mut buf = vec![0u8; 65536];
            let n = self.reader.read(&mut buf).unwrap_or(0);
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    #[test]
    fn from_env_needs_the_timer_file() {
        assert!(Watchdog::from_lookup(|_| None).is_none());
        assert!(
            Watchdog::from_lookup(|k| (k == "TORCHELASTIC_TIMER_FILE").then(String::new)).is_none()
        );
        let wd = Watchdog::from_lookup(|k| match k {
            "TORCHELASTIC_TIMER_FILE" => Some("/x/timer".into()),
            "RDRUN_HEARTBEAT_TIMEOUT" => Some("30".into()),
            "RANK" => Some("3".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(wd.path(), Path::new("/x/timer"));
        assert_eq!(wd.heartbeat_timeout, Duration::from_secs(30));
        assert_eq!(wd.rank, Some(3));
        let wd = Watchdog::from_lookup(|k| match k {
            "TORCHELASTIC_TIMER_FILE" => Some("/x/timer".into()),
            "RDRUN_HEARTBEAT_TIMEOUT" => Some("soon".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(wd.heartbeat_timeout, DEFAULT_HEARTBEAT_TIMEOUT);
    }

    #[test]
    fn beats_are_torch_requests_with_extras_and_rate_limited() {
        let mut f = Fifo::new("beat");
        let mut wd = Watchdog::new(&f.path, Duration::from_secs(60));
        wd.rank = Some(2);
        let before = epoch_now();
        wd.beat(Some(7));
        wd.beat(Some(8)); // within a second: dropped
        let got = f.lines();
        assert_eq!(got.len(), 1, "{got:?}");
        let v = &got[0];
        assert_eq!(v["version"], 1);
        assert_eq!(v["pid"], std::process::id());
        assert_eq!(v["scope_id"], HEARTBEAT_SCOPE);
        assert_eq!(v["signal"], 0);
        assert_eq!(v["rank"], 2);
        assert_eq!(v["step"], 7);
        let exp = v["expiration_time"].as_f64().unwrap();
        assert!(exp >= before + 59.0 && exp <= epoch_now() + 61.0, "{exp}");
    }

    #[test]
    fn expires_acquires_then_releases_on_drop() {
        let mut f = Fifo::new("expires");
        let wd = Watchdog::new(&f.path, Duration::from_secs(60));
        {
            let _g = wd.expires(Duration::from_secs(5), "load \"ckpt\"");
            let a = f.lines();
            assert_eq!(a.len(), 1);
            assert_eq!(a[0]["scope_id"], "load \"ckpt\"");
            assert_eq!(a[0]["signal"], libc::SIGKILL);
            assert!(a[0]["expiration_time"].as_f64().unwrap() > epoch_now());
        }
        let r = f.lines();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0]["expiration_time"], -1);
        assert_eq!(r[0]["signal"], 0);
        assert_eq!(r[0]["scope_id"], "load \"ckpt\"");
    }

    #[test]
    fn errors_are_never_fatal() {
        // No reader at all (a path that does not exist), and an over-long scope.
        let wd = Watchdog::new("/nonexistent/rdrun-timer", Duration::from_secs(1));
        wd.beat(None);
        drop(wd.expires(Duration::from_secs(1), "x"));
        assert!(wd.warned.load(Ordering::Relaxed));
        let f = Fifo::new("long");
        let wd = Watchdog::new(&f.path, Duration::from_secs(1));
        drop(wd.expires(Duration::from_secs(1), &"s".repeat(5000)));
        assert!(wd.warned.load(Ordering::Relaxed), "over-long line refused");
    }
}
