//! Unit tests of the etcd v3 driver (`driver.rs`): lease arithmetic, the 17.7 wait's pure parts.
use super::*;

fn m(addr: &str) -> Member {
    Member::new(addr, 1, 0, 1, 0)
}

#[test]
fn a_renewal_is_seen_only_when_no_expiring_lease_could_read_so() {
    let s = Duration::from_secs_f64;
    // Unrenewed: 4.x s left, 0.3 s later 3.x or 4.x s; 1.2 s later 3.x or lower.
    assert!(!renewed(4, 4, s(0.3)));
    assert!(!renewed(4, 3, s(0.3)));
    assert!(!renewed(4, 3, s(0.99)));
    assert!(!renewed(4, 2, s(1.2)));
    // Renewed back to 4.x s after 1 s or more, or up from 3.x to 4.x at once.
    assert!(renewed(4, 4, s(1.0)));
    assert!(renewed(3, 4, s(0.0)));
    assert!(renewed(4, 3, s(2.0)));
    // Expired (-1) is never renewed.
    assert!(!renewed(4, -1, s(3.0)));
    // An expired lease not yet revoked reads 0 (truncated toward zero): never a renewal.
    assert!(!renewed(2, 0, s(3.02)));
    assert!(!renewed(0, 0, s(1.5)));
}

#[test]
fn a_later_rounds_lost_peers_are_the_old_peers_without_alive_keys() {
    let peers = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        lost_in_later_round(&peers, &[("a".into(), 7), ("c".into(), 9)]),
        vec!["b".to_string()]
    );
    assert!(lost_in_later_round(&peers, &[("a".into(), 7), ("b".into(), 8)]).is_empty());
}

#[test]
fn dropped_peers_are_the_round_peers_a_peer_lost_round_no_longer_has() {
    let peers = vec!["10.0.0.2_1_0".to_string(), "10.0.0.3_1_0".to_string()];
    let mut st = RdzvState {
        round: 2,
        reason: RoundReason::PeerLost,
        participants: vec![m("10.0.0.1"), m("10.0.0.2")],
        ..Default::default()
    };
    assert_eq!(
        crate::rendezvous::plumbing::dropped_by(&peers, &st),
        ["10.0.0.3_1_0"]
    );
    st.reason = RoundReason::WorkerFailure;
    assert!(crate::rendezvous::plumbing::dropped_by(&peers, &st).is_empty());
}

#[test]
fn dead_are_watched_ids_without_an_alive_key() {
    let st = RdzvState {
        participants: vec![m("10.0.0.1"), m("10.0.0.2"), m("10.0.0.3")],
        wait_list: vec![m("10.0.0.4")],
        expected: vec!["10.0.0.5_1_0".into()],
        ..Default::default()
    };
    let alive: HashSet<String> = ["10.0.0.1_1_0", "10.0.0.3_1_0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        dead_among(&st, "10.0.0.1_1_0", &alive),
        ["10.0.0.2_1_0", "10.0.0.4_1_0", "10.0.0.5_1_0"]
    );
}
