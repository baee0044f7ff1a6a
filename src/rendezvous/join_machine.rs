//! The c10d join loop's decisions: what a joining node does next, given the small head it read
//! and what it knows of its own place, without any store I/O and without reading a clock.
//!
//! The driver (`c10d.rs`) reads the head, measures time with its own monotonic clock and asks
//! [`JoinMachine::plan`] what to do: run the `--nnodes` checks, announce itself, read the full
//! state (and possibly become the admission writer), read the round's summary, try to take the
//! admission key, or wait on small keys ([`JoinMachine::wait`] says on which and how long). The
//! decisions on the full state itself are `state::join_step`'s; what one write of it carries is
//! [`to_write`]. The machine remembers the loop's timers and counters (the last call, the poll
//! back-off, lost write races, the announcement, the re-join head, a missing summary, the
//! admission batch), so that each rule is in one place and property-tested.

use std::time::Duration;

use tokio::time::Instant;

use super::state::{self, Head, Member, RdzvState, RoundReason};

/// Where this node stands in a round, as its notice says (the wire's status characters `p`, `w`,
/// `r`, `x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// `p`: a participant.
    Participant,
    /// `w`: on the wait list (the round is complete and has room).
    Waiting,
    /// `r`: on the redundancy list (the round is full).
    Redundant,
    /// `x`: no longer listed (it left, or was dropped).
    Removed,
    /// Another status (a newer writer's): not placed here, but no newcomer either.
    Other,
}

impl Placement {
    /// The placement a notice's status character means.
    pub fn from_status(status: char) -> Self {
        match status {
            'p' => Placement::Participant,
            'w' => Placement::Waiting,
            'r' => Placement::Redundant,
            'x' => Placement::Removed,
            _ => Placement::Other,
        }
    }

    /// On the wait or the redundancy list.
    pub fn listed(self) -> bool {
        matches!(self, Placement::Waiting | Placement::Redundant)
    }
}

/// What the join loop does with the head it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Run the `--nnodes` agreement and the torchrun-agent checks first (before this node joins
    /// anything, then once per poll interval while it waits).
    pub checks: bool,
    /// Append this node to the round's joiners list first (once per round).
    pub announce: bool,
    pub action: Action,
}

/// The step after the checks and the announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read the full state and decide on it (`join_step`); `admit`: as the holder of the
    /// admission key, placing every announced node in the same write.
    Full { admit: bool },
    /// A participant of a complete round: its summary (and notice or roster) say everything.
    ReadSummary,
    /// Try to take the admission key: on success [`Action::Full`] with `admit`, else wait.
    TryAdmit,
    /// A wait on small keys (see [`JoinMachine::wait`]).
    Wait,
}

/// What a wait on small keys waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOn {
    /// The round's summary (a participant).
    Summary,
    /// This node's notice (not placed yet).
    Notice,
    /// Nothing (the wait and redundancy lists): a sleep.
    Sleep,
}

/// One wait on small keys: on what, the poll interval its slice is drawn from, and a cap on
/// the slice (the last call is not overslept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub on: WaitOn,
    pub poll: Duration,
    pub cap: Option<Duration>,
}

/// The fixed parameters of one join.
#[derive(Debug, Clone, Copy)]
pub struct JoinParams {
    pub min: usize,
    pub max: usize,
    pub poll_max: Duration,
    pub join_timeout: Duration,
    pub last_call_timeout: Duration,
    /// The round this agent ran and why it wants the next one (it bumps that round).
    pub bump_from: Option<(u64, RoundReason)>,
    /// Participants of a round above this many nodes are woken by the summary and poll only
    /// for their watched peers and the head.
    pub full_check_max: usize,
}

/// The decisions and the memory of one `next_round` call (see the module doc).
#[derive(Debug, Clone)]
pub struct JoinMachine {
    p: JoinParams,
    min_poll: Duration,
    max_backoff: Duration,
    deadline: Instant,
    /// The last call key (round, last-call sequence) this node saw and since when.
    last_call: Option<((u64, u64), Instant)>,
    poll: Duration,
    /// Write races lost in a row.
    lost: u32,
    announced: Option<u64>,
    /// The head seq at which a waiting or redundant node last re-ran its join in the state.
    rejoined_at: Option<u64>,
    /// Since when a complete round's summary is missing (its completer may have died).
    summary_missing: Option<(u64, Instant)>,
    /// This node admitted a batch and holds the admission key for the head it wrote: it admits
    /// the next batch at once (the others only wait on their notices).
    keep_admitting: bool,
    next_checks: Instant,
    notice_due: Instant,
}

impl JoinMachine {
    /// A join that starts at `now`.
    pub fn new(p: JoinParams, now: Instant) -> Self {
        let min_poll = Duration::from_millis(20).min(p.poll_max);
        JoinMachine {
            p,
            min_poll,
            max_backoff: Duration::from_millis(100).min(p.poll_max),
            deadline: now + p.join_timeout,
            last_call: None,
            poll: min_poll,
            lost: 0,
            announced: None,
            rejoined_at: None,
            summary_missing: None,
            keep_admitting: false,
            next_checks: now,
            notice_due: now,
        }
    }

    /// The join deadline (pushed back while this node is redundant in a full round).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The round this agent ran and why it wants the next one.
    pub fn bump_from(&self) -> Option<(u64, RoundReason)> {
        self.p.bump_from
    }

    /// The current poll interval (backs off while nothing happens).
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// Another node holding the admission key for as long as this without writing is taken
    /// over (it died, or its store link did).
    pub fn admit_stale(&self) -> Duration {
        (self.p.poll_max * 2).max(Duration::from_millis(200))
    }

    /// What to do with `head`, where this node's notice for `head.round` says `placed`.
    pub fn plan(&mut self, head: &Head, placed: Option<Placement>, now: Instant) -> Plan {
        let max = self.p.max;
        let me_in = placed == Some(Placement::Participant);
        // A redundant node waits without a deadline while the round is full (torchrun).
        if head.complete && placed == Some(Placement::Redundant) && head.participants >= max {
            self.deadline = now + self.p.join_timeout;
        }
        let last_call_expired = self.last_call_expired(
            head.complete,
            me_in,
            head.participants,
            (head.round, head.last_call_seq),
            now,
        );
        let checks = !(head.closed || head.complete && me_in) && now >= self.next_checks;
        if checks {
            self.next_checks = now + self.p.poll_max;
        }
        let plan = |announce, action| Plan {
            checks,
            announce,
            action,
        };
        let bump_due = self
            .p
            .bump_from
            .is_some_and(|(r, _)| head.round == r && head.complete);
        let slow = head.closed || bump_due || now >= self.deadline;
        if std::mem::take(&mut self.keep_admitting) && !head.complete && !slow {
            return plan(false, Action::Full { admit: true });
        }
        if slow {
            return plan(false, Action::Full { admit: false });
        }
        if head.complete && me_in {
            return plan(false, Action::ReadSummary);
        }
        if last_call_expired {
            // Every participant's last call runs out at about the same time: the holder of the
            // admission key completes the round, the others see it complete.
            return plan(false, Action::TryAdmit);
        }
        let unplaced = matches!(placed, None | Some(Placement::Removed));
        let listed = placed.is_some_and(Placement::listed);
        let announce = !head.complete && unplaced && self.announced != Some(head.round);
        if !announce {
            if head.complete && unplaced {
                // A complete round: this node goes to its wait or redundancy list.
                return plan(false, Action::Full { admit: false });
            }
            if listed
                && self.rejoined_at != Some(head.seq)
                && (!head.complete || head.participants < max)
            {
                // The state moved while this node waits on a list: see whether it fits now.
                return plan(false, Action::Full { admit: false });
            }
        }
        if !me_in && !listed && !head.complete {
            // Not placed yet: become the admission writer, or wait for a notice.
            if placed == Some(Placement::Removed) {
                return plan(announce, Action::Full { admit: false });
            }
            return plan(announce, Action::TryAdmit);
        }
        plan(announce, Action::Wait)
    }

    /// The last call of a round (`key`: round, last-call sequence) where this node is a
    /// participant with `participants >= min` is over: `last_call_timeout` since this node
    /// first saw that key (a new key restarts the clock; a zero timeout is over at once).
    pub fn last_call_expired(
        &mut self,
        complete: bool,
        me_in: bool,
        participants: usize,
        key: (u64, u64),
        now: Instant,
    ) -> bool {
        if complete || !me_in || participants < self.p.min {
            return false;
        }
        match self.last_call {
            Some((k, since)) if k == key => now.duration_since(since) >= self.p.last_call_timeout,
            _ => {
                self.last_call = Some((key, now));
                self.p.last_call_timeout.is_zero()
            }
        }
    }

    /// This node's announcement for `round` went through.
    pub fn announced(&mut self, round: u64) {
        self.announced = Some(round);
    }

    /// The wait on small keys for `head`: a node not yet placed is woken by its notice and
    /// tries to admit the others itself only after a whole poll interval without one; a
    /// participant of a large round is woken by the summary too, and polls only for its
    /// watched peers and the head (issue 16: at 10,000 nodes the shorter slices of a
    /// backing-off poll were half of all requests of a join).
    pub fn wait(&self, head: &Head, placed: Option<Placement>, now: Instant) -> Wait {
        let me_in = placed == Some(Placement::Participant);
        let on = if me_in {
            WaitOn::Summary
        } else if placed.is_none() {
            WaitOn::Notice
        } else {
            WaitOn::Sleep
        };
        let large = me_in && head.participants > self.p.full_check_max;
        if placed.is_none() || large {
            let lc_left = self
                .last_call
                .filter(|(k, _)| *k == (head.round, head.last_call_seq))
                .map(|(_, since)| {
                    (since + self.p.last_call_timeout).saturating_duration_since(now)
                });
            let cap = lc_left.unwrap_or(self.p.poll_max).max(self.min_poll);
            Wait {
                on,
                poll: self.p.poll_max,
                cap: Some(cap),
            }
        } else {
            Wait {
                on,
                poll: self.poll,
                cap: None,
            }
        }
    }

    /// A wait ended: woken by its key (the poll starts short again) or not (it backs off).
    pub fn waited(&mut self, woke: bool) {
        self.poll = if woke {
            self.min_poll
        } else {
            (self.poll * 2).min(self.p.poll_max)
        };
    }

    /// A participant rereads its own notice (it changes when its watched peers do) when the
    /// version moved without a wake-up, at most once per poll interval (the join writes often).
    pub fn notice_due(&mut self, me_in: bool, woke: bool, moved: bool, now: Instant) -> bool {
        if me_in && !woke && moved && now >= self.notice_due {
            self.notice_due = now + self.p.poll_max;
            return true;
        }
        false
    }

    /// The summary of complete `round` is missing: `true` once it has been for two polls (its
    /// completer may have died; then this participant writes it from the state), else wait.
    pub fn summary_missing(&mut self, round: u64, now: Instant) -> bool {
        let since = match self.summary_missing {
            Some((r, t)) if r == round => t,
            _ => {
                self.summary_missing = Some((round, now));
                now
            }
        };
        now.duration_since(since) >= self.p.poll_max * 2
    }

    /// The full state was read (or written) at head `seq`, and this node's place in it is
    /// `placed`: a listed node does not re-run its join until the head moves.
    pub fn learnt(&mut self, placed: Option<Placement>, seq: Option<u64>) {
        if placed.is_some_and(Placement::listed) {
            self.rejoined_at = seq;
        }
    }

    /// A write of the state won: the poll starts short again.
    pub fn won(&mut self) {
        self.lost = 0;
        self.poll = self.min_poll;
    }

    /// This node keeps the admission key for the head it wrote: it admits whoever announced
    /// meanwhile after a pause as long as the batch took (20-200 ms: more arrive per write).
    pub fn keep_admitting(&mut self, batch_took: Duration) -> Duration {
        self.keep_admitting = true;
        batch_took
            .clamp(Duration::from_millis(20), Duration::from_millis(200))
            .min(self.p.poll_max)
    }

    /// A write of the state lost a race: the cap of a random back-off (drawn by the driver), so
    /// that many agents writing together do not all retry in lockstep.
    pub fn lost_race(&mut self) -> Duration {
        self.lost += 1;
        Duration::from_millis(1u64 << self.lost.min(7)).min(self.max_backoff)
    }

    /// Write races lost in a row.
    pub fn races_lost(&self) -> u32 {
        self.lost
    }
}

/// The state one write leaves, given `join_step`'s new state (`None`: it said wait) and the
/// announced joiners `pending` this node admits: one write places every announced node too.
/// `None`: nothing to write.
pub fn to_write(
    state: &RdzvState,
    step: Option<RdzvState>,
    pending: &[Member],
    min: usize,
    max: usize,
) -> Option<RdzvState> {
    let new = match step {
        Some(new) => new,
        // Already placed: the admission writer still places the announced nodes.
        None if pending.is_empty() => return None,
        None => {
            let b = state::place_pending(state, pending, min, max);
            if b == *state {
                return None;
            }
            b
        }
    };
    Some(if new.round == state.round && !pending.is_empty() {
        state::place_pending(&new, pending, min, max)
    } else {
        new
    })
}

#[cfg(test)]
#[path = "join_machine_tests.rs"]
mod tests;
