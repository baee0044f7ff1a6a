//! The etcd driver's keeper: the background task of one agent that renews its lease every
//! TTL/3 and watches the round it runs (dead peers, a new round, waiting nodes, a close),
//! turning what it sees into [`RdzvEvent`]s for the agent.

use super::*;

/// The background task of one agent: renews the lease, and watches the running round.
pub(super) struct Keeper {
    pub(super) etcd: Etcd,
    pub(super) settings: EtcdSettings,
    pub(super) keys: Keys,
    pub(super) me: String,
    pub(super) lease: i64,
    pub(super) shared: SharedRef,
    pub(super) running_changed: Arc<Notify>,
    pub(super) tx: mpsc::UnboundedSender<(u64, RdzvEvent)>,
}

impl Keeper {
    pub(super) async fn run(self) {
        let ttl = self.settings.ttl;
        let beat_every = ttl / 3;
        let mut next_beat = Instant::now() + beat_every;
        let mut last_ok = Instant::now();
        let mut waker: Option<Waker> = None;
        // The round monitored, and whether its end was already reported.
        let mut monitored: Option<(u64, bool)> = None;
        let mut last_waiting = 0usize;
        let mut dirty = true;
        loop {
            let running = lock(&self.shared).running;
            if let Some(round) = running {
                if monitored.map(|m| m.0) != Some(round) {
                    monitored = Some((round, false));
                    last_waiting = 0;
                    dirty = true;
                }
                if dirty && !monitored.is_some_and(|m| m.1) {
                    dirty = false;
                    match self.monitor(round, &mut last_waiting, &mut waker).await {
                        Ok(true) => monitored = Some((round, true)),
                        Ok(false) => {}
                        Err(e) => {
                            dirty = true;
                            tracing::debug!(error = %e, "watching the etcd rendezvous failed");
                        }
                    }
                }
            }
            let watching = running.is_some() && !monitored.is_some_and(|m| m.1);
            tokio::select! {
                _ = tokio::time::sleep_until(next_beat) => {
                    next_beat = Instant::now() + beat_every;
                    match self.etcd.keep_alive_once(self.lease).await {
                        Ok(left) if left > 0 => last_ok = Instant::now(),
                        Ok(_) => {
                            self.lost(running, format!(
                                "this node's etcd lease expired (no renewal reached etcd at {} \
                                 for {}s), so the other nodes dropped it",
                                self.etcd.endpoints(), ttl.as_secs()));
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "renewing the etcd lease failed");
                            if last_ok.elapsed() >= ttl {
                                self.lost(running, format!(
                                    "no etcd member at {} renewed this node's lease for {}s \
                                     (is a majority of the etcd cluster down?): {e}",
                                    self.etcd.endpoints(), ttl.as_secs()));
                                return;
                            }
                            // Retry soon: the client fails over to another member.
                            next_beat = Instant::now() + Duration::from_millis(300).min(beat_every);
                        }
                    }
                }
                events = async {
                    match waker.as_mut() {
                        Some(w) => w.wait(Duration::from_secs(5)).await,
                        None => std::future::pending().await,
                    }
                }, if watching && waker.is_some() => {
                    if !events.is_empty() {
                        dirty = true;
                    }
                }
                _ = self.running_changed.notified() => {}
            }
        }
    }

    fn lost(&self, running: Option<u64>, why: String) {
        tracing::error!("{why}");
        lock(&self.shared).lost = Some(why.clone());
        if let Some(round) = running {
            let _ = self.tx.send((round, RdzvEvent::StoreUnreachable(why)));
        }
    }

    /// Re-reads the state and the alive keys; true when the round ended (event sent).
    async fn monitor(
        &self,
        round: u64,
        last_waiting: &mut usize,
        waker: &mut Option<Waker>,
    ) -> Result<bool, RendezvousError> {
        let (state, seen, revision) = read_state(&self.etcd, &self.keys).await?;
        if waker.is_none() {
            *waker = Some(Waker::new(&self.etcd, &self.keys, revision + 1));
        }
        let send = |ev| {
            let _ = self.tx.send((round, ev));
        };
        if state.closed {
            send(closed_event(&state));
            return Ok(true);
        }
        if state.round != round {
            send(RdzvEvent::RoundChanged {
                round: state.round,
                reason: state.reason,
            });
            return Ok(true);
        }
        let waiting = state.num_nodes_waiting();
        lock(&self.shared).waiting = waiting;
        if waiting > 0 && waiting != *last_waiting {
            send(RdzvEvent::NodesWaiting(waiting));
        }
        *last_waiting = waiting;
        let alive = alive_ids(&self.etcd, &self.keys).await?;
        let dead = dead_among(&state, &self.me, &alive);
        if dead.is_empty() {
            return Ok(false);
        }
        let (min, max) = (
            self.settings.rounds.min_nodes,
            self.settings.rounds.max_nodes,
        );
        let Some(new) = prune_dead(&state, &dead, min, max) else {
            return Ok(false);
        };
        if self
            .etcd
            .compare_and_set(&self.keys.state(), seen, new.encode())
            .await?
        {
            tracing::warn!(?dead, round, "peers' etcd leases expired; dropped them");
            if new.round != round {
                send(RdzvEvent::PeersLost(dead));
                return Ok(true);
            }
            return Ok(false);
        }
        // Lost a race: whatever was written instead is read on the next pass.
        Err(RendezvousError::Store(StoreOpError(
            "state changed; re-reading".into(),
        )))
    }
}
