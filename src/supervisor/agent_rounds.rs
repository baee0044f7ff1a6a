//! The agent's side of the rendezvous (`agent.rs`'s `Agent`, methods kept apart by job): joining
//! a round, charging a worker failure only once the peers are known alive, the exit barrier and
//! closing, and a node leaving an elastic job after `--max-node-failures` (issue 28 item 4)
//! with the failure counts it keeps and shares with the other nodes (`failshare.rs`), and the
//! run's root cause of each attempt agreed with them for the stop verdict (`rootshare.rs`).
//! The rendezvous I/O itself is `rdzvlink.rs`'s and `netlink.rs`'s.

use crate::rendezvous::keys::round::{FailureKeys, RootKeys};
use crate::rendezvous::{Assignment, RoundReason};

use super::super::attempt::Outcome;
use super::super::end::RunEnd;
use super::super::failshare::{self, FailShare, RunCounts};
use super::super::rdzvlink;
use super::super::rootshare;
use super::super::verdict::{NodeFailures, Signature};
use super::Agent;

/// This node's failure counts in the run and its share of them with the others.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) own: NodeFailures,
    share: FailShare,
}

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

    /// Closes the rendezvous after this node's failure (the others name this node, and say the
    /// stop `verdict` when there is one: they end "do not requeue" too); errors are only logged.
    pub(super) async fn close_rdzv_failed(&mut self, verdict: Option<&str>) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            rdzvlink::close_failed(rdzv, verdict).await;
        }
    }

    /// The run's root cause of the attempt that just ended, for the stop verdict
    /// (`rootshare.rs`): agreed with the other nodes of the round through the run's exchange,
    /// else this node's own (`entry.sig`). A shutdown signal during the wait ends the attempt
    /// as interrupted.
    pub(super) async fn run_root(
        &mut self,
        asg: &Assignment,
        outcome: Outcome,
        entry: &rootshare::Entry,
    ) -> (Outcome, Option<Signature>) {
        let own = entry.sig.clone();
        let part = rootshare::part(&outcome);
        let nodes = asg.group_world_size;
        if part == rootshare::Part::Alone || !(2..=rootshare::MAX_NODES).contains(&nodes) {
            return (outcome, own);
        }
        let Some(rdzv) = self.rdzv.as_ref() else {
            return (outcome, own);
        };
        let Some(ex) = rdzv.exchange() else {
            return (outcome, own);
        };
        let keys = RootKeys::new(&rdzv.run_prefix, asg.round, asg.restart_count);
        let bound = self.config.shutdown_timeout + rootshare::SLACK;
        let shared = rootshare::exchange(&ex, &keys, (asg.group_rank, nodes), entry, part, bound);
        match rdzvlink::until_shutdown(&mut self.signals, shared).await {
            Ok(Ok(entries)) if part == rootshare::Part::Judge => {
                let run = rootshare::pick(&entries);
                if run != own && entry.failed {
                    let show = |s: &Option<Signature>| {
                        s.as_ref()
                            .map_or_else(|| "none".to_string(), ToString::to_string)
                    };
                    tracing::info!(
                        "this node's workers failed with {}; the run's root cause: {}",
                        show(&own),
                        show(&run)
                    );
                }
                (outcome, run)
            }
            Ok(Ok(_)) => (outcome, own),
            Ok(Err(why)) => {
                tracing::warn!("judging the attempt's root cause on this node alone: {why}");
                (outcome, own)
            }
            Err(signal) => {
                let failures = match outcome {
                    Outcome::Failed { failures, .. } => failures,
                    _ => Vec::new(),
                };
                (Outcome::Interrupted { signal, failures }, own)
            }
        }
    }

    /// Counts `outcome` if it was a failure of this node's own workers (`sig`: its signature),
    /// and then publishes the counts for the other nodes' reports.
    pub(super) async fn record_failure(
        &mut self,
        tally: &mut Tally,
        outcome: &Outcome,
        sig: Option<&Signature>,
    ) {
        let before = tally.own.count;
        let now = tally.own.record(outcome, sig);
        self.obs.get().node_failures(now);
        if now == before {
            return;
        }
        let Some((ex, keys)) = self.exchange() else {
            return;
        };
        let node = crate::health::node_name();
        tally.share.publish(&ex, &keys, &node, &tally.own).await;
    }

    /// The run's exchange and its failure-count keys (`None`: single node).
    fn exchange(&self) -> Option<(crate::rendezvous::Exchange, FailureKeys)> {
        let rdzv = self.rdzv.as_ref()?;
        Some((rdzv.exchange()?, FailureKeys::new(&rdzv.run_prefix)))
    }

    /// Every node's counts as published (`Err`: why they cannot be read); a single node's run is
    /// this node alone.
    async fn run_counts(&self) -> Result<RunCounts, String> {
        match self.exchange() {
            Some((ex, keys)) => failshare::read(&ex, &keys).await,
            None => Ok(RunCounts::new()),
        }
    }

    /// Every node's failure counts so far into the metrics (`rdrun_run_node_failures{node}`).
    pub(super) async fn refresh_run_counts(&mut self, tally: &Tally) {
        match self.run_counts().await {
            Ok(run) => {
                let node = crate::health::node_name();
                let all = failshare::merged(&node, &tally.own, &run);
                self.obs.get().run_node_failures(&all);
            }
            Err(why) => tracing::debug!("cannot read the other nodes' failure counts: {why}"),
        }
    }

    /// The report's `node_failures` (this node's counts and the whole run's), if any node failed.
    async fn counts_json(&mut self, tally: &Tally) -> Option<serde_json::Value> {
        let run = self.run_counts().await;
        let node = crate::health::node_name();
        if let Ok(r) = &run {
            self.obs
                .get()
                .run_node_failures(&failshare::merged(&node, &tally.own, r));
        }
        failshare::report_json(&node, &tally.own, &run)
    }

    /// The end with the failure counts in its report: a worker failure's, or a rendezvous lost
    /// because another node gave up (the counts then say which node failed how often).
    pub(super) async fn with_counts(&mut self, end: RunEnd, tally: &Tally) -> RunEnd {
        match end {
            RunEnd::WorkersFailed(r) => match self.counts_json(tally).await {
                Some(v) => RunEnd::WorkersFailed(r.with_node_failures(v)),
                None => RunEnd::WorkersFailed(r),
            },
            RunEnd::RendezvousLost(msg, _) => {
                let v = self.counts_json(tally).await;
                RunEnd::RendezvousLost(msg, v)
            }
            other => other,
        }
    }

    /// Issue 28 item 4: this node's workers failed `--max-node-failures` times in this run, and
    /// the elastic job has a spare node to go on without it.
    pub(super) fn fails_too_often(&self, counts: &NodeFailures, asg: &Assignment) -> bool {
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
    pub(super) async fn leave_failing(&mut self, tally: &Tally) -> Option<RunEnd> {
        let counts = &tally.own;
        let node = crate::health::node_name();
        let k = self.config.resilience.max_node_failures;
        let detail = format!(
            "its workers failed {} (--max-node-failures {k})",
            counts.summary()
        );
        let line = format!(
            "{} left the job: {detail}; a spare goes on",
            crate::health::node_phrase(&node)
        );
        let mut bad = super::super::end::BadNode::found(node.clone(), "failures", detail, line);
        bad.workers_ran = true;
        bad.node_failures = self.counts_json(tally).await;
        let rdzv = self.rdzv.as_mut().expect("only an elastic run leaves");
        super::super::netlink::leave(&self.config, rdzv, true, None, bad).await
    }
}
