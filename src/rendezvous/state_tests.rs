//! Unit and property tests of the pure rendezvous state (`state.rs`): encoding, ordering,
//! watch targets, the join decisions, notices, rosters and summaries.
use super::*;

fn m(addr: &str, pid: u32) -> Member {
    Member::new(addr, pid, 0, 2, 1000 + pid as u16)
}

fn view<'a>(me: &'a Member, min: usize, max: usize) -> JoinView<'a> {
    JoinView {
        me,
        min,
        max,
        past_deadline: false,
        last_call_expired: false,
        bump_from: None,
        pending: &[],
    }
}

/// Applies steps until the agent waits or finishes; returns the final step.
fn settle(state: &mut RdzvState, v: &JoinView<'_>) -> JoinStep {
    for _ in 0..10 {
        match join_step(state, v) {
            JoinStep::Write(s) => *state = s,
            other => return other,
        }
    }
    panic!("join_step did not settle");
}

#[test]
fn encode_decode_round_trip_and_foreign_state() {
    let mut s = RdzvState::default();
    s.participants.push(m("10.0.0.1", 5));
    assert_eq!(RdzvState::decode(&s.encode()).unwrap(), s);
    assert_eq!(RdzvState::decode(NO_STATE).unwrap(), RdzvState::default());
    // torchrun's pickled state is base64 text.
    assert!(matches!(
        RdzvState::decode(b"Y2FuaW1hZGFt"),
        Err(StateError::Foreign(_))
    ));
    let mut other = s.clone();
    other.format = 99;
    assert_eq!(
        RdzvState::decode(&other.encode()),
        Err(StateError::Format { found: 99 })
    );
}

#[test]
fn order_is_numeric_by_address_then_pid_and_keeps_previous_order() {
    let mut ps = vec![
        m("10.0.0.10", 1),
        m("node-b", 1),
        m("10.0.0.2", 9),
        m("::1", 1),
        m("10.0.0.2", 3),
    ];
    order_participants(&mut ps, &[]);
    let addrs: Vec<String> = ps.iter().map(|p| p.id.clone()).collect();
    assert_eq!(
        addrs,
        [
            "10.0.0.2_3_0",
            "10.0.0.2_9_0",
            "10.0.0.10_1_0",
            "::1_1_0",
            "node-b_1_0"
        ]
    );
    // Survivors of the previous round keep their order; newcomers follow.
    let prev = vec!["node-b_1_0".to_string(), "10.0.0.10_1_0".to_string()];
    order_participants(&mut ps, &prev);
    let ids: Vec<&str> = ps.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "node-b_1_0",
            "10.0.0.10_1_0",
            "10.0.0.2_3_0",
            "10.0.0.2_9_0",
            "::1_1_0"
        ]
    );
}

#[test]
fn every_node_is_watched_by_two_and_watches_at_most_a_few() {
    let ms: Vec<Member> = (1..=7).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
    let s = RdzvState {
        participants: ms[..4].to_vec(),
        wait_list: vec![ms[4].clone()],
        redundancy_list: vec![ms[5].clone()],
        expected: vec![ms[6].id.clone(), ms[0].id.clone()],
        ..Default::default()
    };
    let all: Vec<&str> = ms.iter().map(|m| m.id.as_str()).collect();
    let mut watched_by: std::collections::HashMap<&str, Vec<&str>> = Default::default();
    for w in &all {
        let t = watch_targets(&s, w);
        assert!(t.len() <= 2 * WATCHERS, "{w}: {t:?}");
        for id in &t {
            assert_ne!(id, w);
            let id = *all.iter().find(|a| *a == id).unwrap();
            watched_by.entry(id).or_default().push(w);
        }
    }
    for id in &all {
        assert!(
            watched_by.get(id).is_some_and(|v| v.len() >= WATCHERS),
            "{id} watched by {:?}",
            watched_by.get(id)
        );
    }
    // Participants watch their successors in list order (cyclic).
    assert_eq!(
        watch_targets(&s, &ms[3].id)[..2],
        [ms[0].id.clone(), ms[1].id.clone()]
    );
    // Without participants the others watch each other; a stranger watches nobody.
    let mut s2 = s.clone();
    s2.participants.clear();
    assert_eq!(
        watch_targets(&s2, &ms[4].id),
        [ms[5].id.clone(), ms[6].id.clone()]
    );
    assert!(watch_targets(&s, "nobody").is_empty());
    // Two nodes watch each other; one alone watches nobody.
    let mut s3 = RdzvState {
        participants: ms[..2].to_vec(),
        ..Default::default()
    };
    assert_eq!(watch_targets(&s3, &ms[0].id), [ms[1].id.clone()]);
    s3.participants.truncate(1);
    assert!(watch_targets(&s3, &ms[0].id).is_empty());
}

#[test]
fn base_rank_table() {
    let cases: &[(&[usize], usize, (usize, usize))] = &[
        (&[2, 2], 0, (0, 4)),
        (&[2, 2], 1, (2, 4)),
        (&[1, 3, 2], 2, (4, 6)),
        (&[4], 0, (0, 4)),
    ];
    for (nprocs, gr, want) in cases {
        assert_eq!(base_rank(nprocs, *gr), *want, "{nprocs:?} {gr}");
    }
}

#[test]
fn completes_immediately_at_max() {
    let (a, b) = (m("10.0.0.2", 1), m("10.0.0.1", 1));
    let mut s = RdzvState::default();
    assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Wait);
    assert!(!s.complete);
    assert_eq!(s.last_call_seq, 1, "min reached starts the last call");
    assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
    assert!(s.complete);
    assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Done);
    // Ordered by address: 10.0.0.1 is group rank 0 and provides MASTER_ADDR/PORT.
    let asg = assignment(&s, &a.id, "p").unwrap();
    assert_eq!((asg.group_rank, asg.base_rank, asg.world_size), (1, 2, 4));
    assert_eq!(
        (asg.master_addr.as_str(), asg.master_port),
        ("10.0.0.1", 1001)
    );
    assert_eq!(asg.store_prefix, "p.0");
}

#[test]
fn last_call_completes_after_min() {
    let (a, b) = (m("10.0.0.1", 1), m("10.0.0.2", 1));
    let mut s = RdzvState::default();
    assert_eq!(settle(&mut s, &view(&a, 2, 4)), JoinStep::Wait);
    assert_eq!(s.last_call_seq, 0);
    assert_eq!(settle(&mut s, &view(&b, 2, 4)), JoinStep::Wait);
    assert_eq!(s.last_call_seq, 1);
    // The last call has not expired: keep waiting.
    assert_eq!(settle(&mut s, &view(&a, 2, 4)), JoinStep::Wait);
    let mut v = view(&a, 2, 4);
    v.last_call_expired = true;
    assert_eq!(settle(&mut s, &v), JoinStep::Done);
    assert!(s.complete);
    assert_eq!(s.participants.len(), 2);
}

#[test]
fn below_min_never_completes_and_times_out_leaving_the_lists() {
    let a = m("10.0.0.1", 1);
    let mut s = RdzvState::default();
    let mut v = view(&a, 2, 2);
    v.last_call_expired = true;
    assert_eq!(settle(&mut s, &v), JoinStep::Wait);
    v.past_deadline = true;
    match join_step(&s, &v) {
        JoinStep::TimedOut(Some(new)) => assert!(new.participants.is_empty()),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        join_step(&RdzvState::default(), &v),
        JoinStep::TimedOut(None)
    );
}

#[test]
fn late_joiner_waits_then_bump_admits_it_without_charging() {
    let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
    let mut s = RdzvState::default();
    settle(&mut s, &view(&a, 2, 3));
    settle(&mut s, &view(&b, 2, 3));
    let mut v = view(&a, 2, 3);
    v.last_call_expired = true;
    assert_eq!(settle(&mut s, &v), JoinStep::Done);
    // c arrives late: wait list.
    assert_eq!(settle(&mut s, &view(&c, 2, 3)), JoinStep::Wait);
    assert_eq!(s.num_nodes_waiting(), 1);
    // a restarts for membership: one bump; expected = a, b (survivors) + c (waiting).
    let mut v = view(&a, 2, 3);
    v.bump_from = Some((0, RoundReason::Membership));
    assert_eq!(settle(&mut s, &v), JoinStep::Wait);
    assert_eq!((s.round, s.complete, s.restart_count), (1, false, 0));
    assert_eq!(s.expected.len(), 3);
    // b also asks from round 0: no second bump.
    let mut v = view(&b, 2, 3);
    v.bump_from = Some((0, RoundReason::Membership));
    assert_eq!(settle(&mut s, &v), JoinStep::Wait);
    assert_eq!(s.round, 1);
    assert_eq!(settle(&mut s, &view(&c, 2, 3)), JoinStep::Done);
    assert!(s.complete);
    assert_eq!(s.num_nodes_waiting(), 0);
    // a and b keep ranks 0 and 1 (previous order), c follows.
    let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, [a.id.as_str(), b.id.as_str(), c.id.as_str()]);
}

#[test]
fn bumped_round_completes_when_all_expected_rejoin_without_last_call() {
    let (a, b) = (m("10.0.0.1", 1), m("10.0.0.2", 1));
    let mut s = RdzvState::default();
    settle(&mut s, &view(&a, 1, 4));
    settle(&mut s, &view(&b, 1, 4));
    let mut v = view(&a, 1, 4);
    v.last_call_expired = true;
    settle(&mut s, &v);
    assert!(s.complete);
    let mut v = view(&b, 1, 4);
    v.bump_from = Some((0, RoundReason::WorkerFailure));
    assert_eq!(settle(&mut s, &v), JoinStep::Wait);
    assert_eq!(s.restart_count, 1);
    assert_eq!(settle(&mut s, &view(&a, 1, 4)), JoinStep::Done);
    assert_eq!(assignment(&s, &b.id, "p").unwrap().restart_count, 1);
}

#[test]
fn full_round_sends_newcomer_to_redundancy_and_reserves_expected_slots() {
    let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
    let mut s = RdzvState::default();
    settle(&mut s, &view(&a, 1, 2));
    assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
    assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
    assert!(s.in_redundancy_list(&c.id));
    assert_eq!(
        s.num_nodes_waiting(),
        0,
        "redundant nodes do not trigger restarts"
    );
    // A failure bump: c must not take a slot expected for a or b.
    let mut v = view(&a, 1, 2);
    v.bump_from = Some((0, RoundReason::WorkerFailure));
    settle(&mut s, &v);
    assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
    assert!(!s.is_participant(&c.id));
    assert_eq!(settle(&mut s, &view(&b, 1, 2)), JoinStep::Done);
    // b is lost: c moves to the wait list, then into the next round.
    let s2 = prune_dead(&s, std::slice::from_ref(&b.id), 1, 2).unwrap();
    assert_eq!(
        (s2.round, s2.reason, s2.restart_count),
        (2, RoundReason::PeerLost, 1)
    );
    let mut s = s2;
    assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Wait);
    assert_eq!(settle(&mut s, &view(&a, 1, 2)), JoinStep::Done);
    assert_eq!(settle(&mut s, &view(&c, 1, 2)), JoinStep::Done);
    let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, [a.id.as_str(), c.id.as_str()]);
}

#[test]
fn pruning_during_join_completes_the_round_for_the_rest() {
    let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 1), m("10.0.0.3", 1));
    let mut s = RdzvState::default();
    for n in [&a, &b, &c] {
        settle(&mut s, &view(n, 2, 3));
    }
    assert!(s.complete);
    let mut v = view(&a, 2, 3);
    v.bump_from = Some((0, RoundReason::WorkerFailure));
    settle(&mut s, &v);
    settle(&mut s, &view(&b, 2, 3));
    assert!(!s.complete, "c is still expected");
    let s = prune_dead(&s, std::slice::from_ref(&c.id), 2, 3).unwrap();
    assert!(s.complete);
    assert_eq!(s.participants.len(), 2);
    assert_eq!(prune_dead(&s, &["nobody".into()], 2, 3), None);
}

#[test]
fn one_write_admits_every_announced_joiner_that_fits() {
    let ms: Vec<Member> = (1..=4).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
    let mut s = RdzvState::default();
    // Announcement order: .1, .2, the writer .4, then .3.
    let pending = [ms[0].clone(), ms[1].clone(), ms[3].clone(), ms[2].clone()];
    let mut v = view(&ms[3], 2, 3);
    v.pending = &pending;
    match join_step(&s, &v) {
        JoinStep::Write(new) => s = new,
        other => panic!("{other:?}"),
    }
    // .1, .2 and the writer fill the round (max 3); .3 is left over.
    assert!(s.complete);
    let ids: Vec<&str> = s.participants.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        [ms[0].id.as_str(), ms[1].id.as_str(), ms[3].id.as_str()]
    );
    assert_eq!(settle(&mut s, &view(&ms[2], 2, 3)), JoinStep::Wait);
    assert!(s.in_redundancy_list(&ms[2].id));
}

#[test]
fn closed_rendezvous_reports_redundancy() {
    let a = m("10.0.0.1", 1);
    let mut s = close(&RdzvState::default(), None);
    assert_eq!(
        join_step(&s, &view(&a, 1, 1)),
        JoinStep::Closed { redundant: false }
    );
    s.redundancy_list.push(a.clone());
    assert_eq!(
        join_step(&s, &view(&a, 1, 1)),
        JoinStep::Closed { redundant: true }
    );
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    fn check_invariants(s: &RdzvState, max: usize, min: usize) {
        let mut all: Vec<&str> = s.listed().map(|m| m.id.as_str()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a node is in at most one list: {s:?}");
        assert!(s.participants.len() <= max, "{s:?}");
        if s.complete {
            assert!(s.participants.len() >= min, "{s:?}");
        }
    }

    proptest! {
        /// Random interleavings of joins, restarts and deaths keep the lists consistent, and
        /// once every live node keeps stepping, the round completes with min(live, max).
        #[test]
        fn random_interleavings_stay_consistent_and_complete(
            n in 1usize..6,
            min in 1usize..4,
            extra in 0usize..3,
            steps in proptest::collection::vec((0usize..6, 0u8..4, any::<bool>()), 0..60),
        ) {
            let max = min + extra;
            let nodes: Vec<Member> = (0..n).map(|i| m(&format!("10.0.0.{}", i + 1), 1)).collect();
            let mut dead = vec![false; n];
            let mut my_round: Vec<Option<u64>> = vec![None; n];
            let mut s = RdzvState::default();
            let mut failures = 0u32;
            let mut announced: Vec<Option<u64>> = vec![None; n];
            for (who, action, expired) in steps {
                let i = who % n;
                if dead[i] {
                    continue;
                }
                match action {
                    // A death, noticed by the others.
                    0 if dead.iter().filter(|d| !**d).count() > 1 => {
                        dead[i] = true;
                        if let Some(new) = prune_dead(&s, std::slice::from_ref(&nodes[i].id), min, max) {
                            s = new;
                        }
                    }
                    // A worker failure on a node that ran a round.
                    1 if my_round[i].is_some() => {
                        let mut v = view(&nodes[i], min, max);
                        v.bump_from = my_round[i].map(|r| (r, RoundReason::WorkerFailure));
                        if let JoinStep::Write(new) = join_step(&s, &v) {
                            if new.restart_count > s.restart_count { failures += 1; }
                            s = new;
                        }
                    }
                    // Announced, but its own write lost a race (admission by others).
                    2 if !s.complete => announced[i] = Some(s.round),
                    _ => {
                        // Live nodes announced for this round (batch admission).
                        let pending: Vec<Member> = (0..n)
                            .filter(|j| !dead[*j] && announced[*j] == Some(s.round))
                            .map(|j| nodes[j].clone())
                            .collect();
                        if !s.complete {
                            announced[i] = Some(s.round);
                        }
                        let mut v = view(&nodes[i], min, max);
                        v.pending = &pending;
                        v.last_call_expired = expired;
                        match join_step(&s, &v) {
                            JoinStep::Write(new) => s = new,
                            JoinStep::Done => my_round[i] = Some(s.round),
                            _ => {}
                        }
                    }
                }
                check_invariants(&s, max, min);
                prop_assert_eq!(s.restart_count, failures);
            }
            // Liveness: every live node keeps stepping with expired last calls.
            let live: Vec<usize> = (0..n).filter(|i| !dead[*i]).collect();
            for _ in 0..20 {
                for &i in &live {
                    let mut v = view(&nodes[i], min, max);
                    v.last_call_expired = true;
                    if let JoinStep::Write(new) = join_step(&s, &v) {
                        s = new;
                    }
                    check_invariants(&s, max, min);
                }
            }
            if live.len() >= min {
                prop_assert!(s.complete, "{:?}", s);
                // Live nodes on the wait list would trigger the next round (scale-up).
                let running = s.participants.len() + s.wait_list.len();
                prop_assert_eq!(running.min(max), live.len().min(max), "{:?}", s);
            }
        }
    }
}

/// Issue 16: the per-node-keys join builds the same assignment from the compact roster as
/// from the full state, and publishes the same watch targets as `watch_targets`.
#[test]
fn roster_gives_the_assignment_of_the_state_and_batch_targets_match() {
    let mut s = RdzvState {
        participants: vec![
            Member::new("10.0.0.3", 7, 0, 4, 29500),
            Member::new("node-a", 3, 1, 2, 29400),
            Member::new("::1", 9, 0, 1, 1),
        ],
        round: 3,
        restart_count: 2,
        reason: RoundReason::PeerLost,
        ..Default::default()
    };
    mark_complete(&mut s);
    let r = roster(&s);
    for m in &s.participants {
        assert_eq!(
            roster_assignment(&r, &m.id, "p"),
            assignment(&s, &m.id, "p"),
            "{}",
            String::from_utf8_lossy(&r)
        );
    }
    // The summary and each participant's own notice give the same, without the roster.
    let sum = round_summary(&s);
    assert_eq!(summary_size(&sum), Some(3));
    let notes: std::collections::HashMap<String, Notice> = notices(None, &s).into_iter().collect();
    for m in &s.participants {
        let n = &notes[&m.id];
        assert_eq!(Notice::decode(&n.encode()).as_ref(), Some(n), "round trip");
        let mut want = assignment(&s, &m.id, "p").unwrap();
        assert!(!want.uniform_nproc, "4, 2 and 1 workers");
        want.nodes.clear();
        assert_eq!(
            summary_assignment(&sum, n, m.nproc, "p"),
            Some(want),
            "{}",
            String::from_utf8_lossy(&sum)
        );
    }
    // A notice without ranks (an incomplete round's), or ranks that do not fit: none.
    let plain = Notice {
        status: 'p',
        rank: None,
        targets: vec![],
    };
    assert_eq!(summary_assignment(&sum, &plain, 1, "p"), None);
    let far = Notice {
        rank: Some((3, 0)),
        ..plain.clone()
    };
    assert_eq!(summary_assignment(&sum, &far, 1, "p"), None);
    assert_eq!(summary_assignment(b"rdrun-round 1", &far, 1, "p"), None);
    assert_eq!(Notice::decode(b"p=1 a"), None, "bad ranks");
    assert_eq!(roster_assignment(&r, "10.0.0.9_1_0", "p"), None);
    assert_eq!(roster_assignment(b"junk", &s.participants[0].id, "p"), None);
    assert_eq!(
        roster_ids(&r).unwrap(),
        s.participants
            .iter()
            .map(|m| m.id.clone())
            .collect::<Vec<_>>()
    );
    let ms: Vec<Member> = (1..=9).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
    for (np, nw, nr, ne) in [(4, 1, 1, 2), (0, 2, 1, 1), (1, 0, 0, 3), (5, 0, 0, 0)] {
        let st = RdzvState {
            participants: ms[..np].to_vec(),
            wait_list: ms[np..np + nw].to_vec(),
            redundancy_list: ms[np + nw..np + nw + nr].to_vec(),
            expected: ms[np + nw + nr..np + nw + nr + ne]
                .iter()
                .map(|m| m.id.clone())
                .chain(ms.first().map(|m| m.id.clone()))
                .collect(),
            ..Default::default()
        };
        for (id, t) in all_watch_targets(&st) {
            assert_eq!(t, watch_targets(&st, &id), "{id} in {np}/{nw}/{nr}/{ne}");
        }
    }
}

/// The reason's name (roster, summary, events) is its serde name, and reads back.
#[test]
fn round_reason_names_match_serde_and_read_back() {
    for r in [
        RoundReason::Initial,
        RoundReason::WorkerFailure,
        RoundReason::Membership,
        RoundReason::PeerLost,
    ] {
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            format!("\"{}\"", r.name())
        );
        assert_eq!(RoundReason::from_name(r.name()), Some(r));
    }
    assert_eq!(RoundReason::from_name("restart"), None);
}

#[test]
fn notices_cover_changed_nodes_and_dropped_ones() {
    let ms: Vec<Member> = (1..=5).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
    let old = RdzvState {
        participants: ms[..3].to_vec(),
        ..Default::default()
    };
    let all = notices(None, &old);
    assert_eq!(all.len(), 3);
    assert!(all
        .iter()
        .all(|(_, n)| n.status == 'p' && n.targets.len() == 2));
    // One more admitted: it and the node whose successors wrap around to it change.
    let mut new = old.clone();
    new.participants.push(ms[3].clone());
    let ch: Vec<String> = notices(Some(&old), &new)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(ch.contains(&ms[3].id) && ch.contains(&ms[2].id), "{ch:?}");
    assert!(!ch.contains(&ms[0].id), "{ch:?}");
    // One dropped: `x`.
    let mut gone = new.clone();
    gone.remove_everywhere(&ms[1].id);
    let x = notices(Some(&new), &gone);
    assert!(x.iter().any(|(id, n)| *id == ms[1].id && n.status == 'x'));
    assert_eq!(
        Notice::decode(&x[0].1.encode()),
        Some(x[0].1.clone()),
        "round trip"
    );
    // A closed state needs none.
    assert!(notices(Some(&new), &close(&new, None)).is_empty());
}

#[test]
fn one_batch_places_every_announced_node_as_their_own_steps_would() {
    let ms: Vec<Member> = (1..=5).map(|i| m(&format!("10.0.0.{i}"), 1)).collect();
    // Incomplete round, max 3: three admitted, it completes, the other two wait.
    let s = place_pending(&RdzvState::default(), &ms, 2, 3);
    assert!(s.complete);
    assert_eq!(s.participants.len(), 3);
    assert_eq!(s.wait_list.len() + s.redundancy_list.len(), 2);
    let mut one_by_one = RdzvState::default();
    for p in &ms {
        settle(&mut one_by_one, &view(p, 2, 3));
    }
    assert_eq!(s, one_by_one);
    // Head: foreign text and another format are clear errors.
    assert!(matches!(
        Head::decode(b"Y2FuaW1hZGFt"),
        Err(StateError::Foreign(_))
    ));
    assert_eq!(
        Head::decode(br#"{"format":1}"#),
        Err(StateError::Format { found: 1 })
    );
    let h = Head::of(&s, 4, "k");
    assert_eq!(Head::decode(&h.encode()).unwrap(), Some(h));
    assert_eq!(Head::decode(NO_STATE).unwrap(), None);
}

#[test]
fn a_node_that_leaves_is_bumped_out_of_a_complete_round_or_removed_from_a_forming_one() {
    let (a, b, c) = (m("10.0.0.1", 1), m("10.0.0.2", 2), m("10.0.0.3", 3));
    let mut s = RdzvState {
        participants: vec![a.clone(), b.clone(), c.clone()],
        ..RdzvState::default()
    };
    mark_complete(&mut s);
    // Complete: the next round expects the others only, and is not charged.
    let new = leave(&s, &c.id, RoundReason::Membership, 2, 3).unwrap();
    assert_eq!(new.round, s.round + 1);
    assert!(!new.complete && new.participants.is_empty());
    assert_eq!(new.expected, vec![a.id.clone(), b.id.clone()]);
    assert_eq!(new.reason, RoundReason::Membership);
    assert_eq!(new.restart_count, s.restart_count);
    // A node leaving after its own failures: the bump is charged.
    let charged = leave(&s, &c.id, RoundReason::WorkerFailure, 2, 3).unwrap();
    assert_eq!(charged.restart_count, s.restart_count + 1);
    // Forming (another node bumped first): removed, and the round completes once the others are in.
    let mut forming = bump_round(&s, RoundReason::Membership, &[]);
    forming.participants = vec![a.clone(), b.clone()];
    let done = leave(&forming, &c.id, RoundReason::Membership, 2, 3).unwrap();
    assert!(done.complete, "{done:?}");
    assert!(!done.expected.contains(&c.id) && !done.is_participant(&c.id));
    // Below MIN it stays open.
    forming.participants = vec![a.clone()];
    let open = leave(&forming, &c.id, RoundReason::Membership, 2, 3).unwrap();
    assert!(!open.complete);
    // Two of three leaving at once with MIN 2: the second one stays (no spare left).
    assert_eq!(leave(&new, &b.id, RoundReason::Membership, 2, 3), None);
    assert_eq!(leave(&s, &c.id, RoundReason::Membership, 3, 3), None);
    // Unknown node, closed rendezvous: nothing to do.
    assert_eq!(leave(&s, "nobody", RoundReason::Membership, 2, 3), None);
    assert_eq!(
        leave(&close(&s, None), &c.id, RoundReason::Membership, 2, 3),
        None
    );
}
