//! The network pre-check after a multi-node round (issue 28 item 3), and a node leaving an
//! elastic job (item 3's slow node, item 4's node that failed `--max-node-failures` times).
//!
//! Once a round completes and before any worker starts, with `--network-check on`: every node
//! opens a probe listener (`health::netprobe`) and publishes its address in the round's keys
//! (`keys::round::NetKeys`); the pairs of `health::network::schedule` measure each other step by
//! step; each end publishes what it received; every node reads every result and runs the same
//! pure verdict (`health::network::judge`), so all of them name the same slow node without a
//! coordinator. A slow node is named on the console (one line), in the `network_check` event
//! and the metrics. In an elastic job (c10d) with spare nodes (the round has more than MIN), the
//! slowest ones, as many as there are spares, leave: each takes itself out of the rendezvous
//! (`Rendezvous::leave`, which bumps the round without it, not charged), says so on the
//! round's `left` key, and ends as a bad node (exit 75, remembered in `--bad-nodes-file`); the
//! others wait for that key and join the next round. The exchange is the run's TCPStore (static,
//! c10d) or etcd itself (`rendezvous::Exchange`): on etcd the check and the leaving are the same.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::resilience::Resilience;
use crate::config::Endpoint;
use crate::health::netprobe::{self, Probe, PAIR_BOUND};
use crate::health::network::{self, Measure, Measured, NetVerdict, Peer};
use crate::rendezvous::keys::round::NetKeys;
use crate::rendezvous::{addr, Assignment, Exchange, Rendezvous};

use crate::supervisor::group::signals::Signals;
use crate::supervisor::nodes::join::until_shutdown;
use crate::supervisor::report::end::{BadNode, RunEnd};

/// How long a node waits for every other node's probe address (they all left the same round).
const ADDR_WAIT: Duration = Duration::from_secs(30);
/// How long the others wait for a leaving node to have left before joining the next round
/// (joining earlier is correct too: the round then waits until it left).
const LEFT_WAIT: Duration = Duration::from_secs(30);

/// What one check measured (the agent emits it as the `network_check` event and the metrics).
pub(in crate::supervisor) struct NetSeen<'a> {
    pub verdict: &'a NetVerdict,
    pub peers: &'a [Peer],
    /// The nodes (group ranks) that leave the job.
    pub leaving: &'a [usize],
    pub took: Duration,
}

/// What the check reads of the launch, built by the agent for each check (as
/// `group::attempt::GroupSettings`): its signature says what it depends on.
pub(in crate::supervisor) struct NetSettings<'a> {
    /// `--network-check`, `--network-check-threshold`, and `--bad-nodes-file` (where a slow
    /// node that leaves is remembered).
    pub resilience: &'a Resilience,
    /// MIN of `--nnodes`: the nodes of a round above it are spares, which may leave.
    pub min_nodes: usize,
    /// `--local-addr`, then the rendezvous endpoint: where this node's probe listens when the
    /// rendezvous advertised no address for it.
    pub local_addr: Option<&'a str>,
    pub endpoint: Option<&'a Endpoint>,
}

/// What the agent does after the check.
#[derive(Debug)]
pub(in crate::supervisor) enum NetOutcome {
    /// Start the workers of this round.
    Go,
    /// Slow nodes left: join the next round (not charged).
    Rejoin,
}

/// Runs the check after round `asg` if it is on; `Err`: how this node's run ends (a signal, or
/// it left as a slow node). `seen` gets what was measured, once the verdict is in and before
/// anyone leaves.
pub(in crate::supervisor) async fn check(
    settings: &NetSettings<'_>,
    seen: impl FnOnce(NetSeen<'_>),
    rdzv: &mut Rendezvous,
    asg: &Assignment,
    signals: &mut Signals,
) -> Result<NetOutcome, RunEnd> {
    if !settings.resilience.network_check || asg.group_world_size < 2 {
        return Ok(NetOutcome::Go);
    }
    let Some(store) = rdzv.exchange() else {
        return Ok(NetOutcome::Go);
    };
    let t0 = Instant::now();
    let host = match probe_host(settings.local_addr, settings.endpoint, rdzv).await {
        Ok(h) => h,
        Err(why) => {
            tracing::warn!("network check skipped: {why}");
            return Ok(NetOutcome::Go);
        }
    };
    let keys = NetKeys::new(&asg.store_prefix);
    let measured = until_shutdown(
        signals,
        run(&store, &keys, asg, &host, rdzv.server.is_some()),
    )
    .await;
    let (peers, measured) = match measured {
        Ok(Ok(v)) => v,
        Ok(Err(why)) => {
            tracing::warn!("network check skipped: {why}");
            return Ok(NetOutcome::Go);
        }
        Err(signal) => {
            return Err(RunEnd::Interrupted {
                signal,
                report: None,
            })
        }
    };
    let n = asg.group_world_size;
    let verdict = network::judge(n, &measured, settings.resilience.network_threshold);
    let took = t0.elapsed();
    let spares = if rdzv.can_leave() {
        n.saturating_sub(settings.min_nodes)
    } else {
        0
    };
    let leaving = network::left_out(&verdict, spares, |r| peers[r].hosts_store);
    report(&verdict, &peers, &leaving, spares, took);
    seen(NetSeen {
        verdict: &verdict,
        peers: &peers,
        leaving: &leaving,
        took,
    });
    let me = asg.group_rank;
    if leaving.contains(&me) {
        let slow = verdict.slow.iter().find(|s| s.node == me);
        let detail = slow.map_or_else(String::new, ToString::to_string);
        let line = format!(
            "{} is slow in the network pre-check: {detail}; leaving the job (a spare goes on)",
            peers[me].describe(me)
        );
        let bad = BadNode::found(crate::health::node_name(), "network", detail, line);
        let left = Some((&store, keys.left(me)));
        let bad_nodes_file = settings.resilience.bad_nodes_file.as_deref();
        return match leave(bad_nodes_file, rdzv, false, left, bad).await {
            Some(end) => Err(end),
            // Only when the state changed under the check (another node left or failed first):
            // named, and it runs.
            None => Ok(NetOutcome::Go),
        };
    }
    if leaving.is_empty() {
        return Ok(NetOutcome::Go);
    }
    let left: Vec<String> = leaving.iter().map(|&r| keys.left(r)).collect();
    match until_shutdown(signals, store.wait(&left, LEFT_WAIT)).await {
        Ok(Ok(true)) => {}
        Ok(_) => tracing::warn!("the slow node(s) did not say they left; joining the next round"),
        Err(signal) => {
            return Err(RunEnd::Interrupted {
                signal,
                report: None,
            })
        }
    }
    Ok(NetOutcome::Rejoin)
}

/// This node leaves the job while the others go on: out of the rendezvous (the round bumped
/// without it; `charged`: as a worker failure), `left` set if given, remembered in
/// `--bad-nodes-file` (`bad_nodes_file`); the end is a bad node. `None`: the rendezvous would
/// keep fewer than MIN nodes without it (others left first), so it stays.
pub(in crate::supervisor) async fn leave(
    bad_nodes_file: Option<&std::path::Path>,
    rdzv: &mut Rendezvous,
    charged: bool,
    left: Option<(&Exchange, String)>,
    bad: BadNode,
) -> Option<RunEnd> {
    match rdzv.leave(charged).await {
        Ok(true) => {}
        Ok(false) => return None,
        // The store is gone or unreadable: leaving by ending is all that is left (the others
        // find this node's heartbeats stopped).
        Err(err) => tracing::warn!(
            "cannot leave the rendezvous: {}",
            crate::supervisor::report::end::error_chain(&err)
        ),
    }
    if let Some((store, key)) = left {
        if let Err(err) = store.set(&key, b"1").await {
            tracing::debug!("cannot say this node left: {err}");
        }
    }
    Some(crate::supervisor::nodes::health_gate::bad_node(bad_nodes_file, bad, None, true).await)
}

/// The address the others reach this node's probe at: the one it advertised to the rendezvous
/// (c10d), else `--local-addr`, else its route to the store host (a static round lists host
/// names, which need not resolve to this node on the others).
async fn probe_host(
    local_addr: Option<&str>,
    endpoint: Option<&Endpoint>,
    rdzv: &Rendezvous,
) -> Result<String, String> {
    if let Some(a) = rdzv.advertised.clone() {
        return Ok(a);
    }
    if let Some(a) = local_addr {
        return Ok(a.to_string());
    }
    let endpoint = endpoint.ok_or("the rendezvous has no endpoint")?;
    addr::advertised_addr(
        None,
        &endpoint.host,
        endpoint.port,
        Instant::now() + Duration::from_secs(5),
    )
    .await
    .map_err(|e| format!("cannot choose this node's address: {e}"))
}

/// Publishes this node's probe, runs its pairs, and reads every pair's result.
async fn run(
    store: &Exchange,
    keys: &NetKeys,
    asg: &Assignment,
    host: &str,
    hosts_store: bool,
) -> Result<(Vec<Peer>, Vec<Measured>), String> {
    let ip: IpAddr = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => IpAddr::from([0, 0, 0, 0]),
    };
    let probe = Probe::bind(ip)
        .await
        .map_err(|e| format!("cannot listen on {host}: {e}"))?;
    let peers = publish(store, keys, asg, host, probe.port(), hosts_store).await?;
    let steps = network::schedule(asg.group_world_size);
    run_pairs(store, keys, &steps, &peers, &probe, asg.group_rank).await;
    let pairs: Vec<network::Pair> = steps.into_iter().flatten().collect();
    let measured = read_results(store, keys, pairs).await;
    Ok((peers, measured))
}

/// Publishes this node's probe address (`port` on `host`) and reads every node's, once all
/// of them published.
async fn publish(
    store: &Exchange,
    keys: &NetKeys,
    asg: &Assignment,
    host: &str,
    port: u16,
    hosts_store: bool,
) -> Result<Vec<Peer>, String> {
    let hosts_store = u8::from(hosts_store);
    let mine = format!("{host} {port} {} {hosts_store}", crate::health::node_name());
    store
        .set(&keys.addr(asg.group_rank), mine.as_bytes())
        .await
        .map_err(|e| format!("cannot publish this node's address: {e}"))?;
    let addr_keys: Vec<String> = (0..asg.group_world_size).map(|r| keys.addr(r)).collect();
    match store.wait(&addr_keys, ADDR_WAIT).await {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "not every node published its address within {ADDR_WAIT:?}"
            ))
        }
        Err(e) => return Err(format!("the store: {e}")),
    }
    let values = store
        .multi_get(&addr_keys)
        .await
        .map_err(|e| format!("the store: {e}"))?;
    values
        .iter()
        .map(|v| parse_peer(&String::from_utf8_lossy(v)))
        .collect::<Option<_>>()
        .ok_or_else(|| "a node published an address that does not parse".to_string())
}

/// This node's side of each step's pair (`me`: its group rank): the client measures and
/// publishes latency and rate, the server publishes what it received.
async fn run_pairs(
    store: &Exchange,
    keys: &NetKeys,
    steps: &[Vec<network::Pair>],
    peers: &[Peer],
    probe: &Probe,
    me: usize,
) {
    for (i, step) in steps.iter().enumerate() {
        let step_no = i as u32;
        let Some(pair) = step.iter().find(|p| p.client == me || p.server == me) else {
            continue;
        };
        if pair.client == me {
            let server = &peers[pair.server];
            let value = match resolve(&server.addr, server.port).await {
                Some(sa) => netprobe::measure(sa, step_no, me as u32).await,
                None => None,
            };
            let text = match value {
                Some(c) => format!("{} {}", c.latency.as_micros(), c.down_bps),
                None => "fail".into(),
            };
            let _ = store
                .set(&keys.client(pair.client, pair.server), text.as_bytes())
                .await;
        } else {
            let up = probe
                .served(
                    step_no,
                    pair.client as u32,
                    PAIR_BOUND + Duration::from_secs(2),
                )
                .await;
            let text = up.map_or_else(|| "fail".into(), |b| b.to_string());
            let _ = store
                .set(&keys.server(pair.client, pair.server), text.as_bytes())
                .await;
        }
    }
}

/// Every pair's two results: each end publishes within its bound, so a bound of all steps
/// plus slack is only reached when a node died (then its pairs count as failed).
async fn read_results(
    store: &Exchange,
    keys: &NetKeys,
    pairs: Vec<network::Pair>,
) -> Vec<Measured> {
    let result_keys: Vec<String> = pairs
        .iter()
        .flat_map(|p| {
            [
                keys.client(p.client, p.server),
                keys.server(p.client, p.server),
            ]
        })
        .collect();
    let bound = (PAIR_BOUND + Duration::from_secs(4)) * 3 + Duration::from_secs(10);
    let all = store.wait(&result_keys, bound).await.unwrap_or(false);
    let mut measured = Vec::with_capacity(pairs.len());
    for p in pairs {
        let get = |k: String| async move {
            if all {
                store.multi_get(&[k]).await.ok().and_then(|mut v| v.pop())
            } else {
                store.get(&k).await.ok().flatten()
            }
        };
        let client = get(keys.client(p.client, p.server)).await;
        let server = get(keys.server(p.client, p.server)).await;
        measured.push((p, parse_result(client.as_deref(), server.as_deref())));
    }
    measured
}

async fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    let found = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::lookup_host((host, port)),
    )
    .await
    .ok()?
    .ok()?;
    let mut found = found;
    found.next()
}

/// `<host> <port> <hostname> <1: it serves the rendezvous store>`.
fn parse_peer(text: &str) -> Option<Peer> {
    let mut it = text.split_whitespace();
    let addr = it.next()?.to_string();
    let port = it.next()?.parse().ok()?;
    let host = it.next().unwrap_or("?").to_string();
    let hosts_store = it.next() == Some("1");
    Some(Peer {
        addr,
        port,
        host,
        hosts_store,
    })
}

/// A pair's measure from its client's `<latency µs> <down B/s>` and its server's `<up B/s>`
/// (`fail`, missing or unparsable: the pair failed; a failed up phase alone is 0 B/s).
fn parse_result(client: Option<&[u8]>, server: Option<&[u8]>) -> Option<Measure> {
    let client = String::from_utf8_lossy(client?).to_string();
    let mut it = client.split_whitespace();
    let lat: u64 = it.next()?.parse().ok()?;
    let down: f64 = it.next()?.parse().ok()?;
    let up: f64 = server
        .and_then(|s| String::from_utf8_lossy(s).trim().parse().ok())
        .unwrap_or(0.0);
    Some(Measure {
        latency: Duration::from_micros(lat),
        up_bps: up,
        down_bps: down,
    })
}

/// The console: one line per slow node, and whether it leaves (`spares`: how many may).
fn report(v: &NetVerdict, peers: &[Peer], leaving: &[usize], spares: usize, took: Duration) {
    for s in &v.slow {
        let what = if leaving.contains(&s.node) {
            "left out of the next round (a spare goes on)"
        } else if spares > 0 && peers[s.node].hosts_store {
            "kept (it serves the rendezvous store the others need)"
        } else {
            "kept (no spare node to go on without it)"
        };
        tracing::warn!(
            "network check: {} is slow: {s}; {what}",
            peers[s.node].describe(s.node)
        );
    }
    tracing::info!(
        took_ms = took.as_millis() as u64,
        median = %network::rate(v.median_bps),
        median_latency = %network::ms(v.median_latency),
        slow = v.slow.len(),
        "network check done"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_parse_and_failures_read_as_failed() {
        let m = parse_result(Some(b"120 2500000"), Some(b"1e9")).unwrap();
        assert_eq!(m.latency, Duration::from_micros(120));
        assert_eq!((m.up_bps, m.down_bps), (1e9, 2.5e6));
        assert_eq!(m.bps(), 2.5e6);
        assert_eq!(parse_result(Some(b"fail"), Some(b"1e9")), None);
        assert_eq!(parse_result(None, Some(b"1e9")), None);
        // The up phase failed alone: 0 B/s that way.
        assert_eq!(
            parse_result(Some(b"50 1e9"), Some(b"fail")).unwrap().up_bps,
            0.0
        );
        let p = parse_peer("10.0.0.3 4711 n3").unwrap();
        assert_eq!(
            (p.addr.as_str(), p.port, p.host.as_str()),
            ("10.0.0.3", 4711, "n3")
        );
        assert_eq!(p.describe(2), "node 2 (10.0.0.3, host n3)");
        assert!(parse_peer("10.0.0.3").is_none());
    }
}
