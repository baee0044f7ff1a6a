//! `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT` (torch's `LocalElasticAgent`): a worker process
//! continuously in uninterruptible sleep (state `D` in `/proc/<pid>/stat`) for the timeout
//! fails the group and disables further restarts (a wedged worker holds a kernel resource — a
//! GPU, a NIC — that a fresh worker on the same host would conflict with). As torch, only each
//! worker's own process is looked at, not its threads or children; the dwell restarts whenever
//! the process is seen in another state. torch checks every `--monitor-interval`; rdrun, which
//! does not poll otherwise, samples every quarter of the timeout (between 50 ms and 1 s).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::time::{Interval, MissedTickBehavior};

/// The D-state watch of one attempt.
pub(crate) struct DStateWatch {
    timeout: Duration,
    first_seen: HashMap<i32, Instant>,
    interval: Interval,
}

impl DStateWatch {
    pub fn new(timeout: Duration) -> DStateWatch {
        let period = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        DStateWatch {
            timeout,
            first_seen: HashMap::new(),
            interval,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub async fn tick(&mut self) {
        self.interval.tick().await;
    }

    /// Samples the live workers `(pid, rank)`; the first one in D state for at least the
    /// timeout, with how long, if any.
    pub fn check(&mut self, live: &[(i32, usize)]) -> Option<(i32, usize, Duration)> {
        self.first_seen
            .retain(|pid, _| live.iter().any(|(p, _)| p == pid));
        let now = Instant::now();
        let mut found = None;
        for &(pid, rank) in live {
            if process_state(pid) != Some('D') {
                self.first_seen.remove(&pid);
                continue;
            }
            let first = *self.first_seen.entry(pid).or_insert_with(|| {
                tracing::warn!(
                    "worker pid={pid} (rank {rank}) entered uninterruptible sleep (D state); the group fails if it stays there for {:?} (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)",
                    self.timeout
                );
                now
            });
            let dwell = now.duration_since(first);
            if dwell >= self.timeout && found.is_none() {
                found = Some((pid, rank, dwell));
            }
        }
        found
    }
}

/// The state letter of `/proc/<pid>/stat` (after the last `)`: the command may hold spaces).
pub(crate) fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_state_is_running() {
        let me = std::process::id() as i32;
        // The test harness's main thread waits (S) or runs (R); never D.
        assert!(
            matches!(process_state(me), Some('R' | 'S')),
            "{:?}",
            process_state(me)
        );
        assert_eq!(process_state(i32::MAX), None);
    }

    #[tokio::test]
    async fn a_process_not_in_d_state_never_times_out() {
        let mut w = DStateWatch::new(Duration::from_millis(1));
        let me = std::process::id() as i32;
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(w.check(&[(me, 0)]), None);
        assert!(w.first_seen.is_empty());
    }
}
