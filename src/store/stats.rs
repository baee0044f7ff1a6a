//! Process-wide counters of every store server in this process (the worker store and, on the
//! node that hosts it, the rendezvous store), read by the launcher's `/metrics`.
//!
//! Plain relaxed atomics: the server only increments them (one line at each point where a
//! connection opens or closes, a request is served, a wait starts or is answered, bytes are read
//! or written), so the hot
//! path pays one uncontended atomic add per request and nothing else. A process-wide value
//! instead of a per-server one keeps the server's API unchanged; `/metrics` reports the sum.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::protocol::{QueryType, Request};

/// The counters (see [`STATS`]).
#[derive(Debug)]
pub struct StoreStats {
    accepted: AtomicU64,
    open: AtomicI64,
    ops: [AtomicU64; QueryType::ALL.len()],
    waits_pending: AtomicI64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

/// The one instance every store server of the process updates.
pub static STATS: StoreStats = StoreStats {
    accepted: AtomicU64::new(0),
    open: AtomicI64::new(0),
    ops: [const { AtomicU64::new(0) }; QueryType::ALL.len()],
    waits_pending: AtomicI64::new(0),
    bytes_read: AtomicU64::new(0),
    bytes_written: AtomicU64::new(0),
};

/// What `/metrics` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Connections accepted since the process started.
    pub accepted: u64,
    /// Connections open now.
    pub open: i64,
    /// Requests served, per opcode (lower-case name as in `QueryType`'s Debug form).
    pub ops: Vec<(String, u64)>,
    /// WAIT and BARRIER requests registered and not answered yet.
    pub waits_pending: i64,
    /// Bytes read from all connections (requests), totals since the process started.
    pub bytes_read: u64,
    /// Bytes written to all connections (replies).
    pub bytes_written: u64,
}

impl StoreStats {
    /// A connection was accepted.
    pub fn opened(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection ended.
    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A request is being served.
    pub fn op(&self, req: &Request) {
        self.ops[req.query_type() as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A WAIT or BARRIER did not finish at once: it waits.
    pub fn wait_started(&self) {
        self.waits_pending.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` registered waits were answered, cancelled or dropped with their connection.
    pub fn waits_ended(&self, n: usize) {
        self.waits_pending.fetch_sub(n as i64, Ordering::Relaxed);
    }

    /// `n` bytes were read from a connection.
    pub fn read(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` bytes of replies are being written to a connection.
    pub fn wrote(&self, n: usize) {
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            accepted: self.accepted.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
            ops: QueryType::ALL
                .iter()
                .map(|q| {
                    let name = format!("{q:?}");
                    (snake(&name), self.ops[*q as usize].load(Ordering::Relaxed))
                })
                .collect(),
            waits_pending: self.waits_pending.load(Ordering::Relaxed).max(0),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }
}

/// `CompareSet` → `compare_set`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_snake_case_and_every_opcode_is_listed() {
        assert_eq!(snake("CompareSet"), "compare_set");
        assert_eq!(snake("Get"), "get");
        let snap = STATS.snapshot();
        assert_eq!(snap.ops.len(), QueryType::ALL.len());
        assert!(snap.ops.iter().any(|(n, _)| n == "multi_get"));
    }

    #[test]
    fn counters_move() {
        // Other tests' servers share the process-wide counters: only monotonic checks here.
        let s = StoreStats {
            accepted: AtomicU64::new(0),
            open: AtomicI64::new(0),
            ops: [const { AtomicU64::new(0) }; QueryType::ALL.len()],
            waits_pending: AtomicI64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        };
        s.opened();
        s.opened();
        s.closed();
        s.op(&Request::Get { key: b"k".to_vec() });
        s.wait_started();
        s.wait_started();
        s.waits_ended(1);
        s.read(10);
        s.read(5);
        s.wrote(7);
        let snap = s.snapshot();
        assert_eq!((snap.bytes_read, snap.bytes_written), (15, 7));
        assert_eq!((snap.accepted, snap.open, snap.waits_pending), (2, 1, 1));
        assert_eq!(snap.ops.iter().find(|(n, _)| n == "get").unwrap().1, 1);
    }
}
