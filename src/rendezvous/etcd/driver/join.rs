//! The steps of [`EtcdRendezvous::next_round`]'s join loop: the last call's clock, this
//! agent's join announcement and the pending joiners, what a waiting agent checks (the
//! `--nnodes` of the others, expired leases), the state's compare-and-set write, and the
//! completed round taken.

use super::*;

/// The last call of an incomplete round this agent is in: the round and last-call sequence it
/// was first seen for, and when.
#[derive(Default)]
pub(super) struct LastCall(Option<((u64, u64), Instant)>);

impl LastCall {
    /// Whether the last call of `state` (with at least `min` participants, this agent among
    /// them) has run for `timeout`; pulls `wake_at` in to its end.
    pub(super) fn expired(
        &mut self,
        state: &RdzvState,
        id: &str,
        min: usize,
        now: Instant,
        timeout: Duration,
        wake_at: &mut Instant,
    ) -> bool {
        if state.complete || !state.is_participant(id) || state.participants.len() < min {
            return false;
        }
        let key = (state.round, state.last_call_seq);
        match self.0 {
            Some((k, since)) if k == key => {
                let end = since + timeout;
                *wake_at = (*wake_at).min(end);
                now >= end
            }
            _ => {
                self.0 = Some((key, now));
                *wake_at = (*wake_at).min(now + timeout);
                timeout.is_zero()
            }
        }
    }
}

impl EtcdRendezvous {
    /// For an agent not yet in an open round: announces it (once per round, leased), and reads
    /// every announced joiner, ordered by address. Empty otherwise or when etcd does not answer.
    pub(super) async fn pending_joiners(
        &self,
        state: &RdzvState,
        announced: &mut Option<u64>,
    ) -> Vec<Member> {
        let id = &self.me.id;
        let mut pending = Vec::new();
        if state.complete || state.closed || state.is_participant(id) {
            return pending;
        }
        let prefix = self.keys.joiners(state.round);
        if *announced != Some(state.round) {
            let line = serde_json::to_vec(&self.me).expect("member serializes");
            if self
                .etcd
                .put(&self.keys.joiner(state.round, id), line, Some(self.lease))
                .await
                .is_ok()
            {
                *announced = Some(state.round);
            }
        }
        if let Ok((kvs, _)) = self.etcd.get_prefix(&prefix).await {
            pending = kvs
                .into_iter()
                .filter_map(|(_, v)| serde_json::from_slice::<Member>(&v).ok())
                .collect();
            // Announcement order is not kept by a prefix read; order by address as the
            // round's ranks are (the write admits them all at once anyway).
            state::order_participants(&mut pending, &[]);
        }
        pending
    }

    /// The round is complete with this agent in it: its assignment, and the round recorded
    /// as running (peers, waiting count, the keeper told).
    pub(super) fn round_complete(&mut self, state: &RdzvState) -> Assignment {
        let id = self.me.id.clone();
        let asg = assignment(state, &id, &self.keys.store_prefix())
            .expect("join_step returns Done only for a participant of a complete round");
        self.my_round = Some(state.round);
        self.round_peers = state
            .participants
            .iter()
            .filter(|m| m.id != id)
            .map(|m| m.id.clone())
            .collect();
        {
            let mut sh = lock(&self.shared);
            sh.running = Some(state.round);
            sh.waiting = state.num_nodes_waiting();
        }
        self.running_changed.notify_one();
        tracing::debug!(round = asg.round, "etcd round complete");
        asg
    }

    /// While waiting: an agent given another `--nnodes` ends the join (this agent takes itself
    /// out of the state first); peers whose lease expired are dropped (the new state to write).
    pub(super) async fn while_waiting(
        &self,
        state: &RdzvState,
        seen: i64,
        min: usize,
        max: usize,
    ) -> Result<Option<RdzvState>, RendezvousError> {
        let id = &self.me.id;
        let mine = nnodes_text(min, max);
        if let Ok((kvs, _)) = self.etcd.get_prefix(&self.keys.nnodes_prefix()).await {
            if let Some((other_node, other)) = kvs.into_iter().find_map(|(who, n)| {
                let n = String::from_utf8_lossy(&n).into_owned();
                (n != mine).then_some((who, n))
            }) {
                let mut new = state.clone();
                new.remove_everywhere(id);
                let _ = self
                    .etcd
                    .compare_and_set(&self.keys.state(), seen, new.encode())
                    .await;
                return Err(RendezvousError::NnodesDisagree {
                    mine,
                    other_node,
                    other,
                });
            }
        }
        // Peers whose lease expired while this agent waits are dropped, so the round can go on
        // without them.
        Ok(match alive_ids(&self.etcd, &self.keys).await {
            Ok(alive) => {
                let dead = dead_among(state, id, &alive);
                if dead.is_empty() {
                    None
                } else {
                    tracing::warn!(?dead, "dropping nodes whose etcd lease expired");
                    prune_dead(state, &dead, min, max)
                }
            }
            Err(_) => None,
        })
    }

    /// Writes `new` over the state read at revision `seen`; a lost race pauses a random moment.
    pub(super) async fn write_state(&self, seen: i64, new: RdzvState, lost_races: &mut u32) {
        match self
            .etcd
            .compare_and_set(&self.keys.state(), seen, new.encode())
            .await
        {
            Ok(true) => *lost_races = 0,
            Ok(false) => {
                // Lost a race: a random pause, so agents joining together do not retry in
                // lockstep.
                *lost_races += 1;
                let cap = Duration::from_millis(1u64 << (*lost_races).min(7))
                    .min(Duration::from_millis(100));
                tokio::time::sleep(cap.mul_f64(fastrand::f64())).await;
            }
            Err(e) => tracing::warn!(error = %e, "etcd write failed; retrying"),
        }
    }
}
