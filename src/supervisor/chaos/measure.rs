//! What each injected fault cost (issue 41 item 2): its record — when it was injected, how
//! long rdrun took to decide (detect), how long until every rank was back in user code
//! (recover), until the first progress line, and the work lost — and the `--chaos-progress`
//! reader that finds progress values in the workers' last output lines. Pure: the times come
//! in as arguments.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::config::chaos::Kind;

/// Where a fault stands.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Injected; its recovery is not measured yet.
    Pending,
    /// Every rank came back to user code (or, `slow`, the throttle ended with the job alive).
    Recovered,
    /// The job ended without coming back (why).
    NotSurvived(String),
    /// Could not be injected here (why): no fault happened.
    Skipped(String),
}

/// One injected fault and what was measured of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// 1-based, in the order of injection.
    pub id: usize,
    /// The `--chaos` spec (0-based) it comes from.
    pub spec: usize,
    /// Which of that spec's faults (0-based, in the schedule every node draws alike).
    pub number: u32,
    pub kind: Kind,
    /// The global rank hit (`None`: a whole node).
    pub rank: Option<usize>,
    /// The node (group rank) it happened on.
    pub node: usize,
    /// The attempt (TORCHELASTIC_RESTART_COUNT) it hit.
    pub attempt: u32,
    pub pid: Option<i32>,
    pub at: SystemTime,
    pub detected: Option<Duration>,
    pub recovered: Option<Duration>,
    pub progress: Option<Duration>,
    /// The progress value last seen before the fault, and the first one after it.
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub state: State,
}

impl Record {
    /// Work lost: the progress value before the fault minus the first one after it, when both
    /// were read (never negative).
    pub fn work_lost(&self) -> Option<f64> {
        Some((self.before? - self.after?).max(0.0))
    }

    /// `kill rank 1` / `node-loss node 2`.
    pub fn what(&self) -> String {
        match self.rank {
            Some(r) => format!("{} rank {r}", self.kind),
            None => format!("{} node {}", self.kind, self.node),
        }
    }

    /// The fault as the `chaos_inject` event and `--report-json`'s `chaos.faults` show it.
    pub fn to_json(&self) -> Value {
        let s = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        let at = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let (state, why) = match &self.state {
            State::Pending => ("pending", None),
            State::Recovered => ("recovered", None),
            State::NotSurvived(w) => ("not_survived", Some(w.clone())),
            State::Skipped(w) => ("skipped", Some(w.clone())),
        };
        json!({
            "fault": self.id,
            "spec": self.spec + 1,
            "kind": self.kind.as_str(),
            "rank": self.rank,
            "node": self.node,
            "attempt": self.attempt,
            "pid": self.pid,
            "injected_at": at,
            "detect_s": s(self.detected),
            "recover_s": s(self.recovered),
            "progress_s": s(self.progress),
            "progress_before": self.before,
            "progress_after": self.after,
            "work_lost": self.work_lost(),
            "state": state,
            "why": why,
        })
    }
}

/// `--chaos-progress REGEX`: a line matching it is a progress line; its first capture group,
/// when it reads as a number, is the progress value (a step, an epoch, samples seen).
#[derive(Debug, Clone)]
pub struct ProgressRegex(regex::Regex);

impl ProgressRegex {
    pub fn new(text: &str) -> Result<ProgressRegex, String> {
        regex::Regex::new(text).map(ProgressRegex).map_err(|e| {
            let first = e.to_string();
            let last = first.lines().last().unwrap_or("").trim().to_string();
            format!("--chaos-progress {text:?}: not a regular expression ({last})")
        })
    }

    /// Each progress line among `lines` (oldest first): its value, if it has one.
    pub fn scan<'a>(&'a self, lines: &'a [String]) -> impl Iterator<Item = Option<f64>> + 'a {
        lines.iter().filter_map(|line| {
            let caps = self.0.captures(line)?;
            Some(
                caps.get(1)
                    .and_then(|m| m.as_str().trim().parse::<f64>().ok()),
            )
        })
    }
}

/// What the progress reader has seen of the running attempt: the latest value (read before a
/// fault as "before"), and, once a fault waits for it, the first progress after the fault.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Seen {
    /// The newest value seen in this attempt's output (any rank: the largest of the last
    /// lines read).
    pub latest: Option<f64>,
    /// Whether some progress line (with or without a value) was seen in this attempt.
    pub any: bool,
    /// The smallest first value of any rank in this attempt (where a resumed job restarted).
    pub first: Option<f64>,
}

impl Seen {
    /// Folds one look at every rank's last lines (`ranks`: each rank's lines, oldest first).
    pub fn look(&mut self, re: &ProgressRegex, ranks: &[Vec<String>]) {
        let first_look = !self.any;
        for lines in ranks {
            let values: Vec<Option<f64>> = re.scan(lines).collect();
            if values.is_empty() {
                continue;
            }
            self.any = true;
            let numbers = values.iter().flatten().copied();
            if let Some(max) = numbers.clone().reduce(f64::max) {
                self.latest = Some(self.latest.map_or(max, |l| l.max(max)));
            }
            // The oldest value of the first look that saw any: where the attempt began.
            if first_look {
                if let Some(v) = numbers.clone().next() {
                    self.first = Some(self.first.map_or(v, |f| f.min(v)));
                }
            }
        }
    }
}

/// Median, p95 and max of `values` (nearest rank), or `None` when empty.
pub fn stats(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[idx]
    };
    Some((at(0.5), at(0.95), v[v.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn progress_values_come_from_the_first_group() {
        let re = ProgressRegex::new(r"step (\d+)").unwrap();
        let got: Vec<_> = re
            .scan(&lines(&["loading", "step 3 loss 1.0", "step 4", "done"]))
            .collect();
        assert_eq!(got, vec![Some(3.0), Some(4.0)]);
        let re = ProgressRegex::new("tick").unwrap();
        assert_eq!(re.scan(&lines(&["tick"])).collect::<Vec<_>>(), vec![None]);
        let e = ProgressRegex::new("step (").unwrap_err();
        assert!(
            e.starts_with("--chaos-progress \"step (\": not a regular expression"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn seen_keeps_the_latest_and_the_first_of_the_attempt() {
        let re = ProgressRegex::new(r"step (\d+)").unwrap();
        let mut s = Seen::default();
        s.look(&re, &[lines(&["hello"])]);
        assert_eq!(s, Seen::default());
        s.look(&re, &[lines(&["step 30", "step 31"]), lines(&["step 30"])]);
        assert_eq!((s.latest, s.first, s.any), (Some(31.0), Some(30.0), true));
        s.look(&re, &[lines(&["step 40"]), lines(&["step 41"])]);
        assert_eq!((s.latest, s.first), (Some(41.0), Some(30.0)));
    }

    #[test]
    fn work_lost_is_before_minus_after_never_negative() {
        let mut r = Record {
            id: 1,
            spec: 0,
            number: 0,
            kind: Kind::Kill,
            rank: Some(1),
            node: 0,
            attempt: 0,
            pid: Some(5),
            at: SystemTime::UNIX_EPOCH,
            detected: Some(Duration::from_millis(10)),
            recovered: None,
            progress: None,
            before: Some(37.0),
            after: Some(31.0),
            state: State::Pending,
        };
        assert_eq!(r.work_lost(), Some(6.0));
        r.after = Some(40.0);
        assert_eq!(r.work_lost(), Some(0.0));
        r.after = None;
        assert_eq!(r.work_lost(), None);
        assert_eq!(r.what(), "kill rank 1");
        let j = r.to_json();
        assert_eq!(j["kind"], "kill");
        assert_eq!(j["state"], "pending");
        assert_eq!(j["detect_s"], 0.01);
        assert!(j["recover_s"].is_null());
    }

    #[test]
    fn stats_are_nearest_rank() {
        assert_eq!(stats(&[]), None);
        assert_eq!(stats(&[2.0]), Some((2.0, 2.0, 2.0)));
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(stats(&v), Some((10.0, 19.0, 20.0)));
        assert_eq!(stats(&[3.0, 1.0, 2.0]), Some((2.0, 3.0, 3.0)));
    }

    proptest::proptest! {
        #[test]
        fn stats_are_ordered(v in proptest::collection::vec(0.0f64..1e6, 1..100)) {
            let (m, p, x) = stats(&v).unwrap();
            proptest::prop_assert!(m <= p && p <= x);
            proptest::prop_assert!(v.contains(&m) && v.contains(&x));
        }
    }
}
