//! The store's shared state: the key-value map, the FIFO queues and the per-key waiter table that
//! defers WAIT and BARRIER replies. One `std::sync::Mutex`, never held across an `.await`.
//!
//! Semantics follow PyTorch 2.15.0's libuv server (`TCPStoreLibUvBackend.cpp`): ADD and BARRIER
//! keep counters as ASCII decimal parsed like `std::stoll`; a key counts as present for CHECK and
//! WAIT if it is in the map or names a non-empty queue; SET, ADD, APPEND, MULTI_SET and
//! COMPARE_SET wake every waiter on the key, a completed BARRIER wakes every waiter on its key, and
//! QUEUE_PUSH wakes one. DELETE_KEY wakes nobody.
//!
//! Waiters are identified by connection id. A finished wait does not write to the socket itself:
//! it bumps the connection's `ready` count and notifies the connection's task, which writes one
//! STOP_WAITING byte per finished wait. CANCEL_WAIT and disconnect remove every registration of
//! the connection, so nothing outlives its socket.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use thiserror::Error;
use tokio::sync::Notify;

use super::protocol::parse_stoll;

/// Identifies one server connection in the waiter table.
pub type ConnId = u64;

/// One pending WAIT/BARRIER for hang capture: the peer address of its connection (if known),
/// the keys it still misses, when it was registered.
pub type PendingWait = (
    Option<std::net::SocketAddr>,
    Vec<Vec<u8>>,
    std::time::Instant,
);

/// Whether a WAIT or BARRIER finished at once or was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Reply STOP_WAITING now.
    Ready,
    /// Registered; the connection's notify fires once it is done.
    Pending,
}

/// An operation the state refuses; the server closes the connection (PyTorch throws, which closes
/// the socket).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StateError {
    #[error("value of key {key:?} is not a decimal integer: {value:?}")]
    NotANumber { key: String, value: String },
}

#[derive(Default)]
struct Inner {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> registrations, oldest first.
    waiters: HashMap<Vec<u8>, VecDeque<WaitRef>>,
    conns: HashMap<ConnId, ConnWaits>,
    next_wait: u64,
    /// Each open connection's peer address (read-only for hang capture: who waits on what).
    peers: HashMap<ConnId, std::net::SocketAddr>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct WaitRef {
    conn: ConnId,
    wait: u64,
}

struct ConnWaits {
    notify: Arc<Notify>,
    /// Finished waits whose STOP_WAITING byte the connection has not taken yet.
    ready: u32,
    /// Registrations by wait id, in registration order: a connection has one at a time in
    /// PyTorch's client (at most `max_pending_waits`), so a short list costs a tenth of the
    /// memory of a map per waiting connection (issue 16: all ranks wait at once in a barrier).
    pending: Vec<(u64, Pending)>,
}

struct Pending {
    remaining: usize,
    keys: Vec<Vec<u8>>,
    since: std::time::Instant,
}

/// The shared store. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

impl Store {
    /// An empty store.
    pub fn new() -> Store {
        Store::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every mutation is a single
        // map operation or finishes before anything can panic), so keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// SET: store `value` and wake every waiter on `key`.
    pub fn set(&self, key: Vec<u8>, value: Vec<u8>) {
        let mut g = self.lock();
        g.wake_all(&key);
        g.kv.insert(key, value);
    }

    /// GET: the value, or `None` if missing (the server replies an empty value then, like libuv).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().kv.get(key).cloned()
    }

    /// ADD: add `delta` to the decimal counter at `key` (missing counts as 0), wrapping like the
    /// C++ signed add on two's-complement hardware; wakes waiters.
    pub fn add(&self, key: &[u8], delta: i64) -> Result<i64, StateError> {
        let mut g = self.lock();
        let v = g.add_locked(key, delta)?;
        g.wake_all(key);
        Ok(v)
    }

    /// COMPARE_SET with PyTorch's missing-key rules; returns the reply value.
    pub fn compare_set(&self, key: &[u8], expected: &[u8], desired: Vec<u8>) -> Vec<u8> {
        let mut g = self.lock();
        let reply = match g.kv.get_mut(key) {
            None if expected.is_empty() => {
                g.kv.insert(key.to_vec(), desired.clone());
                desired
            }
            // Missing and a non-empty expectation: no change, reply `expected` (PyTorch's
            // documented behaviour, `test_store.py::_test_compare_set`).
            None => return expected.to_vec(),
            Some(cur) => {
                if cur.as_slice() == expected {
                    *cur = desired;
                }
                cur.clone()
            }
        };
        g.wake_all(key);
        reply
    }

    /// CHECK: whether every key is present (map key or non-empty queue).
    pub fn check(&self, keys: &[Vec<u8>]) -> bool {
        let g = self.lock();
        keys.iter().all(|k| g.present(k))
    }

    /// GETNUMKEYS: number of map keys (queues not counted).
    pub fn num_keys(&self) -> i64 {
        self.lock().kv.len() as i64
    }

    /// DELETE_KEY: whether the key existed.
    pub fn delete(&self, key: &[u8]) -> bool {
        self.lock().kv.remove(key).is_some()
    }

    /// APPEND: append bytes (creating the key) and wake waiters.
    pub fn append(&self, key: &[u8], value: &[u8]) {
        let mut g = self.lock();
        g.kv.entry(key.to_vec())
            .or_default()
            .extend_from_slice(value);
        g.wake_all(key);
    }

    /// MULTI_GET: values in order, `None` for missing keys.
    pub fn multi_get(&self, keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        let g = self.lock();
        keys.iter().map(|k| g.kv.get(k).cloned()).collect()
    }

    /// MULTI_SET: each pair as a SET, under one lock.
    pub fn multi_set(&self, pairs: Vec<(Vec<u8>, Vec<u8>)>) {
        let mut g = self.lock();
        for (k, v) in pairs {
            g.wake_all(&k);
            g.kv.insert(k, v);
        }
    }

    /// QUEUE_PUSH: append to the FIFO and wake one waiter on it.
    pub fn queue_push(&self, key: &[u8], value: Vec<u8>) {
        let mut g = self.lock();
        g.queues.entry(key.to_vec()).or_default().push_back(value);
        g.wake_one(key);
    }

    /// QUEUE_POP: the length before the pop and the popped value (if the queue was non-empty).
    pub fn queue_pop(&self, key: &[u8]) -> (i64, Option<Vec<u8>>) {
        let mut g = self.lock();
        let Some(q) = g.queues.get_mut(key) else {
            return (0, None);
        };
        let len = q.len() as i64;
        let v = q.pop_front();
        if q.is_empty() {
            g.queues.remove(key);
        }
        (len, v)
    }

    /// QUEUE_LEN: 0 for an unknown queue.
    pub fn queue_len(&self, key: &[u8]) -> i64 {
        self.lock().queues.get(key).map_or(0, |q| q.len() as i64)
    }

    /// LIST_KEYS: every map key, in no particular order.
    pub fn list_keys(&self) -> Vec<Vec<u8>> {
        self.lock().kv.keys().cloned().collect()
    }

    /// WAIT: `Ready` if every key is present, else registers `conn` on each missing key.
    pub fn wait(&self, conn: ConnId, notify: &Arc<Notify>, keys: &[Vec<u8>]) -> WaitOutcome {
        let mut g = self.lock();
        let missing: Vec<Vec<u8>> = keys.iter().filter(|k| !g.present(k)).cloned().collect();
        if missing.is_empty() {
            return WaitOutcome::Ready;
        }
        g.register(conn, notify, missing);
        WaitOutcome::Pending
    }

    /// BARRIER: bump the decimal counter at `key`; at `world_size` wake every waiter on the key and
    /// answer at once, else register `conn` as a waiter on the key. Arrivals that do not complete
    /// the barrier wake nobody, so earlier arrivals keep waiting.
    pub fn barrier(
        &self,
        conn: ConnId,
        notify: &Arc<Notify>,
        key: &[u8],
        world_size: i64,
    ) -> Result<WaitOutcome, StateError> {
        let mut g = self.lock();
        let count = g.add_locked(key, 1)?;
        if count >= world_size {
            g.wake_all(key);
            Ok(WaitOutcome::Ready)
        } else {
            g.register(conn, notify, vec![key.to_vec()]);
            Ok(WaitOutcome::Pending)
        }
    }

    /// Number of WAIT/BARRIER registrations of `conn` still pending.
    pub fn pending_waits(&self, conn: ConnId) -> usize {
        self.lock().conns.get(&conn).map_or(0, |c| c.pending.len())
    }

    /// Whether `conn` has a WAIT/BARRIER registered, pending or finished and not answered yet.
    pub fn has_waits(&self, conn: ConnId) -> bool {
        self.lock().conns.contains_key(&conn)
    }

    /// Takes the number of finished waits of `conn` not yet answered.
    pub fn take_ready(&self, conn: ConnId) -> u32 {
        let mut g = self.lock();
        let Some(c) = g.conns.get_mut(&conn) else {
            return 0;
        };
        let n = std::mem::take(&mut c.ready);
        if c.pending.is_empty() {
            g.conns.remove(&conn);
            // A barrier of every rank grows this map to the world size; give that back.
            if g.conns.is_empty() && g.conns.capacity() > 1024 {
                g.conns = HashMap::new();
            }
        }
        n
    }

    /// CANCEL_WAIT: drops every pending wait of `conn` and returns the finished waits not yet
    /// answered, whose STOP_WAITING bytes must go out before WAIT_CANCELED (PyTorch's client reads
    /// a `00` then expects the `01`).
    pub fn cancel_waits(&self, conn: ConnId) -> u32 {
        let mut g = self.lock();
        g.drop_conn(conn)
    }

    /// Forgets every registration of a closed connection.
    pub fn disconnect(&self, conn: ConnId) {
        let mut g = self.lock();
        g.drop_conn(conn);
        g.peers.remove(&conn);
    }

    /// Records an accepted connection's peer address (forgotten at [`Store::disconnect`]).
    pub fn note_peer(&self, conn: ConnId, peer: std::net::SocketAddr) {
        self.lock().peers.insert(conn, peer);
    }

    /// Read-only, for hang capture (issue 13): every pending WAIT/BARRIER as (peer address,
    /// keys it still misses, registered at), oldest first.
    pub fn pending_waits_by_peer(
        &self,
    ) -> Vec<(
        Option<std::net::SocketAddr>,
        Vec<Vec<u8>>,
        std::time::Instant,
    )> {
        let g = self.lock();
        let mut out: Vec<_> = g
            .conns
            .iter()
            .flat_map(|(c, w)| {
                let peer = g.peers.get(c).copied();
                let g = &g;
                w.pending.iter().map(move |(_, p)| {
                    let keys = p.keys.iter().filter(|k| !g.present(k)).cloned().collect();
                    (peer, keys, p.since)
                })
            })
            .collect();
        out.sort_by_key(|w| w.2);
        out
    }

    /// Drops every key and queue. Pending WAIT/BARRIER registrations stay: they wait for keys that
    /// are absent, which remains true after the clear, and they finish when a key is next written
    /// (or are cancelled / dropped as usual). Barrier counters restart from zero.
    pub fn clear(&self) {
        let mut g = self.lock();
        g.kv.clear();
        g.queues.clear();
    }

    /// Drops every key and queue whose name starts with none of `keep`, returning how many went;
    /// waiters stay as in [`Store::clear`]. The static rendezvous' host uses it to give each
    /// attempt's workers an empty namespace while its own `rdrun.` keys stay.
    pub fn clear_except(&self, keep: &[&[u8]]) -> usize {
        let mut g = self.lock();
        let (keys, queues) = (g.kv.len(), g.queues.len());
        let kept = |k: &Vec<u8>| keep.iter().any(|p| k.starts_with(p));
        g.kv.retain(|k, _| kept(k));
        g.queues.retain(|k, _| kept(k));
        keys + queues - g.kv.len() - g.queues.len()
    }

    /// Number of connections with pending or unanswered waits, and of keys with waiters (for
    /// tests and diagnostics: both drop to zero when no wait is outstanding).
    pub fn waiter_counts(&self) -> (usize, usize) {
        let g = self.lock();
        (g.conns.len(), g.waiters.len())
    }
}

impl Inner {
    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    fn add_locked(&mut self, key: &[u8], delta: i64) -> Result<i64, StateError> {
        match self.kv.get_mut(key) {
            None => {
                self.kv.insert(key.to_vec(), delta.to_string().into_bytes());
                Ok(delta)
            }
            Some(v) => {
                let cur = parse_stoll(v).ok_or_else(|| StateError::NotANumber {
                    key: String::from_utf8_lossy(key).into_owned(),
                    value: String::from_utf8_lossy(&v[..v.len().min(64)]).into_owned(),
                })?;
                let new = cur.wrapping_add(delta);
                *v = new.to_string().into_bytes();
                Ok(new)
            }
        }
    }

    fn register(&mut self, conn: ConnId, notify: &Arc<Notify>, missing: Vec<Vec<u8>>) {
        let wait = self.next_wait;
        self.next_wait += 1;
        for k in &missing {
            // No key copy when the key already has waiters (a barrier's every rank).
            let w = WaitRef { conn, wait };
            match self.waiters.get_mut(k) {
                Some(list) => list.push_back(w),
                None => {
                    self.waiters.insert(k.clone(), VecDeque::from([w]));
                }
            }
        }
        let c = self.conns.entry(conn).or_insert_with(|| ConnWaits {
            notify: notify.clone(),
            ready: 0,
            pending: Vec::new(),
        });
        c.pending.push((
            wait,
            Pending {
                remaining: missing.len(),
                keys: missing,
                since: std::time::Instant::now(),
            },
        ));
    }

    fn wake_all(&mut self, key: &[u8]) {
        // Fast path for the common case: nobody waits on anything.
        if self.waiters.is_empty() {
            return;
        }
        if let Some(list) = self.waiters.remove(key) {
            for w in list {
                self.hit(w);
            }
        }
    }

    fn wake_one(&mut self, key: &[u8]) {
        if self.waiters.is_empty() {
            return;
        }
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        let w = list.pop_front();
        if list.is_empty() {
            self.waiters.remove(key);
        }
        if let Some(w) = w {
            self.hit(w);
        }
    }

    /// One registration of `w` saw its key written.
    fn hit(&mut self, w: WaitRef) {
        let Some(c) = self.conns.get_mut(&w.conn) else {
            return;
        };
        let Some(i) = c.pending.iter().position(|(id, _)| *id == w.wait) else {
            return;
        };
        let p = &mut c.pending[i].1;
        p.remaining = p.remaining.saturating_sub(1);
        if p.remaining == 0 {
            c.pending.remove(i);
            c.ready += 1;
            c.notify.notify_one();
        }
    }

    fn drop_conn(&mut self, conn: ConnId) -> u32 {
        let Some(c) = self.conns.remove(&conn) else {
            return 0;
        };
        for (_, p) in &c.pending {
            for k in &p.keys {
                if let Some(list) = self.waiters.get_mut(k) {
                    list.retain(|w| w.conn != conn);
                    if list.is_empty() {
                        self.waiters.remove(k);
                    }
                }
            }
        }
        c.ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n() -> Arc<Notify> {
        Arc::new(Notify::new())
    }

    fn k(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn pending_waits_name_the_peer_and_the_missing_keys() {
        let s = Store::new();
        let peer: std::net::SocketAddr = "127.0.0.1:4242".parse().unwrap();
        s.note_peer(1, peer);
        s.set(k("a"), k("1"));
        assert_eq!(
            s.wait(1, &n(), &[k("a"), k("b"), k("c")]),
            WaitOutcome::Pending
        );
        s.set(k("c"), k("1"));
        let w = s.pending_waits_by_peer();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].0, w[0].1.clone()), (Some(peer), vec![k("b")]));
        s.disconnect(1);
        assert!(s.pending_waits_by_peer().is_empty());
        assert!(s.lock().peers.is_empty());
    }

    #[test]
    fn add_parses_like_stoll_and_stores_decimal() {
        let s = Store::new();
        assert_eq!(s.add(b"c", 5), Ok(5));
        assert_eq!(s.add(b"c", -7), Ok(-2));
        assert_eq!(s.get(b"c"), Some(k("-2")));
        s.set(k("c"), k(" 12x"));
        assert_eq!(s.add(b"c", 1), Ok(13));
        s.set(k("c"), k("abc"));
        assert!(s.add(b"c", 1).is_err());
        s.set(k("c"), k(&i64::MAX.to_string()));
        assert_eq!(s.add(b"c", 1), Ok(i64::MIN));
    }

    #[test]
    fn compare_set_rules() {
        let s = Store::new();
        assert_eq!(s.compare_set(b"k", b"x", k("d")), k("x"));
        assert_eq!(s.get(b"k"), None);
        assert_eq!(s.compare_set(b"k", b"", k("d")), k("d"));
        assert_eq!(s.compare_set(b"k", b"nope", k("e")), k("d"));
        assert_eq!(s.compare_set(b"k", b"d", k("e")), k("e"));
        assert_eq!(s.get(b"k"), Some(k("e")));
    }

    #[test]
    fn each_waking_op_finishes_a_wait() {
        type Op = fn(&Store);
        let ops: &[(&str, Op)] = &[
            ("set", |s| s.set(k("w"), k("1"))),
            ("add", |s| {
                s.add(b"w", 1).expect("add");
            }),
            ("append", |s| s.append(b"w", b"x")),
            ("multi_set", |s| s.multi_set(vec![(k("w"), k("1"))])),
            ("compare_set", |s| {
                s.compare_set(b"w", b"", k("1"));
            }),
            ("queue_push", |s| s.queue_push(b"w", k("1"))),
        ];
        for (name, op) in ops {
            let s = Store::new();
            let notify = n();
            assert_eq!(
                s.wait(1, &notify, &[k("w")]),
                WaitOutcome::Pending,
                "{name}"
            );
            assert_eq!(s.take_ready(1), 0);
            op(&s);
            assert_eq!(s.take_ready(1), 1, "{name}");
            assert_eq!(s.waiter_counts(), (0, 0), "{name}");
        }
    }

    #[test]
    fn delete_wakes_nobody_and_multi_key_wait_needs_all() {
        let s = Store::new();
        let notify = n();
        s.set(k("a"), k("1"));
        assert_eq!(
            s.wait(1, &notify, &[k("a"), k("b"), k("c")]),
            WaitOutcome::Pending
        );
        s.delete(b"a");
        s.set(k("b"), k("1"));
        assert_eq!(s.take_ready(1), 0);
        s.set(k("c"), k("1"));
        assert_eq!(s.take_ready(1), 1);
        assert_eq!(s.wait(1, &notify, &[k("b"), k("c")]), WaitOutcome::Ready);
    }

    #[test]
    fn queue_push_wakes_exactly_one() {
        let s = Store::new();
        let (n1, n2) = (n(), n());
        assert_eq!(s.wait(1, &n1, &[k("q")]), WaitOutcome::Pending);
        assert_eq!(s.wait(2, &n2, &[k("q")]), WaitOutcome::Pending);
        s.queue_push(b"q", k("a"));
        assert_eq!(s.take_ready(1) + s.take_ready(2), 1);
        assert!(s.check(&[k("q")]));
        assert_eq!(s.queue_len(b"q"), 1);
        assert_eq!(s.queue_pop(b"q"), (1, Some(k("a"))));
        assert_eq!(s.queue_pop(b"q"), (0, None));
        assert!(!s.check(&[k("q")]));
        s.queue_push(b"q", k("b"));
        assert_eq!(s.take_ready(1) + s.take_ready(2), 1);
        assert_eq!(s.waiter_counts(), (0, 0));
        assert_eq!(s.num_keys(), 0, "queues are not keys");
    }

    #[test]
    fn barrier_wakes_all_only_when_complete() {
        let s = Store::new();
        let notify = n();
        assert_eq!(s.barrier(1, &notify, b"b", 3), Ok(WaitOutcome::Pending));
        assert_eq!(s.barrier(2, &notify, b"b", 3), Ok(WaitOutcome::Pending));
        assert_eq!(s.take_ready(1), 0);
        assert_eq!(s.barrier(3, &notify, b"b", 3), Ok(WaitOutcome::Ready));
        assert_eq!(s.take_ready(1), 1);
        assert_eq!(s.take_ready(2), 1);
        assert_eq!(s.get(b"b"), Some(k("3")));
        // Reusing the key passes at once (the counter is never reset).
        assert_eq!(s.barrier(4, &notify, b"b", 3), Ok(WaitOutcome::Ready));
    }

    #[test]
    fn cancel_and_disconnect_leave_no_state() {
        let s = Store::new();
        let notify = n();
        s.wait(1, &notify, &[k("a"), k("b")]);
        s.wait(2, &notify, &[k("a")]);
        assert_eq!(s.waiter_counts(), (2, 2));
        assert_eq!(s.cancel_waits(1), 0);
        s.disconnect(2);
        assert_eq!(s.waiter_counts(), (0, 0));
        // A wait that finished before the cancel is reported so its byte goes out first.
        s.wait(3, &notify, &[k("c")]);
        s.set(k("c"), k("1"));
        assert_eq!(s.cancel_waits(3), 1);
        assert_eq!(s.cancel_waits(3), 0);
    }

    #[test]
    fn clear_drops_data_keeps_waiters_consistent() {
        let s = Store::new();
        let notify = n();
        s.set(k("a"), k("1"));
        s.queue_push(b"q", k("1"));
        s.wait(1, &notify, &[k("z")]);
        s.clear();
        assert_eq!(s.num_keys(), 0);
        assert_eq!(s.queue_len(b"q"), 0);
        assert!(!s.check(&[k("a")]));
        s.set(k("z"), k("1"));
        assert_eq!(s.take_ready(1), 1);
    }

    #[test]
    fn clear_except_keeps_only_the_prefix() {
        let s = Store::new();
        // As on the wire: TCPStore clients send "/" + key.
        s.set(k("/rdrun.static.job/gen"), k("1"));
        s.set(k("/0//cpu//0/0"), k("addr"));
        s.set(k("/rdrunner"), k("x"));
        s.queue_push(b"q", k("1"));
        s.queue_push(b"/rdrun.q", k("1"));
        assert_eq!(s.clear_except(&[b"/rdrun.", b"rdrun."]), 3);
        assert_eq!(s.list_keys(), vec![k("/rdrun.static.job/gen")]);
        assert_eq!(s.queue_len(b"/rdrun.q"), 1);
        assert_eq!(s.queue_len(b"q"), 0);
    }
}
