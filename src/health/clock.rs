//! The `clock` health check's verdict (issue 28 item 1): this node's clock offset to the store
//! host, from the store round trip with the shortest time (the supervisor measures it through
//! the store's clock key, `store::CLOCK_KEY`; this module only judges the numbers). The offset
//! is the host's time minus this node's at the middle of the round trip, so it is known to
//! within half the round trip.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Status, Verdict};

/// An offset beyond this fails the check: NTP keeps nodes within milliseconds; a node seconds
/// off stamps its logs, events and error files at the wrong time and trips timeouts based on
/// wall time (TLS certificates, Kerberos tickets).
pub const MAX_OFFSET: Duration = Duration::from_secs(1);

/// One round trip to the store host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Host minus this node, seconds.
    pub offset: f64,
    pub rtt: Duration,
}

/// A sample from the host's answer (nanoseconds since the epoch, decimal) to a request sent at
/// `sent` that took `rtt`; `None` if the answer does not parse.
pub fn sample(answer: &[u8], sent: SystemTime, rtt: Duration) -> Option<Sample> {
    let host_ns: u128 = std::str::from_utf8(answer).ok()?.trim().parse().ok()?;
    let mid = (sent + rtt / 2).duration_since(UNIX_EPOCH).ok()?.as_nanos();
    let offset = (host_ns as f64 - mid as f64) / 1e9;
    Some(Sample { offset, rtt })
}

/// The verdict of the best sample (`Ok(None)`: the store does not tell its time; `Err`: it
/// could not be asked), for the store at `store`.
pub fn verdict(best: Result<Option<Sample>, String>, store: &str, took: Duration) -> Verdict {
    let (status, detail) = match best {
        Ok(Some(s)) => {
            let off = Duration::from_secs_f64(s.offset.abs());
            let ahead = if s.offset >= 0.0 {
                "behind"
            } else {
                "ahead of"
            };
            let detail = format!(
                "{:.1} ms {ahead} the store host {store} (round trip {:.1} ms)",
                off.as_secs_f64() * 1e3,
                s.rtt.as_secs_f64() * 1e3
            );
            if off > MAX_OFFSET {
                (
                    Status::Failed,
                    format!("{detail}; more than {MAX_OFFSET:?}"),
                )
            } else {
                (Status::Ok, detail)
            }
        }
        Ok(None) => (
            Status::Skipped,
            format!("the store at {store} does not tell its time (not an rdrun store)"),
        ),
        Err(why) => (
            Status::Skipped,
            format!("cannot ask the store at {store}: {why}"),
        ),
    };
    Verdict {
        check: "clock",
        status,
        detail,
        took,
    }
}

/// The best of several samples: the shortest round trip.
pub fn best(samples: impl IntoIterator<Item = Sample>) -> Option<Sample> {
    samples.into_iter().min_by_key(|s| s.rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u128) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    }

    #[test]
    fn offset_is_the_host_minus_the_middle_of_the_round_trip() {
        let sent = at(1_000_000_000_000);
        // Host answered 2 s later than the middle of a 10 ms round trip.
        let s = sample(b"1002005000000", sent, Duration::from_millis(10)).unwrap();
        assert!((s.offset - 2.0).abs() < 1e-6, "{s:?}");
        let s = sample(b"999505000000", sent, Duration::from_millis(10)).unwrap();
        assert!((s.offset + 0.5).abs() < 1e-6, "{s:?}");
        assert_eq!(sample(b"x", sent, Duration::ZERO), None);
        assert_eq!(sample(b"\0rdrun-absent\0", sent, Duration::ZERO), None);
    }

    #[test]
    fn verdicts() {
        let ok = Sample {
            offset: -0.012,
            rtt: Duration::from_micros(400),
        };
        let v = verdict(Ok(Some(ok)), "h:1", Duration::ZERO);
        assert_eq!(v.status, Status::Ok);
        assert_eq!(
            v.detail,
            "12.0 ms ahead of the store host h:1 (round trip 0.4 ms)"
        );
        let far = Sample {
            offset: 3.5,
            rtt: Duration::from_millis(1),
        };
        let v = verdict(Ok(Some(far)), "h:1", Duration::ZERO);
        assert_eq!(v.status, Status::Failed);
        assert!(
            v.detail.starts_with("3500.0 ms behind the store host h:1"),
            "{}",
            v.detail
        );
        assert_eq!(
            verdict(Ok(None), "h:1", Duration::ZERO).status,
            Status::Skipped
        );
        assert_eq!(
            verdict(Err("gone".into()), "h:1", Duration::ZERO).status,
            Status::Skipped
        );
        assert_eq!(best([far, ok]), Some(ok));
    }
}
