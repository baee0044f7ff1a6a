//! The network pre-check's decisions (issue 28 item 3), pure: which nodes measure each other in
//! which step ([`schedule`]), and which node is slow given the measured numbers ([`judge`]).
//! The socket I/O is `netprobe.rs`; the store exchange and what a verdict does to the run are
//! the supervisor's (`supervisor/nodes/network_check.rs`).
//!
//! Why two partners per node: one pair's slow exchange cannot say which of its two ends is slow.
//! The pairs are the edges of a ring over the group ranks (node i with i+1, the last with the
//! first), split into at most three steps in which no node is in two pairs (even n: two steps,
//! odd n: three), so every node is measured twice, against two different partners, in O(1)
//! steps whatever the number of nodes. A node's score is its best pair (the healthy partner
//! shows what its own link can do); a node is slow when its score is far below the median
//! node's, and only when one of its partners is not: a healthy node between two slow ones
//! cannot be told from a slow one, and is not named.

use std::fmt;
use std::time::Duration;

/// One measured pair: `client` connects to `server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    pub client: usize,
    pub server: usize,
}

/// The pairs of each step, for `n` nodes (group ranks `0..n`): the ring's edges, in steps where
/// no node is in two pairs. Fewer than two nodes: none; two: the one pair.
pub fn schedule(n: usize) -> Vec<Vec<Pair>> {
    if n < 2 {
        return Vec::new();
    }
    if n == 2 {
        return vec![vec![Pair {
            client: 0,
            server: 1,
        }]];
    }
    let even: Vec<Pair> = (0..n / 2)
        .map(|k| Pair {
            client: 2 * k,
            server: 2 * k + 1,
        })
        .collect();
    // Odd edges (1,2), (3,4), ...; with even n the last one wraps to (n-1, 0).
    let odd: Vec<Pair> = (0..n / 2)
        .map(|k| 2 * k + 1)
        .map(|a| Pair {
            client: a,
            server: (a + 1) % n,
        })
        .collect();
    let mut steps = vec![even, odd];
    if n % 2 == 1 {
        // The ring's closing edge: node n-1 and node 0 were each in one pair so far.
        steps.push(vec![Pair {
            client: n - 1,
            server: 0,
        }]);
    }
    steps
}

/// One node as the check knows it (from the address it published): where its probe listens,
/// and its host name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: String,
    pub port: u16,
    pub host: String,
    /// It serves the rendezvous store: it cannot leave without taking the store from the others.
    pub hosts_store: bool,
}

impl Peer {
    /// `node 2 (10.0.0.3, host n3)`.
    pub fn describe(&self, rank: usize) -> String {
        format!("node {rank} ({}, host {})", self.addr, self.host)
    }
}

/// What one pair measured (both directions; `None` in [`Measured`]: the exchange failed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// The shortest of a few one-byte round trips.
    pub latency: Duration,
    /// Bytes per second client to server, as the server received them.
    pub up_bps: f64,
    /// Bytes per second server to client, as the client received them.
    pub down_bps: f64,
}

impl Measure {
    /// The pair's bandwidth: its slower direction (a rate limit on either end's egress shows).
    pub fn bps(&self) -> f64 {
        self.up_bps.min(self.down_bps)
    }
}

/// A pair and what it measured (`None`: it could not connect or exchange within its bound).
pub type Measured = (Pair, Option<Measure>);

/// One node's score: the best of its pairs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    pub node: usize,
    /// Its best pair's bandwidth (0: none of its exchanges worked).
    pub bps: f64,
    /// Its best pair's latency (`None`: none worked).
    pub latency: Option<Duration>,
}

/// A node found slow, with the numbers that say so.
#[derive(Debug, Clone, PartialEq)]
pub struct Slow {
    pub node: usize,
    pub score: Score,
    pub median_bps: f64,
    pub median_latency: Duration,
    /// Which rules found it slow: its bandwidth, its latency (no answer counts as both).
    pub low_bandwidth: bool,
    pub high_latency: bool,
}

impl Slow {
    /// `bandwidth`, `latency` or `bandwidth and latency`: why it was named.
    pub fn why(&self) -> &'static str {
        match (self.low_bandwidth, self.high_latency) {
            (true, true) => "bandwidth and latency",
            (false, true) => "latency",
            _ => "bandwidth",
        }
    }
}

impl fmt::Display for Slow {
    /// `10.5 MB/s, 0.21 ms (median 1.2 GB/s, 0.05 ms; by its bandwidth)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lat = match self.score.latency {
            Some(l) => ms(l),
            None => "no answer".into(),
        };
        write!(
            f,
            "{}, {lat} (median {}, {}; by its {})",
            rate(self.score.bps),
            rate(self.median_bps),
            ms(self.median_latency),
            self.why()
        )
    }
}

/// The verdict of one pre-check.
#[derive(Debug, Clone, PartialEq)]
pub struct NetVerdict {
    /// Every node's score, by group rank.
    pub scores: Vec<Score>,
    pub median_bps: f64,
    pub median_latency: Duration,
    /// The slow nodes, by group rank.
    pub slow: Vec<Slow>,
}

/// Latency below this is never slow, whatever the median: on a fast local network the median is
/// tens of microseconds, and one scheduling delay is more than a few times that.
pub const LATENCY_SLACK: Duration = Duration::from_millis(2);

/// Which of `n` nodes are slow, from every pair's measurement. A node is slow when its best
/// bandwidth is under `threshold` × the median node's, or its best latency over
/// [`LATENCY_SLACK`] + the median's / `threshold` — and at least one of its partners is not.
pub fn judge(n: usize, measured: &[Measured], threshold: f64) -> NetVerdict {
    let scores: Vec<Score> = (0..n)
        .map(|node| {
            let mine = measured
                .iter()
                .filter(|(p, _)| p.client == node || p.server == node);
            let mut s = Score {
                node,
                bps: 0.0,
                latency: None,
            };
            for (_, m) in mine {
                if let Some(m) = m {
                    s.bps = s.bps.max(m.bps());
                    s.latency = Some(s.latency.map_or(m.latency, |l| l.min(m.latency)));
                }
            }
            s
        })
        .collect();
    let median_bps = median_f64(scores.iter().map(|s| s.bps).collect());
    let lats: Vec<f64> = scores
        .iter()
        .filter_map(|s| s.latency.map(|l| l.as_secs_f64()))
        .collect();
    let median_latency = Duration::from_secs_f64(median_f64(lats).max(0.0));
    let lat_limit = median_latency.div_f64(threshold) + LATENCY_SLACK;
    let low_bw = |s: &Score| s.bps < threshold * median_bps;
    let high_lat = |s: &Score| s.latency.map_or(true, |l| l > lat_limit);
    let low = |s: &Score| low_bw(s) || high_lat(s);
    // Nothing to compare with: every exchange failed (then it is not one node's fault).
    let comparable = median_bps > 0.0;
    let partners = |node: usize| {
        measured.iter().filter_map(move |(p, _)| {
            (p.client == node)
                .then_some(p.server)
                .or((p.server == node).then_some(p.client))
        })
    };
    let slow = scores
        .iter()
        .filter(|s| comparable && low(s) && partners(s.node).any(|p| !low(&scores[p])))
        .map(|s| Slow {
            node: s.node,
            score: *s,
            median_bps,
            median_latency,
            low_bandwidth: low_bw(s),
            high_latency: high_lat(s),
        })
        .collect();
    NetVerdict {
        scores,
        median_bps,
        median_latency,
        slow,
    }
}

/// Which slow nodes leave the job when `spares` nodes can go (the round has that many more than
/// MIN): the slowest first (by bandwidth, then group rank), in group-rank order; never one for
/// which `stays` is true (the node serving the rendezvous store).
pub fn left_out(v: &NetVerdict, spares: usize, stays: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut slow: Vec<&Slow> = v.slow.iter().filter(|s| !stays(s.node)).collect();
    slow.sort_by(|a, b| {
        a.score
            .bps
            .total_cmp(&b.score.bps)
            .then(a.node.cmp(&b.node))
    });
    let mut out: Vec<usize> = slow.into_iter().take(spares).map(|s| s.node).collect();
    out.sort_unstable();
    out
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `12.5 MB/s`, `1.1 GB/s` (bytes, decimal units: what a link's rate divided by 8 reads as).
pub fn rate(bps: f64) -> String {
    let (v, unit) = if bps >= 1e9 {
        (bps / 1e9, "GB/s")
    } else if bps >= 1e6 {
        (bps / 1e6, "MB/s")
    } else {
        (bps / 1e3, "kB/s")
    };
    format!("{v:.1} {unit}")
}

/// `0.21 ms`.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
