//! The agent's side of the rendezvous (`agent.rs`'s `Agent`, methods kept apart by job): joining
//! a round, charging a worker failure only once the peers are known alive, the exit barrier and
//! closing, and a node leaving an elastic job after `--max-node-failures` (issue 28 item 4).
//! The rendezvous I/O itself is `rdzvlink.rs`'s and `netlink.rs`'s.

use crate::rendezvous::{Assignment, RoundReason};

use super::super::attempt::Outcome;
use super::super::end::RunEnd;
use super::super::rdzvlink;
use super::Agent;

impl Agent {
    /// Joins the next rendezvous round; on failure, how the run ends.
    pub(super) async fn join_round(&mut self, reason: RoundReason) -> Result<Assignment, RunEnd> {
        self.obs.get().rendezvous_begins(reason);
        let rdzv = self.rdzv.as_mut().expect("multi-node run has a rendezvous");
        let board = self.obs.get().join_progress();
        let join = rdzvlink::join_round(rdzv, &mut self.signals, reason, self.master_port);
        let res = board.scope(join).await;
        self.obs.get().rendezvous_ended(res.as_ref());
        res
    }

    /// A worker failure on a multi-node job is charged only once the peers are known to be
    /// alive (issue 17.7): a peer node found lost around it makes it the membership change's.
    /// A shutdown signal during that wait ends the run as interrupted.
    pub(super) async fn attribute_failure(&mut self, outcome: Outcome) -> Outcome {
        let Outcome::Failed {
            failures,
            peer_loss: None,
            hang: None,
        } = outcome
        else {
            return outcome;
        };
        let Some(rdzv) = self.rdzv.as_mut() else {
            return Outcome::Failed {
                failures,
                peer_loss: None,
                hang: None,
            };
        };
        match rdzvlink::lost_peers_after_failure(rdzv, &mut self.signals).await {
            Ok(lost) => Outcome::Failed {
                failures,
                peer_loss: (!lost.is_empty()).then_some((RoundReason::Membership, lost)),
                hang: None,
            },
            Err(signal) => Outcome::Interrupted { signal, failures },
        }
    }

    /// After local success: the exit barrier, then close.
    pub(super) async fn finish_rdzv(&mut self, asg: &Assignment) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            let timeout = self.config.exit_barrier_timeout;
            self.obs.get().barrier_begins(timeout);
            let signal = rdzvlink::finish(rdzv, &mut self.signals, asg, timeout).await;
            if let Some(sig) = signal {
                self.obs.get().signal(sig);
            }
            self.obs.get().barrier_ended();
        }
    }

    /// Closes the rendezvous for every node (the job is over); errors are only logged.
    pub(super) async fn close_rdzv(&mut self) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            rdzvlink::close(rdzv).await;
        }
    }

    /// Closes the rendezvous after this node's failure (the others name this node); errors are
    /// only logged.
    pub(super) async fn close_rdzv_failed(&mut self) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            rdzvlink::close_failed(rdzv).await;
        }
    }

    /// Issue 28 item 4: this node's workers failed `--max-node-failures` times in this run, and
    /// the elastic job has a spare node to go on without it.
    pub(super) fn fails_too_often(
        &self,
        counts: &super::super::verdict::NodeFailures,
        asg: &Assignment,
    ) -> bool {
        let k = self.config.resilience.max_node_failures;
        k > 0
            && counts.count >= k
            && asg.group_world_size > self.config.nnodes.min
            // The node serving the store cannot leave without taking it from the others.
            && self
                .rdzv
                .as_ref()
                .is_some_and(|r| r.can_leave() && r.server.is_none())
    }

    /// Leaves the elastic job as a bad node (its failure still charged to the others' restart:
    /// the round is bumped as a worker failure), remembered in `--bad-nodes-file`. `None`: the
    /// others would be fewer than MIN (several nodes failing at once): it stays.
    pub(super) async fn leave_failing(
        &mut self,
        counts: &super::super::verdict::NodeFailures,
    ) -> Option<RunEnd> {
        let node = crate::health::node_name();
        let k = self.config.resilience.max_node_failures;
        let detail = format!(
            "its workers failed {} (--max-node-failures {k})",
            counts.summary()
        );
        let line = format!("node {node} left the job: {detail}; a spare goes on");
        let mut bad = super::super::end::BadNode::found(node.clone(), "failures", detail, line);
        bad.workers_ran = true;
        bad.node_failures = Some(counts.to_json(&node));
        let rdzv = self.rdzv.as_mut().expect("only an elastic run leaves");
        super::super::netlink::leave(&self.config, rdzv, true, None, bad).await
    }
}

/// A failure report with this node's failure counts (issue 28 item 4), when it had any.
pub(super) fn with_counts(end: RunEnd, counts: &super::super::verdict::NodeFailures) -> RunEnd {
    match end {
        RunEnd::WorkersFailed(r) if counts.count > 0 => {
            RunEnd::WorkersFailed(r.with_node_failures(counts.to_json(&crate::health::node_name())))
        }
        other => other,
    }
}
