//! `slow` (issue 41): one rank throttled to a share of the CPU for a while, as a straggler
//! looks. The run's cgroup holds every worker itself, and cgroup v2's `cpu.max` applies to a
//! whole cgroup (no process may sit beside a child cgroup that has the cpu controller), so one
//! rank cannot be given a quota of its own without moving it out of the run's containment.
//! The throttle is therefore a duty cycle the agent drives: the rank runs `cpu` % of every
//! [`PERIOD`] and is stopped (SIGSTOP) the rest, until `for=` is over; it is always continued
//! at the end, and when the attempt's stop begins. Pure: the agent sends the signals.

use std::time::{Duration, Instant};

/// One on/off cycle.
pub const PERIOD: Duration = Duration::from_millis(100);

/// A rank being throttled.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    /// The fault's record.
    pub idx: usize,
    pub pid: i32,
    on: Duration,
    off: Duration,
    until: Instant,
    stopped: bool,
    next: Instant,
}

impl Throttle {
    /// Throttles `pid` to `pct` % of one core for `secs` from `now` (it runs first).
    pub fn new(idx: usize, pid: i32, pct: f64, secs: f64, now: Instant) -> Throttle {
        let on = PERIOD.mul_f64((pct / 100.0).clamp(0.0, 1.0));
        Throttle {
            idx,
            pid,
            on,
            off: PERIOD - on,
            until: now + Duration::from_secs_f64(secs.max(0.0)),
            stopped: false,
            next: now + on,
        }
    }

    /// When [`Throttle::step`] must be called next.
    pub fn next(&self) -> Instant {
        self.next.min(self.until)
    }

    /// Whether the rank is stopped now (it must be continued if the throttle is dropped).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The signal to send now, if any, and whether the throttle is over.
    pub fn step(&mut self, now: Instant) -> (Option<i32>, bool) {
        if now >= self.until {
            let cont = std::mem::take(&mut self.stopped).then_some(libc::SIGCONT);
            return (cont, true);
        }
        if now < self.next || self.off.is_zero() {
            return (None, false);
        }
        if self.stopped {
            self.stopped = false;
            self.next = now + self.on;
            (Some(libc::SIGCONT), false)
        } else {
            self.stopped = true;
            self.next = now + self.off;
            (Some(libc::SIGSTOP), false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duty_cycle_alternates_and_always_ends_running() {
        let t0 = Instant::now();
        let mut t = Throttle::new(0, 7, 20.0, 1.0, t0);
        assert_eq!(t.next(), t0 + Duration::from_millis(20));
        assert_eq!(t.step(t0), (None, false), "it runs first");
        let at = t.next();
        assert_eq!(t.step(at), (Some(libc::SIGSTOP), false));
        assert!(t.stopped());
        assert_eq!(t.next(), at + Duration::from_millis(80));
        let at = t.next();
        assert_eq!(t.step(at), (Some(libc::SIGCONT), false));
        let at = t.next();
        assert_eq!(t.step(at), (Some(libc::SIGSTOP), false));
        // The end comes while stopped: continued.
        assert_eq!(
            t.step(t0 + Duration::from_secs(1)),
            (Some(libc::SIGCONT), true)
        );
        assert!(!t.stopped());
        let mut full = Throttle::new(0, 7, 100.0, 1.0, t0);
        assert_eq!(
            full.step(t0 + Duration::from_millis(500)),
            (None, false),
            "100 %: never stopped"
        );
    }
}
