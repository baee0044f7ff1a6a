//! The observer's servers, bound before anything starts (a port that cannot be bound: one line,
//! the launch fails): `/metrics` and `/healthz` on `--metrics-addr` (with the task that samples
//! the workers' output counters for the metrics), and the health state on every address of
//! `TORCHELASTIC_HEALTH_CHECK_PORT`. They read what the renderers set (the registry, the
//! health state) and stop when the observer is dropped.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::health::Health;
use super::metrics::{self, Metrics};
use super::{exposition, http};
use crate::config::observe::ObserveSettings;

/// The servers started and the metrics registry they serve (`None`: no `--metrics-addr`).
pub struct Served {
    pub metrics: Option<Arc<Metrics>>,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Binds the servers `sinks` asks for; `health`: the state they answer.
pub async fn start(sinks: &ObserveSettings, health: &Health) -> Result<Served, String> {
    let mut served = Served {
        metrics: None,
        tasks: Vec::new(),
    };
    if let Some(addr) = sinks.metrics_addr {
        let m = Arc::new(Metrics::new(health.clone()));
        let (mm, hh) = (m.clone(), health.clone());
        let handler: http::Handler = Arc::new(move |req: &http::Request| match &*req.path {
            "/metrics" => {
                let open = exposition::wants_openmetrics(req.accept.as_deref());
                http::Response {
                    status: 200,
                    content_type: if open {
                        exposition::OPENMETRICS
                    } else {
                        exposition::CLASSIC
                    },
                    body: mm.render(open),
                }
            }
            "/healthz" => hh.response(),
            _ => http::text(404, "not found: try /metrics or /healthz\n"),
        });
        let (bound, task) = http::serve(addr, handler)
            .await
            .map_err(|e| format!("--metrics-addr {addr}: cannot listen: {e}"))?;
        tracing::info!("serving metrics at http://{bound}/metrics");
        served.tasks.push(task);
        let sampler = m.clone();
        served.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(metrics::SAMPLE);
            loop {
                tick.tick().await;
                sampler.sample_outputs();
            }
        }));
        served.metrics = Some(m);
    }
    if let Some(port) = sinks.health_port {
        served.tasks.push(serve_health(port, health).await?);
    }
    Ok(served)
}

/// The health state on every address of `port`, IPv6 too: a health probe (a kubelet) comes over
/// the pod's address, which may be IPv6. `[::]` is dual-stack (IPv4 clients arrive as mapped
/// addresses); a host without IPv6 gets the IPv4 wildcard.
async fn serve_health(port: u16, health: &Health) -> Result<JoinHandle<()>, String> {
    let hh = health.clone();
    let handler: http::Handler = Arc::new(move |_: &http::Request| hh.response());
    let any6 = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let served = match http::serve(any6, handler.clone()).await {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            let any4 = std::net::SocketAddr::from(([0, 0, 0, 0], port));
            http::serve(any4, handler).await
        }
        r => r,
    };
    let (bound, task) =
        served.map_err(|e| format!("TORCHELASTIC_HEALTH_CHECK_PORT={port}: cannot listen: {e}"))?;
    tracing::info!("serving the health check on port {}", bound.port());
    Ok(task)
}
