//! The c10d join loop (`C10dRendezvous::next_round`): the store I/O around the pure
//! [`JoinMachine`] (which decides what to do with each head read) and `state::join_step`
//! (which decides on the full state).

use super::io::*;
use super::*;
use crate::rendezvous::join_machine::{
    to_write, Action, JoinMachine, JoinParams, Placement, WaitOn,
};

/// One `next_round` call's memory besides the machine's: what it read of the store.
struct Join {
    m: JoinMachine,
    started: Instant,
    /// The head's text as last read.
    text: Vec<u8>,
    /// The version counter as last read.
    version: Option<Vec<u8>>,
    /// This node's place as last learnt (its notice key, or the state a write read).
    mine: Option<(u64, Notice)>,
    /// The watched peers' heartbeats.
    tracker: HeartbeatTracker,
    /// The admission key's value another node holds, and since when this node sees it.
    admit_seen: Option<(Vec<u8>, Instant)>,
}

impl Join {
    /// This node's place in `round`, as last learnt.
    fn placed(&self, round: u64) -> Option<Placement> {
        self.mine
            .as_ref()
            .filter(|(r, _)| *r == round)
            .map(|(_, n)| Placement::from_status(n.status))
    }

    /// This node's place in `state`, read or written at the head in `self.text`.
    fn learn(&mut self, state: &RdzvState, id: &str) {
        self.mine = own_notice(state, id).map(|n| (state.round, n));
        let placed = self
            .mine
            .as_ref()
            .map(|m| Placement::from_status(m.1.status));
        let seq = Head::decode(&self.text).ok().flatten().map(|h| h.seq);
        self.m.learnt(placed, seq);
    }
}

/// How reading a complete round's summary went.
enum Summary {
    /// This node's assignment.
    Done(Assignment),
    /// Read the full state.
    Full,
    /// Read the head again.
    Again,
}

impl<S: RdzvStore> C10dRendezvous<S> {
    /// Joins the next round and waits until it completes with this agent in it.
    ///
    /// The first call joins round 0 (or the current round). A later call after this agent's
    /// workers failed (`RoundReason::WorkerFailure`) or to admit waiting nodes
    /// (`RoundReason::Membership`) starts a new round for every node, unless another agent already
    /// did; only a `WorkerFailure` start is charged to the job-wide restart count.
    ///
    /// Per-node keys (issue 16): a node announces itself on the round's joiners list and waits
    /// on its own notice key; one node at a time (the holder of the round's admission key for
    /// the current head) reads the state and admits every announced node in one write, then
    /// publishes each placed node's notice. A participant waits on the round's roster, written
    /// once when the round completes, and builds its assignment from it. Only writers (admission,
    /// last call, a dead peer, a bump, a timeout) read the O(n) state.
    pub async fn next_round(&mut self, req: RoundRequest) -> Result<Assignment, RendezvousError> {
        lock(&self.shared).running = None;
        self.me.master_port = req.master_port;
        let started = Instant::now();
        let join_timeout = self.settings.join_timeout;
        let deadline = started + join_timeout;
        // The heartbeat key exists before this node appears in any list (peers multi_get it).
        self.retry_store(deadline, |s, k| {
            let key = k.hb(&self.me.id);
            async move { s.add(&key, 1).await.map(|_| ()) }
        })
        .await?;
        self.ensure_keeper();
        let bump_from = self.my_round.map(|r| {
            let reason = match req.reason {
                RoundReason::Initial => RoundReason::Membership,
                other => other,
            };
            (r, reason)
        });
        let params = JoinParams {
            min: self.settings.min_nodes,
            max: self.settings.max_nodes,
            poll_max: self.settings.poll_interval,
            join_timeout,
            last_call_timeout: self.settings.last_call_timeout,
            bump_from,
            full_check_max: self.full_check_max,
        };
        let nnodes = nnodes_text(params.min, params.max);
        let m = JoinMachine::new(params, Instant::now());
        let text = self
            .retry_store(deadline, |s, k| {
                let k = k.clone();
                async move { read_head(&*s, &k).await }
            })
            .await?;
        let mut j = Join {
            m,
            started,
            text,
            version: None,
            mine: None,
            tracker: HeartbeatTracker::default(),
            admit_seen: None,
        };
        loop {
            let head = Head::decode(&j.text)?.unwrap_or_else(empty_head);
            let now = Instant::now();
            let placed = j.placed(head.round);
            let plan = j.m.plan(&head, placed, now);
            if plan.checks {
                if let Some(err) = self.conflict_checks(&nnodes).await {
                    return Err(err);
                }
            }
            if plan.announce {
                // Announce this node for the round (once): a writer admits every announced node.
                let mut line = serde_json::to_vec(&self.me).expect("member serializes");
                line.push(b'\n');
                let key = self.keys.joiners(head.round);
                if self.store.append(&key, &line).await.is_ok() {
                    j.m.announced(head.round);
                }
            }
            let (admit, dead) = match plan.action {
                Action::Full { admit } => (admit, Vec::new()),
                Action::ReadSummary => match self.read_summary(&mut j, &head, now).await? {
                    Summary::Done(asg) => return Ok(asg),
                    Summary::Full => (false, Vec::new()),
                    Summary::Again => continue,
                },
                Action::TryAdmit => {
                    let stale = j.m.admit_stale();
                    match self.try_admit(&head, &mut j.admit_seen, stale).await {
                        Admit::Got => (true, Vec::new()),
                        Admit::Busy => match self.wait_small(&mut j, &head, placed, now).await? {
                            dead if dead.is_empty() => continue,
                            dead => (false, dead),
                        },
                    }
                }
                Action::Wait => match self.wait_small(&mut j, &head, placed, now).await? {
                    dead if dead.is_empty() => continue,
                    dead => (false, dead),
                },
            };
            if let Some(asg) = self.full_step(&mut j, &head, admit, dead, now).await? {
                return Ok(asg);
            }
        }
    }

    /// A participant of complete round `head.round`: the round's summary with this node's
    /// notice (or, in a small round, its roster) says everything this node needs.
    async fn read_summary(
        &mut self,
        j: &mut Join,
        head: &Head,
        now: Instant,
    ) -> Result<Summary, RendezvousError> {
        let deadline = j.m.deadline();
        match try_get(&*self.store, &self.keys.complete(head.round)).await {
            Ok(Some(sum)) => {
                if let Some((asg, peers)) = self.completed(head.round, &sum).await {
                    return Ok(Summary::Done(self.finish(asg, peers, head.waiting)));
                }
                Ok(Summary::Full)
            }
            Ok(None) => {
                // Its completer may have died before writing it: after two polls, any
                // participant writes it (and the notices) from the state.
                if j.m.summary_missing(head.round, now) {
                    return Ok(Summary::Full);
                }
                let key = [self.keys.complete(head.round)];
                let _ = self
                    .store
                    .wait(&key, self.wait_slice(j.m.poll(), deadline))
                    .await;
                j.m.waited(false);
                j.text = self
                    .reread(deadline, &mut j.version, true, &j.text, None)
                    .await?;
                Ok(Summary::Again)
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the round's roster failed");
                tokio::time::sleep(j.m.poll()).await;
                j.text = self
                    .reread(deadline, &mut j.version, true, &j.text, None)
                    .await?;
                Ok(Summary::Again)
            }
        }
    }

    /// A wait on small keys: the summary (participants), this node's notice (not yet placed),
    /// or nothing (wait and redundancy lists); then the version and the watched heartbeats.
    /// Returns the watched peers found dead (they are dropped from the state next).
    async fn wait_small(
        &mut self,
        j: &mut Join,
        head: &Head,
        placed: Option<Placement>,
        now: Instant,
    ) -> Result<Vec<String>, RendezvousError> {
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let deadline = j.m.deadline();
        crate::rendezvous::progress::c10d(head.round, head.participants, min, max, deadline);
        let id = self.me.id.clone();
        let w = j.m.wait(head, placed, now);
        let slice = self.wait_slice(w.poll, deadline);
        let slice = w.cap.map_or(slice, |cap| slice.min(cap));
        let waited = match w.on {
            WaitOn::Summary => {
                let key = [self.keys.complete(head.round)];
                self.store.wait(&key, slice).await
            }
            WaitOn::Notice => {
                let key = [self.keys.notice(head.round, &id)];
                self.store.wait(&key, slice).await
            }
            WaitOn::Sleep => {
                tokio::time::sleep(slice).await;
                Ok(false)
            }
        };
        let woke = match waited {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "waiting in the rendezvous failed");
                tokio::time::sleep(j.m.poll()).await;
                false
            }
        };
        if woke && placed.is_none() {
            if let Ok(Some(n)) = read_notice(&*self.store, &self.keys, head.round, &id).await {
                j.mine = Some((head.round, n));
            }
        }
        // Watched peers (from this node's notice) that stopped heartbeating are dropped so that
        // the round can go on; read with the version in one request (both exist once this node
        // was placed).
        let mut dead = Vec::new();
        let mut known = None;
        if let Some((r, n)) = &j.mine {
            if *r == head.round && !n.targets.is_empty() {
                let mut ks = vec![self.keys.version()];
                ks.extend(n.targets.iter().map(|t| self.keys.hb(t)));
                match self.store.multi_get(&ks).await {
                    Ok(mut vals) => {
                        known = Some(vals.remove(0));
                        let beats = n.targets.iter().cloned().zip(vals).collect();
                        dead = j
                            .tracker
                            .observe(Instant::now(), beats, self.settings.dead_after());
                    }
                    Err(e) => tracing::debug!(error = %e, "reading heartbeats failed"),
                }
            }
        }
        let before = j.version.clone();
        j.text = self
            .reread(deadline, &mut j.version, woke, &j.text, known)
            .await?;
        let me_in = placed == Some(Placement::Participant);
        if j.m.notice_due(me_in, woke, before != j.version, now) {
            if let Ok(Some(n)) = read_notice(&*self.store, &self.keys, head.round, &id).await {
                j.mine = Some((head.round, n));
            }
        }
        j.m.waited(woke);
        Ok(dead)
    }

    /// The full state: read it, drop the `dead` peers or decide as before (`join_step`), write.
    /// `Some`: this node's assignment.
    async fn full_step(
        &mut self,
        j: &mut Join,
        head: &Head,
        admit: bool,
        dead: Vec<String>,
        now: Instant,
    ) -> Result<Option<Assignment>, RendezvousError> {
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let id = self.me.id.clone();
        let batch_started = Instant::now();
        let (t, state) = match load_state(&*self.store, &self.keys).await {
            Ok(v) => v,
            Err(ReadError::State(e)) => return Err(e.into()),
            Err(ReadError::Store(e)) => {
                tracing::warn!(error = %e, "rendezvous store error; retrying");
                self.release_admit(admit, head).await;
                self.store_error_pause(j).await?;
                return Ok(None);
            }
        };
        j.text = t;
        j.learn(&state, &id);
        if !dead.is_empty() {
            self.release_admit(admit, head).await;
            self.drop_dead(j, &state, &dead).await;
            return Ok(None);
        }
        let pending = if admit && !state.complete && !state.closed {
            self.announced_joiners(state.round).await
        } else {
            Vec::new()
        };
        let last_call_expired = j.m.last_call_expired(
            state.complete,
            state.is_participant(&id),
            state.participants.len(),
            (state.round, state.last_call_seq),
            now,
        );
        let view = JoinView {
            me: &self.me,
            min,
            max,
            past_deadline: now >= j.m.deadline(),
            last_call_expired,
            bump_from: j.m.bump_from(),
            pending: &pending,
        };
        let step = match join_step(&state, &view) {
            JoinStep::Write(new) => Some(new),
            JoinStep::Wait => None,
            end => {
                self.release_admit(admit, head).await;
                return self.join_ends(j, &state, end, now).await.map(Some);
            }
        };
        let Some(new) = to_write(&state, step, &pending, min, max) else {
            let h = Head::decode(&j.text)
                .ok()
                .flatten()
                .unwrap_or_else(empty_head);
            self.release_admit(admit, &h).await;
            return Ok(None);
        };
        match write_state(&*self.store, &self.keys, &j.text, Some(&state), &new).await {
            Ok(Wrote::Won(t)) => {
                j.m.won();
                if admit && !new.complete && !new.closed && new.round == state.round {
                    self.keep_admitting(j, &t, &new, batch_started).await;
                }
                j.text = t;
                j.learn(&new, &id);
            }
            Ok(Wrote::Lost(t)) => {
                // Lost a race: back off a random while before retrying.
                let cap = j.m.lost_race();
                tokio::time::sleep(cap.mul_f64(fastrand::f64())).await;
                tracing::debug!(
                    lost = j.m.races_lost(),
                    "rendezvous state changed under us; retrying"
                );
                j.text = t;
            }
            Err(e) => {
                tracing::warn!(error = %e, "rendezvous store error; retrying");
                self.release_admit(admit, head).await;
                self.store_error_pause(j).await?;
            }
        }
        Ok(None)
    }

    /// Writes the state without the `dead` peers (when the round may lose them).
    async fn drop_dead(&self, j: &mut Join, state: &RdzvState, dead: &[String]) {
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        if let Some(new) = prune_dead(state, dead, min, max) {
            tracing::warn!(?dead, "dropping nodes that stopped heartbeating");
            match write_state(&*self.store, &self.keys, &j.text, Some(state), &new).await {
                Ok(Wrote::Won(t)) | Ok(Wrote::Lost(t)) => j.text = t,
                Err(e) => tracing::debug!(error = %e, "dropping dead nodes failed"),
            }
        }
    }

    /// The joiners announced for `round` (none when the list cannot be read).
    async fn announced_joiners(&self, round: u64) -> Vec<Member> {
        match try_get(&*self.store, &self.keys.joiners(round)).await {
            Ok(Some(list)) => parse_joiners(&list),
            _ => Vec::new(),
        }
    }

    /// After a store error: a pause, then the head again.
    async fn store_error_pause(&self, j: &mut Join) -> Result<(), RendezvousError> {
        tokio::time::sleep(j.m.poll()).await;
        j.text = self
            .reread(j.m.deadline(), &mut j.version, true, &j.text, None)
            .await?;
        Ok(())
    }

    /// Keeps the admission key for the head just written (`written`: its text) and admits
    /// whoever announced meanwhile after a short pause (batches, not one by one).
    async fn keep_admitting(
        &self,
        j: &mut Join,
        written: &[u8],
        new: &RdzvState,
        batch_started: Instant,
    ) {
        let key = self.keys.admit(new.round);
        let old_seq = Head::decode(&j.text).ok().flatten().map_or(0, |h| h.seq);
        let ours = |seq: u64| format!("{seq} {}", self.me.id).into_bytes();
        let next = Head::decode(written).ok().flatten().map_or(0, |h| h.seq);
        if let Ok(got) = self
            .store
            .compare_set(&key, &ours(old_seq), &ours(next))
            .await
        {
            if got == ours(next) {
                let pause = j.m.keep_admitting(batch_started.elapsed());
                tokio::time::sleep(pause).await;
            }
        }
    }

    /// The join ended with `end` (`join_step`'s `Done`, `Closed` or `TimedOut`) on `state`.
    async fn join_ends(
        &mut self,
        j: &mut Join,
        state: &RdzvState,
        end: JoinStep,
        now: Instant,
    ) -> Result<Assignment, RendezvousError> {
        let id = self.me.id.clone();
        match end {
            JoinStep::Done => {
                let asg = assignment(state, &id, self.keys.prefix())
                    .expect("join_step returns Done only for a participant of a complete round");
                // The notices, roster and summary of this round, if its completer did not get
                // to write them (O(n): only then).
                if let Ok(None) = try_get(&*self.store, &self.keys.complete(state.round)).await {
                    publish(&*self.store, &self.keys, None, state).await;
                }
                let peers = state.participants.iter().map(|m| m.id.clone()).collect();
                Ok(self.finish(asg, RoundPeers::Ids(peers), state.num_nodes_waiting()))
            }
            JoinStep::Closed { redundant } => {
                ack_closed(&*self.store, &self.keys.closed_acks(), &id).await;
                Err(match &state.closed_reason {
                    Some(why) if !redundant => RendezvousError::JobFailed(why.clone()),
                    _ => RendezvousError::Closed { redundant },
                })
            }
            JoinStep::TimedOut(leave) => {
                if let Some(new) = leave {
                    // Best effort: leave the lists so the others do not wait for us.
                    let _ = write_state(&*self.store, &self.keys, &j.text, Some(state), &new).await;
                }
                Err(RendezvousError::Timeout {
                    waited: now.duration_since(j.started),
                    joined: state.participants.len(),
                    min: self.settings.min_nodes,
                })
            }
            JoinStep::Write(_) | JoinStep::Wait => unreachable!("not an end of the join"),
        }
    }
}
