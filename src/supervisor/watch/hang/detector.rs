//! The hang detector: a pure state machine of samples and events, and [`HangMonitor`], which
//! feeds it from a [`ProcSource`] on each poll tick.
//!
//! Rules (spec hang-detection §4 and §5.3, issue 13):
//! * A rank is *active* in a poll interval when its tree's CPU time grew by at least
//!   `cpu_idle_pct` % of one core over the interval, its read+write bytes by at least
//!   `io_idle_bytes`, its output by any byte, or it sent a heartbeat / timer message.
//! * A rank is *exempt* while stopped (`T`), in tracing stop (`t`) or traced (`TracerPid ≠ 0`).
//!   Leaving exemption counts as activity, so a long debugger session is not a hang the moment
//!   it ends. The `--debug-rank` rank is exempt for its whole life: debugpy pauses it with
//!   threads of its own, nothing `/proc` shows; it also does not hold the startup phase open
//!   (waiting for a client it shows no progress).
//! * Phase *startup* lasts from spawn until every rank has shown *progress* — a heartbeat or
//!   timer message, or output — or until `startup_budget` has passed since spawn; then
//!   *steady*. CPU and I/O do not count as progress: every rank burns CPU importing torch.
//! * Hung when every live, non-exempt rank has been inactive for the phase budget and at least
//!   one live rank is not exempt (all-exempt is never a hang: somebody is debugging).
//! * Shortcuts: some rank exited 0 and the live ranks stayed quiet for `exit_skew_budget`;
//!   a rank's heartbeat is past its budget while the rank lives.
//! * One verdict per quiet episode: after a verdict the detector stays silent until some rank
//!   is active again (observe mode), or until [`Detector::reset`] (a new attempt).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::sample::{ProcSample, ProcSource, ProcState, RankProcs, RankSample};
use super::settings::{HangMode, HangSettings};

/// The detector's phase; each has its own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Startup,
    Steady,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Startup => "startup",
            Phase::Steady => "steady",
        }
    }
}

/// Which rule fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HangReason {
    /// Every live, non-exempt rank quiet for the phase budget.
    Quiescence,
    /// These ranks exited 0 and the others stayed quiet for the exit-skew budget.
    ExitSkew { exited: Vec<u32> },
    /// This rank's heartbeat is past its budget.
    Heartbeat { rank: u32 },
    /// Multi-node: every one of `nodes` nodes quiet past its budget (`cluster`), declared by
    /// node `by`.
    Cluster { nodes: u32, by: u32 },
    /// torch FileTimers of these ranks expired (the agent's FileTimer server, not the sampler):
    /// captured, then each expired process gets its timer's signal.
    FileTimer { expired: Vec<TimerExpiry> },
}

/// One expired FileTimer of a live worker's tree: whose, which process, which scopes, and the
/// signal the agent sends after the capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerExpiry {
    pub rank: u32,
    /// The process that armed the timer (the worker or one of its descendants).
    pub pid: i32,
    pub scopes: Vec<String>,
    /// The timer's signal by name (`SIGKILL`).
    pub signal: String,
}

impl HangReason {
    /// The `detector` name of spec §5.6.
    pub fn detector(&self) -> &'static str {
        match self {
            HangReason::Quiescence => "quiescence",
            HangReason::ExitSkew { .. } => "exit_skew",
            HangReason::Heartbeat { .. } => "heartbeat",
            HangReason::Cluster { .. } => "quiescence",
            HangReason::FileTimer { .. } => "file_timer",
        }
    }
}

/// One rank as the verdict saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankView {
    pub rank: u32,
    pub pid: i32,
    pub alive: bool,
    pub exempt: bool,
    pub state: Option<ProcState>,
    /// CPU of the last interval in % of one core.
    pub cpu_pct: f64,
    /// Read+write bytes of the last interval.
    pub io_bytes: u64,
    /// Time since this rank was last active.
    pub quiet_for: Duration,
    /// Exit code when the rank has exited.
    pub exit_code: Option<i32>,
}

/// The detector's decision: the job (or one rank) hangs.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub reason: HangReason,
    pub phase: Phase,
    /// How long the job has been quiet (for a heartbeat: how long since the last beat).
    pub quiet_for: Duration,
    pub budget: Duration,
    /// `Observe` or `Kill`: whether the caller should stop the group after capturing.
    pub action: HangMode,
    pub ranks: Vec<RankView>,
}

#[derive(Debug, Clone)]
struct RankState {
    pid: i32,
    last: Option<(Instant, ProcSample)>,
    last_cpu_pct: f64,
    last_io: u64,
    quiet_since: Instant,
    alive: bool,
    exempt: bool,
    /// rdrun itself stopped it (`--chaos hang`): a stop that is a hang, not a debugger's, so
    /// it never makes the rank exempt.
    stopped_by_rdrun: bool,
    progressed: bool,
    exit: Option<(i32, Instant)>,
    beat: Option<(Instant, Duration)>,
}

/// This node's quiet state, for the multi-node rule (`cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeQuiet {
    pub phase: Phase,
    /// The phase budget.
    pub budget: Duration,
    /// Live ranks.
    pub live: u32,
    /// Live ranks that are not exempt.
    pub watched: u32,
    /// How long every watched rank has been inactive (zero when none is watched).
    pub quiet_for: Duration,
}

/// The pure detector. Feed it with [`Detector::observe`] each poll and with the event methods.
#[derive(Debug, Clone)]
pub struct Detector {
    settings: HangSettings,
    mode: HangMode,
    spawned_at: Instant,
    ranks: BTreeMap<u32, RankState>,
    /// A verdict was given and no rank has been active since.
    latched: bool,
}

impl Detector {
    /// A detector for ranks spawned at `now`. `mode` is the effective mode
    /// ([`HangSettings::effective_mode`]).
    pub fn new(settings: &HangSettings, mode: HangMode, now: Instant) -> Self {
        Detector {
            settings: settings.clone(),
            mode,
            spawned_at: now,
            ranks: BTreeMap::new(),
            latched: false,
        }
    }

    /// Forgets every rank and restarts the startup phase (call at each new attempt).
    pub fn reset(&mut self, now: Instant) {
        self.spawned_at = now;
        self.ranks.clear();
        self.latched = false;
    }

    fn rank(&mut self, rank: u32, pid: i32, now: Instant) -> &mut RankState {
        let spawned = self.spawned_at.min(now);
        self.ranks.entry(rank).or_insert(RankState {
            pid,
            last: None,
            last_cpu_pct: 0.0,
            last_io: 0,
            quiet_since: spawned,
            alive: true,
            exempt: false,
            stopped_by_rdrun: false,
            progressed: false,
            exit: None,
            beat: None,
        })
    }

    /// The current phase.
    pub fn phase(&self, now: Instant) -> Phase {
        let debug = self.settings.debug_rank;
        let all_progressed = self.ranks.iter().any(|(k, _)| Some(*k) != debug)
            && self
                .ranks
                .iter()
                .all(|(k, r)| r.progressed || Some(*k) == debug);
        if all_progressed
            || now.saturating_duration_since(self.spawned_at) >= self.settings.startup_budget
        {
            Phase::Steady
        } else {
            Phase::Startup
        }
    }

    fn budget(&self, phase: Phase) -> Duration {
        match phase {
            Phase::Startup => self.settings.startup_budget,
            Phase::Steady => self.settings.steady_budget,
        }
    }

    fn active(&mut self, rank: u32, now: Instant) {
        if let Some(r) = self.ranks.get_mut(&rank) {
            r.quiet_since = r.quiet_since.max(now);
        }
        self.latched = false;
    }

    /// A heartbeat or FileTimer message from `rank`: activity and progress. `budget` is how
    /// long until the rank must beat again (None: no heartbeat contract, e.g. a plain timer).
    pub fn heartbeat(&mut self, rank: u32, pid: i32, now: Instant, budget: Option<Duration>) {
        let r = self.rank(rank, pid, now);
        r.progressed = true;
        if let Some(b) = budget {
            r.beat = Some((now, b));
        }
        self.active(rank, now);
    }

    /// `rank` released its heartbeat: no budget to miss any more (the quiet rule still holds).
    pub fn end_heartbeat(&mut self, rank: u32) {
        if let Some(r) = self.ranks.get_mut(&rank) {
            r.beat = None;
        }
    }

    /// rdrun stopped `rank` itself (a `--chaos hang` fault): its stopped state is the hang to
    /// find, not a debugger's pause, so the quiet rule keeps watching it (a one-rank job has no
    /// other rank whose wait would show the hang).
    pub fn stopped_by_rdrun(&mut self, rank: u32, now: Instant) {
        self.rank(rank, 0, now).stopped_by_rdrun = true;
    }

    /// `rank` exited with `code` (negative: killed by signal -code).
    pub fn rank_exited(&mut self, rank: u32, code: i32, now: Instant) {
        let r = self.rank(rank, 0, now);
        r.alive = false;
        r.exit = Some((code, now));
    }

    /// One poll's samples. Returns a verdict at most once per quiet episode.
    pub fn observe(&mut self, now: Instant, samples: &[RankSample]) -> Option<Verdict> {
        if self.mode == HangMode::Off {
            return None;
        }
        let cpu_idle = self.settings.cpu_idle_pct;
        let io_idle = self.settings.io_idle_bytes;
        let mut any_active = false;
        let spawned = self.spawned_at;
        let debug = self.settings.debug_rank;
        for s in samples {
            let r = self.rank(s.rank, s.pid, now);
            r.pid = s.pid;
            let Some(cur) = s.sample else {
                r.alive = false;
                continue;
            };
            if r.exit.is_some() {
                continue;
            }
            r.alive = true;
            let was_exempt = r.exempt;
            r.exempt = (cur.exempt() && !r.stopped_by_rdrun) || debug == Some(s.rank);
            let mut active = was_exempt && !r.exempt;
            // A worker starts from zero counters at spawn: the first sample's deltas are
            // measured from there, so activity before the first poll is not lost.
            let (t0, prev) = r.last.unwrap_or((
                spawned,
                ProcSample {
                    cpu_secs: 0.0,
                    io_bytes: 0,
                    output_bytes: 0,
                    state: ProcState::Running,
                    traced: false,
                },
            ));
            let dt = now.saturating_duration_since(t0).as_secs_f64();
            let dcpu = (cur.cpu_secs - prev.cpu_secs).max(0.0);
            let dio = cur.io_bytes.saturating_sub(prev.io_bytes);
            let dout = cur.output_bytes.saturating_sub(prev.output_bytes);
            r.last_cpu_pct = if dt > 0.0 { 100.0 * dcpu / dt } else { 0.0 };
            r.last_io = dio;
            // CPU over a zero-length interval is no evidence either way; any growth then
            // counts, so a burst between two close polls is never dropped.
            let cpu_active = if dt > 0.0 {
                r.last_cpu_pct >= cpu_idle
            } else {
                dcpu > 0.0
            };
            if dout > 0 {
                r.progressed = true;
            }
            active |= cpu_active || dio >= io_idle.max(1) || dout > 0;
            r.last = Some((now, cur));
            if active {
                r.quiet_since = now;
                any_active = true;
            }
        }
        if any_active {
            self.latched = false;
        }
        if self.latched {
            return None;
        }
        let verdict = self.judge(now);
        if verdict.is_some() {
            self.latched = true;
        }
        verdict
    }

    fn judge(&self, now: Instant) -> Option<Verdict> {
        let phase = self.phase(now);
        // Heartbeat shortcut: an explicit contract, checked per rank.
        for (&rank, r) in &self.ranks {
            if let (true, false, Some((at, budget))) = (r.alive, r.exempt, r.beat) {
                let age = now.saturating_duration_since(at);
                if age >= budget {
                    return Some(self.verdict(
                        HangReason::Heartbeat { rank },
                        phase,
                        age,
                        budget,
                        now,
                    ));
                }
            }
        }
        let live: Vec<&RankState> = self.ranks.values().filter(|r| r.alive).collect();
        let watched: Vec<&RankState> = live.iter().copied().filter(|r| !r.exempt).collect();
        if watched.is_empty() {
            return None;
        }
        let job_quiet_since = watched.iter().map(|r| r.quiet_since).max()?;
        let quiet_for = now.saturating_duration_since(job_quiet_since);
        let budget = self.budget(phase);
        if quiet_for >= budget {
            return Some(self.verdict(HangReason::Quiescence, phase, quiet_for, budget, now));
        }
        let exited: Vec<u32> = self
            .ranks
            .iter()
            .filter(|(_, r)| matches!(r.exit, Some((0, _))))
            .map(|(&k, _)| k)
            .collect();
        if let Some(first_exit) = self
            .ranks
            .values()
            .filter_map(|r| r.exit.filter(|e| e.0 == 0).map(|e| e.1))
            .min()
        {
            // Quiet since the later of the last activity and the first clean exit.
            let since = job_quiet_since.max(first_exit);
            let q = now.saturating_duration_since(since);
            let b = self.settings.exit_skew_budget.min(budget);
            if q >= b {
                return Some(self.verdict(HangReason::ExitSkew { exited }, phase, q, b, now));
            }
        }
        None
    }

    /// This node's quiet state at `now` (after the poll's [`Detector::observe`]).
    pub fn node_state(&self, now: Instant) -> NodeQuiet {
        let phase = self.phase(now);
        let live = self.ranks.values().filter(|r| r.alive);
        let watched: Vec<&RankState> = live.clone().filter(|r| !r.exempt).collect();
        let quiet_for = watched
            .iter()
            .map(|r| r.quiet_since)
            .max()
            .map_or(Duration::ZERO, |q| now.saturating_duration_since(q));
        NodeQuiet {
            phase,
            budget: self.budget(phase),
            live: u32::try_from(live.count()).unwrap_or(u32::MAX),
            watched: u32::try_from(watched.len()).unwrap_or(u32::MAX),
            quiet_for,
        }
    }

    /// A verdict decided outside this detector (the multi-node rule, or the local rule at a
    /// longer budget), with this node's ranks as seen now; latches like one of its own.
    pub fn declare(
        &mut self,
        reason: HangReason,
        quiet_for: Duration,
        budget: Duration,
        now: Instant,
    ) -> Verdict {
        self.latched = true;
        self.verdict(reason, self.phase(now), quiet_for, budget, now)
    }

    fn verdict(
        &self,
        reason: HangReason,
        phase: Phase,
        quiet_for: Duration,
        budget: Duration,
        now: Instant,
    ) -> Verdict {
        Verdict {
            reason,
            phase,
            quiet_for,
            budget,
            action: self.mode,
            ranks: self
                .ranks
                .iter()
                .map(|(&rank, r)| RankView {
                    rank,
                    pid: r.pid,
                    alive: r.alive,
                    exempt: r.exempt,
                    state: r.last.map(|(_, s)| s.state),
                    cpu_pct: r.last_cpu_pct,
                    io_bytes: r.last_io,
                    quiet_for: now.saturating_duration_since(r.quiet_since),
                    exit_code: r.exit.map(|e| e.0),
                })
                .collect(),
        }
    }
}

/// The detector plus its sample source: what the agent holds. Call [`HangMonitor::sample`] on
/// each tick of a `poll_interval()` timer.
pub struct HangMonitor {
    detector: Detector,
    source: Box<dyn ProcSource>,
    poll_interval: Duration,
}

impl HangMonitor {
    /// A monitor reading `/proc`, for ranks spawned at `now`.
    pub fn new(settings: &HangSettings, stdin_is_tty: bool, now: Instant) -> Self {
        Self::with_source(
            settings,
            stdin_is_tty,
            now,
            Box::new(super::sample::ProcFs::new()),
        )
    }

    pub fn with_source(
        settings: &HangSettings,
        stdin_is_tty: bool,
        now: Instant,
        source: Box<dyn ProcSource>,
    ) -> Self {
        HangMonitor {
            detector: Detector::new(settings, settings.effective_mode(stdin_is_tty), now),
            source,
            poll_interval: settings.poll_interval,
        }
    }

    /// Whether the monitor does anything (false for `--hang-detect off`: skip the timer).
    pub fn enabled(&self) -> bool {
        self.detector.mode != HangMode::Off
    }

    /// The effective mode (kill downgraded to observe on a TTY).
    pub fn mode(&self) -> HangMode {
        self.detector.mode
    }

    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Samples every rank and judges. Never blocks for long (a few small `/proc` reads).
    pub fn sample(&mut self, now: Instant, ranks: &[RankProcs]) -> Option<Verdict> {
        if !self.enabled() {
            return None;
        }
        let samples = self.source.sample(ranks);
        self.detector.observe(now, &samples)
    }

    /// The underlying detector, for the event methods (`rank_exited`, `heartbeat`, `reset`).
    pub fn detector(&mut self) -> &mut Detector {
        &mut self.detector
    }
}

#[cfg(test)]
#[path = "detector_tests.rs"]
mod tests;
