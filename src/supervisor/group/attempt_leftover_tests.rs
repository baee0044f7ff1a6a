//! The attempt's table tests of processes the workers leave behind (`--leftovers`, the grace in
//! which helpers may exit on their own): a part of `attempt_tests.rs` (its harness), kept apart
//! so that each file fits in a head.

use super::*;

#[test]
fn leftovers_are_stopped_waited_for_or_left_as_the_policy_says() {
    let stray = PID0 + 50;
    for policy in [
        LeftoverPolicy::Kill,
        LeftoverPolicy::Wait,
        LeftoverPolicy::Leave,
    ] {
        let mut h = Harness::with(
            1,
            None,
            GroupSettings {
                leftovers: policy,
                ..settings()
            },
        );
        // A process the worker started in a session of its own, still alive after it.
        h.world.borrow_mut().alive.push(proc_entry(stray, stray));
        // First the grace (issue 38 item 8): it may still exit on its own.
        assert_eq!(h.step(vec![h.exit(0, code(0))]), Flow::Continue);
        assert!(h.group.polls_leftovers() && h.effects().is_empty());
        h.advance(LEFTOVER_GRACE);
        let flow = h.step(vec![Event::LeftoverPoll]);
        match policy {
            LeftoverPolicy::Leave => assert_eq!(flow, Flow::Over),
            LeftoverPolicy::Kill => {
                assert_eq!(flow, Flow::Continue);
                assert_eq!(
                    h.effects(),
                    [Fx::Group(Harness::pid(0), TERM), Fx::Pid(stray, TERM)]
                );
            }
            LeftoverPolicy::Wait => {
                assert_eq!(flow, Flow::Continue);
                assert!(h.group.polls_leftovers() && !h.group.judging());
                assert_eq!(h.effects(), []);
                assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Continue);
            }
        }
        h.world.borrow_mut().alive.clear();
        if policy != LeftoverPolicy::Leave {
            assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Over);
        }
        assert!(matches!(h.outcome(), Outcome::Succeeded), "{policy:?}");
    }
}

#[test]
fn helpers_that_exit_within_the_grace_are_not_leftovers() {
    // Issue 38 item 8: a process of the workers that exits a moment after them (a
    // multiprocessing resource tracker) gets no WARN and no signal.
    let helper = PID0 + 50;
    let mut h = Harness::new(1);
    h.world.borrow_mut().alive.push(proc_entry(helper, helper));
    assert_eq!(h.step(vec![h.exit(0, code(0))]), Flow::Continue);
    assert!(h.group.polls_leftovers());
    h.advance(LEFTOVER_GRACE / 2);
    assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Continue);
    h.world.borrow_mut().alive.clear();
    assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Over);
    assert!(h.effects().is_empty());
    assert!(matches!(h.outcome(), Outcome::Succeeded));
}

#[test]
fn a_known_helper_gets_the_longer_grace_an_unknown_process_does_not() {
    let pid = PID0 + 50;
    for (cmdline, known) in [
        (
            "/venv/bin/python -m debugpy.adapter --for-server 5679",
            true,
        ),
        ("sleep 1000", false),
    ] {
        let mut h = Harness::new(1);
        h.world.borrow_mut().alive.push(proc_entry(pid, pid));
        h.world.borrow_mut().cmdlines.insert(pid, cmdline.into());
        assert_eq!(h.step(vec![h.exit(0, code(0))]), Flow::Continue);
        h.advance(LEFTOVER_GRACE);
        assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Continue);
        // The default policy (kill) stops an unknown process after the short grace only.
        assert_eq!(h.effects().is_empty(), known, "{cmdline}");
        if known {
            h.advance(KNOWN_HELPER_GRACE);
            assert_eq!(h.step(vec![Event::LeftoverPoll]), Flow::Continue);
            assert!(!h.effects().is_empty(), "{cmdline}");
        }
    }
}
