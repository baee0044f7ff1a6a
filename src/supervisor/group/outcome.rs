//! How one attempt ended ([`Outcome`]: what the report and the restart decision need) and what a
//! rendezvous event means for the running attempt ([`rendezvous_end`]). The attempt
//! (`attempt.rs`) produces an `Outcome`; the agent and `restart::decide` read it.

use crate::rendezvous::{RdzvEvent, RoundReason};

use crate::supervisor::group::restart::AttemptEnd;
use crate::supervisor::report::failure::Failure;
use crate::supervisor::watch::verdict::HangFinding;

/// How one attempt ended, with what the report and the decision need.
#[derive(Debug)]
pub(in crate::supervisor) enum Outcome {
    Succeeded,
    /// Workers failed; `peer_loss`: a peer node was reported lost close to the first failure
    /// (the reason the round would have had, and the lost nodes).
    Failed {
        failures: Vec<Failure>,
        peer_loss: Option<(RoundReason, Vec<String>)>,
        /// The group was stopped because it hung (kill mode): the report's root cause.
        hang: Option<HangFinding>,
    },
    Interrupted {
        signal: i32,
        failures: Vec<Failure>,
    },
    LauncherError(String),
    /// The rendezvous membership changed (multi-node): join the next round with `reason`.
    Regroup {
        reason: RoundReason,
        lost: Vec<String>,
    },
    /// The rendezvous was closed or its store became unreachable: the run cannot go on.
    RendezvousLost(String),
}

impl Outcome {
    /// When rdrun observed the attempt's first failure, if a worker failed.
    pub(in crate::supervisor) fn first_failure_at(&self) -> Option<std::time::SystemTime> {
        match self {
            Outcome::Failed { failures, .. } | Outcome::Interrupted { failures, .. } => {
                failures.iter().map(|f| f.observed_at).min()
            }
            _ => None,
        }
    }

    /// What [`restart::decide`] needs to know of it.
    pub(in crate::supervisor) fn attempt_end(&self) -> AttemptEnd {
        match self {
            Outcome::Succeeded => AttemptEnd::Succeeded,
            Outcome::Failed {
                peer_loss: None, ..
            } => AttemptEnd::Failed,
            Outcome::Failed {
                peer_loss: Some((reason, _)),
                ..
            } => AttemptEnd::FailedWithPeerLoss {
                charged: *reason == RoundReason::PeerLost,
            },
            Outcome::Regroup { reason, .. } => AttemptEnd::Regroup {
                charged: *reason == RoundReason::PeerLost,
            },
            Outcome::Interrupted { .. } => AttemptEnd::Interrupted,
            Outcome::LauncherError(_) => AttemptEnd::LauncherError,
            Outcome::RendezvousLost(_) => AttemptEnd::RendezvousLost,
        }
    }

    /// What ended the attempt, in words, for a restart's record (`--report-json`'s `restarts`):
    /// `sig`, the run's root cause when it was a plain worker failure (`ValueError at
    /// train.py:88`, `exit code 3`); `hang`; `node(s) lost: …` (a failure that came with it is
    /// counted as the loss, as the restart decision does); `membership change`.
    /// (`sig` is a `verdict::Signature`; taken as `Display` so that this file, which
    /// `verdict.rs` reads, does not import it back.)
    pub(in crate::supervisor) fn cause(&self, sig: Option<&impl std::fmt::Display>) -> String {
        let lost_nodes = |lost: &[String]| match lost.is_empty() {
            true => "membership change".to_string(),
            false => format!("node(s) lost: {}", lost.join(", ")),
        };
        match self {
            Outcome::Failed {
                peer_loss: Some((_, lost)),
                ..
            }
            | Outcome::Regroup { lost, .. } => lost_nodes(lost),
            Outcome::Failed { hang: Some(_), .. } => "hang".to_string(),
            Outcome::Failed { .. } => {
                sig.map_or_else(|| "worker failure".into(), ToString::to_string)
            }
            Outcome::Succeeded => "succeeded".to_string(),
            Outcome::Interrupted { signal, .. } => crate::exit::signal_label(*signal),
            Outcome::LauncherError(msg) | Outcome::RendezvousLost(msg) => msg.clone(),
        }
    }

    /// The peer nodes a regroup is about (lost ones), logging why the group regroups.
    pub(in crate::supervisor) fn log_regroup(&self) {
        let lost = match self {
            Outcome::Regroup { lost, .. } => lost.as_slice(),
            Outcome::Failed {
                peer_loss: Some((_, lost)),
                ..
            } => {
                tracing::warn!(
                    ?lost,
                    "the workers failed while peer node(s) were lost; counting the failure as the membership change"
                );
                lost.as_slice()
            }
            _ => &[],
        };
        if lost.is_empty() {
            tracing::warn!(
                "rendezvous membership changed; stopping the workers and joining the next round"
            );
        } else {
            tracing::warn!(
                ?lost,
                "peer node(s) stopped heartbeating; stopping the workers and joining the next round"
            );
        }
    }
}

/// What a rendezvous event means for the running attempt. A static job cannot shrink: a lost
/// peer is a failure of the job (charged, `PeerLost`); a c10d job regroups without it.
pub(in crate::supervisor) fn rendezvous_end(ev: RdzvEvent, static_job: bool) -> Outcome {
    match ev {
        RdzvEvent::Closed => Outcome::RendezvousLost(
            "the rendezvous was closed: its store says so (normally another node's job finished \
             or gave up there; any client of the unauthenticated store can write that mark)"
                .into(),
        ),
        RdzvEvent::StoreUnreachable(msg) => {
            Outcome::RendezvousLost(format!("lost the rendezvous store: {msg}"))
        }
        RdzvEvent::JobFailed(why) => {
            Outcome::RendezvousLost(format!("the job {why}; its agent closed the rendezvous"))
        }
        RdzvEvent::PeersLost(lost) => Outcome::Regroup {
            reason: if static_job {
                RoundReason::PeerLost
            } else {
                RoundReason::Membership
            },
            lost,
        },
        RdzvEvent::NodesWaiting(_) | RdzvEvent::RoundChanged { .. } => Outcome::Regroup {
            reason: RoundReason::Membership,
            lost: Vec::new(),
        },
    }
}
