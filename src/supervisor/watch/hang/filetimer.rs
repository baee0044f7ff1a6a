//! Server side of torch's FileTimer protocol (`torch.distributed.elastic.timer.FileTimerClient`):
//! the line parser, the timer table, and the FIFO reader task.
//!
//! Wire format (torch `file_based_local_timer.py`): one `json.dumps` object per line, `"\n"`
//! terminated, with keys `version`, `pid`, `scope_id`, `expiration_time` (wall-clock epoch
//! seconds) and `signal`. The client refuses requests whose JSON exceeds `PIPE_BUF` (4096)
//! characters, so a line is at most 4096 bytes before its newline; longer lines are rejected and
//! skipped up to the next newline. Like torch, only `pid`, `scope_id`, `expiration_time` and
//! `signal` are read (`version` and unknown keys are ignored); a negative expiration is a
//! release. Unlike torch, a malformed line is an error value, not an exception that stops the
//! server.
//!
//! The FIFO is created 0600 (its directory should be private), opened read-write and
//! non-blocking before any worker starts — so a client's `O_WRONLY|O_NONBLOCK` open never gets
//! ENXIO and the reader never sees EOF — and removed when [`TimerFifo`] is dropped.
//!
//! What rdrun says about the FIFO is bounded (issue 25: 200,000 malformed lines gave 200,252
//! WARN lines; 20,000 expired scopes of one pid one 20 MB line): malformed lines are counted in
//! the reader task and reported as the store's warnings are ([`LogLimiter`]: the first of a
//! quiet period at once, then one summary per [`WARN_INTERVAL`]), so they are never queued one
//! by one; and a log line lists at most [`MAX_LISTED`] scopes of [`MAX_SCOPE_CHARS`] each
//! ([`scope_list`]).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::store::server::LogLimiter;

/// Longest request line torch's client sends, newline excluded (`select.PIPE_BUF`).
pub const MAX_LINE: usize = 4096;

/// At most one warning line about the FIFO's malformed requests per this interval (the store's
/// interval for its warnings).
pub const WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Scopes one log line names; more are counted.
pub const MAX_LISTED: usize = 8;
/// Characters of one scope id in a log line; longer ones are cut (with `...`).
pub const MAX_SCOPE_CHARS: usize = 200;

/// The scope ids of `timers` for a log line: at most [`MAX_LISTED`], each at most
/// [`MAX_SCOPE_CHARS`] characters, and a last entry `(N more)` for the rest.
pub fn scope_list(timers: &[Timer]) -> Vec<String> {
    let mut out: Vec<String> = timers
        .iter()
        .take(MAX_LISTED)
        .map(|t| match t.scope_id.char_indices().nth(MAX_SCOPE_CHARS) {
            Some((at, _)) => format!("{}...", &t.scope_id[..at]),
            None => t.scope_id.clone(),
        })
        .collect();
    if timers.len() > MAX_LISTED {
        out.push(format!("({} more)", timers.len() - MAX_LISTED));
    }
    out
}

/// One request.
#[derive(Debug, Clone, PartialEq)]
pub enum TimerMsg {
    /// Arm (or re-arm) the timer `(pid, scope_id)`.
    Acquire {
        pid: i32,
        scope_id: String,
        expiration_time: f64,
        signal: i32,
    },
    /// Drop the timer `(pid, scope_id)`.
    Release { pid: i32, scope_id: String },
}

impl TimerMsg {
    pub fn pid(&self) -> i32 {
        match self {
            TimerMsg::Acquire { pid, .. } | TimerMsg::Release { pid, .. } => *pid,
        }
    }
}

/// Parses one line (without its newline).
pub fn parse_line(line: &[u8]) -> Result<TimerMsg, String> {
    if line.len() > MAX_LINE {
        return Err(format!(
            "timer request of {} bytes exceeds {MAX_LINE}",
            line.len()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("timer request is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("timer request is not a JSON object")?;
    let int = |k: &str| -> Result<i64, String> {
        obj.get(k)
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(|| format!("timer request: {k:?} missing or not an integer"))
    };
    let pid = i32::try_from(int("pid")?).map_err(|_| "timer request: \"pid\" out of range")?;
    let signal =
        i32::try_from(int("signal")?).map_err(|_| "timer request: \"signal\" out of range")?;
    let scope_id = obj
        .get("scope_id")
        .and_then(serde_json::Value::as_str)
        .ok_or("timer request: \"scope_id\" missing or not a string")?
        .to_string();
    let expiration_time = obj
        .get("expiration_time")
        .and_then(serde_json::Value::as_f64)
        .ok_or("timer request: \"expiration_time\" missing or not a number")?;
    // A signal the kernel would refuse (65, 2^31-1) was once accepted and "sent" (issue 38 item
    // 13): refused at the request, naming it. 0 is an event without a signal.
    let max = libc::SIGRTMAX();
    if expiration_time >= 0.0 && !(0..=max).contains(&signal) {
        return Err(format!(
            "timer request: \"signal\" {signal} is not a signal number (0 to {max})"
        ));
    }
    Ok(if expiration_time < 0.0 {
        TimerMsg::Release { pid, scope_id }
    } else {
        TimerMsg::Acquire {
            pid,
            scope_id,
            expiration_time,
            signal,
        }
    })
}

/// Splits a byte stream into request lines, enforcing [`MAX_LINE`] without buffering more.
#[derive(Debug, Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    /// Inside an over-long line: drop bytes up to the next newline.
    skipping: bool,
}

impl LineSplitter {
    /// Feeds bytes; returns one result per completed (or rejected) line.
    pub fn push(&mut self, mut data: &[u8]) -> Vec<Result<TimerMsg, String>> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let nl = data.iter().position(|&b| b == b'\n');
            let (chunk, rest) = match nl {
                Some(i) => (&data[..i], Some(&data[i + 1..])),
                None => (data, None),
            };
            if !self.skipping {
                self.buf.extend_from_slice(chunk);
                if self.buf.len() > MAX_LINE {
                    out.push(Err(format!(
                        "timer request longer than {MAX_LINE} bytes skipped"
                    )));
                    self.buf.clear();
                    self.skipping = true;
                }
            }
            match rest {
                Some(r) => {
                    if !self.skipping {
                        let line = std::mem::take(&mut self.buf);
                        if !line.iter().all(u8::is_ascii_whitespace) {
                            out.push(parse_line(&line));
                        }
                    }
                    self.skipping = false;
                    data = r;
                }
                None => break,
            }
        }
        out
    }
}

/// One armed timer.
#[derive(Debug, Clone, PartialEq)]
pub struct Timer {
    pub scope_id: String,
    pub expiration_time: f64,
    pub signal: i32,
}

/// What to do about one pid whose timers expired (torch's reaping step).
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    pub pid: i32,
    /// Its expired timers, earliest first.
    pub timers: Vec<Timer>,
    /// The signal of the earliest expired timer with a signal > 0; None: event only.
    pub signal: Option<i32>,
}

/// The timer table, keyed by `(pid, scope_id)`.
#[derive(Debug, Default)]
pub struct TimerTable {
    timers: HashMap<(i32, String), (f64, i32)>,
}

impl TimerTable {
    pub fn apply(&mut self, msg: TimerMsg) {
        match msg {
            TimerMsg::Acquire {
                pid,
                scope_id,
                expiration_time,
                signal,
            } => {
                self.timers
                    .insert((pid, scope_id), (expiration_time, signal));
            }
            TimerMsg::Release { pid, scope_id } => {
                self.timers.remove(&(pid, scope_id));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.timers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// Takes every pid with a timer at or past `now` (epoch seconds) and forgets all of that
    /// pid's expired timers, as torch does after reaping.
    pub fn take_expired(&mut self, now: f64) -> Vec<Expired> {
        let mut by_pid: HashMap<i32, Vec<Timer>> = HashMap::new();
        self.timers.retain(|(pid, scope), &mut (exp, sig)| {
            if exp <= now {
                by_pid.entry(*pid).or_default().push(Timer {
                    scope_id: scope.clone(),
                    expiration_time: exp,
                    signal: sig,
                });
                false
            } else {
                true
            }
        });
        let mut out: Vec<Expired> = by_pid
            .into_iter()
            .map(|(pid, mut timers)| {
                timers.sort_by(|a, b| a.expiration_time.total_cmp(&b.expiration_time));
                let signal = timers.iter().find(|t| t.signal > 0).map(|t| t.signal);
                Expired {
                    pid,
                    timers,
                    signal,
                }
            })
            .collect();
        out.sort_by_key(|e| e.pid);
        out
    }

    /// Drops the timers of pids for which `alive` is false.
    pub fn retain_pids(&mut self, alive: impl Fn(i32) -> bool) {
        self.timers.retain(|(pid, _), _| alive(*pid));
    }

    /// Drops everything (a new attempt).
    pub fn clear(&mut self) {
        self.timers.clear();
    }
}

/// The FIFO: created at construction, removed on drop.
#[derive(Debug)]
pub struct TimerFifo {
    path: PathBuf,
}

impl TimerFifo {
    /// Replaces whatever is at `path` by a FIFO with mode 0600.
    pub fn create(path: &Path) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(io::Error::from)?;
        Ok(TimerFifo {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the reading end (read-write, non-blocking: never EOF, writers never ENXIO) and
    /// spawns the reader task, which sends every request on the returned channel until the
    /// receiver is dropped. Malformed lines are not sent one by one: the channel carries
    /// `Err(line)` only for a warning line to print, at most one per [`WARN_INTERVAL`] (see the
    /// module docs). Must run inside a tokio runtime.
    pub fn serve(&self) -> io::Result<mpsc::UnboundedReceiver<Result<TimerMsg, String>>> {
        let mut rx = tokio::net::unix::pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&self.path)?;
        let (tx, out) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut split = LineSplitter::default();
            let mut warns = MalformedWarnings::new(WARN_INTERVAL);
            let mut buf = vec![0u8; 8192];
            loop {
                let n = tokio::select! {
                    r = rx.read(&mut buf) => match r {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                    _ = tx.closed() => break,
                    // A summary of what was held back comes due.
                    _ = tokio::time::sleep(WARN_INTERVAL), if warns.holding() => 0,
                };
                let now = tokio::time::Instant::now();
                let mut send = Vec::new();
                for m in split.push(&buf[..n]) {
                    match m {
                        Ok(m) => send.push(Ok(m)),
                        Err(why) => send.extend(warns.malformed(now, why).map(Err)),
                    }
                }
                send.extend(warns.due(now).map(Err));
                for m in send {
                    if tx.send(m).is_err() {
                        return;
                    }
                }
            }
            if let Some(line) = warns.flush_all() {
                let _ = tx.send(Err(line));
            }
        });
        Ok(out)
    }
}

/// The warning lines about malformed requests: the first of a quiet period names it, later ones
/// are counted into one summary per interval.
#[derive(Debug)]
pub struct MalformedWarnings(LogLimiter);

impl MalformedWarnings {
    pub fn new(interval: std::time::Duration) -> MalformedWarnings {
        MalformedWarnings(LogLimiter::new(interval, "malformed requests ignored"))
    }

    /// One malformed line (`why`); the warning line to print now, if any.
    pub fn malformed(&mut self, now: tokio::time::Instant, why: String) -> Option<String> {
        let first = !self.holding();
        let line = self.0.event(now, why)?;
        Some(match first {
            true => format!("ignored a malformed request: {line}"),
            false => line,
        })
    }

    /// The summary of held-back lines, once the interval has passed.
    pub fn due(&mut self, now: tokio::time::Instant) -> Option<String> {
        self.0.flush(now)
    }

    /// The summary of held-back lines now (the reader is ending).
    pub fn flush_all(&mut self) -> Option<String> {
        self.0.flush_all()
    }

    /// Whether some lines are held back for a summary.
    pub fn holding(&self) -> bool {
        self.0.holding()
    }
}

impl Drop for TimerFifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a FileTimer scope is rdrun's (heartbeat policy, never a kill when its signal is 0).
pub(crate) fn is_heartbeat_scope(scope: &str) -> bool {
    scope.starts_with("rdrun/")
}

pub(crate) fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};

    /// A line exactly as torch's client writes it (json.dumps key order and spacing).
    const ACQ: &str = r#"{"version": 1, "pid": 17818, "scope_id": "/x/python3.11/contextlib.py#137", "expiration_time": 1795974990.8477502, "signal": 9}"#;

    #[test]
    fn torch_acquire_and_release_lines() {
        assert_eq!(
            parse_line(ACQ.as_bytes()).unwrap(),
            TimerMsg::Acquire {
                pid: 17818,
                scope_id: "/x/python3.11/contextlib.py#137".into(),
                expiration_time: 1795974990.8477502,
                signal: 9
            }
        );
        let rel =
            r#"{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": -1, "signal": 0}"#;
        assert_eq!(
            parse_line(rel.as_bytes()).unwrap(),
            TimerMsg::Release {
                pid: 5,
                scope_id: "s".into()
            }
        );
    }

    #[test]
    fn extra_keys_and_version_are_ignored() {
        let l = r#"{"version": 7, "pid": 1, "scope_id": "rdrun/heartbeat", "expiration_time": 10, "signal": 0, "rank": 3, "step": 12}"#;
        assert!(matches!(
            parse_line(l.as_bytes()).unwrap(),
            TimerMsg::Acquire {
                pid: 1,
                signal: 0,
                ..
            }
        ));
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_problem() {
        for (line, want) in [
            ("not json", "not JSON"),
            ("[1,2]", "not a JSON object"),
            (
                r#"{"scope_id": "s", "expiration_time": 1, "signal": 9}"#,
                "\"pid\"",
            ),
            (
                r#"{"pid": "1", "scope_id": "s", "expiration_time": 1, "signal": 9}"#,
                "\"pid\"",
            ),
            (
                r#"{"pid": 1, "expiration_time": 1, "signal": 9}"#,
                "\"scope_id\"",
            ),
            (
                r#"{"pid": 1, "scope_id": "s", "signal": 9}"#,
                "\"expiration_time\"",
            ),
            (
                r#"{"pid": 1, "scope_id": "s", "expiration_time": 1}"#,
                "\"signal\"",
            ),
            (
                r#"{"pid": 99999999999, "scope_id": "s", "expiration_time": 1, "signal": 9}"#,
                "out of range",
            ),
            (
                r#"{"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 65}"#,
                "65 is not a signal number",
            ),
            (
                r#"{"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 2147483647}"#,
                "is not a signal number",
            ),
            (
                r#"{"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": -3}"#,
                "is not a signal number",
            ),
        ] {
            let e = parse_line(line.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    fn padded(len: usize) -> String {
        let base = r#"{"version": 1, "pid": 1, "scope_id": "", "expiration_time": 5, "signal": 9}"#;
        let pad = "a".repeat(len - base.len());
        base.replace(r#""scope_id": """#, &format!(r#""scope_id": "{pad}""#))
    }

    #[test]
    fn lines_of_4096_bytes_pass_longer_ones_are_skipped() {
        let ok = padded(4096);
        assert_eq!(ok.len(), 4096);
        let long = padded(4097);
        let mut sp = LineSplitter::default();
        // Fed in awkward pieces: the splitter must not care where reads end.
        let stream = format!("{long}\n{ok}\n\n{ACQ}\npartial");
        let mut got = Vec::new();
        for c in stream.as_bytes().chunks(1000) {
            got.extend(sp.push(c));
        }
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].as_ref().unwrap_err().contains("longer than 4096"));
        assert!(
            matches!(&got[1], Ok(TimerMsg::Acquire { scope_id, .. }) if scope_id.len() == 4096 - 75)
        );
        assert!(matches!(&got[2], Ok(TimerMsg::Acquire { pid: 17818, .. })));
        // The unterminated tail completes with the next read.
        let r = sp.push(b" junk\n");
        assert_eq!(r.len(), 1);
        assert!(r[0].is_err());
        assert!(parse_line(long.as_bytes()).is_err());
    }

    #[test]
    fn table_release_expiry_and_signal_choice() {
        let acq = |pid, s: &str, exp, signal| TimerMsg::Acquire {
            pid,
            scope_id: s.into(),
            expiration_time: exp,
            signal,
        };
        let mut t = TimerTable::default();
        t.apply(acq(1, "a", 10.0, 0));
        t.apply(acq(1, "b", 12.0, 15));
        t.apply(acq(1, "c", 11.0, 9));
        t.apply(acq(2, "a", 100.0, 9));
        t.apply(acq(3, "x", 5.0, 9));
        t.apply(TimerMsg::Release {
            pid: 3,
            scope_id: "x".into(),
        });
        t.apply(TimerMsg::Release {
            pid: 3,
            scope_id: "never".into(),
        });
        assert_eq!(t.len(), 4);
        assert!(t.take_expired(9.9).is_empty());
        let e = t.take_expired(12.0);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].pid, 1);
        assert_eq!(
            e[0].timers
                .iter()
                .map(|t| t.scope_id.as_str())
                .collect::<Vec<_>>(),
            ["a", "c", "b"]
        );
        assert_eq!(
            e[0].signal,
            Some(9),
            "earliest expired timer with a signal > 0"
        );
        assert_eq!(t.len(), 1);
        // Re-acquire re-arms (upsert).
        t.apply(acq(2, "a", 200.0, 9));
        assert!(t.take_expired(150.0).is_empty());
        // Signal 0 only: event, no signal.
        t.apply(acq(4, "rdrun/heartbeat", 1.0, 0));
        assert_eq!(t.take_expired(150.0)[0].signal, None);
        t.retain_pids(|p| p != 2);
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn fifo_serves_a_nonblocking_writer_and_is_removed() {
        let tmp = tempfile::Builder::new()
            .prefix("rdrun-ft-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let path = dir.join("timer");
        std::fs::write(&path, "stale").unwrap();
        let fifo = TimerFifo::create(&path).unwrap();
        let md = std::fs::metadata(&path).unwrap();
        assert!(md.file_type().is_fifo());
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        let mut rx = fifo.serve().unwrap();
        // Two clients, torch style: open O_WRONLY|O_NONBLOCK (no ENXIO), write one line, close.
        for line in [format!("{ACQ}\n"), "garbage\n".to_string()] {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .unwrap();
            f.write_all(line.as_bytes()).unwrap();
        }
        let bound = std::time::Duration::from_secs(30);
        let a = tokio::time::timeout(bound, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(a, Ok(TimerMsg::Acquire { pid: 17818, .. })));
        let b = tokio::time::timeout(bound, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(b.is_err());
        drop(rx);
        drop(fifo);
        assert!(!path.exists(), "FIFO left behind");
    }

    /// Issue 25: 200,000 malformed lines gave 200,252 warning lines. Now the first is named,
    /// the rest of the flood is one summary line with the count, and good requests still pass.
    #[tokio::test]
    async fn a_flood_of_malformed_lines_is_one_warning_and_one_summary() {
        let tmp = tempfile::Builder::new()
            .prefix("rdrun-ft-")
            .tempdir()
            .unwrap();
        let path = tmp.path().join("timer");
        let fifo = TimerFifo::create(&path).unwrap();
        let mut rx = fifo.serve().unwrap();
        let n = 20_000;
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                let junk = "not json\n".repeat(1000);
                for _ in 0..n / 1000 {
                    f.write_all(junk.as_bytes()).unwrap();
                }
                f.write_all(format!("{ACQ}\n").as_bytes()).unwrap();
            })
        };
        let bound = std::time::Duration::from_secs(60);
        let mut warnings = Vec::new();
        // Every line is read once the acquire arrives; then the reader ends (dropped FIFO
        // reader: the receiver closes) and flushes its summary.
        loop {
            match tokio::time::timeout(bound, rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Ok(TimerMsg::Acquire { pid: 17818, .. }) => break,
                Ok(m) => panic!("unexpected {m:?}"),
                Err(line) => warnings.push(line),
            }
        }
        writer.join().unwrap();
        assert!(warnings.len() <= 2, "{warnings:#?}");
        assert!(
            warnings[0].starts_with("ignored a malformed request: timer request is not JSON"),
            "{warnings:#?}"
        );
        // The held-back rest comes as one summary (here: when the interval passes).
        let summary = match warnings.get(1) {
            Some(s) => s.clone(),
            None => tokio::time::timeout(WARN_INTERVAL * 3, rx.recv())
                .await
                .unwrap()
                .unwrap()
                .unwrap_err(),
        };
        assert!(
            summary.starts_with(&format!("{} more malformed requests ignored", n - 1)),
            "{summary}"
        );
    }

    #[test]
    fn scope_lists_are_capped() {
        let t = |s: &str| Timer {
            scope_id: s.to_string(),
            expiration_time: 1.0,
            signal: 9,
        };
        let few: Vec<Timer> = ["a", "b"].iter().map(|s| t(s)).collect();
        assert_eq!(scope_list(&few), ["a", "b"]);
        let long = "x".repeat(1024);
        let many: Vec<Timer> = (0..20_000).map(|_| t(&long)).collect();
        let l = scope_list(&many);
        assert_eq!(l.len(), MAX_LISTED + 1);
        assert_eq!(l[0], format!("{}...", "x".repeat(MAX_SCOPE_CHARS)));
        assert_eq!(l[MAX_LISTED], format!("({} more)", 20_000 - MAX_LISTED));
        assert!(format!("{l:?}").len() < 4096);
    }
}
