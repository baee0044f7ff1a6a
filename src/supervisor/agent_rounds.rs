//! The agent's side of the rendezvous (`agent.rs`'s `Agent`, methods kept apart by job): joining
//! a round, charging a worker failure only once the peers are known alive, the exit barrier and
//! closing, and a node leaving an elastic job after `--max-node-failures` (issue 28 item 4)
//! with the failure counts it keeps and shares with the other nodes (`nodes/failure_counts.rs`), the
//! run's root cause of each attempt agreed with them for the stop verdict (`nodes/root_cause.rs`;
//! issue 38: never waiting for a peer the round knows is gone), and the end of the job on every
//! node at once after a failure that no restart can follow (issue 38 item 7).
//! The rendezvous I/O itself is `nodes/join.rs`'s and `nodes/network_check.rs`'s.

use std::ops::ControlFlow;

use crate::rendezvous::keys::round::{FailureKeys, RootKeys};
use crate::rendezvous::{Assignment, RoundReason};

use super::Agent;
use crate::supervisor::chaos::Injected;
use crate::supervisor::group::attempt::Outcome;
use crate::supervisor::nodes::failure_counts::{self, FailShare, RunCounts};
use crate::supervisor::nodes::join;
use crate::supervisor::nodes::root_cause;
use crate::supervisor::nodes::stop_verdict::{NodeFailures, SameFailure, Signature};
use crate::supervisor::observe::RunEvent;
use crate::supervisor::report::end::RunEnd;

/// This node's failure counts in the run and its share of them with the others.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) own: NodeFailures,
    share: FailShare,
}

impl Agent {
    /// Joins the next rendezvous round; on failure, how the run ends.
    pub(super) async fn join_round(&mut self, reason: RoundReason) -> Result<Assignment, RunEnd> {
        self.obs.emit(RunEvent::RendezvousBegins(reason));
        let rdzv = self.rdzv.as_mut().expect("multi-node run has a rendezvous");
        let board = self.obs.join_progress();
        let join = join::join_round(rdzv, &mut self.signals, reason, self.master_port);
        let res = board.scope(join).await;
        self.obs.emit(RunEvent::RendezvousEnded(res.as_ref()));
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
        match join::lost_peers_after_failure(rdzv, &mut self.signals).await {
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
            self.obs.emit(RunEvent::BarrierBegins { timeout });
            let signal = join::finish(rdzv, &mut self.signals, asg, timeout).await;
            if let Some(sig) = signal {
                self.obs.emit(RunEvent::Signal(sig));
            }
            self.obs.emit(RunEvent::BarrierEnded);
        }
    }

    /// Closes the rendezvous for every node (the job is over); errors are only logged.
    pub(super) async fn close_rdzv(&mut self) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            join::close(rdzv).await;
        }
    }

    /// Closes the rendezvous after this node's failure (the others name this node, and say the
    /// stop `verdict` when there is one: they end "do not requeue" too); errors are only logged.
    pub(super) async fn close_rdzv_failed(&mut self, verdict: Option<&str>) {
        if let Some(rdzv) = self.rdzv.as_mut() {
            join::close_failed(rdzv, verdict).await;
        }
    }

    /// The run's root cause of the attempt that just ended, for the stop verdict
    /// (`nodes/root_cause.rs`): agreed with the other nodes of the round through the run's exchange,
    /// else this node's own (`entry.sig`). An attempt the rendezvous knows lost a peer keeps
    /// this node's own judgement (issue 38 item 4): a regroup learned from another node's new
    /// round gets the lost peers' names, and the wait for the others' entries ends once the
    /// round is known to have lost a node. A node stopped by another's close after a failure
    /// that ended the job reads that node's reason when it is pending (issue 38 item 7). A
    /// shutdown signal during the wait ends the attempt as interrupted. Issue 41: with the
    /// entries, the chaos fault a node injected that ended the attempt, if any
    /// (`root_cause::injected`).
    pub(super) async fn run_root(
        &mut self,
        asg: &Assignment,
        outcome: Outcome,
        entry: &root_cause::Entry,
    ) -> (Outcome, Option<Signature>, Option<Injected>) {
        let own = entry.sig.clone();
        let outcome = self.with_lost_peers(outcome).await;
        let part = root_cause::part(&outcome);
        let nodes = asg.group_world_size;
        if !(2..=root_cause::MAX_NODES).contains(&nodes) {
            return (outcome, own, None);
        }
        let Some((ex, keys)) = self.root_exchange(asg) else {
            return (outcome, own, None);
        };
        if let Outcome::RendezvousLost(msg) = &outcome {
            if root_cause::told_of_failure(msg) {
                return (self.told(asg, &ex, &keys, outcome).await, own, None);
            }
        }
        if part == root_cause::Part::Alone {
            return (outcome, own, None);
        }
        if let Err(why) = root_cause::publish(&ex, &keys, asg.group_rank, entry).await {
            tracing::warn!("judging the attempt's root cause on this node alone: {why}");
            return (outcome, own, None);
        }
        if part != root_cause::Part::Judge {
            return (outcome, own, None);
        }
        match self.judge(&ex, &keys, nodes).await {
            Ok(Some(entries)) => {
                let run = root_cause::pick(&entries);
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
                (outcome, run, root_cause::injected(&entries))
            }
            Ok(None) => (outcome, own, None),
            Err(signal) => {
                let failures = match outcome {
                    Outcome::Failed { failures, .. } => failures,
                    _ => Vec::new(),
                };
                (Outcome::Interrupted { signal, failures }, own, None)
            }
        }
    }

    /// The run's exchange and the root-cause keys of the attempt `asg` ran (`None`: no
    /// rendezvous, or a backend without an exchange).
    fn root_exchange(&self, asg: &Assignment) -> Option<(crate::rendezvous::Exchange, RootKeys)> {
        let rdzv = self.rdzv.as_ref()?;
        let keys = RootKeys::new(&rdzv.run_prefix, asg.round, asg.restart_count);
        Some((rdzv.exchange()?, keys))
    }

    /// Every node's entry of the round (`Ok(None)`: judge alone, as logged: a peer of the round
    /// is known gone, or the exchange failed), unless a shutdown signal comes first. Bounded by
    /// the shutdown grace plus `root_cause::SLACK`.
    async fn judge(
        &mut self,
        ex: &crate::rendezvous::Exchange,
        keys: &RootKeys,
        nodes: usize,
    ) -> Result<Option<Vec<(usize, root_cause::Entry)>>, i32> {
        let bound = self.config.shutdown_timeout + root_cause::SLACK;
        let rdzv = self.rdzv.as_ref();
        let gone = || async move {
            match rdzv {
                Some(r) => bounded_lost(r).await,
                None => Vec::new(),
            }
        };
        let judged = root_cause::collect(ex, keys, nodes, bound, gone);
        match join::until_shutdown(&mut self.signals, judged).await? {
            Ok(root_cause::Judged::Entries(entries)) => Ok(Some(entries)),
            Ok(root_cause::Judged::PeersGone(lost)) => {
                tracing::info!(
                    ?lost,
                    "peer node(s) of this round are gone; judging the attempt's root cause on this node alone"
                );
                Ok(None)
            }
            Err(why) => {
                tracing::warn!("judging the attempt's root cause on this node alone: {why}");
                Ok(None)
            }
        }
    }

    /// A regroup that named no lost peer (this node saw another node's new round) gets the
    /// peers of its round that the rendezvous already knows are gone (issue 38 item 4): then the
    /// attempt ended with a lost peer, as on the node that dropped it.
    async fn with_lost_peers(&self, outcome: Outcome) -> Outcome {
        let Outcome::Regroup { reason, lost } = outcome else {
            return outcome;
        };
        let lost = match (lost.is_empty(), self.rdzv.as_ref()) {
            (true, Some(r)) => bounded_lost(r).await,
            _ => lost,
        };
        Outcome::Regroup { reason, lost }
    }

    /// A node whose attempt another node's close ended (that node's failure ended the job):
    /// where that node's reason was pending, this node publishes its entry, waits for the
    /// reason (bounded by the shutdown grace plus `root_cause::SLACK`) and ends with it, so that
    /// it names the stop verdict when there is one.
    async fn told(
        &mut self,
        asg: &Assignment,
        ex: &crate::rendezvous::Exchange,
        keys: &RootKeys,
        outcome: Outcome,
    ) -> Outcome {
        let bound = self.config.shutdown_timeout + root_cause::SLACK;
        let told = root_cause::told_reason(ex, keys, asg.group_rank, bound);
        match join::until_shutdown(&mut self.signals, told).await {
            Ok(Ok(Some(why))) => Outcome::RendezvousLost(
                crate::rendezvous::RendezvousError::JobFailed(why).to_string(),
            ),
            Ok(Ok(None)) => outcome,
            Ok(Err(why)) => {
                tracing::debug!("cannot read why the job ended: {why}");
                outcome
            }
            Err(signal) => Outcome::Interrupted {
                signal,
                failures: Vec::new(),
            },
        }
    }

    /// Issue 38 item 7: a plain worker failure after which no restart can follow (none left, or
    /// restarts disabled) ends the job on every node: the rendezvous is closed at once, naming
    /// this node and the root cause, so that the others stop their workers within the shutdown
    /// grace and exit non-zero, instead of running on until this node's wait for their word
    /// (the grace plus 5 s) ran out. Where the stop verdict may still apply (the same failure
    /// once more would reach `--max-same-failures`), the close is marked pending, every node's
    /// entry is waited for (the close stopped the others', so they come within the grace), and
    /// the reason is told with the verdict once judged. `Continue`: not such a failure (or the
    /// node may leave the job as a bad node instead, `fails_too_often`).
    pub(super) async fn end_everywhere(
        &mut self,
        asg: &Assignment,
        outcome: Outcome,
        same: &mut SameFailure,
        tally: &mut Tally,
    ) -> ControlFlow<RunEnd, Outcome> {
        let plain = matches!(
            outcome,
            Outcome::Failed {
                peer_loss: None,
                ..
            }
        );
        let no_restart = asg.restart_count >= self.config.max_restarts || self.restarts_disabled;
        if self.rdzv.is_none() || !plain || !no_restart {
            return ControlFlow::Continue(outcome);
        }
        let (entry, own_fault) = self.own_entry(&outcome);
        let own = entry.sig.clone();
        let max_same = self.config.resilience.max_same_failures;
        let pending = same.could_reach(max_same);
        let mut after = tally.own.clone();
        after.record(&outcome, own.as_ref());
        if pending && self.fails_too_often(&after, asg) {
            return ControlFlow::Continue(outcome);
        }
        let exchange = (2..=root_cause::MAX_NODES)
            .contains(&asg.group_world_size)
            .then(|| self.root_exchange(asg))
            .flatten();
        let show = own.as_ref().map(ToString::to_string);
        if pending {
            if let Some((ex, keys)) = &exchange {
                let marked = async {
                    root_cause::publish(ex, keys, asg.group_rank, &entry).await?;
                    root_cause::mark_pending(ex, keys).await
                };
                if let Err(why) = marked.await {
                    tracing::warn!("judging the attempt's root cause on this node alone: {why}");
                }
            }
        }
        tracing::warn!("no restart left: ending the job on every node");
        self.close_rdzv_failed(show.as_deref()).await;
        let (run, run_fault, signal) = self
            .judged_after_close(asg, exchange.as_ref(), pending, &entry)
            .await;
        // Issue 41: an injected failure counts toward neither the stop verdict nor the node's
        // failure counts, on this path as on the restart path (`Agent::count_failure`).
        let injected = self.chaos_label(own_fault, run_fault).is_some();
        let in_a_row = match injected {
            true => 0,
            false => same.record_signature(run),
        };
        if !injected {
            self.record_failure(tally, &outcome, own.as_ref()).await;
        }
        let verdict = (max_same > 0 && in_a_row >= max_same).then(|| same.verdict());
        if let (Some((ex, keys)), true) = (&exchange, pending) {
            let detail = verdict.as_deref().or(show.as_deref());
            let rdzv = self.rdzv.as_ref().expect("checked above");
            root_cause::tell_reason(ex, keys, &rdzv.failed_here(detail)).await;
        }
        let Outcome::Failed { failures, hang, .. } = outcome else {
            unreachable!("a plain failure, checked above");
        };
        let end = match signal {
            Some(signal) => RunEnd::Interrupted {
                signal,
                report: Some(self.resolve(failures).await),
            },
            None => {
                let end = self.failed_end(failures, hang).await;
                match verdict {
                    Some(v) => end.with_verdict(v),
                    None => end,
                }
            }
        };
        ControlFlow::Break(self.with_counts(end, tally).await)
    }

    /// After the close of [`Agent::end_everywhere`]: the run's root cause and the chaos fault
    /// that ended the attempt, as every node's entry says when the stop verdict may apply
    /// (`pending`), else this node's own (its entry published for the others); a shutdown
    /// signal during the wait comes back as the third value.
    async fn judged_after_close(
        &mut self,
        asg: &Assignment,
        exchange: Option<&(crate::rendezvous::Exchange, RootKeys)>,
        pending: bool,
        entry: &root_cause::Entry,
    ) -> (Option<Signature>, Option<Injected>, Option<i32>) {
        let own = (entry.sig.clone(), None, None);
        match exchange {
            Some((ex, keys)) if pending => match self.judge(ex, keys, asg.group_world_size).await {
                Ok(Some(entries)) => (
                    root_cause::pick(&entries),
                    root_cause::injected(&entries),
                    None,
                ),
                Ok(None) => own,
                Err(sig) => (entry.sig.clone(), None, Some(sig)),
            },
            // The others' entries make no difference here; one node that thought otherwise
            // (its own count in a row differs) need not wait for this one's.
            Some((ex, keys)) => {
                if let Err(why) = root_cause::publish(ex, keys, asg.group_rank, entry).await {
                    tracing::debug!("cannot publish this node's root cause: {why}");
                }
                own
            }
            None => own,
        }
    }

    /// The end of the run after this node's workers failed: their report, error files read
    /// now, with the hang that stopped them when one did.
    pub(super) async fn failed_end(
        &mut self,
        failures: Vec<crate::supervisor::report::failure::Failure>,
        hang: Option<crate::supervisor::watch::verdict::HangFinding>,
    ) -> RunEnd {
        let report = self.resolve(failures).await;
        RunEnd::WorkersFailed(match hang {
            Some(h) => report.with_hang(h.suspect.map(|r| r as usize), h.summary),
            None => report,
        })
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
        self.obs.emit(RunEvent::NodeFailures(now));
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
            Some((ex, keys)) => failure_counts::read(&ex, &keys).await,
            None => Ok(RunCounts::new()),
        }
    }

    /// Every node's failure counts so far into the metrics (`rdrun_run_node_failures{node}`).
    pub(super) async fn refresh_run_counts(&mut self, tally: &Tally) {
        match self.run_counts().await {
            Ok(run) => {
                let node = crate::health::node_name();
                let all = failure_counts::merged(&node, &tally.own, &run);
                let nodes: Vec<(&str, u32)> =
                    all.iter().map(|(n, c)| (n.as_str(), c.count)).collect();
                self.obs.emit(RunEvent::RunNodeFailures(&nodes));
            }
            Err(why) => tracing::debug!("cannot read the other nodes' failure counts: {why}"),
        }
    }

    /// The report's `node_failures` (this node's counts and the whole run's), if any node failed.
    async fn counts_json(&mut self, tally: &Tally) -> Option<serde_json::Value> {
        let run = self.run_counts().await;
        let node = crate::health::node_name();
        if let Ok(r) = &run {
            let all = failure_counts::merged(&node, &tally.own, r);
            let nodes: Vec<(&str, u32)> = all.iter().map(|(n, c)| (n.as_str(), c.count)).collect();
            self.obs.emit(RunEvent::RunNodeFailures(&nodes));
        }
        failure_counts::report_json(&node, &tally.own, &run)
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
        let mut bad =
            crate::supervisor::report::end::BadNode::found(node.clone(), "failures", detail, line);
        bad.workers_ran = true;
        bad.node_failures = self.counts_json(tally).await;
        let rdzv = self.rdzv.as_mut().expect("only an elastic run leaves");
        let bad_nodes_file = self.config.resilience.bad_nodes_file.as_deref();
        crate::supervisor::nodes::network_check::leave(bad_nodes_file, rdzv, true, None, bad).await
    }
}

/// The peers of the round just run that `rdzv` knows are gone, within
/// `failure_counts::BOUND` (none when it does not answer in time).
async fn bounded_lost(rdzv: &crate::rendezvous::Rendezvous) -> Vec<String> {
    tokio::time::timeout(failure_counts::BOUND, rdzv.lost_since_round())
        .await
        .unwrap_or_default()
}
