//! The agent's side of the rendezvous (multi-node): whether a launch uses one, joining a round,
//! the exit barrier and closing after success, and waiting on either while only a shutdown
//! signal can interrupt. What a rendezvous event means for a running attempt stays with the
//! agent's select loop; what it costs is [`crate::supervisor::group::restart::decide`]'s.

use std::future::Future;
use std::time::Duration;

use crate::rendezvous::{
    Assignment, RdzvEvent, Rendezvous, RendezvousError, RoundReason, RoundRequest,
};

use crate::supervisor::group::signals::{self, SignalAction, Signals};
use crate::supervisor::report::end::{error_chain, RunEnd};

/// How long a node that does not host the rendezvous store tries to close the rendezvous after
/// a successful exit barrier (the host closes it anyway and may be gone already).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The next rendezvous event; pending forever without a rendezvous.
pub(crate) async fn watch_opt(rdzv: Option<&mut Rendezvous>) -> RdzvEvent {
    match rdzv {
        Some(r) => r.watch().await,
        None => std::future::pending().await,
    }
}

/// Runs `fut` unless a shutdown signal arrives first (then `Err(signal)`). Other handled
/// signals have no worker to go to while no attempt runs; they are logged and dropped.
pub(crate) async fn until_shutdown<T>(
    signals: &mut Signals,
    fut: impl Future<Output = T>,
) -> Result<T, i32> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            v = &mut fut => return Ok(v),
            sig = signals.recv() => {
                if signals::action(sig) == SignalAction::Shutdown {
                    return Err(sig);
                }
                tracing::info!("received {} while no worker runs; ignoring it", crate::exit::signal_label(sig));
            }
        }
    }
}

/// After this node's workers failed: the peers lost around the failure (see
/// `Rendezvous::lost_peers_after_failure`), unless a shutdown signal comes first.
pub(crate) async fn lost_peers_after_failure(
    rdzv: &mut Rendezvous,
    signals: &mut Signals,
) -> Result<Vec<String>, i32> {
    let lost = until_shutdown(signals, rdzv.lost_peers_after_failure()).await?;
    if !lost.is_empty() {
        tracing::warn!(
            ?lost,
            "peer node(s) lost around this node's worker failure; the failure is the membership change's (not charged)"
        );
    }
    Ok(lost)
}

/// Joins the next rendezvous round; on failure, how the run ends.
pub(crate) async fn join_round(
    rdzv: &mut Rendezvous,
    signals: &mut Signals,
    reason: RoundReason,
    master_port: u16,
) -> Result<Assignment, RunEnd> {
    let req = RoundRequest {
        reason,
        master_port,
    };
    match until_shutdown(signals, rdzv.next_round(req)).await {
        Ok(Ok(asg)) => {
            tracing::info!(
                round = asg.round,
                group_rank = asg.group_rank,
                group_world_size = asg.group_world_size,
                world_size = asg.world_size,
                restart_count = asg.restart_count,
                master = %crate::rendezvous::addr::host_port(&asg.master_addr, asg.master_port),
                "rendezvous round complete"
            );
            Ok(asg)
        }
        Ok(Err(RendezvousError::Closed { redundant: true })) => {
            tracing::warn!("the job finished while this node waited to join; nothing to do");
            Err(RunEnd::Succeeded)
        }
        Ok(Err(err)) => Err(RunEnd::from_error(err)),
        Err(signal) => Err(interrupted_in_rendezvous(signal)),
    }
}

/// After local success: the exit barrier (errors are only logged, as torchrun), then close.
/// Returns the shutdown signal that ended the barrier early, if one did.
pub(crate) async fn finish(
    rdzv: &mut Rendezvous,
    signals: &mut Signals,
    asg: &Assignment,
    timeout: Duration,
) -> Option<i32> {
    match until_shutdown(signals, rdzv.exit_barrier(asg, timeout)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::error!("exit barrier: {}", error_chain(&err)),
        Err(sig) => {
            tracing::warn!(
                "received {} in the exit barrier",
                crate::exit::signal_label(sig)
            );
            return Some(sig);
        }
    }
    // The store's host lingers in the barrier until every agent has departed, then closes
    // (for nodes still waiting to join). The others try briefly: the host may be gone.
    if rdzv.server.is_some() {
        close(rdzv).await;
    } else if tokio::time::timeout(CLOSE_WAIT, close_quiet(rdzv))
        .await
        .is_err()
    {
        tracing::debug!("rendezvous store gone after the exit barrier; not closing it");
    }
    None
}

/// [`close`] with failures at debug level (the store may be gone already).
async fn close_quiet(rdzv: &mut Rendezvous) {
    if let Err(err) = rdzv.close().await {
        tracing::debug!("cannot close the rendezvous: {}", error_chain(&err));
    }
}

/// Closes the rendezvous after this node's failure (the others name this node); errors are
/// only logged.
pub(crate) async fn close_failed(rdzv: &mut Rendezvous, verdict: Option<&str>) {
    if let Err(err) = rdzv.close_failed(verdict).await {
        tracing::warn!("cannot close the rendezvous: {}", error_chain(&err));
    }
}

/// Closes the rendezvous for every node (the job is over); errors are only logged.
pub(crate) async fn close(rdzv: &mut Rendezvous) {
    if let Err(err) = rdzv.close().await {
        tracing::warn!("cannot close the rendezvous: {}", error_chain(&err));
    }
}

/// The end of a run that a shutdown signal reached while it joined a rendezvous (said once).
pub(in crate::supervisor) fn interrupted_in_rendezvous(signal: i32) -> RunEnd {
    tracing::warn!(
        "received {} during the rendezvous, exiting",
        crate::exit::signal_label(signal)
    );
    RunEnd::Interrupted {
        signal,
        report: None,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::RdzvBackend;

    use crate::config::testkit::launch_config as config;

    #[test]
    fn which_launches_use_the_rendezvous() {
        use crate::config::{Endpoint, NodeRange};
        let ep = Some(Endpoint {
            host: "h".into(),
            port: 1,
        });
        // (standalone, backend, endpoint, nnodes max, expected)
        let table = [
            (true, RdzvBackend::C10d, None, 1, false),
            (false, RdzvBackend::Static, ep.clone(), 1, false),
            (false, RdzvBackend::Static, ep.clone(), 2, true),
            (false, RdzvBackend::C10d, ep.clone(), 1, true),
            (false, RdzvBackend::C10d, ep.clone(), 4, true),
            (false, RdzvBackend::Etcd, ep.clone(), 1, false),
            (false, RdzvBackend::Etcd, ep.clone(), 2, true),
        ];
        for (standalone, backend, endpoint, max, want) in table {
            let mut c = config(standalone, "127.0.0.1", None);
            c.rdzv.backend = backend;
            c.rdzv.endpoint = endpoint;
            c.nnodes = NodeRange { min: 1, max };
            assert_eq!(c.uses_rendezvous(), want, "{standalone} {backend:?} {max}");
        }
    }
}
