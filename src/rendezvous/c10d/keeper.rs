//! The c10d keeper: the background task of one agent that beats its heartbeat and monitors
//! the round it runs (the version, the watched peers' heartbeats, its own notice), turning what
//! it sees into [`RdzvEvent`]s for the agent.

use super::io::*;
use super::*;

/// The background task of one agent: heartbeats, and monitoring of the round it runs.
pub(super) struct Keeper<S: RdzvStore> {
    pub(super) store: Arc<S>,
    pub(super) settings: C10dSettings,
    pub(super) keys: Keys,
    pub(super) me: String,
    pub(super) shared: SharedRef,
    pub(super) tx: mpsc::UnboundedSender<(u64, RdzvEvent)>,
}

/// What the keeper last read of the round it monitors: the version, the head at it, and the
/// peers this node watches (its notice).
struct Seen {
    version: Vec<u8>,
    head: Head,
    targets: Vec<String>,
}

impl Seen {
    /// The keys one poll reads (the version, then the watched heartbeats), once the version key
    /// is known to exist.
    fn poll_keys(&self, keys: &Keys, round: u64) -> Option<Vec<String>> {
        if self.version.is_empty() || self.head.round != round {
            return None;
        }
        let mut out = vec![keys.version()];
        out.extend(self.targets.iter().map(|id| keys.hb(id)));
        Some(out)
    }
}

/// The keeper's monitoring memory for one round.
struct Monitor {
    round: u64,
    /// The waiting count last reported.
    waiting: usize,
    /// The round ended (another round, a close): nothing more to report for it.
    ended: bool,
    seen: Option<Seen>,
    tracker: HeartbeatTracker,
    /// This keeper counts itself on the round's suspects counter.
    suspecting: bool,
}

impl<S: RdzvStore> Keeper<S> {
    pub(super) async fn run(self) {
        let interval = self.settings.keep_alive_interval;
        let poll = self.settings.poll_interval;
        let tick = interval.min(poll);
        let hb_key = self.keys.hb(&self.me);
        let mut next_beat = Instant::now();
        let mut next_poll = Instant::now();
        let mut loss = StoreLoss::new(Instant::now());
        let mut mon: Option<Monitor> = None;
        loop {
            let now = Instant::now();
            let running = lock(&self.shared).running;
            if let Some(round) = running {
                // A suspicion stays on the counter of a round that ended: it is the round's
                // record that a peer stalled (read by `lost_peers_after_failure`).
                if mon.as_ref().map(|m| m.round) != Some(round) {
                    mon = Some(Monitor {
                        round,
                        waiting: 0,
                        ended: false,
                        seen: None,
                        tracker: HeartbeatTracker::default(),
                        suspecting: false,
                    });
                }
            }
            // The beat and the poll fall due together (both every second by default): one
            // round trip carries both (issue 16: the store's load per node per second).
            let combined = match mon.as_ref().filter(|m| running == Some(m.round)) {
                Some(m) if now >= next_beat && now >= next_poll && !m.ended => m
                    .seen
                    .as_ref()
                    .and_then(|s| s.poll_keys(&self.keys, m.round)),
                _ => None,
            };
            if let Some(keys) = combined {
                next_beat = now + interval;
                next_poll = now + poll;
                let r = tokio::time::timeout(
                    self.settings.heartbeat_timeout,
                    self.store.beat_and_read(&hb_key, &keys),
                )
                .await;
                let values = match r {
                    Ok(Ok(v)) if v.len() == keys.len() => {
                        loss.ok(Instant::now());
                        Some(v)
                    }
                    Ok(Ok(_)) => {
                        loss.ok(Instant::now());
                        None
                    }
                    Ok(Err(e)) => {
                        if self.beat_failed(&mut loss, running, e.to_string()) {
                            return;
                        }
                        None
                    }
                    Err(_) => {
                        if self.beat_failed(&mut loss, running, "heartbeat timed out".into()) {
                            return;
                        }
                        None
                    }
                };
                if let (Some(values), Some(m)) = (values, mon.as_mut()) {
                    if let Err(e) = self.monitor(m, Some(values)).await {
                        tracing::debug!(error = %e, "monitoring the rendezvous failed");
                    }
                }
                tokio::time::sleep(tick).await;
                continue;
            }
            if now >= next_beat {
                next_beat = now + interval;
                let lost = match beat(&*self.store, &hb_key, self.settings.heartbeat_timeout).await
                {
                    Ok(()) => {
                        loss.ok(Instant::now());
                        false
                    }
                    Err(why) => self.beat_failed(&mut loss, running, why),
                };
                if lost {
                    // Fatal (no node can take the store over): nothing left to beat or watch.
                    return;
                }
            }
            if let Some(m) = mon.as_mut().filter(|m| running == Some(m.round)) {
                if now >= next_poll && !m.ended {
                    next_poll = now + poll;
                    if let Err(e) = self.monitor(m, None).await {
                        tracing::debug!(error = %e, "monitoring the rendezvous failed");
                    }
                }
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// Records a failed beat; true once the store counts as lost (then it is recorded for
    /// `next_round`/`close`, and reported to a running round).
    fn beat_failed(&self, loss: &mut StoreLoss, running: Option<u64>, why: String) -> bool {
        let lost = loss.failed(
            Instant::now(),
            self.settings.keep_alive_interval,
            self.settings.keep_alive_max_attempt,
        );
        tracing::warn!(failures = loss.failures(), error = %why, "rendezvous heartbeat failed");
        if lost {
            lock(&self.shared).lost = Some(why.clone());
            if let Some(round) = running {
                let _ = self.tx.send((round, RdzvEvent::StoreUnreachable(why)));
            }
        }
        lost
    }

    /// One poll of the running round: the version counter and the heartbeats of the few watched
    /// peers (one multi_get); the small head and this node's notice only when the version moved.
    /// A watched peer found dead is dropped from the state (read for that, rarely), which every
    /// other node then sees through the version.
    async fn monitor(
        &self,
        m: &mut Monitor,
        read: Option<Vec<Vec<u8>>>,
    ) -> Result<(), StoreOpError> {
        let round = m.round;
        // Once the version key is known to exist (keys are never removed), the version and the
        // watched heartbeats are one multi_get (`read`: already done with the beat).
        let poll_keys = m.seen.as_ref().and_then(|s| s.poll_keys(&self.keys, round));
        let (version, mut beats) = match (&m.seen, poll_keys) {
            (Some(s), Some(keys)) => {
                let mut values = match read {
                    Some(v) => v,
                    None => self.store.multi_get(&keys).await?,
                };
                let version = values.remove(0);
                let beats: Vec<(String, Vec<u8>)> = s.targets.iter().cloned().zip(values).collect();
                (version, Some(beats))
            }
            _ => (read_version(&*self.store, &self.keys).await?, None),
        };
        let fresh = m
            .seen
            .as_ref()
            .map_or(true, |s| s.version != version || s.head.round != round);
        if fresh {
            if !self.refresh(m, version).await? {
                return Ok(());
            }
            // The watched peers may have changed with the state.
            beats = None;
        }
        let seen = m.seen.as_ref().expect("read above");
        let beats = match beats {
            Some(b) => b,
            None => read_beats(&*self.store, &self.keys, seen.targets.clone()).await?,
        };
        let now = Instant::now();
        let dead = m.tracker.observe(now, beats, self.settings.dead_after());
        // A stalled watched peer is published for agents whose workers just failed (see
        // `lost_peers_after_failure`), and withdrawn once it beats again or is dropped.
        let stalled = !m
            .tracker
            .silent(now, self.settings.keep_alive_interval * SUSPECT_AFTER)
            .is_empty();
        if stalled != m.suspecting {
            let delta = if stalled { 1 } else { -1 };
            if self
                .store
                .add(&self.keys.suspects(round), delta)
                .await
                .is_ok()
            {
                m.suspecting = stalled;
            }
        }
        if dead.is_empty() {
            return Ok(());
        }
        self.drop_dead(m, dead).await
    }

    /// The head (and this node's notice) after the version moved: `Ok(false)` when the round
    /// ended (closed, or another round began: the event is sent) or the head did not decode;
    /// else the new view is in `m.seen`.
    async fn refresh(&self, m: &mut Monitor, version: Vec<u8>) -> Result<bool, StoreOpError> {
        let round = m.round;
        let text = read_head(&*self.store, &self.keys).await?;
        let Ok(Some(head)) = Head::decode(&text) else {
            return Ok(false);
        };
        let send = |ev| {
            let _ = self.tx.send((round, ev));
        };
        if head.closed {
            m.ended = true;
            ack_closed(&*self.store, &self.keys.closed_acks(), &self.me).await;
            let st = RdzvState {
                closed: true,
                closed_reason: head.closed_reason.clone(),
                ..RdzvState::default()
            };
            send(closed_event(&st));
            return Ok(false);
        }
        if head.round != round {
            m.ended = true;
            send(RdzvEvent::RoundChanged {
                round: head.round,
                reason: head.reason,
            });
            return Ok(false);
        }
        let waiting = head.waiting;
        lock(&self.shared).waiting = waiting;
        if waiting > 0 && waiting != m.waiting {
            send(RdzvEvent::NodesWaiting(waiting));
        }
        m.waiting = waiting;
        let targets = match read_notice(&*self.store, &self.keys, round, &self.me).await? {
            Some(n) => n.targets,
            None => m
                .seen
                .as_ref()
                .map(|s| s.targets.clone())
                .unwrap_or_default(),
        };
        m.seen = Some(Seen {
            version,
            head,
            targets,
        });
        Ok(true)
    }

    /// Drops the watched peers found dead from the state (compare-and-set; a lost race is read
    /// again next poll) and tells the agent when that ended its round.
    async fn drop_dead(&self, m: &mut Monitor, dead: Vec<String>) -> Result<(), StoreOpError> {
        let round = m.round;
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        let (text, state) = match load_state(&*self.store, &self.keys).await {
            Ok(v) => v,
            Err(ReadError::Store(e)) => return Err(e),
            Err(ReadError::State(_)) => return Ok(()),
        };
        if state.round != round {
            // Moved on meanwhile: the version shows it next poll.
            m.seen = None;
            return Ok(());
        }
        let Some(new) = prune_dead(&state, &dead, min, max) else {
            return Ok(());
        };
        match write_state(&*self.store, &self.keys, &text, Some(&state), &new).await? {
            Wrote::Won(_) => {
                tracing::warn!(?dead, round, "peers stopped heartbeating; dropped them");
                if new.round != round {
                    m.ended = true;
                    send_lost(&self.tx, round, dead);
                }
            }
            Wrote::Lost(_) => {
                // The state moved under us: read it again next poll.
                m.seen = None;
            }
        }
        Ok(())
    }
}

/// Reports peers this keeper dropped to the agent running `round`.
fn send_lost(tx: &mpsc::UnboundedSender<(u64, RdzvEvent)>, round: u64, dead: Vec<String>) {
    let _ = tx.send((round, RdzvEvent::PeersLost(dead)));
}
