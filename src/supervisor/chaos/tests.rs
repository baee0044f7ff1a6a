//! The chaos runtime driven by hand: attempts started and ended, ticks, the back mark; the
//! schedule's clocks, the labels of injected failures, the measures and the end's verdicts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::*;

fn layout(per: usize) -> Layout {
    Layout {
        node: 0,
        nodes: 1,
        world_size: per,
        local: (0..per)
            .map(|r| Target {
                rank: r,
                pid: 4000 + r as i32,
            })
            .collect(),
    }
}

/// A rank's lines as the test writes them.
type Lines = Arc<Mutex<Vec<String>>>;

/// Each rank's last lines, which the test writes.
fn outputs(n: usize) -> (Vec<Lines>, Vec<crate::supervisor::watch::task::LastOutput>) {
    let bufs: Vec<Lines> = (0..n).map(|_| Arc::default()).collect();
    let last = bufs
        .iter()
        .map(|b| {
            let b = b.clone();
            Box::new(move || b.lock().unwrap().clone())
                as crate::supervisor::watch::task::LastOutput
        })
        .collect();
    (bufs, last)
}

fn chaos(text: &str, progress: Option<&str>) -> Chaos {
    Chaos::new(text, progress, true, false, "run")
        .unwrap()
        .unwrap()
}

#[test]
fn off_without_a_spec_and_refusals_up_front() {
    assert!(Chaos::new("", None, true, false, "r").unwrap().is_none());
    let e = Chaos::new("", Some("step (\\d+)"), true, false, "r")
        .err()
        .unwrap();
    assert!(e.contains("needs --chaos"), "{e}");
    let e = Chaos::new("hang:after=1s", None, false, false, "r")
        .err()
        .unwrap();
    assert!(e.contains("--hang-detect kill"), "{e}");
    let e = Chaos::new("node-loss:after=1s", None, true, false, "r")
        .err()
        .unwrap();
    assert!(e.contains("multi-node"), "{e}");
    // Multi-node without a seed: every node draws the same schedule from the run id.
    let a = Chaos::new("kill:mtbf=5s", None, true, true, "job7")
        .unwrap()
        .unwrap();
    let b = Chaos::new("kill:mtbf=5s", None, true, true, "job7")
        .unwrap()
        .unwrap();
    assert_eq!(a.schedule.seed, b.schedule.seed);
}

#[test]
fn a_kill_is_injected_once_due_labelled_and_measured() {
    let mut c = chaos("kill:after=0s,rank=1", None);
    assert!(c.start_lines()[0].starts_with("chaos mode: 1 fault spec(s), seed "));
    assert_eq!(c.wake(), None, "nothing before the first spawn");
    let (_, last) = outputs(2);
    c.attempt_started(0, layout(2), last);
    assert!(c.wake().is_some());
    assert!(
        c.tick(false).is_empty(),
        "never while the group is not untouched"
    );
    let acts = c.tick(true);
    assert_eq!(
        acts,
        vec![(
            0,
            Act::Signal {
                pid: 4001,
                signal: libc::SIGKILL
            }
        )]
    );
    assert_eq!(
        c.act_line(0),
        "chaos: injecting fault 1 (kill rank 1 in attempt 0)"
    );
    c.injected(0, &acts[0].1, Ok(()));
    assert!(matches!(c.events().as_slice(), [ChaosEvent::Inject(v)] if v["rank"] == 1));
    assert!(c.tick(true).is_empty(), "count 1: once");
    let failed = SystemTime::now();
    let label = c.attempt_over(Some(failed), Some(failed + Duration::from_millis(5)));
    assert_eq!(
        label.as_deref(),
        Some("injected kill rank 1, chaos fault 1")
    );
    assert!(c.records()[0].detected.unwrap() >= Duration::from_millis(5));
    c.restarted(failed);
    let (_, last) = outputs(2);
    c.attempt_started(1, layout(2), last);
    c.back(Duration::from_millis(300));
    assert!(c.records()[0].recovered.unwrap() >= Duration::from_millis(300));
    assert!(matches!(
        c.events().as_slice(),
        [ChaosEvent::Recovered { kind: "kill", .. }]
    ));
    // A failure of a later attempt without a fault is a real one: no label.
    assert_eq!(c.attempt_over(Some(SystemTime::now()), None), None);
    let end = c.finish(false);
    assert!(end.not_survived.is_empty(), "{:?}", end.not_survived);
    assert_eq!(end.table.len(), 2, "{:?}", end.table);
    assert_eq!(end.json["summary"]["kill"]["survived"], 1);
}

#[test]
fn no_second_fault_before_the_first_recovered_and_every_counts_from_recovery() {
    let mut c = chaos("kill:after=0s,every=1ms,count=3", None);
    let (_, last) = outputs(1);
    c.attempt_started(0, layout(1), last);
    let acts = c.tick(true);
    assert_eq!(acts.len(), 1);
    c.injected(acts[0].0, &acts[0].1, Ok(()));
    assert_eq!(c.wake(), None, "the next waits for this one's recovery");
    assert!(c.attempt_over(None, None).is_some());
    c.restarted(SystemTime::now());
    let (_, last) = outputs(1);
    c.attempt_started(1, layout(1), last);
    assert!(c.tick(true).is_empty(), "still awaiting back in user code");
    c.back(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(c.tick(true).len(), 1, "the second one after the recovery");
}

#[test]
fn a_job_that_never_comes_back_fails_the_check() {
    let mut c = chaos("hang:after=0s,rank=0", None);
    let (_, last) = outputs(2);
    c.attempt_started(0, layout(2), last);
    let acts = c.tick(true);
    assert_eq!(
        acts[0].1,
        Act::Signal {
            pid: 4000,
            signal: libc::SIGSTOP
        }
    );
    c.injected(acts[0].0, &acts[0].1, Ok(()));
    assert_eq!(
        c.stop_began(),
        vec![4000],
        "the stopped worker is continued at the stop"
    );
    assert_eq!(c.stop_began(), Vec::<i32>::new(), "once");
    assert!(c.attempt_over(None, Some(SystemTime::now())).is_some());
    let end = c.finish(false);
    assert_eq!(
        end.not_survived,
        vec!["chaos: fault 1 (hang rank 0 in attempt 0) was not survived: the job ended without coming back to user code"]
    );
    assert_eq!(end.json["survived"], false);
}

#[test]
fn progress_before_and_after_give_the_work_lost() {
    let mut c = chaos("kill:after=0s,rank=0", Some(r"step (\d+)"));
    let (bufs, last) = outputs(2);
    c.attempt_started(0, layout(2), last);
    *bufs[0].lock().unwrap() = vec!["step 36".into(), "step 37".into()];
    *bufs[1].lock().unwrap() = vec!["step 37".into()];
    let acts = c.tick(true);
    assert_eq!(c.records()[0].before, Some(37.0));
    c.injected(acts[0].0, &acts[0].1, Ok(()));
    c.attempt_over(Some(SystemTime::now()), None);
    c.restarted(SystemTime::now());
    let (bufs, last) = outputs(2);
    c.attempt_started(1, layout(2), last);
    c.back(Duration::from_millis(1));
    assert!(
        c.events()
            .iter()
            .all(|e| !matches!(e, ChaosEvent::Recovered { .. })),
        "progress still awaited"
    );
    *bufs[0].lock().unwrap() = vec!["resumed from 30".into(), "step 31".into()];
    std::thread::sleep(PROGRESS_POLL);
    c.tick(true);
    let r = &c.records()[0];
    assert_eq!((r.after, r.work_lost()), (Some(31.0), Some(6.0)));
    assert!(r.progress.is_some());
    assert!(matches!(
        c.events().as_slice(),
        [ChaosEvent::Recovered { .. }]
    ));
}

#[test]
fn at_attempt_waits_for_its_attempt_and_a_rank_beyond_the_world_is_skipped() {
    let mut c = chaos("kill:at-attempt=1", None);
    let (_, last) = outputs(1);
    c.attempt_started(0, layout(1), last);
    assert!(c.tick(true).is_empty());
    c.attempt_over(None, None);
    let (_, last) = outputs(1);
    c.attempt_started(1, layout(1), last);
    assert_eq!(c.tick(true).len(), 1);

    let mut c = chaos("kill:after=0s,rank=5", None);
    let (_, last) = outputs(2);
    c.attempt_started(0, layout(2), last);
    assert!(c.tick(true).is_empty());
    assert!(matches!(&c.records()[0].state, State::Skipped(w) if w.contains("rank=5")));
    let end = c.finish(true);
    assert!(end.table.is_empty(), "a skipped fault is no injection");
}

#[test]
fn slow_cycles_the_rank_and_is_survived_when_its_time_is_over() {
    let mut c = chaos("slow:after=0s,rank=1,for=0.3s,cpu=50", None);
    let (_, last) = outputs(2);
    c.attempt_started(0, layout(2), last);
    let acts = c.tick(true);
    assert!(
        matches!(acts.as_slice(), [(0, Act::Throttle { pid: 4001, .. })]),
        "{acts:?}"
    );
    c.injected(0, &acts[0].1, Ok(()));
    let mut signals = Vec::new();
    while c.records()[0].state == State::Pending {
        let wake = c.wake().expect("the cycle wakes the agent");
        std::thread::sleep(wake.saturating_duration_since(std::time::Instant::now()));
        for (_, act) in c.tick(true) {
            match act {
                Act::Toggle { pid: 4001, signal } => signals.push(signal),
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(
        signals.len() >= 2 && signals[0] == libc::SIGSTOP,
        "{signals:?}"
    );
    assert_ne!(signals.last(), Some(&libc::SIGSTOP), "never left stopped");
    assert!(matches!(
        c.events().last(),
        Some(ChaosEvent::Recovered { kind: "slow", .. })
    ));

    // A worker gone meanwhile ends the cycle, continuing the rank if it was stopped.
    let mut c = chaos("slow:after=0s,rank=0,for=10s,cpu=1", None);
    let (_, last) = outputs(1);
    c.attempt_started(0, layout(1), last);
    let acts = c.tick(true);
    c.injected(0, &acts[0].1, Ok(()));
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        c.tick(true),
        vec![(
            0,
            Act::Toggle {
                pid: 4000,
                signal: libc::SIGSTOP
            }
        )]
    );
    assert_eq!(
        c.tick(false),
        vec![(
            0,
            Act::Toggle {
                pid: 4000,
                signal: libc::SIGCONT
            }
        )]
    );
    assert!(c.tick(false).is_empty());
}

#[test]
fn a_fault_that_lands_on_another_node_labels_this_nodes_end_too() {
    // Node 0 of two, rank 3 lives on node 1: node 0 only learns that the fault was injected.
    let mut c = two_node_chaos("kill:after=0s,every=1ms,count=2,rank=3");
    let here = node_0_of_two();
    let (_, last) = outputs(2);
    c.attempt_started(0, here.clone(), last);
    assert!(c.tick(true).is_empty(), "nothing to signal here");
    assert!(c.records().is_empty(), "measured where it was injected");
    assert_eq!(
        c.attempt_over(Some(SystemTime::now()), None).as_deref(),
        Some("injected kill on another node, chaos spec 1")
    );
    c.restarted(SystemTime::now());
    let (_, last) = outputs(2);
    c.attempt_started(1, here, last);
    assert!(c.tick(true).is_empty());
    c.back(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    assert!(
        c.tick(true).is_empty(),
        "the second fault lands elsewhere as well"
    );
    assert!(c.attempt_over(None, None).is_some());
}

#[test]
fn a_fault_agreed_on_another_node_moves_this_nodes_clock_past_it() {
    // Node 0 of two; rank 3 lives on node 1. Node 0's timer had not fired yet when node 1's
    // kill ended the attempt: the root-cause exchange tells it, and its clock skips that fault
    // instead of drawing it again after the restart.
    let mut c = two_node_chaos("kill:after=1h,every=1h,count=2,rank=3");
    let here = node_0_of_two();
    let (_, last) = outputs(2);
    c.attempt_started(0, here.clone(), last);
    assert!(c.tick(true).is_empty(), "not due here yet");
    assert_eq!(c.attempt_over(Some(SystemTime::now()), None), None);
    let fault = Injected {
        label: "injected kill rank 3, chaos fault 1".into(),
        spec: 0,
        number: 0,
    };
    assert_eq!(c.agreed(&fault), "injected kill rank 3, chaos fault 1");
    assert_eq!(c.clocks[0].next, 1, "fault 0 is behind this node's clock");
    // Told twice (or after its own clock drew it): the clock never goes back.
    c.agreed(&fault);
    assert_eq!(c.clocks[0].next, 1);
    c.restarted(SystemTime::now());
    let (_, last) = outputs(2);
    c.attempt_started(1, here, last);
    let before = c.clocks[0].since;
    c.back(Duration::ZERO);
    assert_ne!(
        c.clocks[0].since, before,
        "the gap counts from this node's recovery"
    );
}

/// Node 0 of two, ranks 0 and 1 here (ranks 2 and 3 on node 1).
fn node_0_of_two() -> Layout {
    Layout {
        node: 0,
        nodes: 2,
        world_size: 4,
        local: vec![Target { rank: 0, pid: 10 }, Target { rank: 1, pid: 11 }],
    }
}

/// Chaos of a two-node job (hang detection on) from `spec`.
fn two_node_chaos(spec: &str) -> Chaos {
    Chaos::new(spec, None, true, true, "job").unwrap().unwrap()
}
