//! What each restart cost (issue 37 item 4): the marks the agent takes between a failed attempt
//! and the next one's workers, and the one line, event fields and JSON they give.
//!
//! The phases, each from the previous mark (wall clock, so that they add up to the total):
//! - `noticed`: the first failure rdrun observed (the worker's reaping) → the stop of the others
//!   began. rdrun learns of a worker's exit from SIGCHLD at once; what this shows is what came
//!   between (a hang capture, a kill verdict's wait). A regroup without a local failure starts
//!   at the stop.
//! - `stopped`: the stop began → every worker of the attempt is gone.
//! - `round`: the group is gone → the next attempt's assignment (the report, the stop verdict's
//!   exchange between nodes, the decision, the rendezvous round).
//! - `started`: the assignment → every worker of the next attempt spawned, forked warm from the
//!   template or started cold (how many of each).
//!
//!
//! Then, apart (the agent does not wait for it): **back in user code**, the failure → the
//! first output of the new attempt's last rank to print (`BackWatch`, read from the output
//! pumps' counters while the attempt runs): one more line, event and JSON field. A rank that
//! prints nothing leaves it unmeasured.

use std::time::{Duration, SystemTime};

use serde_json::json;

/// The marks of one restart, taken as the agent goes.
#[derive(Debug, Default, Clone)]
pub(in crate::supervisor) struct RestartClock {
    failed: Option<SystemTime>,
    stop_began: Option<SystemTime>,
    over: Option<SystemTime>,
    assigned: Option<SystemTime>,
}

impl RestartClock {
    /// The attempt is over: when its first failure was observed (if any), when the stop began
    /// (if one did), and now.
    pub(in crate::supervisor) fn attempt_over(
        &mut self,
        failed: Option<SystemTime>,
        stop: Option<SystemTime>,
    ) {
        *self = RestartClock {
            failed,
            stop_began: stop,
            over: Some(SystemTime::now()),
            assigned: None,
        };
    }

    /// The next attempt's assignment is known (its workers are about to be spawned).
    pub(in crate::supervisor) fn assigned(&mut self) {
        self.assigned = Some(SystemTime::now());
    }

    /// Every worker of the next attempt was spawned: the cost of restart `restart` (the new
    /// attempt's number), when an attempt was over before it; the clock is cleared.
    pub(in crate::supervisor) fn spawned(
        &mut self,
        restart: u32,
        warm: usize,
        cold: usize,
    ) -> Option<RestartCost> {
        let clock = std::mem::take(self);
        let over = clock.over?;
        let now = SystemTime::now();
        let assigned = clock.assigned.unwrap_or(now);
        let stop = clock.stop_began.unwrap_or(over).min(over);
        let failed = clock.failed.unwrap_or(stop).min(stop);
        let since = |later: SystemTime, earlier: SystemTime| {
            later.duration_since(earlier).unwrap_or(Duration::ZERO)
        };
        Some(RestartCost {
            restart,
            failed_at: failed,
            noticed: since(stop, failed),
            stopped: since(over, stop),
            round: since(assigned, over),
            started: since(now, assigned),
            warm,
            cold,
        })
    }
}

/// What one restart cost, phase by phase (module doc).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::supervisor) struct RestartCost {
    pub restart: u32,
    /// The failure the phases count from (the first one observed, else the stop's start).
    pub failed_at: SystemTime,
    pub noticed: Duration,
    pub stopped: Duration,
    pub round: Duration,
    pub started: Duration,
    /// Workers of the new attempt forked warm from the template, and started cold.
    pub warm: usize,
    pub cold: usize,
}

impl RestartCost {
    pub(in crate::supervisor) fn total(&self) -> Duration {
        self.noticed + self.stopped + self.round + self.started
    }

    /// `forked warm`, `started cold`, or `forked warm 3, cold 1`.
    fn how(&self) -> String {
        match (self.warm, self.cold) {
            (_, 0) => "forked warm".to_string(),
            (0, _) => "started cold".to_string(),
            (w, c) => format!("forked warm {w}, cold {c}"),
        }
    }

    /// `restart 1: 0.09 s (noticed 0.01, stopped 0.06, round 0.01, forked warm 0.01)`.
    pub(in crate::supervisor) fn line(&self) -> String {
        let s = |d: Duration| format!("{:.2}", d.as_secs_f64());
        format!(
            "restart {}: {} s (noticed {}, stopped {}, round {}, {} {})",
            self.restart,
            s(self.total()),
            s(self.noticed),
            s(self.stopped),
            s(self.round),
            self.how(),
            s(self.started)
        )
    }

    /// The fields of the `restart_cost` event and of `--report-json`'s restart entry.
    pub(in crate::supervisor) fn to_json(&self) -> serde_json::Value {
        json!({
            "total_s": self.total().as_secs_f64(),
            "noticed_s": self.noticed.as_secs_f64(),
            "stopped_s": self.stopped.as_secs_f64(),
            "round_s": self.round.as_secs_f64(),
            "started_s": self.started.as_secs_f64(),
            "forked_warm": self.warm,
            "started_cold": self.cold,
        })
    }
}

/// Waits for every rank of a restarted attempt to print (module doc).
#[derive(Debug)]
pub(in crate::supervisor) struct BackWatch {
    pub restart: u32,
    failed_at: SystemTime,
    ranks: Vec<crate::supervisor::watch::hang::sample::OutputCounter>,
}

impl BackWatch {
    pub(in crate::supervisor) fn new(
        cost: &RestartCost,
        ranks: Vec<crate::supervisor::watch::hang::sample::OutputCounter>,
    ) -> Option<BackWatch> {
        (!ranks.is_empty()).then(|| BackWatch {
            restart: cost.restart,
            failed_at: cost.failed_at,
            ranks,
        })
    }

    /// Failure → the last rank's first output, once every rank printed.
    pub(in crate::supervisor) fn back(&self) -> Option<Duration> {
        let mut last = self.failed_at;
        for r in &self.ranks {
            last = last.max(r.first()?);
        }
        Some(
            last.duration_since(self.failed_at)
                .unwrap_or(Duration::ZERO),
        )
    }

    /// `restart 1: back in user code 0.15 s after the failure (every rank's first output)`.
    pub(in crate::supervisor) fn line(&self, back: Duration) -> String {
        format!(
            "restart {}: back in user code {:.2} s after the failure (every rank's first output)",
            self.restart,
            back.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_the_line_names_them() {
        let c = RestartCost {
            restart: 1,
            failed_at: SystemTime::UNIX_EPOCH,
            noticed: Duration::from_millis(10),
            stopped: Duration::from_millis(60),
            round: Duration::from_millis(10),
            started: Duration::from_millis(12),
            warm: 4,
            cold: 0,
        };
        assert_eq!(c.total(), Duration::from_millis(92));
        assert_eq!(
            c.line(),
            "restart 1: 0.09 s (noticed 0.01, stopped 0.06, round 0.01, forked warm 0.01)"
        );
        let cold = RestartCost {
            warm: 0,
            cold: 2,
            ..c.clone()
        };
        assert!(
            cold.line().ends_with("started cold 0.01)"),
            "{}",
            cold.line()
        );
        let mixed = RestartCost {
            warm: 3,
            cold: 1,
            ..c.clone()
        };
        assert!(
            mixed.line().contains("forked warm 3, cold 1 0.01"),
            "{}",
            mixed.line()
        );
        assert_eq!(c.to_json()["forked_warm"], 4);
    }

    #[test]
    fn back_in_user_code_once_every_rank_printed() {
        use crate::supervisor::watch::hang::sample::OutputCounter;
        let mut clock = RestartClock::default();
        let t = SystemTime::now() - Duration::from_secs(1);
        clock.attempt_over(Some(t), Some(t));
        let cost = clock.spawned(1, 2, 0).expect("a cost");
        assert_eq!(BackWatch::new(&cost, Vec::new()).map(|b| b.restart), None);
        let ranks = vec![OutputCounter::new(), OutputCounter::new()];
        let watch = BackWatch::new(&cost, ranks.clone()).expect("ranks");
        assert_eq!(watch.back(), None);
        ranks[0].add(5);
        assert_eq!(watch.back(), None, "one rank printed, the other not yet");
        // Nothing printed is no output.
        ranks[1].add(0);
        assert_eq!(watch.back(), None);
        ranks[1].add(1);
        let back = watch.back().expect("both printed");
        assert!(back >= Duration::from_secs(1), "{back:?}");
        assert!(watch
            .line(back)
            .starts_with("restart 1: back in user code 1."));
    }

    #[test]
    fn a_clock_without_an_attempt_over_gives_nothing_and_marks_stay_ordered() {
        let mut clock = RestartClock::default();
        assert_eq!(clock.spawned(0, 2, 0), None);
        // A regroup with no local failure and no stop: every phase is from the end.
        clock.attempt_over(None, None);
        clock.assigned();
        let c = clock.spawned(1, 0, 2).expect("a cost");
        assert_eq!((c.noticed, c.stopped), (Duration::ZERO, Duration::ZERO));
        assert_eq!(clock.spawned(2, 0, 2), None, "the clock is cleared");
        // A failure observed before the stop began: noticed covers the gap.
        let t = SystemTime::now() - Duration::from_secs(1);
        clock.attempt_over(Some(t), Some(t + Duration::from_millis(200)));
        let c = clock.spawned(1, 2, 0).expect("a cost");
        assert_eq!(c.noticed, Duration::from_millis(200));
        assert!(c.stopped >= Duration::from_millis(700), "{c:?}");
    }
}
