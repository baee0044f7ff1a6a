//! The attempt's table tests: a fake spawner and fake effects (a recording executor with a
//! hand-moved clock) drive [`Group`] through event sequences as the agent's loop does.

use super::*;

#[test]
fn rendezvous_events_to_outcomes() {
    let regroup = |o: Outcome| match o {
        Outcome::Regroup { reason, lost } => Some((reason, lost)),
        _ => None,
    };
    let lost = vec!["n2".to_string()];
    // A static job cannot shrink: a lost peer is charged; c10d regroups for free.
    assert_eq!(
        regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), true)),
        Some((RoundReason::PeerLost, lost.clone()))
    );
    assert_eq!(
        regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), false)),
        Some((RoundReason::Membership, lost))
    );
    for ev in [
        RdzvEvent::NodesWaiting(1),
        RdzvEvent::RoundChanged {
            round: 3,
            reason: RoundReason::WorkerFailure,
        },
    ] {
        assert_eq!(
            regroup(rendezvous_end(ev, false)),
            Some((RoundReason::Membership, Vec::new()))
        );
    }
    for (ev, want) in [
        (
            RdzvEvent::Closed,
            "the rendezvous was closed: its store says so",
        ),
        (
            RdzvEvent::StoreUnreachable("x:1 refused".into()),
            "lost the rendezvous store: x:1 refused",
        ),
    ] {
        match rendezvous_end(ev, true) {
            Outcome::RendezvousLost(msg) => assert!(msg.starts_with(want), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}

// ---- The table tests: a fake world behind `Effects` and `Spawner`. ----

use std::cell::RefCell;
use std::rc::Rc;

use crate::supervisor::group::proctree::ProcEntry;
use crate::supervisor::group::restart::{decide, AttemptEnd, Decision, Repeats};
use crate::supervisor::group::spawn::Spawned;
use crate::supervisor::watch::verdict::TimerSignal;

/// Fake pids: far above any kernel's `pid_max` (2^22), so that the group's panic guard, which
/// signals for real, can never reach a real process.
const PID0: i32 = 10_000_000;
const GRACE: Duration = Duration::from_secs(30);
const TERM: i32 = libc::SIGTERM;
const KILL: i32 = libc::SIGKILL;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Fx {
    Group(i32, i32),
    Pid(i32, i32),
    Cgroup,
}

/// What the fake effects see and did: a hand-moved clock, the live process table, the log.
struct World {
    base: Instant,
    offset: Duration,
    wall0: SystemTime,
    alive: Vec<ProcEntry>,
    /// pid -> the worker whose tree holds it (what `/proc` would say).
    owners: HashMap<i32, i32>,
    /// pid -> its command line, where a test gives one (else `fake <pid>`).
    cmdlines: HashMap<i32, String>,
    log: Vec<Fx>,
}

struct FakeFx(Rc<RefCell<World>>);

impl Effects for FakeFx {
    fn now(&self) -> Instant {
        let w = self.0.borrow();
        w.base + w.offset
    }
    fn wall(&self) -> SystemTime {
        let w = self.0.borrow();
        w.wall0 + w.offset
    }
    fn signal_group(&mut self, pgid: i32, sig: i32) {
        self.0.borrow_mut().log.push(Fx::Group(pgid, sig));
    }
    fn signal_pid(&mut self, pid: i32, sig: i32) {
        self.0.borrow_mut().log.push(Fx::Pid(pid, sig));
    }
    fn kill_cgroup(&mut self, _dir: &std::path::Path, _wait: Duration) {
        self.0.borrow_mut().log.push(Fx::Cgroup);
    }
    fn own_tree(&self) -> Vec<ProcEntry> {
        self.0.borrow().alive.clone()
    }
    fn owning_worker(&self, pid: i32, workers: &[i32]) -> Option<i32> {
        let w = self.0.borrow();
        let owner = if workers.contains(&pid) {
            pid
        } else {
            *w.owners.get(&pid)?
        };
        workers.contains(&owner).then_some(owner)
    }
    fn command_line(&self, pid: i32) -> String {
        self.0
            .borrow()
            .cmdlines
            .get(&pid)
            .cloned()
            .unwrap_or_else(|| format!("fake {pid}"))
    }
}

/// Hands out fake pids; fails at `fail_at` (a worker that cannot be started).
struct FakeSpawner {
    world: Rc<RefCell<World>>,
    fail_at: Option<usize>,
}

impl Spawner for FakeSpawner {
    fn spawn(&mut self, lr: usize, _id: &RankIdentity) -> Result<Spawned, String> {
        if self.fail_at == Some(lr) {
            return Err(format!("cannot start local rank {lr}: no such file"));
        }
        let pid = PID0 + lr as i32;
        self.world.borrow_mut().alive.push(proc_entry(pid, pid));
        Ok(Spawned {
            pid,
            output: None,
            activity: output::Activity::default(),
            error_file: None,
        })
    }
}

fn proc_entry(pid: i32, pgid: i32) -> ProcEntry {
    ProcEntry {
        pid,
        ppid: 1,
        pgid,
        sid: pgid,
        zombie: false,
    }
}

fn settings() -> GroupSettings {
    GroupSettings {
        grace: GRACE,
        watchdog_pid: None,
        cgroup: Some(PathBuf::from("/sys/fs/cgroup/fake")),
        program: PathBuf::from("train.py"),
        leftovers: LeftoverPolicy::Kill,
        static_job: false,
    }
}

/// One attempt of `n` local ranks (global ranks 4.. as on node 1 of a 4-per-node job).
struct Harness {
    world: Rc<RefCell<World>>,
    group: Group,
}

impl Harness {
    fn new(n: usize) -> Harness {
        Harness::with(n, None, settings())
    }

    fn with(n: usize, fail_at: Option<usize>, settings: GroupSettings) -> Harness {
        let world = Rc::new(RefCell::new(World {
            base: Instant::now(),
            offset: Duration::ZERO,
            wall0: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            alive: Vec::new(),
            owners: HashMap::new(),
            cmdlines: HashMap::new(),
            log: Vec::new(),
        }));
        let ids: Vec<RankIdentity> = (0..n)
            .map(|lr| RankIdentity {
                role: "default".into(),
                rank: 4 + lr,
                local_rank: lr,
                hostname: "node1".into(),
            })
            .collect();
        let mut spawner = FakeSpawner {
            world: world.clone(),
            fail_at,
        };
        let group = Group::spawn(
            &ids,
            &mut spawner,
            settings,
            Box::new(FakeFx(world.clone())),
        );
        Harness { world, group }
    }

    fn pid(lr: usize) -> i32 {
        PID0 + lr as i32
    }

    /// Local rank `lr` exits with `status` (gone from the process table).
    fn exit(&self, lr: usize, status: WorkerStatus) -> Event {
        let pid = Harness::pid(lr);
        self.world.borrow_mut().alive.retain(|p| p.pid != pid);
        Event::Reaped { pid, status }
    }

    fn advance(&self, d: Duration) {
        self.world.borrow_mut().offset += d;
    }

    fn now(&self) -> Instant {
        let w = self.world.borrow();
        w.base + w.offset
    }

    fn step(&mut self, events: Vec<Event>) -> Flow {
        self.group.handle(events)
    }

    /// The effects since the last call.
    fn effects(&self) -> Vec<Fx> {
        std::mem::take(&mut self.world.borrow_mut().log)
    }

    fn outcome(self) -> Outcome {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (stop_output, _) = watch::channel(false);
                self.group.finish(&stop_output).await
            })
    }
}

/// The stop verdict off (these cases are about the budget, not about repeated failures).
fn no_repeats() -> Repeats {
    Repeats::default()
}

fn code(c: i32) -> WorkerStatus {
    WorkerStatus::Exited(c)
}

fn killed(sig: i32) -> WorkerStatus {
    WorkerStatus::Signaled(sig)
}

/// `sig` to every worker's process group, in local-rank order.
fn to_groups(n: usize, sig: i32) -> Vec<Fx> {
    (0..n).map(|lr| Fx::Group(Harness::pid(lr), sig)).collect()
}

fn finding(kill: bool, suspect: u32) -> HangFinding {
    HangFinding {
        kill,
        suspect: Some(suspect),
        summary: format!("no activity on any rank, suspect rank {suspect}"),
        block: String::new(),
    }
}

fn failed_ranks(o: &Outcome) -> Vec<(usize, WorkerStatus)> {
    match o {
        Outcome::Failed { failures, .. } | Outcome::Interrupted { failures, .. } => {
            failures.iter().map(|f| (f.rank, f.status)).collect()
        }
        other => panic!("not a failure: {other:?}"),
    }
}

#[test]
fn exits_in_any_order_succeed_and_nothing_is_signalled() {
    let mut h = Harness::new(3);
    assert_eq!(h.step(vec![h.exit(2, code(0))]), Flow::Continue);
    assert_eq!(h.step(vec![h.exit(0, code(0))]), Flow::Continue);
    assert_eq!(h.step(vec![h.exit(1, code(0))]), Flow::Over);
    assert_eq!(h.effects(), []);
    assert!(matches!(h.outcome(), Outcome::Succeeded));
}

#[test]
fn the_first_failure_stops_its_peers_with_sigterm() {
    let mut h = Harness::new(3);
    assert_eq!(h.step(vec![h.exit(1, code(3))]), Flow::Continue);
    assert_eq!(h.effects(), to_groups(3, TERM));
    assert!(matches!(h.group.stop().phase(), Phase::Grace(_)));
    assert!(!h.group.judging(), "no more hang verdicts once stopping");
    let flow = h.step(vec![h.exit(0, killed(TERM)), h.exit(2, killed(TERM))]);
    assert_eq!(flow, Flow::Over);
    let o = h.outcome();
    assert_eq!(
        failed_ranks(&o),
        [(5, code(3)), (4, killed(TERM)), (6, killed(TERM))]
    );
    let Outcome::Failed { failures, hang, .. } = o else {
        unreachable!()
    };
    assert!(hang.is_none());
    // The report tells the failing rank from those rdrun stopped.
    assert!(failures[0].stop_sent_at.is_none());
    assert!(failures[1].stop_sent_at.is_some() && failures[2].stop_sent_at.is_some());
}

#[test]
fn failures_in_one_batch_are_recorded_in_local_rank_order_with_one_timestamp() {
    let mut h = Harness::new(3);
    h.step(vec![h.exit(2, code(1)), h.exit(0, killed(libc::SIGSEGV))]);
    h.step(vec![h.exit(1, killed(TERM))]);
    let o = h.outcome();
    assert_eq!(
        failed_ranks(&o),
        [(4, killed(libc::SIGSEGV)), (6, code(1)), (5, killed(TERM))]
    );
    let Outcome::Failed { failures, .. } = o else {
        unreachable!()
    };
    assert_eq!(failures[0].observed_at, failures[1].observed_at);
}

#[test]
fn a_worker_that_ignores_sigterm_gets_sigkill_at_the_end_of_the_grace() {
    let mut h = Harness::new(2);
    h.step(vec![h.exit(0, code(1))]);
    h.effects();
    let Phase::Grace(deadline) = h.group.stop().phase() else {
        panic!("not in the grace")
    };
    assert_eq!(deadline, h.now() + GRACE);
    h.advance(GRACE);
    assert_eq!(h.step(vec![Event::Deadline]), Flow::Continue);
    let mut want = to_groups(2, KILL);
    want.push(Fx::Cgroup);
    want.push(Fx::Pid(Harness::pid(1), KILL));
    assert_eq!(h.effects(), want);
    assert!(matches!(h.group.stop().phase(), Phase::Killed(_)));
    h.step(vec![h.exit(1, killed(KILL))]);
    assert!(matches!(h.outcome(), Outcome::Failed { .. }));
}

#[test]
fn what_survives_the_sigkill_wait_is_abandoned_and_reported_killed() {
    let mut h = Harness::new(2);
    h.step(vec![h.exit(0, code(1))]);
    h.advance(GRACE);
    h.step(vec![Event::Deadline]);
    h.advance(KILL_WAIT);
    assert_eq!(h.step(vec![Event::Deadline]), Flow::Over);
    let o = h.outcome();
    let Outcome::Failed { failures, .. } = &o else {
        panic!("{o:?}")
    };
    assert_eq!(failures.len(), 2);
    assert!(failures[1].abandoned && failures[1].status == killed(KILL));
}

#[test]
fn a_deadline_while_running_changes_nothing() {
    let mut h = Harness::new(1);
    assert_eq!(h.step(vec![Event::Deadline]), Flow::Continue);
    assert_eq!(h.effects(), []);
    assert_eq!(h.group.stop().phase(), Phase::Running);
}

#[test]
fn a_failure_during_a_shutdowns_grace_is_reported_with_the_interruption() {
    let mut h = Harness::new(2);
    h.step(vec![Event::Signal(TERM)]);
    assert_eq!(h.effects(), to_groups(2, TERM));
    h.step(vec![h.exit(0, code(1))]);
    assert_eq!(h.effects(), [], "already stopping: no second stop");
    assert_eq!(h.step(vec![h.exit(1, killed(TERM))]), Flow::Over);
    match h.outcome() {
        Outcome::Interrupted { signal, failures } => {
            assert_eq!(signal, TERM);
            assert_eq!(failures[0].status, code(1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_ctrl_c_in_the_grace_kills_at_once() {
    let mut h = Harness::new(2);
    h.step(vec![Event::Signal(libc::SIGINT)]);
    assert_eq!(h.effects(), to_groups(2, libc::SIGINT));
    h.step(vec![Event::Signal(libc::SIGINT)]);
    let effects = h.effects();
    assert_eq!(&effects[..2], to_groups(2, KILL).as_slice());
    assert!(matches!(h.group.stop().phase(), Phase::Killed(_)));
}

#[test]
fn sigusr1_is_forwarded_and_nothing_stops() {
    let mut h = Harness::new(2);
    h.step(vec![Event::Signal(libc::SIGUSR1)]);
    assert_eq!(h.effects(), to_groups(2, libc::SIGUSR1));
    assert_eq!(h.group.stop().phase(), Phase::Running);
    assert!(h.group.stop().sent_at().is_none());
    assert!(h.group.judging());
    h.step(vec![h.exit(0, code(0))]);
    assert_eq!(h.step(vec![h.exit(1, code(0))]), Flow::Over);
    assert!(matches!(h.outcome(), Outcome::Succeeded));
}

#[test]
fn a_worker_that_cannot_start_stops_the_ones_started_as_a_launch_error() {
    let mut h = Harness::with(3, Some(1), settings());
    assert!(h.group.launch_failed());
    assert_eq!(h.effects(), [Fx::Group(Harness::pid(0), TERM)]);
    assert_eq!(h.group.live(), 1);
    // A shutdown signal that came in during the spawn is handled first, and forwarded.
    h.step(vec![Event::Signal(TERM)]);
    assert_eq!(h.effects(), [Fx::Group(Harness::pid(0), TERM)]);
    assert_eq!(h.step(vec![h.exit(0, killed(TERM))]), Flow::Over);
    match h.outcome() {
        Outcome::LauncherError(msg) => assert!(msg.contains("local rank 1"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_signal_queued_during_the_spawn_interrupts_the_attempt() {
    let mut h = Harness::new(2);
    // The agent's first batch: the signal arrived while the workers were being started.
    h.step(vec![
        Event::Signal(libc::SIGHUP),
        h.exit(1, killed(libc::SIGHUP)),
    ]);
    assert_eq!(h.effects(), to_groups(2, libc::SIGHUP));
    assert_eq!(h.step(vec![h.exit(0, killed(libc::SIGHUP))]), Flow::Over);
    assert!(matches!(
        h.outcome(),
        Outcome::Interrupted { signal, .. } if signal == libc::SIGHUP
    ));
}

#[test]
fn a_membership_change_stops_the_group_for_the_next_round() {
    let mut h = Harness::new(2);
    h.step(vec![Event::Rendezvous(RdzvEvent::NodesWaiting(1))]);
    assert_eq!(h.effects(), to_groups(2, TERM));
    h.step(vec![h.exit(0, killed(TERM)), h.exit(1, code(0))]);
    match h.outcome() {
        Outcome::Regroup { reason, lost } => {
            assert_eq!(reason, RoundReason::Membership);
            assert!(lost.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_membership_change_during_a_failure_stop_leaves_the_failure_the_cause() {
    let mut h = Harness::new(2);
    h.step(vec![h.exit(1, code(2))]);
    h.step(vec![Event::Rendezvous(RdzvEvent::RoundChanged {
        round: 7,
        reason: RoundReason::WorkerFailure,
    })]);
    h.step(vec![h.exit(0, killed(TERM))]);
    let o = h.outcome();
    assert_eq!(o.attempt_end(), AttemptEnd::Failed);
}

#[test]
fn a_lost_store_outranks_this_nodes_own_failure() {
    let mut h = Harness::new(2);
    h.step(vec![h.exit(0, code(1))]);
    h.step(vec![Event::Rendezvous(RdzvEvent::StoreUnreachable(
        "n0:29500 refused".into(),
    ))]);
    h.step(vec![h.exit(1, killed(TERM))]);
    assert!(matches!(h.outcome(), Outcome::RendezvousLost(m) if m.contains("n0:29500")));
}

#[test]
fn a_peer_lost_close_to_the_failure_is_remembered_a_late_one_is_not() {
    for (gap, remembered) in [
        (Duration::from_secs(4), true),
        (Duration::from_secs(11), false),
    ] {
        let mut h = Harness::new(1);
        h.step(vec![h.exit(0, code(1))]);
        h.advance(gap);
        h.step(vec![Event::Rendezvous(RdzvEvent::PeersLost(vec![
            "n2".into()
        ]))]);
        let end = h.outcome().attempt_end();
        let want = if remembered {
            AttemptEnd::FailedWithPeerLoss { charged: false }
        } else {
            AttemptEnd::Failed
        };
        assert_eq!(end, want, "gap {gap:?}");
    }
}

#[test]
fn the_worker_store_stopping_ends_the_attempt_as_rdruns_error() {
    let mut h = Harness::new(1);
    h.step(vec![Event::StoreStopped("accept failed".into())]);
    assert_eq!(h.effects(), to_groups(1, TERM));
    h.step(vec![h.exit(0, killed(TERM))]);
    assert!(matches!(h.outcome(), Outcome::LauncherError(m) if m.contains("accept failed")));
}

#[test]
fn a_kill_verdict_stops_an_untouched_group_with_the_hang_as_the_cause() {
    let mut h = Harness::new(2);
    let judged_at = h.now();
    h.step(vec![Event::Watch(WatchVerdict::Hang {
        found: finding(true, 5),
        judged_at,
    })]);
    assert_eq!(h.effects(), to_groups(2, TERM));
    assert!(!h.group.judging());
    // Ranks that exit 0 on rdrun's stop are part of the hang's failure.
    h.step(vec![h.exit(0, code(0)), h.exit(1, killed(TERM))]);
    match h.outcome() {
        Outcome::Failed { hang, failures, .. } => {
            assert_eq!(hang.and_then(|f| f.suspect), Some(5));
            assert_eq!(failures.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_verdict_racing_a_worker_exit_is_the_cause_only_if_judged_before_it() {
    for (judged_before, is_cause) in [(true, true), (false, false)] {
        let mut h = Harness::new(2);
        let sampled = h.now();
        h.advance(Duration::from_secs(2));
        // The capture ran for a while; meanwhile a rank failed (its collective timed out).
        h.step(vec![h.exit(1, code(1))]);
        h.effects();
        h.advance(Duration::from_secs(1));
        let judged_at = if judged_before { sampled } else { h.now() };
        h.step(vec![Event::Watch(WatchVerdict::Hang {
            found: finding(true, 4),
            judged_at,
        })]);
        assert_eq!(h.effects(), [], "the stop is already under way");
        h.step(vec![h.exit(0, killed(TERM))]);
        match h.outcome() {
            Outcome::Failed { hang, .. } => assert_eq!(hang.is_some(), is_cause),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn an_observe_verdict_is_only_shown() {
    let mut h = Harness::new(1);
    let judged_at = h.now();
    h.step(vec![Event::Watch(WatchVerdict::Hang {
        found: finding(false, 4),
        judged_at,
    })]);
    assert_eq!(h.effects(), []);
    assert!(h.group.judging());
    h.step(vec![h.exit(0, code(0))]);
    assert!(matches!(h.outcome(), Outcome::Succeeded));
}

#[test]
fn a_dstate_verdict_fails_the_group_and_disables_restarts() {
    let mut h = Harness::new(2);
    let judged_at = h.now();
    h.step(vec![Event::Watch(WatchVerdict::DState {
        found: finding(true, 4),
        judged_at,
    })]);
    assert!(h.group.disables_restarts());
    assert_eq!(h.effects(), to_groups(2, TERM));
    h.step(vec![h.exit(0, killed(TERM)), h.exit(1, killed(TERM))]);
    let end = h.outcome().attempt_end();
    // Restarts were left (0 of 3 used): the D state takes them away, as torch.
    assert_eq!(decide(end, 0, 3, true, no_repeats()), Decision::GiveUp);
    assert_eq!(
        decide(end, 0, 3, false, no_repeats()),
        Decision::Restart { restart_count: 1 }
    );
}

#[test]
fn an_expired_filetimer_signals_only_a_process_still_in_a_live_workers_tree() {
    let mut h = Harness::new(2);
    let child = PID0 + 100;
    let gone = PID0 + 200;
    h.world.borrow_mut().owners.insert(child, Harness::pid(1));
    let signal = |pid: i32| TimerSignal {
        pid,
        sig: KILL,
        rank: 5,
        local_rank: 1,
        scopes: vec!["step".into()],
    };
    h.step(vec![Event::Watch(WatchVerdict::TimerExpired {
        found: Some(finding(true, 5)),
        signals: vec![signal(child), signal(gone)],
    })]);
    assert_eq!(h.effects(), [Fx::Pid(child, KILL)]);
    // Its worker then dies: the capture is the failure's root cause.
    h.step(vec![h.exit(1, killed(KILL))]);
    h.step(vec![h.exit(0, killed(TERM))]);
    match h.outcome() {
        Outcome::Failed { hang, .. } => assert_eq!(hang.and_then(|f| f.suspect), Some(5)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_filetimer_rank_that_survived_its_signal_is_not_the_hang() {
    // Issue 38 item 13: the expiry's SIGUSR1 is handled, the rank lives on; later another rank
    // fails on its own and rdrun's stop ends the first: the root cause is the real failure.
    const USR1: i32 = 10;
    let mut h = Harness::new(2);
    h.step(vec![Event::Watch(WatchVerdict::TimerExpired {
        found: Some(finding(true, 5)),
        signals: vec![TimerSignal {
            pid: Harness::pid(1),
            sig: USR1,
            rank: 5,
            local_rank: 1,
            scopes: vec!["step".into()],
        }],
    })]);
    assert_eq!(h.effects(), [Fx::Pid(Harness::pid(1), USR1)]);
    h.step(vec![h.exit(0, code(3))]);
    h.step(vec![h.exit(1, killed(TERM))]);
    match h.outcome() {
        Outcome::Failed { hang, failures, .. } => {
            assert_eq!(hang.map(|f| f.suspect), None);
            assert_eq!(failures[0].status, code(3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn restarts_run_out_after_max_restarts_failed_attempts() {
    let max_restarts = 2;
    let mut restart_count = 0;
    let mut attempts = 0;
    let decision = loop {
        attempts += 1;
        let mut h = Harness::new(2);
        h.step(vec![h.exit(0, code(1))]);
        h.step(vec![h.exit(1, killed(TERM))]);
        match decide(
            h.outcome().attempt_end(),
            restart_count,
            max_restarts,
            false,
            no_repeats(),
        ) {
            Decision::Restart {
                restart_count: next,
            } => restart_count = next,
            other => break other,
        }
        assert!(attempts < 10, "no end");
    };
    assert_eq!(decision, Decision::GiveUp);
    assert_eq!((attempts, restart_count), (3, 2));
}

#[test]
fn what_would_stop_the_workers_waits_for_a_kill_verdicts_capture() {
    let mut h = Harness::new(2);
    let judged_at = h.now();
    h.step(vec![Event::Watch(WatchVerdict::Capturing { judged_at })]);
    assert!(h.group.capturing());
    // During the capture: another node is lost and a rank fails; nothing is stopped yet.
    h.advance(Duration::from_secs(3));
    h.step(vec![
        Event::Rendezvous(RdzvEvent::PeersLost(vec!["n1".into()])),
        h.exit(1, code(1)),
    ]);
    assert_eq!(h.effects(), [], "nothing stopped under the capture");
    assert_eq!(h.group.stop().phase(), Phase::Running);
    // The verdict: the hang is the root cause (judged before the failure), then the stop.
    h.step(vec![Event::Watch(WatchVerdict::Hang {
        found: finding(true, 4),
        judged_at,
    })]);
    assert!(!h.group.capturing());
    assert_eq!(h.effects(), to_groups(2, TERM));
    h.step(vec![h.exit(0, killed(TERM))]);
    match h.outcome() {
        // This node's failure, with the hang as its root cause; the peer lost close to it is
        // remembered (what follows is the regroup's, not a charged restart).
        Outcome::Failed {
            hang, peer_loss, ..
        } => {
            assert_eq!(hang.and_then(|f| f.suspect), Some(4));
            assert_eq!(
                peer_loss,
                Some((RoundReason::Membership, vec!["n1".into()]))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_shutdown_signal_does_not_wait_for_a_capture() {
    let mut h = Harness::new(1);
    let judged_at = h.now();
    h.step(vec![Event::Watch(WatchVerdict::Capturing { judged_at })]);
    h.step(vec![Event::Signal(libc::SIGINT)]);
    assert_eq!(h.effects(), to_groups(1, libc::SIGINT));
}

#[path = "attempt_leftover_tests.rs"]
mod leftovers;
