//! Chaos mode (issue 41): rdrun injects the failures a cluster brings — a crash (`kill`), a
//! hang (`hang`), a slow rank (`slow`), a lost node (`node-loss`) — into a real job on a
//! seeded schedule, and measures how long detection and recovery took (`docs/chaos.md`).
//!
//! This module decides; the agent acts. [`Chaos`] is the run's chaos state, held by the agent:
//! it is told when an attempt starts and ends, when the restart's ranks are back in user code
//! (the `restart_back` mark of `report/restart_cost.rs`), and when it asked to wake; it answers
//! with [`Act`]s (a signal to one worker the agent spawned, the end of the node), the label of
//! an injected failure (which the agent keeps out of the stop verdict and the failure counts),
//! the events to report, and at the end the table, the `--report-json` section and the faults
//! not survived. Split by job: `spec` the `--chaos` text, `schedule` the seeded gaps and draws,
//! `inject` where a fault lands, `measure` each fault's record and the progress reader,
//! `table` the end.
//!
//! The clock: a spec's first fault counts from the run's first spawn (`at-attempt=N`: from
//! that attempt's spawn), each later one from its previous fault's recovery; no fault is
//! injected while another one's recovery is awaited, nor while the group is not running
//! untouched (a stop under way, a verdict), and one that falls due meanwhile comes once that
//! is over. Only this node's faults are measured here; on a multi-node job every node draws
//! the same schedule (the seed defaults to one derived from the run id), and the node that
//! holds the chosen rank or is the chosen node injects it. The others learn of it from that
//! node's root-cause entry ([`Injected`], `nodes/root_cause.rs`), not from their own clocks,
//! which start at their own spawn and fire late on a busy node: [`Chaos::agreed`] moves their
//! clock past the fault. Their own draw of a fault landing elsewhere is the fallback when the
//! exchange does not answer.

pub mod inject;
pub mod measure;
pub mod schedule;
pub mod slow;
pub mod table;

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::config::chaos::{self as spec, ChaosSpec, Kind};
pub use inject::{Act, Layout, Target};
use measure::{ProgressRegex, Record, Seen, State};
use schedule::Schedule;

/// How often the workers' last lines are read for `--chaos-progress` (the resolution of the
/// "first progress" time).
const PROGRESS_POLL: Duration = Duration::from_millis(100);

/// What the agent reports for chaos: one event each.
#[derive(Debug, Clone, PartialEq)]
pub enum ChaosEvent {
    /// A fault was injected (`chaos_inject`: the record's JSON).
    Inject(Value),
    /// A fault's recovery was measured (`chaos_recovered`: the record's JSON; the kind and the
    /// detect and recover seconds for the histograms).
    Recovered {
        kind: &'static str,
        detect: Option<f64>,
        recover: Option<f64>,
        fields: Value,
    },
}

/// A fault that ended an attempt. The node that injected it publishes it with its root-cause
/// entry (`nodes/root_cause.rs`), so that every node labels that attempt alike, whatever its
/// own clock had reached, and the others' clocks catch up with the fault (module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The attempt's label (`injected kill rank 1, chaos fault 1`).
    pub label: String,
    /// The spec (0-based) and which of its faults (0-based): the same on every node.
    pub spec: usize,
    pub number: u32,
}

/// The last attempt's end, when a fault caused it: the fault, and whether this node injected
/// it (else its own clock drew it landing on another node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub injected: Injected,
    pub here: bool,
}

/// What the run's end says about chaos.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// The table (header first).
    pub table: Vec<String>,
    /// One line per fault not survived (the run then fails the check: exit ≠ 0).
    pub not_survived: Vec<String>,
    /// `--report-json`'s `chaos` section.
    pub json: Value,
}

/// One spec's clock: its next fault's number and when its gap began.
#[derive(Debug, Clone, Default)]
struct Clock {
    next: u32,
    since: Option<Instant>,
}

/// The attempt that runs now, as chaos sees it.
struct Running {
    restart_count: u32,
    layout: Layout,
    last: Vec<crate::supervisor::watch::task::LastOutput>,
    seen: Seen,
    /// Workers stopped by a `hang` fault (continued when the stop begins).
    stopped: Vec<i32>,
    /// The record of the fault injected into this attempt (at most one: the next waits).
    injected: Option<usize>,
    /// A `slow` fault's duty cycle under way.
    throttle: Option<slow::Throttle>,
    /// A fault of the same schedule that landed on another node during this attempt, as this
    /// node's clock drew it (module doc).
    remote: Option<Injected>,
}

/// The run's chaos state (module doc).
pub struct Chaos {
    spec: ChaosSpec,
    schedule: Schedule,
    progress: Option<ProgressRegex>,
    clocks: Vec<Clock>,
    records: Vec<Record>,
    /// A fault whose ranks are not back in user code yet (it holds the next fault back).
    pending: Option<usize>,
    /// Faults waiting for their first progress line after the fault.
    awaiting_progress: Vec<usize>,
    running: Option<Running>,
    next_poll: Option<Instant>,
    /// The failure the restart after a fault counts its "back in user code" from.
    restart_failed_at: Option<SystemTime>,
    events: Vec<ChaosEvent>,
    /// The last attempt's end, when a fault caused it.
    cause: Option<Cause>,
    /// A fault landed on another node: the spec whose clock restarts at this node's next
    /// recovery, as on the node that injected it (it holds no other fault back: a fault
    /// elsewhere may leave this node's attempt running).
    remote_pending: Option<usize>,
}

impl Chaos {
    /// Chaos for this run (`None`: no `--chaos`). `text`: the joined specs; `progress`:
    /// `--chaos-progress`; `hang_kills`: hang detection stops a hung group (`hang` needs it);
    /// `nodes_may_change`: a multi-node rendezvous (`node-loss` needs one); `run_id` seeds the
    /// schedule when no `seed=` is given on a multi-node job (every node must draw alike).
    pub fn new(
        text: &str,
        progress: Option<&str>,
        hang_kills: bool,
        multi_node: bool,
        run_id: &str,
    ) -> Result<Option<Chaos>, String> {
        Chaos::of_spec(spec::parse(text)?, progress, hang_kills, multi_node, run_id)
    }

    /// [`Chaos::new`] from the spec the config already typed (`config::ChaosSettings`).
    pub fn of_spec(
        spec: ChaosSpec,
        progress: Option<&str>,
        hang_kills: bool,
        multi_node: bool,
        run_id: &str,
    ) -> Result<Option<Chaos>, String> {
        let progress = progress.map(ProgressRegex::new).transpose()?;
        spec::check_plan(&spec, progress.is_some(), hang_kills, multi_node)?;
        if spec.faults.is_empty() {
            return Ok(None);
        }
        let seed = spec.seed.unwrap_or_else(|| match multi_node {
            true => run_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            }),
            false => fastrand::u64(..),
        });
        Ok(Some(Chaos {
            schedule: Schedule::new(&spec, seed),
            clocks: vec![Clock::default(); spec.faults.len()],
            spec,
            progress,
            records: Vec::new(),
            pending: None,
            awaiting_progress: Vec::new(),
            running: None,
            next_poll: None,
            restart_failed_at: None,
            events: Vec::new(),
            cause: None,
            remote_pending: None,
        }))
    }

    /// The lines said at start: chaos is on, the seed, and each spec's first gaps.
    pub fn start_lines(&mut self) -> Vec<String> {
        let mut out = vec![format!(
            "chaos mode: {} fault spec(s), seed {}; injected failures are labelled injected and never count toward --max-same-failures or --max-node-failures",
            self.spec.faults.len(),
            self.schedule.seed
        )];
        out.extend(self.schedule.lines());
        out
    }

    /// An attempt's workers were spawned: its number, where its ranks are, and each rank's
    /// last output lines (for `--chaos-progress`).
    pub fn attempt_started(
        &mut self,
        restart_count: u32,
        layout: Layout,
        last: Vec<crate::supervisor::watch::task::LastOutput>,
    ) {
        let now = Instant::now();
        for (clock, f) in self.clocks.iter_mut().zip(&self.spec.faults) {
            match f.at_attempt {
                Some(a) if a == restart_count => clock.since = Some(now),
                Some(_) => {}
                None => {
                    clock.since.get_or_insert(now);
                }
            }
        }
        self.next_poll = self.progress.as_ref().map(|_| now);
        self.running = Some(Running {
            restart_count,
            layout,
            last,
            seen: Seen::default(),
            stopped: Vec::new(),
            injected: None,
            throttle: None,
            remote: None,
        });
    }

    /// When the agent should call [`Chaos::tick`] next (`None`: no need while nothing changes).
    pub fn wake(&mut self) -> Option<Instant> {
        let running = self.running.as_ref()?;
        let mut due = self.next_poll;
        if let Some(t) = &running.throttle {
            due = Some(due.map_or(t.next(), |d| d.min(t.next())));
        }
        if self.pending.is_none() && running.injected.is_none() {
            let attempt = running.restart_count;
            for i in 0..self.clocks.len() {
                if let Some(at) = self.due(i, attempt) {
                    due = Some(due.map_or(at, |d| d.min(at)));
                }
            }
        }
        due
    }

    /// Spec `i`'s next fault time in attempt `attempt`, if it has one.
    fn due(&mut self, i: usize, attempt: u32) -> Option<Instant> {
        let f = &self.spec.faults[i];
        if f.at_attempt.is_some_and(|a| a != attempt) {
            return None;
        }
        let since = self.clocks[i].since?;
        let planned = self.schedule.get(i, self.clocks[i].next)?;
        Some(since + planned.gap)
    }

    /// Reads progress, and injects what is due while the group runs untouched (`untouched`).
    /// Returns the acts for the agent, each with the record it belongs to.
    pub fn tick(&mut self, untouched: bool) -> Vec<(usize, Act)> {
        let now = Instant::now();
        self.read_progress(now);
        let toggles = self.step_throttle(now, untouched);
        if !toggles.is_empty() {
            return toggles;
        }
        if !untouched || self.pending.is_some() {
            return Vec::new();
        }
        let Some(running) = self.running.as_ref() else {
            return Vec::new();
        };
        if running.injected.is_some() {
            return Vec::new();
        }
        let attempt = running.restart_count;
        let mut first: Option<(Instant, usize)> = None;
        for i in 0..self.clocks.len() {
            match self.due(i, attempt) {
                Some(at) if at <= now && first.map_or(true, |(f, _)| at < f) => {
                    first = Some((at, i))
                }
                _ => {}
            }
        }
        let Some((_, i)) = first else {
            return Vec::new();
        };
        // The progress value "before" is read at the fault itself, not up to a poll ago.
        self.next_poll = None;
        self.read_progress(now);
        let number = self.clocks[i].next;
        let planned = self.schedule.get(i, number).expect("due");
        self.clocks[i].next += 1;
        self.clocks[i].since = Some(now);
        let running = self.running.as_mut().expect("checked");
        let landed = inject::land(&self.spec.faults[i], planned.draw, &running.layout);
        let mut record = Record {
            id: self.records.len() + 1,
            spec: i,
            number,
            kind: self.spec.faults[i].kind,
            rank: None,
            node: running.layout.node,
            attempt,
            pid: None,
            at: SystemTime::now(),
            detected: None,
            recovered: None,
            progress: None,
            before: running.seen.latest,
            after: None,
            state: State::Pending,
        };
        let act = match landed {
            // Another node injects it (every node draws the same schedule): this node's end of
            // the attempt is that fault's too, never one of its own (a kill, a hang or a lost
            // node ends every node's attempt; a slow rank elsewhere ends none).
            Ok(None) if record.kind != Kind::Slow => {
                running.remote = Some(Injected {
                    label: format!(
                        "injected {} on another node, chaos spec {}",
                        record.kind,
                        i + 1
                    ),
                    spec: i,
                    number: record.number,
                });
                self.remote_pending = Some(i);
                return Vec::new();
            }
            Ok(None) => return Vec::new(),
            Ok(Some((target, act))) => {
                record.rank = target.map(|t| t.rank);
                record.pid = target.map(|t| t.pid);
                act
            }
            Err(why) => {
                record.state = State::Skipped(why);
                self.records.push(record);
                return Vec::new();
            }
        };
        let idx = self.records.len();
        self.records.push(record);
        vec![(idx, act)]
    }

    /// The agent performed record `idx`'s act (`Err`: why it could not).
    pub fn injected(&mut self, idx: usize, act: &Act, done: Result<(), String>) {
        let Some(r) = self.records.get_mut(idx) else {
            return;
        };
        if let Err(why) = done {
            r.state = State::Skipped(why);
            return;
        }
        match act {
            Act::Signal { pid, signal } if *signal == libc::SIGSTOP => {
                if let Some(run) = self.running.as_mut() {
                    run.stopped.push(*pid);
                }
            }
            Act::Throttle { pid, pct, secs } => {
                if let Some(run) = self.running.as_mut() {
                    run.throttle =
                        Some(slow::Throttle::new(idx, *pid, *pct, *secs, Instant::now()));
                }
            }
            _ => {}
        }
        self.events.push(ChaosEvent::Inject(r.to_json()));
        if r.state == State::Pending {
            self.pending = Some(idx);
            if let Some(run) = self.running.as_mut() {
                run.injected = Some(idx);
            }
            if self.progress.is_some() {
                self.awaiting_progress.push(idx);
            }
        }
    }

    /// The stop of the attempt began: the workers a `hang` stopped, to be continued so that
    /// they take the stop's signal now (none is ever left stopped); each is given once.
    pub fn stop_began(&mut self) -> Vec<i32> {
        let Some(run) = self.running.as_mut() else {
            return Vec::new();
        };
        let mut pids = std::mem::take(&mut run.stopped);
        if let Some(t) = run.throttle.take() {
            pids.extend(t.stopped().then_some(t.pid));
        }
        pids
    }

    /// The `slow` duty cycle's signal due now, as an [`Act::Toggle`]; at its end the fault is
    /// survived (the job went on through it) and the next one may come.
    /// A group no longer untouched (a worker exited, a stop) ends the cycle at once: a stopped
    /// rank is continued (stopped, it cannot have exited), and the job's fate decides the
    /// fault's.
    fn step_throttle(&mut self, now: Instant, untouched: bool) -> Vec<(usize, Act)> {
        let Some(run) = self.running.as_mut() else {
            return Vec::new();
        };
        if !untouched {
            return match run.throttle.take() {
                Some(t) if t.stopped() => vec![(
                    t.idx,
                    Act::Toggle {
                        pid: t.pid,
                        signal: libc::SIGCONT,
                    },
                )],
                _ => Vec::new(),
            };
        }
        let Some(t) = run.throttle.as_mut() else {
            return Vec::new();
        };
        let (signal, over) = t.step(now);
        let (idx, pid) = (t.idx, t.pid);
        if over {
            let run = self.running.as_mut().expect("checked");
            run.throttle = None;
            run.injected = None;
            let r = &mut self.records[idx];
            r.state = State::Recovered;
            self.clocks[r.spec].since = Some(now);
            if self.pending == Some(idx) {
                self.pending = None;
            }
            self.awaiting_progress.retain(|&i| i != idx);
            self.resolved(idx);
        }
        signal
            .map(|signal| vec![(idx, Act::Toggle { pid, signal })])
            .unwrap_or_default()
    }

    /// The attempt is over (`failed`: its first failure observed, `stop`: when its stop began):
    /// the label of its failure when a fault caused it (`injected kill rank 1, chaos fault 1`),
    /// which keeps it out of the stop verdict and the failure counts.
    pub fn attempt_over(
        &mut self,
        failed: Option<SystemTime>,
        stop: Option<SystemTime>,
    ) -> Option<String> {
        self.cause = self.caused(failed, stop);
        self.cause.as_ref().map(|c| c.injected.label.clone())
    }

    /// What [`Chaos::attempt_over`] found, once.
    pub fn take_cause(&mut self) -> Option<Cause> {
        self.cause.take()
    }

    /// The nodes agreed that `fault`, injected on another node, ended the attempt: this node's
    /// clock for its spec catches up with it (when it had not drawn it yet, a busy node's
    /// timer being behind), and restarts at this node's recovery, as on the node that
    /// injected it. Returns the label every node gives the attempt.
    pub fn agreed(&mut self, fault: &Injected) -> String {
        if let Some(clock) = self.clocks.get_mut(fault.spec) {
            clock.next = clock.next.max(fault.number + 1);
            self.remote_pending = Some(fault.spec);
        }
        fault.label.clone()
    }

    fn caused(&mut self, failed: Option<SystemTime>, stop: Option<SystemTime>) -> Option<Cause> {
        let run = self.running.take()?;
        if run.injected.is_none() {
            return run.remote.map(|injected| Cause {
                injected,
                here: false,
            });
        }
        let idx = run.injected?;
        let r = &mut self.records[idx];
        if !matches!(r.kind, Kind::Kill | Kind::Hang) {
            return None;
        }
        // rdrun's decision: the stop of the group (for a kill, right after the reap).
        let decided = stop.or(failed).unwrap_or_else(SystemTime::now);
        r.detected = Some(decided.duration_since(r.at).unwrap_or(Duration::ZERO));
        Some(Cause {
            injected: Injected {
                label: format!("injected {}, chaos fault {}", r.what(), r.id),
                spec: r.spec,
                number: r.number,
            },
            here: true,
        })
    }

    /// The restart after a fault spawned its workers; `failed_at` is what its "back in user
    /// code" counts from (`RestartCost::failed_at`).
    pub fn restarted(&mut self, failed_at: SystemTime) {
        self.restart_failed_at = Some(failed_at);
    }

    /// Every rank of the restarted attempt is back in user code, `back` after `failed_at`.
    pub fn back(&mut self, back: Duration) {
        if let Some(i) = self.remote_pending.take() {
            // The spec's next gap counts from here, as on the node that injected the fault.
            self.clocks[i].since = Some(Instant::now());
        }
        let Some(idx) = self.pending.take() else {
            return;
        };
        let at = self.restart_failed_at.unwrap_or_else(SystemTime::now) + back;
        let r = &mut self.records[idx];
        r.recovered = Some(at.duration_since(r.at).unwrap_or(Duration::ZERO));
        r.state = State::Recovered;
        // The spec's next gap counts from the recovery.
        self.clocks[r.spec].since = Some(Instant::now());
        if !self.awaiting_progress.contains(&idx) {
            self.resolved(idx);
        }
    }

    fn resolved(&mut self, idx: usize) {
        let r = &self.records[idx];
        self.events.push(ChaosEvent::Recovered {
            kind: r.kind.as_str(),
            detect: r.detected.map(|d| d.as_secs_f64()),
            recover: r.recovered.map(|d| d.as_secs_f64()),
            fields: r.to_json(),
        });
    }

    /// Reads the workers' last lines for `--chaos-progress` once per [`PROGRESS_POLL`].
    fn read_progress(&mut self, now: Instant) {
        let (Some(re), Some(run)) = (self.progress.as_ref(), self.running.as_mut()) else {
            return;
        };
        if self.next_poll.is_some_and(|t| t > now) {
            return;
        }
        self.next_poll = Some(now + PROGRESS_POLL);
        let lines: Vec<Vec<String>> = run.last.iter().map(|f| f()).collect();
        run.seen.look(re, &lines);
        if !run.seen.any {
            return;
        }
        let attempt = run.restart_count;
        let after = run.seen.first;
        let mut done = Vec::new();
        for &idx in &self.awaiting_progress {
            let r = &mut self.records[idx];
            if r.attempt < attempt {
                r.progress = Some(SystemTime::now().duration_since(r.at).unwrap_or_default());
                r.after = after;
                done.push(idx);
            }
        }
        self.awaiting_progress.retain(|i| !done.contains(i));
        for idx in done {
            if self.pending != Some(idx) {
                self.resolved(idx);
            }
        }
    }

    /// The events to report since the last call.
    pub fn events(&mut self) -> Vec<ChaosEvent> {
        std::mem::take(&mut self.events)
    }

    /// The run is over (`succeeded`: it ended well): a fault still awaiting its recovery was
    /// survived only if the job succeeded after it (its ranks printed nothing to measure);
    /// otherwise it was not.
    pub fn finish(&mut self, succeeded: bool) -> Finish {
        if let Some(idx) = self.pending.take() {
            self.records[idx].state = match succeeded {
                true => State::Recovered,
                false => {
                    State::NotSurvived("the job ended without coming back to user code".to_string())
                }
            };
            self.awaiting_progress.retain(|&i| i != idx);
            self.resolved(idx);
        }
        for idx in std::mem::take(&mut self.awaiting_progress) {
            self.resolved(idx);
        }
        let specs: Vec<String> = self.spec.faults.iter().map(|f| f.describe()).collect();
        Finish {
            table: table::render(&self.records),
            not_survived: table::not_survived(&self.records),
            json: table::to_json(self.schedule.seed, &specs, &self.records),
        }
    }

    /// The records so far (tests, the report).
    pub fn records(&self) -> &[Record] {
        &self.records
    }
}

/// The `chaos_inject` / `chaos_recovered` event fields of `ev`.
pub fn event_fields(ev: &ChaosEvent) -> (&'static str, &Value) {
    match ev {
        ChaosEvent::Inject(v) => ("chaos_inject", v),
        ChaosEvent::Recovered { fields, .. } => ("chaos_recovered", fields),
    }
}

impl Chaos {
    /// The line the agent says as it injects record `idx`: `chaos: injecting fault 1 (kill
    /// rank 1 in attempt 0)`.
    pub fn act_line(&self, idx: usize) -> String {
        match self.records.get(idx) {
            Some(r) => format!(
                "chaos: injecting fault {} ({} in attempt {})",
                r.id,
                r.what(),
                r.attempt
            ),
            None => String::new(),
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
