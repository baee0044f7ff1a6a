//! What every renderer is handed with an event: the [`Renderer`] contract and the [`Facts`]
//! several renderers share — the fields every event line carries (`Common`: run id, attempt,
//! node rank, host), the current attempt's workers, and what the event being handed out meant,
//! measured once ([`Measured`]: how long a round, a spawn, a worker's life or a stop took).
//!
//! One struct, updated before the renderers and lent to them read-only, rather than a copy in
//! each renderer: a duration is read from the clock once, so that an event line and its metric
//! (`rendezvous_complete`'s `duration_s` and `rdrun_rendezvous_duration_seconds`,
//! `stop_end`'s `duration_s` and `rdrun_stop_duration_seconds`) show the same value, and the
//! health rules, the metrics and the exit events all read one table of workers (a child that is
//! not one of this attempt's workers is nobody's event). The renderers keep only what they
//! alone use (the event log its sinks and whether a `signal` line was written, the status line
//! its printer).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::event::RunEvent;
use super::lifecycle::Common;
use crate::supervisor::group::stop::{Phase, StopReason};

/// One renderer of the observer: it consumes the events it cares about and ignores the rest.
/// `mod.rs` hands each event to every renderer in turn, in a fixed order, after the facts were
/// updated.
pub trait Renderer: Send {
    fn on(&mut self, ev: &RunEvent<'_>, facts: &Facts);
}

/// A worker of the current attempt, for its exit event.
struct Worker {
    local_rank: usize,
    rank: usize,
    at: Instant,
    exited: bool,
}

/// The stop under way, for its "finished" event.
struct StopSeen {
    began: Instant,
    killed: bool,
}

/// A worker of this attempt exited (`RunEvent::Reaped`).
#[derive(Debug, Clone, Copy)]
pub struct Exited {
    pub local_rank: usize,
    pub rank: usize,
    /// Seconds since its spawn.
    pub ran_s: f64,
}

/// A stop of the group began with this turn of the agent's loop (`RunEvent::StopProgress`).
#[derive(Debug, Clone, Copy)]
pub struct StopBegan {
    pub reason: Option<StopReason>,
    /// The stop signal (`SIGKILL` when the stop was first seen already escalated).
    pub signal: i32,
    /// The grace before SIGKILL (zero when first seen escalated).
    pub grace: Duration,
}

/// A stop under way finished: the attempt's processes are gone (`RunEvent::AttemptOver`).
#[derive(Debug, Clone, Copy)]
pub struct StopEnded {
    pub took: Duration,
    /// The part of the grace it used (at most the grace).
    pub grace_used: Duration,
    /// It escalated to SIGKILL.
    pub killed: bool,
}

/// What the event being handed out meant, measured once by [`Facts::before`]; each field is
/// set only by the event its doc names, and cleared for every other.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// `RendezvousEnded`: the round's time in seconds (0 when its beginning was not seen).
    pub round_s: f64,
    /// `Spawned`: the group is complete with this worker, spawning it took this long.
    pub spawn_done: Option<Duration>,
    /// `Reaped`: the worker of this attempt that exited (`None`: not one).
    pub exited: Option<Exited>,
    /// `StopProgress`: a stop began with this turn.
    pub stop_began: Option<StopBegan>,
    /// `AttemptOver`: a stop under way finished.
    pub stop_ended: Option<StopEnded>,
}

/// The facts the renderers share (see the module docs).
pub struct Facts {
    /// The fields every event line carries.
    pub common: Common,
    /// What the event being handed out meant.
    pub now: Measured,
    /// Workers per node: the group is complete when this many were spawned.
    nproc: usize,
    /// The stop's grace (`--shutdown-timeout`).
    grace: Duration,
    rdzv_began: Option<Instant>,
    spawn_began: Option<Instant>,
    workers: HashMap<i32, Worker>,
    stop: Option<StopSeen>,
}

impl Facts {
    pub fn new(common: Common, nproc: usize, grace: Duration) -> Facts {
        Facts {
            common,
            now: Measured::default(),
            nproc,
            grace,
            rdzv_began: None,
            spawn_began: None,
            workers: HashMap::new(),
            stop: None,
        }
    }

    /// Updates the facts for `ev`, before any renderer sees it.
    pub fn before(&mut self, ev: &RunEvent<'_>) {
        self.now = Measured::default();
        match ev {
            RunEvent::RendezvousBegins(_) => self.rdzv_began = Some(Instant::now()),
            RunEvent::RendezvousEnded(res) => {
                self.now.round_s = self
                    .rdzv_began
                    .take()
                    .map_or(0.0, |t| t.elapsed().as_secs_f64());
                if let Ok(asg) = res {
                    self.common.node_rank = Some(asg.group_rank);
                    // The round's job-wide restart count is the attempt its workers run
                    // (TORCHELASTIC_RESTART_COUNT); a node joining late learns it only here.
                    self.common.attempt = asg.restart_count;
                }
            }
            RunEvent::AttemptBegins { attempt, .. } => {
                self.common.attempt = *attempt;
                self.workers.clear();
                self.stop = None;
                self.spawn_began = Some(Instant::now());
            }
            RunEvent::Spawned {
                local_rank,
                rank,
                pid,
                ..
            } => self.spawned(*local_rank, *rank, *pid),
            RunEvent::Reaped { pid, .. } => {
                if let Some(w) = self.workers.get_mut(pid) {
                    w.exited = true;
                    self.now.exited = Some(Exited {
                        local_rank: w.local_rank,
                        rank: w.rank,
                        ran_s: w.at.elapsed().as_secs_f64(),
                    });
                }
            }
            RunEvent::StopProgress { stop, .. } => self.stop_progress(stop.phase(), stop.reason()),
            RunEvent::AttemptOver => {
                if let Some(s) = self.stop.take() {
                    let took = s.began.elapsed();
                    self.now.stop_ended = Some(StopEnded {
                        took,
                        grace_used: took.min(self.grace),
                        killed: s.killed,
                    });
                }
            }
            _ => {}
        }
    }

    /// Updates the facts once every renderer saw `ev`: a `restart` line carries the attempt it
    /// ends; what follows (the next round's rendezvous events) belongs to the next attempt.
    pub fn after(&mut self, ev: &RunEvent<'_>) {
        if let RunEvent::Restart { next, .. } = ev {
            self.common.attempt = *next;
        }
    }

    fn spawned(&mut self, local_rank: usize, rank: usize, pid: i32) {
        self.workers.insert(
            pid,
            Worker {
                local_rank,
                rank,
                at: Instant::now(),
                exited: false,
            },
        );
        if self.workers.len() == self.nproc {
            self.now.spawn_done = Some(
                self.spawn_began
                    .take()
                    .map_or(Duration::ZERO, |t| t.elapsed()),
            );
        }
    }

    /// Notices when a stop begins and when it escalates to SIGKILL.
    fn stop_progress(&mut self, phase: Phase, reason: Option<StopReason>) {
        match phase {
            Phase::Running => {}
            Phase::Grace(_) => {
                if self.stop.is_none() {
                    let signal = match reason {
                        Some(StopReason::Signal(s)) => s,
                        _ => libc::SIGTERM,
                    };
                    self.stop = Some(StopSeen {
                        began: Instant::now(),
                        killed: false,
                    });
                    self.now.stop_began = Some(StopBegan {
                        reason,
                        signal,
                        grace: self.grace,
                    });
                }
            }
            Phase::Killed(_) => {
                if let Some(s) = self.stop.as_mut() {
                    s.killed = true;
                } else {
                    self.stop = Some(StopSeen {
                        began: Instant::now(),
                        killed: true,
                    });
                    self.now.stop_began = Some(StopBegan {
                        reason,
                        signal: libc::SIGKILL,
                        grace: Duration::ZERO,
                    });
                }
            }
        }
    }

    /// A stop of the current attempt's group is under way.
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// Every worker of the current attempt was spawned and has exited.
    pub fn group_exited(&self) -> bool {
        self.workers.len() == self.nproc && self.workers.values().all(|w| w.exited)
    }

    /// The workers of the last attempt as (local rank, global rank), by rank.
    pub fn last_ranks(&self) -> Vec<(usize, usize)> {
        let mut ranks: Vec<(usize, usize)> = self
            .workers
            .values()
            .map(|w| (w.local_rank, w.rank))
            .collect();
        ranks.sort_by_key(|&(local, rank)| (rank, local));
        ranks.dedup();
        ranks
    }
}
