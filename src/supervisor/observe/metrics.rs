//! The `/metrics` registry (Prometheus text format, through the `prometheus-client` crate: the
//! maintained, dependency-light client of the Prometheus project's Rust org, whose text encoder
//! gets names, escaping, `_total` suffixes and `# EOF` right so rdrun need not). Its encoder
//! writes OpenMetrics; [`super::exposition`] gives the classic format to clients that ask for it.
//!
//! Every series whose labels are known up front exists from the first scrape, at 0: a counter
//! that appears only with its first increment hides that increment from `rate()`/`increase()`
//! (issue 25: one restart, `increase(rdrun_restarts_total[10m])` = 0).
//!
//! Its renderer (`render_metrics.rs`) updates the values as the agent's events arrive; the
//! output watch, the store counters and `rdrun_healthy` (the health state, `health.rs`) are
//! sampled when a scrape comes (and every [`SAMPLE`] for the output times, so "time to first
//! output" is exact to that period).

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::health::{Health, State};
use crate::store::stats::{Snapshot, STATS};
use crate::supervisor::watch::hang::OutputCounter;

/// How often worker output counters are sampled for first-output and last-output times.
pub const SAMPLE: Duration = Duration::from_millis(100);

type Rank = [(&'static str, String); 1];
/// A histogram by fault kind (`--chaos`, issue 41).
type ByKind = Family<[(&'static str, String); 1], Histogram, fn() -> Histogram>;
type FGauge = Gauge<f64, AtomicU64>;

fn rank(lr: usize) -> Rank {
    [("local_rank", lr.to_string())]
}

/// The buckets of the chaos histograms: a kill is detected at once and recovered in a
/// restart's time; a hang takes its budget.
fn chaos_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    ])
}

/// One worker's output as seen by the sampler.
struct OutputWatch {
    local_rank: usize,
    counter: OutputCounter,
    spawned: Instant,
    seen: u64,
    last_at: Option<Instant>,
    first_done: bool,
}

pub struct Metrics {
    registry: Registry,
    workers_up: Family<Rank, Gauge>,
    restarts: Family<[(&'static str, String); 1], Counter>,
    attempt: Gauge,
    healthy: Gauge,
    spawn_seconds: FGauge,
    rdzv_seconds: FGauge,
    rdzv_total: Counter<f64, AtomicU64>,
    first_output: Family<Rank, FGauge>,
    output_age: Family<Rank, FGauge>,
    stop_seconds: FGauge,
    restart_seconds: Histogram,
    chaos_detect: ByKind,
    chaos_recover: ByKind,
    store_open: Gauge,
    store_accepted: Counter,
    store_ops: Family<[(&'static str, String); 1], Counter>,
    store_waits: Gauge,
    node_checks: Family<[(&'static str, String); 1], Gauge>,
    net_seconds: FGauge,
    net_bps: Family<[(&'static str, String); 1], FGauge>,
    net_slow: Family<[(&'static str, String); 1], Gauge>,
    node_failures: Gauge,
    run_node_failures: Family<[(&'static str, String); 1], Gauge>,
    outputs: Mutex<Vec<OutputWatch>>,
    store_seen: Mutex<Option<Snapshot>>,
    /// The group's health state, which `rdrun_healthy` shows.
    health: Health,
}

impl Metrics {
    /// `health`: the state `rdrun_healthy` shows (1 while it is `running`).
    pub fn new(health: Health) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            workers_up: Family::default(),
            restarts: Family::default(),
            attempt: Gauge::default(),
            healthy: Gauge::default(),
            spawn_seconds: FGauge::default(),
            rdzv_seconds: FGauge::default(),
            rdzv_total: Counter::default(),
            first_output: Family::default(),
            output_age: Family::default(),
            stop_seconds: FGauge::default(),
            // A warm restart takes 0.05-0.3 s, a cold one seconds, one that waits for a
            // rendezvous or a stop's grace up to minutes.
            restart_seconds: Histogram::new([
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            chaos_detect: Family::new_with_constructor(chaos_histogram),
            chaos_recover: Family::new_with_constructor(chaos_histogram),
            store_open: Gauge::default(),
            store_accepted: Counter::default(),
            store_ops: Family::default(),
            store_waits: Gauge::default(),
            node_checks: Family::default(),
            net_seconds: FGauge::default(),
            net_bps: Family::default(),
            net_slow: Family::default(),
            node_failures: Gauge::default(),
            run_node_failures: Family::default(),
            outputs: Mutex::new(Vec::new()),
            store_seen: Mutex::new(None),
            health,
            registry: Registry::default(),
        };
        m.register_nodes(&mut registry);
        m.register_run(&mut registry);
        m.register_store(&mut registry);
        for charged in [true, false] {
            drop(
                m.restarts
                    .get_or_create(&[("charged", charged.to_string())]),
            );
        }
        Metrics { registry, ..m }
    }

    /// The node's health, network and failure-count series (issue 28). The registration order
    /// is the exposition's order.
    fn register_nodes(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "rdrun_node_check_failed",
            "1 when this node's last health check of this kind failed (issue 28), else 0",
            m.node_checks.clone(),
        );
        registry.register(
            "rdrun_network_check_duration_seconds",
            "Time the last network pre-check took (issue 28)",
            m.net_seconds.clone(),
        );
        registry.register(
            "rdrun_network_node_bytes_per_second",
            "Each node's best pair bandwidth in the last network pre-check, by group rank",
            m.net_bps.clone(),
        );
        registry.register(
            "rdrun_network_node_slow",
            "1 when the last network pre-check found this group rank slow, else 0",
            m.net_slow.clone(),
        );
        registry.register(
            "rdrun_node_failures",
            "This node's worker failures in this run (what --max-node-failures counts)",
            m.node_failures.clone(),
        );
        registry.register(
            "rdrun_run_node_failures",
            "Every node's worker failures in this run, by host name, as shared through the \
             rendezvous store (read when a round starts and at the end)",
            m.run_node_failures.clone(),
        );
    }

    /// The workers' and the attempts' series.
    fn register_run(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "rdrun_workers_up",
            "1 while the worker of this local rank runs (current attempt)",
            m.workers_up.clone(),
        );
        registry.register(
            "rdrun_restarts",
            "Restarts of the worker group; charged=false for membership changes",
            m.restarts.clone(),
        );
        registry.register(
            "rdrun_attempt",
            "The current attempt (TORCHELASTIC_RESTART_COUNT)",
            m.attempt.clone(),
        );
        registry.register(
            "rdrun_healthy",
            "1 while the group runs healthily (what the health endpoint answers 200 for)",
            m.healthy.clone(),
        );
        registry.register(
            "rdrun_spawn_duration_seconds",
            "Time to spawn every local worker, last attempt",
            m.spawn_seconds.clone(),
        );
        registry.register(
            "rdrun_rendezvous_duration_seconds",
            "Time the last rendezvous round took",
            m.rdzv_seconds.clone(),
        );
        registry.register(
            "rdrun_rendezvous_seconds",
            "Time spent in rendezvous rounds, all rounds",
            m.rdzv_total.clone(),
        );
        registry.register(
            "rdrun_first_output_seconds",
            "Time from spawn to the worker's first output byte, current attempt",
            m.first_output.clone(),
        );
        registry.register(
            "rdrun_last_output_age_seconds",
            "Time since the worker last wrote output (since its spawn if it never did)",
            m.output_age.clone(),
        );
        registry.register(
            "rdrun_restart_seconds",
            "What each restart cost: the first failure seen to every worker of the next attempt \
             spawned (issue 37; the phases are in the restart_cost event)",
            m.restart_seconds.clone(),
        );
        registry.register(
            "rdrun_chaos_detect_seconds",
            "--chaos: an injected fault to rdrun's decision (the stop began), by fault kind",
            m.chaos_detect.clone(),
        );
        registry.register(
            "rdrun_chaos_recover_seconds",
            "--chaos: an injected fault to every rank back in user code, by fault kind",
            m.chaos_recover.clone(),
        );
        registry.register(
            "rdrun_stop_duration_seconds",
            "Time the last stop of the group took, from the stop signal to the last exit",
            m.stop_seconds.clone(),
        );
    }

    /// The hosted store's counters (sampled from `store::stats` when a scrape comes).
    fn register_store(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "rdrun_store_connections",
            "Store connections open now (this process's store servers)",
            m.store_open.clone(),
        );
        registry.register(
            "rdrun_store_connections_accepted",
            "Store connections accepted",
            m.store_accepted.clone(),
        );
        registry.register(
            "rdrun_store_operations",
            "Store requests served, per operation",
            m.store_ops.clone(),
        );
        registry.register(
            "rdrun_store_waits_pending",
            "Store WAIT/BARRIER requests not answered yet",
            m.store_waits.clone(),
        );
    }

    pub fn attempt_begins(&self, attempt: u32) {
        self.attempt.set(i64::from(attempt));
        self.workers_up.clear();
        self.first_output.clear();
        self.output_age.clear();
        lock(&self.outputs).clear();
    }

    pub fn spawned(&self, local_rank: usize, counter: OutputCounter) {
        self.workers_up.get_or_create(&rank(local_rank)).set(1);
        lock(&self.outputs).push(OutputWatch {
            local_rank,
            seen: counter.get(),
            counter,
            spawned: Instant::now(),
            last_at: None,
            first_done: false,
        });
    }

    pub fn exited(&self, local_rank: usize) {
        self.workers_up.get_or_create(&rank(local_rank)).set(0);
    }

    pub fn spawn_took(&self, d: Duration) {
        self.spawn_seconds.set(d.as_secs_f64());
    }

    pub fn rendezvous_took(&self, d: Duration) {
        self.rdzv_seconds.set(d.as_secs_f64());
        self.rdzv_total.inc_by(d.as_secs_f64());
    }

    pub fn stop_took(&self, d: Duration) {
        self.stop_seconds.set(d.as_secs_f64());
    }

    /// An injected fault's measured detection and recovery (`--chaos`).
    pub fn chaos_recovered(&self, kind: &str, detect: Option<f64>, recover: Option<f64>) {
        let label = [("kind", kind.to_string())];
        if let Some(d) = detect {
            self.chaos_detect.get_or_create(&label).observe(d);
        }
        if let Some(r) = recover {
            self.chaos_recover.get_or_create(&label).observe(r);
        }
    }

    pub fn restart_took(&self, d: Duration) {
        self.restart_seconds.observe(d.as_secs_f64());
    }

    pub fn restarted(&self, charged: bool) {
        self.restarts
            .get_or_create(&[("charged", charged.to_string())])
            .inc();
    }

    /// The last verdict of one health check.
    pub fn node_check(&self, check: &str, failed: bool) {
        self.node_checks
            .get_or_create(&[("check", check.to_string())])
            .set(i64::from(failed));
    }

    /// The last network pre-check: its time, every node's score, who is slow.
    pub fn network_check(&self, v: &crate::health::network::NetVerdict, took: Duration) {
        self.net_seconds.set(took.as_secs_f64());
        self.net_bps.clear();
        self.net_slow.clear();
        for s in &v.scores {
            let label = [("node", s.node.to_string())];
            self.net_bps.get_or_create(&label).set(s.bps);
            let slow = v.slow.iter().any(|x| x.node == s.node);
            self.net_slow.get_or_create(&label).set(i64::from(slow));
        }
    }

    pub fn node_failures(&self, count: u32) {
        self.node_failures.set(i64::from(count));
    }

    pub fn run_node_failures<'a>(&self, nodes: impl Iterator<Item = (&'a str, u32)>) {
        self.run_node_failures.clear();
        for (node, count) in nodes {
            self.run_node_failures
                .get_or_create(&[("node", node.to_string())])
                .set(i64::from(count));
        }
    }

    /// Looks at every worker's output counter (the sampler task and each scrape call it).
    pub fn sample_outputs(&self) {
        let now = Instant::now();
        for w in lock(&self.outputs).iter_mut() {
            let bytes = w.counter.get();
            if bytes != w.seen {
                w.seen = bytes;
                w.last_at = Some(now);
                if !w.first_done {
                    w.first_done = true;
                    self.first_output
                        .get_or_create(&rank(w.local_rank))
                        .set(now.duration_since(w.spawned).as_secs_f64());
                }
            }
            let since = w.last_at.unwrap_or(w.spawned);
            self.output_age
                .get_or_create(&rank(w.local_rank))
                .set(now.duration_since(since).as_secs_f64());
        }
    }

    fn sample_store(&self) {
        let now = STATS.snapshot();
        let mut seen = lock(&self.store_seen);
        let before = seen.take();
        let old = |name: &str| {
            before
                .as_ref()
                .and_then(|b| b.ops.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
                .unwrap_or(0)
        };
        for (name, v) in &now.ops {
            let c = self.store_ops.get_or_create(&[("op", name.clone())]);
            c.inc_by(v.saturating_sub(old(name)));
        }
        let accepted_before = before.as_ref().map_or(0, |b| b.accepted);
        self.store_accepted
            .inc_by(now.accepted.saturating_sub(accepted_before));
        self.store_open.set(now.open.max(0));
        self.store_waits.set(now.waits_pending);
        *seen = Some(now);
    }

    /// The text exposition: OpenMetrics (`# EOF` terminated) or, `openmetrics` false, the
    /// classic text format 0.0.4.
    pub fn render(&self, openmetrics: bool) -> String {
        self.sample_outputs();
        self.sample_store();
        self.healthy
            .set(i64::from(self.health.get() == State::Running));
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        if openmetrics {
            out
        } else {
            super::exposition::classic(&out)
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn exposition_names_and_values() {
        let m = Metrics::new(Health::default());
        m.attempt_begins(1);
        let c = OutputCounter::new();
        m.spawned(0, c.clone());
        m.spawned(1, OutputCounter::new());
        m.exited(1);
        m.restarted(true);
        m.rendezvous_took(Duration::from_millis(1500));
        tokio::time::advance(Duration::from_secs(2)).await;
        c.add(10);
        let text = m.render(true);
        for want in [
            "rdrun_workers_up{local_rank=\"0\"} 1",
            "rdrun_workers_up{local_rank=\"1\"} 0",
            "rdrun_restarts_total{charged=\"true\"} 1",
            "rdrun_attempt 1",
            "rdrun_rendezvous_duration_seconds 1.5",
            "rdrun_rendezvous_seconds_total 1.5",
            "rdrun_first_output_seconds{local_rank=\"0\"} 2.0",
            "rdrun_last_output_age_seconds{local_rank=\"0\"} 0.0",
            "rdrun_last_output_age_seconds{local_rank=\"1\"} 2.0",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(text.contains("rdrun_store_operations_total{op=\"get\"}"));
        // A new attempt forgets the old workers.
        m.attempt_begins(2);
        assert!(!m.render(true).contains("rdrun_workers_up{"));
    }

    /// `rdrun_healthy` is the health state when the scrape comes: 1 only while `running`.
    #[test]
    fn healthy_is_read_from_the_health_state() {
        let health = Health::default();
        let m = Metrics::new(health.clone());
        assert!(m.render(true).contains("rdrun_healthy 0\n"));
        health.set(State::Running);
        assert!(m.render(true).contains("rdrun_healthy 1\n"));
        health.set(State::Stopping);
        assert!(m.render(false).contains("rdrun_healthy 0\n"));
    }

    /// Issue 25: both `charged` series of the restart counter exist at 0 before any restart,
    /// in either format.
    #[test]
    fn counters_exist_at_zero_from_the_first_scrape() {
        let m = Metrics::new(Health::default());
        for open in [true, false] {
            let text = m.render(open);
            for want in [
                "rdrun_restarts_total{charged=\"true\"} 0",
                "rdrun_restarts_total{charged=\"false\"} 0",
                "rdrun_rendezvous_seconds_total 0",
                "rdrun_store_connections_accepted_total ",
            ] {
                assert!(text.contains(want), "{want} missing in\n{text}");
            }
        }
        let classic = m.render(false);
        assert!(
            classic.contains("# TYPE rdrun_restarts_total counter\n"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"), "{classic}");
    }

    /// Issue 41: an injected fault's detect and recover seconds, by fault kind.
    #[test]
    fn chaos_histograms_by_kind() {
        let m = Metrics::new(Health::default());
        m.chaos_recovered("kill", Some(0.005), Some(2.0));
        m.chaos_recovered("hang", Some(40.0), None);
        let text = m.render(false);
        for want in [
            "# TYPE rdrun_chaos_detect_seconds histogram\n",
            "rdrun_chaos_detect_seconds_count{kind=\"kill\"} 1",
            "rdrun_chaos_detect_seconds_bucket{le=\"0.01\",kind=\"kill\"} 1",
            "rdrun_chaos_detect_seconds_count{kind=\"hang\"} 1",
            "rdrun_chaos_recover_seconds_bucket{le=\"2.5\",kind=\"kill\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(
            !text.contains("rdrun_chaos_recover_seconds_count{kind=\"hang\"}"),
            "{text}"
        );
    }

    /// Issue 37 item 4: the restart histogram is there from the first scrape and counts each
    /// restart's total in its buckets.
    #[test]
    fn restart_seconds_is_a_histogram() {
        let m = Metrics::new(Health::default());
        assert!(m
            .render(false)
            .contains("# TYPE rdrun_restart_seconds histogram\n"));
        m.restart_took(Duration::from_millis(90));
        m.restart_took(Duration::from_secs(3));
        let text = m.render(false);
        for want in [
            "rdrun_restart_seconds_count 2",
            "rdrun_restart_seconds_bucket{le=\"0.1\"} 1",
            "rdrun_restart_seconds_bucket{le=\"5.0\"} 2",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }

    /// Issue 28: every node's failure counts, by host name; a new reading replaces the old.
    #[test]
    fn the_runs_failure_counts_are_one_series_per_node() {
        let m = Metrics::new(Health::default());
        m.run_node_failures([("n2", 2), ("n1", 1)].into_iter());
        let text = m.render(true);
        assert!(
            text.contains("rdrun_run_node_failures{node=\"n2\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("rdrun_run_node_failures{node=\"n1\"} 1"),
            "{text}"
        );
        m.run_node_failures([("n2", 3)].into_iter());
        let text = m.render(true);
        assert!(
            text.contains("rdrun_run_node_failures{node=\"n2\"} 3"),
            "{text}"
        );
        assert!(!text.contains("node=\"n1\""), "{text}");
    }
}
