//! Unit tests of the rendezvous handle (`handle.rs`).
use super::*;

fn rdzv_config(backend: RdzvBackend) -> RdzvConfig {
    with_conf(backend, &[])
}

/// A config typed as the resolver types it (`RdzvConfig::typed`).
fn with_conf(backend: RdzvBackend, conf: &[(&str, &str)]) -> RdzvConfig {
    RdzvConfig::typed(
        backend,
        Endpoint {
            host: "127.0.0.1".into(),
            port: 1,
        },
        "x",
        conf.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        NodeRange { min: 2, max: 2 },
    )
    .expect("typed")
}

#[tokio::test]
async fn an_untyped_config_is_refused_not_parsed() {
    let mut cfg = rdzv_config(RdzvBackend::C10d);
    cfg.settings = None;
    let err = start_for(cfg).await.err().unwrap();
    assert!(err.to_string().contains("were not typed"), "{err}");
}

#[tokio::test]
async fn etcd_v2_is_rejected_naming_etcd_v3() {
    let err = start_for(rdzv_config(RdzvBackend::EtcdV2))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("v2 API is gone"), "{err}");
    assert!(err.to_string().contains("etcd-v3"), "{err}");
}

#[cfg(not(feature = "etcd"))]
#[tokio::test]
async fn etcd_without_the_feature_says_how_to_enable_it() {
    let err = start_for(rdzv_config(RdzvBackend::Etcd))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("--features etcd"), "{err}");
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn unreachable_etcd_is_a_bounded_error_naming_the_endpoints() {
    let cfg = with_conf(
        RdzvBackend::Etcd,
        &[(super::super::etcd::ENDPOINTS_KEY, "127.0.0.1:1,127.0.0.1:2")],
    );
    let t0 = std::time::Instant::now();
    let err = start_for(cfg).await.err().unwrap().to_string();
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(
        err.starts_with("etcd rendezvous at 127.0.0.1:1, 127.0.0.1:2: no member answered"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

async fn start_for(rdzv: RdzvConfig) -> Result<Rendezvous, RendezvousError> {
    Rendezvous::start(
        &rdzv,
        NodeSpec {
            nnodes: NodeRange { min: 2, max: 2 },
            node_rank: 0,
            nproc_per_node: 1,
            local_addr: None,
        },
    )
    .await
}
