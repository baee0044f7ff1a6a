//! Waiting is never silent: while rdrun waits (for the nodes of a rendezvous round, in the exit
//! barrier, for workers to exit within the grace period) it says on stderr what it waits for
//! and how long is left. On a terminal that is one status line updated in place (a spinner and
//! the text, drawn by the terminal's console thread, the terminal's one writer, and erased when
//! the wait ends: `output/console_own.rs`); otherwise a plain line every interval (5 s;
//! `RDRUN_STATUS_INTERVAL` seconds) of rdrun's own text, so logs get it too.
//!
//! A short wait says nothing: the first line comes one interval (a terminal: one second) after
//! the wait began.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::rendezvous::progress::{Board, JoinProgress};
use crate::supervisor::output::{own, Console, Stream};

/// What rdrun waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitKind {
    /// Reaching the rendezvous store at this endpoint (before the first round).
    Connect(String),
    /// A rendezvous round: the nodes (details from the run's [`Board`]).
    Rendezvous,
    /// The exit barrier, until `deadline`.
    Barrier { deadline: Instant },
    /// `live` workers to exit before SIGKILL at `deadline`.
    Grace { deadline: Instant, live: usize },
}

/// A wait and when it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub kind: WaitKind,
    pub since: Instant,
}

impl Waiting {
    pub fn rendezvous() -> Waiting {
        Waiting {
            kind: WaitKind::Rendezvous,
            since: Instant::now(),
        }
    }

    pub fn connect(endpoint: String) -> Waiting {
        Waiting {
            kind: WaitKind::Connect(endpoint),
            since: Instant::now(),
        }
    }

    pub fn barrier(deadline: Instant) -> Waiting {
        Waiting {
            kind: WaitKind::Barrier { deadline },
            since: Instant::now(),
        }
    }

    pub fn grace(deadline: tokio::time::Instant, live: usize) -> Waiting {
        Waiting {
            kind: WaitKind::Grace {
                deadline: deadline.into_std(),
                live,
            },
            since: Instant::now(),
        }
    }
}

struct Inner {
    waiting: Option<Waiting>,
    /// The terminal's console when rdrun's stderr is a terminal: it draws the status line
    /// (erased at once when the wait ends, so that what follows is not drawn over it).
    tty: Option<Console>,
    /// The console was given a text since the wait began.
    drawn: bool,
    /// What a waiting rendezvous round has seen (its backends publish there).
    board: Board,
}

/// The status line's state and its printer task.
pub struct Status {
    inner: Arc<Mutex<Inner>>,
    task: Option<JoinHandle<()>>,
}

impl Status {
    /// Starts the printer (on the current tokio runtime); `interval` is the plain interval
    /// between two lines (`RDRUN_STATUS_INTERVAL`, resolved in the config); `console`: the
    /// terminal's, which draws the line when stderr is a terminal (`None`: plain lines only).
    pub fn new(interval: Duration, console: Option<Console>) -> Status {
        let tty = console.filter(|_| own::is_terminal(Stream::Stderr));
        let is_tty = tty.is_some();
        let inner = Arc::new(Mutex::new(Inner {
            waiting: None,
            tty,
            drawn: false,
            board: Board::default(),
        }));
        let task = tokio::spawn(printer(inner.clone(), is_tty, interval));
        Status {
            inner,
            task: Some(task),
        }
    }

    /// The board a rendezvous round publishes its looks to (run it in [`Board::scope`]).
    pub fn board(&self) -> Board {
        lock(&self.inner).board.clone()
    }

    /// What rdrun waits for now (`None`: nothing). The same kind of wait keeps its start.
    pub fn set(&self, w: Option<Waiting>) {
        let mut g = lock(&self.inner);
        match (&mut g.waiting, w) {
            (Some(old), Some(new))
                if std::mem::discriminant(&old.kind) == std::mem::discriminant(&new.kind) =>
            {
                old.kind = new.kind;
            }
            (slot, new) => *slot = new,
        }
        if g.waiting.is_none() {
            g.board.clear();
            if std::mem::take(&mut g.drawn) {
                if let Some(c) = &g.tty {
                    c.status(None);
                }
            }
        }
    }

    /// Ends the printer (a status line on a terminal is cleared).
    pub fn stop(&mut self) {
        self.set(None);
        if let Some(t) = self.task.take() {
            // The printer clears its line within one tick; the run's end message comes after.
            t.abort();
        }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn printer(inner: Arc<Mutex<Inner>>, tty: bool, every: Duration) {
    let tick = if tty {
        Duration::from_millis(250)
    } else {
        every.min(Duration::from_millis(250))
    };
    let mut last_line: Option<Instant> = None;
    let mut current: Option<Instant> = None;
    loop {
        tokio::time::sleep(tick).await;
        let mut g = lock(&inner);
        let now = Instant::now();
        let Some(w) = g.waiting.clone() else {
            current = None;
            continue;
        };
        if current != Some(w.since) {
            current = Some(w.since);
            last_line = None;
        }
        let text = describe(&w, g.board.current().as_ref(), now);
        if tty {
            if now.duration_since(w.since) < Duration::from_secs(1) {
                continue;
            }
            if let Some(c) = &g.tty {
                c.status(Some(text));
            }
            g.drawn = true;
        } else {
            let due = match last_line {
                None => now.duration_since(w.since) >= every,
                Some(t) => now.duration_since(t) >= every,
            };
            if due {
                last_line = Some(now);
                own::stderr_line(&format!("rdrun: {text}"));
            }
        }
    }
}

/// The status text of a wait, e.g. `waiting for nodes (round 0): 1 of 2 joined, missing: node
/// rank 1; 57s left`.
pub fn describe(w: &Waiting, p: Option<&JoinProgress>, now: Instant) -> String {
    let waited = secs(now.duration_since(w.since));
    match &w.kind {
        WaitKind::Rendezvous => match p {
            Some(p) => {
                let mut s = format!(
                    "waiting for nodes (round {}): {} of {} joined",
                    p.round, p.joined, p.needed
                );
                if p.max > p.needed {
                    s.push_str(&format!(" (up to {})", p.max));
                }
                if !p.missing.is_empty() {
                    s.push_str(&format!(", missing: {}", p.missing.join(", ")));
                }
                s.push_str(&format!(
                    "; {} left, waited {waited}",
                    secs(p.deadline.saturating_duration_since(now))
                ));
                s
            }
            None => format!("waiting for the rendezvous; waited {waited}"),
        },
        WaitKind::Connect(endpoint) => {
            format!("waiting for the rendezvous store at {endpoint}; waited {waited}")
        }
        WaitKind::Barrier { deadline } => format!(
            "exit barrier: this node's workers succeeded, waiting for the other nodes to finish; {} left, waited {waited}",
            secs(deadline.saturating_duration_since(now))
        ),
        WaitKind::Grace { deadline, live } => format!(
            "stopping: waiting for {live} worker(s) to exit; SIGKILL in {}",
            secs(deadline.saturating_duration_since(now))
        ),
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(12);
        let w = Waiting {
            kind: WaitKind::Rendezvous,
            since: t0,
        };
        let p = JoinProgress {
            round: 0,
            joined: 1,
            needed: 3,
            max: 3,
            missing: vec!["node rank 1".into(), "node rank 2".into()],
            deadline: t0 + Duration::from_secs(600),
        };
        assert_eq!(
            describe(&w, Some(&p), now),
            "waiting for nodes (round 0): 1 of 3 joined, missing: node rank 1, node rank 2; 588s left, waited 12s"
        );
        assert_eq!(
            describe(&w, None, now),
            "waiting for the rendezvous; waited 12s"
        );
        let p = JoinProgress {
            max: 4,
            missing: vec![],
            ..p
        };
        assert!(describe(&w, Some(&p), now).contains("1 of 3 joined (up to 4); 588s left"));
        let w = Waiting {
            kind: WaitKind::Grace {
                deadline: now + Duration::from_secs(20),
                live: 2,
            },
            since: t0,
        };
        assert_eq!(
            describe(&w, None, now),
            "stopping: waiting for 2 worker(s) to exit; SIGKILL in 20s"
        );
    }
}
