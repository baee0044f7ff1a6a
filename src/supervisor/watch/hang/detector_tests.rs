//! Unit tests of `detector.rs` (moved out so that the module fits in a head).

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

/// `--chaos hang`: a rank rdrun stopped itself is the hang, not a debugger's pause — a
/// one-rank job stopped so is found after the budget, as a quiet one would be.
#[test]
fn a_rank_rdrun_stopped_is_watched_not_exempt() {
    let t0 = Instant::now();
    let mut d = Detector::new(&settings(), HangMode::Kill, t0);
    d.stopped_by_rdrun(0, t0);
    let f = |_| vec![with_state(smp(0, 0.0, 0, 0), ProcState::Stopped, false)];
    let (t, v) = first_verdict(&mut d, t0, 0, 5000, f).expect("a verdict");
    assert_eq!(t, 200, "the startup budget, as for any quiet rank");
    assert!(!v.ranks[0].exempt);
    // The same stop by someone else: exempt, never a verdict.
    let mut d = Detector::new(&settings(), HangMode::Kill, t0);
    let f = |_| vec![with_state(smp(0, 0.0, 0, 0), ProcState::Stopped, false)];
    assert!(first_verdict(&mut d, t0, 0, 5000, f).is_none());
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
