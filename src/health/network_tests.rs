//! The pairing schedule and the verdict from measured numbers.

use std::collections::BTreeSet;

use super::*;

/// Every node's partners over all steps.
fn partners(steps: &[Vec<Pair>], node: usize) -> BTreeSet<usize> {
    steps
        .iter()
        .flatten()
        .filter_map(|p| {
            (p.client == node)
                .then_some(p.server)
                .or((p.server == node).then_some(p.client))
        })
        .collect()
}

#[test]
fn every_node_is_measured_against_two_partners_in_at_most_three_steps() {
    assert!(schedule(0).is_empty() && schedule(1).is_empty());
    assert_eq!(
        schedule(2),
        vec![vec![Pair {
            client: 0,
            server: 1
        }]]
    );
    for n in 3..=33 {
        let steps = schedule(n);
        assert!(steps.len() <= 3, "{n}: {} steps", steps.len());
        assert_eq!(steps.len(), if n % 2 == 0 { 2 } else { 3 }, "{n}");
        for (i, step) in steps.iter().enumerate() {
            let mut seen = BTreeSet::new();
            for p in step {
                assert_ne!(p.client, p.server);
                assert!(p.client < n && p.server < n);
                assert!(seen.insert(p.client), "{n} step {i}: {} twice", p.client);
                assert!(seen.insert(p.server), "{n} step {i}: {} twice", p.server);
            }
        }
        for node in 0..n {
            assert_eq!(
                partners(&steps, node).len(),
                2,
                "{n} node {node}: {steps:?}"
            );
        }
        // A ring: n pairs in all.
        assert_eq!(steps.iter().flatten().count(), n, "{n}");
    }
}

const FAST: f64 = 1e9;
const SLOW: f64 = 2e6;

fn ok(lat_us: u64, up: f64, down: f64) -> Option<Measure> {
    Some(Measure {
        latency: Duration::from_micros(lat_us),
        up_bps: up,
        down_bps: down,
    })
}

/// What every pair of `n` nodes measures when `slow` nodes have a rate limit (on either
/// direction), with a little noise.
fn measure(n: usize, slow: &[usize], slow_up_only: bool) -> Vec<Measured> {
    schedule(n)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| {
            let noise = 1.0 - 0.1 * (i % 4) as f64;
            let hit = |x: usize| slow.contains(&x);
            let fast = FAST * noise;
            // A rate limit on a slow node's egress only, or on both of its directions.
            let (up, down) = if slow_up_only {
                (
                    if hit(p.client) { SLOW } else { fast },
                    if hit(p.server) { SLOW } else { fast },
                )
            } else {
                let r = if hit(p.client) || hit(p.server) {
                    SLOW
                } else {
                    fast
                };
                (r, r)
            };
            (p, ok(40 + i as u64 * 3, up, down))
        })
        .collect()
}

fn named(v: &NetVerdict) -> Vec<usize> {
    v.slow.iter().map(|s| s.node).collect()
}

#[test]
fn the_one_slow_node_is_named_whichever_it_is() {
    for n in 3..=9 {
        for bad in 0..n {
            for up_only in [false, true] {
                let v = judge(n, &measure(n, &[bad], up_only), 0.25);
                assert_eq!(named(&v), [bad], "n={n} bad={bad} up_only={up_only}: {v:?}");
            }
        }
    }
}

#[test]
fn an_even_network_names_nobody() {
    for n in 2..=9 {
        let v = judge(n, &measure(n, &[], false), 0.25);
        assert!(v.slow.is_empty(), "{n}: {v:?}");
        assert!(v.median_bps > 0.5e9);
    }
}

#[test]
fn two_nodes_cannot_tell_which_end_is_slow() {
    let v = judge(2, &measure(2, &[1], false), 0.25);
    assert!(v.slow.is_empty(), "{v:?}");
}

#[test]
fn latency_alone_can_make_a_node_slow_but_only_past_the_slack() {
    let pairs: Vec<Pair> = schedule(4).into_iter().flatten().collect();
    // Node 3: 20 ms to everyone, full bandwidth.
    let m: Vec<Measured> = pairs
        .iter()
        .map(|&p| {
            let lat = if p.client == 3 || p.server == 3 {
                20_000
            } else {
                50
            };
            (p, ok(lat, FAST, FAST))
        })
        .collect();
    let v = judge(4, &m, 0.25);
    assert_eq!(named(&v), [3]);
    assert_eq!(v.slow[0].why(), "latency");
    assert!(
        v.slow[0].to_string().ends_with("; by its latency)"),
        "{}",
        v.slow[0]
    );
    // 1 ms against a 50 µs median is 20 times it, but within the slack: nobody.
    let m: Vec<Measured> = pairs
        .iter()
        .map(|&p| {
            let lat = if p.client == 3 || p.server == 3 {
                1_000
            } else {
                50
            };
            (p, ok(lat, FAST, FAST))
        })
        .collect();
    assert!(judge(4, &m, 0.25).slow.is_empty());
}

#[test]
fn a_failed_exchange_counts_as_slow_and_all_failed_names_nobody() {
    let m: Vec<Measured> = schedule(4)
        .into_iter()
        .flatten()
        .map(|p| {
            let dead = p.client == 2 || p.server == 2;
            (p, if dead { None } else { ok(50, FAST, FAST) })
        })
        .collect();
    let v = judge(4, &m, 0.25);
    assert_eq!(named(&v), [2], "{v:?}");
    assert_eq!(v.scores[2].latency, None);
    assert!(v.slow[0].to_string().contains("no answer"), "{}", v.slow[0]);
    assert_eq!(v.slow[0].why(), "bandwidth and latency");
    let m: Vec<Measured> = schedule(4)
        .into_iter()
        .flatten()
        .map(|p| (p, None))
        .collect();
    assert!(judge(4, &m, 0.25).slow.is_empty());
}

#[test]
fn a_healthy_node_between_two_slow_ones_is_not_named() {
    // Ring of 7: node 2's partners are 1 and 3, both slow (the median node is still fast).
    let v = judge(7, &measure(7, &[1, 3], false), 0.25);
    assert_eq!(named(&v), [1, 3], "{v:?}");
}

#[test]
fn the_threshold_decides_how_far_below_is_slow() {
    // Node 1 at 40 % of the others.
    let m: Vec<Measured> = schedule(4)
        .into_iter()
        .flatten()
        .map(|p| {
            let r = if p.client == 1 || p.server == 1 {
                0.4e9
            } else {
                1e9
            };
            (p, ok(50, r, r))
        })
        .collect();
    assert!(judge(4, &m, 0.25).slow.is_empty());
    assert_eq!(named(&judge(4, &m, 0.5)), [1]);
}

#[test]
fn numbers_read_as_units() {
    assert_eq!(rate(2.5e6), "2.5 MB/s");
    assert_eq!(rate(1.25e9), "1.2 GB/s");
    assert_eq!(rate(900.0), "0.9 kB/s");
    assert_eq!(ms(Duration::from_micros(210)), "0.21 ms");
}

#[test]
fn only_as_many_slow_nodes_leave_as_there_are_spares_slowest_first() {
    let mut m = measure(9, &[2, 6], false);
    // Node 6 slower still than node 2.
    for (p, r) in &mut m {
        if p.client == 6 || p.server == 6 {
            let x = r.as_mut().unwrap();
            x.up_bps = SLOW / 4.0;
            x.down_bps = SLOW / 4.0;
        }
    }
    let v = judge(9, &m, 0.25);
    assert_eq!(named(&v), [2, 6]);
    let none = |_| false;
    assert_eq!(left_out(&v, 0, none), Vec::<usize>::new());
    assert_eq!(left_out(&v, 1, none), [6]);
    assert_eq!(left_out(&v, 5, none), [2, 6]);
    // The store's host stays (named only); the next slowest goes instead.
    assert_eq!(left_out(&v, 1, |n| n == 6), [2]);
}
