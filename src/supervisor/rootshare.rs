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
//! launcher error), keep the node's own judgement, as a single-node run does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::exit::WorkerStatus;
use crate::rendezvous::keys::round::RootKeys;
use crate::rendezvous::Exchange;

use super::outcome::Outcome;
use super::report::FailureReport;
use super::verdict::{of_report, Signature};

/// Beyond the shutdown grace, how long a node waits for the others' entries.
pub(super) const SLACK: Duration = Duration::from_secs(5);

/// Rounds of more nodes judge on their own (each node would read every other's entry).
pub(super) const MAX_NODES: usize = 64;

/// What ended an attempt on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    /// This node's own workers failed (a hang rdrun stopped counts, without a signature).
    pub failed: bool,
    /// Its root cause only says that a peer went away (`report::is_peer_error`).
    pub peer: bool,
    /// When rdrun observed its root cause, in ms since the epoch.
    pub at_ms: u64,
    /// Its root cause's signature (`None`: no failure, or a hang).
    pub sig: Option<Signature>,
}

/// How a node takes part in the exchange after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
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
    pub(super) fn of(outcome: &Outcome) -> Entry {
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
                }
            }
            _ => Entry {
                failed: false,
                peer: false,
                at_ms: 0,
                sig: None,
            },
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
        json!({"failed": self.failed, "peer": self.peer, "at_ms": self.at_ms, "sig": sig})
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
        Some(Entry {
            failed: v["failed"].as_bool()?,
            peer: v["peer"].as_bool()?,
            at_ms: v["at_ms"].as_u64()?,
            sig,
        })
    }
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a node whose attempt ended with `outcome` takes part.
pub(super) fn part(outcome: &Outcome) -> Part {
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
pub(super) fn pick(entries: &[(usize, Entry)]) -> Option<Signature> {
    entries
        .iter()
        .filter(|(_, e)| e.failed)
        .min_by_key(|(n, e)| (e.peer, e.at_ms, *n))
        .and_then(|(_, e)| e.sig.clone())
}

/// Publishes this node's entry; with [`Part::Judge`], waits up to `bound` for every node's of the
/// round and returns all those read (this node's included). `Err`: why the exchange failed.
pub(super) async fn exchange(
    ex: &Exchange,
    keys: &RootKeys,
    (me, nodes): (usize, usize),
    entry: &Entry,
    part: Part,
    bound: Duration,
) -> Result<Vec<(usize, Entry)>, String> {
    let mine = serde_json::to_vec(&entry.to_json()).unwrap_or_default();
    let my_key = keys.node(me);
    let publish = ex.set(&my_key, &mine);
    match tokio::time::timeout(super::failshare::BOUND, publish).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("cannot publish through {}: {e}", ex.describe())),
        Err(_) => return Err(format!("{} did not answer", ex.describe())),
    }
    if part != Part::Judge {
        return Ok(vec![(me, entry.clone())]);
    }
    let all: Vec<String> = (0..nodes).map(|n| keys.node(n)).collect();
    let complete = match ex.wait(&all, bound).await {
        Ok(done) => done,
        Err(e) => return Err(format!("cannot read through {}: {e}", ex.describe())),
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
    let values: Vec<Option<Vec<u8>>> =
        match tokio::time::timeout(super::failshare::BOUND, read).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(format!("cannot read through {}: {e}", ex.describe())),
            Err(_) => return Err(format!("{} did not answer", ex.describe())),
        };
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
    Ok(out)
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
        }
    }

    fn quiet() -> Entry {
        Entry {
            failed: false,
            peer: false,
            at_ms: 0,
            sig: None,
        }
    }

    /// The CI case: node 1's gloo error came first by the clock, node 0's ValueError is the
    /// cause; a node that only regrouped has no say; a hang resets; nothing failed: `None`.
    #[test]
    fn the_runs_root_cause_is_the_first_real_failure() {
        let gloo = failed(true, 1000, exc("RuntimeError", 40));
        let value = failed(false, 1003, exc("ValueError", 12));
        assert_eq!(
            pick(&[(0, value.clone()), (1, gloo.clone()), (2, quiet())]),
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
        assert_eq!(pick(&[(0, quiet()), (1, quiet())]), None);
        assert_eq!(pick(&[]), None);
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
            quiet(),
        ] {
            let bytes = serde_json::to_vec(&e.to_json()).unwrap();
            assert_eq!(Entry::from_json(&bytes), Some(e));
        }
        assert_eq!(Entry::from_json(b"not json"), None);
        assert_eq!(Entry::from_json(br#"{"failed": true}"#), None);
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
