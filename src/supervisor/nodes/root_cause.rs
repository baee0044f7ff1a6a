//! The run's root cause of one attempt, agreed between nodes (issue 28 item 5): the stop verdict
//! ("the same failure N attempts in a row") must judge the failure that ended the attempt, not
//! what one node's workers saw of it. When rank 3 on node 0 raises, the ranks of node 1 often
//! die a moment later on their own with gloo's "Connection closed by peer", at the same line
//! every time: judged alone, node 1 would see "the same failure" twice and close the job while
//! the real failures differed (a CI failure of `static_restart` showed it). So after each
//! attempt every node publishes what ended it there ([`Entry`]), waits (bounded) for every
//! other node's entry, and all of them judge the same run-wide root cause ([`pick`]): the
//! earliest failure that is not a peer's loss, else the earliest failure.
//!
//! Through the run's exchange (`rendezvous::Exchange`: its TCPStore, or etcd), keys
//! `keys::round::RootKeys` (one directory per attempt). The wait ends when every node of the
//! round has written its entry; it is bounded by the shutdown grace plus [`SLACK`] (a node
//! writes after stopping its own workers, which may take the grace). A node that does not
//! answer in time is judged without (a warning says so); rounds of more than [`MAX_NODES`]
//! nodes, and ends that are not a worker failure or a plain regroup (a lost peer, a signal, a
//! launcher error), keep the node's own judgement, as a single-node run does. So does an
//! attempt whose round the rendezvous already knows lost a node (issue 38 item 4): the wait
//! asks between slices of a second and ends at once ([`Judged::PeersGone`]), as a dead node
//! never writes its entry.
//!
//! A failure after which no restart can follow ends the job on every node at once (issue 38
//! item 7, `agent_rounds.rs`): its node closes the rendezvous before the others' entries are
//! in. Where the stop verdict may still apply, it first marks the attempt's close pending
//! ([`mark_pending`]); the nodes its close stopped then publish an entry and wait for its
//! reason ([`told_reason`], written by [`tell_reason`] once judged), so that they name the
//! verdict too.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use serde_json::{json, Value};

use crate::exit::WorkerStatus;
use crate::rendezvous::keys::round::RootKeys;
use crate::rendezvous::Exchange;

use crate::supervisor::chaos::Injected;
use crate::supervisor::group::outcome::Outcome;
use crate::supervisor::nodes::stop_verdict::{of_report, Signature};
use crate::supervisor::report::failure::FailureReport;

/// Beyond the shutdown grace, how long a node waits for the others' entries.
pub(in crate::supervisor) const SLACK: Duration = Duration::from_secs(5);

/// Rounds of more nodes judge on their own (each node would read every other's entry).
pub(in crate::supervisor) const MAX_NODES: usize = 64;

/// How long one wait for the others' entries lasts before the node asks the rendezvous again
/// whether a peer of the round is gone.
const SLICE: Duration = Duration::from_secs(1);

/// What ended an attempt on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::supervisor) struct Entry {
    /// This node's own workers failed (a hang rdrun stopped counts, without a signature).
    pub failed: bool,
    /// Its root cause only says that a peer went away (`report::is_peer_error`).
    pub peer: bool,
    /// When rdrun observed its root cause, in ms since the epoch.
    pub at_ms: u64,
    /// Its root cause's signature (`None`: no failure, or a hang).
    pub sig: Option<Signature>,
    /// Issue 41: the chaos fault this node injected that ended the attempt (`None` on the
    /// other nodes, and without `--chaos`): every node labels the attempt by it ([`injected`]).
    pub injected: Option<Injected>,
}

/// How a node takes part in the exchange after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::supervisor) enum Part {
    /// Not at all: its own judgement stands (a lost peer, a signal, a launcher error...).
    Alone,
    /// Publishes its entry (the others may wait for it) but decides nothing from the others'.
    Publish,
    /// Publishes and waits for every node's: a failure or a plain regroup, which record the
    /// run's root cause for the count in a row.
    Judge,
}

impl Entry {
    /// What ended the attempt here: a plain worker failure's root cause (error files read), a
    /// hang, or nothing of this node's own.
    pub(in crate::supervisor) fn of(outcome: &Outcome) -> Entry {
        match outcome {
            Outcome::Failed {
                failures,
                peer_loss: None,
                hang,
            } => {
                let report = FailureReport {
                    name: String::new(),
                    host: String::new(),
                    failures: failures.clone(),
                }
                .resolve();
                let at = report.root_observed_at().unwrap_or_else(SystemTime::now);
                Entry {
                    failed: true,
                    peer: hang.is_none() && report.root_is_peer_error(),
                    at_ms: ms(at),
                    sig: match hang {
                        Some(_) => None,
                        None => of_report(&report),
                    },
                    injected: None,
                }
            }
            _ => Entry::quiet(),
        }
    }

    /// Nothing of this node's own ended the attempt.
    pub(in crate::supervisor) fn quiet() -> Entry {
        Entry {
            failed: false,
            peer: false,
            at_ms: 0,
            sig: None,
            injected: None,
        }
    }

    fn to_json(&self) -> Value {
        let sig = match &self.sig {
            None => Value::Null,
            Some(Signature::Exception { kind, file, line }) => {
                json!({"exception": kind, "file": file, "line": line})
            }
            Some(Signature::Status(WorkerStatus::Exited(c))) => json!({"exit": c}),
            Some(Signature::Status(WorkerStatus::Signaled(n))) => json!({"signal": n}),
        };
        let injected = self
            .injected
            .as_ref()
            .map(|f| json!({"label": f.label, "spec": f.spec, "number": f.number}));
        json!({"failed": self.failed, "peer": self.peer, "at_ms": self.at_ms, "sig": sig,
               "injected": injected})
    }

    fn from_json(bytes: &[u8]) -> Option<Entry> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        let s = &v["sig"];
        let int = |x: &Value| x.as_i64().and_then(|n| i32::try_from(n).ok());
        let sig = if s.is_null() {
            None
        } else if let Some(kind) = s["exception"].as_str() {
            Some(Signature::Exception {
                kind: kind.to_string(),
                file: s["file"].as_str()?.to_string(),
                line: u32::try_from(s["line"].as_u64()?).ok()?,
            })
        } else if let Some(c) = int(&s["exit"]) {
            Some(Signature::Status(WorkerStatus::Exited(c)))
        } else {
            Some(Signature::Status(WorkerStatus::Signaled(
                int(&s["signal"])?,
            )))
        };
        // Absent or unreadable: no fault (an entry of a node without `--chaos`).
        let f = &v["injected"];
        let injected = (|| {
            Some(Injected {
                label: f["label"].as_str()?.to_string(),
                spec: usize::try_from(f["spec"].as_u64()?).ok()?,
                number: u32::try_from(f["number"].as_u64()?).ok()?,
            })
        })();
        Some(Entry {
            failed: v["failed"].as_bool()?,
            peer: v["peer"].as_bool()?,
            at_ms: v["at_ms"].as_u64()?,
            sig,
            injected,
        })
    }
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a node whose attempt ended with `outcome` takes part.
pub(in crate::supervisor) fn part(outcome: &Outcome) -> Part {
    match outcome {
        Outcome::Failed {
            peer_loss: None, ..
        } => Part::Judge,
        Outcome::Regroup { lost, .. } if lost.is_empty() => Part::Judge,
        Outcome::Succeeded => Part::Publish,
        _ => Part::Alone,
    }
}

/// The run's root cause among every node's entry (`(group rank, entry)`): of the nodes whose
/// workers failed, the earliest whose root cause is not a peer's loss, else the earliest
/// (ties: the lower group rank). `None` when no node's workers failed, or when that failure
/// has no signature (a hang): either resets the count in a row.
pub(in crate::supervisor) fn pick(entries: &[(usize, Entry)]) -> Option<Signature> {
    root(entries).and_then(|e| e.sig.clone())
}

/// The entry [`pick`] names the run's root cause (see there).
fn root(entries: &[(usize, Entry)]) -> Option<&Entry> {
    entries
        .iter()
        .filter(|(_, e)| e.failed)
        .min_by_key(|(n, e)| (e.peer, e.at_ms, *n))
        .map(|(_, e)| e)
}

/// Issue 41: the chaos fault that ended the attempt, when a node injected one — the run's
/// root cause's own if it has one, else the lowest group rank's. Any fault counts, not only
/// the root's: a fault injected on one node is what ended the attempt on every node, and the
/// root cause [`pick`] finds may be a consequence of it on a node whose clock runs ahead.
pub(in crate::supervisor) fn injected(entries: &[(usize, Entry)]) -> Option<Injected> {
    root(entries).and_then(|e| e.injected.clone()).or_else(|| {
        entries
            .iter()
            .filter(|(_, e)| e.injected.is_some())
            .min_by_key(|(n, _)| *n)
            .and_then(|(_, e)| e.injected.clone())
    })
}

/// What the wait for every node's entry found.
#[derive(Debug)]
pub(in crate::supervisor) enum Judged {
    /// The entries read (this node's included); a node missing at the bound is left out, with
    /// a warning.
    Entries(Vec<(usize, Entry)>),
    /// These peers of the round are known gone (issue 38 item 4): the attempt ended with a lost
    /// peer, whose entry never comes, and each node keeps its own judgement.
    PeersGone(Vec<String>),
}

/// Publishes this node's entry (group rank `me`). `Err`: why the exchange failed.
pub(in crate::supervisor) async fn publish(
    ex: &Exchange,
    keys: &RootKeys,
    me: usize,
    entry: &Entry,
) -> Result<(), String> {
    let mine = serde_json::to_vec(&entry.to_json()).unwrap_or_default();
    bounded(ex, ex.set(&keys.node(me), &mine)).await
}

/// Waits up to `bound` for every entry of the round's `nodes`. Before each [`SLICE`] of the wait
/// it asks `gone` which peers of the round are known gone (the rendezvous dropped them): then
/// it stops waiting (issue 38 item 4: a survivor that learned of the loss from the new round
/// waited out the whole bound for the dead node's entry). The entries are then read, those
/// missing at the bound left out with a warning. `Err`: why the exchange failed.
pub(in crate::supervisor) async fn collect<F, Fut>(
    ex: &Exchange,
    keys: &RootKeys,
    nodes: usize,
    bound: Duration,
    mut gone: F,
) -> Result<Judged, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Vec<String>>,
{
    let all: Vec<String> = (0..nodes).map(|n| keys.node(n)).collect();
    let until = Instant::now() + bound;
    let complete = loop {
        let lost = gone().await;
        if !lost.is_empty() {
            return Ok(Judged::PeersGone(lost));
        }
        let left = until.saturating_duration_since(Instant::now());
        match ex.wait(&all, left.min(SLICE)).await {
            Ok(true) => break true,
            Ok(false) if left <= SLICE => break false,
            Ok(false) => {}
            Err(e) => return Err(format!("cannot read through {}: {e}", ex.describe())),
        }
    };
    let read = async {
        if complete {
            // Every key is set: one request for all.
            return ex
                .multi_get(&all)
                .await
                .map(|v| v.into_iter().map(Some).collect());
        }
        let mut some = Vec::with_capacity(nodes);
        for key in &all {
            some.push(ex.get(key).await?);
        }
        Ok(some)
    };
    let values: Vec<Option<Vec<u8>>> = bounded(ex, read).await?;
    let mut out = Vec::with_capacity(nodes);
    let mut missing = Vec::new();
    for (n, value) in values.into_iter().enumerate() {
        match value.as_deref().and_then(Entry::from_json) {
            Some(e) => out.push((n, e)),
            None => missing.push(n),
        }
    }
    if !complete || !missing.is_empty() {
        tracing::warn!(
            ?missing,
            "judging the attempt's root cause without these nodes' word (none within {bound:?})"
        );
    }
    Ok(Judged::Entries(out))
}

/// One exchange request within [`crate::supervisor::nodes::failure_counts::BOUND`]; `Err`: why it failed.
async fn bounded<T>(
    ex: &Exchange,
    op: impl Future<Output = Result<T, crate::rendezvous::StoreOpError>>,
) -> Result<T, String> {
    match tokio::time::timeout(crate::supervisor::nodes::failure_counts::BOUND, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{}: {e}", ex.describe())),
        Err(_) => Err(format!("{} did not answer", ex.describe())),
    }
}

/// Issue 38 item 7, the side of a node whose failure ended the job and that closed the
/// rendezvous before it knew whether the stop verdict applies: says so before the close, so
/// that the nodes the close stops publish their entries and wait for its reason.
pub(in crate::supervisor) async fn mark_pending(
    ex: &Exchange,
    keys: &RootKeys,
) -> Result<(), String> {
    bounded(ex, ex.set(&keys.pending(), b"1")).await
}

/// Then, once it judged: its close reason, verdict included (`failed on node N (addr): ...`).
pub(in crate::supervisor) async fn tell_reason(ex: &Exchange, keys: &RootKeys, reason: &str) {
    if let Err(e) = bounded(ex, ex.set(&keys.close_reason(), reason.as_bytes())).await {
        tracing::warn!("cannot tell the other nodes why the job ended: {e}");
    }
}

/// Whether a lost rendezvous's message says that another node's failure closed it (the
/// `RendezvousError::JobFailed` of `Rendezvous::close_failed`'s reason).
pub(in crate::supervisor) fn told_of_failure(msg: &str) -> bool {
    msg.starts_with("the job failed on ")
}

/// The side of a node whose workers the close stopped: `Ok(None)` when the closing node knew
/// its reason at once (nothing pending), else this node publishes its entry (its workers did
/// not fail on their own) and waits up to `bound` for the reason (`Ok(None)` at the bound).
pub(in crate::supervisor) async fn told_reason(
    ex: &Exchange,
    keys: &RootKeys,
    me: usize,
    bound: Duration,
) -> Result<Option<String>, String> {
    if bounded(ex, ex.get(&keys.pending())).await?.is_none() {
        return Ok(None);
    }
    publish(ex, keys, me, &Entry::quiet()).await?;
    let key = [keys.close_reason()];
    match ex.wait(&key, bound).await {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", ex.describe())),
    }
    let text = bounded(ex, ex.get(&key[0])).await?;
    Ok(text.map(|t| String::from_utf8_lossy(&t).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exc(kind: &str, line: u32) -> Option<Signature> {
        Some(Signature::Exception {
            kind: kind.into(),
            file: "/w/train.py".into(),
            line,
        })
    }

    fn failed(peer: bool, at_ms: u64, sig: Option<Signature>) -> Entry {
        Entry {
            failed: true,
            peer,
            at_ms,
            sig,
            injected: None,
        }
    }

    /// The CI case: node 1's gloo error came first by the clock, node 0's ValueError is the
    /// cause; a node that only regrouped has no say; a hang resets; nothing failed: `None`.
    #[test]
    fn the_runs_root_cause_is_the_first_real_failure() {
        let gloo = failed(true, 1000, exc("RuntimeError", 40));
        let value = failed(false, 1003, exc("ValueError", 12));
        assert_eq!(
            pick(&[(0, value.clone()), (1, gloo.clone()), (2, Entry::quiet())]),
            exc("ValueError", 12)
        );
        // Only peers' losses: the earliest of them.
        let later_gloo = failed(true, 1005, exc("RuntimeError", 41));
        assert_eq!(
            pick(&[(0, later_gloo), (1, gloo.clone())]),
            exc("RuntimeError", 40)
        );
        // Same time: the lower group rank.
        let a = failed(false, 7, Some(Signature::Status(WorkerStatus::Exited(3))));
        let b = failed(false, 7, Some(Signature::Status(WorkerStatus::Exited(4))));
        assert_eq!(
            pick(&[(1, a), (0, b)]),
            Some(Signature::Status(WorkerStatus::Exited(4)))
        );
        let hang = failed(false, 900, None);
        assert_eq!(pick(&[(0, hang), (1, gloo)]), None);
        assert_eq!(pick(&[(0, Entry::quiet()), (1, Entry::quiet())]), None);
        assert_eq!(pick(&[]), None);
    }

    fn fault(label: &str, spec: usize, number: u32) -> Injected {
        Injected {
            label: label.into(),
            spec,
            number,
        }
    }

    /// Issue 41: the node that injected the fault names it for every node, whichever entry is
    /// the root cause by the clock; without a fault, none.
    #[test]
    fn the_injected_fault_of_any_node_labels_the_attempt() {
        let kill = fault("injected kill rank 1, chaos fault 1", 0, 0);
        let killed = Entry {
            injected: Some(kill.clone()),
            ..failed(
                false,
                1000,
                Some(Signature::Status(WorkerStatus::Signaled(9))),
            )
        };
        let gloo = failed(true, 1002, exc("RuntimeError", 40));
        assert_eq!(
            injected(&[(0, gloo.clone()), (1, killed.clone())]),
            Some(kill.clone())
        );
        // The other node's clock ran ahead: its own (non-peer) exit comes first by the clock.
        let early = failed(false, 990, Some(Signature::Status(WorkerStatus::Exited(1))));
        assert_eq!(injected(&[(0, early), (1, killed.clone())]), Some(kill));
        // A regrouped node took no part in the failure.
        assert_eq!(injected(&[(0, Entry::quiet()), (1, gloo.clone())]), None);
        assert_eq!(injected(&[(0, gloo)]), None);
        assert_eq!(injected(&[]), None);
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        for e in [
            failed(true, 12, exc("torch.OutOfMemoryError", 88)),
            failed(false, 13, Some(Signature::Status(WorkerStatus::Exited(7)))),
            failed(
                false,
                14,
                Some(Signature::Status(WorkerStatus::Signaled(9))),
            ),
            failed(false, 15, None),
            Entry::quiet(),
            Entry {
                injected: Some(fault("injected kill rank 1, chaos fault 2", 0, 1)),
                ..failed(
                    false,
                    16,
                    Some(Signature::Status(WorkerStatus::Signaled(9))),
                )
            },
        ] {
            let bytes = serde_json::to_vec(&e.to_json()).unwrap();
            assert_eq!(Entry::from_json(&bytes), Some(e));
        }
        assert_eq!(Entry::from_json(b"not json"), None);
        assert_eq!(Entry::from_json(br#"{"failed": true}"#), None);
    }

    /// A store on loopback and the run's exchange through it.
    async fn exchange_on_loopback() -> (crate::store::StoreServer, Exchange) {
        use crate::rendezvous::addr::ListenOn;
        let server = crate::rendezvous::tcp::serve_on(&ListenOn::Any, 0).unwrap();
        let ex = another_node(&server).await;
        (server, ex)
    }

    /// Another node's exchange through `server` (a connection of its own: one connection
    /// serves one request at a time).
    async fn another_node(server: &crate::store::StoreServer) -> Exchange {
        use crate::rendezvous::tcp::TcpRdzvStore;
        let deadline = Instant::now() + Duration::from_secs(10);
        let store =
            TcpRdzvStore::connect("127.0.0.1", server.port(), deadline, Duration::from_secs(5))
                .await
                .unwrap();
        Exchange::Tcp(std::sync::Arc::new(store))
    }

    /// Issue 38 item 4: the wait for every node's entry ends once the round is known to have
    /// lost a peer (whose entry never comes), not at the bound; with every entry in, it reads
    /// them all.
    #[tokio::test]
    async fn the_wait_ends_once_a_peer_is_known_gone() {
        let (server, ex) = exchange_on_loopback().await;
        let keys = RootKeys::new("run", 3, 0);
        let value = failed(false, 1003, exc("ValueError", 12));
        publish(&ex, &keys, 0, &value).await.unwrap();
        publish(&ex, &keys, 1, &Entry::quiet()).await.unwrap();
        // Node 2 never writes; the rendezvous says so at the second look.
        let mut looks = 0;
        let gone = || {
            looks += 1;
            let now = looks;
            async move {
                match now {
                    1 => Vec::new(),
                    _ => vec!["n2".to_string()],
                }
            }
        };
        let t0 = Instant::now();
        let judged = collect(&ex, &keys, 3, Duration::from_secs(60), gone)
            .await
            .unwrap();
        assert!(
            matches!(&judged, Judged::PeersGone(lost) if lost == &["n2".to_string()]),
            "{judged:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // Every entry in: read, whatever the bound.
        publish(&ex, &keys, 2, &Entry::quiet()).await.unwrap();
        let judged = collect(&ex, &keys, 3, Duration::from_secs(60), || async {
            Vec::new()
        })
        .await
        .unwrap();
        let Judged::Entries(entries) = judged else {
            panic!("{judged:?}");
        };
        assert_eq!(pick(&entries), exc("ValueError", 12));
        server.shutdown().await;
    }

    /// Issue 38 item 7: a node stopped by another's close reads that node's reason only where
    /// it was marked pending, and then publishes its own entry first (the closing node waits for
    /// it).
    #[tokio::test]
    async fn a_stopped_node_reads_the_reason_only_when_pending() {
        let (server, ex) = exchange_on_loopback().await;
        let keys = RootKeys::new("run", 1, 0);
        let bound = Duration::from_secs(30);
        assert_eq!(told_reason(&ex, &keys, 1, bound).await, Ok(None));
        assert_eq!(ex.get(&keys.node(1)).await.unwrap(), None);
        mark_pending(&ex, &keys).await.unwrap();
        let why = "failed on node 0 (h0): the same failure 1 attempts in a row: exit code 3; not restarting";
        let closing = another_node(&server).await;
        let closer = async {
            // The closing node judges once the stopped one's entry is in.
            assert!(closing.wait(&[keys.node(1)], bound).await.unwrap());
            tell_reason(&closing, &keys, why).await;
        };
        let (told, ()) = tokio::join!(told_reason(&ex, &keys, 1, bound), closer);
        assert_eq!(told, Ok(Some(why.to_string())));
        server.shutdown().await;
    }

    #[test]
    fn who_takes_part() {
        use crate::rendezvous::RoundReason;
        let plain = Outcome::Failed {
            failures: Vec::new(),
            peer_loss: None,
            hang: None,
        };
        assert_eq!(part(&plain), Part::Judge);
        let regroup = Outcome::Regroup {
            reason: RoundReason::Membership,
            lost: Vec::new(),
        };
        assert_eq!(part(&regroup), Part::Judge);
        let lost = Outcome::Regroup {
            reason: RoundReason::PeerLost,
            lost: vec!["n1".into()],
        };
        assert_eq!(part(&lost), Part::Alone);
        assert_eq!(part(&Outcome::Succeeded), Part::Publish);
        assert_eq!(part(&Outcome::LauncherError("x".into())), Part::Alone);
    }
}
