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
            r.exempt = cur.exempt() || debug == Some(s.rank);
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
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn settings() -> HangSettings {
        HangSettings {
            steady_budget: 100 * S,
            startup_budget: 200 * S,
            exit_skew_budget: 30 * S,
            ..HangSettings::default()
        }
    }

    fn smp(rank: u32, cpu: f64, io: u64, out: u64) -> RankSample {
        RankSample {
            rank,
            pid: 1000 + rank as i32,
            sample: Some(ProcSample {
                cpu_secs: cpu,
                io_bytes: io,
                output_bytes: out,
                state: ProcState::Sleeping,
                traced: false,
            }),
        }
    }

    fn with_state(mut s: RankSample, st: ProcState, traced: bool) -> RankSample {
        let p = s.sample.as_mut().unwrap();
        p.state = st;
        p.traced = traced;
        s
    }

    /// Runs `steps` polls 5 s apart of the same idle samples; returns the first verdict time.
    fn first_verdict(
        d: &mut Detector,
        t0: Instant,
        from: u64,
        to: u64,
        f: impl Fn(u64) -> Vec<RankSample>,
    ) -> Option<(u64, Verdict)> {
        let mut t = from;
        while t <= to {
            if let Some(v) = d.observe(t0 + Duration::from_secs(t), &f(t)) {
                return Some((t, v));
            }
            t += 5;
        }
        None
    }

    #[test]
    fn quiet_job_hangs_after_the_startup_budget_when_nobody_progressed() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let (t, v) = first_verdict(&mut d, t0, 0, 1000, |_| {
            vec![smp(0, 1.0, 0, 0), smp(1, 1.0, 0, 0)]
        })
        .unwrap();
        assert_eq!(t, 200, "startup budget from spawn");
        assert_eq!(v.reason, HangReason::Quiescence);
        assert_eq!(v.action, HangMode::Kill);
        assert_eq!(v.ranks.len(), 2);
    }

    /// `--debug-rank 1`: rank 1's pause (quiet, waiting for a client, never printing) is no
    /// hang and does not hold the startup phase; the other ranks are judged as always, so
    /// their quiet still is one. Without the flag the same samples give verdicts.
    #[test]
    fn the_debug_rank_is_exempt_the_others_are_not() {
        let debug = HangSettings {
            debug_rank: Some(1),
            ..settings()
        };
        // Rank 0 prints at t=10 and then goes quiet at t=60; rank 1 never does anything.
        let f = |t: u64| {
            let out = if t >= 10 { 5 + t.min(60) } else { 0 };
            vec![smp(0, 1.0, 0, out), smp(1, 1.0, 0, 0)]
        };
        let t0 = Instant::now();
        let mut d = Detector::new(&debug, HangMode::Kill, t0);
        let (t, v) = first_verdict(&mut d, t0, 0, 1000, f).expect("rank 0's quiet is a hang");
        assert_eq!(
            v.phase,
            Phase::Steady,
            "the debug rank does not hold startup"
        );
        assert_eq!(t, 160, "steady budget from rank 0's last output");
        let view = |r: u32| v.ranks.iter().find(|x| x.rank == r).expect("rank");
        assert!(view(1).exempt && !view(0).exempt);
        // Without the flag rank 1's silence keeps startup: the verdict comes at its budget.
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let (t, _) = first_verdict(&mut d, t0, 0, 1000, f).expect("verdict");
        assert_eq!(t, 200);
        // Rank 0 finished (exit 0) while rank 1 is paused: no exit-skew verdict with the flag.
        let g = |t: u64| {
            let out = if t >= 10 { 5 } else { 0 };
            vec![smp(0, 1.0, 0, out), smp(1, 1.0, 0, 0)]
        };
        let mut d = Detector::new(&debug, HangMode::Kill, t0);
        assert!(d.observe(t0 + 10 * S, &g(10)).is_none());
        d.rank_exited(0, 0, t0 + 12 * S);
        assert!(
            first_verdict(&mut d, t0, 15, 2000, |_| vec![smp(1, 1.0, 0, 0)]).is_none(),
            "the paused debug rank alone is never a hang"
        );
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        assert!(d.observe(t0 + 10 * S, &g(10)).is_none());
        d.rank_exited(0, 0, t0 + 12 * S);
        let (_, v) = first_verdict(&mut d, t0, 15, 2000, |_| vec![smp(1, 1.0, 0, 0)])
            .expect("exit skew without the flag");
        assert!(matches!(v.reason, HangReason::ExitSkew { .. }));
    }

    #[test]
    fn steady_budget_applies_once_every_rank_printed() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        // Both ranks print at t=10, then go quiet.
        let f = |t: u64| {
            let out = if t >= 10 { 50 } else { 0 };
            vec![smp(0, 1.0, 0, out), smp(1, 1.0, 0, out)]
        };
        let (t, v) = first_verdict(&mut d, t0, 0, 1000, f).unwrap();
        assert_eq!(v.phase, Phase::Steady);
        assert_eq!(t, 110, "steady budget counted from the last activity");
        assert_eq!(v.budget, 100 * S);
    }

    #[test]
    fn one_silent_rank_keeps_the_startup_phase() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let f = |t: u64| {
            vec![
                smp(0, 1.0, 0, if t >= 10 { 5 } else { 0 }),
                smp(1, 1.0, 0, 0),
            ]
        };
        let (t, v) = first_verdict(&mut d, t0, 0, 1000, f).unwrap();
        assert_eq!(t, 200);
        assert_eq!(
            v.phase,
            Phase::Steady,
            "startup ended by time at the verdict"
        );
    }

    #[test]
    fn each_activity_signal_resets_the_clock() {
        for which in 0..3 {
            let t0 = Instant::now();
            let mut d = Detector::new(&settings(), HangMode::Kill, t0);
            // Activity of one kind on rank 1 every 50 s, just above threshold.
            let f = move |t: u64| {
                let k = t / 50;
                let (cpu, io, out) = match which {
                    // 5 % of a core over a 5 s poll = 0.25 s of CPU.
                    0 => (k as f64 * 0.25, 0, 0),
                    1 => (0.0, k * 65536, 0),
                    _ => (0.0, 0, k),
                };
                vec![smp(0, 0.0, 0, 0), smp(1, cpu, io, out)]
            };
            assert!(
                first_verdict(&mut d, t0, 0, 2000, f).is_none(),
                "signal {which} ignored"
            );
        }
    }

    #[test]
    fn sub_threshold_activity_is_quiet() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        // 0.4 % of a core and 1 KiB per poll: a hung gloo rank.
        let f = |t: u64| vec![smp(0, t as f64 * 0.004, t * 200, 0)];
        assert!(first_verdict(&mut d, t0, 0, 1000, f).is_some());
    }

    #[test]
    fn stopped_or_traced_ranks_are_exempt_and_all_exempt_is_never_hung() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let f = |_| {
            vec![
                with_state(smp(0, 0.0, 0, 0), ProcState::Stopped, false),
                with_state(smp(1, 0.0, 0, 0), ProcState::Sleeping, true),
                with_state(smp(2, 0.0, 0, 0), ProcState::TracingStop, false),
            ]
        };
        assert!(first_verdict(&mut d, t0, 0, 5000, f).is_none());

        // An exempt rank does not block a verdict on the others.
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let f = |_| {
            vec![
                with_state(smp(0, 0.0, 0, 0), ProcState::Stopped, false),
                smp(1, 0.0, 0, 0),
            ]
        };
        let (_, v) = first_verdict(&mut d, t0, 0, 5000, f).unwrap();
        assert!(v.ranks[0].exempt && !v.ranks[1].exempt);
    }

    #[test]
    fn resuming_from_a_stop_counts_as_activity() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        // Stopped until t=1000, then quiet: verdict only a full budget after the resume.
        let f = |t: u64| {
            let st = if t < 1000 {
                ProcState::Stopped
            } else {
                ProcState::Sleeping
            };
            vec![with_state(smp(0, 0.0, 0, 0), st, false)]
        };
        let (t, _) = first_verdict(&mut d, t0, 0, 5000, f).unwrap();
        assert_eq!(t, 1100);
    }

    #[test]
    fn dead_ranks_are_not_watched_and_no_live_rank_means_no_verdict() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let f = |_| {
            vec![RankSample {
                rank: 0,
                pid: 1,
                sample: None,
            }]
        };
        assert!(first_verdict(&mut d, t0, 0, 5000, f).is_none());
    }

    #[test]
    fn exit_skew_shortcut() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        // Both busy until t=20; rank 0 exits 0 at t=20; rank 1 goes quiet.
        for t in (0..=20).step_by(5) {
            let c = t as f64;
            assert!(d
                .observe(
                    t0 + Duration::from_secs(t),
                    &[smp(0, c, 0, t), smp(1, c, 0, t)]
                )
                .is_none());
        }
        d.rank_exited(0, 0, t0 + Duration::from_secs(20));
        let f = |_| {
            vec![
                RankSample {
                    rank: 0,
                    pid: 1000,
                    sample: None,
                },
                smp(1, 20.0, 0, 20),
            ]
        };
        let (t, v) = first_verdict(&mut d, t0, 25, 1000, f).unwrap();
        assert_eq!(t, 50, "30 s exit-skew budget after the exit");
        assert_eq!(v.reason, HangReason::ExitSkew { exited: vec![0] });

        // A failed exit (code 1) is the normal failure path, not a skew.
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        for t in (0..=20).step_by(5) {
            let c = t as f64;
            d.observe(
                t0 + Duration::from_secs(t),
                &[smp(0, c, 0, t), smp(1, c, 0, t)],
            );
        }
        d.rank_exited(0, 1, t0 + Duration::from_secs(20));
        let (t, v) = first_verdict(&mut d, t0, 25, 1000, f).unwrap();
        assert_eq!((t, v.reason), (120, HangReason::Quiescence));
    }

    #[test]
    fn heartbeat_past_budget_fires_even_while_others_are_busy() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Observe, t0);
        d.heartbeat(1, 1001, t0, Some(20 * S));
        // Rank 0 busy all the time; rank 1 never beats again.
        let f = |t: u64| vec![smp(0, t as f64, 0, 0), smp(1, 0.0, 0, 0)];
        let (t, v) = first_verdict(&mut d, t0, 0, 1000, f).unwrap();
        assert_eq!(t, 20);
        assert_eq!(v.reason, HangReason::Heartbeat { rank: 1 });
        assert_eq!(v.action, HangMode::Observe);
    }

    #[test]
    fn heartbeat_renewed_in_time_never_fires_and_release_ends_the_contract() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        // Rank 0 beats every 10 s with a 20 s budget while both ranks are otherwise busy.
        for t in (0..=300).step_by(5) {
            let now = t0 + Duration::from_secs(t);
            if t % 10 == 0 {
                d.heartbeat(0, 1000, now, Some(20 * S));
            }
            let busy = vec![smp(0, t as f64, 0, 0), smp(1, t as f64, 0, 0)];
            assert!(d.observe(now, &busy).is_none(), "verdict at {t}");
        }
        // Released: the beat stops, no heartbeat verdict while the ranks stay busy.
        d.end_heartbeat(0);
        for t in (305..=600).step_by(5) {
            let busy = vec![smp(0, t as f64, 0, 0), smp(1, t as f64, 0, 0)];
            assert!(d.observe(t0 + Duration::from_secs(t), &busy).is_none());
        }
    }

    #[test]
    fn one_verdict_per_quiet_episode_and_reset() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Observe, t0);
        let quiet = |_| vec![smp(0, 0.0, 0, 0)];
        let (t, _) = first_verdict(&mut d, t0, 0, 1000, quiet).unwrap();
        assert!(
            first_verdict(&mut d, t0, t + 5, 3000, quiet).is_none(),
            "repeated verdict"
        );
        // Activity re-arms it.
        assert!(d
            .observe(t0 + Duration::from_secs(3005), &[smp(0, 0.0, 0, 9)])
            .is_none());
        let f = |_| vec![smp(0, 0.0, 0, 9)];
        let (t2, _) = first_verdict(&mut d, t0, 3010, 9000, f).unwrap();
        assert_eq!(t2, 3105);
        // reset() starts a new attempt.
        d.reset(t0 + Duration::from_secs(10_000));
        let (t3, v) = first_verdict(&mut d, t0, 10_000, 20_000, quiet).unwrap();
        assert_eq!((t3, v.phase), (10_200, Phase::Steady));
    }

    #[test]
    fn node_state_says_how_long_the_node_is_quiet_and_declare_latches() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Kill, t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Rank 0 busy at 10 s, rank 1 silent; rank 2 stopped (exempt).
        d.observe(
            at(10),
            &[
                smp(0, 5.0, 0, 0),
                smp(1, 0.0, 0, 0),
                with_state(smp(2, 0.0, 0, 0), ProcState::Stopped, false),
            ],
        );
        let q = d.node_state(at(25));
        assert_eq!((q.live, q.watched), (3, 2));
        assert_eq!(q.quiet_for, Duration::from_secs(15));
        assert_eq!((q.phase, q.budget), (Phase::Startup, 200 * S));
        let v = d.declare(
            HangReason::Cluster { nodes: 2, by: 1 },
            40 * S,
            100 * S,
            at(25),
        );
        assert_eq!(v.ranks.len(), 3);
        assert_eq!(v.reason.detector(), "quiescence");
        // Latched: the local rule stays silent until some rank is active again.
        assert!(first_verdict(&mut d, t0, 30, 2000, |_| vec![
            smp(0, 5.0, 0, 0),
            smp(1, 0.0, 0, 0)
        ])
        .is_none());
        d.rank_exited(0, 0, at(2001));
        d.rank_exited(1, 0, at(2001));
        d.rank_exited(2, 0, at(2001));
        let q = d.node_state(at(2002));
        assert_eq!((q.live, q.watched, q.quiet_for), (0, 0, Duration::ZERO));
    }

    #[test]
    fn off_mode_never_judges() {
        let t0 = Instant::now();
        let mut d = Detector::new(&settings(), HangMode::Off, t0);
        assert!(first_verdict(&mut d, t0, 0, 10_000, |_| vec![smp(0, 0.0, 0, 0)]).is_none());
        let mut s = settings();
        s.mode = HangMode::Off;
        let mut m = HangMonitor::new(&s, false, t0);
        assert!(!m.enabled());
        assert!(m.sample(t0 + Duration::from_secs(10_000), &[]).is_none());
    }

    proptest::proptest! {
        /// Never a verdict while any rank shows activity: for any random schedule of polls
        /// (no heartbeats, no exits), a verdict at a poll implies no live non-exempt rank was
        /// active in that poll, nor in any poll within the smallest budget before it.
        #[test]
        fn never_a_verdict_while_a_rank_is_active(
            steps in proptest::collection::vec(
                (1u64..120, proptest::collection::vec((0u8..6, proptest::bool::ANY), 1..4)),
                1..200,
            )
        ) {
            let st = HangSettings {
                steady_budget: 60 * S,
                startup_budget: 90 * S,
                ..HangSettings::default()
            };
            let t0 = Instant::now();
            let mut d = Detector::new(&st, HangMode::Kill, t0);
            let n = steps[0].1.len();
            let mut cum = vec![(0.0f64, 0u64, 0u64); n];
            let mut t = 0u64;
            let mut last_active: Vec<Option<u64>> = vec![None; n];
            let mut stopped_now = vec![false; n];
            for (dt, kinds) in &steps {
                t += dt;
                let mut samples = Vec::new();
                let mut active_now = false;
                for (i, c) in cum.iter_mut().enumerate() {
                    let (kind, stopped) = kinds.get(i).copied().unwrap_or((0, false));
                    match kind {
                        1 => c.0 += 0.06 * *dt as f64, // 6 % of a core
                        2 => c.1 += 65536,
                        3 => c.2 += 1,
                        4 => c.0 += 0.01 * *dt as f64, // 1 %: quiet
                        _ => {}
                    }
                    if (1..=3).contains(&kind) && !stopped {
                        active_now = true;
                        last_active[i] = Some(t);
                    }
                    stopped_now[i] = stopped;
                    let state = if stopped { ProcState::Stopped } else { ProcState::Sleeping };
                    samples.push(RankSample { rank: i as u32, pid: 1 + i as i32, sample: Some(ProcSample {
                        cpu_secs: c.0, io_bytes: c.1, output_bytes: c.2, state, traced: false,
                    })});
                }
                if let Some(v) = d.observe(t0 + Duration::from_secs(t), &samples) {
                    proptest::prop_assert!(!active_now, "verdict at t={} while a rank was active: {:?}", t, v);
                    for i in 0..n {
                        if let (false, Some(la)) = (stopped_now[i], last_active[i]) {
                            proptest::prop_assert!(t - la >= 60, "verdict {} s after rank {} was active", t - la, i);
                        }
                    }
                    proptest::prop_assert!(t >= 60);
                }
            }
        }
    }
}
