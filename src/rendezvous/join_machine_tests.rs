//! Unit and property tests of the c10d join loop's decisions (`join_machine.rs`).
use super::*;
use proptest::prelude::*;

const POLL: Duration = Duration::from_secs(1);

fn params(min: usize, max: usize) -> JoinParams {
    JoinParams {
        min,
        max,
        poll_max: POLL,
        join_timeout: Duration::from_secs(60),
        last_call_timeout: Duration::from_secs(5),
        bump_from: None,
        full_check_max: 256,
    }
}

fn head(round: u64, seq: u64, participants: usize, complete: bool) -> Head {
    let mut h = Head::of(&RdzvState::default(), seq, "");
    h.round = round;
    h.participants = participants;
    h.complete = complete;
    h
}

fn member(i: u32) -> Member {
    Member::new("10.0.0.1", i, 0, 1, 0)
}

#[test]
fn status_characters_are_placements() {
    assert_eq!(Placement::from_status('p'), Placement::Participant);
    assert_eq!(Placement::from_status('w'), Placement::Waiting);
    assert_eq!(Placement::from_status('r'), Placement::Redundant);
    assert_eq!(Placement::from_status('x'), Placement::Removed);
    assert_eq!(Placement::from_status('?'), Placement::Other);
    assert!(Placement::Waiting.listed() && Placement::Redundant.listed());
    assert!(!Placement::Participant.listed() && !Placement::Removed.listed());
}

#[test]
fn a_newcomer_runs_the_checks_announces_once_then_tries_to_admit() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(2, 4), t0);
    let h = head(0, 1, 0, false);
    let p = m.plan(&h, None, t0);
    assert_eq!(
        p,
        Plan {
            checks: true,
            announce: true,
            action: Action::TryAdmit
        }
    );
    m.announced(0);
    // Within the poll interval: no checks, no second announcement.
    let p = m.plan(&h, None, t0 + POLL / 2);
    assert_eq!(
        (p.checks, p.announce, p.action),
        (false, false, Action::TryAdmit)
    );
    assert!(m.plan(&h, None, t0 + POLL).checks);
    // A removed node announces again in a new round and reads the state.
    let p = m.plan(&head(1, 2, 0, false), Some(Placement::Removed), t0 + POLL);
    assert_eq!(
        (p.announce, p.action),
        (true, Action::Full { admit: false })
    );
}

#[test]
fn closed_bump_and_deadline_read_the_full_state() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(1, 4), t0);
    let mut h = head(0, 1, 1, true);
    h.closed = true;
    let p = m.plan(&h, Some(Placement::Participant), t0);
    assert_eq!((p.checks, p.action), (false, Action::Full { admit: false }));
    let mut p = params(1, 4);
    p.bump_from = Some((3, RoundReason::WorkerFailure));
    let mut m = JoinMachine::new(p, t0);
    let h = head(3, 9, 2, true);
    assert_eq!(
        m.plan(&h, Some(Placement::Participant), t0).action,
        Action::Full { admit: false }
    );
    let mut m = JoinMachine::new(params(2, 4), t0);
    let late = t0 + Duration::from_secs(60);
    assert_eq!(
        m.plan(&head(0, 1, 0, false), None, late).action,
        Action::Full { admit: false }
    );
}

#[test]
fn a_participant_of_a_complete_round_reads_its_summary_and_waits_two_polls_for_it() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(1, 4), t0);
    let h = head(2, 5, 3, true);
    let p = m.plan(&h, Some(Placement::Participant), t0);
    assert_eq!((p.checks, p.action), (false, Action::ReadSummary));
    assert!(!m.summary_missing(2, t0));
    assert!(!m.summary_missing(2, t0 + POLL));
    assert!(m.summary_missing(2, t0 + POLL * 2));
    // Another round restarts the clock.
    assert!(!m.summary_missing(3, t0 + POLL * 2));
}

#[test]
fn the_last_call_runs_out_after_its_timeout_and_restarts_with_a_new_key() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(2, 4), t0);
    let h = head(0, 1, 2, false);
    let me = Some(Placement::Participant);
    assert_eq!(m.plan(&h, me, t0).action, Action::Wait);
    assert_eq!(
        m.plan(&h, me, t0 + Duration::from_secs(4)).action,
        Action::Wait
    );
    assert_eq!(
        m.plan(&h, me, t0 + Duration::from_secs(5)).action,
        Action::TryAdmit
    );
    let mut h2 = h.clone();
    h2.last_call_seq += 1;
    assert_eq!(
        m.plan(&h2, me, t0 + Duration::from_secs(6)).action,
        Action::Wait
    );
    // Below min there is no last call.
    let mut m = JoinMachine::new(params(3, 4), t0);
    assert_eq!(
        m.plan(&h, me, t0 + Duration::from_secs(9)).action,
        Action::Wait
    );
}

#[test]
fn a_listed_node_rejoins_once_per_head_and_a_redundant_one_has_no_deadline_in_a_full_round() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(1, 2), t0);
    let h = head(0, 7, 1, true);
    let w = Some(Placement::Waiting);
    assert_eq!(m.plan(&h, w, t0).action, Action::Full { admit: false });
    m.learnt(w, Some(7));
    assert_eq!(m.plan(&h, w, t0).action, Action::Wait);
    let h8 = head(0, 8, 1, true);
    assert_eq!(m.plan(&h8, w, t0).action, Action::Full { admit: false });
    // Full round: the redundant node waits, its deadline moves with the clock.
    let full = head(0, 9, 2, true);
    let r = Some(Placement::Redundant);
    let late = t0 + Duration::from_secs(100);
    assert_eq!(m.plan(&full, r, late).action, Action::Wait);
    assert_eq!(m.deadline(), late + Duration::from_secs(60));
}

#[test]
fn the_admission_writer_admits_the_next_batch_at_once_after_its_pause() {
    let t0 = Instant::now();
    let mut m = JoinMachine::new(params(3, 8), t0);
    let pause = m.keep_admitting(Duration::from_millis(5));
    assert_eq!(pause, Duration::from_millis(20));
    assert_eq!(
        m.keep_admitting(Duration::from_secs(3)),
        Duration::from_millis(200)
    );
    let h = head(0, 3, 1, false);
    let me = Some(Placement::Participant);
    assert_eq!(m.plan(&h, me, t0).action, Action::Full { admit: true });
    assert_eq!(m.plan(&h, me, t0).action, Action::Wait);
}

#[test]
fn waits_are_on_the_summary_the_notice_or_nothing() {
    let t0 = Instant::now();
    let m = JoinMachine::new(params(2, 4), t0);
    let h = head(0, 1, 1, false);
    let w = m.wait(&h, Some(Placement::Participant), t0);
    assert_eq!((w.on, w.cap), (WaitOn::Summary, None));
    let w = m.wait(&h, None, t0);
    assert_eq!((w.on, w.poll, w.cap), (WaitOn::Notice, POLL, Some(POLL)));
    assert_eq!(m.wait(&h, Some(Placement::Waiting), t0).on, WaitOn::Sleep);
    let mut p = params(1, 4);
    p.full_check_max = 0;
    let m = JoinMachine::new(p, t0);
    let w = m.wait(&h, Some(Placement::Participant), t0);
    assert_eq!((w.on, w.poll), (WaitOn::Summary, POLL));
}

#[test]
fn to_write_places_the_announced_nodes_in_the_same_write() {
    let s = RdzvState::default();
    assert_eq!(to_write(&s, None, &[], 1, 4), None);
    let pending = [member(1), member(2)];
    let placed = to_write(&s, None, &pending, 1, 4).expect("places the joiners");
    assert_eq!(placed.participants.len(), 2);
    // Nothing new to place: nothing to write.
    assert_eq!(to_write(&placed, None, &pending, 1, 4), None);
    let mut next = s.clone();
    next.round = 5;
    assert_eq!(to_write(&s, Some(next.clone()), &pending, 1, 4), Some(next));
}

proptest! {
    /// Over any sequence of heads, placements and times: a closed round or a passed deadline
    /// always reads the full state; a node announces at most once per round and only as a
    /// newcomer of an incomplete round; the summary is read only by a participant of a complete
    /// round; the checks run at most once per poll interval; only a kept batch admits without
    /// trying for the key; the poll and the race back-off stay in their bounds.
    #[test]
    fn plans_keep_their_rules(
        steps in proptest::collection::vec(
            (0u64..4, 0usize..6, any::<bool>(), any::<bool>(), 0u8..6, 0u64..2500, 0u8..8),
            1..80,
        ),
    ) {
        let t0 = Instant::now();
        let (min, max) = (2, 4);
        let mut m = JoinMachine::new(params(min, max), t0);
        let mut now = t0;
        let mut last_checks: Option<Instant> = None;
        let mut kept = false;
        let mut announced = std::collections::HashSet::new();
        let mut last_cap = Duration::ZERO;
        let mut round = 0;
        for (next_round, participants, complete, closed, placed, dt, side) in steps {
            // Rounds only move forward.
            round += next_round.min(1);
            now += Duration::from_millis(dt);
            let mut h = head(round, dt, participants.min(max), complete);
            h.closed = closed;
            let placed = match placed {
                0 => None,
                1 => Some(Placement::Participant),
                2 => Some(Placement::Waiting),
                3 => Some(Placement::Redundant),
                4 => Some(Placement::Removed),
                _ => Some(Placement::Other),
            };
            let deadline = m.deadline();
            let p = m.plan(&h, placed, now);
            if closed || now >= deadline && m.deadline() == deadline {
                prop_assert!(matches!(p.action, Action::Full { .. }), "{p:?}");
            }
            if p.announce {
                prop_assert!(!h.complete && matches!(placed, None | Some(Placement::Removed)));
                prop_assert!(announced.insert(round), "announced twice in round {round}");
                m.announced(round);
            }
            if p.action == Action::ReadSummary {
                prop_assert!(h.complete && placed == Some(Placement::Participant));
            }
            if p.checks {
                if let Some(t) = last_checks {
                    prop_assert!(now.duration_since(t) >= POLL);
                }
                last_checks = Some(now);
            }
            if p.action == (Action::Full { admit: true }) {
                prop_assert!(kept, "admits without having kept the key");
            }
            kept = false;
            match side {
                0 => { let _ = m.keep_admitting(Duration::from_millis(dt)); kept = true; }
                1 => {
                    let cap = m.lost_race();
                    prop_assert!(cap >= last_cap && cap <= Duration::from_millis(100));
                    last_cap = cap;
                }
                2 => { m.won(); last_cap = Duration::ZERO; prop_assert_eq!(m.races_lost(), 0); }
                3 => m.waited(true),
                4 => m.waited(false),
                5 => m.learnt(placed, Some(dt)),
                _ => {}
            }
            prop_assert!(m.poll() >= Duration::from_millis(20) && m.poll() <= POLL);
            let w = m.wait(&h, placed, now);
            prop_assert!(w.poll <= POLL);
            if let Some(cap) = w.cap {
                prop_assert!(cap >= Duration::from_millis(20) && cap <= Duration::from_secs(5).max(POLL));
            }
        }
    }

    /// Without announced nodes a write is exactly `join_step`'s; with them, nothing is written
    /// only when placing them changes nothing.
    #[test]
    fn to_write_is_join_steps_write_plus_the_batch(n in 0u32..6, with_step in any::<bool>()) {
        let s = RdzvState::default();
        let pending: Vec<Member> = (0..n).map(member).collect();
        let step = with_step.then(|| {
            let mut t = s.clone();
            t.round = 1;
            t
        });
        let got = to_write(&s, step.clone(), &pending, 1, 4);
        match (step, pending.is_empty()) {
            (Some(new), _) if new.round != s.round => prop_assert_eq!(got, Some(new)),
            (None, true) => prop_assert_eq!(got, None),
            (None, false) => {
                let once = state::place_pending(&s, &pending, 1, 4);
                prop_assert_eq!(got.is_none(), once == s);
            }
            (Some(_), _) => {}
        }
    }
}
