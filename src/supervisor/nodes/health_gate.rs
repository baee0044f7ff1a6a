//! What a node's health checks (`crate::health`) do to the run (issue 28 item 2): the one call
//! the agent makes ([`gate`]) once its rendezvous is started and before it joins a round or
//! hosts a worker store.
//!
//! - `--health-check off`: nothing runs.
//! - `warn` (the default): the checks run; each failed one is a warning; the run goes on.
//! - `on`, static job (or a single node): a failed check ends the run before any worker starts,
//!   naming the node and the check, with [`crate::exit::Exit::BadNode`] ("bad node, requeue
//!   elsewhere"); the static rendezvous is closed with that reason so the other nodes end too
//!   instead of waiting for this one until their timeout.
//! - `on`, elastic job (c10d, etcd): the node does not join; it checks again after a back-off
//!   (1 s, doubling up to 30 s), so a transient fault heals, and the others go on if MIN is met.
//!   It gives up as a bad node after the rendezvous join timeout, or as soon as the run it
//!   waits to join is over (`outside`, issue 38.5). A node that hosts the store
//!   (c10d `is_host`) cannot stay out without taking the store from the others: it ends the job
//!   as a static node does.
//!
//! Every report goes back to the agent through the [`Seen`] it hands in, which emits it as the
//! `health_check` event and the metrics (`rdrun_node_check_failed{check}`): this module never
//! names the observer.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::resilience::{HealthMode, Resilience};
use crate::config::{RdzvBackend, RdzvConfig};
use crate::health::{self, HealthReport, Inputs};
use crate::rendezvous::store::try_get;
use crate::rendezvous::{RdzvStore, Rendezvous, TcpRdzvStore};
use crate::store::CLOCK_KEY;

use crate::supervisor::group::signals::Signals;
use crate::supervisor::nodes::join::until_shutdown;
use crate::supervisor::nodes::outside::Outside;
use crate::supervisor::report::end::{BadNode, RunEnd};

/// Where each health report goes as soon as it is made (the agent's: it emits the event). Called
/// from the `warn` checks' own thread too, hence `Send + Sync`.
pub(in crate::supervisor) type Seen = std::sync::Arc<dyn Fn(&HealthReport) + Send + Sync>;

/// The bound of the clock check's round trips (the store answers in microseconds).
const CLOCK_BOUND: Duration = Duration::from_secs(5);

/// The first back-off of an unhealthy elastic node, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the checks and says whether this node may go on (see the module doc); `Err`: how the
/// run ends. Under `warn` the checks only run beside the rendezvous and the workers: the
/// returned [`Background`] is held for the run and waits for their verdict when dropped (before
/// the run's cgroup goes: their programs live in it). What it reads of the launch: the
/// health-check settings (`resilience`: the mode, `--exclude-nodes-from`, `--bad-nodes-file`),
/// the rendezvous's backend and join timeout (`rdzv_config`), and the checks' own `inputs`
/// (their programs contained by the run's `checkcells::CheckCells`).
pub(in crate::supervisor) async fn gate(
    resilience: &Resilience,
    rdzv_config: &RdzvConfig,
    inputs: Inputs,
    seen: Seen,
    signals: &mut Signals,
    rdzv: Option<&mut Rendezvous>,
) -> Result<Option<Background>, RunEnd> {
    let mode = resilience.health;
    let bad_nodes_file = resilience.bad_nodes_file.as_deref();
    let mut rdzv = rdzv;
    // A node an earlier job found bad (`--exclude-nodes-from`) stays out, whatever the mode.
    if let Some((path, names)) = &resilience.exclude_from {
        let node = health::node_name();
        if health::memory::listed(&node, names) {
            let line = format!(
                "{} failed the health check: excluded: listed in {}",
                health::node_phrase(&node),
                path.display()
            );
            let detail = format!("listed in {}", path.display());
            let bad = BadNode::found(node, "excluded", detail, line);
            let elastic = is_elastic(rdzv_config.backend, rdzv.as_deref());
            return Err(bad_node(bad_nodes_file, bad, rdzv.as_deref_mut(), elastic).await);
        }
    }
    if !health::enabled(mode) {
        return Ok(None);
    }
    let store = rdzv.as_deref().and_then(|r| r.store.clone());
    if mode == HealthMode::Warn {
        // The clock's few store round trips stay on this runtime (the store client's); the
        // checks that take long go to the background thread.
        let clock = match until_shutdown(signals, clock(store.as_deref())).await {
            Ok(v) => v,
            Err(signal) => {
                return Err(RunEnd::Interrupted {
                    signal,
                    report: None,
                })
            }
        };
        return Ok(Some(Background::start(inputs, seen, clock)));
    }
    // A node that hosts the rendezvous store cannot stay out: the others need its store, and
    // it would take the store away when it gives up. It ends the job as a static node does.
    let elastic = is_elastic(rdzv_config.backend, rdzv.as_deref());
    let give_up_at = Instant::now() + join_timeout(rdzv_config.settings.as_ref());
    let mut backoff = FIRST_BACKOFF;
    let mut outside = Outside::new(rdzv_config.settings.as_ref());
    loop {
        let checks = async {
            let (mut report, clock) = tokio::join!(health::run(&inputs), clock(store.as_deref()));
            report.verdicts.extend(clock);
            report
        };
        let report = match until_shutdown(signals, checks).await {
            Ok(r) => r,
            Err(signal) => {
                return Err(RunEnd::Interrupted {
                    signal,
                    report: None,
                })
            }
        };
        log(&report);
        seen(&report);
        let Some(line) = report.failure_line() else {
            return Ok(None);
        };
        if let (true, Some(r)) = (elastic && Instant::now() + backoff < give_up_at, &rdzv) {
            tracing::warn!(
                "{line}; not joining, checking again in {} s",
                backoff.as_secs()
            );
            // It must not outlive the run it waits to join (issue 38.5).
            match until_shutdown(signals, outside.wait(r, backoff)).await {
                Ok(None) => {}
                Ok(Some(over)) => {
                    tracing::warn!("{over}: not checking again");
                    let bad = BadNode::of(&report, line);
                    return Err(bad_node(bad_nodes_file, bad, rdzv.as_deref_mut(), elastic).await);
                }
                Err(signal) => {
                    return Err(RunEnd::Interrupted {
                        signal,
                        report: None,
                    })
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        }
        let bad = BadNode::of(&report, line);
        return Err(bad_node(bad_nodes_file, bad, rdzv.as_deref_mut(), elastic).await);
    }
}

/// Round trips to the store host for the `clock` check (`health::clock`), within the checks'
/// bound; the shortest one's verdict. `None` without a rendezvous store (single node, etcd).
async fn clock(store: Option<&TcpRdzvStore>) -> Option<health::Verdict> {
    const SAMPLES: usize = 5;
    let store = store?;
    let t0 = std::time::Instant::now();
    let ask = async {
        let mut samples = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let sent = std::time::SystemTime::now();
            let t = std::time::Instant::now();
            let answer = try_get(store, CLOCK_KEY).await.map_err(|e| e.to_string())?;
            let Some(answer) = answer else {
                return Ok(None);
            };
            samples.extend(health::clock::sample(&answer, sent, t.elapsed()));
        }
        Ok(health::clock::best(samples))
    };
    let best = match tokio::time::timeout(CLOCK_BOUND, ask).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {CLOCK_BOUND:?}")),
    };
    Some(health::clock::verdict(
        best,
        &store.describe(),
        t0.elapsed(),
    ))
}

/// How long a run that ends before its `warn` checks waits for their verdict before it
/// cancels them (each check is bounded by `--health-check-timeout` anyway).
const VERDICT_WAIT_AT_END: Duration = Duration::from_secs(5);

/// The checks of `--health-check warn`, running on a thread of their own while the node joins
/// and its workers start: a warning never gates, so its price is not paid on the launch path
/// (the interpreter check is an interpreter start). A thread, not a task: its programs are
/// then not children of the agent's thread, whose reaper waits with `__WNOTHREAD`.
pub(in crate::supervisor) struct Background {
    done: std::sync::mpsc::Receiver<()>,
    cancel: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// `clock`: the clock check's verdict, measured before (it needs the agent's store client).
    fn start(inputs: Inputs, seen: Seen, clock: Option<health::Verdict>) -> Background {
        let (done_tx, done) = std::sync::mpsc::channel();
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("rdrun-health".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::warn!("health checks not run: no runtime for them");
                    return;
                };
                rt.block_on(async {
                    tokio::select! {
                        mut report = health::run(&inputs) => {
                            report.verdicts.extend(clock);
                            log(&report);
                            seen(&report);
                            if let Some(line) = report.failure_line() {
                                tracing::warn!("{line} (--health-check warn: going on)");
                            }
                        }
                        // Dropping the checks kills what they started.
                        _ = cancelled => {}
                    }
                });
                let _ = done_tx.send(());
            });
        match thread {
            Ok(t) => Background {
                done,
                cancel: Some(cancel),
                thread: Some(t),
            },
            Err(e) => {
                tracing::warn!("health checks not run: cannot start their thread: {e}");
                Background {
                    done,
                    cancel: None,
                    thread: None,
                }
            }
        }
    }
}

impl Drop for Background {
    /// The run is ending: its verdict is waited for a little (so a warning is not lost to a
    /// short job), then the checks are cancelled and their thread joined.
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.done.recv_timeout(VERDICT_WAIT_AT_END).is_err() {
            if let Some(c) = self.cancel.take() {
                let _ = c.send(());
            }
        }
        let _ = thread.join();
    }
}

/// Whether this node can stay out of the job while the others go on: an elastic backend
/// (c10d, etcd), and the store is not this node's (the others need it).
fn is_elastic(backend: RdzvBackend, rdzv: Option<&Rendezvous>) -> bool {
    rdzv.is_some_and(|r| r.server.is_none() && backend != RdzvBackend::Static)
}

/// The end of a bad node: remembered in `--bad-nodes-file` (`bad_nodes_file`); unless it stays
/// out of an elastic job, the rendezvous closed with the reason so that the other nodes end now,
/// naming it.
pub(in crate::supervisor) async fn bad_node(
    bad_nodes_file: Option<&Path>,
    bad: BadNode,
    rdzv: Option<&mut Rendezvous>,
    elastic: bool,
) -> RunEnd {
    if let Some(path) = bad_nodes_file {
        if let Err(err) = health::memory::remember(path, &bad.node) {
            tracing::error!(
                "--bad-nodes-file: cannot add {} to {}: {err}",
                bad.node,
                path.display()
            );
        }
    }
    if let (Some(rdzv), false) = (rdzv, elastic) {
        if let Err(err) = rdzv.close_because(&bad.line).await {
            tracing::warn!(
                "cannot close the rendezvous: {}",
                crate::supervisor::report::end::error_chain(&err)
            );
        }
    }
    RunEnd::BadNode(bad)
}

/// How long an unhealthy elastic node keeps checking: the rendezvous's join timeout.
fn join_timeout(settings: Option<&crate::config::RdzvSettings>) -> Duration {
    match settings {
        Some(crate::config::RdzvSettings::C10d(s)) => s.join_timeout,
        Some(crate::config::RdzvSettings::Etcd(s)) => s.rounds.join_timeout,
        Some(crate::config::RdzvSettings::Static(s)) => s.timeout,
        None => Duration::from_secs(600),
    }
}

/// Each verdict on rdrun's log: failed ones are the warning's, the others at debug.
fn log(report: &HealthReport) {
    for v in &report.verdicts {
        tracing::debug!(node = %report.node, "health check: {v}");
    }
    tracing::info!(
        node = %report.node,
        took_ms = report.took.as_millis() as u64,
        healthy = report.healthy(),
        "health checks done"
    );
}
