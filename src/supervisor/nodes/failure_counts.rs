//! Every node's failure counts of the run, shared (issue 28 item 4): each agent counts its own
//! workers' failures (`verdict::NodeFailures`); so that whichever node's report a requeue script
//! reads names the node that failed how often, each agent publishes its counts in the run's
//! exchange (`rendezvous::Exchange`: the run's TCPStore, or etcd) after each of its failures,
//! and reads every node's back when a round starts (for the metrics) and for its report.
//!
//! Keys (`keys::round::FailureKeys`, under the run's prefix): a node takes a slot once, with an
//! atomic add on `…/rdrun_failures/slots`, and rewrites `…/rdrun_failures/node/<slot>` with its
//! counts as JSON. Every read and write is bounded ([`BOUND`]): a node that cannot read them
//! reports its own counts and says why (`complete: false`, `note`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::rendezvous::keys::round::FailureKeys;
use crate::rendezvous::Exchange;

use crate::supervisor::nodes::stop_verdict::NodeFailures;

/// How long one publish or one read of every node's counts may take.
pub(in crate::supervisor) const BOUND: Duration = Duration::from_secs(3);

/// Slots read at most (a job of more nodes than that lists the first ones).
const MAX_SLOTS: i64 = 4096;

/// This agent's side of the exchange: its slot once taken.
#[derive(Debug, Default)]
pub(in crate::supervisor) struct FailShare {
    slot: Option<i64>,
}

/// Every node's counts as read: node name -> counts.
pub(in crate::supervisor) type RunCounts = BTreeMap<String, NodeFailures>;

impl FailShare {
    /// Publishes this node's counts (after a failure of its own); errors are logged only (the
    /// others then report without this node's latest count).
    pub(in crate::supervisor) async fn publish(
        &mut self,
        ex: &Exchange,
        keys: &FailureKeys,
        node: &str,
        counts: &NodeFailures,
    ) {
        let write = async {
            let slot = match self.slot {
                Some(s) => s,
                None => {
                    let s = ex.add(&keys.slots(), 1).await?;
                    self.slot = Some(s);
                    s
                }
            };
            let text = serde_json::to_vec(&counts.to_json(node)).unwrap_or_default();
            ex.set(&keys.node(slot), &text).await
        };
        match tokio::time::timeout(BOUND, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                "cannot share this node's failure counts through {}: {e}",
                ex.describe()
            ),
            Err(_) => tracing::warn!(
                "cannot share this node's failure counts through {}: no answer within {BOUND:?}",
                ex.describe()
            ),
        }
    }
}

/// Every node's published counts (`Err`: why they cannot be read, within [`BOUND`]).
pub(in crate::supervisor) async fn read(
    ex: &Exchange,
    keys: &FailureKeys,
) -> Result<RunCounts, String> {
    let all = async {
        let n = ex.add(&keys.slots(), 0).await?.clamp(0, MAX_SLOTS);
        let mut out = RunCounts::new();
        for slot in 1..=n {
            // A slot taken but not yet written (its node is writing it now): not counted yet.
            let Some(text) = ex.get(&keys.node(slot)).await? else {
                continue;
            };
            if let Some((node, counts)) = parse(&text) {
                out.insert(node, counts);
            }
        }
        Ok::<_, crate::rendezvous::StoreOpError>(out)
    };
    match tokio::time::timeout(BOUND, all).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{}: {e}", ex.describe())),
        Err(_) => Err(format!("{}: no answer within {BOUND:?}", ex.describe())),
    }
}

/// A published `{"node", "count", "causes": [{"cause", "count"}]}` (`None`: not that shape).
fn parse(text: &[u8]) -> Option<(String, NodeFailures)> {
    let v: Value = serde_json::from_slice(text).ok()?;
    let node = v.get("node")?.as_str()?.to_string();
    let count = u32::try_from(v.get("count")?.as_u64()?).ok()?;
    let mut causes = BTreeMap::new();
    for c in v.get("causes")?.as_array()? {
        let cause = c.get("cause")?.as_str()?.to_string();
        let n = u32::try_from(c.get("count")?.as_u64()?).ok()?;
        causes.insert(cause, n);
    }
    Some((node, NodeFailures { count, causes }))
}

/// The whole run's counts with this node's own laid over (its own are the newest), every node
/// with at least one failure, most failures first (then by name).
pub(in crate::supervisor) fn merged(
    node: &str,
    own: &NodeFailures,
    run: &RunCounts,
) -> Vec<(String, NodeFailures)> {
    let mut all: RunCounts = run.clone();
    all.remove(node);
    if own.count > 0 {
        all.insert(node.to_string(), own.clone());
    }
    let mut v: Vec<(String, NodeFailures)> = all.into_iter().filter(|(_, c)| c.count > 0).collect();
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
    v
}

/// The report's `node_failures`: this node's counts (`node`, `count`, `causes`, as before) and
/// the run's (`nodes`: every node that failed, this one included, most failures first;
/// `complete`: whether the other nodes' counts could be read; `note`: why not). `None` when no
/// node is known to have failed (and the others' counts were read).
pub(in crate::supervisor) fn report_json(
    node: &str,
    own: &NodeFailures,
    run: &Result<RunCounts, String>,
) -> Option<Value> {
    let (nodes, complete, note) = match run {
        Ok(r) => (merged(node, own, r), true, None),
        Err(why) => (
            merged(node, own, &RunCounts::new()),
            false,
            Some(format!(
                "cannot read the other nodes' failure counts ({why}): this node's only"
            )),
        ),
    };
    if nodes.is_empty() && complete {
        return None;
    }
    let mut v = own.to_json(node);
    let list: Vec<Value> = nodes.iter().map(|(n, c)| c.to_json(n)).collect();
    v["nodes"] = Value::Array(list);
    v["complete"] = json!(complete);
    v["note"] = json!(note);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u32)]) -> NodeFailures {
        let causes: BTreeMap<String, u32> =
            pairs.iter().map(|(c, n)| (c.to_string(), *n)).collect();
        NodeFailures {
            count: causes.values().sum(),
            causes,
        }
    }

    #[test]
    fn published_counts_parse_back() {
        let c = counts(&[("exit code 3", 2), ("hang", 1)]);
        let text = serde_json::to_vec(&c.to_json("n2")).unwrap();
        assert_eq!(parse(&text), Some(("n2".to_string(), c)));
        assert_eq!(parse(b"{\"node\": 3}"), None);
        assert_eq!(parse(b"not json"), None);
    }

    #[test]
    fn the_report_lists_every_node_most_failures_first() {
        let own = NodeFailures::default();
        let mut run = RunCounts::new();
        run.insert("n2".into(), counts(&[("exit code 3", 2)]));
        run.insert("n3".into(), counts(&[("hang", 1)]));
        // A stale copy of this node's own counts is replaced by its own.
        run.insert("n1".into(), counts(&[("exit code 1", 1)]));
        let v = report_json("n1", &own, &Ok(run)).unwrap();
        assert_eq!(v["node"], "n1");
        assert_eq!(v["count"], 0);
        assert_eq!(v["complete"], true);
        assert!(v["note"].is_null());
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2, "{v}");
        assert_eq!(
            (nodes[0]["node"].as_str(), nodes[0]["count"].as_u64()),
            (Some("n2"), Some(2))
        );
        assert_eq!(nodes[0]["causes"][0]["cause"], "exit code 3");
        assert_eq!(
            (nodes[1]["node"].as_str(), nodes[1]["count"].as_u64()),
            (Some("n3"), Some(1))
        );
    }

    #[test]
    fn unreadable_counts_are_this_nodes_own_and_say_so() {
        let own = counts(&[("exit code 3", 1)]);
        let v = report_json("n1", &own, &Err("h:1: connection refused".into())).unwrap();
        assert_eq!(v["complete"], false);
        assert!(
            v["note"].as_str().unwrap().contains("connection refused"),
            "{v}"
        );
        assert_eq!(v["nodes"].as_array().unwrap().len(), 1);
        assert_eq!(v["nodes"][0]["node"], "n1");
        // Nothing failed anywhere: no member at all; unknown elsewhere: said even at 0 here.
        assert_eq!(
            report_json("n1", &NodeFailures::default(), &Ok(RunCounts::new())),
            None
        );
        let v = report_json("n1", &NodeFailures::default(), &Err("x".into())).unwrap();
        assert_eq!(v["nodes"].as_array().unwrap().len(), 0);
    }
}
